# SPDX-License-Identifier: BSD-2-Clause
"""Store-and-forward frame FIFO: a frame leaves only once its last beat is in, then without gaps.

The TX engine passes payload through as it arrives, so its output pauses inside a frame whenever
the payload input pauses. A MAC that must not see a pause inside a frame (the Xilinx CMAC and
DCMAC underflow on one: the frame is cut and sent with a bad FCS) needs this block after the
engine (``python build.py --no-underrun``).
"""

from amaranth import *
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out

from .stream import FrameSignature, frame_layout

__all__ = ["FrameFifo"]


class FrameFifo(wiring.Component):
    """Store-and-forward FIFO of frames (:func:`~roce_hw.lib.stream.frame_layout` beats).

    A frame is held until its ``last`` beat has been written; from then on it is sent one beat
    per cycle, with ``o.valid`` high from its first to its last beat (only ``o.ready`` can
    pause it). Frames leave in order, back to back when they are complete.

    Storage: one ``lib.memory`` row per beat (``data``, ``keep``, ``first``, ``last``,
    ``abort``), ``depth`` rows. ``i.ready`` is low exactly while all ``depth`` rows hold beats
    not yet sent (a row is free again once its beat is in the output register); it comes
    straight from a flip-flop, and never depends on ``i.valid`` or ``o.ready`` in the same
    cycle. A frame longer than ``depth`` beats can never complete and would stall the FIFO for
    good: size ``depth`` for the longest frame (the build option checks this).

    Latency (empty FIFO, ``o.ready`` high): the first beat of a frame is on ``o`` in cycle
    ``t + 2``, where ``t`` is the cycle its last beat was transferred on ``i`` (one cycle to
    commit the frame, one for the synchronous memory read). Throughput: one beat per cycle in
    and out, simultaneously.

    Timing: no occupancy counter; every pointer keeps a registered copy one row ahead, and the
    two flags (``i.ready``, "a complete frame's row is waiting") are registers updated from
    equality compares of two pointers. Longest path after ``synth_xilinx -family xcup``: 5
    cells (a pointer increment) at the default depths of every width and at 2 to 4096 rows,
    6 at 8191 rows.

    Aborted frames (``abort`` on the last beat): with ``abort="drop"`` they are discarded
    (their rows are freed, nothing is sent); with ``abort="pass"`` they are sent like any
    other, ``abort`` still set on their last beat.

    Parameters
    ----------
    data_width : int
        Bus width in bits (64, 128, 256, 512 or 1024).
    depth : int
        Rows (beats) of storage, at least 2.
    abort : str
        ``"drop"`` or ``"pass"``.

    Members
    -------
    i : ``In(FrameSignature(data_width))``
        Frames in (``first``/``last`` framing, ``keep`` as in :mod:`roce_hw.lib.stream`).
    o : ``Out(FrameSignature(data_width))``
        The same frames (aborted ones dropped with ``abort="drop"``), never paused inside.
    frames_dropped : ``Out(16)``
        Aborted frames discarded (wraps; always 0 with ``abort="pass"``).
    """

    def __init__(self, data_width, depth, *, abort="drop"):
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 2:
            raise ValueError(f"depth must be an integer of at least 2 beats, not {depth!r}")
        if abort not in ("drop", "pass"):
            raise ValueError(f"abort must be 'drop' or 'pass', not {abort!r}")
        self._data_width = data_width
        self._depth = depth
        self._abort = abort
        super().__init__({
            "i": In(FrameSignature(data_width)),
            "o": Out(FrameSignature(data_width)),
            "frames_dropped": Out(16),
        })

    @property
    def depth(self):
        """Rows of storage, in beats."""
        return self._depth

    @property
    def latency(self):
        """Cycles from the last beat of a frame in to its first beat out, minus one (the
        project's convention: a beat in at cycle t comes out at t + latency + 1)."""
        return 1

    def elaborate(self, platform):
        m = Module()
        depth = self._depth
        drop_mode = self._abort == "drop"

        m.submodules.mem = mem = memory.Memory(shape=frame_layout(self._data_width),
                                               depth=depth, init=[])
        wp = mem.write_port()
        rp = mem.read_port(transparent_for=())

        # No occupancy counter: a wide count feeding its own add/subtract (and the zero and full
        # compares of it) made 7-cell paths. Each pointer has a registered copy one row ahead, so
        # that advancing a pointer is a copy and the flags below compare two registers.
        def ptr(name, init):
            return Signal(range(depth), name=name, init=init % depth)

        wr_ptr, wr_next = ptr("wr_ptr", 0), ptr("wr_next", 1)    # next row to write
        # first row after the last complete frame
        commit_ptr, commit_next = ptr("commit_ptr", 0), ptr("commit_next", 1)
        rd_ptr, rd_next = ptr("rd_ptr", 0), ptr("rd_next", 1)    # next committed row to load
        avail = Signal()    # some rows of complete frames are not loaded yet
        # i.ready: some row holds no beat still to load (a register, inverted from "full" so
        # that i.ready leaves the block straight from a flip-flop)
        ready = Signal(init=1)
        o_valid = Signal()

        def inc(name, value):
            """``value + 1`` modulo ``depth``, as a named signal."""
            out = Signal(range(depth), name=name)
            if depth & (depth - 1) == 0:
                m.d.comb += out.eq(value + 1)
            else:
                m.d.comb += out.eq(Mux(value == depth - 1, 0, value + 1))
            return out

        wr_next_inc = inc("wr_next_inc", wr_next)
        rd_next_inc = inc("rd_next_inc", rd_next)
        # depth - 1 rows in use: the row after the one written next is the next to load
        almost_full = Signal()
        # one committed row left: the row after the one loaded next is the commit boundary
        last_avail = Signal()

        write = Signal()
        last = Signal()
        drop = Signal()
        commit = Signal()
        load = Signal()
        m.d.comb += [
            self.i.ready.eq(ready),
            write.eq(self.i.valid & ready),
            last.eq(write & self.i.payload.last),
            drop.eq(last & self.i.payload.abort) if drop_mode else drop.eq(0),
            commit.eq(last & ~drop),
            load.eq((~o_valid | self.o.ready) & avail),
            almost_full.eq(wr_next == rd_ptr),
            last_avail.eq(rd_next == commit_ptr),
            wp.addr.eq(wr_ptr),
            wp.data.eq(self.i.payload),
            wp.en.eq(write & ~drop),
            rp.addr.eq(rd_ptr),
            rp.en.eq(load),
            self.o.valid.eq(o_valid),
            self.o.payload.eq(rp.data),
        ]

        with m.If(load):
            m.d.sync += [rd_ptr.eq(rd_next), rd_next.eq(rd_next_inc), o_valid.eq(1)]
        with m.Elif(self.o.ready):
            m.d.sync += o_valid.eq(0)

        with m.If(drop):
            m.d.sync += [wr_ptr.eq(commit_ptr), wr_next.eq(commit_next),
                         self.frames_dropped.eq(self.frames_dropped + 1)]
        with m.Elif(write):
            m.d.sync += [wr_ptr.eq(wr_next), wr_next.eq(wr_next_inc)]
        with m.If(commit):
            m.d.sync += [commit_ptr.eq(wr_next), commit_next.eq(wr_next_inc)]

        # A commit adds at least its last row; a load alone takes one row, the last one if
        # rd_next is the commit boundary (with 2 to depth rows committed it is not: depth >= 2).
        with m.If(commit):
            m.d.sync += avail.eq(1)
        with m.Elif(load & last_avail):
            m.d.sync += avail.eq(0)

        # A drop frees every uncommitted row, a load one row; a write alone (none loaded) fills
        # the last free row when wr_next is the next row to load. A write never happens while
        # full, so a write and a load together leave a row free.
        with m.If(drop | load):
            m.d.sync += ready.eq(1)
        with m.Elif(write & almost_full):
            m.d.sync += ready.eq(0)
        return m
