# SPDX-License-Identifier: BSD-2-Clause
"""Frames the engine sends on its own behalf: ARP replies and connection-manager replies."""
from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .. import proto
from ..config import check_config
from ..lib.header import HeaderInserter
from ..lib.ipv4 import IPv4Checksum
from ..lib.stream import frame_layout
from ..rx.items import arp_req_layout
from .cm import cm_reply_layout

__all__ = ["REPLY_VARIANTS", "ReplyBuilder"]

#: The two frame kinds: an ARP reply padded to 60 bytes, a CM datagram over UDP/IPv4.
REPLY_VARIANTS = (
    (proto.ETH, proto.ARP, proto.ARP_PAD),
    (proto.ETH, proto.IPV4, proto.UDP, proto.CM_DATAGRAM),
)
_ARP, _CM = range(2)
_CM_UDP_LENGTH = proto.UDP.size + proto.CM_DATAGRAM.size
_BROADCAST = (1 << 48) - 1


class ReplyBuilder(wiring.Component):
    """Builds ARP replies and CM reply frames through one
    :class:`~roce_hw.lib.header.HeaderInserter` (header-only frames, no payload).

    ARP reply (RFC 826): Ethernet to the asker's MAC from ``local_mac``, ARP for IPv4 over
    Ethernet (:data:`roce_hw.proto.ARP_FIXED`), ``oper`` REPLY,
    ``sha``/``spa`` = ``local_mac``/``local_ip``, ``tha``/``tpa`` = the asker's; 18 zero bytes
    bring it to the 60-byte minimum frame (the MAC appends the FCS).

    CM reply: Ethernet to ``dst_mac``; IPv4 with the fields of :data:`roce_hw.proto.IPV4_FIXED`
    (version 4, IHL 5, DF, not a fragment), DSCP/ECN 0, total length 92, identification 0,
    TTL ``config.ttl``, protocol UDP, header checksum, ``local_ip`` ->
    ``dst_ip``; UDP source port 0x4321 -> ``dst_port``, length 72, checksum 0; the 64-byte
    datagram. 106 bytes, no iCRC (it is not RoCE).

    One request at a time: ARP before CM when both wait. Latency: ``arp`` transfer to the first
    beat about 4 cycles, ``cm`` about 10 (the pipelined IPv4 checksum). Throughput: one frame
    per ~5 (ARP) / ~11 (CM) cycles or its length in beats, whichever is longer: these are
    control frames. Backpressure: ``o`` may stall at any time; ``arp``/``cm`` are taken only
    when the builder is idle.

    Members
    -------
    arp : ``In(stream.Signature(arp_req_layout()))``
    cm : ``In(stream.Signature(cm_reply_layout()))``
    o : ``Out(stream.Signature(frame_layout(W)))``
        Frames (``abort`` always 0).
    local_mac : ``In(48)``, local_ip : ``In(32)``
    """

    def __init__(self, config):
        self._config = check_config(config)
        super().__init__({
            "arp": In(stream.Signature(arp_req_layout())),
            "cm": In(stream.Signature(cm_reply_layout())),
            "o": Out(stream.Signature(frame_layout(config.data_width))),
            "local_mac": In(48),
            "local_ip": In(32),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        m.submodules.hins = hins = HeaderInserter(cfg.data_width, REPLY_VARIANTS, abort=True)
        m.submodules.csum = csum = IPv4Checksum()
        wiring.connect(m, hins.o, wiring.flipped(self.o))
        m.d.comb += hins.i.valid.eq(0)

        hdr = Signal.like(hins.hdr.payload)
        f = hdr.fields
        # the checksum adders see the header register alone (no state in front of them)
        m.d.comb += csum.i.payload.eq(f.ipv4)
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.arp.ready.eq(1)
                m.d.sync += [hdr.payload.eq(0), f.eth.src.eq(self.local_mac)]
                with m.If(self.arp.valid):
                    a = self.arp.payload
                    m.d.sync += [f.arp[name].eq(v) for name, v in proto.ARP_FIXED.items()]
                    m.d.sync += [
                        hdr.variant.eq(_ARP),
                        f.eth.dst.eq(a.sha), f.eth.ethertype.eq(proto.ETHERTYPE_ARP),
                        f.arp.oper.eq(proto.ArpOper.REPLY),
                        f.arp.sha.eq(self.local_mac), f.arp.spa.eq(self.local_ip),
                        f.arp.tha.eq(a.sha), f.arp.tpa.eq(a.spa), f.arp_pad.eq(0),
                    ]
                    m.next = "SEND"
                with m.Else():
                    m.d.comb += self.cm.ready.eq(1)
                    with m.If(self.cm.valid):
                        c = self.cm.payload
                        m.d.sync += [f.ipv4[name].eq(v)
                                     for name, v in proto.IPV4_FIXED.items()]
                        m.d.sync += [
                            hdr.variant.eq(_CM),
                            f.eth.dst.eq(c.dst_mac), f.eth.ethertype.eq(proto.ETHERTYPE_IPV4),
                            f.ipv4.dscp.eq(0), f.ipv4.ecn.eq(0),
                            f.ipv4.total_length.eq(proto.IPV4.size + _CM_UDP_LENGTH),
                            f.ipv4.identification.eq(0),
                            f.ipv4.ttl.eq(cfg.ttl), f.ipv4.protocol.eq(proto.IP_PROTO_UDP),
                            f.ipv4.checksum.eq(0),
                            f.ipv4.src.eq(self.local_ip), f.ipv4.dst.eq(c.dst_ip),
                            f.udp.src_port.eq(proto.CM_UDP_PORT), f.udp.dst_port.eq(c.dst_port),
                            f.udp.length.eq(_CM_UDP_LENGTH), f.udp.checksum.eq(0),
                            f.cm_datagram.eq(c.dgram),
                        ]
                        m.next = "CSUM"

            with m.State("CSUM"):
                m.d.comb += csum.i.valid.eq(1)
                m.next = "CSUM_WAIT"

            with m.State("CSUM_WAIT"):
                with m.If(csum.o.valid):
                    m.d.sync += f.ipv4.checksum.eq(csum.o.payload)
                    m.next = "SEND"

            with m.State("SEND"):
                m.d.comb += [hins.hdr.valid.eq(1), hins.hdr.payload.eq(hdr)]
                with m.If(hins.hdr.ready):
                    m.next = "IDLE"
        return m
