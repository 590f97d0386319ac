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

__all__ = ["facts_layout", "verdict_bits_layout", "verdict_layout", "RxFieldCompare",
           "RxDecision", "RxRules"]

_ETH_HLEN = proto.ETH.size
_ROCE_MIN_UDP = proto.UDP.size + proto.BTH.size + proto.ICRC_BYTES
_ACK_UDP = _ROCE_MIN_UDP + proto.AETH.size
_CM_UDP = proto.UDP.size + proto.CM_DATAGRAM_BYTES
_IP_FIXED = proto.IPV4_FIXED
_LENGTH = layouts.UDP["length"].shape


def facts_layout():
    """What :class:`RxFieldCompare` finds in one frame's record: one bit per compare (named
    below), and the two lengths the decision compares with each other (``ulen``, the UDP
    length, and ``tl_m20``, the IPv4 total length - 20)."""
    return data.StructLayout({
        "bad": 1, "short_eth": 1, "short_ipv4": 1, "short_arp": 1,
        "mac_ours": 1, "mac_bc": 1, "et_arp": 1, "et_ip": 1,
        "arp_fmt": 1, "arp_req": 1, "arp_tpa": 1,
        "ip_hdr": 1, "ip_frag": 1, "tl_exact": 1, "tl_pad": 1, "tl_min": 1, "ip_dst": 1,
        "udp": 1, "tl_m20": _LENGTH, "ulen": _LENGTH, "ulen_min": 1,
        "p_roce": 1, "p_cm": 1, "roce_len": 1, "cm_len": 1,
    })


def verdict_bits_layout():
    """One bit per name of :data:`roce_hw.proto.RX_VERDICTS`."""
    return data.StructLayout({name: 1 for name in proto.RX_VERDICTS})


def verdict_layout():
    """One frame's verdict: ``verdict`` (:func:`verdict_bits_layout`, exactly one bit set) and
    the items ``arp``, ``cm``, ``roce`` (:mod:`roce_hw.rx.items`; only the one of the verdict's
    kind is meaningful)."""
    return data.StructLayout({"verdict": verdict_bits_layout(), "arp": arp_req_layout(),
                              "cm": cm_rx_layout(), "roce": roce_rx_layout()})


class RxFieldCompare(wiring.Component):
    """Compares the header fields and lengths of a frame's record with the constants of
    :mod:`roce_hw.proto` and with the local addresses: one register stage.

    Latency: a record on ``i`` in cycle t gives its facts on ``o`` in cycle t + 1 (registers).
    Throughput: one record per cycle. Backpressure: none.

    Members
    -------
    i : ``In(stream.Signature(rx_frame_layout(), always_ready=True))``
    local_mac : ``In(48)``, local_ip : ``In(32)``
        Static: registered here, so a record is compared with the addresses of the cycle
        before.
    o : ``Out(stream.Signature(facts_layout(), always_ready=True))``
    """

    i: In(stream.Signature(rx_frame_layout(), always_ready=True))
    local_mac: In(layouts.ETH["dst"].shape)
    local_ip: In(layouts.IPV4["dst"].shape)
    o: Out(stream.Signature(facts_layout(), always_ready=True))

    def elaborate(self, platform):
        m = Module()
        rec = self.i.payload
        length, arp = rec.length, rec.arp
        eth, ip, udp = rec.ip.eth, rec.ip.ipv4, rec.ip.udp
        lmac = reg(m, self.local_mac, "lmac")
        lip = reg(m, self.local_ip, "lip")
        tl = ip.total_length
        ulen = udp.length
        # (the facts are gated by `valid`, which has a reset: they need none)
        f = Signal(facts_layout(), reset_less=True)
        m.d.sync += [
            self.o.valid.eq(self.i.valid),
            f.bad.eq(rec.bad),
            f.short_eth.eq(length.short_eth),
            f.short_ipv4.eq(length.short_ipv4),
            f.short_arp.eq(length.short_arp),
            f.mac_ours.eq(eth.dst == lmac),
            f.mac_bc.eq(eth.dst == proto.BROADCAST_MAC),
            f.et_arp.eq(eth.ethertype == proto.ETHERTYPE_ARP),
            f.et_ip.eq(eth.ethertype == proto.ETHERTYPE_IPV4),
            f.arp_fmt.eq(Cat(*[arp[k] == v for k, v in proto.ARP_FIXED.items()]).all()),
            f.arp_req.eq(arp.oper == proto.ArpOper.REQUEST),
            f.arp_tpa.eq(arp.tpa == lip),
            f.ip_hdr.eq((ip.version == _IP_FIXED["version"]) & (ip.ihl == _IP_FIXED["ihl"])),
            f.ip_frag.eq((ip.flag_mf != _IP_FIXED["flag_mf"]) |
                         (ip.frag_offset != _IP_FIXED["frag_offset"])),
            f.tl_exact.eq(length.l3_bytes == tl),
            f.tl_pad.eq(length.min_frame & (tl < proto.ETH_MIN_FRAME - _ETH_HLEN)),
            f.tl_min.eq(tl >= proto.IPV4.size),
            f.ip_dst.eq(ip.dst == lip),
            f.udp.eq(ip.protocol == proto.IP_PROTO_UDP),
            f.tl_m20.eq(tl - proto.IPV4.size),
            f.ulen.eq(ulen),
            f.ulen_min.eq(ulen >= proto.UDP.size),
            f.p_roce.eq(udp.dst_port == proto.ROCEV2_UDP_PORT),
            f.p_cm.eq(udp.dst_port == proto.CM_UDP_PORT),
            f.roce_len.eq(ulen >= _ROCE_MIN_UDP),
            f.cm_len.eq(ulen == _CM_UDP),
        ]
        m.d.comb += self.o.payload.eq(f)
        return m


class RxDecision(wiring.Component):
    """The rules of :func:`roce_hw.model.rx.classify` as logic: from a frame's facts, its IPv4
    header checksum verdict and its iCRC verdict to one verdict bit.

    Two register stages evaluate the rules as AND terms and register a pre-decision that
    assumes a good checksum and iCRC; it is delayed until both verdicts are there, and they
    decide.

    Latency: facts on ``i`` in cycle t give the verdict on ``o`` in cycle t + :attr:`latency`
    (the later of 2 and the two offsets), combinational from registers. Throughput: one frame
    per cycle. Backpressure: none.

    Parameters
    ----------
    ipv4_offset, icrc_offset : int
        Cycles from a frame's facts on ``i`` to its checksum verdict on ``ipv4``, its iCRC
        verdict on ``icrc`` (at least 0).

    Members
    -------
    i : ``In(stream.Signature(facts_layout(), always_ready=True))``
    ipv4 : ``In(stream.Signature(StructLayout({"ok": 1}), always_ready=True))``
        :class:`~roce_hw.lib.ipv4_check.IPv4HeaderCheck`'s verdict on the frame's header.
    icrc : ``In(stream.Signature(ICRCResultLayout, always_ready=True))``
    o : ``Out(stream.Signature(verdict_bits_layout(), always_ready=True))``
        All bits 0 while ``valid`` is 0.
    """

    #: Register stages from the facts to the pre-decision.
    PRE = 2

    def __init__(self, *, ipv4_offset, icrc_offset):
        for name, value in (("ipv4_offset", ipv4_offset), ("icrc_offset", icrc_offset)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, not {value!r}")
        self._ipv4_offset = ipv4_offset
        self._icrc_offset = icrc_offset
        super().__init__({
            "i": In(stream.Signature(facts_layout(), always_ready=True)),
            "ipv4": In(stream.Signature(data.StructLayout({"ok": 1}), always_ready=True)),
            "icrc": In(stream.Signature(ICRCResultLayout, always_ready=True)),
            "o": Out(stream.Signature(verdict_bits_layout(), always_ready=True)),
        })

    @property
    def latency(self):
        """Cycles from facts on ``i`` to the verdict on ``o``."""
        return max(self.PRE, self._ipv4_offset, self._icrc_offset)

    def elaborate(self, platform):
        m = Module()
        at_decide = self.latency
        c = self.i.payload

        # --- stage 1: UDP length; the rules as AND terms
        l2_ok = ~c.bad & ~c.short_eth
        arp_take = l2_ok & c.et_arp & (c.mac_ours | c.mac_bc) & ~c.short_arp & c.arp_fmt & \
            c.arp_req & c.arp_tpa
        ip_path = l2_ok & ~c.et_arp & c.mac_ours & c.et_ip
        ip_whole = ip_path & ~c.short_ipv4
        s = {
            "ev": delay(m, self.i.valid, 1, "ev_1"),
            "bad": reg(m, c.bad, "bad_1"),
            "short_eth": reg(m, c.short_eth, "short_eth_1"),
            "arp": reg(m, arp_take, "arp_1"),
            "l2_other": reg(m, l2_ok & ~arp_take & ~ip_path, "l2_other_1"),
            "ip_runt": reg(m, ip_path & c.short_ipv4, "ip_runt_1"),
            "ip_hdr_bad": reg(m, ip_whole & ~c.ip_hdr, "ip_hdr_bad_1"),
            "ip_frag": reg(m, ip_whole & c.ip_hdr & c.ip_frag, "ip_frag_1"),
            "ip_valid": reg(m, ip_whole & c.ip_hdr & ~c.ip_frag, "ip_valid_1"),
            "ip_len": reg(m, c.tl_min & (c.tl_exact | c.tl_pad), "ip_len_1"),
            "for_us": reg(m, c.ip_dst & c.udp, "for_us_1"),
            "udp_len": reg(m, (c.ulen == c.tl_m20) & c.ulen_min, "udp_len_1"),
        }
        for key in ("p_roce", "p_cm", "roce_len", "cm_len"):
            s[key] = reg(m, c[key], f"{key}_1")

        # --- stage 2: the pre-decision, assuming a good checksum and iCRC
        ip_ok = s["ip_valid"] & s["ip_len"]
        udp_ours = ip_ok & s["for_us"]
        udp_ok = udp_ours & s["udp_len"]
        pre_terms = {
            "mac_bad": s["bad"],
            "runt": ~s["bad"] & (s["short_eth"] | s["ip_runt"]),
            "arp": s["arp"],
            "ip_header": s["ip_hdr_bad"],
            "ip_fragment": s["ip_frag"],
            "ip_length": s["ip_valid"] & ~s["ip_len"],
            "udp_length": udp_ours & ~s["udp_len"],
            "roce_length": udp_ok & s["p_roce"] & ~s["roce_len"],
            "roce": udp_ok & s["p_roce"] & s["roce_len"],
            "cm_length": udp_ok & s["p_cm"] & ~s["cm_len"],
            "cm": udp_ok & s["p_cm"] & s["cm_len"],
            "other": s["l2_other"] | (ip_ok & ~s["for_us"]) |
                     (udp_ok & ~s["p_roce"] & ~s["p_cm"]),
            "ipchk": s["ip_valid"],         # the verdict needs a good IPv4 checksum
        }
        pre = {k: delay(m, s["ev"] & v, 1, f"pre_{k}_2") for k, v in pre_terms.items()}
        pre = {k: delay(m, v, at_decide - self.PRE, f"pre_{k}") for k, v in pre.items()}

        # --- the checksum and iCRC verdicts join the pre-decision
        csum_ok = delay(m, self.ipv4.payload.ok, at_decide - self._ipv4_offset, "csum_ok",
                        data_only=True)
        icrc_ok = delay(m, self.icrc.valid & self.icrc.payload.good,
                        at_decide - self._icrc_offset, "icrc_ok")
        csum_bad = Signal()
        m.d.comb += csum_bad.eq(pre["ipchk"] & ~csum_ok)
        v = self.o.payload
        m.d.comb += [
            self.o.valid.eq(delay(m, self.i.valid, at_decide, "ev_decide")),
            v.roce.eq(pre["roce"] & ~csum_bad & icrc_ok),
            v.icrc.eq(pre["roce"] & ~csum_bad & ~icrc_ok),
            v.cm.eq(pre["cm"] & ~csum_bad),
            v.arp.eq(pre["arp"]),
            v.other.eq(pre["other"] & ~csum_bad),
            v.ip_checksum.eq(csum_bad),
        ]
        for name in ("mac_bad", "runt", "ip_header", "ip_fragment"):      # before the checksum
            m.d.comb += v[name].eq(pre[name])
        for name in ("ip_length", "udp_length", "roce_length", "cm_length"):  # after it
            m.d.comb += v[name].eq(pre[name] & ~csum_bad)
        return m


class RxRules(wiring.Component):
    """The rules of :func:`roce_hw.model.rx.classify` in hardware: one verdict per frame, with
    its item.

    A fixed-latency pipeline, one stage per cycle and one frame per stage::

        i --record--+-> RxFieldCompare --facts (+1)--> RxDecision --verdict (+6)--> o
                    +-> IPv4HeaderCheck --ok (+6)-------^    ^--icrc
                    +-> items (delayed) --------------------------------------> o

    :class:`RxFieldCompare` compares the record's fields, :class:`RxDecision` applies the rules
    and joins the IPv4 header checksum (:class:`~roce_hw.lib.ipv4_check.IPv4HeaderCheck`) and
    the iCRC verdict; the items are built from the record's headers and carried alongside.

    Latency: a record on ``i`` in cycle t gives its verdict on ``o`` in cycle t +
    :attr:`latency` (6: the checksum's latency, or ``icrc_offset`` if that is later); the
    verdict is combinational from registers. Throughput: one frame per cycle. Backpressure:
    none.

    Parameters
    ----------
    icrc_offset : int
        Cycles from a frame's record on ``i`` to its iCRC verdict on ``icrc`` (at least 1).

    Members
    -------
    i : ``In(stream.Signature(rx_frame_layout(), always_ready=True))``
        One record per frame (:class:`~roce_hw.rx.parse.RxParser`).
    icrc : ``In(stream.Signature(ICRCResultLayout, always_ready=True))``
        The iCRC verdict of each frame, ``icrc_offset`` cycles after its record.
    local_mac : ``In(48)``, local_ip : ``In(32)``
        The engine's addresses; static (registered here).
    o : ``Out(stream.Signature(verdict_layout(), always_ready=True))``
        One verdict per frame; its ``verdict`` bits are 0 while ``valid`` is 0.
    """

    def __init__(self, *, icrc_offset):
        if isinstance(icrc_offset, bool) or not isinstance(icrc_offset, int) or icrc_offset < 1:
            raise ValueError(f"icrc_offset must be a positive integer, not {icrc_offset!r}")
        self._decision = RxDecision(ipv4_offset=IPv4HeaderCheck.latency - 1,
                                    icrc_offset=icrc_offset - 1)
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
        return 1 + self._decision.latency

    def elaborate(self, platform):
        m = Module()
        m.submodules.compare = compare = RxFieldCompare()
        m.submodules.csum = csum = IPv4HeaderCheck()
        m.submodules.decision = decision = self._decision
        wiring.connect(m, wiring.flipped(self.i), compare.i)
        m.d.comb += [compare.local_mac.eq(self.local_mac), compare.local_ip.eq(self.local_ip),
                     csum.i.valid.eq(self.i.valid), csum.i.payload.eq(self.i.payload.ip.ipv4)]
        wiring.connect(m, compare.o, decision.i)
        wiring.connect(m, csum.o, decision.ipv4)
        wiring.connect(m, wiring.flipped(self.icrc), decision.icrc)

        # the items, from the record's headers, carried to the verdict
        rec = self.i.payload
        ip, udp = rec.ip.ipv4, rec.ip.udp
        item = Signal(data.StructLayout({"arp": arp_req_layout(), "cm": cm_rx_layout(),
                                         "roce": roce_rx_layout()}))
        m.d.comb += [
            item.arp.sha.eq(rec.arp.sha), item.arp.spa.eq(rec.arp.spa),
            item.cm.src_mac.eq(rec.ip.eth.src), item.cm.src_ip.eq(ip.src),
            item.cm.src_port.eq(udp.src_port), item.cm.udp_checksum.eq(udp.checksum),
            item.cm.dgram.eq(rec.ip.cm_datagram),
            item.roce.src_ip.eq(ip.src), item.roce.src_port.eq(udp.src_port),
            item.roce.udp_length.eq(udp.length), item.roce.bth.eq(rec.ip.bth),
            item.roce.aeth.eq(rec.ip.aeth),
            item.roce.bth_aeth_only.eq(udp.length == _ACK_UDP),
        ]
        item = delay(m, item, self.latency, "item", data_only=True)
        m.d.comb += [
            self.o.valid.eq(decision.o.valid),
            self.o.payload.verdict.eq(decision.o.payload),
            self.o.payload.arp.eq(item.arp),
            self.o.payload.cm.eq(item.cm),
            self.o.payload.roce.eq(item.roce),
        ]
        return m
