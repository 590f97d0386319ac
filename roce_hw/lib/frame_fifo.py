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
    ``abort``), ``depth`` rows. ``i.ready`` is low only while all ``depth`` rows hold beats
    not yet sent. A frame longer than ``depth`` beats can never complete and would stall the
    FIFO for good: size ``depth`` for the longest frame (the build option checks this).

    Latency (empty FIFO, ``o.ready`` high): the first beat of a frame is on ``o`` in cycle
    ``t + 2``, where ``t`` is the cycle its last beat was transferred on ``i`` (one cycle to
    commit the frame, one for the synchronous memory read). Throughput: one beat per cycle in
    and out, simultaneously.

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

        wr_ptr = Signal(range(depth))       # next row to write
        commit_ptr = Signal(range(depth))   # first row after the last complete frame
        rd_ptr = Signal(range(depth))       # next committed row to load into the output
        level = Signal(range(depth + 1))    # rows written and not yet loaded
        avail = Signal(range(depth + 1))    # rows of complete frames not yet loaded
        pending = Signal(range(depth + 1))  # rows of the frame being written
        o_valid = Signal()

        def inc(ptr):
            return Mux(ptr == depth - 1, 0, ptr + 1)

        write = Signal()
        last = Signal()
        drop = Signal()
        commit = Signal()
        load = Signal()
        m.d.comb += [
            self.i.ready.eq(level != depth),
            write.eq(self.i.valid & self.i.ready),
            last.eq(write & self.i.payload.last),
            drop.eq(last & self.i.payload.abort) if drop_mode else drop.eq(0),
            commit.eq(last & ~drop),
            load.eq((~o_valid | self.o.ready) & (avail != 0)),
            wp.addr.eq(wr_ptr),
            wp.data.eq(self.i.payload),
            wp.en.eq(write & ~drop),
            rp.addr.eq(rd_ptr),
            rp.en.eq(load),
            self.o.valid.eq(o_valid),
            self.o.payload.eq(rp.data),
        ]

        with m.If(load):
            m.d.sync += [rd_ptr.eq(inc(rd_ptr)), o_valid.eq(1)]
        with m.Elif(self.o.ready):
            m.d.sync += o_valid.eq(0)

        with m.If(drop):
            m.d.sync += [wr_ptr.eq(commit_ptr), pending.eq(0),
                         level.eq(level - pending - load),
                         self.frames_dropped.eq(self.frames_dropped + 1)]
        with m.Elif(commit):
            m.d.sync += [wr_ptr.eq(inc(wr_ptr)), commit_ptr.eq(inc(wr_ptr)), pending.eq(0),
                         level.eq(level + 1 - load)]
        with m.Elif(write):
            m.d.sync += [wr_ptr.eq(inc(wr_ptr)), pending.eq(pending + 1),
                         level.eq(level + 1 - load)]
        with m.Else():
            m.d.sync += level.eq(level - load)

        with m.If(commit):
            m.d.sync += avail.eq(avail + pending + 1 - load)
        with m.Else():
            m.d.sync += avail.eq(avail - load)
        return m
