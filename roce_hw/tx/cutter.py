# SPDX-License-Identifier: BSD-2-Clause
"""Payload cutter: a work request's payload packet -> one payload packet per RoCEv2 packet,
padded, with its length checked against the work request."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import proto
from ..config import check_data_width
from ..lib.crc import thermometer_count
from ..lib.stream import FrameSignature, PacketSignature, packet_layout

__all__ = ["cut_layout", "PayloadCutter"]


def cut_layout(width):
    """One command of the cutter.

    ``beats``: payload beats of the packet; ``pk``: ``keep`` of the payload bytes in its last
    beat; ``lik``: the same rounded up to a multiple of 4 bytes (payload + PadCnt zero bytes;
    whole 4-lane groups: the cutter reads one bit per group);
    ``pkc``: the lanes set in ``pk`` (1 to ``W/8``);
    ``last_msg``: the packet holds the end of the message (the input packet must end there);
    ``drain``: no packet, drop the input packet (a refused work request).
    """
    check_data_width(width)
    n = width // 8
    # (beats of a packet of up to the largest PMTU)
    beats = proto.MAX_PMTU_BYTES.bit_length() - (n - 1).bit_length()
    return data.StructLayout({"beats": beats, "pk": n, "lik": n,
                              "pkc": n.bit_length(), "last_msg": 1, "drain": 1})


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

    Latency: a command taken in cycle t passes staged input beats from cycle t + 1 (with
    ``early``: from cycle t, the command port's fields used directly while the cutter is idle);
    an input beat transferred in cycle t is staged in t + 1 and on ``o`` in cycle t + 2 (at the
    earliest; the stage fills while the command is on its way, so it adds no latency when the
    payload is there first). ``done`` pulses in the cycle after the packet's last beat left the
    stage (``mism`` = 0: the packet was complete), so at least 2 cycles after its command was
    taken (1 with ``early``). Throughput: one beat per cycle; one idle cycle between two
    commands (none with ``early``). ``cmd`` is taken when the previous command is finished.
    Backpressure: ``o`` stalls ``i``; ``i.ready`` is one LUT of registers and ``o.ready``.

    Parameters
    ----------
    width : int
    early : bool
        Pass the first beat in the command's own cycle (one cycle less from command to
        ``o``; ``cmd.valid`` then reaches the output register's enable).

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

    def __init__(self, width, *, early=False):
        self._width = check_data_width(width)
        self._early = bool(early)
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
        # Beats left minus 2, signed: its sign bit is "one beat left" (the count is at least 1
        # while active), so that flag is a flip-flop with no compare before it; the count's
        # next value is a decrement on the carry chain (ECP5 timing: a compare against 2 behind
        # the late `take` made a path of six LUTs).
        left = Signal(signed(len(self.cmd.payload.beats) + 1), name="left_m2")
        one_left = Signal()
        m.d.comb += one_left.eq(left[-1])
        pk = Signal(n)
        lik = Signal(n)
        last_msg = Signal()
        first = Signal()
        pk_cnt = Signal.like(s_cnt)
        m.d.comb += self.cmd.ready.eq(~active)
        # The command registers follow `cmd` while the cutter is idle, valid or not (none of
        # them is read while it is idle): their enable is the register `active`, not the late
        # `cmd.valid` of the commit stage (ECP5 timing). Only `active` waits for `cmd.valid`.
        with m.If(self.cmd.ready):
            c = self.cmd.payload
            m.d.sync += [active.eq(self.cmd.valid), drain.eq(c.drain), left.eq(c.beats - 2),
                         pk.eq(c.pk), lik.eq(c.lik),
                         last_msg.eq(c.last_msg), first.eq(1), pk_cnt.eq(c.pkc)]

        # The command in effect: the registers, or (early, while idle) the command port itself.
        if self._early:
            c = self.cmd.payload
            e = {"active": Signal(name="e_active"), "drain": Signal(name="e_drain"),
                 "left": Signal.like(left, name="e_left"), "one_left": Signal(name="e_one_left"),
                 "pk": Signal(n, name="e_pk"), "lik": Signal(n, name="e_lik"),
                 "last_msg": Signal(name="e_last_msg"), "first": Signal(name="e_first"),
                 "pk_cnt": Signal.like(pk_cnt, name="e_pk_cnt")}
            m.d.comb += [
                e["active"].eq(active | self.cmd.valid),
                e["drain"].eq(Mux(active, drain, c.drain)),
                e["left"].eq(Mux(active, left, c.beats - 2)),
                e["one_left"].eq(Mux(active, one_left, c.beats == 1)),
                e["pk"].eq(Mux(active, pk, c.pk)),
                e["lik"].eq(Mux(active, lik, c.lik)),
                e["last_msg"].eq(Mux(active, last_msg, c.last_msg)),
                e["first"].eq(active & first | ~active),
                e["pk_cnt"].eq(Mux(active, pk_cnt, c.pkc)),
            ]
        else:
            e = {"active": active, "drain": drain, "left": left, "one_left": one_left, "pk": pk,
                 "lik": lik, "last_msg": last_msg, "first": first, "pk_cnt": pk_cnt}

        o_free = Signal()
        take = Signal()
        m.d.comb += [
            o_free.eq(~self.o.valid | self.o.ready),
            s_ready.eq(e["active"] & (e["drain"] | o_free)),
            take.eq(s_take & ~e["drain"]),
        ]
        end = Signal()           # the message's end is due in this beat
        keep_ok = Signal()       # the beat's keep is the expected one (pk)
        mism = Signal()
        m.d.comb += [
            end.eq(e["one_left"] & e["last_msg"]),
            keep_ok.eq(s_ok & (s_cnt == e["pk_cnt"])),
            mism.eq(Mux(beat.last, ~end | ~keep_ok, end)),
        ]
        mask = Signal(self._width)
        m.d.comb += mask.eq(Cat(*[Mux(e["one_left"], e["pk"][j], 1).replicate(8)
                                  for j in range(n)]))

        # The output keep is whole 4-lane groups (lik, or all lanes): one flip-flop per group,
        # so that every block downstream sees the lanes of a group as one signal.
        keep4 = Signal(n // 4, name="o_keep4")
        m.d.comb += self.o.payload.keep.eq(Cat(*[keep4[j // 4] for j in range(n)]))
        with m.If(o_free):
            m.d.sync += self.o.valid.eq(take)
        with m.If(take):
            m.d.sync += [
                self.o.payload.data.eq(beat.data & mask),
                keep4.eq(Mux(e["one_left"] & ~mism, e["lik"][::4], (1 << (n // 4)) - 1)),
                self.o.payload.first.eq(e["first"]),
                self.o.payload.last.eq(e["one_left"] | mism),
                self.o.payload.abort.eq(mism),
                first.eq(0),
                left.eq(e["left"] - 1),
            ]
            with m.If(e["one_left"] | mism):
                # the packet ends here; an input packet that goes on is dropped to its end
                m.d.sync += [active.eq(mism & ~beat.last), drain.eq(1)]
        with m.If(s_take & e["drain"] & beat.last):
            m.d.sync += active.eq(0)
        m.d.sync += [self.done.valid.eq(take & (e["one_left"] | mism)),
                     self.done.payload.mism.eq(mism)]
        return m
