# SPDX-License-Identifier: BSD-2-Clause
"""Packet builder: frame header fields + payload packets -> RoCEv2 frames with iCRC."""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .. import proto
from ..config import check_data_width
from ..lib.arith import or_tree
from ..lib.header import HeaderInserter, inserter_hdr_layout
from ..lib.icrc import ICRCInserter
from ..lib.ipv4 import IPv4Checksum
from ..lib.stream import FrameSignature, ReadyBreak, frame_layout

__all__ = ["ICRC_VARIANT", "PacketBuilder"]

#: Frame variant ``(vlan, ip_version)`` of every frame built here: no ethertype compare in the
#: iCRC inserter, whose zeroing then needs no register stage of its own.
ICRC_VARIANT = (0, 4)


class PacketBuilder(wiring.Component):
    """Header fields + payload -> complete frames: a
    :class:`~roce_hw.lib.header.HeaderInserter`, then an :class:`~roce_hw.lib.icrc.ICRCInserter`,
    then the IPv4 header checksum.

    The IPv4 checksum is computed beside the frame (:class:`~roce_hw.lib.ipv4.IPv4Checksum`,
    from the header fields as they are taken) and written into the frame as it leaves the iCRC
    inserter: the iCRC does not cover the IPv4 checksum (it is one of its masked fields), so the
    checksum needs no place on the latency path. Frames with an ``abort`` payload keep it on
    their last beat (the iCRC inserter carries no side band: the bit waits in a small FIFO).

    Latency: ``hdr`` transfer to the first beat on ``o``: ``HeaderInserter.latency +
    ICRCInserter(W).latency + 1`` cycles. Throughput: one beat per cycle, frames back to back.
    Backpressure: ``o`` stalls everything; ``hdr`` waits while :data:`_CSUM_DEPTH` frames are
    between ``hdr`` and their checksum beat. ``o.ready`` reaches the iCRC inserter's output
    ready-break only (``ready_break``: its enable, which the header inserter sees, is a
    flip-flop); ``o.payload`` is that ready-break's multiplexer and the checksum's.

    Parameters
    ----------
    data_width : int
    variants : sequence of tuple of proto.Header
        Header variants; every one starts with Ethernet + IPv4.

    Members
    -------
    hdr : ``In(stream.Signature(inserter_hdr_layout(variants)))``
    i : ``In(FrameSignature(W))``
        Payload packets (one per ``hdr`` with ``payload`` = 1).
    o : ``Out(FrameSignature(W))``
        Frames with iCRC, ``abort`` on the last beat of a frame to drop.
    """

    def __init__(self, data_width, variants):
        self._width = check_data_width(data_width)
        self._variants = tuple(tuple(v) for v in variants)
        for v in self._variants:
            if v[:2] != (proto.ETH, proto.IPV4):
                raise ValueError(f"every variant must start with ETH, IPV4, not {v}")
        super().__init__({
            "hdr": In(stream.Signature(inserter_hdr_layout(self._variants))),
            "i": In(FrameSignature(data_width)),
            "o": Out(FrameSignature(data_width)),
        })

    @property
    def latency(self):
        """Cycles from a ``hdr`` transfer (idle builder) to the first beat on ``o``."""
        return (HeaderInserter.latency
                + ICRCInserter.latency_for(self._width, variant=ICRC_VARIANT) + 1)

    def elaborate(self, platform):
        m = Module()
        w = self._width
        n = w // 8
        m.submodules.hins = hins = HeaderInserter(w, self._variants, abort=True)
        # (every variant is IPv4 without a VLAN tag: no ethertype compare in the iCRC inserter)
        m.submodules.icrc = icrc = ICRCInserter(w, variant=ICRC_VARIANT, ready_break=True)
        # the split checksum (two LUT levels per stage) where its cycle more fits before the
        # checksum's beat (see the assertion below): at 64 and 128 bits
        off = proto.ETH.size + proto.IPV4.offset("checksum")[0]
        beat_no, lane = divmod(off, n)
        split = (IPv4Checksum.latency_for(split=True) + 1
                 <= HeaderInserter.latency + icrc.latency + 1 + beat_no)
        m.submodules.csum = csum = IPv4Checksum(split=split)

        # checksums of frames between their `hdr` transfer and their checksum beat on `o`
        depth = 16
        # a ring of registers with one-hot pointers (no counter, no RAM on the output path)
        cs_mem = [Signal(16, name=f"csum{k}") for k in range(depth)]
        cs_wp = Signal(depth, init=1)
        cs_rp = Signal(depth, init=1)
        outstanding = Signal(range(depth + 1))
        room = Signal(init=1)          # outstanding < depth, registered
        hdr_go = Signal()
        patch_go = Signal()
        m.d.comb += [
            hins.hdr.valid.eq(self.hdr.valid & room),
            hins.hdr.payload.eq(self.hdr.payload),
            self.hdr.ready.eq(hins.hdr.ready & room),
            hdr_go.eq(self.hdr.valid & self.hdr.ready),
            csum.i.valid.eq(hdr_go),
            csum.i.payload.eq(self.hdr.payload.fields.ipv4),
        ]
        with m.If(csum.o.valid):
            m.d.sync += cs_wp.eq(cs_wp.rotate_left(1))
            for k in range(depth):
                with m.If(cs_wp[k]):
                    m.d.sync += cs_mem[k].eq(csum.o.payload)
        # counted from registered events: `room` lags by up to two frames, hence the margin
        hdr_r = Signal()
        patch_r = Signal()
        nxt = Signal.like(outstanding)
        m.d.sync += [hdr_r.eq(hdr_go), patch_r.eq(patch_go)]
        m.d.comb += nxt.eq(outstanding + hdr_r - patch_r)
        m.d.sync += [outstanding.eq(nxt), room.eq(nxt < depth - 2)]
        # (the ready path from the header inserter to the payload source stops here)
        m.submodules.ibreak = ibreak = ReadyBreak(frame_layout(w))
        wiring.connect(m, wiring.flipped(self.i), ibreak.i)
        wiring.connect(m, ibreak.o, hins.i)

        # header inserter -> iCRC inserter -> ready break; `abort` waits beside them in a ring
        # of registers with one-hot pointers (no counter on the ready path). Frames inside: at
        # most latency + 3 (one-beat frames back to back, one held in the ready break), so the
        # ring never overflows.
        ring = icrc.latency + 5
        ab = Signal(ring)
        wp = Signal(ring, init=1)
        rp = Signal(ring, init=1)
        src = hins.o
        m.d.comb += [
            icrc.i.valid.eq(src.valid),
            icrc.i.payload.data.eq(src.payload.data),
            icrc.i.payload.keep.eq(src.payload.keep),
            icrc.i.payload.first.eq(src.payload.first),
            icrc.i.payload.last.eq(src.payload.last),
            src.ready.eq(icrc.i.ready),
        ]
        with m.If(src.valid & src.ready & src.payload.last):
            m.d.sync += [wp.eq(wp.rotate_left(1)),
                         ab.eq((ab & ~wp) | Mux(src.payload.abort, wp, 0))]

        # the checksum goes into its beat as the frame leaves (`beat_no`, `lane`: above)
        pos = Signal(beat_no + 2, init=1)       # one-hot: beats of the frame out so far
        at_csum = Signal()
        data_out = Signal(w)
        m.d.comb += at_csum.eq(pos[beat_no])
        cs = Signal(16)             # AND-OR select by the one-hot pointer (no priority chain)
        m.d.comb += cs.eq(or_tree([cs_mem[k] & cs_rp[k].replicate(16) for k in range(depth)]))
        # (the ready path from `o` stops at the iCRC inserter's ready-break: its enable, which
        # the header inserter's output stage sees, is a flip-flop)
        fo = icrc.o
        m.d.comb += data_out.eq(fo.payload.data)
        with m.If(at_csum):
            # wire order: the checksum's high byte first
            m.d.comb += [data_out[8 * lane:8 * lane + 8].eq(cs[8:16]),
                         data_out[8 * lane + 8:8 * lane + 16].eq(cs[:8])]
        out_go = Signal()
        # (the checksum is ready: it comes IPv4Checksum.latency + 1 cycles after `hdr`, the
        # frame's checksum beat at least HeaderInserter.latency + ICRCInserter.latency + 1 +
        # its beat number cycles after it)
        assert csum.latency + 1 <= HeaderInserter.latency + icrc.latency + 1 + beat_no
        m.d.comb += [
            self.o.valid.eq(fo.valid),
            self.o.payload.data.eq(data_out),
            self.o.payload.keep.eq(fo.payload.keep),
            self.o.payload.first.eq(fo.payload.first),
            self.o.payload.last.eq(fo.payload.last),
            self.o.payload.abort.eq(fo.payload.last & (ab & rp).any()),
            fo.ready.eq(self.o.ready),
            out_go.eq(self.o.valid & self.o.ready),
            patch_go.eq(out_go & at_csum),
        ]
        with m.If(patch_go):
            m.d.sync += cs_rp.eq(cs_rp.rotate_left(1))
        with m.If(out_go & fo.payload.last):
            m.d.sync += rp.eq(rp.rotate_left(1))
        with m.If(out_go):
            with m.If(fo.payload.last):
                m.d.sync += pos.eq(1)
            with m.Else():
                m.d.sync += pos.eq(pos << 1)
        return m
