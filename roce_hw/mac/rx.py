# SPDX-License-Identifier: BSD-2-Clause
"""The 1G MAC's receiver: GMII bytes in, frames out (preamble and SFD checked, FCS checked and
stripped, runts and errors flagged and counted)."""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .. import proto
from ..lib.crc import CRC_INIT, residue_register, update_rows, xor_rows
from .common import ByteFrameSignature, gmii_layout, mac_rx_counters_layout

__all__ = ["RxMac"]

#: Shortest frame with its FCS (IEEE 802.3); shorter ones are runts.
_MIN_WITH_FCS = proto.ETH_MIN_FRAME + proto.ETH_FCS_BYTES


class RxMac(wiring.Component):
    """Byte-wide Ethernet receiver (IEEE 802.3 clause 35 GMII, one byte per cycle).

    A frame starts where ``gmii.en`` (RX_DV) rises. Before the SFD it must show 1 to
    :data:`~roce_hw.proto.ETH_PREAMBLE_BYTES` (7) preamble bytes (0x55), then the SFD (0xD5);
    anything else (another byte, a missing or a longer preamble, RX_DV falling before the SFD)
    is a **bad preamble**: nothing of the frame is passed on and ``bad_preamble`` counts it.
    After the SFD every byte up to the fall of RX_DV is the frame with its FCS. The frame leaves
    on ``o`` without its 4 FCS bytes (each byte is held until 4 more have arrived); its last byte
    carries ``last``, and ``abort`` when the frame is bad. A bad frame is counted by its first
    reason, in this order: ``phy_error`` (RX_ER during the frame), ``runt`` (under 64 bytes with
    its FCS), ``bad_fcs`` (the CRC register does not end at the residue of a good frame,
    :func:`~roce_hw.lib.crc.residue_register`); a good one in ``frames``. A frame of 4 bytes or
    fewer after the SFD never shows on ``o`` (nothing was passed on; it is a runt). Frames of
    any length above that are passed on (the consumer limits the length it takes).

    Latency: a frame byte on ``gmii`` in cycle ``c`` is on ``o`` in cycle ``c + 7`` (an input
    register, the 4-byte FCS delay line, the held byte, the output register; the line keeps
    bringing bytes); the last byte in cycle ``f + 2`` if RX_DV is low in cycle ``f``.
    Throughput: line rate (one byte per cycle).

    Backpressure: none. The line cannot wait, so ``o.valid`` is high for exactly one cycle per
    byte and ``o.ready`` must be high whenever it is (the consumer,
    :class:`~roce_hw.mac.convert.FrameWiden` followed by
    :class:`~roce_hw.mac.cdc.RxFrameCdc`, always is). A byte refused all the same is lost and
    counted in ``overflow`` (once per frame, besides its count as good or bad), and its frame
    ends in ``abort`` (if its last byte is not lost too).

    Members
    -------
    gmii : ``In(gmii_layout())``
        RX_DV (``en``), RX_ER, RXD.
    o : ``Out(ByteFrameSignature())``
        Frames without FCS; ``abort`` on the last byte of a bad frame.
    counters : ``Out(mac_rx_counters_layout())``
        Counters (wrapping; :data:`~roce_hw.proto.MAC_RX_COUNTERS`).
    """

    gmii: In(gmii_layout())
    o: Out(ByteFrameSignature())
    counters: Out(mac_rx_counters_layout())

    def elaborate(self, platform):
        m = Module()
        c = self.counters

        # Input register (the PHY's outputs may come straight from I/O cells).
        d = Signal(8)
        dv = Signal()
        er = Signal()
        m.d.sync += [d.eq(self.gmii.data), dv.eq(self.gmii.en), er.eq(self.gmii.er)]

        crc = Signal(32)
        crc_next = xor_rows(m, update_rows(8), Cat(crc, d), "crc_next")
        count = Signal(range(_MIN_WITH_FCS + 1))    # frame bytes, saturating at 64
        preamble = Signal(range(proto.ETH_PREAMBLE_BYTES + 1))
        delay = Signal(32)          # the 4 latest bytes (byte 0 the latest): maybe the FCS
        held = Signal(8)            # the byte before them: known to be a frame byte
        held_valid = Signal()
        held_first = Signal()
        sent_any = Signal()         # a byte of this frame is on ``o`` already
        error = Signal()            # RX_ER seen in this frame
        lost = Signal()             # a byte of this frame was refused on ``o``

        o_valid = Signal()
        m.d.comb += self.o.valid.eq(o_valid)
        m.d.sync += o_valid.eq(0)
        with m.If(o_valid & ~self.o.ready & ~lost):      # counted once per frame
            m.d.sync += [c.overflow.eq(c.overflow + 1), lost.eq(1)]

        def emit(last, abort=0):
            m.d.sync += [o_valid.eq(1), self.o.payload.data.eq(held),
                         self.o.payload.first.eq(held_first), self.o.payload.last.eq(last),
                         self.o.payload.abort.eq(abort)]

        with m.FSM():
            with m.State("Idle"):
                with m.If(dv):
                    with m.If(d == proto.ETH_PREAMBLE_BYTE):
                        m.d.sync += preamble.eq(1)
                        m.next = "Preamble"
                    with m.Else():
                        m.d.sync += c.bad_preamble.eq(c.bad_preamble + 1)
                        m.next = "Drop"
            with m.State("Preamble"):
                with m.If(~dv):
                    m.d.sync += c.bad_preamble.eq(c.bad_preamble + 1)
                    m.next = "Idle"
                with m.Elif((d == proto.ETH_SFD) & ~er):
                    m.d.sync += [crc.eq(CRC_INIT), count.eq(0), held_valid.eq(0),
                                 sent_any.eq(0), error.eq(0), lost.eq(0)]
                    m.next = "Data"
                with m.Elif((d == proto.ETH_PREAMBLE_BYTE) & ~er &
                            (preamble != proto.ETH_PREAMBLE_BYTES)):
                    m.d.sync += preamble.eq(preamble + 1)
                with m.Else():
                    m.d.sync += c.bad_preamble.eq(c.bad_preamble + 1)
                    m.next = "Drop"
            with m.State("Data"):
                with m.If(dv):
                    m.d.sync += [crc.eq(crc_next), delay.eq(Cat(d, delay[:24])),
                                 held.eq(delay[24:]), held_first.eq(~sent_any & ~held_valid),
                                 error.eq(error | er)]
                    with m.If(count != _MIN_WITH_FCS):
                        m.d.sync += count.eq(count + 1)
                    with m.If(count >= proto.ETH_FCS_BYTES):
                        m.d.sync += held_valid.eq(1)
                    with m.If(held_valid):
                        emit(last=0)
                        m.d.sync += sent_any.eq(1)
                with m.Else():
                    runt = count < _MIN_WITH_FCS
                    bad_fcs = crc != residue_register()
                    with m.If(held_valid):
                        emit(last=1, abort=error | runt | bad_fcs | lost)
                    with m.If(error):
                        m.d.sync += c.phy_error.eq(c.phy_error + 1)
                    with m.Elif(runt):
                        m.d.sync += c.runt.eq(c.runt + 1)
                    with m.Elif(bad_fcs):
                        m.d.sync += c.bad_fcs.eq(c.bad_fcs + 1)
                    with m.Else():
                        m.d.sync += c.frames.eq(c.frames + 1)
                    m.next = "Idle"
            with m.State("Drop"):
                with m.If(~dv):
                    m.next = "Idle"
        return m
