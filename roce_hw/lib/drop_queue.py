# SPDX-License-Identifier: BSD-2-Clause
"""Item queue in RAM for a source that cannot wait: an item that finds it full is dropped, and
the source learns so in the same cycle (to count it)."""

from amaranth import *
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["DropQueue"]


class DropQueue(wiring.Component):
    """First-in first-out queue of ``depth`` items that never refuses an offer.

    ``i`` is always ready: an item offered while the queue holds ``depth`` items is dropped;
    ``room`` tells, in the cycle of the offer, whether it is stored (so the source can count
    what it lost). Items leave on ``o`` in order.

    Storage: an :class:`amaranth.lib.fifo.SyncFIFOBuffered` -- ``depth - 1`` rows of
    ``lib.memory`` with a synchronous read (which Yosys maps to LUT RAM or block RAM, not to
    flip-flops) and its output register. Up to 33 items use 32-deep LUT RAM, as 2 to 33 items
    cost the same RAM cells.

    Latency: an item offered in cycle t into an empty queue is valid on ``o`` in cycle t + 2.
    Throughput: one item per cycle in and out. Backpressure: ``o.ready``; none on ``i``.

    Parameters
    ----------
    shape : shape-like
        The items.
    depth : int
        Items held (at least 1; one item is a register only, taken every other cycle).

    Members
    -------
    i : ``In(stream.Signature(shape, always_ready=True))``
        Offered items.
    room : ``Out(1)``
        An item offered on ``i`` in this cycle is stored (combinational, from registers).
    o : ``Out(stream.Signature(shape))``
        The stored items, in order.
    """

    #: Cycles from an item on ``i`` to it on ``o`` (empty queue).
    latency = 2

    def __init__(self, shape, depth):
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be a positive integer, not {depth!r}")
        self._shape = shape
        self._depth = depth
        super().__init__({
            "i": In(stream.Signature(shape, always_ready=True)),
            "room": Out(1),
            "o": Out(stream.Signature(shape)),
        })

    @property
    def depth(self):
        return self._depth

    def elaborate(self, platform):
        m = Module()
        m.submodules.fifo = q = fifo.SyncFIFOBuffered(
            width=Shape.cast(self._shape).width, depth=self._depth)
        m.d.comb += [
            q.w_en.eq(self.i.valid),            # the FIFO writes only when w_rdy
            q.w_data.eq(self.i.payload),
            self.room.eq(q.w_rdy),
        ]
        wiring.connect(m, q.r_stream, wiring.flipped(self.o))
        return m
