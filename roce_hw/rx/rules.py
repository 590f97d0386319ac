# SPDX-License-Identifier: BSD-2-Clause
"""The RX front end's rules: from a frame's record to its verdict (the kind it is passed on as,
or the reason it is dropped) and the item it carries."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import layouts, proto
from ..lib.icrc import ICRCResultLayout
from ..lib.ipv4_check import IPv4HeaderCheck
from .items import arp_req_layout, cm_rx_layout, roce_rx_layout
from .parse import rx_frame_layout
from .pipe import delay, reg

__all__ = ["verdict_layout", "RxRules"]

_ETH_HLEN = proto.ETH.size
_ROCE_MIN_UDP = proto.UDP.size + proto.BTH.size + proto.ICRC_BYTES
_ACK_UDP = _ROCE_MIN_UDP + proto.AETH.size
_CM_UDP = proto.UDP.size + proto.CM_DATAGRAM_BYTES
_IP_FIXED = proto.IPV4_FIXED
_ARP_FIXED = proto.ARP_FIXED

#: Cycles from a record on ``i`` to the registered pre-decision (field compares, the rules as
#: AND terms, the pre-decision).
_PRE = 3


def verdict_layout():
    """One frame's verdict: ``verdict`` (one bit per name of
    :data:`roce_hw.proto.RX_VERDICTS`, exactly one set) and the items ``arp``, ``cm``, ``roce``
    (:mod:`roce_hw.rx.items`; only the one of the verdict's kind is meaningful)."""
    return data.StructLayout({"verdict": data.StructLayout({name: 1
                                                            for name in proto.RX_VERDICTS}),
                              "arp": arp_req_layout(), "cm": cm_rx_layout(),
                              "roce": roce_rx_layout()})


class RxRules(wiring.Component):
    """The rules of :func:`roce_hw.model.rx.classify` in hardware: one verdict per frame.

    A fixed-latency pipeline, one stage per cycle and one frame per stage: the header fields
    of the record are compared with constants from :mod:`roce_hw.proto` and with the local
    addresses (registered), the rules are evaluated as AND terms and a pre-decision is
    registered that assumes a good IPv4 checksum and iCRC; the checksum
    (:class:`~roce_hw.lib.ipv4_check.IPv4HeaderCheck`, fed with the record) and the iCRC
    verdict then decide. The items are built from the record's headers and carried alongside.

    Latency: a record on ``i`` in cycle t gives its verdict on ``o`` in cycle t +
    :attr:`latency` (6; the checksum's latency, or ``icrc_offset`` if that is later); the
    verdict is combinational from registers. Throughput: one frame per cycle. Backpressure:
    none.

    Parameters
    ----------
    icrc_offset : int
        Cycles from a frame's record on ``i`` to its iCRC verdict on ``icrc`` (at least 0).

    Members
    -------
    i : ``In(stream.Signature(rx_frame_layout(), always_ready=True))``
        One record per frame (:class:`~roce_hw.rx.parse.RxParser`).
    icrc : ``In(stream.Signature(ICRCResultLayout, always_ready=True))``
        The iCRC verdict of each frame, ``icrc_offset`` cycles after its record.
    local_mac : ``In(48)``, local_ip : ``In(32)``
        The engine's addresses; static (registered here).
    o : ``Out(stream.Signature(verdict_layout(), always_ready=True))``
        One verdict per frame.
    """

    def __init__(self, *, icrc_offset):
        if isinstance(icrc_offset, bool) or not isinstance(icrc_offset, int) or icrc_offset < 0:
            raise ValueError(f"icrc_offset must be a non-negative integer, not {icrc_offset!r}")
        self._icrc_offset = icrc_offset
        super().__init__({
            "i": In(stream.Signature(rx_frame_layout(), always_ready=True)),
            "icrc": In(stream.Signature(ICRCResultLayout, always_ready=True)),
            "local_mac": In(layouts.ETH["dst"].shape),
            "local_ip": In(layouts.IPV4["dst"].shape),
            "o": Out(stream.Signature(verdict_layout(), always_ready=True)),
        })

    @property
    def latency(self):
        """Cycles from a record on ``i`` to its verdict on ``o``."""
        return max(_PRE, IPv4HeaderCheck.latency, self._icrc_offset)

    def elaborate(self, platform):
        m = Module()
        at_decide = self.latency
        ev = self.i.valid
        rec = self.i.payload
        length, arp = rec.length, rec.arp
        eth, ip, udp = rec.ip.eth, rec.ip.ipv4, rec.ip.udp
        lmac = reg(m, self.local_mac, "lmac")
        lip = reg(m, self.local_ip, "lip")
        tl = ip.total_length
        ulen = udp.length

        m.submodules.csum = csum = IPv4HeaderCheck()
        m.d.comb += [csum.i.valid.eq(ev), csum.i.payload.eq(ip)]

        # --- cycle 0 -> 1: field compares
        c = {
            "ev": delay(m, ev, 1, "ev_1"),
            "bad": reg(m, rec.bad, "bad_1"),
            "short_eth": reg(m, length.short_eth, "short_eth_1"),
            "short_ipv4": reg(m, length.short_ipv4, "short_ipv4_1"),
            "short_arp": reg(m, length.short_arp, "short_arp_1"),
            "mac_ours": reg(m, eth.dst == lmac, "mac_ours_1"),
            "mac_bc": reg(m, eth.dst == proto.BROADCAST_MAC, "mac_bc_1"),
            "et_arp": reg(m, eth.ethertype == proto.ETHERTYPE_ARP, "et_arp_1"),
            "et_ip": reg(m, eth.ethertype == proto.ETHERTYPE_IPV4, "et_ip_1"),
            "arp_fmt": reg(m, Cat(*[arp[k] == v for k, v in _ARP_FIXED.items()]).all(),
                           "arp_fmt_1"),
            "arp_req": reg(m, arp.oper == proto.ArpOper.REQUEST, "arp_req_1"),
            "arp_tpa": reg(m, arp.tpa == lip, "arp_tpa_1"),
            "ip_hdr": reg(m, (ip.version == _IP_FIXED["version"]) &
                          (ip.ihl == _IP_FIXED["ihl"]), "ip_hdr_1"),
            "ip_frag": reg(m, (ip.flag_mf != _IP_FIXED["flag_mf"]) |
                           (ip.frag_offset != _IP_FIXED["frag_offset"]), "ip_frag_1"),
            "tl_exact": reg(m, length.l3_bytes == tl, "tl_exact_1"),
            "tl_pad": reg(m, length.min_frame & (tl < proto.ETH_MIN_FRAME - _ETH_HLEN),
                          "tl_pad_1"),
            "tl_min": reg(m, tl >= proto.IPV4.size, "tl_min_1"),
            "ip_dst": reg(m, ip.dst == lip, "ip_dst_1"),
            "udp": reg(m, ip.protocol == proto.IP_PROTO_UDP, "udp_1"),
            "tl_m20": reg(m, (tl - proto.IPV4.size)[:len(tl)], "tl_m20_1"),
            "ulen": reg(m, ulen, "ulen_1"),
            "ulen_min": reg(m, ulen >= proto.UDP.size, "ulen_min_1"),
            "p_roce": reg(m, udp.dst_port == proto.ROCEV2_UDP_PORT, "p_roce_1"),
            "p_cm": reg(m, udp.dst_port == proto.CM_UDP_PORT, "p_cm_1"),
            "roce_len": reg(m, ulen >= _ROCE_MIN_UDP, "roce_len_1"),
            "cm_len": reg(m, ulen == _CM_UDP, "cm_len_1"),
        }

        # --- cycle 1 -> 2: UDP length; the rules as AND terms
        l2_ok = ~c["bad"] & ~c["short_eth"]
        arp_take = l2_ok & c["et_arp"] & (c["mac_ours"] | c["mac_bc"]) & ~c["short_arp"] & \
            c["arp_fmt"] & c["arp_req"] & c["arp_tpa"]
        ip_path = l2_ok & ~c["et_arp"] & c["mac_ours"] & c["et_ip"]
        ip_whole = ip_path & ~c["short_ipv4"]
        c2 = {
            "ev": delay(m, c["ev"], 1, "ev_2"),
            "bad": reg(m, c["bad"], "bad_2"),
            "short_eth": reg(m, c["short_eth"], "short_eth_2"),
            "arp": reg(m, arp_take, "arp_2"),
            "l2_other": reg(m, l2_ok & ~arp_take & ~ip_path, "l2_other_2"),
            "ip_runt": reg(m, ip_path & c["short_ipv4"], "ip_runt_2"),
            "ip_hdr_bad": reg(m, ip_whole & ~c["ip_hdr"], "ip_hdr_bad_2"),
            "ip_frag": reg(m, ip_whole & c["ip_hdr"] & c["ip_frag"], "ip_frag_2"),
            "ip_valid": reg(m, ip_whole & c["ip_hdr"] & ~c["ip_frag"], "ip_valid_2"),
            "ip_len": reg(m, c["tl_min"] & (c["tl_exact"] | c["tl_pad"]), "ip_len_2"),
            "for_us": reg(m, c["ip_dst"] & c["udp"], "for_us_2"),
            "udp_len": reg(m, (c["ulen"] == c["tl_m20"]) & c["ulen_min"], "udp_len_2"),
        }
        for key in ("p_roce", "p_cm", "roce_len", "cm_len"):
            c2[key] = reg(m, c[key], f"{key}_2")

        # --- cycle 2 -> 3: the pre-decision, assuming a good checksum and iCRC
        c = c2
        ip_ok = c["ip_valid"] & c["ip_len"]
        udp_ours = ip_ok & c["for_us"]
        udp_ok = udp_ours & c["udp_len"]
        pre_terms = {
            "mac_bad": c["bad"],
            "runt": ~c["bad"] & (c["short_eth"] | c["ip_runt"]),
            "arp": c["arp"],
            "ip_header": c["ip_hdr_bad"],
            "ip_fragment": c["ip_frag"],
            "ip_length": c["ip_valid"] & ~c["ip_len"],
            "udp_length": udp_ours & ~c["udp_len"],
            "roce_length": udp_ok & c["p_roce"] & ~c["roce_len"],
            "roce": udp_ok & c["p_roce"] & c["roce_len"],
            "cm_length": udp_ok & c["p_cm"] & ~c["cm_len"],
            "cm": udp_ok & c["p_cm"] & c["cm_len"],
            "other": c["l2_other"] | (ip_ok & ~c["for_us"]) |
                     (udp_ok & ~c["p_roce"] & ~c["p_cm"]),
            "ipchk": c["ip_valid"],         # the verdict needs a good IPv4 checksum
        }
        pre = {k: delay(m, c["ev"] & v, 1, f"pre_{k}_3") for k, v in pre_terms.items()}
        pre = {k: delay(m, v, at_decide - _PRE, f"pre_{k}") for k, v in pre.items()}

        # --- the items, from the record to the verdict
        item = Signal(data.StructLayout({"arp": arp_req_layout(), "cm": cm_rx_layout(),
                                         "roce": roce_rx_layout()}))
        m.d.comb += [
            item.arp.sha.eq(arp.sha), item.arp.spa.eq(arp.spa),
            item.cm.src_mac.eq(eth.src), item.cm.src_ip.eq(ip.src),
            item.cm.src_port.eq(udp.src_port), item.cm.udp_checksum.eq(udp.checksum),
            item.cm.dgram.eq(rec.ip.cm_datagram),
            item.roce.src_ip.eq(ip.src), item.roce.src_port.eq(udp.src_port),
            item.roce.udp_length.eq(ulen), item.roce.bth.eq(rec.ip.bth),
            item.roce.aeth.eq(rec.ip.aeth), item.roce.bth_aeth_only.eq(ulen == _ACK_UDP),
        ]
        item = delay(m, item, at_decide, "item", data_only=True)

        # --- the verdict: the checksum and iCRC verdicts join the pre-decision
        csum_ok = delay(m, csum.o.payload.ok, at_decide - IPv4HeaderCheck.latency, "csum_ok",
                        data_only=True)
        icrc_ok = delay(m, self.icrc.valid & self.icrc.payload.good,
                        at_decide - self._icrc_offset, "icrc_ok")
        csum_bad = Signal()
        m.d.comb += csum_bad.eq(pre["ipchk"] & ~csum_ok)
        v = self.o.payload.verdict
        m.d.comb += [
            self.o.valid.eq(delay(m, ev, at_decide, "ev_decide")),
            v.roce.eq(pre["roce"] & ~csum_bad & icrc_ok),
            v.icrc.eq(pre["roce"] & ~csum_bad & ~icrc_ok),
            v.cm.eq(pre["cm"] & ~csum_bad),
            v.arp.eq(pre["arp"]),
            v.other.eq(pre["other"] & ~csum_bad),
            v.ip_checksum.eq(csum_bad),
            self.o.payload.arp.eq(item.arp),
            self.o.payload.cm.eq(item.cm),
            self.o.payload.roce.eq(item.roce),
        ]
        for name in ("mac_bad", "runt", "ip_header", "ip_fragment"):      # before the checksum
            m.d.comb += v[name].eq(pre[name])
        for name in ("ip_length", "udp_length", "roce_length", "cm_length"):  # after it
            m.d.comb += v[name].eq(pre[name] & ~csum_bad)
        return m
