# SPDX-License-Identifier: BSD-2-Clause
"""sim.stream and sim.harness: the BFMs move bytes intact and catch bad framing; deadlines hold."""

import random

import pytest
from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from roce_hw.lib.stream import PacketSignature
from sim.harness import run_simulation
from sim.stream import PacketAssembler, beats_of, framing_error, recv_packet, send_packet

__all__ = []


class _Reg(wiring.Component):
    """One-stage stream register; ``break_first`` forces ``first`` high on every beat."""

    def __init__(self, width, break_first=False):
        self._break_first = break_first
        super().__init__({"i": In(PacketSignature(width)), "o": Out(PacketSignature(width))})

    def elaborate(self, platform):
        m = Module()
        with m.If(self.o.ready | ~self.o.valid):
            m.d.comb += self.i.ready.eq(1)
            m.d.sync += [self.o.valid.eq(self.i.valid), self.o.payload.eq(self.i.payload)]
            if self._break_first:
                m.d.sync += self.o.payload.first.eq(1)
        return m


def test_beats_of_and_framing_error():
    beats = beats_of(bytes(range(19)), 64)
    assert [(b["keep"], b["first"], b["last"]) for b in beats] == \
        [(0xFF, 1, 0), (0xFF, 0, 0), (0x07, 0, 1)]
    assert beats[2]["data"] == int.from_bytes(bytes([16, 17, 18]), "little")
    with pytest.raises(ValueError):
        beats_of(b"", 64)
    assert framing_error(0, 0xFF, 1, 0, 8) is None
    assert framing_error(2, 0x07, 0, 1, 8) is None
    assert "first" in framing_error(1, 0xFF, 1, 0, 8)
    assert "first" in framing_error(0, 0xFF, 0, 1, 8)
    assert "keep" in framing_error(0, 0x05, 1, 1, 8)
    assert "keep" in framing_error(0, 0x00, 1, 1, 8)
    assert "without last" in framing_error(0, 0x0F, 1, 0, 8)


def test_packet_assembler():
    """Beats in, packets out at their last beat (lanes beyond ``keep`` dropped); a framing
    error is an assertion."""
    from types import SimpleNamespace as Beat
    asm = PacketAssembler(64)
    for pkt in (bytes(range(19)), b"\x01", bytes(range(8))):
        beats = beats_of(pkt, 64)
        got = [asm.add(Beat(**dict(b, data=b["data"] | (0xEE << 56 if b["keep"] < 0xFF else 0))))
               for b in beats]
        assert got == [None] * (len(beats) - 1) + [pkt] and asm.index == 0
    asm.add(Beat(**beats_of(bytes(16), 64)[0]))
    assert asm.index == 1
    with pytest.raises(AssertionError, match="first"):
        asm.add(Beat(**beats_of(bytes(8), 64)[0]))          # a second first beat


@pytest.mark.parametrize("width", [64, 512])
def test_round_trip_with_idle_and_backpressure(width):
    rng = random.Random(width)
    pkts = [rng.randbytes(rng.randint(1, 3 * width // 8 + 5)) for _ in range(12)]
    dut = _Reg(width)
    got = []

    async def producer(ctx):
        for p in pkts:
            await send_packet(ctx, dut.i, p, width, rng=rng, p_idle=0.3)

    async def consumer(ctx):
        crng = random.Random(width + 1)
        for _ in pkts:
            got.append(await recv_packet(ctx, dut.o, width, rng=crng, p_stall=0.3))

    run_simulation(dut, [producer, consumer], cycles=5000)
    assert got == pkts


def test_recv_packet_catches_a_broken_first_flag():
    dut = _Reg(64, break_first=True)

    async def producer(ctx):
        await send_packet(ctx, dut.i, bytes(20), 64)

    async def consumer(ctx):
        await recv_packet(ctx, dut.o, 64)

    with pytest.raises(AssertionError, match="beat 1: first=1"):
        run_simulation(dut, [producer, consumer], cycles=200)


def test_harness_deadline_raises_instead_of_hanging():
    dut = _Reg(64)

    async def never_done(ctx):
        # Waits with plain ticks: a testbench abandoned inside ``tick().until()`` makes
        # Amaranth print "aclose(): asynchronous generator is already running" at exit.
        while True:
            await ctx.tick()

    with pytest.raises(TimeoutError, match="within 300 cycles"):
        run_simulation(dut, [never_done], cycles=300)
