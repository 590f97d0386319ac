# SPDX-License-Identifier: BSD-2-Clause
"""RoCEv2 invariant CRC (iCRC) on streams of whole Ethernet frames: :class:`ICRCInserter` (TX)
and :class:`ICRCChecker` (RX).

The iCRC (PROTOCOL.md §2) is ``zlib.crc32`` over 8 bytes of 0xFF, then the IP header (IPv4 TOS,
TTL, checksum / IPv6 traffic class, flow label, hop limit set to 1s), the UDP header (checksum
set to 1s), the BTH (byte 4 set to 1s) and everything up to the end bounded by the UDP length,
minus the 4 iCRC bytes. Frames are IPv4 (no options) or IPv6, with or without one 802.1Q tag.

How the hardware gets cheap (all constants derived at elaboration time from :mod:`roce_hw.proto`
and :mod:`roce_hw.lib.crc`, no hand-typed offsets or matrices):

* The bytes that are not covered (Ethernet header, VLAN tag) and the masked fields are **zeroed**
  in the input register (synchronous reset of those flip-flops, no LUT), or by an AND in
  front of the partial terms when every frame is of one known variant. The 1s of the masked
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

from .. import proto
from ..config import check_data_width
from .crc import (CRC_INIT, advance, advance_rows, apply_rows, crc_bits, data_term_partials,
                  empty_lanes, residue_register, revert_stages, rewind_product, rows_mul,
                  step_matrices, xor_rows)
from .stream import PacketSignature, ReadyBreak, packet_layout

__all__ = ["MAX_FRAME_BYTES", "VARIANTS", "covered_start", "masked_bytes", "ICRCInserter",
           "ICRCChecker",
           "ICRCResultLayout"]

#: Rewind stages (select bits) of :class:`ICRCInserter`'s combinational gated product, in front
#: of its output register: 3 fit in 3 LUT levels (a LUT6 takes 3 selects and 3 data bits).
COMB_REWIND = 3

#: Data bits per first-stage partial XOR of the data term (behind the zeroing register).
_CHUNK = 64

#: The same when the zeroing is an AND in front of them (no register between): the AND, the
#: ready-break multiplexer before it and the partial XOR in one stage (16 measured 6 cells in
#: the TX engine at every width; 32 and 64 measured 7 and 8 at 128 bits).
_CHUNK_COMB = 16

#: Longest frame the checker accepts (longer ones are reported bad), in bytes.
MAX_FRAME_BYTES = 16384

#: Frame variants handled: ``(vlan, ip_version)``.
VARIANTS = ((0, 4), (0, 6), (1, 4), (1, 6))

#: Lanes used in a frame's last beat, modulo 4, for every RoCEv2 frame without its iCRC:
#: the covered region starts at 14 or 18 (both 2 mod 4) and the IB packet before the iCRC is
#: a multiple of 4 bytes.
_LAST_LANES_MOD4 = 2
assert proto.ETH.size % 4 == _LAST_LANES_MOD4 and \
    (proto.ETH.size + proto.VLAN_TAG.size) % 4 == _LAST_LANES_MOD4

_ETHERTYPE_OFF = proto.ETH.offset("ethertype")[0]                 # 12
_INNER_ETHERTYPE_OFF = _ETHERTYPE_OFF + proto.VLAN_TAG.size       # 16


def covered_start(vlan):
    """Frame offset of the first iCRC-covered byte (the IP header)."""
    return proto.ETH.size + (proto.VLAN_TAG.size if vlan else 0)


def _ip_header(ipv):
    return proto.IPV4 if ipv == 4 else proto.IPV6


def masked_bytes(vlan, ipv):
    """``{frame byte offset: mask}`` of the iCRC-variant bits of a frame variant."""
    e = covered_start(vlan)
    ip = _ip_header(ipv)
    res = {}
    for hdr, base in ((ip, e), (proto.UDP, e + ip.size), (proto.BTH, e + ip.size + proto.UDP.size)):
        for k, mk in enumerate(hdr.mask(proto.ICRC_MASKED_FIELDS[hdr.name])):
            if mk:
                res[base + k] = mk
    return res


def _udp_length_offset(vlan, ipv):
    return covered_start(vlan) + _ip_header(ipv).size + proto.UDP.offset("length")[0]


def _prefix_state():
    """The register after the 8 bytes of 0xFF that stand in for the LRH."""
    return crc_bits(CRC_INIT, 0xFF_FF_FF_FF_FF_FF_FF_FF, 64)


class _FrameFront:
    """Input-side frame tracking shared by the inserter and the checker (elaboration helper).

    Tracks the beat index of the frame on the input stream (``is_beat[b]``: the bus carries
    beat ``b`` of a frame) and captures the header bytes at the offsets in ``capture``
    (:meth:`byte`: from the bus on its own beat, else from its capture register).
    """

    def __init__(self, m, i, transfer, n, nbeats, capture):
        self.n = n
        self.nbeats = nbeats
        first = i.payload.first
        # one-hot "the next beat is beat b" register (no counter, no compare on the path)
        nxt = [None] + [Signal(name=f"fr_next{b}") for b in range(1, nbeats)]
        self.is_beat = [first] + [Signal(name=f"fr_beat{b}") for b in range(1, nbeats)]
        for b in range(1, nbeats):
            m.d.comb += self.is_beat[b].eq(~first & nxt[b])
        with m.If(transfer):
            for b in range(1, nbeats):
                m.d.sync += nxt[b].eq(self.is_beat[b - 1])
        self._cap = {}
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
        """The capture register of the frame byte at ``off`` (valid after its beat)."""
        return self._cap[off][1]

    def word(self, off, nbytes, captured=False):
        """Big-endian ``nbytes`` header word at ``off`` (from :meth:`byte` or :meth:`captured`)."""
        get = self.captured if captured else self.byte
        return Cat(*[get(off + nbytes - 1 - k) for k in range(nbytes)])   # big-endian


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
    out[(tag_beat, "vlan")] = advance(s_tagged ^ s_untagged, w * (tag_beat + 1))
    for v in VARIANTS:
        ones = masked_bytes(*v)
        for b in range(nbeats):
            word = 0
            for off, mk in ones.items():
                if off // n == b:
                    word |= mk << (8 * (off % n))
            k = apply_rows(rows_b, word)
            if k:
                out[(b, v)] = k
    if premul_rows is not None:
        out = {key: apply_rows(premul_rows, k) for key, k in out.items()}
    return out


def _zero_stage(m, en, data, is_beat, cond_fn, n, nbeats, extra_zero, name, *,
                registered=True):
    """Register ``data`` with the uncovered and masked bytes zeroed (a synchronous reset of those
    flip-flops, no LUT in the data path). ``cond_fn(beat, key)`` gives the condition of a
    :func:`_zero_plan` key (``"vlan"`` or a variant) on that beat; ``extra_zero(j)`` an additional
    zero condition of lane ``j`` or ``None``. Returns the registered data Signal; with
    ``registered=False`` the zeroed data combinationally (an AND in front of its user)."""
    plan = _zero_plan(n, nbeats)
    d1 = Signal(8 * n, name=f"{name}_d", reset_less=registered)
    dom = m.d.sync if registered else m.d.comb
    with m.If(en if registered else 1):
        for j in range(n):
            lane = data[8 * j:8 * j + 8]
            bit_conds = [[] for _ in range(8)]
            for b in range(nbeats):
                for mk, key in plan.get((b, j), []):
                    c = is_beat[b] if key is None else is_beat[b] & cond_fn(b, key)
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
                runs = _runs(bits)
                if not terms:
                    dom += [d1[8 * j + lo:8 * j + hi].eq(lane[lo:hi]) for lo, hi in runs]
                    continue
                z = Signal(name=f"{name}_z{j}_{bits[0]}")
                m.d.comb += z.eq(Cat(*terms).any())
                for lo, hi in runs:     # a multiplexer with 0: a synchronous reset of the FFs
                    dom += d1[8 * j + lo:8 * j + hi].eq(Mux(z, 0, lane[lo:hi]))
    return d1


def _runs(bits):
    """Sorted bit indices as ``[(lo, hi), ...]`` runs of consecutive bits."""
    runs = []
    for k in sorted(bits):
        if runs and runs[-1][1] == k:
            runs[-1] = (runs[-1][0], k + 1)
        else:
            runs.append((k, k + 1))
    return runs


def _beat_conds(consts, is_beat, cond_fn):
    """``{(beat, key): condition}`` of the constants of :func:`_beat_constants` on a beat."""
    return {(b, key): is_beat[b] if key is None else is_beat[b] & cond_fn(b, key)
            for b, key in consts}


def _select_constant(m, consts, conds, name):
    """Comb 32-bit XOR of the constants whose condition (``conds``, same keys) holds."""
    k = Signal(32, name=name)
    acc = C(0, 32)
    for key, val in consts.items():
        acc = acc ^ Mux(conds[key], C(val, 32), 0)
    m.d.comb += k.eq(acc)
    return k


def _flag_conds(m, vlan, v6, name):
    """``cond_fn`` over beat-independent flags."""
    conds = _variant_conds(m, vlan, v6, name)
    return lambda b, key: vlan if key == "vlan" else conds[key]


def _bus_flags(m, i, transfer, front, n, name):
    """``cond_fn`` for the input beat with no multiplexer in front of the ethertype compares: on
    the beat that carries an ethertype the flags come straight from the bus, on later beats from
    a register written on that beat (the zero plan never needs them on earlier beats)."""
    b12 = (_ETHERTYPE_OFF + 1) // n
    b16 = (_INNER_ETHERTYPE_OFF + 1) // n

    def bus_word(off):
        lane = off % n
        return Cat(i.payload.data[8 * lane + 8:8 * lane + 16],
                   i.payload.data[8 * lane:8 * lane + 8])

    flags = {}
    for key, off, val, beat in (("vl", _ETHERTYPE_OFF, proto.ETHERTYPE_VLAN, b12),
                                ("o6", _ETHERTYPE_OFF, proto.ETHERTYPE_IPV6, b12),
                                ("o4", _ETHERTYPE_OFF, proto.ETHERTYPE_IPV4, b12),
                                ("i6", _INNER_ETHERTYPE_OFF, proto.ETHERTYPE_IPV6, b16),
                                ("i4", _INNER_ETHERTYPE_OFF, proto.ETHERTYPE_IPV4, b16)):
        bus = Signal(name=f"{name}_{key}_bus")
        reg = Signal(name=f"{name}_{key}_reg", reset_less=True)
        m.d.comb += bus.eq(bus_word(off) == val)
        with m.If(transfer & front.is_beat[beat]):
            m.d.sync += reg.eq(bus)
        flags[key] = (beat, bus, reg)

    def flag(key, b):
        beat, bus, reg = flags[key]
        return bus if b == beat else reg

    def cond_fn(b, key):
        vl = flag("vl", b)
        if key == "vlan":
            return vl
        tagged, ipv = key
        if tagged:
            return vl & (flag("i6", b) if ipv == 6 else ~flag("i6", b))
        return ~vl & (flag("o6", b) if ipv == 6 else ~flag("o6", b))

    def current(key):
        """The flag for whatever beat is on the bus (bus compare on its beat, else register)."""
        beat, bus, reg = flags[key]
        cur = Signal(name=f"{name}_{key}_cur")
        m.d.comb += cur.eq(Mux(front.is_beat[beat], bus, reg))
        return cur

    cond_fn.current = current
    return cond_fn


def _fixed_flags(variant):
    """``cond_fn`` when every frame is of one ``variant``: constants, no compare."""
    def cond_fn(b, key):
        if key == "vlan":
            return C(variant[0], 1)
        return C(int(tuple(key) == tuple(variant)), 1)
    return cond_fn


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
    With ``variant`` set, every frame is taken to be of that variant (no ethertype compare in
    front of the zeroing register: a shorter path for a source that sends one kind).

    Latency: constant; a beat transferred on ``i`` in cycle ``t`` is valid on ``o`` in cycle
    ``t + latency + 1`` (:attr:`latency` counts the register stages between the two
    transfers): input register with the zeroing, partial data terms, feedback loop, then the
    output register with the insertion. The rewind by ``4 * q`` bytes (``log2(bytes per beat)
    - 2`` conditional stages) is by default one gated product of up to :data:`COMB_REWIND`
    stages in front of the output register (3 LUT levels), the stages beyond those two per
    register before it: latency 3, 3, 3, 4, 4 at 64, 128, 256, 512, 1024 bits (a gated product
    of all 4 stages measured 7 cells in the TX engine at 512 bits). ``rewind_per_cycle`` 1 or 2
    puts every stage in registers, that many per register (latency 4, 5, 6, 7, 8 or 4, 4, 5, 5,
    6, and fewer LUTs at 1024 bits). With ``variant`` set, the zeroing needs no ethertype
    compare and is an AND in front of the partial terms (of :data:`_CHUNK_COMB` bits, so the
    AND and the XOR fit the stage), with no register of its own: one cycle less (latency 2, 2,
    2, 3, 3 by default), for about 750 more LUTs at 512 bits in the TX engine. At 64 bits
    (one rewind stage) a second register beside the loop holds the state already rewound by 4
    bytes, so the output stage picks one of two registers (ECP5: the rewind product there was 5
    LUT4 levels).
    Throughput: one beat per cycle, back-to-back frames; the input is held for one cycle when a
    frame needs the extra beat.
    Backpressure: full, ``i.ready`` follows ``o.ready``; any input idle pattern. With
    ``ready_break``, ``o`` leaves through a :class:`~roce_hw.lib.stream.ReadyBreak` and
    ``i.ready`` (the enable of every stage) is a flip-flop, loaded from that ready-break's next
    state and the pending extra beat's: the source's enables see a register, and ``o.ready``
    reaches the ready-break only.

    Parameters
    ----------
    data_width : int
        64, 128, 256, 512 or 1024.
    rewind_per_cycle : int or None
        ``None`` (default): up to :data:`COMB_REWIND` rewind stages in the output stage; 1 or
        2: every stage registered, that many per register (latency against area, see above).
    variant : tuple or None
        ``None`` (default): each frame's variant is read from its ethertypes; one of
        :data:`VARIANTS` (``(vlan, ip_version)``): every frame is of that variant.
    ready_break : bool
        ``i.ready`` from a flip-flop, ``o`` through a ready-break (see Backpressure); the same
        latency.

    Members
    -------
    i : ``In(PacketSignature(data_width))``
        Frames without iCRC; bytes beyond ``keep`` on the last beat are ignored.
    o : ``Out(PacketSignature(data_width))``
        Frames with iCRC; bytes beyond ``keep`` are don't-care.

    Raises
    ------
    ValueError
        For an unsupported ``data_width`` or ``rewind_per_cycle``.
    """

    def __init__(self, data_width, *, rewind_per_cycle=None, variant=None, ready_break=False):
        self._width = check_data_width(data_width)
        self._ready_break = bool(ready_break)
        if variant is not None and tuple(variant) not in VARIANTS:
            raise ValueError(f"variant must be None or one of {VARIANTS}, not {variant!r}")
        self._variant = None if variant is None else tuple(variant)
        self._nbytes = data_width // 8
        self._q_bits = (self._nbytes - 1).bit_length() - 2
        if rewind_per_cycle not in (None, 1, 2):
            raise ValueError(f"rewind_per_cycle must be None, 1 or 2, not {rewind_per_cycle!r}")
        self._per_cycle = rewind_per_cycle
        # register stages in front of the partial terms: the zeroing register (none with a
        # fixed variant: the zeroing is then an AND without compare, see elaborate)
        self._front = 1 if self._variant is None else 0
        self._rev_cycles = self._rewind_cycles(self._q_bits, rewind_per_cycle)
        super().__init__({"i": In(PacketSignature(data_width)),
                          "o": Out(PacketSignature(data_width))})

    @property
    def data_width(self):
        return self._width

    @property
    def latency(self):
        """Cycles from an input beat's transfer to its appearance on ``o`` (no stalls)."""
        return self.latency_for(self._width, rewind_per_cycle=self._per_cycle,
                                variant=self._variant)

    @staticmethod
    def _rewind_cycles(q_bits, per_cycle):
        if per_cycle is None:
            return -(-max(0, q_bits - COMB_REWIND) // 2)
        return -(-q_bits // per_cycle)

    @staticmethod
    def latency_for(data_width, *, rewind_per_cycle=None, variant=None):
        """:attr:`latency` of an inserter with these parameters, without building one."""
        q_bits = (check_data_width(data_width) // 8 - 1).bit_length() - 2
        front = 1 if variant is None else 0
        return 2 + front + ICRCInserter._rewind_cycles(q_bits, rewind_per_cycle)

    def elaborate(self, platform):
        m = Module()
        w, n = self._width, self._nbytes
        nbeats = _header_beats(n)
        a_rows, b_rows = step_matrices(w)
        fold = advance_rows(-16)
        b_fold = rows_mul(fold, b_rows)

        pending = Signal()
        pending_nx = Signal()           # `pending` of the next cycle
        en = Signal()
        if self._ready_break:
            # the output register's stream goes through a ready-break, whose `ready` never
            # waits for `valid`; `en` is loaded with its next value, so it is a flip-flop
            o = PacketSignature(w).create(path=("obuf",))
            m.submodules.obreak = obreak = ReadyBreak(packet_layout(w))
            wiring.connect(m, o, obreak.i)
            wiring.connect(m, obreak.o, wiring.flipped(self.o))
            en_r = Signal(init=1, name="en_r")
            m.d.sync += en_r.eq(obreak.ready_next & ~pending_nx)
            m.d.comb += en.eq(en_r)
        else:
            o = self.o
            m.d.comb += en.eq(~o.valid | (o.ready & ~pending))
        m.d.comb += self.i.ready.eq(en)
        transfer = Signal()
        m.d.comb += transfer.eq(self.i.valid & en)

        front = _FrameFront(m, self.i, transfer, n, nbeats, [])
        cond_fn = (_bus_flags(m, self.i, transfer, front, n, "ins") if self._variant is None
                   else _fixed_flags(self._variant))

        # Stage 1: zeroed beat, per-beat constant, pad count. With a fixed variant the zeroing
        # needs no ethertype compare, so it is an AND in front of the partial terms instead of a
        # register stage of its own (one cycle less).
        reg1 = self._front == 1
        keep = self.i.payload.keep
        d1 = _zero_stage(m, en, self.i.payload.data, front.is_beat, cond_fn, n, nbeats,
                         lambda j: ~keep[j], "s1", registered=reg1)
        consts = _beat_constants(n, b_rows, nbeats, fold)
        kc_in = _beat_conds(consts, front.is_beat, cond_fn)
        pad = empty_lanes(m, self.i.payload.keep, "s1_pad")
        if reg1:
            # the beat constant is selected one stage later, from registered conditions
            kc = {key: Signal(name=f"s1_kc{j}", reset_less=True) for j, key in enumerate(consts)}
            v1 = Signal()
            first1, last1 = Signal(reset_less=True), Signal(reset_less=True)
            q1 = Signal(self._q_bits, reset_less=True)
            with m.If(en):
                m.d.sync += [kc[key].eq(c) for key, c in kc_in.items()]
                m.d.sync += [v1.eq(self.i.valid), first1.eq(self.i.payload.first),
                             last1.eq(self.i.payload.last), q1.eq(pad[2:2 + self._q_bits])]
        else:
            kc = kc_in
            v1, first1, last1 = self.i.valid, self.i.payload.first, self.i.payload.last
            q1 = pad[2:2 + self._q_bits]

        def beat_constant(values, name):
            """The constants ``values`` (keyed like ``consts``) of this beat, registered with
            the partial terms."""
            reg = Signal(32, name=name, reset_less=True)
            with m.If(en):
                m.d.sync += reg.eq(_select_constant(m, values, kc, f"{name}_sel"))
            return reg

        # Stage 2: partial data terms.
        parts = data_term_partials(m, en, d1, b_fold, _CHUNK if reg1 else _CHUNK_COMB, "s2")
        k2 = beat_constant(consts, "k2")
        v2 = Signal()
        first2, last2 = Signal(reset_less=True), Signal(reset_less=True)
        q2 = Signal(self._q_bits, reset_less=True)
        with m.If(en):
            m.d.sync += [v2.eq(v1), first2.eq(first1), last2.eq(last1), q2.eq(q1)]

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

        lay = data.StructLayout({"beat": self.i.payload.shape(), "spill": 1})
        rewound_reg = self._per_cycle is None and self._q_bits == 1
        # (with it: the delay line's register holding the raw beat of the loop's partial terms,
        # made below)
        dl_pt = Signal(lay) if rewound_reg else None

        # Rewind by 4*q bytes and invert -> iCRC: in the output stage, or in stages 4.. .
        q_sel = [q3[b] for b in range(self._q_bits)]
        q_bytes = [4 << b for b in range(self._q_bits)]
        if rewound_reg:
            # One rewind stage (64 bits): a register beside the loop holds the state already
            # rewound by 4 bytes, so the output stage only picks one of the two (the gated
            # product there measured 5 LUT4 levels on ECP5). A beat with q = 1 has lanes n-4..
            # empty, so this register's data term needs the lanes below only, taken from the
            # delay line's register of the beat of the loop's partial terms (nothing is added
            # in front of the partial terms).
            rw = advance_rows(-8 * q_bytes[0])
            lanes = n - 4
            beat = dl_pt.beat
            d_lo = Signal(8 * lanes)
            m.d.comb += d_lo.eq(Cat(*[beat.data[8 * j:8 * j + 8] & beat.keep[j].replicate(8)
                                      for j in range(lanes)]))
            rb = [r & ((1 << 8 * lanes) - 1) for r in rows_mul(rw, b_fold)]
            k2_r = beat_constant(_beat_constants(n, b_rows, nbeats, rows_mul(rw, fold)), "k2_r")
            ra_state = xor_rows(m, rows_mul(rw, a_rows), state, "s3_rastate")
            rb_data = xor_rows(m, rb, d_lo, "s3_rbdata")
            state_r = Signal(32, reset_less=True)
            with m.If(en & v2):
                m.d.sync += state_r.eq(Mux(first2, 0, ra_state) ^ rb_data ^ k2_r)
            crc = Signal(32)
            m.d.comb += crc.eq(~Mux(q3[0], state_r, state))
            rcyc = 0
        elif self._per_cycle is None:
            # the first stages in registers, two per register; the last ones combinational
            k = max(0, self._q_bits - COMB_REWIND)
            x, carried, rcyc = revert_stages(m, en, state, q_sel[:k], q_bytes[:k], 2, "s4",
                                             carry=q_sel[k:])
            crc = Signal(32)
            m.d.comb += crc.eq(~rewind_product(m, x, carried, q_bytes[k:], "s4c"))
        else:
            crc, _, rcyc = revert_stages(m, en, state, q_sel, q_bytes, self._per_cycle, "s4",
                                         complement=True)
        assert rcyc == self._rev_cycles
        depth = 2 + self._front + rcyc

        # Raw delay line; the spill flag rides along: more than n-4 lanes used -> the iCRC
        # spills into an extra beat.
        prev_p = Signal(lay)
        m.d.comb += [prev_p.beat.eq(self.i.payload), prev_p.spill.eq(self.i.payload.keep[n - 4])]
        prev_v = self.i.valid
        for k in range(depth):
            p = Signal(lay, name=f"dl{k}_p", reset_less=True)
            v = Signal(name=f"dl{k}_v")
            with m.If(en):
                m.d.sync += [p.eq(prev_p), v.eq(prev_v)]
            if rewound_reg and k == self._front:
                m.d.comb += dl_pt.eq(p)
            prev_p, prev_v = p, v
        src, src_v = prev_p.beat, prev_v

        # Output stage: insert the iCRC bytes after the last valid lane. A frame without iCRC
        # ends 2 bytes past a 4-byte boundary (see above), so the number of lanes used in its
        # last beat is 2 mod 4 and lane j always gets iCRC byte (j - 2) mod 4: no rotation mux.
        crc_bytes = [crc[8 * r:8 * r + 8] for r in range(4)]
        rot = Signal(32)
        m.d.comb += rot.eq(Cat(*[crc_bytes[(r - _LAST_LANES_MOD4) % 4] for r in range(4)]))
        ins = Signal(w)
        for j in range(n):
            m.d.comb += ins[8 * j:8 * j + 8].eq(
                Mux(src.keep[j], src.data[8 * j:8 * j + 8], rot[8 * (j % 4):8 * (j % 4) + 8]))
        overflow = prev_p.spill
        rot_hold = Signal(32, reset_less=True)
        keep_ext = Signal(4, reset_less=True)
        m.d.comb += pending_nx.eq(pending)
        m.d.sync += pending.eq(pending_nx)
        with m.If(o.valid & o.ready & pending):
            m.d.sync += [o.payload.data[:32].eq(rot_hold), o.payload.keep.eq(keep_ext),
                         o.payload.first.eq(0), o.payload.last.eq(1)]
            m.d.comb += pending_nx.eq(0)
        with m.Elif(en):
            m.d.comb += pending_nx.eq(src_v & src.last & overflow)
            m.d.sync += [o.valid.eq(src_v), o.payload.data.eq(ins),
                         o.payload.first.eq(src.first),
                         o.payload.last.eq(src.last & ~overflow),
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
    ``8 + 12 + 4`` or beyond the end of the frame, is longer than :data:`MAX_FRAME_BYTES`, or
    has a wrong iCRC. Pipeline: capture/decode, end-offset arithmetic (split in two adds so no
    carry chain exceeds a stage), end-beat compare, zeroing register, partial data terms, their
    sum, feedback loop, residue compare in two steps.

    Latency: :attr:`latency` (9) cycles from the transfer of a frame's last beat to its result on
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
        return 9

    def elaborate(self, platform):
        m = Module()
        w, n = self._width, self._nbytes
        lg = n.bit_length() - 1
        bw = (MAX_FRAME_BYTES // n).bit_length() - 1      # beat index bits
        nbeats = _header_beats(n)
        a_rows, b_rows = step_matrices(w)
        en = Signal()
        m.d.comb += [en.eq(~self.o.valid | self.o.ready), self.i.ready.eq(en)]
        transfer = Signal()
        m.d.comb += transfer.eq(self.i.valid & en)
        pl = self.i.payload

        # Header bytes: ethertypes, IP version/IHL, IP protocol, UDP length, for every variant.
        proto_off = {4: proto.IPV4.offset("protocol")[0], 6: proto.IPV6.offset("next_header")[0]}
        caps = [_ETHERTYPE_OFF, _ETHERTYPE_OFF + 1, _INNER_ETHERTYPE_OFF, _INNER_ETHERTYPE_OFF + 1]
        for vl, ipv in VARIANTS:
            e = covered_start(vl)
            u = _udp_length_offset(vl, ipv)
            caps += [e, e + proto_off[ipv], u, u + 1]
        front = _FrameFront(m, self.i, transfer, n, nbeats, caps)
        in_fn = _bus_flags(m, self.i, transfer, front, n, "in")
        cur = {k: in_fn.current(k) for k in ("vl", "o6", "o4", "i6", "i4")}
        vlan, v6, is_ip = Signal(), Signal(), Signal()
        m.d.comb += [vlan.eq(cur["vl"]), v6.eq(Mux(cur["vl"], cur["i6"], cur["o6"])),
                     is_ip.eq(Mux(cur["vl"], cur["i6"] | cur["i4"], cur["o6"] | cur["o4"]))]
        known_reg = Signal()
        known = Signal()
        m.d.comb += known.eq((known_reg & ~pl.first) | Cat(*[
            front.is_beat[b] & in_fn(b, v) for v in VARIANTS
            for b in [(_udp_length_offset(*v) + 1) // n]]).any())
        with m.If(transfer):
            m.d.sync += known_reg.eq(known)
        # Beat index; its MSB sticks once a frame exceeds MAX_FRAME_BYTES.
        bnext = Signal(bw + 1)
        bidx = Signal(bw + 1)
        m.d.comb += bidx.eq(Mux(pl.first, 0, bnext))
        with m.If(transfer):
            with m.If(pl.first):
                m.d.sync += bnext.eq(1)
            with m.Elif(~bnext[bw]):
                m.d.sync += bnext.eq(bnext + 1)

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
                    val = Value.cast(val)
                    reg = Signal(val.shape(), name=f"{name}_{key}", reset_less=(key != "v"))
                    with m.If(en):
                        m.d.sync += reg.eq(val)
                    out[key] = reg
            return out

        def forward(prev, *keys):
            return {k: prev[k] for k in keys}

        beat_keys = ("v", "data", "keep", "first", "last", "isb", "vlan", "v6", "known", "bidx")
        sa = carry({"v": self.i.valid, "data": pl.data, "keep": pl.keep, "first": pl.first,
                    "last": pl.last, "isb": list(front.is_beat), "vlan": vlan, "v6": v6,
                    "ip": is_ip, "known": known, "bidx": bidx}, "sa")

        # Stage A: header checks from the captures; low part of the last covered byte offset.
        sa_conds = _variant_conds(m, sa["vlan"], sa["v6"], "sa")
        udp_len = Signal(16)
        hdr_ok = Signal()
        c_low = Signal(lg)
        c_high = Signal(bw + 1)
        for v in VARIANTS:
            vl, ipv = v
            e = covered_start(vl)
            ipb = front.captured(e)
            if ipv == 4:
                ver_ok = ipb == ((4 << 4) | (proto.IPV4.size // 4))
            else:
                ver_ok = ipb[4:] == 6
            last_off = e + _ip_header(ipv).size - 1     # + udp_len = last covered byte
            with m.If(sa_conds[v]):
                m.d.comb += [
                    udp_len.eq(front.word(_udp_length_offset(vl, ipv), 2, captured=True)),
                    hdr_ok.eq(ver_ok & (front.captured(e + proto_off[ipv]) == proto.IP_PROTO_UDP)),
                    c_low.eq(last_off % n), c_high.eq(last_off // n),
                ]
        # min_len <= udp_len < MAX_FRAME_BYTES, written without comparators (no carry chain)
        min_len = proto.UDP.size + proto.BTH.size + proto.ICRC_BYTES
        lo_bits = (min_len - 1).bit_length()
        max_bits = MAX_FRAME_BYTES.bit_length() - 1
        len_ok = Signal()
        m.d.comb += len_ok.eq(~udp_len[max_bits:].any() & (
            udp_len[lo_bits:].any()
            | udp_len[:lo_bits].matches(*[f"{x:0{lo_bits}b}" for x in range(min_len,
                                                                          1 << lo_bits)])))
        lo_sum = Signal(lg + 1)
        m.d.comb += lo_sum.eq(udp_len[:lg] + c_low)
        sb = carry(dict(forward(sa, *beat_keys), ok=sa["ip"] & hdr_ok & len_ok,
                        uh=udp_len[lg:max_bits], c_high=c_high,
                        lo_sum=lo_sum), "sb")

        # Stage B: end beat; lane decode of the last covered byte.
        eb = Signal(bw + 1)
        m.d.comb += eb.eq(sb["uh"] + sb["c_high"] + sb["lo_sum"][lg])
        el = sb["lo_sum"][:lg]
        # lane decode in two registered halves (3 low bits, the rest), no long chains
        lo, hi = el[:3], el[3:]
        nhi = 1 << len(hi)
        dec = {}
        for nm, val, cnt in (("lo_lt", lo, 8), ("lo_eq", lo, 8), ("hi_lt", hi, nhi),
                             ("hi_eq", hi, nhi)):
            sigs = [Signal(name=f"sb_{nm}{x}") for x in range(cnt)]
            for x, sig in enumerate(sigs):
                if len(val) == 0:
                    m.d.comb += sig.eq(int(nm.endswith("eq") and x == 0))
                elif nm.endswith("lt"):
                    m.d.comb += sig.eq(val.matches(*[f"{y:0{len(val)}b}" for y in range(x)])
                                       if x else 0)
                else:
                    m.d.comb += sig.eq(val == x)
            dec[nm] = sigs
        sc = carry(dict(forward(sb, *beat_keys), ok=sb["ok"], eb=eb, el=el, **dec), "sc")

        # Stage C: is this the beat with the last covered byte, is that byte inside the frame?
        gt = [Signal(name=f"sc_gt{j}") for j in range(n)]
        eq = [Signal(name=f"sc_eq{j}") for j in range(n)]
        for j in range(n):
            jl, jh = j % 8, j // 8
            m.d.comb += [gt[j].eq(sc["hi_lt"][jh] | (sc["hi_eq"][jh] & sc["lo_lt"][jl])),
                         eq[j].eq(sc["hi_eq"][jh] & sc["lo_eq"][jl])]
        keep_grp = [Signal(name=f"sc_kg{g}") for g in range(-(-n // 8))]
        for g, kg in enumerate(keep_grp):
            lanes = range(8 * g, min(n, 8 * g + 8))
            m.d.comb += kg.eq(Cat(*[sc["keep"][j] & eq[j] for j in lanes]).any())
        sd = carry(dict(forward(sc, *beat_keys), ok=sc["ok"] & ~sc["eb"][bw], el=sc["el"],
                        gt=gt, keep_grp=keep_grp,
                        at_end=sc["known"] & (sc["bidx"] == sc["eb"])), "sd")

        # Stage D: zero the uncovered bytes, the masked fields and the bytes past the end.
        after_reg = Signal()
        after = Signal()
        at_end = sd["at_end"]
        m.d.comb += after.eq(~sd["first"] & after_reg)
        with m.If(en & sd["v"]):
            m.d.sync += after_reg.eq(after | at_end)
        zero_tail = [Signal(name=f"sd_zt{j}") for j in range(n)]
        for j in range(n):
            m.d.comb += zero_tail[j].eq(after | (at_end & sd["gt"][j]))
        sd_fn = _flag_conds(m, sd["vlan"], sd["v6"], "sd")
        d_e = _zero_stage(m, en, sd["data"], sd["isb"], sd_fn, n, nbeats,
                          lambda j: zero_tail[j], "se")
        sd_consts = _beat_constants(n, b_rows, nbeats)
        kconst = _select_constant(m, sd_consts, _beat_conds(sd_consts, sd["isb"], sd_fn),
                                  "sd_kc")
        se = carry({"v": sd["v"], "first": sd["first"], "last": sd["last"], "k": kconst,
                    "active": ~after, "el": sd["el"], "ok": sd["ok"] & sd["known"],
                    "after": after, "end_here": at_end & Cat(*sd["keep_grp"]).any()}, "se")

        # Stage E: partial data terms.
        parts = data_term_partials(m, en, d_e, b_rows, _CHUNK, "sf")
        good_len = Signal()
        m.d.comb += good_len.eq(se["ok"] & (se["after"] | se["end_here"]))
        sf = carry({"v": se["v"], "first": se["first"], "last": se["last"], "k": se["k"],
                    "active": se["active"], "el": se["el"], "ok": good_len}, "sf")

        # Stage F: sum of the partial data terms and the beat constant.
        dsum = Signal(32)
        m.d.comb += dsum.eq(Cat(*[Cat(*[p[b] for p in parts], sf["k"][b]).xor()
                                  for b in range(32)]))
        sg = carry({"v": sf["v"], "first": sf["first"], "last": sf["last"], "dsum": dsum,
                    "active": sf["active"], "el": sf["el"], "ok": sf["ok"]}, "sg")

        # Stage G: the loop; the residue ROM for the pad count.
        state = Signal(32, reset_less=True)
        a_state = xor_rows(m, a_rows, state, "sg_astate")
        nxt = Signal(32)
        m.d.comb += nxt.eq(Mux(sg["first"], 0, a_state) ^ sg["dsum"])
        with m.If(en & sg["v"] & sg["active"]):
            m.d.sync += state.eq(nxt)
        resid = residue_register()
        rom = Signal(32)
        with m.Switch(sg["el"]):
            for j in range(n):
                with m.Case(j):
                    m.d.comb += rom.eq(advance(resid, 8 * (n - 1 - j)))
        sh = carry({"v": sg["v"] & sg["last"], "ok": sg["ok"], "rom": rom}, "sh")

        # Stages H, I: compare in two steps (8 groups of 4 bits, then all groups).
        groups = [Signal(name=f"sh_eq{g}") for g in range(8)]
        for g, eqg in enumerate(groups):
            m.d.comb += eqg.eq(state[4 * g:4 * g + 4] == sh["rom"][4 * g:4 * g + 4])
        si = carry({"v": sh["v"], "ok": sh["ok"], "eq": groups}, "si")
        with m.If(en):
            m.d.sync += [self.o.valid.eq(si["v"]),
                         self.o.payload.good.eq(si["ok"] & Cat(*si["eq"]).all())]
        return m
