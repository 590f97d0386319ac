# SPDX-License-Identifier: BSD-2-Clause
"""Item queue in RAM for a source that cannot wait: an item that finds it full is dropped, and
the source learns so in the same cycle (to count it)."""

from amaranth import *
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["DropQueue"]


class DropQueue(wiring.Component):
    """First-in first-out queue of ``depth`` items that never refuses an offer.

    ``i`` is always ready: an item offered while the queue's RAM is full is dropped; ``room``
    tells, in the cycle of the offer, whether it is stored (so the source can count what it
    lost). Items leave on ``o`` in order. What it takes and gives is exactly what an
    :class:`amaranth.lib.fifo.SyncFIFOBuffered` of the same depth would (its ``w_rdy`` is
    ``room``), but every flag is a register, so that the queue adds one LUT level to the logic
    that offers (the write enable and ``room``), at any depth.

    Storage: ``depth - 1`` rows of ``lib.memory`` with a synchronous read (Yosys maps it to LUT
    RAM or block RAM, never to flip-flops) and the output register. The row pointers wrap at
    ``depth - 1`` (no power of two needed: each pointer keeps its successor in a register); the
    number of rows in use is kept with its successor and predecessor, and ``room`` (rows in use
    below ``depth - 1``) and "a row to read" are registered from them.

    Latency: an item offered in cycle t into an empty queue is valid on ``o`` in cycle t + 2.
    Throughput: one item per cycle in and out. Backpressure: ``o.ready``; none on ``i``.

    Parameters
    ----------
    shape : shape-like
        The items.
    depth : int
        Items held (at least 2).

    Members
    -------
    i : ``In(stream.Signature(shape, always_ready=True))``
        Offered items.
    room : ``Out(1)``
        An item offered on ``i`` in this cycle is stored (a register).
    o : ``Out(stream.Signature(shape))``
        The stored items, in order.
    """

    #: Cycles from an item on ``i`` to it on ``o`` (empty queue).
    latency = 2

    def __init__(self, shape, depth):
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 2:
            raise ValueError(f"depth must be an integer of at least 2, not {depth!r}")
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
        rows = self._depth - 1
        m.submodules.mem = mem = memory.Memory(shape=self._shape, depth=rows, init=[])
        wr = mem.write_port()
        rd = mem.read_port(transparent_for=())

        def pointer(name):
            """A row pointer and its successor (wrapping at ``rows``), and the statements
            that advance both (no adder or compare behind the enable)."""
            cur = Signal(range(rows), name=name)
            nxt = Signal(range(rows), name=f"{name}_next", init=1 % rows)
            wrap = Signal(name=f"{name}_wrap")
            m.d.comb += wrap.eq(nxt == rows - 1)
            return cur, [cur.eq(nxt), nxt.eq(Mux(wrap, 0, nxt + 1))]

        wp, wp_step = pointer("wp")
        rp, rp_step = pointer("rp")
        room = Signal(init=1)                   # rows in use < rows
        avail = Signal()                        # rows in use > 0
        o_valid = Signal()
        write = Signal()
        load = Signal()                         # a row into the output register
        m.d.comb += [
            write.eq(self.i.valid & room),
            load.eq(avail & (~o_valid | self.o.ready)),
            wr.addr.eq(wp), wr.data.eq(self.i.payload), wr.en.eq(write),
            rd.addr.eq(rp), rd.en.eq(load),
            self.room.eq(room),
            self.o.valid.eq(o_valid),
            self.o.payload.eq(rd.data),
        ]
        with m.If(write):
            m.d.sync += wp_step
        with m.If(load):
            m.d.sync += rp_step
        with m.If(load):
            m.d.sync += o_valid.eq(1)
        with m.Elif(self.o.ready):
            m.d.sync += o_valid.eq(0)

        # Rows in use, with its successor and predecessor: the compares that give the next
        # flags read registers only.
        used = Signal(range(rows + 1))
        used_up = Signal(len(used) + 1, init=1)
        used_dn = Signal(len(used))             # (meaningless while `used` is 0: no load)
        below_last = Signal()                   # used + 1 < rows
        above_one = Signal()                    # used - 1 > 0
        m.d.comb += [below_last.eq(used < rows - 1), above_one.eq(used > 1)]
        # (`load` selects last: it depends on `o.ready`, which may come late)
        with m.If(load):
            with m.If(~write):
                m.d.sync += [used.eq(used_dn), used_up.eq(used), used_dn.eq(used_dn - 1),
                             room.eq(1), avail.eq(above_one)]
        with m.Elif(write):
            m.d.sync += [used.eq(used_up), used_up.eq(used_up + 1), used_dn.eq(used),
                         room.eq(below_last), avail.eq(1)]
        return m
