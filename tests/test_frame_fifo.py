# SPDX-License-Identifier: BSD-2-Clause
"""FrameFifo: store-and-forward, no pause inside a frame, order, abort drop/pass, latency."""

import random

import pytest

from roce_hw.lib.frame_fifo import FrameFifo
from sim.harness import run_simulation
from sim.stream import beats_of, framing_error

__all__ = []


def _frames(rng, n, max_beats, nbytes, p_abort=0.0):
    out = []
    for _ in range(n):
        length = rng.randint(1, max_beats * nbytes)
        out.append((rng.randbytes(length), rng.random() < p_abort))
    return out


def _run(width, depth, frames, *, abort="drop", p_idle=0.0, p_stall=0.0, seed=0):
    """Push ``frames`` [(bytes, aborted)] through a FrameFifo; returns (received frames
    [(bytes, abort)], per-cycle log [(cycle, i.valid, i.ready, o.valid, o.ready, beat)])."""
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
        async for _, _, iv, ir, ov, orr, p in ctx.tick().sample(
                dut.i.valid, dut.i.ready, dut.o.valid, dut.o.ready, dut.o.payload):
            beat = (int(p.data), int(p.keep), int(p.first), int(p.last), int(p.abort))
            log.append((cycle, int(iv), int(ir), int(ov), int(orr), beat))
            cycle += 1

    total = sum(len(beats_of(d, width)) for d, _ in frames)
    run_simulation(dut, [producer, consumer], [monitor], cycles=40 * total + 200,
                   vcd_name=f"frame_fifo_{width}")
    return got, log


def _check_stream_rules(log):
    """o: valid held, payload stable while stalled; valid never drops inside a frame."""
    in_frame = False
    for (c0, _, _, ov0, or0, b0), (c1, _, _, ov1, _, b1) in zip(log, log[1:]):
        if ov0 and not or0:
            assert ov1 and b1 == b0, f"cycle {c1}: o changed while stalled"
        if ov0 and or0:
            in_frame = not b0[3]
        if in_frame:
            assert ov1, f"cycle {c1}: o.valid dropped inside a frame"


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
    # the FIFO really filled up (i.ready low) and really drained (o.valid low)
    assert any(iv and not ir for _, iv, ir, _, _, _ in log)
    assert any(not ov for _, _, _, ov, _, _ in log[5:])


@pytest.mark.parametrize("width", [64, 512])
def test_frames_of_exactly_depth_beats(width):
    nbytes = width // 8
    depth = 5
    frames = [(bytes((k + j) & 0xFF for j in range(depth * nbytes)), False) for k in range(4)] + \
             [(b"\x5a", False)] + [(bytes(depth * nbytes), True)] + [(b"end", False)]
    got, log = _run(width, depth, frames, abort="drop", p_idle=0.3, p_stall=0.3, seed=3)
    assert got == [f for f in frames if not f[1]]
    _check_stream_rules(log)


def test_latency_and_throughput():
    """Empty FIFO, output ready: a frame's first beat is on o in cycle t + 2 (t = cycle of
    its last beat on i), and then one beat per cycle. Back-to-back input is never stalled when
    the FIFO holds two frames, and the output is busy for every beat after the first frame."""
    width, nbytes = 64, 8
    frames = [(bytes([k]) * (10 * nbytes), False) for k in range(6)]
    got, log = _run(width, 20, frames)
    assert got == frames
    in_cycles = [c for c, iv, ir, _, _, _ in log if iv and ir]
    out_cycles = [c for c, _, _, ov, orr, _ in log if ov and orr]
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
