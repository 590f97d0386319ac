# SPDX-License-Identifier: BSD-2-Clause
"""Payload cutter: a work request's payload packet -> one payload packet per RoCEv2 packet,
padded, with its length checked against the work request."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..config import check_data_width
from ..lib.stream import FrameSignature, PacketSignature

__all__ = ["cut_layout", "PayloadCutter"]


def cut_layout(width):
    """One command of the cutter.

    ``beats``: payload beats of the packet; ``pk``: ``keep`` of the payload bytes in its last
    beat; ``lik``: the same rounded up to a multiple of 4 bytes (payload + PadCnt zero bytes);
    ``last_msg``: the packet holds the end of the message (the input packet must end there);
    ``drain``: no packet, drop the input packet (a refused work request).
    """
    check_data_width(width)
    n = width // 8
    return data.StructLayout({"beats": 13 - (n - 1).bit_length(), "pk": n, "lik": n,
                              "last_msg": 1, "drain": 1})


class PayloadCutter(wiring.Component):
    """Cuts the payload packets of work requests into the payloads of their RoCEv2 packets.

    Every packet's payload starts in lane 0 of an input beat (a PMTU of 256 or more bytes is a
    whole number of beats), so cutting needs no realignment: a command passes ``beats`` input
    beats, the last one ended (``last``) with ``keep`` = ``lik``, its lanes past the payload
    zeroed (the pad). The input packet must end exactly at the end of the last packet of its
    message (``last_msg``). If it ends earlier, or does not end there, or its last ``keep``
    differs, the packet is ended on that beat with ``abort`` = 1 (``keep`` all ones) and
    ``done`` reports ``mism``; an input packet that goes on is then dropped up to its end.
    A ``drain`` command drops one input packet.

    Latency: a command taken in cycle t passes input beats from cycle t + 1; an input beat
    transferred in cycle t is on ``o`` in cycle t + 1. ``done`` pulses in the cycle after the
    packet's last beat went in (``mism`` = 0: the packet was complete). Throughput: one beat per
    cycle; one idle input cycle between two commands. ``cmd`` is taken when the previous command
    is finished. Backpressure: ``o`` stalls ``i``.

    Members
    -------
    cmd : ``In(stream.Signature(cut_layout(width)))``
    i : ``In(PacketSignature(width))``
        Work-request payload packets.
    o : ``Out(FrameSignature(width))``
        Packet payloads.
    done : ``Out(stream.Signature(StructLayout({"mism": 1}), always_ready=True))``
        One pulse per command that is not a ``drain``.
    """

    def __init__(self, width):
        self._width = check_data_width(width)
        super().__init__({
            "cmd": In(stream.Signature(cut_layout(width))),
            "i": In(PacketSignature(width)),
            "o": Out(FrameSignature(width)),
            "done": Out(stream.Signature(data.StructLayout({"mism": 1}), always_ready=True)),
        })

    def elaborate(self, platform):
        m = Module()
        n = self._width // 8
        active = Signal()
        drain = Signal()
        left = Signal(len(self.cmd.payload.beats))
        one_left = Signal()           # left == 1, kept as a register
        pk = Signal(n)
        lik = Signal(n)
        last_msg = Signal()
        first = Signal()
        m.d.comb += self.cmd.ready.eq(~active)
        with m.If(self.cmd.valid & self.cmd.ready):
            c = self.cmd.payload
            m.d.sync += [active.eq(1), drain.eq(c.drain), left.eq(c.beats),
                         one_left.eq(c.beats == 1), pk.eq(c.pk), lik.eq(c.lik),
                         last_msg.eq(c.last_msg), first.eq(1)]

        o_free = Signal()
        take = Signal()
        m.d.comb += [
            o_free.eq(~self.o.valid | self.o.ready),
            self.i.ready.eq(active & (drain | o_free)),
            take.eq(self.i.valid & self.i.ready & ~drain),
        ]
        beat = self.i.payload
        end = Signal()           # the message's end is due in this beat
        mism = Signal()
        m.d.comb += [
            end.eq(one_left & last_msg),
            mism.eq(Mux(beat.last, ~end | (beat.keep != pk), end)),
        ]
        mask = Signal(self._width)
        m.d.comb += mask.eq(Cat(*[Mux(one_left, pk[j], 1).replicate(8) for j in range(n)]))

        with m.If(o_free):
            m.d.sync += self.o.valid.eq(take)
        with m.If(take):
            m.d.sync += [
                self.o.payload.data.eq(beat.data & mask),
                self.o.payload.keep.eq(Mux(one_left & ~mism, lik, (1 << n) - 1)),
                self.o.payload.first.eq(first),
                self.o.payload.last.eq(one_left | mism),
                self.o.payload.abort.eq(mism),
                first.eq(0),
                left.eq(left - 1),
                one_left.eq(left == 2),
            ]
            with m.If(one_left | mism):
                # the packet ends here; an input packet that goes on is dropped to its end
                m.d.sync += [active.eq(mism & ~beat.last), drain.eq(1)]
        with m.If(self.i.valid & self.i.ready & drain & beat.last):
            m.d.sync += active.eq(0)
        m.d.sync += [self.done.valid.eq(take & (one_left | mism)), self.done.payload.mism.eq(mism)]
        return m
