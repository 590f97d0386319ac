# SPDX-License-Identifier: BSD-2-Clause
"""Payload cutter: a work request's payload packet -> one payload packet per RoCEv2 packet,
padded, with its length checked against the work request."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..config import check_data_width
from ..lib.crc import thermometer_count
from ..lib.stream import FrameSignature, PacketSignature, packet_layout

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

    Input beats first enter a register stage, which also encodes the beat's ``keep`` as a
    lane count and a "contiguous from lane 0" flag: the end-of-packet check is then a compare
    of a few bits (no comparison of two ``W/8``-bit masks on the path to the output registers).

    Latency: a command taken in cycle t passes staged input beats from cycle t + 1; an input
    beat transferred in cycle t is staged in t + 1 and on ``o`` in cycle t + 2 (at the earliest;
    the stage fills while the command is on its way, so it adds no latency when the payload is
    there first). ``done`` pulses in the cycle after the packet's last beat left the stage
    (``mism`` = 0: the packet was complete). Throughput: one beat per cycle; one idle cycle
    between two commands. ``cmd`` is taken when the previous command is finished.
    Backpressure: ``o`` stalls ``i``; ``i.ready`` is one LUT of registers and ``o.ready``.

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

    @staticmethod
    def _keep_code(m, keep, name):
        """(lanes, contiguous): the number of lanes of a ``keep`` that is contiguous from lane 0
        (:func:`~roce_hw.lib.crc.thermometer_count`), and whether it is (lane 0 set, no 0 -> 1
        step). Each is an OR tree of two-bit terms."""
        n = len(keep)
        ok = Signal(name=f"{name}_ok")
        m.d.comb += ok.eq(keep[0] & ~Cat(*[~keep[j] & keep[j + 1] for j in range(n - 1)]).any())
        return thermometer_count(m, keep, f"{name}_cnt"), ok

    def elaborate(self, platform):
        m = Module()
        n = self._width // 8

        # ---- the input stage: the beat and its keep code, registered
        beat = Signal(packet_layout(self._width), name="s_beat")
        s_valid = Signal(name="s_valid")
        s_cnt = Signal(n.bit_length(), name="s_cnt")
        s_ok = Signal(name="s_ok")
        s_ready = Signal()            # the cutter takes the staged beat
        s_take = Signal()
        m.d.comb += [s_take.eq(s_valid & s_ready),
                     self.i.ready.eq(~s_valid | s_ready)]
        i_cnt, i_ok = self._keep_code(m, self.i.payload.keep, "i_keep")
        with m.If(self.i.ready):
            m.d.sync += s_valid.eq(self.i.valid)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [beat.eq(self.i.payload), s_cnt.eq(i_cnt), s_ok.eq(i_ok)]
        active = Signal()
        drain = Signal()
        left = Signal(len(self.cmd.payload.beats))
        one_left = Signal()           # left == 1, kept as a register
        pk = Signal(n)
        lik = Signal(n)
        last_msg = Signal()
        first = Signal()
        pk_cnt = Signal.like(s_cnt)
        m.d.comb += self.cmd.ready.eq(~active)
        c_cnt, _ = self._keep_code(m, self.cmd.payload.pk, "c_pk")
        # The command registers follow `cmd` while the cutter is idle, valid or not (none of
        # them is read while it is idle): their enable is the register `active`, not the late
        # `cmd.valid` of the commit stage (ECP5 timing). Only `active` waits for `cmd.valid`.
        with m.If(self.cmd.ready):
            c = self.cmd.payload
            m.d.sync += [active.eq(self.cmd.valid), drain.eq(c.drain), left.eq(c.beats),
                         one_left.eq(c.beats == 1), pk.eq(c.pk), lik.eq(c.lik),
                         last_msg.eq(c.last_msg), first.eq(1), pk_cnt.eq(c_cnt)]

        o_free = Signal()
        take = Signal()
        m.d.comb += [
            o_free.eq(~self.o.valid | self.o.ready),
            s_ready.eq(active & (drain | o_free)),
            take.eq(s_take & ~drain),
        ]
        end = Signal()           # the message's end is due in this beat
        keep_ok = Signal()       # the beat's keep is the expected one (pk)
        mism = Signal()
        m.d.comb += [
            end.eq(one_left & last_msg),
            keep_ok.eq(s_ok & (s_cnt == pk_cnt)),
            mism.eq(Mux(beat.last, ~end | ~keep_ok, end)),
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
        with m.If(s_take & drain & beat.last):
            m.d.sync += active.eq(0)
        m.d.sync += [self.done.valid.eq(take & (one_left | mism)), self.done.payload.mism.eq(mism)]
        return m
