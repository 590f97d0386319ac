# SPDX-License-Identifier: BSD-2-Clause
"""The whole 1G MAC between the engine's frame bus and GMII: transmit FIFO, width converters,
transmitter, receiver and the receive clock crossing."""

from amaranth import *
from amaranth.hdl import DomainRenamer
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .. import proto
from ..config import check_data_width
from ..lib.frame_fifo import FrameFifo
from ..lib.stream import FrameSignature, ReadyBreak, frame_layout
from .cdc import FrameCdc, RxFrameCdc
from .common import gmii_layout, mac_counters_layout
from .convert import FrameNarrow, FrameWiden
from .rx import RxMac
from .tx import TxMac

__all__ = ["Mac1G"]


class Mac1G(wiring.Component):
    """A 1 Gb/s Ethernet MAC with a ``data_width``-bit frame bus on the engine's side.

    Transmit: the FIFO in ``sync`` (the engine's clock), the rest in ``tx_domain`` (the GMII
    transmit clock, 125 MHz)::

        tx -> FrameFifo(abort="drop") [-> FrameCdc -> ReadyBreak] -> FrameNarrow -> TxMac -> gmii_tx

    (the crossing only when ``tx_domain`` is not ``sync``: then the engine may run slower than
    125 MHz; at 64 bits anything above about 20 MHz keeps up with the line.)

    The store-and-forward FIFO (:class:`~roce_hw.lib.frame_fifo.FrameFifo`, ``tx_fifo_depth``
    beats) sends a frame only once it is whole, then without a pause, so the transmitter never
    underruns however the engine's output pauses inside a frame; frames with ``abort`` are
    dropped there (``counters.tx.fifo_dropped``) and never reach the line. A frame must fit in
    the FIFO (``tx_fifo_depth * data_width / 8`` bytes): a longer one would stall it for good,
    so size it for the longest frame (:meth:`fifo_depth_for`). Once the FIFO releases a
    frame, it enters the crossing one beat per ``sync`` cycle, faster than the line takes it, so
    the crossing does not break the no-pause guarantee.

    Receive, in ``rx_domain`` (the PHY's receive clock) up to the crossing::

        gmii_rx -> RxMac -> FrameWiden -> RxFrameCdc -> rx   (rx in ``sync``)

    Frames leave on ``rx`` without FCS; a bad one (FCS, runt, PHY error, overflow) ends with
    ``abort`` on its last beat, as :class:`~roce_hw.engine.RoceEngine`'s ``rx`` expects (it
    discards and counts it); a frame with a bad preamble, or of 4 bytes or fewer after its SFD,
    does not show at all. ``rx`` has no backpressure to speak of: the crossing's FIFO
    (``rx_fifo_depth`` beats) overflows only if ``rx.ready`` stays low (see
    :class:`~roce_hw.mac.cdc.RxFrameCdc`).

    Latency: transmit, a frame whose last beat is transferred on ``tx`` in cycle ``t`` (FIFO
    empty, line idle) has its first preamble byte on ``gmii_tx`` in cycle ``t + 4`` (FIFO 2,
    converter 1, transmitter 1) and its first byte in ``t + 12`` (measured by
    ``tests/test_mac.py``). Receive: a byte on ``gmii_rx`` reaches its beat on ``rx`` after 8
    ``rx_domain`` cycles (receiver 7, converter 1; a beat leaves with its last byte) plus the
    crossing's 3-4 ``sync`` cycles.
    Throughput: line rate both ways (1 Gb/s at 125 MHz: a frame of ``L`` >= 60 bytes every
    ``L + 24`` cycles back to back).

    Parameters
    ----------
    data_width : int
    tx_fifo_depth : int
        Beats of the transmit FIFO (default 256: frames of up to 2048 bytes at 64 bits).
    rx_fifo_depth : int
        Beats of the receive crossing's FIFO (a power of 2).
    rx_domain, tx_domain : str
        The PHY's receive clock domain; the transmit clock domain (``sync``: no crossing).

    Members
    -------
    tx : ``In(FrameSignature(data_width))``
        Frames to send, without FCS (``sync``).
    rx : ``Out(FrameSignature(data_width))``
        Frames received, without FCS (``sync``).
    gmii_tx : ``Out(gmii_layout())`` (``tx_domain``)
    gmii_rx : ``In(gmii_layout())`` (``rx_domain``)
    counters : ``Out(mac_counters_layout())``
        ``tx`` in ``tx_domain`` (``fifo_dropped`` in ``sync``), ``rx`` in ``rx_domain`` (read
        them there, or through a synchroniser); ``rx.overflow`` adds the receiver's and the
        crossing's.
    """

    def __init__(self, data_width=64, *, tx_fifo_depth=256, rx_fifo_depth=16,
                 rx_domain="eth_rx", tx_domain="sync"):
        self._width = check_data_width(data_width)
        self._tx_domain = tx_domain
        self._tx_fifo_depth = tx_fifo_depth
        self._rx_fifo_depth = rx_fifo_depth
        self._rx_domain = rx_domain
        super().__init__({
            "tx": In(FrameSignature(data_width)),
            "rx": Out(FrameSignature(data_width)),
            "gmii_tx": Out(gmii_layout()),
            "gmii_rx": In(gmii_layout()),
            "counters": Out(mac_counters_layout()),
        })

    @staticmethod
    def fifo_depth_for(max_frame, data_width=64):
        """Transmit FIFO beats for frames of up to ``max_frame`` bytes (without FCS): the next
        power of 2 (it sizes a RAM anyway), at least 2."""
        beats = -(-max_frame // (data_width // 8))
        return max(2, 1 << (beats - 1).bit_length())

    def elaborate(self, platform):
        m = Module()
        w = self._width
        rx_dom = DomainRenamer({"sync": self._rx_domain})

        tx_dom = DomainRenamer({"sync": self._tx_domain})
        m.submodules.tx_fifo = tx_fifo = FrameFifo(w, self._tx_fifo_depth, abort="drop")
        narrow = FrameNarrow(w)
        tx_mac = TxMac()
        m.submodules.tx_narrow = tx_dom(narrow)
        m.submodules.tx_mac = tx_dom(tx_mac)
        wiring.connect(m, wiring.flipped(self.tx), tx_fifo.i)
        if self._tx_domain == "sync":
            wiring.connect(m, tx_fifo.o, narrow.i)
        else:
            m.submodules.tx_cdc = tx_cdc = FrameCdc(w, w_domain="sync",
                                                    r_domain=self._tx_domain)
            # The converter's ready is combinational from the transmitter's state; into the
            # AsyncFIFO's read pointer and its RAM's address it made a 9 ns path (Versa, seed
            # 1: 110.6 MHz against 125). The ready break takes it from a register.
            tx_break = ReadyBreak(frame_layout(w))
            m.submodules.tx_break = tx_dom(tx_break)
            wiring.connect(m, tx_fifo.o, tx_cdc.i)
            wiring.connect(m, tx_cdc.o, tx_break.i)
            wiring.connect(m, tx_break.o, narrow.i)
        wiring.connect(m, narrow.o, tx_mac.i)
        m.d.comb += self.gmii_tx.eq(tx_mac.gmii)

        rx_mac = RxMac()
        widen = FrameWiden(w)
        m.submodules.rx_mac = rx_dom(rx_mac)
        m.submodules.rx_widen = rx_dom(widen)
        m.submodules.rx_cdc = cdc = RxFrameCdc(w, self._rx_fifo_depth,
                                               w_domain=self._rx_domain, r_domain="sync")
        m.d.comb += rx_mac.gmii.eq(self.gmii_rx)
        wiring.connect(m, rx_mac.o, widen.i)
        wiring.connect(m, widen.o, cdc.i)
        wiring.connect(m, cdc.o, wiring.flipped(self.rx))

        c = self.counters
        m.d.comb += [getattr(c.tx, name).eq(getattr(tx_mac.counters, name))
                     for name in proto.MAC_TX_COUNTERS]
        m.d.comb += c.tx.fifo_dropped.eq(tx_fifo.frames_dropped)
        m.d.comb += [getattr(c.rx, name).eq(getattr(rx_mac.counters, name))
                     for name in proto.MAC_RX_COUNTERS if name != "overflow"]
        m.d.comb += c.rx.overflow.eq(rx_mac.counters.overflow + cdc.overflow)
        return m
