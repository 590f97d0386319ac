# SPDX-License-Identifier: BSD-2-Clause
"""FramePad and the CMAC adapter of the 100G board tops: short frames padded with zeros to 60
bytes, no idle cycle inside a frame towards the CMAC (whatever the engine's pauses and the CMAC's
tready), aborted frames dropped, RX registered with first/abort rebuilt, and the bring-up
sequence without AXI4-Lite (send RFI until RX is aligned, then enable TX)."""

import random

import pytest

from platforms.cmac import CmacAdapter
from roce_hw.lib.pad import MIN_FRAME_BYTES, FramePad
from sim.harness import run_simulation
from sim.stream import PacketAssembler, beats_of, send_packet, stream_put

__all__ = []

W = 512
NB = W // 8


def _padded(frame):
    """The oracle: Ethernet's rule, zero bytes up to 60 (IEEE 802.3 minimum without FCS)."""
    return frame + bytes(max(0, 60 - len(frame)))


def _lengths(rng, n):
    # every short length around the boundary, then random ones up to 3 beats
    return [1, 14, 42, 59, 60, 61, 63, 64, 65] + [rng.randint(1, 3 * NB) for _ in range(n)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pad_short_frames_with_zeros(seed):
    rng = random.Random(seed)
    frames = [rng.randbytes(n) for n in _lengths(rng, 20)]
    dut = FramePad(W)
    got = []

    async def producer(ctx):
        for f in frames:
            await send_packet(ctx, dut.i, f, W, rng=rng, p_idle=0.3, garbage=True)

    async def consumer(ctx):
        asm = PacketAssembler(W)
        while len(got) < len(frames):
            ready = rng.random() >= 0.3
            ctx.set(dut.o.ready, ready)
            _, _, valid, p = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            if valid and ready:
                pkt = asm.add(p)
                if pkt is not None:
                    got.append(pkt)

    run_simulation(dut, [producer, consumer], cycles=5000)
    assert MIN_FRAME_BYTES == 60
    assert got == [_padded(f) for f in frames]


def test_pad_needs_a_beat_of_60_bytes():
    for width in (64, 128, 256):
        with pytest.raises(ValueError, match="512 or 1024"):
            FramePad(width)
    assert FramePad(1024).min_bytes == 60


def _adapter_run(frames, *, seed, align_at=20, unalign=None, p_idle=0.3, p_stall=0.3,
                 min_cycles=0, cycles=20000):
    """Frames [(bytes, aborted)] into ``tx``; returns (frames seen on ``cmac_tx`` [(bytes,
    user)], per-cycle log of (tx_enable, send_rfi, rx_enable, valid, ready, last) and the
    cycles at which a frame had an idle cycle inside it)."""
    dut = CmacAdapter(fifo_depth=2 * 68)
    rng = random.Random(seed)
    rng_i, rng_o = random.Random(rng.random()), random.Random(rng.random())
    expect = sum(1 for _, a in frames if not a)
    out, log, gaps = [], [], []

    async def producer(ctx):
        for data, aborted in frames:
            for beat in beats_of(data, W):
                await stream_put(ctx, dut.tx, dict(beat, abort=int(aborted and beat["last"])),
                                 rng=rng_i, p_idle=p_idle)

    async def cmac(ctx):
        cycle, cur, inside = 0, bytearray(), False
        while len(out) < expect or cycle < min_cycles:
            aligned = align_at <= cycle and not (unalign and unalign[0] <= cycle < unalign[1])
            ctx.set(dut.stat_rx_aligned, aligned)
            ready = rng_o.random() >= p_stall
            ctx.set(dut.cmac_tx.ready, ready)
            _, _, en, rfi, rxen, valid, p = await ctx.tick().sample(
                dut.ctl_tx_enable, dut.ctl_tx_send_rfi, dut.ctl_rx_enable, dut.cmac_tx.valid,
                dut.cmac_tx.payload)
            log.append((int(en), int(rfi), int(rxen), int(valid), ready, int(p.last)))
            if inside and not valid:
                gaps.append(cycle)
            if valid and ready:
                cur += int(p.data).to_bytes(NB, "little")[:int(p.keep).bit_length()]
                inside = not p.last
                if p.last:
                    out.append((bytes(cur), int(p.user)))
                    cur = bytearray()
            cycle += 1

    run_simulation(dut, [producer, cmac], cycles=cycles)
    return out, log, gaps


@pytest.mark.parametrize("seed", [1, 2])
def test_adapter_tx_frames_whole_and_padded(seed):
    rng = random.Random(seed)
    frames = [(rng.randbytes(n), rng.random() < 0.2) for n in _lengths(rng, 25)]
    out, log, gaps = _adapter_run(frames, seed=seed)
    assert out == [(_padded(f), 0) for f, aborted in frames if not aborted]
    assert gaps == [], f"idle cycles inside a frame towards the CMAC at {gaps}"


def test_adapter_bring_up_sequence():
    """RX enabled from reset; RFI sent and TX disabled until aligned; nothing offered to the
    CMAC before TX is enabled; after alignment is lost, RFI again; TX enabled again after."""
    rng = random.Random(7)
    frames = [(rng.randbytes(rng.randint(1, 200)), False) for _ in range(60)]
    out, log, gaps = _adapter_run(frames, seed=7, align_at=30, unalign=(200, 260),
                                   min_cycles=400)
    assert out == [(_padded(f), 0) for f, _ in frames] and gaps == []
    en, rfi, rxen = ([r[i] for r in log] for i in range(3))
    assert all(rxen[2:])
    assert en[:30] == [0] * 30 and all(rfi[1:30])              # not aligned: RFI, TX off
    first_on = en.index(1)
    assert 30 <= first_on <= 33 and rfi[first_on] == 0
    assert not any(r[3] for r in log[:first_on])               # nothing sent before
    # (en, rfi) are never both set or both clear once out of reset
    assert all(e != r for e, r in zip(en[2:], rfi[2:]))
    lost = [c for c in range(201, len(en)) if en[c] == 0]
    assert lost and lost[0] <= 203 and en[lost[0] - 1] == 1    # alignment loss seen quickly
    assert any(en[c] for c in range(262, len(en)))             # and back up


@pytest.mark.parametrize("seed", [1, 2])
def test_adapter_rx_registers_and_rebuilds_first(seed):
    """The CMAC's rx_axis (no tready, gaps between and inside frames) onto the engine's rx:
    one cycle later, first rebuilt, abort = tuser on the last beat."""
    rng = random.Random(seed)
    frames = [(rng.randbytes(rng.randint(1, 3 * NB)), rng.random() < 0.3) for _ in range(30)]
    dut = CmacAdapter(fifo_depth=8)
    sent, got = [], []

    async def cmac(ctx):
        for data, bad in frames:
            for beat in beats_of(data, W):
                while rng.random() < 0.3:
                    ctx.set(dut.cmac_rx.valid, 0)
                    await ctx.tick()
                ctx.set(dut.cmac_rx.payload, {"data": beat["data"], "keep": beat["keep"],
                                              "last": beat["last"],
                                              "user": int(bad and beat["last"])})
                ctx.set(dut.cmac_rx.valid, 1)
                await ctx.tick()
            sent.append((data, bad))
        ctx.set(dut.cmac_rx.valid, 0)

    async def engine(ctx):
        asm = PacketAssembler(W)
        while len(got) < len(frames):
            _, _, valid, p = await ctx.tick().sample(dut.rx.valid, dut.rx.payload)
            if valid:
                pkt = asm.add(p)
                if pkt is not None:
                    got.append((pkt, bool(p.abort)))

    run_simulation(dut, [cmac, engine], cycles=5000)
    assert got == frames
