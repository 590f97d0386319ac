# SPDX-License-Identifier: BSD-2-Clause
"""FrameFifo: store-and-forward, no pause inside a frame, order, abort drop/pass, latency."""

import random
from collections import namedtuple

import pytest

from roce_hw.lib.frame_fifo import FrameFifo
from sim.harness import run_simulation
from sim.stream import beats_of, framing_error

__all__ = []

#: One cycle of the run as the monitor saw it (``last``/``abort`` are ``i``'s, ``beat`` is ``o``'s
#: (data, keep, first, last, abort)).
Cycle = namedtuple("Cycle", "cycle iv ir ilast iabort ov orr beat")


def _frames(rng, n, max_beats, nbytes, p_abort=0.0):
    out = []
    for _ in range(n):
        length = rng.randint(1, max_beats * nbytes)
        out.append((rng.randbytes(length), rng.random() < p_abort))
    return out


def _run(width, depth, frames, *, abort="drop", p_idle=0.0, p_stall=0.0, seed=0):
    """Push ``frames`` [(bytes, aborted)] through a FrameFifo; returns (received frames
    [(bytes, abort)], per-cycle log [:data:`Cycle`])."""
    dut = FrameFifo(width, depth, abort=abort)
    nbytes = width // 8
    rng = random.Random(seed)
    rng_i, rng_o = random.Random(rng.random()), random.Random(rng.random())
    expect_n = sum(1 for _, a in frames if abort == "pass" or not a)
    got, log = [], []

    async def producer(ctx):
        for data, aborted in frames:
            for beat in beats_of(data, width):
                while p_idle and rng_i.random() < p_idle:
                    ctx.set(dut.i.valid, 0)
                    await ctx.tick()
                ctx.set(dut.i.payload, dict(beat, abort=int(aborted and beat["last"])))
                ctx.set(dut.i.valid, 1)
                await ctx.tick().until(dut.i.ready)
            ctx.set(dut.i.valid, 0)

    async def consumer(ctx):
        cur, index = bytearray(), 0
        while len(got) < expect_n:
            ready = not (p_stall and rng_o.random() < p_stall)
            ctx.set(dut.o.ready, ready)
            _, _, valid, p = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            if valid and ready:
                assert framing_error(index, p.keep, p.first, p.last, nbytes) is None
                cur += int(p.data).to_bytes(nbytes, "little")[:int(p.keep).bit_length()]
                index += 1
                if p.last:
                    got.append((bytes(cur), bool(p.abort)))
                    cur, index = bytearray(), 0
        ctx.set(dut.o.ready, 0)

    async def monitor(ctx):
        cycle = 0
        async for _, _, iv, ir, ip, ov, orr, p in ctx.tick().sample(
                dut.i.valid, dut.i.ready, dut.i.payload, dut.o.valid, dut.o.ready,
                dut.o.payload):
            beat = (int(p.data), int(p.keep), int(p.first), int(p.last), int(p.abort))
            log.append(Cycle(cycle, int(iv), int(ir), int(ip.last), int(ip.abort), int(ov),
                             int(orr), beat))
            cycle += 1

    total = sum(len(beats_of(d, width)) for d, _ in frames)
    run_simulation(dut, [producer, consumer], [monitor], cycles=40 * total + 200,
                   vcd_name=f"frame_fifo_{width}")
    return got, log


def _check_stream_rules(log):
    """o: valid held, payload stable while stalled; valid never drops inside a frame."""
    in_frame = False
    for (c0, _, _, _, _, ov0, or0, b0), (c1, _, _, _, _, ov1, _, b1) in zip(log, log[1:]):
        if ov0 and not or0:
            assert ov1 and b1 == b0, f"cycle {c1}: o changed while stalled"
        if ov0 and or0:
            in_frame = not b0[3]
        if in_frame:
            assert ov1, f"cycle {c1}: o.valid dropped inside a frame"


def _rows_in_use(log, abort):
    """Rows holding unsent beats at the start of each cycle, counted from the ports alone: beats
    written in earlier cycles, minus those of frames dropped in earlier cycles (``abort="drop"``:
    all their rows are freed when their aborted last beat is in), minus the beats already loaded
    for sending (taken from ``o`` in earlier cycles, plus the one on ``o`` now)."""
    used, written, frame, out = [], 0, 0, 0
    for c in log:
        used.append(written - out - c.ov)
        if c.iv and c.ir:
            written += 1
            frame += 1
            if c.ilast:
                if abort == "drop" and c.iabort:
                    written -= frame
                frame = 0
        if c.ov and c.orr:
            out += 1
    return used


def _check_ready_rule(log, depth, abort):
    """``i.ready`` is low exactly when all ``depth`` rows hold unsent beats; returns the most
    rows seen in use."""
    used = _rows_in_use(log, abort)
    for c, u in zip(log, used):
        assert 0 <= u <= depth, f"cycle {c.cycle}: {u} rows in use, depth {depth}"
        assert c.ir == (u < depth), f"cycle {c.cycle}: i.ready={c.ir} with {u}/{depth} rows"
    return max(used)


def _check_output_cycles(log, abort):
    """With ``o.ready`` always high: each kept frame's first beat is on ``o`` 2 cycles after its
    last beat was in, or the cycle after the previous frame's last beat if that is later; its
    other beats follow one per cycle, and ``o.valid`` is low in every other cycle."""
    want, end = set(), -1
    n = 0
    for c in log:
        if c.iv and c.ir:
            n += 1
            if c.ilast:
                if not (abort == "drop" and c.iabort):
                    first = max(c.cycle + 2, end + 1)
                    end = first + n - 1
                    want.update(range(first, end + 1))
                n = 0
    # the consumer drops o.ready once it has every frame
    log = log[:max(c.cycle for c in log if c.ov and c.orr) + 1]
    assert all(c.orr for c in log)
    got = {c.cycle for c in log if c.ov}
    assert got == want, f"o.valid in cycles {sorted(got ^ want)[:10]} differs from the rule"


@pytest.mark.parametrize("width", [64, 512])
@pytest.mark.parametrize("abort", ["drop", "pass"])
def test_cycle_timing_random_input(width, abort):
    """Cycle-level latency and ``i.ready`` under random idle input, output always ready."""
    nbytes = width // 8
    depth = 12
    rng = random.Random(7 * width + len(abort))
    frames = _frames(rng, 60, depth, nbytes, p_abort=0.2)
    got, log = _run(width, depth, frames, abort=abort, p_idle=0.3, seed=width + 1)
    assert got == [(d, a) for d, a in frames if abort == "pass" or not a]
    _check_output_cycles(log, abort)
    assert _check_ready_rule(log, depth, abort) == depth


@pytest.mark.parametrize("depth", [2, 3])
@pytest.mark.parametrize("abort", ["drop", "pass"])
def test_small_depth_full_boundary(depth, abort):
    """Frames of 1 to ``depth`` beats through a FIFO of 2 or 3 rows: full (i.ready low) often,
    with and without backpressure, and aborted frames freeing a full FIFO."""
    width, nbytes = 64, 8
    rng = random.Random(depth * 10 + len(abort))
    frames = _frames(rng, 80, depth, nbytes, p_abort=0.25)
    frames += [(bytes(depth * nbytes), True), (b"\x11" * (depth * nbytes), False)]
    want = [(d, a) for d, a in frames if abort == "pass" or not a]
    for p_idle, p_stall, seed in ((0.0, 0.0, 1), (0.3, 0.0, 2), (0.0, 0.5, 3), (0.4, 0.4, 4)):
        got, log = _run(width, depth, frames, abort=abort, p_idle=p_idle, p_stall=p_stall,
                        seed=seed)
        assert got == want
        _check_stream_rules(log)
        assert _check_ready_rule(log, depth, abort) == depth
        assert any(c.iv and not c.ir for c in log)
        if not p_stall:
            _check_output_cycles(log, abort)


@pytest.mark.parametrize("width", [64, 512])
@pytest.mark.parametrize("abort", ["drop", "pass"])
def test_random_valid_ready(width, abort):
    nbytes = width // 8
    depth = 12
    rng = random.Random(width + len(abort))
    frames = _frames(rng, 60, depth, nbytes, p_abort=0.2)
    got, log = _run(width, depth, frames, abort=abort, p_idle=0.4, p_stall=0.4, seed=width)
    want = [(d, a) for d, a in frames if abort == "pass" or not a]
    assert got == want
    _check_stream_rules(log)
    assert _check_ready_rule(log, depth, abort) == depth
    # the FIFO really filled up (i.ready low) and really drained (o.valid low)
    assert any(c.iv and not c.ir for c in log)
    assert any(not c.ov for c in log[5:])


@pytest.mark.parametrize("width", [64, 512])
def test_frames_of_exactly_depth_beats(width):
    nbytes = width // 8
    depth = 5
    frames = [(bytes((k + j) & 0xFF for j in range(depth * nbytes)), False) for k in range(4)] + \
             [(b"\x5a", False)] + [(bytes(depth * nbytes), True)] + [(b"end", False)]
    got, log = _run(width, depth, frames, abort="drop", p_idle=0.3, p_stall=0.3, seed=3)
    assert got == [f for f in frames if not f[1]]
    _check_stream_rules(log)
    assert _check_ready_rule(log, depth, "drop") == depth


def test_latency_and_throughput():
    """Empty FIFO, output ready: a frame's first beat is on o in cycle t + 2 (t = cycle of
    its last beat on i), and then one beat per cycle. Back-to-back input is never stalled when
    the FIFO holds two frames, and the output is busy for every beat after the first frame."""
    width, nbytes = 64, 8
    frames = [(bytes([k]) * (10 * nbytes), False) for k in range(6)]
    got, log = _run(width, 20, frames)
    assert got == frames
    in_cycles = [c.cycle for c in log if c.iv and c.ir]
    out_cycles = [c.cycle for c in log if c.ov and c.orr]
    assert len(in_cycles) == len(out_cycles) == 60
    assert in_cycles == list(range(in_cycles[0], in_cycles[0] + 60))   # never stalled
    assert out_cycles[0] == in_cycles[9] + 2                            # latency
    assert out_cycles == list(range(out_cycles[0], out_cycles[0] + 60))  # no gap at all


def test_constructor_errors():
    with pytest.raises(ValueError, match="depth"):
        FrameFifo(64, 1)
    with pytest.raises(ValueError, match="depth"):
        FrameFifo(64, True)
    with pytest.raises(ValueError, match="abort"):
        FrameFifo(64, 8, abort="keep")
    with pytest.raises(ValueError, match="data width"):
        FrameFifo(100, 8)
    assert FrameFifo(64, 8).depth == 8 and FrameFifo(64, 8).latency == 1
