# SPDX-License-Identifier: BSD-2-Clause
"""RoCEv2 invariant CRC (iCRC) on streams of whole Ethernet frames: :class:`ICRCInserter` (TX)
and :class:`ICRCChecker` (RX).

The iCRC (PROTOCOL.md §2) is ``zlib.crc32`` over 8 bytes of 0xFF, then the IP header (IPv4 TOS,
TTL, checksum / IPv6 traffic class, flow label, hop limit set to 1s), the UDP header (checksum
set to 1s), the BTH (byte 4 set to 1s) and everything up to the end bounded by the UDP length,
minus the 4 iCRC bytes. Frames are IPv4 (no options) or IPv6, with or without one 802.1Q tag.

How the hardware gets cheap (all constants derived at elaboration time from :mod:`roce_hw.proto`
and :mod:`roce_hw.crc`, no hand-typed offsets or matrices):

* The bytes that are not covered (Ethernet header, VLAN tag) and the masked fields are **zeroed**
  in the input register (synchronous reset of those flip-flops, no LUT). The 1s of the masked
  fields re-enter as a 32-bit constant per (frame variant, beat), ``B * mask``, added to the
  beat's data term; the 8-byte 0xFF prefix and the zeroed Ethernet header fold into a constant
  *rewound* start state (``A^-8e * state_after_prefix``) whose first-beat image ``A * S0`` is part
  of that same constant, so the feedback loop is just ``state' = A * state ^ data_term``.
* Every RoCEv2 IB packet is a multiple of 4 bytes and the covered region starts at byte 14 or 18,
  so a frame without iCRC ends 2 bytes past a 4-byte boundary: the inserter folds the constant
  part of the final rewind (``A^-16``) into its matrices and rewinds only by ``4 * q`` bytes
  (``log2(bytes per beat) - 2`` conditional stages).
* The checker never rewinds: it compares the state after the zero-padded last covered beat with
  the CRC residue pre-multiplied for each pad count (a small ROM).
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from . import proto
from .config import check_data_width
from .crc import (CRC_INIT, advance, advance_rows, apply_rows, data_term_partials,
                  residue_register, revert_stages, step_matrices, thermometer_count, xor_rows)
from .stream import PacketSignature

__all__ = ["VARIANTS", "covered_start", "masked_bytes", "ICRCInserter", "ICRCChecker",
           "ICRCResultLayout"]

#: Frame variants handled: ``(vlan, ip_version)``.
VARIANTS = ((0, 4), (0, 6), (1, 4), (1, 6))

_ETHERTYPE_OFF = proto.ETH.offset("ethertype")[0]                 # 12
_INNER_ETHERTYPE_OFF = _ETHERTYPE_OFF + proto.VLAN_TAG.size       # 16

#: Fields set to 1s for the iCRC (PROTOCOL.md §2), per header.
_MASKED_FIELDS = {
    4: (proto.IPV4, ("dscp", "ecn", "ttl", "checksum")),
    6: (proto.IPV6, ("traffic_class", "flow_label", "hop_limit")),
}
_UDP_MASKED = ("checksum",)
_BTH_MASKED = ("fecn", "becn", "resv6")


def covered_start(vlan):
    """Frame offset of the first iCRC-covered byte (the IP header)."""
    return proto.ETH.size + (proto.VLAN_TAG.size if vlan else 0)


def _ip_header(ipv):
    return proto.IPV4 if ipv == 4 else proto.IPV6


def _field_masks(header, fields, base):
    """``{frame byte offset: bit mask}`` of ``fields`` of ``header`` placed at ``base``."""
    out = {}
    for f in fields:
        byte, bit = header.offset(f)
        for k in range(header.width(f)):
            pos = byte * 8 + bit + k
            off = base + pos // 8
            out[off] = out.get(off, 0) | (0x80 >> (pos % 8))
    return out


def masked_bytes(vlan, ipv):
    """``{frame byte offset: mask}`` of the iCRC-variant bits of a frame variant."""
    e = covered_start(vlan)
    ip = _ip_header(ipv)
    res = {}
    for hdr, fields, base in ((ip, _MASKED_FIELDS[ipv][1], e),
                              (proto.UDP, _UDP_MASKED, e + ip.size),
                              (proto.BTH, _BTH_MASKED, e + ip.size + proto.UDP.size)):
        for off, mk in _field_masks(hdr, fields, base).items():
            res[off] = res.get(off, 0) | mk
    return res


def _udp_length_offset(vlan, ipv):
    return covered_start(vlan) + _ip_header(ipv).size + proto.UDP.offset("length")[0]


def _rows_mul(left, right):
    """Rows of the product ``left * right`` (both rows-matrices)."""
    out = []
    for r in left:
        acc = 0
        for k in range(len(right)):
            if (r >> k) & 1:
                acc ^= right[k]
        out.append(acc)
    return out


#: Prefix standing in for the LRH: the register after 8 bytes of 0xFF.
def _prefix_state():
    s = CRC_INIT
    for _ in range(8):
        s = _crc_byte(s, 0xFF)
    return s


def _crc_byte(s, b):
    from .crc import crc_bits
    return crc_bits(s, b, 8)


class _FrameFront:
    """Input-side frame tracking shared by the inserter and the checker (elaboration helper).

    Tracks the beat index of the frame on the input stream, captures the header bytes that
    later beats need, and decodes the frame variant combinationally (a byte from the current
    beat comes straight from the bus, one from an earlier beat from its capture register).
    """

    def __init__(self, m, i, transfer, n, nbeats, capture):
        self.n = n
        self.nbeats = nbeats
        first = i.payload.first
        cnt = Signal(range(nbeats + 1), name="fr_cnt")
        self.is_beat = [first] + [Signal(name=f"fr_beat{b}") for b in range(1, nbeats)]
        for b in range(1, nbeats):
            m.d.comb += self.is_beat[b].eq(~first & (cnt == b))
        with m.If(transfer):
            with m.If(first):
                m.d.sync += cnt.eq(1)
            with m.Elif(cnt != nbeats):
                m.d.sync += cnt.eq(cnt + 1)
        self._cap = {}
        self._m = m
        self._i = i
        for off in sorted(set(capture)):
            b, lane = divmod(off, n)
            cur = i.payload.data[8 * lane:8 * lane + 8]
            if b >= nbeats:
                raise ValueError(f"header byte {off} beyond tracked beats")
            reg = Signal(8, name=f"fr_cap{off}")
            with m.If(transfer & self.is_beat[b]):
                m.d.sync += reg.eq(cur)
            byte = Signal(8, name=f"fr_byte{off}")
            m.d.comb += byte.eq(Mux(self.is_beat[b], cur, reg))
            self._cap[off] = (byte, reg)

    def byte(self, off):
        """The frame byte at ``off``: from the bus on its own beat, else its capture."""
        return self._cap[off][0]

    def captured(self, off):
        return self._cap[off][1]

    def word(self, off, nbytes, captured=False):
        get = self.captured if captured else self.byte
        return Cat(*[get(off + nbytes - 1 - k) for k in range(nbytes)])   # big-endian


def _decode_variant(m, word16, name):
    """Comb flags ``(vlan, v6, is_ip)`` from the two ethertype words."""
    outer, inner = word16
    vlan = Signal(name=f"{name}_vlan")
    v6 = Signal(name=f"{name}_v6")
    ip = Signal(name=f"{name}_ip")
    o6, i6 = Signal(name=f"{name}_o6"), Signal(name=f"{name}_i6")
    o4, i4 = Signal(name=f"{name}_o4"), Signal(name=f"{name}_i4")
    m.d.comb += [
        vlan.eq(outer == proto.ETHERTYPE_VLAN),
        o6.eq(outer == proto.ETHERTYPE_IPV6), i6.eq(inner == proto.ETHERTYPE_IPV6),
        o4.eq(outer == proto.ETHERTYPE_IPV4), i4.eq(inner == proto.ETHERTYPE_IPV4),
        v6.eq(Mux(vlan, i6, o6)),
        ip.eq(Mux(vlan, i4 | i6, o4 | o6)),
    ]
    return vlan, v6, ip


def _variant_conds(m, vlan, v6, name):
    """One comb Signal per entry of :data:`VARIANTS`."""
    out = {}
    for vl, ipv in VARIANTS:
        s = Signal(name=f"{name}_v{vl}{ipv}")
        m.d.comb += s.eq((vlan if vl else ~vlan) & (v6 if ipv == 6 else ~v6))
        out[(vl, ipv)] = s
    return out


def _zero_plan(n, nbeats):
    """Elaboration-time plan of the bytes to zero: ``{(beat, lane): [(mask, key), ...]}`` where
    ``key`` is ``None`` (always), ``"vlan"`` or a variant tuple."""
    plan = {}
    e0, e1 = covered_start(0), covered_start(1)
    for off in range(e1):
        key = None if off < e0 else "vlan"
        plan.setdefault(divmod(off, n), []).append((0xFF, key))
    for v in VARIANTS:
        for off, mk in masked_bytes(*v).items():
            plan.setdefault(divmod(off, n), []).append((mk, v))
    for (b, _), entries in plan.items():
        assert b < nbeats
        for _, key in entries:        # the deciding ethertype bytes come no later than b
            if key is None:
                continue
            assert (_ETHERTYPE_OFF + 1) // n <= b
            if key is not None and key != "vlan" and key[0]:
                assert (_INNER_ETHERTYPE_OFF + 1) // n <= b
    return plan


def _beat_constants(n, rows_b, nbeats, premul_rows=None):
    """``{(beat, key): K}``: data-term constants added to a beat's data term when ``key``
    (``None`` = always, else a variant) holds on that beat: the masked 1s of the variant, on
    beat 0 the image ``A * S0`` of the rewound start state of an untagged frame, and on the beat
    that holds the ethertype (where the tag becomes known) the correction to the start state of
    a tagged frame. Optionally pre-multiplied by ``premul_rows``."""
    w = 8 * n
    a_rows, _ = step_matrices(w)
    prefix = _prefix_state()
    s_untagged = advance(prefix, -8 * covered_start(0))
    s_tagged = advance(prefix, -8 * covered_start(1))
    tag_beat = (_ETHERTYPE_OFF + 1) // n
    out = {(0, None): apply_rows(a_rows, s_untagged)}
    for v in VARIANTS:
        ones = masked_bytes(*v)
        for b in range(nbeats):
            word = 0
            for off, mk in ones.items():
                if off // n == b:
                    word |= mk << (8 * (off % n))
            k = apply_rows(rows_b, word)
            if v[0] and b == tag_beat:
                k ^= advance(s_tagged ^ s_untagged, w * (b + 1))
            if k:
                out[(b, v)] = k
    if premul_rows is not None:
        out = {key: apply_rows(premul_rows, k) for key, k in out.items()}
    return out


def _zero_stage(m, en, data, is_beat, conds, vlan, n, nbeats, extra_zero, name):
    """Register ``data`` with the uncovered and masked bytes zeroed (a synchronous reset of those
    flip-flops); ``extra_zero(j)`` gives an additional zero condition of lane ``j`` or ``None``.
    Returns the registered data Signal."""
    plan = _zero_plan(n, nbeats)
    d1 = Signal(8 * n, name=f"{name}_d", reset_less=True)
    with m.If(en):
        for j in range(n):
            lane = data[8 * j:8 * j + 8]
            bit_conds = [[] for _ in range(8)]
            for b in range(nbeats):
                for mk, key in plan.get((b, j), []):
                    if key is None:
                        c = is_beat[b]
                    elif key == "vlan":
                        c = is_beat[b] & vlan
                    else:
                        c = is_beat[b] & conds[key]
                    for k in range(8):
                        if (mk >> k) & 1:
                            bit_conds[k].append(c)
            groups = {}
            for k in range(8):
                groups.setdefault(tuple(id(c) for c in bit_conds[k]), (bit_conds[k], []))[1] \
                    .append(k)
            extra = extra_zero(j)
            for cl, bits in groups.values():
                terms = list(cl) + ([extra] if extra is not None else [])
                if not terms:
                    m.d.sync += [d1[8 * j + k].eq(lane[k]) for k in bits]
                    continue
                z = Signal(name=f"{name}_z{j}_{bits[0]}")
                m.d.comb += z.eq(Cat(*terms).any())
                for k in bits:
                    m.d.sync += d1[8 * j + k].eq(Mux(z, 0, lane[k]))
    return d1


def _select_constant(m, consts, front_is_beat, conds, name):
    """Comb 32-bit XOR of the constants whose (beat, variant) condition holds."""
    k = Signal(32, name=name)
    terms = []
    for (b, v), val in consts.items():
        cond = front_is_beat[b] if v is None else front_is_beat[b] & conds[v]
        terms.append(Mux(cond, C(val, 32), 0))
    acc = C(0, 32)
    for t in terms:
        acc = acc ^ t
    m.d.comb += k.eq(acc)
    return k


def _header_beats(n):
    """Beats that hold zeroed/masked bytes or bytes the decoders need."""
    last = max([covered_start(1)] + [max(masked_bytes(*v)) for v in VARIANTS]
               + [_udp_length_offset(*v) + 1 for v in VARIANTS])
    return last // n + 1


class ICRCInserter(wiring.Component):
    """Append the RoCEv2 iCRC to Ethernet frames.

    ``i`` carries complete frames without the iCRC (the IPv4 total length / IPv6 payload length
    and the UDP length already count the 4 iCRC bytes); ``o`` carries the same frames with the 4
    iCRC bytes after the last byte, in one extra beat when the last input beat has fewer than 4
    free lanes. Frames must be RoCEv2 frames (IPv4 without options or IPv6, at most one 802.1Q
    tag) whose IB packet is a multiple of 4 bytes, as every RoCEv2 packet is; the iCRC covers
    every input byte after the Ethernet header. Other frames get a wrong iCRC (never a hang).

    Latency: :attr:`latency` cycles from an input beat's transfer to the same beat on ``o``
    (5 at 64/128, 6 at 256/512, 7 at 1024 bits), constant. Throughput: one beat per cycle,
    back-to-back frames; the input is held for one cycle when a frame needs the extra beat.
    Backpressure: full, ``i.ready`` follows ``o.ready``; any input idle pattern.

    Parameters
    ----------
    data_width : int
        64, 128, 256, 512 or 1024.

    Members
    -------
    i : ``In(PacketSignature(data_width))``
        Frames without iCRC; bytes beyond ``keep`` on the last beat are ignored.
    o : ``Out(PacketSignature(data_width))``
        Frames with iCRC; bytes beyond ``keep`` are don't-care.

    Raises
    ------
    ValueError
        For an unsupported ``data_width``.
    """

    def __init__(self, data_width):
        self._width = check_data_width(data_width)
        self._nbytes = data_width // 8
        self._q_bits = (self._nbytes - 1).bit_length() - 2
        self._rev_cycles = self._q_bits
        super().__init__({"i": In(PacketSignature(data_width)),
                          "o": Out(PacketSignature(data_width))})

    @property
    def data_width(self):
        return self._width

    @property
    def latency(self):
        """Cycles from an input beat's transfer to its appearance on ``o`` (no stalls)."""
        return 4 + self._rev_cycles

    def elaborate(self, platform):
        m = Module()
        w, n = self._width, self._nbytes
        nbeats = _header_beats(n)
        a_rows, b_rows = step_matrices(w)
        fold = advance_rows(-16)
        b_fold = _rows_mul(fold, b_rows)

        o = self.o
        pending = Signal()
        en = Signal()
        m.d.comb += [en.eq(~o.valid | (o.ready & ~pending)), self.i.ready.eq(en)]
        transfer = Signal()
        m.d.comb += transfer.eq(self.i.valid & en)

        front = _FrameFront(m, self.i, transfer, n, nbeats,
                            [_ETHERTYPE_OFF, _ETHERTYPE_OFF + 1,
                             _INNER_ETHERTYPE_OFF, _INNER_ETHERTYPE_OFF + 1])
        vlan, v6, _ = _decode_variant(m, (front.word(_ETHERTYPE_OFF, 2),
                                          front.word(_INNER_ETHERTYPE_OFF, 2)), "ins")
        conds = _variant_conds(m, vlan, v6, "ins")

        # Stage 1: zeroed beat, per-beat constant, pad count.
        keep = self.i.payload.keep
        d1 = _zero_stage(m, en, self.i.payload.data, front.is_beat, conds, vlan, n, nbeats,
                         lambda j: ~keep[j], "s1")
        kconst = _select_constant(m, _beat_constants(n, b_rows, nbeats, fold),
                                  front.is_beat, conds, "s1_kc")
        zeros = Signal(n)
        m.d.comb += zeros.eq(Cat(*[~self.i.payload.keep[n - 1 - j] for j in range(n)]))
        pad = thermometer_count(m, zeros, "s1_pad")
        k1 = Signal(32, reset_less=True)
        v1 = Signal()
        first1, last1 = Signal(reset_less=True), Signal(reset_less=True)
        q1 = Signal(self._q_bits, reset_less=True)
        with m.If(en):
            m.d.sync += [k1.eq(kconst), v1.eq(self.i.valid), first1.eq(self.i.payload.first),
                         last1.eq(self.i.payload.last), q1.eq(pad[2:2 + self._q_bits])]

        # Stage 2: partial data terms.
        parts = data_term_partials(m, en, d1, b_fold, 64, "s2")
        k2 = Signal(32, reset_less=True)
        v2 = Signal()
        first2, last2 = Signal(reset_less=True), Signal(reset_less=True)
        q2 = Signal(self._q_bits, reset_less=True)
        with m.If(en):
            m.d.sync += [k2.eq(k1), v2.eq(v1), first2.eq(first1), last2.eq(last1), q2.eq(q1)]

        # Stage 3: loop (state pre-multiplied by A^-16).
        state = Signal(32, reset_less=True)
        a_state = xor_rows(m, a_rows, state, "s3_astate")
        dsum = Signal(32)
        m.d.comb += dsum.eq(Cat(*[Cat(*[p[b] for p in parts], k2[b]).xor() for b in range(32)]))
        nxt = Signal(32)
        m.d.comb += nxt.eq(Mux(first2, 0, a_state) ^ dsum)
        with m.If(en & v2):
            m.d.sync += state.eq(nxt)
        q3 = Signal(self._q_bits, reset_less=True)
        with m.If(en):
            m.d.sync += q3.eq(q2)

        # Stages 4..: rewind by 4*q bytes and invert -> iCRC register value.
        crc, _, rcyc = revert_stages(m, en, state, [q3[b] for b in range(self._q_bits)],
                                     [4 << b for b in range(self._q_bits)], 1, "s4",
                                     complement=True)
        depth = 3 + rcyc

        # Raw delay line.
        lay = self.i.payload.shape()
        line = []
        prev_p, prev_v = self.i.payload, self.i.valid
        for k in range(depth):
            p = Signal(lay, name=f"dl{k}_p", reset_less=True)
            v = Signal(name=f"dl{k}_v")
            with m.If(en):
                m.d.sync += [p.eq(prev_p), v.eq(prev_v)]
            prev_p, prev_v = p, v
        src, src_v = prev_p, prev_v

        # Output stage: insert the iCRC bytes after the last valid lane.
        nk = Signal(range(n + 1))
        m.d.comb += nk.eq(thermometer_count(m, src.keep, "o_k"))
        crc_bytes = [crc[8 * r:8 * r + 8] for r in range(4)]
        rot = Signal(32)
        with m.Switch(nk[:2]):
            for s in range(4):
                with m.Case(s):
                    m.d.comb += rot.eq(Cat(*[crc_bytes[(r - s) % 4] for r in range(4)]))
        ins = Signal(w)
        for j in range(n):
            m.d.comb += ins[8 * j:8 * j + 8].eq(
                Mux(src.keep[j], src.data[8 * j:8 * j + 8], rot[8 * (j % 4):8 * (j % 4) + 8]))
        overflow = Signal()
        # keep of the last beat grows by 4 lanes; overflow when more than n-4 lanes were used
        m.d.comb += overflow.eq(src.keep[n - 4])
        rot_hold = Signal(32, reset_less=True)
        keep_ext = Signal(4, reset_less=True)
        with m.If(o.valid & o.ready & pending):
            m.d.sync += [o.payload.data[:32].eq(rot_hold), o.payload.keep.eq(keep_ext),
                         o.payload.first.eq(0), o.payload.last.eq(1), pending.eq(0)]
        with m.Elif(en):
            m.d.sync += [o.valid.eq(src_v), o.payload.data.eq(ins),
                         o.payload.first.eq(src.first),
                         o.payload.last.eq(src.last & ~overflow),
                         pending.eq(src_v & src.last & overflow),
                         rot_hold.eq(rot),
                         keep_ext.eq(src.keep[n - 4:])]
            with m.If(src.last):
                m.d.sync += o.payload.keep.eq(Cat(C(0xF, 4), src.keep[:n - 4]))
            with m.Else():
                m.d.sync += o.payload.keep.eq(src.keep)
        return m


#: Payload of :class:`ICRCChecker` results: ``good`` is 1 when the frame is an IPv4 (no options)
#: or IPv6 UDP frame whose UDP-length-bounded packet fits in the frame and ends with a correct
#: iCRC.
ICRCResultLayout = data.StructLayout({"good": 1})


class ICRCChecker(wiring.Component):
    """Check the RoCEv2 iCRC of received Ethernet frames, one result per frame.

    ``i`` carries whole frames (IPv4 without options or IPv6, with or without one 802.1Q tag),
    each possibly followed by Ethernet padding and/or an FCS beyond the end given by the UDP
    length; those trailing bytes are ignored. The iCRC is checked over exactly the
    UDP-length-bounded packet, without any rewind: the state after the zero-padded last covered
    beat is compared with the CRC residue pre-multiplied for that pad count (a ROM). A frame is
    reported bad when it is not IPv4/IPv6 + UDP, has IPv4 options, has a UDP length below
    ``8 + 12 + 4`` or beyond the end of the frame, or has a wrong iCRC.

    Latency: :attr:`latency` (7) cycles from the transfer of a frame's last beat to its result on
    ``o``, constant at every width. Throughput: one beat per cycle, back-to-back frames (one
    result per cycle at most). Backpressure: the pipeline stalls while ``o`` is valid and not
    ready (``i.ready = ~o.valid | o.ready``). There is no pass-through of the frame data.

    Parameters
    ----------
    data_width : int
        64, 128, 256, 512 or 1024.

    Members
    -------
    i : ``In(PacketSignature(data_width))``
        Frames; bytes beyond ``keep`` on the last beat are ignored.
    o : ``Out(stream.Signature(ICRCResultLayout))``
        One ``{good}`` per frame, in frame order.

    Raises
    ------
    ValueError
        For an unsupported ``data_width``.
    """

    def __init__(self, data_width):
        self._width = check_data_width(data_width)
        self._nbytes = data_width // 8
        super().__init__({"i": In(PacketSignature(data_width)),
                          "o": Out(stream.Signature(ICRCResultLayout))})

    @property
    def data_width(self):
        return self._width

    @property
    def latency(self):
        """Cycles from a frame's last beat transfer to its result on ``o`` (no stalls)."""
        return 7

    def elaborate(self, platform):
        m = Module()
        w, n = self._width, self._nbytes
        lg = n.bit_length() - 1
        nbeats = _header_beats(n)
        a_rows, b_rows = step_matrices(w)
        en = Signal()
        m.d.comb += [en.eq(~self.o.valid | self.o.ready), self.i.ready.eq(en)]
        transfer = Signal()
        m.d.comb += transfer.eq(self.i.valid & en)

        # Header bytes: ethertypes, IP version/IHL, IP protocol, UDP length, for every variant.
        proto_off = {4: proto.IPV4.offset("protocol")[0], 6: proto.IPV6.offset("next_header")[0]}
        caps = [_ETHERTYPE_OFF, _ETHERTYPE_OFF + 1, _INNER_ETHERTYPE_OFF, _INNER_ETHERTYPE_OFF + 1]
        for vl, ipv in VARIANTS:
            e = covered_start(vl)
            u = _udp_length_offset(vl, ipv)
            caps += [e, e + proto_off[ipv], u, u + 1]
        front = _FrameFront(m, self.i, transfer, n, nbeats, caps)
        vlan, v6, is_ip = _decode_variant(m, (front.word(_ETHERTYPE_OFF, 2),
                                              front.word(_INNER_ETHERTYPE_OFF, 2)), "in")
        conds = _variant_conds(m, vlan, v6, "in")
        known_reg = Signal()
        known = Signal()
        m.d.comb += known.eq((known_reg & ~self.i.payload.first) | Cat(*[
            conds[v] & front.is_beat[(_udp_length_offset(*v) + 1) // n] for v in VARIANTS]).any())
        with m.If(transfer):
            m.d.sync += known_reg.eq(known)
        bidx_max = (1 << 16) // n + 64
        bidx = Signal(range(bidx_max + 1))
        bidx_reg = Signal(range(bidx_max + 1))
        m.d.comb += bidx.eq(Mux(self.i.payload.first, 0, bidx_reg))
        with m.If(transfer):
            m.d.sync += bidx_reg.eq(Mux(bidx == bidx_max, bidx_max, bidx + 1))

        def carry(sig_map, name):
            """Register a dict of Signals/Values when ``en``; returns a dict of registers."""
            out = {}
            for key, val in sig_map.items():
                if isinstance(val, list):
                    regs = [Signal(Value.cast(v).shape(), name=f"{name}_{key}{k}",
                                   reset_less=True) for k, v in enumerate(val)]
                    with m.If(en):
                        m.d.sync += [r.eq(v) for r, v in zip(regs, val)]
                    out[key] = regs
                else:
                    val = Value.cast(val) if not isinstance(val, Signal) else val
                    reg = Signal(val.shape(), name=f"{name}_{key}", reset_less=(key != "v"))
                    with m.If(en):
                        m.d.sync += reg.eq(val)
                    out[key] = reg
            return out

        pl = self.i.payload
        sa = carry({"v": self.i.valid, "data": pl.data, "keep": pl.keep, "first": pl.first,
                    "last": pl.last, "isb": list(front.is_beat), "vlan": vlan, "v6": v6,
                    "ip": is_ip, "known": known, "bidx": bidx}, "sa")

        # Stage A (comb): header checks and last covered byte offset from the captures.
        def cap_sel(fn):
            return {v: fn(*v) for v in VARIANTS}
        sa_conds = _variant_conds(m, sa["vlan"], sa["v6"], "sa")
        udp_len = Signal(16)
        hdr_ok = Signal()
        e_last = Signal(17)
        for v in VARIANTS:
            vl, ipv = v
            e = covered_start(vl)
            u = _udp_length_offset(vl, ipv)
            ipb = front.captured(e)
            if ipv == 4:
                ver_ok = ipb == ((4 << 4) | (proto.IPV4.size // 4))
            else:
                ver_ok = ipb[4:] == 6
            ulen = front.word(u, 2, captured=True)
            with m.If(sa_conds[v]):
                m.d.comb += [
                    udp_len.eq(ulen),
                    hdr_ok.eq(ver_ok & (front.captured(e + proto_off[ipv]) == proto.IP_PROTO_UDP)),
                    e_last.eq(ulen + (e + _ip_header(ipv).size - 1)),
                ]
        len_ok = Signal()
        m.d.comb += len_ok.eq(udp_len >= proto.UDP.size + proto.BTH.size + proto.ICRC_BYTES)
        sb = carry({"v": sa["v"], "data": sa["data"], "keep": sa["keep"], "first": sa["first"],
                    "last": sa["last"], "isb": sa["isb"], "vlan": sa["vlan"], "v6": sa["v6"],
                    "known": sa["known"], "bidx": sa["bidx"],
                    "ok": sa["ip"] & hdr_ok & len_ok, "e_last": e_last}, "sb")

        # Stage B (comb): end beat and lane decode.
        eb = sb["e_last"][lg:]
        el = sb["e_last"][:lg]
        gt = [Signal(name=f"sb_gt{j}") for j in range(n)]
        eq = [Signal(name=f"sb_eq{j}") for j in range(n)]
        for j in range(n):
            m.d.comb += [gt[j].eq(el < j), eq[j].eq(el == j)]
        sc = carry({"v": sb["v"], "data": sb["data"], "keep": sb["keep"], "first": sb["first"],
                    "last": sb["last"], "isb": sb["isb"], "vlan": sb["vlan"], "v6": sb["v6"],
                    "known": sb["known"], "ok": sb["ok"], "el": el, "gt": gt, "eq": eq,
                    "at_end": sb["known"] & (sb["bidx"] == eb)}, "sc")

        # Stage C (comb): zero the uncovered bytes, the masked fields and the bytes past the end.
        after_reg = Signal()
        after = Signal()
        at_end = sc["at_end"]
        m.d.comb += after.eq(~sc["first"] & after_reg)
        with m.If(en & sc["v"]):
            m.d.sync += after_reg.eq(after | at_end)
        sc_conds = _variant_conds(m, sc["vlan"], sc["v6"], "sc")
        zero_tail = [Signal(name=f"sc_zt{j}") for j in range(n)]
        for j in range(n):
            m.d.comb += zero_tail[j].eq(after | (at_end & sc["gt"][j]))
        d_d = _zero_stage(m, en, sc["data"], sc["isb"], sc_conds, sc["vlan"], n, nbeats,
                          lambda j: zero_tail[j], "sd")
        kconst = _select_constant(m, _beat_constants(n, b_rows, nbeats), sc["isb"], sc_conds,
                                  "sc_kc")
        keep_at_end = Signal()
        m.d.comb += keep_at_end.eq(Cat(*[sc["keep"][j] & sc["eq"][j] for j in range(n)]).any())
        sd = carry({"v": sc["v"], "first": sc["first"], "last": sc["last"], "k": kconst,
                    "active": ~after, "el": sc["el"], "ok": sc["ok"] & sc["known"],
                    "after": after, "end_here": at_end & keep_at_end}, "sd")

        # Stage D: partial data terms.
        parts = data_term_partials(m, en, d_d, b_rows, 64, "se")
        good_len = Signal()
        m.d.comb += good_len.eq(sd["ok"] & (sd["after"] | sd["end_here"]))
        se = carry({"v": sd["v"], "first": sd["first"], "last": sd["last"], "k": sd["k"],
                    "active": sd["active"], "el": sd["el"], "ok": good_len}, "se")

        # Stage E: the loop; the residue ROM for the pad count.
        state = Signal(32, reset_less=True)
        a_state = xor_rows(m, a_rows, state, "se_astate")
        dsum = Signal(32)
        m.d.comb += dsum.eq(Cat(*[Cat(*[p[b] for p in parts], se["k"][b]).xor()
                                  for b in range(32)]))
        nxt = Signal(32)
        m.d.comb += nxt.eq(Mux(se["first"], 0, a_state) ^ dsum)
        with m.If(en & se["v"] & se["active"]):
            m.d.sync += state.eq(nxt)
        resid = residue_register()
        rom = Signal(32)
        with m.Switch(se["el"]):
            for j in range(n):
                with m.Case(j):
                    m.d.comb += rom.eq(advance(resid, 8 * (n - 1 - j)))
        sf = carry({"v": se["v"] & se["last"], "ok": se["ok"], "rom": rom}, "sf")

        # Stage F: compare.
        with m.If(en):
            m.d.sync += [self.o.valid.eq(sf["v"]),
                         self.o.payload.good.eq(sf["ok"] & (state == sf["rom"]))]
        return m
