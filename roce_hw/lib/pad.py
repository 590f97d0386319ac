# SPDX-License-Identifier: BSD-2-Clause
"""Pads short frames to the Ethernet minimum: 60 bytes before the FCS, the pad bytes zero.

A MAC that does not pad by itself (the Xilinx CMAC: a frame under 64 bytes with its FCS is sent
as a runt, and short frames have been seen to lock its TX path up) needs this block in front.
"""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .stream import FrameSignature

__all__ = ["MIN_FRAME_BYTES", "FramePad"]

#: Shortest Ethernet frame without its FCS (64 bytes on the wire with it).
MIN_FRAME_BYTES = 60


class FramePad(wiring.Component):
    """Pads every frame shorter than ``min_bytes`` to ``min_bytes`` with zero bytes.

    Works on buses whose beat holds ``min_bytes`` (512 and 1024 bits for 60 bytes): a frame
    shorter than that is one beat (``first`` and ``last`` together), and padding it is setting
    the ``keep`` bits of the missing bytes. Bytes outside ``keep`` are zeroed on every beat
    (they are don't-care on the input), so the pad bytes leave as zeros. Longer frames pass
    unchanged; ``abort`` passes through.

    Latency: one cycle (a pipeline register: ``o`` comes straight from flip-flops).
    Throughput: one beat per cycle. Backpressure: ``i.ready`` is ``o.ready`` or an empty output
    register (one gate). Logic between flip-flops: one LUT per data and ``keep`` bit.

    Parameters
    ----------
    data_width : int
        Bus width in bits; its beat must hold ``min_bytes``.
    min_bytes : int
        Shortest frame to send (default :data:`MIN_FRAME_BYTES`).

    Members
    -------
    i : ``In(FrameSignature(data_width))``
    o : ``Out(FrameSignature(data_width))``
    """

    def __init__(self, data_width, min_bytes=MIN_FRAME_BYTES):
        if isinstance(min_bytes, bool) or not isinstance(min_bytes, int) or min_bytes < 1:
            raise ValueError(f"min_bytes must be a positive integer, not {min_bytes!r}")
        sig = FrameSignature(data_width)       # checks data_width
        if min_bytes > data_width // 8:
            raise ValueError(f"a {data_width}-bit beat holds {data_width // 8} bytes, fewer "
                             f"than min_bytes={min_bytes}: FramePad pads within one beat "
                             f"(use 512 or 1024 bits)")
        self._data_width = data_width
        self._min_bytes = min_bytes
        super().__init__({"i": In(sig), "o": Out(sig)})

    @property
    def min_bytes(self):
        return self._min_bytes

    def elaborate(self, platform):
        m = Module()
        nbytes = self._data_width // 8
        i, o = self.i, self.o
        short_keep = Const((1 << self._min_bytes) - 1, nbytes)

        # a one-beat frame gets at least min_bytes of keep (a frame of min_bytes or more that
        # fits one beat already has them: OR-ing changes nothing)
        single = Signal()
        keep = Signal(nbytes)
        data = Signal(self._data_width)
        m.d.comb += [
            single.eq(i.payload.first & i.payload.last),
            keep.eq(i.payload.keep | Mux(single, short_keep, 0)),
            data.eq(Cat(i.payload.data.word_select(b, 8) & i.payload.keep[b].replicate(8)
                        for b in range(nbytes))),
        ]
        m.d.comb += i.ready.eq(~o.valid | o.ready)
        with m.If(i.ready):
            m.d.sync += [
                o.valid.eq(i.valid),
                o.payload.data.eq(data),
                o.payload.keep.eq(keep),
                o.payload.first.eq(i.payload.first),
                o.payload.last.eq(i.payload.last),
                o.payload.abort.eq(i.payload.abort),
            ]
        return m
