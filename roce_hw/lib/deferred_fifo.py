# SPDX-License-Identifier: BSD-2-Clause
"""Store-and-forward frame FIFO whose keep-or-discard decision for a frame comes after the frame.

A receiver that must decide whether to pass a frame on only once it has checked the whole frame
(checksums, lengths, ...) stores every frame as it arrives and learns its fate a few cycles after
the last beat, while the next frames are already being stored. :class:`DeferredFrameFifo` keeps
the frames in one memory, in order, and a small queue of frame ends; the decisions arrive in frame
order on ``decide``; the read side sends the kept frames and jumps over the discarded ones.
"""

from amaranth import *
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ..config import check_data_width
from .stream import FrameSignature, frame_layout

__all__ = ["DeferredFrameFifo"]


class DeferredFrameFifo(wiring.Component):
    """Frame FIFO with a late keep/discard decision per frame, for a source without backpressure.

    Every frame on ``i`` is written to the memory as it arrives (``i`` is always ready: a MAC
    cannot wait). A frame that does not fit -- a beat finds no free row, or ``max_frames``
    frames are already held -- is discarded whole, never cut: its rows are given back at its
    last beat. In the cycle after each frame's last beat ``stored`` reports whether it was kept
    in the memory (``ok``). For every frame with ``ok`` = 1 the user gives one decision on
    ``decide``, in frame order, at any later time: ``keep`` = 1 sends the frame on ``o``,
    ``keep`` = 0 discards it. Frames leave in order; a frame starts on ``o`` only once its
    decision is known (so only after its last beat was stored), then flows one beat per cycle,
    paused only by ``o.ready``. The beats are the received ones: ``data`` (lanes beyond ``keep``
    included), ``keep``, ``first``, ``last``, ``abort`` as they came.

    Storage: ``depth`` rows of one beat (``lib.memory``, one write and one synchronous read
    port); the longest frame that can pass is ``depth`` beats. A frame table of
    ``max_frames`` entries (LUT RAM, read asynchronously) holds, per frame in order, the row
    after its end and its decision. Rows of a frame are held until it has been sent or jumped
    over; a discarded frame is jumped over in one cycle once it is at the head. The "room" flags
    (rows, frames) are registered from the previous cycle's pointers: safe, since at most one
    row and one frame can be added per cycle (a row or a frame freed in the last cycle is only
    seen one cycle later).

    Latency (empty FIFO, ``o.ready`` high): a frame whose decision is given in cycle t starts on
    ``o`` in cycle t + 2 (table write, memory read). Throughput: one beat per cycle in and out;
    kept frames leave back to back; a discarded frame costs one read-side cycle.

    Parameters
    ----------
    data_width : int
        Bus width in bits (64 to 1024).
    depth : int
        Rows of storage (beats), a power of two, at least 2.
    max_frames : int
        Frames held at once (being written, waiting for their decision, or waiting to leave),
        at least 2.

    Members
    -------
    i : ``In(stream.Signature(frame_layout(data_width), always_ready=True))``
        Frames.
    stored : ``Out(stream.Signature(StructLayout({"ok": 1}), always_ready=True))``
        One pulse per frame, the cycle after its last beat: ``ok`` = 1 if it is in the memory
        and waits for its decision.
    decide : ``In(stream.Signature(StructLayout({"keep": 1}), always_ready=True))``
        One decision per frame reported with ``ok`` = 1, in order, no earlier than its
        ``stored`` pulse (never more decisions than such frames).
    o : ``Out(FrameSignature(data_width))``
        The kept frames.
    """

    #: Cycles from a frame's last beat on ``i`` to its report on ``stored``.
    stored_latency = 1

    def __init__(self, data_width, depth, *, max_frames=32):
        self._width = check_data_width(data_width)
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 2 or \
                depth & (depth - 1):
            raise ValueError(f"depth must be a power of two of at least 2 rows, not {depth!r}")
        if isinstance(max_frames, bool) or not isinstance(max_frames, int) or max_frames < 2:
            raise ValueError(f"max_frames must be an integer of at least 2, not {max_frames!r}")
        self._depth = depth
        self._max_frames = max_frames
        super().__init__({
            "i": In(stream.Signature(frame_layout(data_width), always_ready=True)),
            "stored": Out(stream.Signature(data.StructLayout({"ok": 1}), always_ready=True)),
            "decide": In(stream.Signature(data.StructLayout({"keep": 1}), always_ready=True)),
            "o": Out(FrameSignature(data_width)),
        })

    @property
    def depth(self):
        return self._depth

    @property
    def max_frames(self):
        return self._max_frames

    def elaborate(self, platform):
        m = Module()
        depth, k = self._depth, self._depth.bit_length() - 1
        nf = self._max_frames
        m.submodules.mem = mem = memory.Memory(shape=frame_layout(self._width), depth=depth,
                                               init=[])
        wp = mem.write_port()
        rp = mem.read_port(transparent_for=())

        # Frame table, one entry per frame in order: where the next frame starts (``end``, the
        # row after its last one) and that plus one, written at the frame's last beat; its
        # decision, written when it comes. Small memories read asynchronously (LUT RAM), with
        # three pointers: `produce` (next entry to write), `dec` (next to decide), `consume`
        # (head). A pointer has a wrap bit; `*_inc` registers hold pointer + 1 so that no adder
        # sits behind a decision.
        ptr_shape = k + 1
        fb = max(1, (nf - 1).bit_length())
        m.submodules.ends = ends = memory.Memory(
            shape=data.StructLayout({"end": ptr_shape, "end_inc": ptr_shape}), depth=1 << fb,
            init=[])
        m.submodules.keeps = keeps = memory.Memory(shape=1, depth=1 << fb, init=[])
        ends_w = ends.write_port()
        ends_r = ends.read_port(domain="comb")
        keeps_w = keeps.write_port()
        keeps_r = keeps.read_port(domain="comb")

        def counter(name, init=0):
            value = Signal(fb + 1, name=name, init=init)
            inc = Signal(fb + 1, name=f"{name}_inc", init=init + 1)
            return value, inc

        def advance(value, inc):
            return [value.eq(inc), inc.eq(inc + 1)]

        produce, produce_inc = counter("produce")
        dec, dec_inc = counter("dec")
        consume, consume_inc = counter("consume")

        # Pointers into the rows carry a wrap bit.
        wr_ptr = Signal(ptr_shape)
        wr_inc = Signal(ptr_shape, init=1)
        start = Signal(ptr_shape)           # wr_ptr at the first beat of the current frame
        start_inc = Signal(ptr_shape, init=1)
        rd_ptr = Signal(ptr_shape)
        rd_inc = Signal(ptr_shape, init=1)

        # Room, from the previous cycle's registers and therefore safe: at most one row and one
        # frame were added since. After a frame was given back, the row flag computed from the
        # value it went back to is used, so the next frame finds that room at once; the frame
        # flag counts the frame taken in the previous cycle only if there was one, so exactly
        # `max_frames` frames fit.
        acq = Signal(fb + 2)                # frames given a slot (wrapping)
        rel = Signal(fb + 2)                # frames that left the table (wrapping)
        full_w = Signal()                   # no row, counting the rows written
        full_s = Signal()                   # no row once the current frame is given back
        nf_w = Signal()                     # no frame slot, counting a frame taken last cycle
        nf_g = Signal()                     # no frame slot, none taken last cycle
        gave = Signal()
        took = Signal()
        m.d.sync += [
            full_w.eq(((wr_ptr - rd_ptr)[:ptr_shape]) >= depth - 1),
            full_s.eq(((start - rd_ptr)[:ptr_shape]) >= depth - 1),
            nf_w.eq(((acq - rel)[:fb + 2]) >= nf - 1),
            nf_g.eq(((acq - rel)[:fb + 2]) >= nf),
        ]
        rows_full = Signal()
        frames_full = Signal()
        m.d.comb += [rows_full.eq(Mux(gave, full_s, full_w)),
                     frames_full.eq(Mux(took, nf_w, nf_g))]

        pl = self.i.payload
        slot = Signal()                     # the current frame got a slot
        ovf = Signal()                      # the current frame is being discarded
        cur_slot = Signal()
        cur_ovf = Signal()
        write = Signal()
        end = Signal()
        m.d.comb += [
            cur_slot.eq(Mux(pl.first, ~frames_full, slot)),
            cur_ovf.eq((~pl.first & ovf) | ~cur_slot | rows_full),
            write.eq(self.i.valid & ~cur_ovf),
            end.eq(self.i.valid & pl.last),
            wp.addr.eq(wr_ptr[:k]),
            wp.data.eq(pl),
            wp.en.eq(write),
        ]
        with m.If(self.i.valid):
            m.d.sync += [slot.eq(cur_slot), ovf.eq(cur_ovf & ~pl.last)]
        wr_step = Signal(ptr_shape)
        m.d.comb += wr_step.eq(wr_inc + 1)
        with m.If(end & cur_ovf):                   # give the frame's rows back
            m.d.sync += [wr_ptr.eq(start), wr_inc.eq(start_inc)]
        with m.Elif(write):
            m.d.sync += [wr_ptr.eq(wr_inc), wr_inc.eq(wr_step)]
        with m.If(end & ~cur_ovf):
            m.d.sync += [start.eq(wr_inc), start_inc.eq(wr_step)]
            m.d.sync += advance(produce, produce_inc)
        m.d.comb += [
            ends_w.addr.eq(produce[:fb]),
            ends_w.data.end.eq(wr_inc),
            ends_w.data.end_inc.eq(wr_step),
            ends_w.en.eq(end & ~cur_ovf),
        ]
        m.d.sync += [self.stored.valid.eq(end), self.stored.payload.ok.eq(~cur_ovf)]
        take = Signal()
        give = Signal()
        m.d.comb += [take.eq(self.i.valid & pl.first & cur_slot),
                     give.eq(end & cur_ovf & cur_slot)]
        m.d.sync += [gave.eq(end & cur_ovf), took.eq(take & ~give)]
        with m.If(take & ~give):
            m.d.sync += acq.eq(acq + 1)
        with m.Elif(give & ~take):
            m.d.sync += acq.eq(acq - 1)

        # decisions
        m.d.comb += [keeps_w.addr.eq(dec[:fb]), keeps_w.data.eq(self.decide.payload.keep),
                     keeps_w.en.eq(self.decide.valid)]
        with m.If(self.decide.valid):
            m.d.sync += advance(dec, dec_inc)

        # read side: send the head frame if kept, else jump over it
        o_valid = Signal()
        head = Signal()
        load = Signal()
        skip = Signal()
        at_end = Signal()
        pop = Signal()
        m.d.comb += [
            ends_r.addr.eq(consume[:fb]),
            keeps_r.addr.eq(consume[:fb]),
            head.eq(consume != dec),
            load.eq(head & keeps_r.data & (~o_valid | self.o.ready)),
            skip.eq(head & ~keeps_r.data),
            at_end.eq(rd_inc == ends_r.data.end),
            pop.eq(skip | (load & at_end)),
            rp.addr.eq(rd_ptr[:k]),
            rp.en.eq(load),
            self.o.valid.eq(o_valid),
            self.o.payload.eq(rp.data),
        ]
        with m.If(skip):
            m.d.sync += [rd_ptr.eq(ends_r.data.end), rd_inc.eq(ends_r.data.end_inc)]
        with m.Elif(load):
            m.d.sync += [rd_ptr.eq(rd_inc), rd_inc.eq(rd_inc + 1)]
        with m.If(pop):
            m.d.sync += advance(consume, consume_inc)
        pop_r = Signal()
        m.d.sync += pop_r.eq(pop)
        with m.If(pop_r):
            m.d.sync += rel.eq(rel + 1)
        with m.If(load):
            m.d.sync += o_valid.eq(1)
        with m.Elif(self.o.ready):
            m.d.sync += o_valid.eq(0)
        return m
