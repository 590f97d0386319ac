# SPDX-License-Identifier: BSD-2-Clause
"""FrameArbiter: random sources, valid and ready; every frame whole and byte-identical, the
round-robin fairness bound, no idle cycle between frames."""

import random

import pytest

from roce_hw.lib.arbiter import FrameArbiter
from roce_hw.generate import emit
from sim.harness import run_simulation
from sim.stream import beats_of, framing_error

FAST = [64, 512]
SLOW = [pytest.param(w, marks=pytest.mark.slow) for w in (128, 256, 1024)]
WIDTHS = FAST + SLOW


def random_frames(rng, width, count):
    """``count`` frames of 1 .. 3 beats + 1 bytes (one-beat frames included), random abort."""
    n = width // 8
    lens = [1, n - 1, n, n + 1, 3 * n + 1] + [rng.randrange(1, 3 * n + 2) for _ in range(count)]
    rng.shuffle(lens)
    return [(bytes(rng.getrandbits(8) for _ in range(ln)), rng.getrandbits(1))
            for ln in lens[:count]]


def run_arbiter(width, n, frames, seed, *, p_idle=0.3, p_stall=0.3, abort=True):
    """Simulate; ``frames[k]`` is the list of ``(bytes, abort)`` of source ``k``. Returns
    ``(out, waits, beats)``: output frames ``[(source, bytes, abort)]``; per frame of every
    source ``(source, offered cycle, taken cycle)`` of its first beat; the output beat cycles."""
    dut = FrameArbiter(width, n, abort=abort)
    nb = width // 8
    rngs = [random.Random(seed * 100 + k) for k in range(n + 1)]
    total = sum(len(beats_of(f, width)) for fs in frames for f, _ in fs)
    res = {"out": [], "waits": [], "beats": []}

    def producer(k):
        async def tb(ctx):
            rng = rngs[k]
            for data, ab in frames[k]:
                for beat in beats_of(data, width):
                    used = beat["keep"].bit_length()
                    beat["data"] |= rng.getrandbits(8 * (nb - used)) << 8 * used if nb > used \
                        else 0
                    if abort:
                        beat["abort"] = ab if beat["last"] else rng.getrandbits(1)
                    while p_idle and rng.random() < p_idle:
                        ctx.set(dut.i[k].valid, 0)
                        await ctx.tick()
                    ctx.set(dut.i[k].payload, beat)
                    ctx.set(dut.i[k].valid, 1)
                    await ctx.tick().until(dut.i[k].ready)
            ctx.set(dut.i[k].valid, 0)
        return tb

    async def consumer(ctx):
        rng = rngs[n]
        sigs = []
        for k in range(n):
            sigs += [dut.i[k].valid, dut.i[k].ready, dut.i[k].payload]
        taken = []              # input transfers, in order: (source, payload)
        waiting = [None] * n
        cur, index, cycle, got = bytearray(), 0, 0, 0
        src = None
        while got < total:
            ready = not (p_stall and rng.random() < p_stall)
            ctx.set(dut.o.ready, ready)
            _, _, ov, op, *ins = await ctx.tick().sample(dut.o.valid, dut.o.payload, *sigs)
            for k in range(n):
                v, r, p = ins[3 * k:3 * k + 3]
                if v and p.first and waiting[k] is None:
                    waiting[k] = cycle
                if v and r:
                    if p.first:
                        res["waits"].append((k, waiting[k], cycle))
                        waiting[k] = None
                    taken.append((k, int(p.data), int(p.keep), int(p.first), int(p.last),
                                  int(p.abort) if abort else 0))
            if ov and ready:
                k, data, keep, first, last, ab = taken[got]
                assert (int(op.data), int(op.keep), int(op.first), int(op.last)) == \
                    (data, keep, first, last), f"output beat {got} is not input beat {got}"
                error = framing_error(index, op.keep, op.first, op.last, nb)
                assert error is None, error
                assert src is None or src == k, f"beat {got}: frame of source {src} " \
                                                 f"interleaved with source {k}"
                src = k
                cur += int(op.data).to_bytes(nb, "little")[:int(op.keep).bit_length()]
                index += 1
                got += 1
                res["beats"].append(cycle)
                if op.last:
                    res["out"].append((k, bytes(cur), int(op.abort) if abort else 0))
                    cur, index, src = bytearray(), 0, None
            cycle += 1
        # nothing more comes out
        ctx.set(dut.o.ready, 1)
        for _ in range(8):
            _, _, ov = await ctx.tick().sample(dut.o.valid)
            assert not ov, "a beat nobody sent"

    run_simulation(dut, [producer(k) for k in range(n)] + [consumer],
                   cycles=200 + 8 * total, vcd_name=f"arbiter_{width}_{n}")
    return res["out"], res["waits"], res["beats"]


def check(frames, out, waits, n, *, abort=True):
    for k in range(n):
        mine = [(f, ab if abort else 0) for f, ab in frames[k]]
        assert [(f, ab) for s, f, ab in out if s == k] == mine, f"source {k}"
    # fairness: while a frame of source k waits (first beat offered .. taken), every other
    # source starts at most one frame
    starts = sorted((t, s) for s, _, t in waits)
    for k, offered, taken in waits:
        others = [s for t, s in starts if offered <= t < taken and s != k]
        assert all(others.count(s) <= 1 for s in set(others)), \
            f"source {k} waited {offered}..{taken} over frames of {others}"


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_random(width, n):
    for seed in range(2):
        rng = random.Random(seed * 7 + n + width)
        frames = [random_frames(rng, width, rng.randrange(4, 9)) for _ in range(n)]
        out, waits, _ = run_arbiter(width, n, frames, seed)
        check(frames, out, waits, n)


@pytest.mark.parametrize("width", FAST)
def test_packet_layout(width):
    rng = random.Random(5)
    frames = [random_frames(rng, width, 6) for _ in range(3)]
    out, waits, _ = run_arbiter(width, 3, frames, 1, abort=False)
    check(frames, out, waits, 3, abort=False)


@pytest.mark.parametrize("width", FAST)
@pytest.mark.parametrize("n", [1, 2, 4])
def test_back_to_back(width, n):
    """Sources always valid, output always ready: a beat every cycle, frames of different
    sources (one-beat frames included) with no idle cycle between them, strict rotation."""
    rng = random.Random(n)
    frames = [random_frames(rng, width, 6) for _ in range(n)]
    out, waits, beats = run_arbiter(width, n, frames, 0, p_idle=0, p_stall=0)
    check(frames, out, waits, n)
    assert beats == list(range(beats[0], beats[0] + len(beats))), "idle cycle on the output"
    assert [s for s, _, _ in out] == [k % n for k in range(len(out))], "not round robin"


@pytest.mark.parametrize("width", FAST)
def test_fairness_with_a_long_source(width):
    """A source with long frames cannot keep the others out for more than one frame each."""
    nb = width // 8
    rng = random.Random(3)
    frames = [[(bytes(rng.getrandbits(8) for _ in range(8 * nb)), 0) for _ in range(6)],
              random_frames(rng, width, 10), random_frames(rng, width, 10)]
    out, waits, _ = run_arbiter(width, 3, frames, 2, p_idle=0.5, p_stall=0.2)
    check(frames, out, waits, 3)


@pytest.mark.parametrize("n", [2, 3])
def test_ready_does_not_depend_on_valid(n):
    """``i[k].ready`` comes from ``o.ready`` and registers only: changing the sources'
    ``valid`` within a cycle never changes it."""
    dut = FrameArbiter(64, n)
    rng = random.Random(n)

    async def tb(ctx):
        for _ in range(300):
            for k in range(n):
                ctx.set(dut.i[k].payload, {"data": rng.getrandbits(64), "keep": 0xFF,
                                           "first": 1, "last": rng.getrandbits(1)})
            ctx.set(dut.o.ready, rng.getrandbits(1))
            readies = set()
            for _ in range(4):
                for k in range(n):
                    ctx.set(dut.i[k].valid, rng.getrandbits(1))
                readies.add(tuple(ctx.get(dut.i[k].ready) for k in range(n)))
            assert len(readies) == 1
            await ctx.tick()

    run_simulation(dut, [tb], cycles=400)


def test_check_can_fail():
    """The fairness and identity checks reject a starving or a corrupting arbiter."""
    frames = [[(b"a", 0), (b"b", 0)], [(b"c", 0)]]
    with pytest.raises(AssertionError):
        check(frames, [(0, b"a", 0), (0, b"b", 0), (1, b"c", 0)],
              [(0, 0, 0), (0, 2, 2), (1, 0, 5)], 2)
    with pytest.raises(AssertionError):
        check(frames, [(0, b"a", 0), (1, b"x", 0), (0, b"b", 0)], [], 2)


def test_bad_parameters():
    for n in (0, 33, 2.0, True):
        with pytest.raises(ValueError):
            FrameArbiter(64, n)
    with pytest.raises(ValueError):
        FrameArbiter(96, 2)


@pytest.mark.parametrize("width", FAST)
def test_emit(width):
    assert "module arb" in emit(FrameArbiter(width, 3), "arb")
