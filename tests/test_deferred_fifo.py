# SPDX-License-Identifier: BSD-2-Clause
"""DeferredFrameFifo alone (roce_hw/lib/deferred_fifo.py) against its docstring: every frame
stored or discarded whole (``stored`` the cycle after its last beat), the kept ones sent beat
for beat in order once decided, the discarded ones jumped over; the room limits (``depth``
beats, ``max_frames`` frames), the latency from a decision, back-to-back output and the one
cycle a discarded frame costs -- with seeded random frames, idle, decisions and
backpressure."""

import random

import pytest

from roce_hw.lib.deferred_fifo import DeferredFrameFifo
from sim.harness import run_simulation

__all__ = []

FIELDS = ("data", "keep", "first", "last", "abort")


def make_frame(rng, width, beats):
    """A random frame of ``beats`` beats (dicts of FIELDS): random data in every lane (lanes
    beyond ``keep`` too), ``keep`` full but on the last beat, a random ``abort`` on the last."""
    n = width // 8
    frame = []
    for b in range(beats):
        last = b == beats - 1
        keep = (1 << (rng.randrange(1, n + 1) if last else n)) - 1
        frame.append({"data": rng.getrandbits(width), "keep": keep, "first": int(b == 0),
                      "last": int(last), "abort": int(last and rng.random() < 0.2)})
    return frame


def make_frames(rng, width, count, *, max_beats):
    return [make_frame(rng, width, rng.choice([1, 2, max_beats, rng.randrange(1, max_beats + 1)]))
            for _ in range(count)]


def run_fifo(width, frames, keeps, *, depth, max_frames=32, seed=0, p_idle=0.3, gap=(0, 4),
             decide_delay=(0, 20), p_stall=0.3, hold_decisions=0, gaps=None, cycles=None):
    """Send ``frames`` (beats with random idle inside; ``gap`` idle cycles before each frame, or
    ``gaps[k]`` before frame ``k``), answer every frame reported ``ok`` with the next of
    ``keeps`` a random ``decide_delay`` cycles after its ``stored`` pulse (none before cycle
    ``hold_decisions``), take ``o`` with random backpressure.

    Returns ``stored`` [(cycle, ok)], ``first_in``/``last_in`` (cycle of each frame's first and
    last beat), ``decided`` [(cycle, keep)], ``out`` (frames as lists of beats) and
    ``out_cycles`` (the cycle of each output beat), ``i_ready`` (every sampled ``i.ready``)."""
    dut = DeferredFrameFifo(width, depth, max_frames=max_frames)
    rng = random.Random(seed)
    rngs = [random.Random(rng.getrandbits(32)) for _ in range(4)]
    res = {"stored": [], "first_in": [], "last_in": [], "decided": [], "out": [],
           "out_cycles": [], "i_ready": set(), "cycle": 0}
    st = {"sent": False}

    async def source(ctx):
        for k, frame in enumerate(frames):
            for _ in range(gaps[k] if gaps else rngs[0].randint(*gap)):
                await ctx.tick()
            for beat in frame:
                while p_idle and rngs[0].random() < p_idle:
                    ctx.set(dut.i.valid, 0)
                    await ctx.tick()
                ctx.set(dut.i.payload, beat)
                ctx.set(dut.i.valid, 1)
                _, _, ready = await ctx.tick().sample(dut.i.ready)
                res["i_ready"].add(int(ready))
                cycle = res["cycle"] - 1          # (the monitor counted this cycle already)
                if beat["first"]:
                    res["first_in"].append(cycle)
                if beat["last"]:
                    res["last_in"].append(cycle)
            ctx.set(dut.i.valid, 0)
        st["sent"] = True

    async def monitor(ctx):
        # counts cycles, sees `stored` and answers it (decide is always ready)
        pending = []
        todo = iter(keeps)
        async for _, _, sv, sp in ctx.tick().sample(dut.stored.valid, dut.stored.payload):
            cycle = res["cycle"]
            res["cycle"] = cycle + 1
            if sv:
                res["stored"].append((cycle, int(sp.ok)))
                if sp.ok:
                    pending.append(max(cycle + rngs[1].randint(*decide_delay), hold_decisions))
            # the decision of this coming cycle (no earlier than the pulse's cycle + 1, the
            # first cycle the testbench can act on it)
            if pending and pending[0] <= cycle + 1:
                pending.pop(0)
                keep = next(todo)
                ctx.set(dut.decide.payload, {"keep": keep})
                ctx.set(dut.decide.valid, 1)
                res["decided"].append((cycle + 1, keep))
            else:
                ctx.set(dut.decide.valid, 0)

    async def sink(ctx):
        want = None
        cur, cycles = [], []
        while True:
            rdy = not (p_stall and rngs[2].random() < p_stall)
            ctx.set(dut.o.ready, rdy)
            _, _, valid, p = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            if valid and rdy:
                cur.append({f: int(getattr(p, f)) for f in FIELDS})
                cycles.append(res["cycle"] - 1)
                if p.last:
                    res["out"].append(cur)
                    res["out_cycles"].append(cycles)
                    cur, cycles = [], []
            if want is None and st["sent"] and len(res["stored"]) == len(frames):
                oks = [ok for _, ok in res["stored"]]
                want = sum(k for k, _ in zip(keeps, range(sum(oks))))
            if want is not None and len(res["out"]) >= want and not cur:
                break
        ctx.set(dut.o.ready, 0)

    if cycles is None:
        cycles = 3000 + hold_decisions + 12 * sum(len(f) for f in frames)
    run_simulation(dut, [source, sink], [monitor], cycles=cycles, vcd_name="deferred_fifo")
    return res


def check(frames, keeps, res):
    """The reference: one ``stored`` pulse per frame, the cycle after its last beat; the kept
    frames (``ok``, then ``keep``) leave whole and unchanged, in order; nothing else leaves; a
    frame starts on ``o`` only after its decision."""
    assert res["i_ready"] == {1}
    assert [c for c, _ in res["stored"]] == [c + 1 for c in res["last_in"]]
    oks = [ok for _, ok in res["stored"]]
    decisions = iter(keeps)
    want, decided_at = [], iter(c for c, _ in res["decided"])
    starts = []
    for frame, ok in zip(frames, oks):
        if ok:
            at = next(decided_at)
            if next(decisions):
                want.append(frame)
                starts.append(at)
    assert res["out"] == want
    for k, (cycles, at) in enumerate(zip(res["out_cycles"], starts)):
        assert cycles[0] > at, f"frame {k} left before its decision"


def _keeps(rng, n, p_keep=0.7):
    return [int(rng.random() < p_keep) for _ in range(n)]


@pytest.mark.parametrize("width", [64, 512])
@pytest.mark.parametrize("depth, max_frames", [(64, 32), (16, 4)])
def test_random(width, depth, max_frames):
    """Random frames, decisions and backpressure; with the smaller memory some frames do not
    fit and are discarded whole (``ok`` = 0), never cut; the rest as decided."""
    rng = random.Random(width + depth)
    frames = make_frames(rng, width, 40, max_beats=min(depth, 12))
    keeps = _keeps(rng, len(frames))
    res = run_fifo(width, frames, keeps, depth=depth, max_frames=max_frames, seed=depth)
    check(frames, keeps, res)
    oks = [ok for _, ok in res["stored"]]
    if depth == 64:
        assert all(oks), "a frame was discarded with room to spare"
    else:
        assert 0 < sum(oks) < len(oks), "the small memory should overflow now and then"


@pytest.mark.slow
@pytest.mark.parametrize("width", [128, 256, 1024])
@pytest.mark.parametrize("depth, max_frames", [(32, 8), (8, 2)])
def test_random_more(width, depth, max_frames):
    rng = random.Random(width * 3 + depth)
    frames = make_frames(rng, width, 60, max_beats=depth)
    keeps = _keeps(rng, len(frames))
    res = run_fifo(width, frames, keeps, depth=depth, max_frames=max_frames, seed=width)
    check(frames, keeps, res)


def test_check_can_fail():
    rng = random.Random(2)
    frames = make_frames(rng, 64, 6, max_beats=4)
    keeps = [1, 0, 1, 1, 0, 1]
    res = run_fifo(64, frames, keeps, depth=16, p_idle=0, p_stall=0)
    check(frames, keeps, res)
    with pytest.raises(AssertionError):
        check(frames, [1, 1, 1, 1, 0, 1], res)
    bad = dict(res, out=[[dict(b, abort=1 - b["abort"]) for b in f] for f in res["out"]])
    with pytest.raises(AssertionError):
        check(frames, keeps, bad)


@pytest.mark.parametrize("width", [64, 512])
def test_longest_frame_and_frame_limit(width):
    """Empty memory of ``depth`` rows: a frame of ``depth`` beats fits, one of ``depth + 1``
    is discarded whole (its rows given back: the next frame fits again). With ``max_frames``
    frames waiting for their decisions, the next frame is discarded; once they have left, a
    frame fits again."""
    rng = random.Random(width)
    depth = 8
    frames = [make_frame(rng, width, depth), make_frame(rng, width, depth + 1),
              make_frame(rng, width, depth)]
    res = run_fifo(width, frames, [1, 1], depth=depth, max_frames=4, p_idle=0, p_stall=0,
                   gap=(30, 30), decide_delay=(0, 0))
    check(frames, [1, 1], res)
    assert [ok for _, ok in res["stored"]] == [1, 0, 1]


def _frame_limit(width, max_frames, beats, gap):
    """Six frames of ``beats`` beats, ``gap`` idle cycles apart, no decision before cycle 400:
    the ``ok`` of each, then the same with a seventh frame after the first ones have left."""
    rng = random.Random(width + max_frames)
    small = [make_frame(rng, width, beats) for _ in range(6)]
    res = run_fifo(width, small, [1] * 6, depth=64, max_frames=max_frames, p_idle=0,
                   p_stall=0, gap=(gap, gap), hold_decisions=400)
    oks = [ok for _, ok in res["stored"]]
    check(small, [1] * 6, res)
    later = small + [make_frame(rng, width, 3)]
    res = run_fifo(width, later, [1] * 7, depth=64, max_frames=max_frames, p_idle=0,
                   p_stall=0, gaps=[gap] * 6 + [200], hold_decisions=100, cycles=3000)
    check(later, [1] * 7, res)
    return oks, [ok for _, ok in res["stored"]][-1]


@pytest.mark.parametrize("beats,gap", [(2, 2), (1, 0), (2, 0)])
@pytest.mark.parametrize("max_frames", [2, 4])
def test_frame_limit(max_frames, beats, gap):
    """Frames waiting for their decisions: exactly ``max_frames`` are held, as documented, the
    later ones are discarded whole; once the held ones have left, a frame fits again. Spaced
    frames and back-to-back ones, down to one beat each (a frame taken in the previous cycle
    is not yet in the registered count). Regression: the registered room flag held
    ``max_frames - 1`` spaced frames (issue 33)."""
    oks, after = _frame_limit(64, max_frames, beats, gap)
    assert oks == [1] * max_frames + [0] * (6 - max_frames)
    assert after == 1


@pytest.mark.parametrize("width", [64, 512])
def test_latency_and_throughput(width):
    """Empty FIFO, ``o`` always ready: a frame decided in cycle t starts in cycle t + 2; kept
    frames decided ahead leave back to back; a discarded frame between two kept ones costs one
    cycle."""
    rng = random.Random(width + 5)
    frames = make_frames(rng, width, 5, max_beats=5)
    # one frame, decided late: latency
    res = run_fifo(width, frames[:1], [1], depth=64, p_idle=0, p_stall=0, decide_delay=(10, 10))
    check(frames[:1], [1], res)
    assert res["out_cycles"][0][0] == res["decided"][0][0] + 2
    assert res["out_cycles"][0] == list(range(res["out_cycles"][0][0],
                                              res["out_cycles"][0][0] + len(frames[0])))
    # five frames, all decided before the first leaves (held until cycle 200): keep, keep,
    # drop, keep, keep -> back to back, one idle cycle where the dropped frame was
    keeps = [1, 1, 0, 1, 1]
    res = run_fifo(width, frames, keeps, depth=64, p_idle=0, p_stall=0, gap=(0, 0),
                   hold_decisions=200, decide_delay=(0, 0))
    check(frames, keeps, res)
    cyc = res["out_cycles"]
    assert all(c == list(range(c[0], c[0] + len(c))) for c in cyc)
    gaps = [cyc[k + 1][0] - cyc[k][-1] - 1 for k in range(len(cyc) - 1)]
    assert gaps == [0, 1, 0], gaps


def test_bad_arguments():
    for depth in (0, 1, 3, 12, 2.0, True):
        with pytest.raises(ValueError):
            DeferredFrameFifo(64, depth)
    for nf in (0, 1, 2.5, True):
        with pytest.raises(ValueError):
            DeferredFrameFifo(64, 16, max_frames=nf)
