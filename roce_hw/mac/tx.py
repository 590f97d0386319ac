# SPDX-License-Identifier: BSD-2-Clause
"""The 1G MAC's transmitter: frames in, GMII bytes out (preamble, SFD, padding, FCS, gap)."""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .. import proto
from ..lib.crc import CRC_INIT, update_rows, xor_rows
from .common import ByteFrameSignature, gmii_layout, mac_tx_counters_layout

__all__ = ["TxMac"]


class TxMac(wiring.Component):
    """Byte-wide Ethernet transmitter (IEEE 802.3 clause 35 GMII, one byte per cycle).

    Each frame on ``i`` (without FCS) leaves on ``gmii`` as 7 preamble bytes, the SFD, the
    frame's bytes, zero bytes up to :data:`~roce_hw.proto.ETH_MIN_FRAME` (60) if it is shorter,
    and the FCS (``zlib.crc32`` of the padded frame, least significant byte first; computed by
    :func:`~roce_hw.lib.crc.update_rows`, one byte per cycle); then ``en`` stays low for at least
    :data:`~roce_hw.proto.ETH_IFG_BYTES` (12) cycles. Back to back, a frame of ``L`` bytes
    (``L`` >= 60, else 60) therefore takes exactly ``L + 8 + 4 + 12`` cycles: line rate,
    1 Gb/s at 125 MHz. ``er`` is always 0.

    Latency: a first byte offered in cycle ``t`` while idle (the gap over) is taken in cycle
    ``t + 9`` (one cycle to start, 8 of preamble, whose first byte is on ``gmii`` in ``t + 2``);
    ``gmii`` is registered, and shows a byte the cycle after it is taken.

    Backpressure: ``i.ready`` is high exactly in the cycles in which a frame byte is sent. The
    line cannot wait: once a frame has started, its next byte must be valid in the cycle after
    the previous one was taken. **Underrun**: if it is not, the frame is ended there with an
    inverted FCS (every receiver drops it), ``underruns`` counts it, and the rest of that frame
    is taken and discarded as it arrives (up to its ``last``). **Abort**: a frame whose last
    byte carries ``abort`` is sent with an inverted FCS too (its bytes are on the line
    already) and counted in ``aborted``. Put a store-and-forward FIFO in front to avoid both
    (:class:`~roce_hw.lib.frame_fifo.FrameFifo` with ``abort="drop"`` drops aborted frames and
    sends complete ones without a pause, as :class:`~roce_hw.mac.mac.Mac1G` does). A byte
    without ``first`` offered between frames is discarded.

    Members
    -------
    i : ``In(ByteFrameSignature())``
        Frames, one byte per beat, without FCS.
    gmii : ``Out(gmii_layout())``
        TX_EN, TX_ER, TXD, registered.
    counters : ``Out(mac_tx_counters_layout())``
        Frames sent with a good FCS / with an inverted FCS because of ``abort`` / because of an
        underrun (wrapping; :data:`~roce_hw.proto.MAC_TX_COUNTERS`).
    """

    i: In(ByteFrameSignature())
    gmii: Out(gmii_layout())
    counters: Out(mac_tx_counters_layout())

    def elaborate(self, platform):
        m = Module()
        c = self.counters
        min_frame = proto.ETH_MIN_FRAME

        crc = Signal(32, init=CRC_INIT)
        crc_byte = Signal(8)            # the frame byte sent this cycle (data or padding)
        crc_next = xor_rows(m, update_rows(8), Cat(crc, crc_byte), "crc_next")
        sent = Signal(range(min_frame + 1))     # frame bytes sent, saturating at 60
        count = Signal(range(proto.ETH_IFG_BYTES))   # position in the preamble, FCS or gap
        bad = Signal()                  # send the FCS inverted
        drain = Signal()                # discarding the rest of an underrun frame
        why = Signal(2)                 # 0: good, 1: aborted, 2: underrun

        out_data = Signal(8)
        out_en = Signal()
        m.d.sync += [self.gmii.data.eq(out_data), self.gmii.en.eq(out_en),
                     self.gmii.er.eq(0)]

        # A discarded byte: the rest of an underrun frame (``drain``, never set in "Data"), or
        # a stray byte without ``first`` between frames.
        take_data = Signal()
        take_drain = Signal()
        m.d.comb += self.i.ready.eq(take_data | take_drain)
        with m.If(take_drain & self.i.valid & self.i.payload.last):
            m.d.sync += drain.eq(0)
        m.d.comb += take_drain.eq(drain)

        with m.FSM():
            with m.State("Idle"):
                # One cycle of the gap is spent here (the other 11 in "Gap").
                with m.If(self.i.valid & ~self.i.payload.first):
                    m.d.comb += take_drain.eq(1)
                with m.If(self.i.valid & self.i.payload.first & ~drain):
                    m.d.sync += [count.eq(0), sent.eq(0), crc.eq(CRC_INIT), bad.eq(0),
                                 why.eq(0)]
                    m.next = "Preamble"
            with m.State("Preamble"):
                m.d.comb += [out_en.eq(1),
                             out_data.eq(Mux(count == proto.ETH_PREAMBLE_BYTES, proto.ETH_SFD,
                                             proto.ETH_PREAMBLE_BYTE))]
                m.d.sync += count.eq(count + 1)
                with m.If(count == proto.ETH_PREAMBLE_BYTES):
                    m.d.sync += count.eq(0)
                    m.next = "Data"
            with m.State("Data"):
                m.d.comb += [take_data.eq(1), out_en.eq(1), crc_byte.eq(self.i.payload.data)]
                with m.If(self.i.valid):
                    m.d.comb += out_data.eq(self.i.payload.data)
                    m.d.sync += crc.eq(crc_next)
                    with m.If(sent != min_frame):
                        m.d.sync += sent.eq(sent + 1)
                    with m.If(self.i.payload.last):
                        m.d.sync += [bad.eq(self.i.payload.abort),
                                     why.eq(Mux(self.i.payload.abort, 1, 0))]
                        with m.If(sent < min_frame - 1):
                            m.next = "Pad"
                        with m.Else():
                            m.next = "Fcs"
                with m.Else():
                    # Underrun: the FCS starts in this very cycle (the line must not pause),
                    # inverted: its first byte is the register's own low byte.
                    m.d.comb += out_data.eq(crc[:8])
                    m.d.sync += [bad.eq(1), why.eq(2), drain.eq(1), count.eq(1)]
                    m.next = "Fcs"
            with m.State("Pad"):
                m.d.comb += [out_en.eq(1), out_data.eq(0), crc_byte.eq(0)]
                m.d.sync += [crc.eq(crc_next), sent.eq(sent + 1)]
                with m.If(sent == min_frame - 1):
                    m.next = "Fcs"
            with m.State("Fcs"):
                fcs = Signal(32)
                m.d.comb += [fcs.eq(Mux(bad, crc, ~crc)), out_en.eq(1),
                             out_data.eq(fcs.word_select(count[:2], 8))]
                m.d.sync += count.eq(count + 1)
                with m.If(count == proto.ETH_FCS_BYTES - 1):
                    m.d.sync += count.eq(0)
                    with m.Switch(why):
                        with m.Case(0):
                            m.d.sync += c.frames.eq(c.frames + 1)
                        with m.Case(1):
                            m.d.sync += c.aborted.eq(c.aborted + 1)
                        with m.Default():
                            m.d.sync += c.underruns.eq(c.underruns + 1)
                    m.next = "Gap"
            with m.State("Gap"):
                m.d.sync += count.eq(count + 1)
                with m.If(count == proto.ETH_IFG_BYTES - 2):
                    m.next = "Idle"
        return m
