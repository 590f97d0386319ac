# SPDX-License-Identifier: BSD-2-Clause
"""Receive clock crossing: frames from the PHY's receive clock into the engine's clock, through
an asynchronous FIFO, with the overflow rule of a stream that cannot wait."""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.fifo import AsyncFIFO
from amaranth.lib.wiring import In, Out

from ..config import check_data_width
from ..lib.stream import FrameSignature, frame_layout

__all__ = ["RxFrameCdc", "FrameCdc"]


def _check_depth(depth):
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 4 or depth & (depth - 1):
        raise ValueError(f"depth must be a power of 2 of at least 4 beats, not {depth!r}")


class RxFrameCdc(wiring.Component):
    """Frames (:func:`~roce_hw.lib.stream.frame_layout` beats) from domain ``w_domain`` into
    domain ``r_domain`` through a :class:`amaranth.lib.fifo.AsyncFIFO` of ``depth`` beats.

    ``i.ready`` is always high: the receiver feeding it cannot wait. **Overflow**: a beat that
    finds the FIFO full is discarded with the rest of its frame, and the frame is counted in
    ``overflow`` (in ``w_domain``). If beats of the frame were already written, the frame is
    ended with one extra beat (``last`` and ``abort`` set, one byte of ``keep``) as soon as the
    FIFO has room, so the consumer sees a bad frame, never two frames run together; a frame that
    starts while that beat is still waiting is discarded whole (and counted). A frame that never
    overflows passes unchanged.

    Latency: the AsyncFIFO's (a beat is readable 3 to 4 ``r_domain`` cycles after it is
    written: two synchroniser stages and the registered read). Throughput: one beat per cycle on
    each side. The receive path of :class:`~roce_hw.mac.mac.Mac1G` writes at most one 64-bit
    beat every 8 cycles of a 125 MHz clock and the engine reads one per cycle, so at 64 bits
    overflow needs the read side stopped or its clock far slower than the write side's.

    Parameters
    ----------
    data_width : int
    depth : int
        Beats of the FIFO (a power of 2, at least 4: the AsyncFIFO's rule).
    w_domain, r_domain : str

    Members
    -------
    i : ``In(FrameSignature(data_width))`` (``w_domain``)
    o : ``Out(FrameSignature(data_width))`` (``r_domain``)
    overflow : ``Out(32)`` (``w_domain``)
        Frames cut or discarded for want of room (wrapping).
    """

    def __init__(self, data_width, depth=16, *, w_domain="eth_rx", r_domain="sync"):
        check_data_width(data_width)
        _check_depth(depth)
        self._width = data_width
        self._depth = depth
        self._w_domain = w_domain
        self._r_domain = r_domain
        super().__init__({"i": In(FrameSignature(data_width)),
                          "o": Out(FrameSignature(data_width)),
                          "overflow": Out(32)})

    def elaborate(self, platform):
        m = Module()
        wd = m.d[self._w_domain]
        layout = frame_layout(self._width)
        m.submodules.fifo = fifo = AsyncFIFO(width=layout.size, depth=self._depth,
                                             w_domain=self._w_domain, r_domain=self._r_domain)

        dropping = Signal()     # discarding the rest of the current frame
        pending = Signal()      # a terminating beat is owed to the FIFO
        in_frame = Signal()     # beats of the current frame were written
        term = Signal(layout)
        m.d.comb += [term.keep.eq(1), term.last.eq(1), term.abort.eq(1)]

        beat = self.i.valid
        p = self.i.payload
        m.d.comb += self.i.ready.eq(1)
        with m.If(pending):
            # Owe the terminator first; a new frame meanwhile is discarded whole.
            m.d.comb += [fifo.w_data.eq(term), fifo.w_en.eq(1)]
            with m.If(fifo.w_rdy):
                wd += pending.eq(0)
            with m.If(beat & p.first & ~dropping):
                wd += [self.overflow.eq(self.overflow + 1), dropping.eq(~p.last)]
            with m.Elif(beat & p.last):
                wd += dropping.eq(0)
        with m.Elif(beat & (dropping & ~p.first)):
            with m.If(p.last):
                wd += dropping.eq(0)
        with m.Elif(beat):
            m.d.comb += [fifo.w_data.eq(p), fifo.w_en.eq(1)]
            with m.If(fifo.w_rdy):
                wd += [in_frame.eq(~p.last), dropping.eq(0)]
            with m.Else():
                wd += [self.overflow.eq(self.overflow + 1), dropping.eq(~p.last),
                       pending.eq(in_frame & ~p.first), in_frame.eq(0)]

        m.d.comb += [self.o.valid.eq(fifo.r_rdy), self.o.payload.eq(fifo.r_data),
                     fifo.r_en.eq(self.o.ready)]
        return m


class FrameCdc(wiring.Component):
    """Frames (:func:`~roce_hw.lib.stream.frame_layout` beats) from domain ``w_domain`` into
    domain ``r_domain`` through a :class:`amaranth.lib.fifo.AsyncFIFO` of ``depth`` beats, with
    ordinary backpressure on both sides (``i.ready`` low while the FIFO is full).

    Latency: a beat is readable 3 to 4 ``r_domain`` cycles after it is written (two
    synchroniser stages and the registered read). Throughput: one beat per cycle on each side.
    A frame that enters without a pause leaves without one as long as the write side's beat
    rate exceeds the read side's (the transmit path of :class:`~roce_hw.mac.mac.Mac1G`: a
    64-bit beat per engine cycle in, one per 8 cycles of 125 MHz out).

    Parameters
    ----------
    data_width : int
    depth : int
        Beats of the FIFO (a power of 2, at least 4).
    w_domain, r_domain : str

    Members
    -------
    i : ``In(FrameSignature(data_width))`` (``w_domain``)
    o : ``Out(FrameSignature(data_width))`` (``r_domain``)
    """

    def __init__(self, data_width, depth=16, *, w_domain="sync", r_domain="eth_tx"):
        check_data_width(data_width)
        _check_depth(depth)
        self._width, self._depth = data_width, depth
        self._w_domain, self._r_domain = w_domain, r_domain
        super().__init__({"i": In(FrameSignature(data_width)),
                          "o": Out(FrameSignature(data_width))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.fifo = fifo = AsyncFIFO(width=frame_layout(self._width).size,
                                             depth=self._depth, w_domain=self._w_domain,
                                             r_domain=self._r_domain)
        m.d.comb += [fifo.w_data.eq(self.i.payload), fifo.w_en.eq(self.i.valid),
                     self.i.ready.eq(fifo.w_rdy),
                     self.o.valid.eq(fifo.r_rdy), self.o.payload.eq(fifo.r_data),
                     fifo.r_en.eq(self.o.ready)]
        return m
