# SPDX-License-Identifier: BSD-2-Clause
"""Segmenter: work requests and resume requests + QP rows -> one packet descriptor per packet."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import layouts, proto
from ..config import check_config
from ..lib.arith import FastCounter
from ..layouts import qp_index_width, QPReadSignature
from ..verbs import WcStatus, resume_layout, wr_layout
from .psn import WriteBackSignature

__all__ = ["desc_layout", "header_bytes", "Segmenter"]

_PMTU_CODES = tuple(int(c) for c in proto.PMTU_BYTES)          # 1..5
_WRITES = (proto.WrOpcode.RDMA_WRITE, proto.WrOpcode.RDMA_WRITE_WITH_IMM)
_WITH_IMM = (proto.WrOpcode.RDMA_WRITE_WITH_IMM, proto.WrOpcode.SEND_WITH_IMM)
#: The work-request opcodes the segmenter sends (the others are refused).
_WR_OPS = (proto.WrOpcode.RDMA_WRITE, proto.WrOpcode.RDMA_WRITE_WITH_IMM, proto.WrOpcode.SEND,
           proto.WrOpcode.SEND_WITH_IMM)


def header_bytes(*headers):
    """Total size in bytes of a sequence of :class:`~roce_hw.proto.Header`."""
    return sum(h.size for h in headers)


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
    n = check_config(config).data_bytes
    # (the widths of the QP row's and the WR's fields, from their declarations)
    row = {k: w for k, w in proto.QP_CONTEXT_FIELDS
           if k in ("remote_mac", "remote_ip", "udp_sport", "dscp", "ecn")}
    wr = {k: Shape.cast(f.shape).width for k, f in wr_layout(config)}
    return data.StructLayout({
        "qp": qp_index_width(config.n_qp), "wr_id": 64, "tag": 1, "refuse": 5,
        "first": 1, "last": 1, "resumed": 1, "has_payload": 1,
        "has_pay": 1, "refused": 1, "index": 23, "psn_next": 24, "pay_len": 13,
        "pk": n, "lik": n, "pkc": n.bit_length(), "beats": 13 - (n - 1).bit_length(),
        "tot_len": 16, "udp_len": 16, "reth": 1, "imm": 1,
        "bth": layouts.BTH,
        "va": wr["remote_addr"], "r_key": wr["r_key"], "dma_length": wr["length"],
        "imm_data": wr["imm"], **row,
    })


#: Chunk of the packet counter (its one look-ahead flag: the low 12 bits are zero).
_Q_CHUNK = 12

#: Bit from which a byte count's high part is tested as one registered "all zero" flag.
_HZ = 14


def _select(m, code, values, out):
    """``out = values[code]`` for a PMTU code (the first value for a code outside 1..5: such
    a QP is refused, its descriptor's other fields do not matter)."""
    with m.Switch(code):
        for c, v in zip(_PMTU_CODES, values):
            with m.Case(c):
                m.d.comb += out.eq(v)
        with m.Default():
            m.d.comb += out.eq(values[0])


class Segmenter(wiring.Component):
    """Work requests (and resume requests) + the QP table -> a stream of packet descriptors.

    A request is accepted from ``resume`` (priority) or ``wr``, its QP row read, checked, and
    split into packets by the QP's PMTU exactly as :func:`roce_hw.model.segment.segment_message`
    does (FIRST/MIDDLE/LAST/ONLY, RETH on a WRITE's first packet, ImmDt on the last, SE, PadCnt,
    AckReq on the last packet and every ``ack_req_every`` packets). A resume request
    (:func:`roce_hw.verbs.resume_layout`) restarts a message at packet ``start_packet`` with
    PSN ``start_psn``: the rest goes out as MIDDLE/LAST without a RETH, as rxe resends it; the
    AckReq count restarts there.

    PSN. A new message's first packet takes the QP's ``next_psn``, newest write-back first
    (``fwd_*``, a :class:`~roce_hw.tx.psn.PsnForward` looked up while the request waits, and
    ``wb``, also while the descriptor waits on ``o``); its other packets count on from it. A QP
    the write-backs moved to ERROR refuses new messages. ``flush`` drops the rest of the message
    with that tag (the packet builder gave it up). The segmenter writes nothing back.

    Refusals (one descriptor, ``refuse`` != 0, ``last`` = 1): QP index >= ``n_qp``, QP not in RTS
    (or in ERROR by a write-back), PMTU code not 1..5, opcode not one of the four, a resume whose
    ``start_packet`` is not a packet of the message (``LOC_QP_OP_ERR``); ``length`` > 2**31
    (``LOC_LEN_ERR``).

    Timing. A message is kept as ``q`` (full PMTU packets left, the one on ``o`` included) and
    ``r`` (bytes of a last, partial packet): per packet only ``q`` counts down and the next
    descriptor is chosen from flags (``q`` == 1, 2, 3) kept one step ahead, so no byte count is
    ever subtracted. Lengths of a last packet are one 11-bit adder (every header size is a
    multiple of 4). A resume's rest (``length - start_packet * PMTU``) is subtracted 12 bits
    per cycle.

    Latency: a work request transferred in cycle 0 has its first descriptor valid on ``o`` in
    cycle 2, or 3 with ``fwd_registered`` (a resume request in cycle 11). Throughput: a
    message's next descriptor is on ``o`` two cycles after the one before it left (packets with
    payload are at least two beats, and the commit waits for a packet's payload anyway); a
    message's first descriptor comes the cycle after the last one of the message before left
    ``o``. ``o`` comes from registers; ``wr``/``resume`` wait while the accept register is full.

    Parameters
    ----------
    config : EngineConfig
    fwd_registered : bool
        The :class:`~roce_hw.tx.psn.PsnForward` answers a cycle after the key
        (``registered_key``): a work request then waits one cycle more for its look-up.

    Members
    -------
    wr : ``In(stream.Signature(wr_layout(config)))``
    resume : ``In(stream.Signature(resume_layout(config)))``
    qp_rd : ``Out(QPReadSignature(idx_width))``
    o : ``Out(stream.Signature(desc_layout(config)))``
    fwd_qp : ``Out(idx_width)``; fwd_hit, fwd_psn, fwd_err : ``In``
        Look-up port of the :class:`~roce_hw.tx.psn.PsnForward`.
    wb : ``In(WriteBackSignature(idx_width))``
        The write-backs (to refresh a first descriptor waiting on ``o``).
    flush_valid : ``In(1)``, flush_tag : ``In(1)``
        Drop the rest of the message with this tag.
    """

    def __init__(self, config, *, fwd_registered=False):
        self._config = check_config(config)
        self._fwd_registered = bool(fwd_registered)
        qw = qp_index_width(config.n_qp)
        super().__init__({
            "wr": In(stream.Signature(wr_layout(config))),
            "resume": In(stream.Signature(resume_layout(config))),
            "qp_rd": Out(QPReadSignature(qw)),
            "o": Out(stream.Signature(desc_layout(config))),
            "fwd_qp": Out(qw), "fwd_hit": In(1), "fwd_psn": In(24), "fwd_err": In(1),
            "wb": In(WriteBackSignature(qw)),
            "flush_valid": In(1), "flush_tag": In(1),
        })

    @staticmethod
    def _l3_bytes(reth, imm):
        """IPv4 + UDP + BTH [+ RETH] [+ ImmDt] + iCRC: the IPv4 total length of a packet
        without payload."""
        return header_bytes(proto.IPV4, proto.UDP, proto.BTH) + proto.ICRC_BYTES + \
            (proto.RETH.size if reth else 0) + (proto.IMMDT.size if imm else 0)

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        self._n = cfg.data_bytes
        self._lg = (self._n - 1).bit_length()
        assert all(self._l3_bytes(a, b) % 4 == 0 for a in (0, 1) for b in (0, 1))
        a = self._accept(m)
        self._resume_prep(m, a)
        self._emit(m, a)
        return m

    # ------------------------------------------------------------------ lengths
    def _last_lengths(self, m, rem, reth, imm, name, opcode=None, any_of=None, lo_nz=None,
                      nz4=None):
        """IPv4 total length, UDP length and payload beats of a last packet of ``rem`` (< 2**13)
        bytes. The padded payload and every header size are multiples of 4, so each length is
        one 11-bit adder of ``rem[2:13]``, a constant of the header variant and "``rem`` is not
        a multiple of 4" as its carry in. The variant, given by ``reth``/``imm`` or by a WR
        ``opcode``, picks the constant operand in parallel with ``rem``'s own source, and the
        sum goes straight to the caller's register (ECP5: no multiplexer after the carry
        chain). ``any_of(lo, hi)`` is "``rem[lo:hi]`` is not zero" (``rem[lo:hi].any()`` if not
        given); ``lo_nz`` and ``nz4``, if given, are "the bytes below a beat are not zero" and
        "``rem`` is not a multiple of 4" computed by the caller."""
        if any_of is None:
            def any_of(lo, hi):
                return rem[lo:hi].any()
        if nz4 is None:
            nz4 = Signal(name=f"{name}_nz4")
            m.d.comb += nz4.eq(rem[0] | rem[1])
        tl = Signal(16, name=f"{name}_tl")
        ul = Signal(16, name=f"{name}_ul")
        beats = Signal(13 - self._lg, name=f"{name}_beats")
        t4 = Signal(12, name=f"{name}_tl4")
        u4 = Signal(12, name=f"{name}_ul4")
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
            cases = {int(op): (int(op in _WRITES), int(op in _WITH_IMM)) for op in _WR_OPS}
        with m.Switch(sel):
            for c, (v_reth, v_imm) in cases.items():
                with m.Case(c):
                    words = self._l3_bytes(v_reth, v_imm) // 4
                    m.d.comb += [q4.eq(words), u4c.eq(words - udp_words)]
        m.d.comb += [t4.eq(rem[2:13] + q4 + nz4), u4.eq(rem[2:13] + u4c + nz4)]
        m.d.comb += [
            tl.eq(Cat(C(0, 2), t4)), ul.eq(Cat(C(0, 2), u4)),
        ]
        # beats = ceil(rem / n): the low bits only as an OR into the carry in (an adder over
        # them would hand their OR to other logic as a carry output, two cells deep)
        if lo_nz is None:
            lo_nz = Signal(name=f"{name}_lo_nz")
            m.d.comb += lo_nz.eq(any_of(0, self._lg))
        m.d.comb += beats.eq(rem[self._lg:13] + lo_nz)
        return tl, ul, beats

    def _pre_shapes(self):
        return [("le", len(_PMTU_CODES)), ("nz", 1),
                ("tl", 16), ("ul", 16),
                ("beats", 13 - self._lg)]

    def _keep_decode(self, m, length, name):
        """Registered compares of a byte count's low ``lg`` bits (``cnt``, the bytes in a last
        beat, 0 meaning all), from which :meth:`_keep_lanes` builds the keep masks: ``cnt ==
        0``, and ``cnt > j`` split as ``hi > a | (hi == a & lo > b)`` for lane ``j = 8 a + b``
        (``lo = cnt[:3]``, ``hi = cnt[3:]``). Each is a function of at most 4 bits."""
        n, lg = self._n, self._lg
        cnt = length[:lg]
        lo, hi = cnt[:3], cnt[3:]
        na = n // 8
        k = {"z": Signal(name=f"{name}_z"),
             "gt_hi": [Signal(name=f"{name}_gth{a}") for a in range(na)],
             "eq_hi": [Signal(name=f"{name}_eqh{a}") for a in range(na)],
             "gt_lo": [Signal(name=f"{name}_gtl{b}") for b in range(8)],
             "cnt": Signal(lg, name=f"{name}_cnt")}
        m.d.sync += [k["z"].eq(cnt == 0), k["cnt"].eq(cnt)]
        # (no compare against the largest value: it would be constant)
        m.d.sync += [k["gt_lo"][b].eq(lo > b if b < 7 else 0) for b in range(8)]
        for a_ in range(na):
            if len(hi):
                m.d.sync += [k["gt_hi"][a_].eq(hi > a_ if a_ < na - 1 else 0),
                             k["eq_hi"][a_].eq(hi == a_)]
            else:
                m.d.sync += [k["gt_hi"][a_].eq(0), k["eq_hi"][a_].eq(1)]
        return k

    def _keep_lanes(self, m, k, name):
        """``keep`` of the payload bytes in the last beat (``pk``), the same rounded up to 4
        bytes (``lik``, PadCnt), from :meth:`_keep_decode` flags: one LUT per lane; and the lanes
        set in ``pk`` (``pkc``: the byte count, 0 meaning all, is ``n`` when ``cnt == 0``)."""
        n = self._n
        pk = Signal(n, name=f"{name}_pk")
        lik = Signal(n, name=f"{name}_lik")
        m.d.comb += [pk[j].eq(k["z"] | k["gt_hi"][j >> 3] |
                              (k["eq_hi"][j >> 3] & k["gt_lo"][j & 7])) for j in range(n)]
        # every 4-byte group that has a payload byte is kept whole
        m.d.comb += lik.eq(Cat(*[pk[j & ~3] for j in range(n)]))
        pkc = Signal(n.bit_length(), name=f"{name}_pkc")
        m.d.comb += pkc.eq(Cat(k["cnt"], k["z"]))
        return pk, lik, pkc

    def _precompute(self, m, rem, reth, imm, name, opcode=None, hz=None, nib=None, lo_nz=None,
                    nz4=None):
        """What the load needs of ``rem`` bytes from the first packet to send (see
        :meth:`_pre_shapes`), computed before the PMTU is known. ``hz`` is "``rem[14:]`` is
        zero" (computed here if not given): every test below then looks at 14 bits at most,
        which keeps Yosys from chaining the wide zero tests. ``nib``, if given, are registered
        "``rem[4 i:4 i + 4]`` is not zero" flags for the nibbles below bit 16, which the zero
        tests then use in place of the bits: no test is more than one LUT of its inputs, and
        no prefix OR is left for the mapper to chain. ``lo_nz``, if given, is "``rem`` is not
        a multiple of the beat" and ``nz4`` "... of 4" (see :meth:`_last_lengths`)."""
        if hz is None:
            hz = Signal(name=f"{name}_hz")
            m.d.comb += hz.eq(~rem[_HZ:].any())

        def any_of(lo, hi):
            """``rem[lo:hi]`` is not zero (``hi`` <= 14)."""
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

        out = {"le": Signal(len(_PMTU_CODES), name=f"{name}_le"),
               "nz": Signal(name=f"{name}_nz")}
        for i, c in enumerate(_PMTU_CODES):
            k = 7 + c
            # rem <= 2**k
            m.d.comb += out["le"][i].eq(hz & ~any_of(k + 1, _HZ) &
                                        (~rem[k] | ~any_of(0, k)))
        m.d.comb += out["nz"].eq(~hz | any_of(0, _HZ))
        out["tl"], out["ul"], out["beats"] = self._last_lengths(m, rem, reth, imm, name, opcode,
                                                                any_of=any_of, lo_nz=lo_nz,
                                                                nz4=nz4)
        return out

    # ------------------------------------------------------------------ accept
    def _accept(self, m):
        cfg = self._config
        qw = qp_index_width(cfg.n_qp)
        a = {
            "valid": Signal(name="a_valid"),
            "ready": Signal(name="a_ready"),      # the values below are valid (a resume: later)
            "res": Signal(name="a_resume"),
            "wr": Signal(wr_layout(cfg), name="a_wr"),
            "spkt": Signal(23, name="a_start_packet"),
            "spsn": Signal(24, name="a_start_psn"),
            "first": Signal(name="a_first"),      # the first packet to send is the message's first
            "reth": Signal(name="a_reth"), "imm": Signal(name="a_imm"),
            "bad_qp": Signal(name="a_bad_qp"), "bad_op": Signal(name="a_bad_op"),
            "bad_len": Signal(name="a_bad_len"), "bad_res": Signal(name="a_bad_resume"),
            "rem": Signal(32, name="a_rem"),      # bytes from the first packet to send on
            # lengths of a first packet that is also the last, and rem <= PMTU per PMTU code:
            # from the WR as it is taken (w_*) or computed for a resume (r_*)
            "w": {key: Signal(shape, name=f"a_w_{key}") for key, shape in self._pre_shapes()},
            "r": {key: Signal(shape, name=f"a_r_{key}") for key, shape in self._pre_shapes()},
            "hit": Signal(name="a_hit"), "hpsn": Signal(24, name="a_hit_psn"),
            "herr": Signal(name="a_hit_err"),
            "fresh": Signal(name="a_fresh"),      # a_hit* were looked up for this request
            "take": Signal(name="a_take"),        # the emitter takes the request this cycle
        }
        go_r = Signal()
        go_w = Signal()
        free = Signal()
        m.d.comb += [
            free.eq(~a["valid"]),         # (not in the cycle it is taken: keeps `go` shallow)
            self.resume.ready.eq(free),
            self.wr.ready.eq(free & ~self.resume.valid),
            go_r.eq(self.resume.valid & self.resume.ready),
            go_w.eq(self.wr.valid & self.wr.ready),
        ]
        wr_in = Signal(wr_layout(cfg))      # the WR part of whichever request is taken
        for name, _ in wr_layout(cfg):
            m.d.comb += wr_in[name].eq(Mux(self.resume.valid, self.resume.payload[name],
                                           self.wr.payload[name]))
        m.d.comb += [self.qp_rd.addr.eq(wr_in.qp), self.qp_rd.en.eq(go_r | go_w)]
        reth = Signal()
        imm = Signal()
        m.d.comb += [reth.eq((wr_in.opcode == _WRITES[0]) | (wr_in.opcode == _WRITES[1])),
                     imm.eq((wr_in.opcode == _WITH_IMM[0]) | (wr_in.opcode == _WITH_IMM[1]))]
        length = self.wr.payload.length
        # The precompute of a WR: from the WR port while the accept register is empty, then
        # from the WR taken (the same values again), so its registers load in every cycle with
        # no enable (an enable folded into the LUT before the register lengthened this cone).
        # The multiplexers read copies of a_valid and of the WR's length and opcode, kept for
        # them alone: the originals also feed the emitter's wide descriptor register, which
        # pulls them away from this cone (ECP5 routing of 2 ns on its first hop). The copies'
        # logic differs from the originals' (an inverted valid; a WR part that follows the
        # request ports while the register is empty), so no pass merges them.
        p_empty = Signal(init=1, name="a_pre_empty")
        p_len = Signal(32, name="a_pre_len")
        p_op = Signal.like(self.wr.payload.opcode, name="a_pre_op")
        with m.If(p_empty):
            m.d.sync += [p_len.eq(wr_in.length), p_op.eq(wr_in.opcode)]
        pre_len = Signal(32)
        pre_op = Signal.like(self.wr.payload.opcode)
        m.d.comb += [pre_len.eq(Mux(p_empty, length, p_len)),
                     pre_op.eq(Mux(p_empty, self.wr.payload.opcode, p_op))]
        # The beat count's carry in ("bytes below a beat") as two keep wires: from the port's
        # own bits, then that or its registered copy while the accept register is full (the
        # same WR; a resume uses the `r` precompute, not this one): without them the mapper
        # built it from pre_len's multiplexed bits in a chain of four LUTs in front of the
        # carry chain (7 cells at 64 bits).
        def port_flag(value, name):
            """``value`` of the port's length, or its registered copy while the accept
            register is full (the same WR), as a keep wire."""
            port = Signal(name=f"{name}_port", attrs={"keep": 1})
            flag = Signal(name=name, attrs={"keep": 1})
            reg = Signal(name=f"{name}_reg")
            m.d.comb += [port.eq(value), flag.eq(Mux(p_empty, port, reg))]
            m.d.sync += reg.eq(flag)
            return flag

        w_lo_nz = port_flag(length[:self._lg].any(), "w_lo_nz")
        # (and the carry in of the length adders: `pre_len`'s multiplexed bits and their OR
        # were two LUTs in front of the carry chain; only where a beat is 8 bytes: with more,
        # ABC builds the beat flag's OR from this one, a LUT level more, 7 cells at 128 bits)
        w_nz4 = port_flag(length[:2].any(), "w_nz4") if self._lg <= 3 else None
        # the zero tests of the PMTU compares the same way (the resume's precompute has them
        # as registers): "the high part is zero", "nibble i is not zero" (ECP5: built from the
        # multiplexed length bits, the compares were 7-8 cells deep)
        w_hz = port_flag(~length[_HZ:].any(), "w_hz")
        w_nib = [port_flag(length[4 * i:4 * i + 4].any(), f"w_nib{i}") for i in range(4)]
        pre_w = self._precompute(m, pre_len, reth, imm, "w", opcode=pre_op, hz=w_hz, nib=w_nib,
                                 lo_nz=w_lo_nz, nz4=w_nz4)
        with m.If(go_r | go_w):
            m.d.sync += [
                a["valid"].eq(1), a["wr"].eq(wr_in), a["res"].eq(go_r),
                a["bad_qp"].eq(wr_in.qp >= cfg.n_qp) if cfg.n_qp < (1 << qw) else a["bad_qp"].eq(0),
                a["bad_op"].eq(wr_in.opcode > 3),
                a["bad_len"].eq(wr_in.length[31] & (wr_in.length[:31] != 0)),
                a["spkt"].eq(self.resume.payload.start_packet),
                a["spsn"].eq(self.resume.payload.start_psn),
                a["first"].eq(~go_r | (self.resume.payload.start_packet == 0)),
                a["reth"].eq(reth & (~go_r | (self.resume.payload.start_packet == 0))),
                a["imm"].eq(imm),
                a["bad_res"].eq(0),
                a["ready"].eq(go_w), a["rem"].eq(length),
            ]
        m.d.sync += [a["w"][key].eq(pre_w[key]) for key in pre_w]
        with m.If(a["valid"] & a["take"]):
            m.d.sync += a["valid"].eq(0)
        with m.If(go_r | go_w):
            m.d.sync += p_empty.eq(0)
        with m.Elif(a["valid"] & a["take"]):
            m.d.sync += p_empty.eq(1)
        # The keep-mask compares and the packet counter's load flags per PMTU, one register set
        # for both kinds of request: from the WR port while the accept register is empty, then
        # from the request taken (a resume's rest has its length's low bits; its a_rem is final
        # from step 6).
        lg = self._lg
        k_src = Signal(lg)
        m.d.comb += k_src.eq(Mux(p_empty, length[:lg], p_len[:lg]))
        a["keep"] = self._keep_decode(m, k_src, "a_k")
        q_src = Signal(32)
        m.d.comb += q_src.eq(Mux(a["valid"], a["rem"], length))
        a["qz"] = {c: Signal(name=f"a_qz{c}") for c in _PMTU_CODES}
        m.d.sync += [a["qz"][c].eq(q_src[7 + c:7 + c + _Q_CHUNK] == 0) for c in _PMTU_CODES]
        # the newest write-back of the request's QP, looked up again every cycle it waits (the
        # result is for the request in the accept register unless that one was replaced; with
        # a registered look-up key, for the request of the cycle before: a request's first
        # result then comes a cycle after it was taken)
        m.d.comb += self.fwd_qp.eq(Mux(a["valid"], a["wr"].qp, wr_in.qp))
        first_look = C(0, 1) if self._fwd_registered else go_r | go_w
        m.d.sync += [a["hit"].eq(self.fwd_hit), a["hpsn"].eq(self.fwd_psn),
                     a["herr"].eq(self.fwd_err),
                     a["fresh"].eq(Mux(a["valid"], ~a["take"], first_look))]
        a["go_w"], a["go"], a["first_look"] = go_w, go_r | go_w, first_look
        return a

    # ------------------------------------------------------------------ resume preparation
    def _resume_prep(self, m, a):
        """A resume request: offset = start_packet * PMTU (the row's), rest = length - offset
        12 bits per cycle (shift registers, no multiplexer by step), then the checks and the
        precomputes from the rest, one step per cycle. Step 0 copies the row's PMTU code: the
        offset's multiplexer then reads a register of its own, not the row's (ECP5 timing)."""
        row = self.qp_rd.data
        step = Signal(9, init=1, name="res_step")   # one-hot: each step enables with one AND
        off = Signal(36, name="res_off")
        lsh = Signal(36, name="res_len")
        rest = Signal(36, name="res_rest")
        borrow = Signal(name="res_borrow")
        zero = Signal(name="res_zero")
        going = Signal()
        m.d.comb += going.eq(a["valid"] & a["res"] & ~a["ready"])
        off_in = Signal(36)
        code = Signal.like(row.pmtu, name="res_pmtu")
        with m.If(going & step[0]):
            m.d.sync += code.eq(row.pmtu)
        with m.Switch(code):
            for c in _PMTU_CODES:
                with m.Case(c):
                    m.d.comb += off_in.eq(a["spkt"] << (7 + c))
        # lsh - off - borrow as one adder: lsh + ~off + (1 - borrow), carry out = no borrow
        acc = Signal(14, name="res_acc")
        m.d.comb += acc.eq(Cat(C(1, 1), lsh[:12]) + Cat(~borrow, ~off[:12]))
        part = Signal(13, name="res_part")
        m.d.comb += part.eq(Cat(acc[1:13], ~acc[13]))
        # The precomputes from the rest in two register stages: a_rem is final from step 6;
        # its low bits, "the high part is zero" and "nibble i is not zero" registered from
        # step 7 (`zero` is then one LUT of them); the precomputes from step 8, taken at step 9.
        r_rem = Signal(_HZ, name="res_rem")
        r_hz = Signal(name="res_hz")
        r_nib = [Signal(name=f"res_nib{i}") for i in range(4)]
        m.d.sync += [r_rem.eq(a["rem"][:_HZ]), r_hz.eq(~a["rem"][_HZ:].any())]
        m.d.sync += [r_nib[i].eq(a["rem"][4 * i:4 * i + 4].any()) for i in range(4)]
        m.d.comb += zero.eq(r_hz & ~Cat(*r_nib).any())
        pre_r = self._precompute(m, r_rem, a["reth"], a["imm"], "r", hz=r_hz, nib=r_nib)
        with m.If(going):
            m.d.sync += step.eq(step.rotate_left(1))
        with m.If(going & step[1]):
            m.d.sync += [off.eq(off_in), lsh.eq(a["wr"].length), borrow.eq(0)]
        with m.If(going & (step[2] | step[3] | step[4])):
            m.d.sync += [borrow.eq(part[12]), rest.eq(Cat(rest[12:], part[:12])),
                         off.eq(off[12:]), lsh.eq(lsh[12:])]
        with m.If(going & step[5]):
            m.d.sync += a["rem"].eq(Mux(borrow, 0, rest[:32]))
        # not a packet of the message: past its end (a_rem is 0 then), or past byte 0 of a
        # 0-byte one
        with m.If(going & step[7] & (borrow | (zero & ~a["first"]))):
            m.d.sync += a["bad_res"].eq(1)
        a["ready_set"] = Signal(name="a_ready_set")     # a resume's values are final now
        m.d.comb += a["ready_set"].eq(going & step[8])
        with m.If(a["ready_set"]):
            m.d.sync += [a["ready"].eq(1)]
        # (computed every cycle from res_*, which no longer change after step 7)
        m.d.sync += [a["r"][key].eq(pre_r[key]) for key in pre_r]

    # ------------------------------------------------------------------ emit
    def _emit(self, m, a):
        cfg = self._config
        n, lg = self._n, self._lg
        npm = len(_PMTU_CODES)
        row = self.qp_rd.data
        d = Signal(desc_layout(cfg), name="d")      # the descriptor on `o`
        d_valid = Signal(name="d_valid")
        adv = Signal(name="adv")                    # make the message's next descriptor now
        # the message beyond the descriptor
        q = FastCounter(m, 24, "m_q", down=True, chunk=_Q_CHUNK)  # full PMTU packets left,
        assert q.flag_bits == (_Q_CHUNK,)                         # d's included
        psn = FastCounter(m, 24, "psn")             # d's PSN
        index = FastCounter(m, 23, "index")         # d's packet index
        eq1 = Signal(name="m_q_eq1")
        eq2 = Signal(name="m_q_eq2")
        eq3 = Signal(name="m_q_eq3")
        r = Signal(13, name="m_r")                  # bytes of a partial last packet (0: none)
        r_nz = Signal(name="m_r_nz")
        pmtu_b = Signal(13, name="m_pmtu_bytes")
        pmtu_beats = Signal(13 - lg, name="m_pmtu_beats")
        full = {key: Signal(16, name=f"m_full_{key}") for key in ("tl", "ul", "tl_i", "ul_i")}
        ackcnt = Signal(range(max(2, cfg.ack_req_every)), name="m_ackcnt")
        wrop = Signal(2, name="m_op")
        solicited = Signal(name="m_solicited")
        has_imm = Signal(name="m_has_imm")
        tag = Signal(name="m_tag")                  # tag of the next message loaded
        m.d.comb += [self.o.valid.eq(d_valid), self.o.payload.eq(d),
                     self.o.payload.bth.psn.eq(psn.value), self.o.payload.psn_next.eq(psn.step),
                     self.o.payload.index.eq(index.value)]

        xfer = Signal()
        flushed = Signal()
        load = Signal()
        # "the accept register holds a request to load" (a_valid & a_ready & a_fresh) as a
        # flip-flop of its own, from the next values of the three: `load`, which selects the
        # whole descriptor register's input, is then one LUT of flip-flops (ECP5 timing). A
        # request taken (a_valid low) is ready and fresh at once only for a WR without the
        # registered look-up; one held stays fresh until it is loaded, and a resume becomes
        # ready at its last preparation step.
        req_ok = Signal(name="a_req_ok")
        m.d.sync += req_ok.eq(Mux(a["valid"], ~load & (a["ready"] | a["ready_set"]),
                                  a["first_look"] & a["go_w"]))
        m.d.comb += [
            xfer.eq(self.o.valid & self.o.ready),
            flushed.eq(self.flush_valid & (self.flush_tag == d.tag)),
            load.eq(req_ok & ~d_valid & ~adv),
            a["take"].eq(load),
        ]

        # -------- load: the first packet to send of the request in the accept register
        w = a["wr"]
        code = row.pmtu
        # With `fwd_registered`, a request is loaded two cycles after it was taken at the
        # earliest (its look-up is a cycle late), and everything below that depends on the
        # request and its QP row alone is final from the cycle after it was taken (a resume's
        # from step 8, the cycle before it is ready): those values are then registered here,
        # so that the row's PMTU code and the multiplexers it selects are a cycle off the path
        # to the descriptor register (ECP5 timing: that path crossed the block twice).
        staged = self._fwd_registered

        def stage(value, name):
            if not staged:
                return value
            reg = Signal.like(value, name=f"{name}_st")
            m.d.sync += reg.eq(value)
            return reg

        l_pmtu_b = Signal(13)
        l_le = Signal()
        l_q = Signal(24)
        l_r = Signal(13)
        _select(m, code, [128 << c for c in _PMTU_CODES], l_pmtu_b)
        pre = {key: Signal(shape, name=f"l_{key}") for key, shape in self._pre_shapes()}
        for key in pre:
            m.d.comb += pre[key].eq(Mux(a["res"], a["r"][key], a["w"][key]))
        _select(m, code, [pre["le"][i] for i in range(npm)], l_le)
        _select(m, code, [a["rem"][7 + c:] for c in _PMTU_CODES], l_q)
        _select(m, code, [a["rem"][:7 + c] for c in _PMTU_CODES], l_r)
        bad_pmtu = Signal()
        m.d.comb += bad_pmtu.eq((code < _PMTU_CODES[0]) | (code > _PMTU_CODES[-1]))
        l_pmtu_b, l_le, l_q, l_r = (stage(l_pmtu_b, "l_pmtu_b"), stage(l_le, "l_le"),
                                    stage(l_q, "l_q"), stage(l_r, "l_r"))
        pre = {key: stage(value, f"l_{key}") for key, value in pre.items()}
        # "This cycle's write-back is of the request's QP" (`wb_req`) and "... of the first
        # descriptor's QP" (`wb_first`, with d.first folded in), as flip-flops compared a cycle
        # ahead from the write-back's `qp_next` (ECP5 timing: each compare was two LUTs in
        # front of the PSN counter's load or enable). A request is loaded a cycle after it was
        # taken at the earliest, and `fwd_qp` is its QP in the cycle before any cycle it is
        # loaded in; a descriptor's QP changes only with a load.
        wb_req = Signal(name="wb_is_req")
        wb_first = Signal(name="wb_is_first")
        eq_req = Signal()
        m.d.comb += eq_req.eq(self.wb.qp_next == self.fwd_qp)
        # (a request loaded now is in the accept register: compared with its QP there, not
        # through `fwd_qp`'s multiplexer of the ports, which is equal then)
        m.d.sync += [wb_req.eq(eq_req),
                     wb_first.eq(Mux(load, (self.wb.qp_next == w.qp) & ~a["res"],
                                     (self.wb.qp_next == d.qp) & d.first & ~adv))]
        wb_hit = Signal()
        m.d.comb += wb_hit.eq(self.wb.valid & wb_req)
        q_err = Signal()
        m.d.comb += q_err.eq(Mux(wb_hit, self.wb.err, a["hit"] & a["herr"]))
        op_err = Signal()
        m.d.comb += op_err.eq(a["bad_qp"] | a["bad_op"] | bad_pmtu | a["bad_res"] |
                              (row.state != proto.QPState.RTS) | q_err)
        refuse = Signal(5)
        m.d.comb += refuse.eq(Mux(op_err, WcStatus.LOC_QP_OP_ERR,
                                  Mux(a["bad_len"], WcStatus.LOC_LEN_ERR, 0)))
        refused = Signal()
        m.d.comb += refused.eq(op_err | a["bad_len"])
        l_psn = Signal(24)
        m.d.comb += l_psn.eq(Mux(a["res"], a["spsn"],
                                 Mux(wb_hit, self.wb.psn,
                                     Mux(a["hit"], a["hpsn"], row.next_psn))))
        # the counters' look-ahead flags of every source, chosen like the value
        wb_f = psn.load_flags(m, self.wb.psn, "wb_psn")
        l_psn_f = [Signal(name=f"l_psn_f{k}") for k in range(len(wb_f))]
        # (a resume's start PSN flags: registered with it, from the port)
        fs_port = psn.load_flags(m, self.resume.payload.start_psn, "res_psn")
        fs_reg = [Signal(name=f"a_spsn_f{k}") for k in range(len(fs_port))]
        with m.If(a["go"]):
            m.d.sync += [r.eq(f) for r, f in zip(fs_reg, fs_port)]
        row_f = [stage(f, f"row_psn_f{k}")
                 for k, f in enumerate(psn.load_flags(m, row.next_psn, "row_psn"))]
        for k, (fs, fh, fr) in enumerate(zip(fs_reg,
                                             psn.load_flags(m, a["hpsn"], "a_hpsn"), row_f)):
            m.d.comb += l_psn_f[k].eq(Mux(a["res"], fs, Mux(wb_hit, wb_f[k], Mux(a["hit"], fh,
                                                                                  fr))))
        l_q_f = [Signal(name=f"l_q_f{_Q_CHUNK}")]
        _select(m, code, [a["qz"][c] for c in _PMTU_CODES], l_q_f[0])
        l_q_f = [stage(l_q_f[0], "l_q_f")]
        l_pk, l_lik, l_pkc = self._keep_lanes(m, a["keep"], "l")
        # lengths of full packets: constants chosen by the PMTU code (and the variant)
        l_full = {}
        for key, (reth, imm) in {"tl": (0, 0), "ul": (0, 0), "tl_i": (0, 1), "ul_i": (0, 1),
                                 "tl_r": (1, 0), "ul_r": (1, 0)}.items():
            sub = proto.IPV4.size if key.startswith("ul") else 0
            l_full[key] = Signal(16, name=f"l_full_{key}")
            _select(m, code, [(128 << c) + self._l3_bytes(reth, imm) - sub
                              for c in _PMTU_CODES], l_full[key])
            l_full[key] = stage(l_full[key], f"l_full_{key}")
        l_imm = Signal()
        m.d.comb += l_imm.eq(a["imm"] & l_le)

        def bth_fields(first, last, wrop_v, solicited_v, name):
            """(opcode, se) of a packet of operation ``wrop_v``."""
            opcode = Signal(8, name=f"{name}_opcode")
            with m.Switch(Cat(last, first, wrop_v)):
                for op, seq in proto.WR_OPCODE_SEQUENCE.items():
                    for f in (0, 1):
                        for la in (0, 1):
                            low = seq[(3 if la else 0) if f else (2 if la else 1)]
                            with m.Case(la | (f << 1) | (int(op) << 2)):
                                m.d.comb += opcode.eq(int(proto.Transport.RC) | low)
            se = Signal(name=f"{name}_se")
            m.d.comb += se.eq(last & solicited_v & (wrop_v != proto.WrOpcode.RDMA_WRITE))
            return opcode, se

        l_opcode, l_se = bth_fields(a["first"], l_le, w.opcode[:2], w.solicited, "l")

        # -------- advance: the packet after the one on `o`
        n_last = Signal()
        n_part = Signal()          # the next packet is the partial last one
        m.d.comb += [n_last.eq((eq1 & r_nz) | (eq2 & ~r_nz)), n_part.eq(eq1)]
        # a partial last packet's lengths: constant per message, registered the cycle after the
        # load (the first advance comes two cycles after it at the earliest)
        r_len = self._last_lengths(m, r, C(0, 1), has_imm, "p")
        # its keep masks are the first packet's (functions of the byte count's low lg bits,
        # which a PMTU, a whole number of beats, leaves alone): loaded with it
        assert all((128 << c) % n == 0 for c in _PMTU_CODES)
        r_pk = Signal(self._n, name="m_r_pk")
        r_lik = Signal(self._n, name="m_r_lik")
        r_pkc = Signal.like(l_pkc, name="m_r_pkc")
        r_tl = Signal(16, name="m_r_tl")
        r_ul = Signal(16, name="m_r_ul")
        r_beats = Signal(len(r_len[2]), name="m_r_beats")
        m.d.sync += [r_tl.eq(r_len[0]), r_ul.eq(r_len[1]), r_beats.eq(r_len[2])]
        n_opcode, n_se = bth_fields(C(0, 1), n_last, wrop, solicited, "n")
        ack_wrap = Signal()
        m.d.comb += ack_wrap.eq(ackcnt == cfg.ack_req_every - 1)
        # q == 1, 2, 3, 4 (eq1..eq3 are set from these the cycle after a load: the first
        # advance is two cycles after it at the earliest)
        q_hz = Signal()
        q_eq = {k: Signal(name=f"m_q_is{k}") for k in (1, 2, 3, 4)}
        m.d.comb += q_hz.eq(~q.value[3:].any())
        m.d.comb += [q_eq[k].eq(q_hz & (q.value[:3] == k)) for k in q_eq]
        loaded = Signal(name="m_loaded")
        m.d.sync += loaded.eq(load)
        with m.If(loaded):
            m.d.sync += [eq1.eq(q_eq[1]), eq2.eq(q_eq[2]), eq3.eq(q_eq[3])]

        with m.If(xfer & ~d.last):
            m.d.sync += [adv.eq(1), d_valid.eq(0)]
        with m.If(adv):
            m.d.sync += psn.advance() + index.advance() + q.advance()
            m.d.sync += [
                adv.eq(0), d_valid.eq(1),
                d.first.eq(0), d.last.eq(n_last),
                d.pay_len.eq(Mux(n_part, r, pmtu_b)), d.has_pay.eq(1),
                d.beats.eq(Mux(n_part, r_beats, pmtu_beats)),
                d.pk.eq(Mux(n_part, r_pk, (1 << n) - 1)),
                d.lik.eq(Mux(n_part, r_lik, (1 << n) - 1)),
                d.pkc.eq(Mux(n_part, r_pkc, n)),
                d.tot_len.eq(Mux(n_part, r_tl, Mux(has_imm & n_last, full["tl_i"], full["tl"]))),
                d.udp_len.eq(Mux(n_part, r_ul, Mux(has_imm & n_last, full["ul_i"], full["ul"]))),
                d.reth.eq(0), d.imm.eq(has_imm & n_last),
                d.bth.opcode.eq(n_opcode), d.bth.se.eq(n_se),
                d.bth.pad_cnt.eq(Mux(n_part, -r[:2], 0)),
                d.bth.ack_req.eq(n_last | ack_wrap),
                eq1.eq(eq2), eq2.eq(eq3), eq3.eq(q_eq[4]),
                ackcnt.eq(Mux(ack_wrap, 0, ackcnt + 1)),
            ]
        with m.If(xfer & d.last):
            m.d.sync += d_valid.eq(0)

        # refresh of a waiting first descriptor by a write-back of its QP (the PSN of a
        # refused one too: it is not used, and the PSN counter's enable has an input less)
        refresh = Signal()
        m.d.comb += refresh.eq(d_valid & self.wb.valid & wb_first)
        with m.If(refresh):
            m.d.sync += psn.load(self.wb.psn, wb_f)
            with m.If(~d.refused & self.wb.err):
                m.d.sync += [d.refuse.eq(WcStatus.LOC_QP_OP_ERR), d.refused.eq(1),
                             d.last.eq(1)]
        with m.If(flushed):
            m.d.sync += [d_valid.eq(0), adv.eq(0)]

        with m.If(load):
            # (a new message's packets count from 0; `a_spkt` holds the resume port's value for
            # a WR too)
            m.d.sync += (psn.load(l_psn, l_psn_f) + index.load(Mux(a["res"], a["spkt"], 0)) +
                         q.load(l_q, l_q_f))
            m.d.sync += [
                d_valid.eq(1), tag.eq(~tag),
                d.qp.eq(w.qp), d.wr_id.eq(w.wr_id), d.tag.eq(tag), d.refuse.eq(refuse),
                d.refused.eq(refused),
                d.first.eq(~a["res"]), d.last.eq(l_le | refused), d.resumed.eq(a["res"]),
                d.has_payload.eq(pre["nz"]),
                d.pay_len.eq(Mux(l_le, a["rem"][:13], l_pmtu_b)),
                d.has_pay.eq(pre["nz"]),
                d.beats.eq(Mux(l_le, pre["beats"], l_pmtu_b >> lg)),
                d.pk.eq(Mux(l_le, l_pk, (1 << n) - 1)),
                d.lik.eq(Mux(l_le, l_lik, (1 << n) - 1)),
                d.pkc.eq(Mux(l_le, l_pkc, n)),
                # a last packet's lengths were computed with the request; a full first one
                # has the RETH of a WRITE and no ImmDt
                d.tot_len.eq(Mux(l_le, pre["tl"], Mux(a["reth"], l_full["tl_r"], l_full["tl"]))),
                d.udp_len.eq(Mux(l_le, pre["ul"], Mux(a["reth"], l_full["ul_r"], l_full["ul"]))),
                d.reth.eq(a["reth"]), d.imm.eq(l_imm),
                d.bth.opcode.eq(l_opcode), d.bth.se.eq(l_se), d.bth.migreq.eq(row.migreq),
                d.bth.pad_cnt.eq(Mux(l_le, -a["rem"][:2], 0)), d.bth.tver.eq(0),
                d.bth.p_key.eq(row.p_key), d.bth.dest_qp.eq(row.remote_qpn),
                d.bth.ack_req.eq(l_le | (cfg.ack_req_every == 1)),
                d.va.eq(w.remote_addr), d.r_key.eq(w.r_key), d.dma_length.eq(w.length),
                d.imm_data.eq(w.imm),
                d.remote_mac.eq(row.remote_mac), d.remote_ip.eq(row.remote_ip),
                d.udp_sport.eq(row.udp_sport), d.dscp.eq(row.dscp), d.ecn.eq(row.ecn),
                r.eq(l_r), r_nz.eq(l_r != 0), r_pk.eq(l_pk), r_lik.eq(l_lik), r_pkc.eq(l_pkc),
                pmtu_b.eq(l_pmtu_b), pmtu_beats.eq(l_pmtu_b >> lg),
                full["tl"].eq(l_full["tl"]), full["ul"].eq(l_full["ul"]),
                full["tl_i"].eq(l_full["tl_i"]), full["ul_i"].eq(l_full["ul_i"]),
                ackcnt.eq(0 if cfg.ack_req_every == 1 else 1),
                wrop.eq(w.opcode[:2]), solicited.eq(w.solicited), has_imm.eq(a["imm"]),
            ]
        return d
