# SPDX-License-Identifier: BSD-2-Clause
"""Packet stream conventions shared by every block.

Every data path is an ``amaranth.lib.stream.Signature(packet_layout(width))``:

* ``data`` -- ``width`` bits; **wire byte 0 of the beat is ``data[7:0]``** (AXI-Stream lane order).
* ``keep`` -- ``width // 8`` bits, ``keep[i]`` qualifies byte lane ``i``. Keep is contiguous from
  bit 0 and all ones on every beat except possibly the one with ``last``; a ``last`` beat has
  at least one byte. Bytes in lanes whose ``keep`` is 0 are don't-care (blocks must not depend
  on them, and do not promise to zero them unless they say so).
* ``first`` -- set on the first beat of a packet; ``last`` -- set on its last beat.

Header channels: per-packet header values travel on a **separate stream, one transfer per
packet** (the verilog-ethernet ``hdr_valid/hdr_ready`` pattern), never as a field held across
the packet's beats.

Streams obey the rules of ``amaranth.lib.stream``: ``valid`` never depends on ``ready``, and
once ``valid`` is asserted the payload is held until the transfer.
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..config import check_data_width

__all__ = ["packet_layout", "PacketSignature", "frame_layout", "FrameSignature", "keep_to_count",
           "count_to_keep", "ReadyBreak"]


def packet_layout(width):
    """Payload layout of a packet beat: ``{data, keep, first, last}``."""
    check_data_width(width)
    return data.StructLayout({"data": width, "keep": width // 8, "first": 1, "last": 1})


def PacketSignature(width):
    """``stream.Signature`` carrying :func:`packet_layout` beats."""
    return stream.Signature(packet_layout(width))


def frame_layout(width):
    """Beat of the output frame stream: :func:`packet_layout` plus ``abort``
    (1 bit, meaningful on the ``last`` beat: the MAC must discard the frame, like the AXI
    ``tuser`` "bad frame" bit of the Xilinx CMAC or verilog-ethernet)."""
    check_data_width(width)
    return data.StructLayout({"data": width, "keep": width // 8, "first": 1, "last": 1,
                              "abort": 1})


def FrameSignature(width):
    """``stream.Signature`` carrying :func:`frame_layout` beats."""
    return stream.Signature(frame_layout(width))


def keep_to_count(keep):
    """Python helper: number of valid bytes of a contiguous ``keep`` integer (raises if not
    contiguous from bit 0)."""
    n = keep.bit_length()
    if keep != (1 << n) - 1:
        raise ValueError(f"keep {keep:#x} is not contiguous from bit 0")
    return n


def count_to_keep(count):
    """Python helper: the ``keep`` integer for ``count`` valid bytes."""
    return (1 << count) - 1


class ReadyBreak(wiring.Component):
    """Cuts the combinational ``ready`` path of a stream, with no latency.

    ``i.ready`` comes from a register: while it is high, ``i`` flows through to ``o`` in the
    same cycle (``o.valid``/``o.payload`` are ``i``'s, one multiplexer added on the data). If
    ``o`` refuses a beat that ``i`` offered, the beat is kept in a one-entry register, ``i.ready``
    drops for the next cycle and the kept beat goes first. Throughput: one beat per cycle while
    ``o`` is ready.

    Parameters
    ----------
    payload_shape : shape-like

    Members
    -------
    i : ``In(stream.Signature(payload_shape))``
    o : ``Out(stream.Signature(payload_shape))``

    Attributes
    ----------
    ready_next : Signal
        ``i.ready`` of the next cycle (combinational, from this cycle's handshakes), for a
        flip-flop copy of it kept elsewhere.
    """

    def __init__(self, payload_shape):
        super().__init__({"i": In(stream.Signature(payload_shape)),
                          "o": Out(stream.Signature(payload_shape))})
        self.ready_next = Signal()

    def elaborate(self, platform):
        m = Module()
        kept = Signal()
        held = Signal.like(self.i.payload)
        m.d.comb += [
            self.i.ready.eq(~kept),
            self.o.valid.eq(kept | self.i.valid),
            self.o.payload.eq(Mux(kept, held, self.i.payload)),
        ]
        # (the held register follows `i` whenever nothing is kept, so its enable is the
        # register `kept`, not the handshake of `o`: it fans out to every payload bit)
        with m.If(~kept):
            m.d.sync += held.eq(self.i.payload)
        # a beat is kept while `o` refuses it: a new one from `i`, or the one already kept
        m.d.comb += self.ready_next.eq(~((kept | self.i.valid) & ~self.o.ready))
        m.d.sync += kept.eq(~self.ready_next)
        return m
