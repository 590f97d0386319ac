# SPDX-License-Identifier: BSD-2-Clause
"""Width converters between the engine's frame bus (:func:`~roce_hw.lib.stream.frame_layout`)
and the MAC's byte stream (:func:`~roce_hw.mac.common.byte_frame_layout`)."""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..config import check_data_width
from ..lib.crc import thermometer_count
from ..lib.stream import FrameSignature
from .common import ByteFrameSignature

__all__ = ["FrameNarrow", "FrameWiden"]


class FrameNarrow(wiring.Component):
    """Frames from a ``data_width``-bit bus to one byte per beat.

    Byte order: lane 0 (``data[7:0]``) first, then lane 1, ... up to the last lane with ``keep``
    (all lanes on a beat without ``last``; see :mod:`roce_hw.lib.stream`). ``first`` goes with
    the first byte of a frame, ``last`` and ``abort`` with its last one.

    Latency: a beat taken in cycle ``t`` offers its first byte from cycle ``t + 1``.
    Throughput: one byte per cycle, without a gap between beats or frames (the next beat is
    taken in the cycle its predecessor's last byte leaves). Backpressure: ``o.ready`` low holds
    the current byte; ``i.ready`` is high when no beat is held, or when the held beat's last
    byte is taken in this cycle (combinational from ``o.ready``).

    Members
    -------
    i : ``In(FrameSignature(data_width))``
    o : ``Out(ByteFrameSignature())``
    """

    def __init__(self, data_width):
        self._width = check_data_width(data_width)
        super().__init__({"i": In(FrameSignature(data_width)),
                          "o": Out(ByteFrameSignature())})

    def elaborate(self, platform):
        m = Module()
        n = self._width // 8
        held = Signal.like(self.i.payload)
        held_valid = Signal()
        lane = Signal(range(n))
        last_lane = Signal(range(n))    # the held beat's last byte
        count = thermometer_count(m, self.i.payload.keep, "keep_count")

        at_end = Signal()
        m.d.comb += [
            at_end.eq(lane == last_lane),
            self.i.ready.eq(~held_valid | (self.o.ready & at_end)),
            self.o.valid.eq(held_valid),
            self.o.payload.data.eq(held.data.word_select(lane, 8)),
            self.o.payload.first.eq(held.first & (lane == 0)),
            self.o.payload.last.eq(held.last & at_end),
            self.o.payload.abort.eq(held.abort & held.last & at_end),
        ]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [held.eq(self.i.payload), held_valid.eq(1), lane.eq(0),
                         last_lane.eq(Mux(self.i.payload.last, count - 1, n - 1))]
        with m.Elif(self.o.ready & held_valid):
            with m.If(at_end):
                m.d.sync += held_valid.eq(0)
            with m.Else():
                m.d.sync += lane.eq(lane + 1)
        return m


class FrameWiden(wiring.Component):
    """Frames from one byte per beat to a ``data_width``-bit bus.

    Bytes fill lanes 0, 1, ... of a beat; a beat leaves when its last lane is filled or with the
    frame's ``last`` byte (then ``keep`` covers the lanes filled, contiguous from lane 0; the
    lanes beyond are don't-care). ``first`` of the first byte goes with the frame's first beat,
    ``last`` and ``abort`` of the last byte with its last beat.

    Latency: a beat is on ``o`` the cycle after its last byte is taken. Throughput: one byte per
    cycle. Backpressure: ``i.ready`` = ``~o.valid | o.ready`` (a registered beat not yet taken
    holds the input); with ``o.ready`` always high, ``i.ready`` is always high.

    Members
    -------
    i : ``In(ByteFrameSignature())``
    o : ``Out(FrameSignature(data_width))``
    """

    def __init__(self, data_width):
        self._width = check_data_width(data_width)
        super().__init__({"i": In(ByteFrameSignature()),
                          "o": Out(FrameSignature(data_width))})

    def elaborate(self, platform):
        m = Module()
        n = self._width // 8
        acc = Signal(self._width)
        lane = Signal(range(n))
        beat_first = Signal()       # the beat being filled is a frame's first

        byte = self.i.payload.data
        beat_data = Signal(self._width)
        m.d.comb += beat_data.eq(Cat(*[Mux(lane == j, byte, acc[8 * j:8 * j + 8])
                                       for j in range(n)]))
        m.d.comb += self.i.ready.eq(~self.o.valid | self.o.ready)
        with m.If(self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += acc.eq(beat_data)
            first = Mux(lane == 0, self.i.payload.first, beat_first)
            with m.If(lane == 0):
                m.d.sync += beat_first.eq(self.i.payload.first)
            with m.If(self.i.payload.last | (lane == n - 1)):
                m.d.sync += [
                    self.o.valid.eq(1),
                    self.o.payload.data.eq(beat_data),
                    self.o.payload.keep.eq(Cat(*[lane >= j for j in range(n)])),
                    self.o.payload.first.eq(first),
                    self.o.payload.last.eq(self.i.payload.last),
                    self.o.payload.abort.eq(self.i.payload.abort & self.i.payload.last),
                    lane.eq(0),
                ]
            with m.Else():
                m.d.sync += lane.eq(lane + 1)
        return m
