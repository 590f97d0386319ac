# SPDX-License-Identifier: BSD-2-Clause
"""What the segmenter's stages share: the records that cross between them (the packet
descriptor, the request record, the resume preparation's port) and the length arithmetic.

The segmenter (:class:`roce_hw.tx.segmenter.Segmenter`) is three components:

* :class:`~roce_hw.tx.seg_accept.RequestAccept`: takes a work or resume request, reads its QP row
  and looks up its newest write-back; its output is a stream of :func:`request_layout` records
  (the request, checks and precomputes, the row);
* :class:`~roce_hw.tx.seg_resume.ResumePrep`: the multi-cycle arithmetic of a resume request in
  the accept register, through :class:`ResumePrepSignature`;
* :class:`~roce_hw.tx.seg_emit.DescriptorEmitter`: a request record -> the message's packet
  descriptors (:func:`desc_layout`).
"""

from amaranth import *
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .. import layouts, proto
from ..config import check_config
from ..layouts import qp_index_width
from ..lib.arith import counter_flag_bits
from ..verbs import resume_layout, wr_layout

__all__ = ["PMTU_CODES", "WRITES", "WITH_IMM", "WR_OPS", "BYTES_BITS", "LEN_BITS", "Q_BITS",
           "Q_CHUNK", "HZ", "PSN_FLAG_BITS", "header_bytes", "l3_bytes", "desc_layout",
           "pre_layout", "keep_code_layout", "request_layout", "flush_signature",
           "ResumePrepSignature",
           "select_by_pmtu", "last_lengths", "precompute", "keep_decode", "keep_lanes"]

PMTU_CODES = tuple(int(c) for c in proto.PMTU_BYTES)          # 1..5
WRITES = (proto.WrOpcode.RDMA_WRITE, proto.WrOpcode.RDMA_WRITE_WITH_IMM)
WITH_IMM = (proto.WrOpcode.RDMA_WRITE_WITH_IMM, proto.WrOpcode.SEND_WITH_IMM)
#: The work-request opcodes the segmenter sends (the others are refused).
WR_OPS = (proto.WrOpcode.RDMA_WRITE, proto.WrOpcode.RDMA_WRITE_WITH_IMM, proto.WrOpcode.SEND,
          proto.WrOpcode.SEND_WITH_IMM)

#: Bits of a byte count of one packet (0 to the largest PMTU).
BYTES_BITS = proto.MAX_PMTU_BYTES.bit_length()
#: Bits of a message length (0 to :data:`roce_hw.proto.MAX_MESSAGE_BYTES`).
LEN_BITS = proto.MAX_MESSAGE_BYTES.bit_length()
#: Bits of a count of full packets of a message (its length over the smallest PMTU).
Q_BITS = LEN_BITS - min(proto.pmtu_shift(c) for c in PMTU_CODES)
#: Chunk of the packet counter (its one look-ahead flag: the low 12 bits are zero).
Q_CHUNK = 12
#: Bit from which a byte count's high part is tested as one registered "all zero" flag (a
#: packet's count and the bit above it are below).
HZ = BYTES_BITS + 1
#: The PSN counter's look-ahead flag positions (:class:`~roce_hw.lib.arith.FastCounter`'s
#: default chunk): a PSN loaded into it comes with these flags.
PSN_FLAG_BITS = counter_flag_bits(proto.PSN_BITS)

assert all(proto.pmtu_bytes(c) < 1 << BYTES_BITS for c in PMTU_CODES)
assert max(proto.pmtu_shift(c) for c in PMTU_CODES) + 1 < HZ


def header_bytes(*headers):
    """Total size in bytes of a sequence of :class:`~roce_hw.proto.Header`."""
    return sum(h.size for h in headers)


def l3_bytes(reth, imm):
    """IPv4 + UDP + BTH [+ RETH] [+ ImmDt] + iCRC: the IPv4 total length of a packet without
    payload."""
    return header_bytes(proto.IPV4, proto.UDP, proto.BTH) + proto.ICRC_BYTES + \
        (proto.RETH.size if reth else 0) + (proto.IMMDT.size if imm else 0)


def _beat_bits(config):
    """``(n, lg)``: bytes per beat and their log2."""
    n = check_config(config).data_bytes
    return n, (n - 1).bit_length()


def desc_layout(config):
    """One packet descriptor: everything the packet builder needs but the IPv4 identification.

    ==================  =======================================================================
    field               meaning
    ==================  =======================================================================
    ``qp``, ``wr_id``   QP index and the work request's cookie
    ``tag``             1-bit message tag (alternates per message; names the message to flush)
    ``refuse``          :class:`~roce_hw.verbs.WcStatus` of a refused request (0: send); a
                        refused request is one descriptor with ``last`` = 1 and no packet
    ``first``           the first packet of a message the QP's next PSN was taken for (a new
                        message, not a resumed one)
    ``last``            the message's last packet
    ``resumed``         part of a resumed message (its PSNs came with the request)
    ``has_payload``     the request has a payload packet on the payload input
    ``has_pay``         ``pay_len`` != 0 (a payload packet follows the header)
    ``refused``         ``refuse`` != 0
    ``index``           packet index in the message (its payload starts at byte
                        ``index * PMTU`` of the message)
    ``pay_len``         payload bytes of this packet (0 to 4096), pad not included
    ``beats``           payload beats of this packet (``ceil(pay_len / (W/8))``)
    ``tot_len``         IPv4 total length; ``udp_len``: UDP length
    ``reth``, ``imm``   the RETH / ImmDt header is present (the header variant)
    ``bth``             the BTH (PSN included), as :data:`roce_hw.layouts.BTH`
    ``psn_next``        the BTH PSN + 1 (modulo 2**24)
    ``pk``, ``lik``     ``keep`` of the payload bytes in the packet's last payload beat, and the
                        same rounded up to a multiple of 4 (with the PadCnt bytes)
    ``pkc``             the lanes set in ``pk`` (1 to W/8), so the cutter compares counts
                        without counting ``pk``
    ``va``, ``r_key``,  RETH fields (``remote_addr``, ``r_key``, message length)
    ``dma_length``
    ``imm_data``        ImmDt
    ``remote_mac``,     addressing from the QP row
    ``remote_ip``,
    ``udp_sport``,
    ``dscp``, ``ecn``
    ==================  =======================================================================
    """
    n, lg = _beat_bits(config)
    # (the widths of the QP row's and the WR's fields, from their declarations)
    row = {k: w for k, w in proto.QP_CONTEXT_FIELDS
           if k in ("remote_mac", "remote_ip", "udp_sport", "dscp", "ecn")}
    wr = {k: Shape.cast(f.shape).width for k, f in wr_layout(config)}
    return data.StructLayout({
        "qp": qp_index_width(config.n_qp), "wr_id": wr["wr_id"], "tag": 1,
        "refuse": Shape.cast(proto.WcStatus).width,
        "first": 1, "last": 1, "resumed": 1, "has_payload": 1,
        "has_pay": 1, "refused": 1,
        "index": Shape.cast(resume_layout(config)["start_packet"].shape).width,
        "psn_next": proto.PSN_BITS, "pay_len": BYTES_BITS,
        "pk": n, "lik": n, "pkc": n.bit_length(), "beats": BYTES_BITS - lg,
        "tot_len": proto.IPV4.width("total_length"), "udp_len": proto.UDP.width("length"),
        "reth": 1, "imm": 1,
        "bth": layouts.BTH,
        "va": wr["remote_addr"], "r_key": wr["r_key"], "dma_length": wr["length"],
        "imm_data": wr["imm"], **row,
    })


def pre_layout(config):
    """What loading a request needs of its byte count from the first packet to send on
    (``rem``), computed before the QP's PMTU is known (:func:`precompute`): ``le`` (per PMTU
    code: ``rem`` <= PMTU), ``nz`` (``rem`` != 0), and the IPv4 total length, UDP length and
    payload beats of a last packet of ``rem`` bytes (``tl``, ``ul``, ``beats``)."""
    _, lg = _beat_bits(config)
    return data.StructLayout({"le": len(PMTU_CODES), "nz": 1,
                              "tl": proto.IPV4.width("total_length"),
                              "ul": proto.UDP.width("length"),
                              "beats": BYTES_BITS - lg})


def keep_code_layout(config):
    """Registered compares of a byte count's low ``lg`` bits (``cnt``, the bytes in a last beat,
    0 meaning all), from which :func:`keep_lanes` builds the keep masks: ``z`` (``cnt == 0``),
    and ``cnt > j`` split as ``hi > a | (hi == a & lo > b)`` for lane ``j = 8 a + b`` (``lo =
    cnt[:3]``, ``hi = cnt[3:]``: ``gt_hi[a]``, ``eq_hi[a]``, ``gt_lo[b]``)."""
    n, lg = _beat_bits(config)
    return data.StructLayout({"z": 1, "gt_hi": n // 8, "eq_hi": n // 8, "gt_lo": 8, "cnt": lg})


def request_layout(config):
    """The request record: what :class:`~roce_hw.tx.seg_accept.RequestAccept` hands the emitter
    (its accept register, the precomputes and the QP row).

    ===============  ==========================================================================
    field            meaning
    ===============  ==========================================================================
    ``res``          a resume request (else a work request)
    ``wr``           the request's :func:`~roce_hw.verbs.wr_layout` part
    ``spkt``,        a resume's ``start_packet``, ``start_psn`` and that PSN's counter flags
    ``spsn``,        (:data:`PSN_FLAG_BITS`)
    ``spsn_f``
    ``first``        the first packet to send is the message's first
    ``reth``,        the first packet to send has a RETH; the message has an ImmDt
    ``imm``
    ``bad_qp``,      refusals: QP index >= ``n_qp``; opcode not one of the four; ``length`` >
    ``bad_op``,      2**31; a resume's ``start_packet`` is not a packet of the message
    ``bad_len``,
    ``bad_res``
    ``rem``          bytes from the first packet to send on
    ``w``, ``r``     :func:`pre_layout` of ``rem``: a work request's (computed as it was taken)
                     and a resume's (computed by the resume preparation)
    ``keep``         :func:`keep_code_layout` of ``rem``
    ``qz``           per PMTU code: the packet count's low chunk (``rem >> shift``, 12 bits)
                     is zero (the packet counter's look-ahead flag)
    ``hit``,         the newest write-back of the request's QP (looked up every cycle the
    ``hpsn``,        request waits)
    ``herr``
    ``wb_req``       this cycle's write-back (if any) is of the request's QP
    ``row``          the QP row (:data:`roce_hw.layouts.QP_CONTEXT`)
    ===============  ==========================================================================
    """
    cfg = check_config(config)
    spkt = Shape.cast(resume_layout(cfg)["start_packet"].shape).width
    return data.StructLayout({
        "res": 1, "wr": wr_layout(cfg),
        "spkt": spkt, "spsn": proto.PSN_BITS, "spsn_f": len(PSN_FLAG_BITS),
        "first": 1, "reth": 1, "imm": 1,
        "bad_qp": 1, "bad_op": 1, "bad_len": 1, "bad_res": 1,
        "rem": LEN_BITS,
        "w": pre_layout(cfg), "r": pre_layout(cfg),
        "keep": keep_code_layout(cfg), "qz": len(PMTU_CODES),
        "hit": 1, "hpsn": proto.PSN_BITS, "herr": 1, "wb_req": 1,
        "row": layouts.QP_CONTEXT,
    })


def flush_signature():
    """The flush of a message, seen from its producer (the commit stage): ``valid`` (a pulse,
    never blocked) drops the rest of the message with the 1-bit ``tag``. (Not an
    ``always_ready`` stream: its constant ``ready`` could not be a port of a Verilog top.)"""
    return wiring.Signature({"valid": Out(1), "tag": Out(1)})


class ResumePrepSignature(wiring.Signature):
    """The resume preparation's port, seen from the accept stage (which holds the request; the
    :class:`~roce_hw.tx.seg_resume.ResumePrep` has it flipped).

    Members
    -------
    busy : ``Out(1)``
        A resume request waits in the accept register for its preparation.
    spkt, length, rem, first, reth, imm : ``Out``
        The request's ``start_packet``, message length, current ``rem`` (final from the
        preparation's step 6), "the first packet to send is the message's first", RETH, ImmDt.
    pmtu : ``Out``
        The QP row's PMTU code (valid from the cycle after the request was taken).
    set_rem : ``In(1)``, rem_next : ``In(LEN_BITS)``
        Load ``rem`` with ``rem_next`` (the bytes from ``start_packet * PMTU`` on).
    bad : ``In(1)``
        ``start_packet`` is not a packet of the message.
    done : ``In(1)``
        The request's values are final (``rem``, ``bad``, ``pre``): it may be loaded.
    pre : ``In(pre_layout(config))``
        :func:`precompute` of the resume's ``rem`` (registered).
    """

    def __init__(self, config):
        self._config = cfg = check_config(config)
        spkt = Shape.cast(resume_layout(cfg)["start_packet"].shape).width
        super().__init__({
            "busy": Out(1), "spkt": Out(spkt), "length": Out(LEN_BITS), "rem": Out(LEN_BITS),
            "first": Out(1), "reth": Out(1), "imm": Out(1),
            "pmtu": Out(layouts.QP_CONTEXT["pmtu"].shape),
            "set_rem": In(1), "rem_next": In(LEN_BITS), "bad": In(1), "done": In(1),
            "pre": In(pre_layout(cfg)),
        })

    def __eq__(self, other):
        return type(other) is type(self) and other._config == self._config

    def __repr__(self):
        return f"ResumePrepSignature({self._config!r})"


def select_by_pmtu(m, code, values, out):
    """``out = values[code]`` for a PMTU code (the first value for a code outside 1..5: such
    a QP is refused, its descriptor's other fields do not matter)."""
    with m.Switch(code):
        for c, v in zip(PMTU_CODES, values):
            with m.Case(c):
                m.d.comb += out.eq(v)
        with m.Default():
            m.d.comb += out.eq(values[0])


def last_lengths(m, lg, rem, reth, imm, name, opcode=None, any_of=None, lo_nz=None, nz4=None):
    """IPv4 total length, UDP length and payload beats of a last packet of ``rem`` (<
    2**:data:`BYTES_BITS`) bytes, for beats of ``2**lg`` bytes. The padded payload and every
    header size are multiples of 4, so each length is one 11-bit adder of ``rem[2:13]``, a
    constant of the header variant and "``rem`` is not a multiple of 4" as its carry in. The
    variant, given by ``reth``/``imm`` or by a WR ``opcode``, picks the constant operand in
    parallel with ``rem``'s own source, and the sum goes straight to the caller's register
    (ECP5: no multiplexer after the carry chain). ``any_of(lo, hi)`` is "``rem[lo:hi]`` is not
    zero" (``rem[lo:hi].any()`` if not given); ``lo_nz`` and ``nz4``, if given, are "the bytes
    below a beat are not zero" and "``rem`` is not a multiple of 4" computed by the caller."""
    if any_of is None:
        def any_of(lo, hi):
            return rem[lo:hi].any()
    if nz4 is None:
        nz4 = Signal(name=f"{name}_nz4")
        m.d.comb += nz4.eq(rem[0] | rem[1])
    tl_w, ul_w = proto.IPV4.width("total_length"), proto.UDP.width("length")
    tl = Signal(tl_w, name=f"{name}_tl")
    ul = Signal(ul_w, name=f"{name}_ul")
    beats = Signal(BYTES_BITS - lg, name=f"{name}_beats")
    t4 = Signal(tl_w - 4, name=f"{name}_tl4")
    u4 = Signal(ul_w - 4, name=f"{name}_ul4")
    udp_words = proto.IPV4.size // 4
    q4 = Signal(7, name=f"{name}_b4")
    u4c = Signal(7, name=f"{name}_u4c")
    if opcode is None:
        sel = Cat(imm, reth)
        cases = {c: (c >> 1, c & 1) for c in range(4)}
    else:
        # (on the opcode's two low bits: an opcode past SEND_WITH_IMM is refused, its
        # lengths do not matter)
        sel = opcode[:2]
        cases = {int(op): (int(op in WRITES), int(op in WITH_IMM)) for op in WR_OPS}
    with m.Switch(sel):
        for c, (v_reth, v_imm) in cases.items():
            with m.Case(c):
                words = l3_bytes(v_reth, v_imm) // 4
                m.d.comb += [q4.eq(words), u4c.eq(words - udp_words)]
    m.d.comb += [t4.eq(rem[2:BYTES_BITS] + q4 + nz4), u4.eq(rem[2:BYTES_BITS] + u4c + nz4)]
    m.d.comb += [
        tl.eq(Cat(C(0, 2), t4)), ul.eq(Cat(C(0, 2), u4)),
    ]
    # beats = ceil(rem / n): the low bits only as an OR into the carry in (an adder over
    # them would hand their OR to other logic as a carry output, two cells deep)
    if lo_nz is None:
        lo_nz = Signal(name=f"{name}_lo_nz")
        m.d.comb += lo_nz.eq(any_of(0, lg))
    m.d.comb += beats.eq(rem[lg:BYTES_BITS] + lo_nz)
    return tl, ul, beats


def precompute(m, config, rem, reth, imm, name, opcode=None, hz=None, nib=None, lo_nz=None,
               nz4=None):
    """:func:`pre_layout` of ``rem`` bytes from the first packet to send, computed before the
    PMTU is known (a ``Signal(pre_layout(config))``, comb in ``m``). ``hz`` is "``rem[HZ:]``
    is zero" (computed here if not given): every test below then looks at :data:`HZ` bits at
    most, which keeps Yosys from chaining the wide zero tests. ``nib``, if given, are registered
    "``rem[4 i:4 i + 4]`` is not zero" flags for the nibbles below bit 16, which the zero
    tests then use in place of the bits: no test is more than one LUT of its inputs, and
    no prefix OR is left for the mapper to chain. ``lo_nz``, if given, is "``rem`` is not
    a multiple of the beat" and ``nz4`` "... of 4" (see :func:`last_lengths`)."""
    _, lg = _beat_bits(config)
    if hz is None:
        hz = Signal(name=f"{name}_hz")
        m.d.comb += hz.eq(~rem[HZ:].any())

    def any_of(lo, hi):
        """``rem[lo:hi]`` is not zero (``hi`` <= HZ)."""
        if nib is None or hi <= lo:
            return rem[lo:hi].any()
        terms = []
        b = lo
        while b < hi:
            if b % 4 == 0 and b + 4 <= hi:
                terms.append(nib[b // 4])
                b += 4
            else:
                terms.append(rem[b])
                b += 1
        return Cat(*terms).any()

    le = Signal(len(PMTU_CODES), name=f"{name}_le")
    nz = Signal(name=f"{name}_nz")
    for i, c in enumerate(PMTU_CODES):
        k = proto.pmtu_shift(c)
        # rem <= 2**k
        m.d.comb += le[i].eq(hz & ~any_of(k + 1, HZ) & (~rem[k] | ~any_of(0, k)))
    m.d.comb += nz.eq(~hz | any_of(0, HZ))
    tl, ul, beats = last_lengths(m, lg, rem, reth, imm, name, opcode, any_of=any_of,
                                 lo_nz=lo_nz, nz4=nz4)
    out = Signal(pre_layout(config), name=f"{name}_pre")
    m.d.comb += [out.le.eq(le), out.nz.eq(nz), out.tl.eq(tl), out.ul.eq(ul),
                 out.beats.eq(beats)]
    return out


def keep_decode(m, config, length, name):
    """:func:`keep_code_layout` of a byte count (its low ``lg`` bits), registered (a
    ``Signal(keep_code_layout(config))`` loaded in every cycle). Each flag is a function of at
    most 4 bits."""
    n, lg = _beat_bits(config)
    cnt = length[:lg]
    lo, hi = cnt[:3], cnt[3:]
    na = n // 8
    k = Signal(keep_code_layout(config), name=name)
    m.d.sync += [k.z.eq(cnt == 0), k.cnt.eq(cnt)]
    # (no compare against the largest value: it would be constant)
    m.d.sync += [k.gt_lo[b].eq(lo > b if b < 7 else 0) for b in range(8)]
    for a_ in range(na):
        if len(hi):
            m.d.sync += [k.gt_hi[a_].eq(hi > a_ if a_ < na - 1 else 0),
                         k.eq_hi[a_].eq(hi == a_)]
        else:
            m.d.sync += [k.gt_hi[a_].eq(0), k.eq_hi[a_].eq(1)]
    return k


def keep_lanes(m, config, k, name):
    """``keep`` of the payload bytes in the last beat (``pk``), the same rounded up to 4 bytes
    (``lik``, PadCnt), from :func:`keep_decode` flags ``k``: one LUT per lane; and the lanes set
    in ``pk`` (``pkc``: the byte count, 0 meaning all, is ``n`` when ``cnt == 0``)."""
    n, _ = _beat_bits(config)
    pk = Signal(n, name=f"{name}_pk")
    lik = Signal(n, name=f"{name}_lik")
    m.d.comb += [pk[j].eq(k.z | k.gt_hi[j >> 3] | (k.eq_hi[j >> 3] & k.gt_lo[j & 7]))
                 for j in range(n)]
    # every 4-byte group that has a payload byte is kept whole
    m.d.comb += lik.eq(Cat(*[pk[j & ~3] for j in range(n)]))
    pkc = Signal(n.bit_length(), name=f"{name}_pkc")
    m.d.comb += pkc.eq(Cat(k.cnt, k.z))
    return pk, lik, pkc
