# SPDX-License-Identifier: BSD-2-Clause
"""RX front end: Ethernet frames from the MAC, checked whole, then sorted into ARP requests, CM
datagrams, RoCEv2 packets and the frames that are not for the engine."""

from amaranth import *
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import layouts, proto
from ..config import check_config
from ..lib.arith import event_counter, or_tree
from ..lib.deferred_fifo import DeferredFrameFifo
from ..lib.header import HeaderExtractor
from ..lib.icrc import ICRCChecker
from ..lib.ipv4_check import IPv4HeaderCheck
from ..lib.stream import FrameSignature

__all__ = ["ARP_VARIANTS", "IP_VARIANTS", "arp_req_layout", "cm_rx_layout", "roce_rx_layout",
           "rx_counters_layout", "RxFrontEnd"]

#: Header stack of the ARP extractor.
ARP_VARIANTS = ((proto.ETH, proto.ARP),)
#: Header stacks of the IPv4 extractor: a CM datagram (UDP port 0x4321), else a RoCEv2 BTH and
#: the 4 bytes after it as an AETH.
IP_VARIANTS = ((proto.ETH, proto.IPV4, proto.UDP, proto.CM_DATAGRAM),
               (proto.ETH, proto.IPV4, proto.UDP, proto.BTH, proto.AETH))

_ETH_HLEN = proto.ETH.size
_IP_END = _ETH_HLEN + proto.IPV4.size              # 34: frame holds the IPv4 header
_ARP_END = _ETH_HLEN + proto.ARP.size              # 42: frame holds the ARP packet
_MIN_FRAME = 60                                     # Ethernet minimum without FCS
_ROCE_MIN_UDP = proto.UDP.size + proto.BTH.size + proto.ICRC_BYTES
_ACK_UDP = _ROCE_MIN_UDP + proto.AETH.size
_CM_UDP = proto.UDP.size + proto.CM_DATAGRAM_BYTES
#: Frame lengths are counted exactly up to this many bytes (longer ones fail every length check).
_LEN_BITS = 17


def arp_req_layout():
    """Payload of the ``arp`` stream: the sender of an ARP request for our IP,
    ``{sha 48, spa 32}`` (hardware and protocol address, as integers)."""
    return data.StructLayout({"sha": 48, "spa": 32})


def cm_rx_layout():
    """Payload of the ``cm`` stream: ``{src_mac 48, src_ip 32, src_port 16, udp_checksum 16,
    dgram}`` with ``dgram`` a :data:`roce_hw.layouts.CM_DATAGRAM` and ``udp_checksum`` the UDP
    header's checksum field as received (the connection manager verifies it)."""
    return data.StructLayout({"src_mac": 48, "src_ip": 32, "src_port": 16, "udp_checksum": 16,
                              "dgram": layouts.CM_DATAGRAM})


def roce_rx_layout():
    """Payload of the ``roce`` stream, one per good RoCEv2 packet:
    ``{src_ip 32, src_port 16, udp_length 16, bth_aeth_only 1, bth, aeth}``.

    ``bth`` is a :data:`roce_hw.layouts.BTH`; ``aeth`` the 4 bytes after the BTH as a
    :data:`roce_hw.layouts.AETH` (meaningful for the opcodes that carry an AETH);
    ``bth_aeth_only`` is 1 when the packet is exactly BTH + AETH + iCRC (UDP length 28), the
    shape of an ACK/NAK; ``udp_length`` gives the rest (payload + pad = ``udp_length`` - 8 - 12
    - extension headers - 4)."""
    return data.StructLayout({"src_ip": 32, "src_port": 16, "udp_length": 16,
                              "bth_aeth_only": 1, "bth": layouts.BTH, "aeth": layouts.AETH})


def rx_counters_layout():
    """``StructLayout`` of the front end's 32-bit wrapping counters, one member per name of
    :data:`roce_hw.proto.RX_COUNTERS`."""
    return data.StructLayout({name: 32 for name in proto.RX_COUNTERS})


def _delay(m, value, cycles, name, *, data_only=False):
    """``value`` after ``cycles`` register stages (no enable: the pipeline never stalls).
    ``data_only``: no reset (data whose use is gated by a reset flag), so that synthesis may
    map the chain to shift-register LUTs."""
    shape = value.shape() if isinstance(value, data.View) else Value.cast(value).shape()
    for k in range(cycles):
        reg = Signal(shape, name=f"{name}_d{k + 1}", reset_less=data_only)
        m.d.sync += reg.eq(value)
        value = reg
    return value


def _reg(m, value, name):
    """``value`` registered once, without reset: a field compare of the decision pipeline,
    whose use is gated by the frame-end flag (which has a reset)."""
    reg = Signal(Value.cast(value).shape(), name=name, reset_less=True)
    m.d.sync += reg.eq(value)
    return reg


class RxFrontEnd(wiring.Component):
    """Receive front end: checks every frame from the MAC whole, then hands ARP requests, CM
    datagrams and RoCEv2 packets to the engine and the rest to the user.

    Decisions (the golden model is :func:`roce_hw.model.rx.classify`, whose docstring lists the
    rules in order; the first that applies decides). In short: a frame flagged bad by the MAC
    (``abort`` on its last beat) is dropped; ARP requests for ``local_ip`` (to our MAC or
    broadcast, well formed) go to ``arp`` and every other ARP frame is "other"; frames to another
    MAC or of another EtherType (IPv6, VLAN-tagged, ...) are "other". A frame to our MAC with
    EtherType IPv4 is **the engine's to judge**: a malformed one -- truncated IPv4 header, IP
    options or a version other than 4, a fragment, a bad header checksum, a total length that
    disagrees with the frame (Ethernet padding of a 60-byte frame allowed) -- is dropped and
    counted by reason, never passed on, since its addresses cannot be trusted. A well-formed one
    to another IP address or of another protocol is "other"; UDP to our IP must have a UDP length
    of total length - 20 (else dropped); then port 4791 is RoCEv2 (BTH and iCRC room needed, iCRC
    checked, bad ones dropped) for ``roce``, port 0x4321 a CM datagram (UDP length exactly 8 +
    64, else dropped) for ``cm``, any other port "other". Consequence for a user stack sharing
    the engine's MAC: it sees no IPv4 fragments, no IP options and no malformed IPv4 (they are
    counted).

    "Other" frames leave on ``other`` byte for byte as received (same beats, ``data`` lanes
    beyond ``keep`` included, ``keep``, ``first``, ``last``; ``abort`` as received, hence 0: a
    frame the MAC flagged bad is dropped), in order, from a store-and-forward
    FIFO (:class:`~roce_hw.lib.deferred_fifo.DeferredFrameFifo`, ``other_bytes`` of storage) so
    the user may stall ``other``; a frame that does not fit is dropped whole and counted
    (``other_dropped``). A frame starts on ``other`` only after it was checked whole. With
    ``rx_other=False`` there is no ``other`` stream and those frames are dropped and counted.

    ``arp``, ``cm`` and ``roce`` are streams with backpressure, each behind a queue of
    ``queue_depth`` entries; an item whose queue is full is dropped and counted (``arp_full``,
    ``cm_full``, ``roce_full``). Nothing is emitted for a frame before its last beat has been
    checked: the MAC's bad flag, the lengths, the IPv4 checksum and the iCRC all come from the
    whole frame.

    Counters: every frame is counted in ``rx_frames`` and in exactly one of the others (see
    :data:`roce_hw.proto.RX_COUNTERS`), 32 bits each, wrapping; with the last beat of a frame
    on ``i`` in cycle t, the counters show it from cycle t + :attr:`latency`.

    Structure: the input beat is registered, then fed in parallel to two
    :class:`~roce_hw.lib.header.HeaderExtractor`\\ s (Ethernet + ARP; Ethernet + IPv4 + UDP + CM
    datagram or BTH + AETH, classified by UDP port), the :class:`~roce_hw.lib.icrc.ICRCChecker`,
    a frame-length counter and the ``other`` FIFO. Each extractor's header of a frame is latched
    when it appears (at most 3 cycles after the last beat, never before the previous frame's
    end); from then on a fixed-latency pipeline, one stage per cycle and one frame per stage,
    compares fields, checks the IPv4 checksum (:class:`~roce_hw.lib.ipv4_check.IPv4HeaderCheck`),
    joins the iCRC result and decides. No header byte is sliced by hand: every field comes from
    an extractor's ``proto``-built layout.

    Latency: with the last beat of a frame on ``i`` in cycle t, its item is valid on
    ``arp``/``cm``/``roce`` in cycle t + :attr:`latency` (13) if the queue was empty, and an
    "other" frame starts on ``other`` in cycle t + :attr:`latency` if the FIFO was empty
    (input register 1, extractor and latch 4, field compares and decision 6, queue 2).

    Throughput: one beat per cycle on ``i``, back to back frames of any length, including
    frames of one beat; the outputs take one item per cycle.

    Backpressure: none on ``i``: ``i.ready`` is constant 1 (a MAC cannot wait); what cannot be
    stored is dropped and counted, as above.

    Parameters
    ----------
    config : EngineConfig
        ``data_width`` (64 to 1024).
    rx_other : bool
        Build the ``other`` stream and its FIFO.
    queue_depth : int
        Entries of the ``arp``, ``cm`` and ``roce`` queues (1 to 64).
    other_bytes : int
        Storage of the ``other`` FIFO in bytes (at least two beats; rounded up to a power of
        two of beats): the longest frame that can pass on ``other``.

    Members
    -------
    i : ``In(FrameSignature(data_width))``
        Frames from the MAC without FCS; ``abort`` on the last beat = bad frame. ``ready`` is 1.
    local_mac : ``In(48)``, local_ip : ``In(32)``
        The engine's addresses (``0x020000000001`` is 02:00:00:00:00:01); static (registered).
    arp : ``Out(stream.Signature(arp_req_layout()))``
    cm : ``Out(stream.Signature(cm_rx_layout()))``
    roce : ``Out(stream.Signature(roce_rx_layout()))``
    other : ``Out(FrameSignature(data_width))``
        Only with ``rx_other``.
    counters : ``Out(rx_counters_layout())``
    """

    #: Cycles from the last beat of a frame on ``i`` to its item on ``arp``/``cm``/``roce``
    #: (or its first beat on ``other``), empty queues.
    latency = 13

    def __init__(self, config, *, rx_other=True, queue_depth=4, other_bytes=8192):
        self._config = check_config(config)
        if not isinstance(rx_other, bool):
            raise TypeError(f"rx_other must be a bool, not {rx_other!r}")
        if isinstance(queue_depth, bool) or not isinstance(queue_depth, int) or \
                not 1 <= queue_depth <= 64:
            raise ValueError(f"queue_depth must be an integer from 1 to 64, not {queue_depth!r}")
        nbytes = config.data_bytes
        if isinstance(other_bytes, bool) or not isinstance(other_bytes, int) or \
                other_bytes < 2 * nbytes:
            raise ValueError(f"other_bytes must be an integer of at least two beats "
                             f"({2 * nbytes} bytes), not {other_bytes!r}")
        self._rx_other = rx_other
        self._queue_depth = queue_depth
        rows = -(-other_bytes // nbytes)
        self._other_rows = 1 << (rows - 1).bit_length()
        width = config.data_width
        members = {
            "i": In(FrameSignature(width)),
            "local_mac": In(48),
            "local_ip": In(32),
            "arp": Out(stream.Signature(arp_req_layout())),
            "cm": Out(stream.Signature(cm_rx_layout())),
            "roce": Out(stream.Signature(roce_rx_layout())),
            "counters": Out(rx_counters_layout()),
        }
        if rx_other:
            members["other"] = Out(FrameSignature(width))
        super().__init__(members)

    @property
    def config(self):
        return self._config

    @property
    def rx_other(self):
        return self._rx_other

    @property
    def queue_depth(self):
        return self._queue_depth

    @property
    def other_bytes(self):
        """Storage of the ``other`` FIFO in bytes (after rounding up to a power of two of
        beats): the longest frame that can pass."""
        return self._other_rows * self._config.data_bytes

    def elaborate(self, platform):
        m = Module()
        width = self._config.data_width
        n = width // 8
        lg = n.bit_length() - 1

        # --- input register; local addresses (static) registered once
        beat = Signal(self.i.payload.shape(), reset_less=True)
        bv = Signal()
        m.d.comb += self.i.ready.eq(1)
        m.d.sync += [bv.eq(self.i.valid), beat.eq(self.i.payload)]
        lmac = _reg(m, self.local_mac, "lmac")
        lip = _reg(m, self.local_ip, "lip")

        # --- parallel consumers of the beat: they never stall (outputs always taken)
        m.submodules.x_arp = x_arp = HeaderExtractor(width, ARP_VARIANTS)
        m.submodules.x_ip = x_ip = HeaderExtractor(
            width, IP_VARIANTS,
            classify=lambda m, f: f.udp.dst_port != proto.CM_UDP_PORT)
        m.submodules.icrc = icrc = ICRCChecker(width)
        m.submodules.csum = csum = IPv4HeaderCheck()

        # Cycle numbers below count from the cycle the registered last beat of a frame is on
        # the extractors' inputs (cycle 0, one after it was on `i`).
        at_fields = HeaderExtractor.latency + 1          # 4: latched headers are this frame's
        at_pre = at_fields + 3                            # 7: pre-decision registered
        at_csum = at_fields + csum.latency                # 10: IPv4 checksum verdict
        icrc_at = icrc.latency + 1                        # 10: iCRC verdict on icrc.o
        at_decide = max(at_csum, icrc_at, at_pre)         # 10
        for sink in (x_arp.i, x_ip.i, icrc.i):
            m.d.comb += [sink.valid.eq(bv), sink.payload.data.eq(beat.data),
                         sink.payload.keep.eq(beat.keep), sink.payload.first.eq(beat.first),
                         sink.payload.last.eq(beat.last)]
        m.d.comb += [x_arp.o.ready.eq(1), x_arp.hdr.ready.eq(1), x_ip.o.ready.eq(1),
                     x_ip.hdr.ready.eq(1), icrc.o.ready.eq(1)]

        # A frame's header leaves an extractor at most 3 cycles after its last beat went in
        # (HeaderExtractor.latency, outputs never stalled) and the next frame's no earlier than
        # 3 cycles after that frame's first beat: in cycle 4 the latches hold this frame's.
        arp_h = Signal(layouts.ARP)
        ip_h = Signal(x_ip.hdr.payload.fields.shape())
        with m.If(x_arp.hdr.valid):
            m.d.sync += arp_h.eq(x_arp.hdr.payload.fields.arp)
        with m.If(x_ip.hdr.valid):
            m.d.sync += ip_h.eq(x_ip.hdr.payload.fields)

        # --- frame length - 1 = Cat(index of the last valid lane, beat index): no adder
        bw = _LEN_BITS - lg
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
        lm1_0 = Signal(_LEN_BITS + 1)           # frame length - 1 (bit 17: too long)
        m.d.comb += lm1_0.eq(Cat(lane[:lg], bidx))
        ev0 = Signal()
        m.d.comb += ev0.eq(bv & beat.last)

        # --- "other" FIFO (written at cycle 0, decided at at_decide)
        if self._rx_other:
            m.submodules.ofifo = ofifo = DeferredFrameFifo(width, self._other_rows)
            m.d.comb += [ofifo.i.valid.eq(bv), ofifo.i.payload.eq(beat)]
            wiring.connect(m, ofifo.o, wiring.flipped(self.other))
            stored_ok = _delay(m, ofifo.stored.payload.ok, at_decide - 1, "ostored")

        # --- cycle 1 -> 2: length flags
        lm1 = _delay(m, lm1_0, 1, "lm1", data_only=True)
        lf = {
            "runt14": _reg(m, lm1 < _ETH_HLEN - 1, "runt14_2"),
            "runt34": _reg(m, lm1 < _IP_END - 1, "runt34_2"),
            "lt42": _reg(m, lm1 < _ARP_END - 1, "lt42_2"),
            "eq60": _reg(m, lm1 == _MIN_FRAME - 1, "eq60_2"),
            "lm14": _reg(m, (lm1 - (_ETH_HLEN - 1))[:_LEN_BITS + 1], "lm14_2"),  # length - 14
        }
        lf = {k: _delay(m, v, at_fields - 2, k, data_only=True) for k, v in lf.items()}
        bad = _delay(m, beat.abort, at_fields, "bad", data_only=True)
        ev = _delay(m, ev0, at_fields, "ev")

        # --- cycle 4 -> 5: field compares
        eth, ip, udp = ip_h.eth, ip_h.ipv4, ip_h.udp
        arp = arp_h
        tl = ip.total_length
        ulen = udp.length
        c5 = {
            "ev": _delay(m, ev, 1, "ev_5"),
            "bad": _reg(m, bad, "bad_5"),
            "runt14": _reg(m, lf["runt14"], "runt14_5"),
            "runt34": _reg(m, lf["runt34"], "runt34_5"),
            "lt42": _reg(m, lf["lt42"], "lt42_5"),
            "mac_ours": _reg(m, eth.dst == lmac, "mac_ours_5"),
            "mac_bc": _reg(m, eth.dst == proto.BROADCAST_MAC, "mac_bc_5"),
            "et_arp": _reg(m, eth.ethertype == proto.ETHERTYPE_ARP, "et_arp_5"),
            "et_ip": _reg(m, eth.ethertype == proto.ETHERTYPE_IPV4, "et_ip_5"),
            "arp_fmt": _reg(m, (arp.htype == 1) & (arp.ptype == proto.ETHERTYPE_IPV4) &
                            (arp.hlen == 6) & (arp.plen == 4), "arp_fmt_5"),
            "arp_req": _reg(m, arp.oper == proto.ArpOper.REQUEST, "arp_req_5"),
            "arp_tpa": _reg(m, arp.tpa == lip, "arp_tpa_5"),
            "ip_hdr": _reg(m, (ip.version == 4) & (ip.ihl == proto.IPV4.size // 4), "ip_hdr_5"),
            "ip_frag": _reg(m, ip.flag_mf | (ip.frag_offset != 0), "ip_frag_5"),
            "tl_exact": _reg(m, lf["lm14"] == tl, "tl_exact_5"),
            "tl_pad": _reg(m, lf["eq60"] & (tl < _MIN_FRAME - _ETH_HLEN), "tl_pad_5"),
            "tl_min": _reg(m, tl >= proto.IPV4.size, "tl_min_5"),
            "ip_dst": _reg(m, ip.dst == lip, "ip_dst_5"),
            "udp": _reg(m, ip.protocol == proto.IP_PROTO_UDP, "udp_5"),
            "tl_m20": _reg(m, (tl - proto.IPV4.size)[:16], "tl_m20_5"),
            "ulen": _reg(m, ulen, "ulen_5"),
            "ulen_min": _reg(m, ulen >= proto.UDP.size, "ulen_min_5"),
            "p_roce": _reg(m, udp.dst_port == proto.ROCEV2_UDP_PORT, "p_roce_5"),
            "p_cm": _reg(m, udp.dst_port == proto.CM_UDP_PORT, "p_cm_5"),
            "roce_len": _reg(m, ulen >= _ROCE_MIN_UDP, "roce_len_5"),
            "cm_len": _reg(m, ulen == _CM_UDP, "cm_len_5"),
        }
        m.d.comb += [csum.i.valid.eq(ev), csum.i.payload.eq(ip)]

        # --- cycle 5 -> 6: UDP length; the rules as AND terms
        c = c5
        l2_ok = ~c["bad"] & ~c["runt14"]
        arp_take = l2_ok & c["et_arp"] & (c["mac_ours"] | c["mac_bc"]) & ~c["lt42"] & \
            c["arp_fmt"] & c["arp_req"] & c["arp_tpa"]
        ip_path = l2_ok & ~c["et_arp"] & c["mac_ours"] & c["et_ip"]
        c6 = {
            "ev": _delay(m, c["ev"], 1, "ev_6"),
            "bad": _reg(m, c["bad"], "bad_6"),
            "runt14": _reg(m, c["runt14"], "runt14_6"),
            "arp": _reg(m, arp_take, "arp_6"),
            "l2_other": _reg(m, l2_ok & ~arp_take & ~ip_path, "l2_other_6"),
            "ip_runt": _reg(m, ip_path & c["runt34"], "ip_runt_6"),
            "ip_hdr_bad": _reg(m, ip_path & ~c["runt34"] & ~c["ip_hdr"], "ip_hdr_bad_6"),
            "ip_frag": _reg(m, ip_path & ~c["runt34"] & c["ip_hdr"] & c["ip_frag"], "ip_frag_6"),
            "ip_valid": _reg(m, ip_path & ~c["runt34"] & c["ip_hdr"] & ~c["ip_frag"],
                             "ip_valid_6"),
            "ip_len": _reg(m, c["tl_min"] & (c["tl_exact"] | c["tl_pad"]), "ip_len_6"),
            "for_us": _reg(m, c["ip_dst"] & c["udp"], "for_us_6"),
            "udp_len": _reg(m, (c["ulen"] == c["tl_m20"]) & c["ulen_min"], "udp_len_6"),
        }
        for key in ("p_roce", "p_cm", "roce_len", "cm_len"):
            c6[key] = _reg(m, c[key], f"{key}_6")

        # --- cycle 6 -> 7: the pre-decision, assuming a good checksum and iCRC
        c = c6
        ip_ok = c["ip_valid"] & c["ip_len"]
        udp_ours = ip_ok & c["for_us"]
        udp_ok = udp_ours & c["udp_len"]
        pre_terms = {
            "mac_bad": c["bad"],
            "runt": ~c["bad"] & (c["runt14"] | c["ip_runt"]),
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
            "ipchk": c["ip_valid"],         # the outcome needs a good IPv4 checksum
        }
        pre = {k: _delay(m, c["ev"] & v, 1, f"pre_{k}_7") for k, v in pre_terms.items()}
        pre = {k: _delay(m, v, at_decide - at_pre, f"pre_{k}") for k, v in pre.items()}

        # --- the stream items, from the latched headers (cycle 4) to the decision
        arp_item = Signal(arp_req_layout())
        cm_item = Signal(cm_rx_layout())
        roce_item = Signal(roce_rx_layout())
        m.d.comb += [
            arp_item.sha.eq(arp.sha), arp_item.spa.eq(arp.spa),
            cm_item.src_mac.eq(eth.src), cm_item.src_ip.eq(ip.src),
            cm_item.src_port.eq(udp.src_port), cm_item.udp_checksum.eq(udp.checksum),
            cm_item.dgram.eq(ip_h.cm_datagram),
            roce_item.src_ip.eq(ip.src), roce_item.src_port.eq(udp.src_port),
            roce_item.udp_length.eq(ulen), roce_item.bth.eq(ip_h.bth),
            roce_item.aeth.eq(ip_h.aeth), roce_item.bth_aeth_only.eq(ulen == _ACK_UDP),
        ]
        arp_item = _delay(m, arp_item, at_decide - at_fields, "arp_item", data_only=True)
        cm_item = _delay(m, cm_item, at_decide - at_fields, "cm_item", data_only=True)
        roce_item = _delay(m, roce_item, at_decide - at_fields, "roce_item", data_only=True)

        # --- cycle 10: checksum and iCRC verdicts, queues, final outcome
        csum_ok = _delay(m, csum.o.payload.ok, at_decide - at_csum, "csum_ok", data_only=True)
        icrc_ok = _delay(m, icrc.o.valid & icrc.o.payload.good, at_decide - icrc_at, "icrc_ok")
        csum_bad = Signal()
        m.d.comb += csum_bad.eq(pre["ipchk"] & ~csum_ok)
        out = {name: Signal(name=f"out_{name}") for name in proto.RX_COUNTERS[1:]}
        for kind, item in (("arp", arp_item), ("cm", cm_item), ("roce", roce_item)):
            q = fifo.SyncFIFOBuffered(width=Value.cast(item).shape().width,
                                      depth=self._queue_depth)
            m.submodules[f"{kind}_q"] = q
            go = Signal(name=f"{kind}_go")
            if kind == "roce":
                m.d.comb += [go.eq(pre["roce"] & ~csum_bad & icrc_ok),
                             out["icrc"].eq(pre["roce"] & ~csum_bad & ~icrc_ok)]
            elif kind == "cm":
                m.d.comb += go.eq(pre["cm"] & ~csum_bad)
            else:
                m.d.comb += go.eq(pre["arp"])
            m.d.comb += [q.w_en.eq(go & q.w_rdy), q.w_data.eq(item),
                         out[kind].eq(go & q.w_rdy), out[f"{kind}_full"].eq(go & ~q.w_rdy)]
            port = getattr(self, kind)
            m.d.comb += [port.valid.eq(q.r_rdy), port.payload.eq(q.r_data), q.r_en.eq(port.ready)]

        other_go = Signal()
        m.d.comb += other_go.eq(pre["other"] & ~csum_bad)
        if self._rx_other:
            decide = Signal()
            m.d.comb += [
                decide.eq(_delay(m, ev0, at_decide, "ev_dec") & stored_ok),
                ofifo.decide.valid.eq(decide),
                ofifo.decide.payload.keep.eq(other_go),
                out["other"].eq(other_go & stored_ok),
                out["other_dropped"].eq(other_go & ~stored_ok),
            ]
        else:
            m.d.comb += out["other_dropped"].eq(other_go)
        m.d.comb += out["ip_checksum"].eq(csum_bad)
        for name in ("mac_bad", "runt", "ip_header", "ip_fragment"):      # before the checksum
            m.d.comb += out[name].eq(pre[name])
        for name in ("ip_length", "udp_length", "roce_length", "cm_length"):  # after it
            m.d.comb += out[name].eq(pre[name] & ~csum_bad)

        # --- counters, from the registered outcome
        ev_final = _delay(m, ev0, at_decide + 1, "ev_cnt")
        m.d.comb += self.counters.rx_frames.eq(event_counter(m, 32, ev_final, "cnt_rx_frames"))
        for name, sig in out.items():
            m.d.comb += self.counters[name].eq(
                event_counter(m, 32, _delay(m, sig, 1, f"outcome_{name}"), f"cnt_{name}"))
        return m
