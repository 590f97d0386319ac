# SPDX-License-Identifier: BSD-2-Clause
"""The readers of the RX front end's beats: each frame's headers, its length and its iCRC
verdict, as one record per frame."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import layouts, proto
from ..config import check_data_width
from ..lib.arith import or_tree
from ..lib.header import HeaderExtractor, header_fields_layout
from ..lib.icrc import ICRCChecker, ICRCResultLayout
from ..lib.stream import frame_layout
from .pipe import delay

__all__ = ["ARP_VARIANTS", "IP_VARIANTS", "LEN_BITS", "frame_length_layout", "rx_frame_layout",
           "RxParser"]

#: Header stack of the ARP extractor.
ARP_VARIANTS = ((proto.ETH, proto.ARP),)
#: Header stacks of the IPv4 extractor: a CM datagram (UDP port 0x4321), else a RoCEv2 BTH and
#: the 4 bytes after it as an AETH.
IP_VARIANTS = ((proto.ETH, proto.IPV4, proto.UDP, proto.CM_DATAGRAM),
               (proto.ETH, proto.IPV4, proto.UDP, proto.BTH, proto.AETH))

#: Frame lengths are counted exactly up to ``2**LEN_BITS`` bytes, enough to compare the bytes
#: after the Ethernet header with any IPv4 total length; a longer frame fails every length check.
LEN_BITS = dict(proto.IPV4.fields)["total_length"] + 1

_ETH_HLEN = proto.ETH.size
_IP_END = _ETH_HLEN + proto.IPV4.size              # the frame holds the IPv4 header
_ARP_END = _ETH_HLEN + proto.ARP.size              # the frame holds the ARP packet


def frame_length_layout():
    """What the rules need of a frame's length: ``short_eth`` (below an Ethernet header),
    ``short_ipv4`` (below Ethernet + IPv4 headers), ``short_arp`` (below Ethernet + ARP),
    ``min_frame`` (exactly :data:`roce_hw.proto.ETH_MIN_FRAME` bytes) and ``l3_bytes`` (the
    bytes after the Ethernet header, ``LEN_BITS + 1`` bits: meaningful unless ``short_eth``)."""
    return data.StructLayout({"short_eth": 1, "short_ipv4": 1, "short_arp": 1, "min_frame": 1,
                              "l3_bytes": LEN_BITS + 1})


def rx_frame_layout():
    """One received frame, as :class:`RxParser` reports it: ``bad`` (the MAC's flag),
    ``length`` (:func:`frame_length_layout`), ``arp`` (:data:`roce_hw.layouts.ARP`, from the
    ARP extractor) and ``ip`` (every header of :data:`IP_VARIANTS`,
    :func:`~roce_hw.lib.header.header_fields_layout`, from the IPv4 extractor). Header bytes the
    frame does not hold are meaningless (the lengths say which)."""
    return data.StructLayout({"bad": 1, "length": frame_length_layout(), "arp": layouts.ARP,
                              "ip": header_fields_layout(IP_VARIANTS)})


class RxParser(wiring.Component):
    """Reads every beat of the received frames: two header extractors, the frame length and
    the iCRC checker, with one record per frame on ``o`` and one iCRC verdict on ``icrc``.

    The beats go in parallel to two :class:`~roce_hw.lib.header.HeaderExtractor`\\ s (Ethernet
    + ARP; Ethernet + IPv4 + UDP + CM datagram or BTH + AETH, told apart by the UDP port), the
    :class:`~roce_hw.lib.icrc.ICRCChecker` and a length counter; none of them ever stalls. A
    frame's header leaves an extractor at most :attr:`HeaderExtractor.latency` cycles after its
    last beat went in and the next frame's no earlier than that after its first beat: each is
    latched when it appears, so :attr:`latency` cycles after the last beat the latches hold this
    frame's. The length is ``Cat(index of the last valid lane, beat index)`` (no adder), its
    compares registered in the cycle after.

    Latency: with the last beat of a frame on ``i`` in cycle t, its record is on ``o`` in cycle
    t + :attr:`latency` (4) and its iCRC verdict on ``icrc`` in cycle t + :attr:`icrc_latency`
    (10). Throughput: one beat per cycle, back to back frames of any length (frames of one
    beat included), one record per frame. Backpressure: none (``i`` is always ready, ``o`` and
    ``icrc`` are taken when valid).

    Parameters
    ----------
    data_width : int

    Members
    -------
    i : ``In(stream.Signature(frame_layout(data_width), always_ready=True))``
        The frames.
    o : ``Out(stream.Signature(rx_frame_layout(), always_ready=True))``
        One record per frame.
    icrc : ``Out(stream.Signature(ICRCResultLayout, always_ready=True))``
        One iCRC verdict per frame (``good``: a RoCEv2 frame with a correct iCRC).
    """

    #: Cycles from the last beat of a frame on ``i`` to its record on ``o``.
    latency = HeaderExtractor.latency + 1

    def __init__(self, data_width):
        self._width = check_data_width(data_width)
        self._icrc = ICRCChecker(data_width)
        super().__init__({
            "i": In(stream.Signature(frame_layout(data_width), always_ready=True)),
            "o": Out(stream.Signature(rx_frame_layout(), always_ready=True)),
            "icrc": Out(stream.Signature(ICRCResultLayout, always_ready=True)),
        })

    @property
    def icrc_latency(self):
        """Cycles from the last beat of a frame on ``i`` to its verdict on ``icrc``."""
        return self._icrc.latency + 1

    def elaborate(self, platform):
        m = Module()
        width = self._width
        n = width // 8
        lg = n.bit_length() - 1
        beat, bv = self.i.payload, self.i.valid

        m.submodules.x_arp = x_arp = HeaderExtractor(width, ARP_VARIANTS)
        m.submodules.x_ip = x_ip = HeaderExtractor(
            width, IP_VARIANTS,
            classify=lambda m, f: f.udp.dst_port != proto.CM_UDP_PORT)
        m.submodules.icrc = icrc = self._icrc
        # The readers take packet beats (no abort) and have a `ready`, which is always 1 here
        # since nothing downstream stalls.
        for sink in (x_arp.i, x_ip.i, icrc.i):
            m.d.comb += [sink.valid.eq(bv), sink.payload.data.eq(beat.data),
                         sink.payload.keep.eq(beat.keep), sink.payload.first.eq(beat.first),
                         sink.payload.last.eq(beat.last)]
        m.d.comb += [x_arp.o.ready.eq(1), x_arp.hdr.ready.eq(1), x_ip.o.ready.eq(1),
                     x_ip.hdr.ready.eq(1)]
        wiring.connect(m, icrc.o, wiring.flipped(self.icrc))      # (its `ready` becomes 1)

        # Cycle numbers count from the cycle the last beat of a frame is on `i` (cycle 0).
        arp_h = Signal(layouts.ARP)
        ip_h = Signal(header_fields_layout(IP_VARIANTS))
        with m.If(x_arp.hdr.valid):
            m.d.sync += arp_h.eq(x_arp.hdr.payload.fields.arp)
        with m.If(x_ip.hdr.valid):
            m.d.sync += ip_h.eq(x_ip.hdr.payload.fields)

        # --- frame length - 1 = Cat(index of the last valid lane, beat index)
        bw = LEN_BITS - lg
        bnext = Signal(bw + 1)                  # beats so far; MSB sticks (frame too long)
        bidx = Signal(bw + 1)
        m.d.comb += bidx.eq(Mux(beat.first, 0, bnext))
        with m.If(bv):
            with m.If(beat.first):
                m.d.sync += bnext.eq(1)
            with m.Elif(~bnext[bw]):
                m.d.sync += bnext.eq(bnext + 1)
        lane = Signal(lg)
        keep = beat.keep
        # keep is contiguous from lane 0: lane j is the last one where keep[j] & ~keep[j + 1]
        edge = [keep[j] & ~keep[j + 1] for j in range(n - 1)] + [keep[n - 1]]
        for b in range(lg):
            m.d.comb += lane[b].eq(or_tree([edge[j] for j in range(n) if (j >> b) & 1]))
        lm1_0 = Signal(LEN_BITS + 1)            # frame length - 1 (top bit: too long)
        m.d.comb += lm1_0.eq(Cat(lane[:lg], bidx))

        # --- cycle 1 -> 2: the length compares, then carried to the record
        lm1 = delay(m, lm1_0, 1, "lm1", data_only=True)
        length = Signal(frame_length_layout(), reset_less=True)
        m.d.sync += [
            length.short_eth.eq(lm1 < _ETH_HLEN - 1),
            length.short_ipv4.eq(lm1 < _IP_END - 1),
            length.short_arp.eq(lm1 < _ARP_END - 1),
            length.min_frame.eq(lm1 == proto.ETH_MIN_FRAME - 1),
            length.l3_bytes.eq((lm1 - (_ETH_HLEN - 1))[:LEN_BITS + 1]),
        ]
        rec = self.o.payload
        m.d.comb += [
            rec.arp.eq(arp_h),
            rec.ip.eq(ip_h),
            rec.length.eq(delay(m, length, self.latency - 2, "length", data_only=True)),
            rec.bad.eq(delay(m, beat.abort, self.latency, "bad", data_only=True)),
            self.o.valid.eq(delay(m, bv & beat.last, self.latency, "ev")),
        ]
        return m
