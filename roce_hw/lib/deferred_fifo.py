# SPDX-License-Identifier: BSD-2-Clause
"""Store-and-forward frame FIFO whose keep-or-discard decision for a frame comes after the frame.

A receiver that must decide whether to pass a frame on only once it has checked the whole frame
(checksums, lengths, ...) stores every frame as it arrives and learns its fate a few cycles after
the last beat, while the next frames are already being stored. :class:`DeferredFrameFifo` keeps
the frames in one memory, in order, and a small queue of frame ends; the decisions arrive in frame
order on ``decide``; the read side sends the kept frames and jumps over the discarded ones.
"""

from amaranth import *
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ..config import check_data_width
from .stream import FrameSignature, frame_layout

__all__ = ["DeferredFrameFifo"]


class DeferredFrameFifo(wiring.Component):
    """Frame FIFO with a late keep/discard decision per frame, for a source without backpressure.

    Every frame on ``i`` is written to the memory as it arrives (``i.ready`` is constant 1: a
    MAC cannot wait). A frame that does not fit -- a beat finds the memory full, or
    ``max_frames`` frames are already held -- is discarded whole, never cut: its rows are given
    back at its last beat. In the cycle after each frame's last beat ``stored`` reports whether
    it was kept in the memory (``ok``). For every frame with ``ok`` = 1 the user gives one
    decision on ``decide``, in frame order, at any later time: ``keep`` = 1 sends the frame on
    ``o``, ``keep`` = 0 discards it. Frames leave in order; a frame starts on ``o`` only once its
    decision is known (so only after its last beat was stored), then flows one beat per cycle,
    paused only by ``o.ready``. The bytes are the received ones: ``data`` (lanes beyond ``keep``
    included), ``keep``, ``first``, ``last``, ``abort`` as they came.

    Storage: ``depth`` rows of one beat (``lib.memory``, one write and one read port), a queue of
    frame ends and a queue of decisions of ``max_frames`` entries each. Rows of a frame are held
    until it has been sent or jumped over; a discarded frame is jumped over in one cycle once
    its decision is at the head.

    Latency (empty FIFO, ``o.ready`` high): a frame whose decision is given in cycle t starts on
    ``o`` in cycle t + 3 (decision queue, end queue, memory read). Throughput: one beat per
    cycle in and out; kept frames leave back to back; each discarded frame costs one read-side
    cycle.

    Parameters
    ----------
    data_width : int
        Bus width in bits (64 to 1024).
    depth : int
        Rows of storage (beats), a power of two, at least 2.
    max_frames : int
        Frames held at once (written, or being written, and not yet sent or jumped over), at
        least 2.

    Members
    -------
    i : ``In(FrameSignature(data_width))``
        Frames; ``i.ready`` is constant 1.
    stored : ``Out(stream.Signature(StructLayout({"ok": 1}), always_ready=True))``
        One pulse per frame, the cycle after its last beat: ``ok`` = 1 if it is in the memory
        and waits for its decision.
    decide : ``In(stream.Signature(StructLayout({"keep": 1}), always_ready=True))``
        One decision per frame reported with ``ok`` = 1, in order (never more decisions than
        such frames).
    o : ``Out(FrameSignature(data_width))``
        The kept frames.
    """

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
            "i": In(FrameSignature(data_width)),
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
        m.submodules.mem = mem = memory.Memory(shape=frame_layout(self._width), depth=depth,
                                               init=[])
        wp = mem.write_port()
        rp = mem.read_port(transparent_for=())
        # frame ends (row of the last beat, with the wrap bit) and decisions, in frame order
        m.submodules.ends = ends = fifo.SyncFIFOBuffered(width=k + 1, depth=self._max_frames)
        m.submodules.keeps = keeps = fifo.SyncFIFOBuffered(width=1, depth=self._max_frames)

        # Pointers carry a wrap bit: the memory is full when they differ only in it.
        wr_ptr = Signal(k + 1)
        wr_inc = Signal(k + 1, init=1)      # wr_ptr + 1, kept beside it (no adder on the path)
        start = Signal(k + 1)               # wr_ptr at the first beat of the current frame
        rd_ptr = Signal(k + 1)
        held = Signal(range(self._max_frames + 1))
        slot = Signal()                     # the current frame counts in `held`
        ovf = Signal()                      # the current frame is being discarded

        pl = self.i.payload
        m.d.comb += self.i.ready.eq(1)
        full = Signal()
        cur_slot = Signal()
        cur_ovf = Signal()
        write = Signal()
        m.d.comb += [
            full.eq((wr_ptr ^ rd_ptr) == (1 << k)),
            cur_slot.eq(Mux(pl.first, held != self._max_frames, slot)),
            cur_ovf.eq(Mux(pl.first, 0, ovf) | ~cur_slot | full),
            write.eq(self.i.valid & ~cur_ovf),
            wp.addr.eq(wr_ptr[:k]),
            wp.data.eq(pl),
            wp.en.eq(write),
        ]
        end = Signal()
        m.d.comb += end.eq(self.i.valid & pl.last)
        with m.If(self.i.valid):
            m.d.sync += [slot.eq(cur_slot), ovf.eq(cur_ovf & ~pl.last)]
        with m.If(end & cur_ovf):                   # give the frame's rows back
            m.d.sync += [wr_ptr.eq(start), wr_inc.eq(start + 1)]
        with m.Elif(write):
            m.d.sync += [wr_ptr.eq(wr_inc), wr_inc.eq(wr_inc + 1)]
        with m.If(end & ~cur_ovf):
            m.d.sync += start.eq(wr_inc)
        m.d.comb += [ends.w_en.eq(end & ~cur_ovf), ends.w_data.eq(wr_ptr)]
        m.d.sync += [self.stored.valid.eq(end), self.stored.payload.ok.eq(~cur_ovf)]

        # decisions
        m.d.comb += [keeps.w_en.eq(self.decide.valid), keeps.w_data.eq(self.decide.payload.keep)]

        # read side: send the head frame if kept, else jump over it
        o_valid = Signal()
        head = Signal()
        load = Signal()
        skip = Signal()
        at_end = Signal()
        pop = Signal()
        m.d.comb += [
            head.eq(ends.r_rdy & keeps.r_rdy),
            load.eq(head & keeps.r_data[0] & (~o_valid | self.o.ready)),
            skip.eq(head & ~keeps.r_data[0]),
            at_end.eq(rd_ptr == ends.r_data),
            pop.eq(skip | (load & at_end)),
            ends.r_en.eq(pop),
            keeps.r_en.eq(pop),
            rp.addr.eq(rd_ptr[:k]),
            rp.en.eq(load),
            self.o.valid.eq(o_valid),
            self.o.payload.eq(rp.data),
        ]
        with m.If(skip):
            m.d.sync += rd_ptr.eq(ends.r_data + 1)
        with m.Elif(load):
            m.d.sync += rd_ptr.eq(rd_ptr + 1)
        with m.If(load):
            m.d.sync += o_valid.eq(1)
        with m.Elif(self.o.ready):
            m.d.sync += o_valid.eq(0)

        # frames held: +1 when a frame gets a slot, -1 when one is given back or leaves
        take = Signal()
        give = Signal()
        m.d.comb += [take.eq(self.i.valid & pl.first & cur_slot),
                     give.eq(end & cur_ovf & cur_slot)]
        m.d.sync += held.eq(held + take - give - pop)
        return m
