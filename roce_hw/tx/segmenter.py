# SPDX-License-Identifier: BSD-2-Clause
"""Segmenter: work requests and resume requests + QP rows -> one packet descriptor per packet."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import layouts, proto
from ..config import EngineConfig
from ..qp_state import QPReadSignature, qp_index_width
from ..verbs import MAX_MESSAGE_BYTES, WcStatus, resume_layout, wr_layout
from .psn import WriteBackSignature

__all__ = ["desc_layout", "header_bytes", "Segmenter"]

_PMTU_CODES = tuple(int(c) for c in proto.PMTU_BYTES)          # 1..5
_WRITES = (proto.WrOpcode.RDMA_WRITE, proto.WrOpcode.RDMA_WRITE_WITH_IMM)
_WITH_IMM = (proto.WrOpcode.RDMA_WRITE_WITH_IMM, proto.WrOpcode.SEND_WITH_IMM)


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
    ``offset``          payload offset of this packet in the message, in bytes
    ``pay_len``         payload bytes of this packet (0 to 4096), pad not included
    ``beats``           payload beats of this packet (``ceil(pay_len / (W/8))``)
    ``tot_len``         IPv4 total length; ``udp_len``: UDP length
    ``reth``, ``imm``   the RETH / ImmDt header is present (the header variant)
    ``bth``             the BTH (PSN included), as :data:`roce_hw.layouts.BTH`
    ``va``, ``r_key``,  RETH fields (``remote_addr``, ``r_key``, message length)
    ``dma_length``
    ``imm_data``        ImmDt
    ``remote_mac``,     addressing from the QP row
    ``remote_ip``,
    ``udp_sport``,
    ``dscp``, ``ecn``
    ==================  =======================================================================
    """
    if not isinstance(config, EngineConfig):
        raise TypeError(f"expected an EngineConfig, not {config!r}")
    n = config.data_bytes
    return data.StructLayout({
        "qp": qp_index_width(config.n_qp), "wr_id": 64, "tag": 1, "refuse": 5,
        "first": 1, "last": 1, "resumed": 1, "has_payload": 1,
        "offset": 32, "pay_len": 13, "beats": 13 - (n - 1).bit_length(),
        "tot_len": 16, "udp_len": 16, "reth": 1, "imm": 1,
        "bth": layouts.BTH,
        "va": 64, "r_key": 32, "dma_length": 32, "imm_data": 32,
        "remote_mac": 48, "remote_ip": 32, "udp_sport": 16, "dscp": 6, "ecn": 2,
    })


def _le_pow2(value, k):
    """``value <= 2**k`` with no carry chain (zero tests only)."""
    return (value[k:] == 0) | ((value[k:] == 1) & (value[:k] == 0))


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
    PSN ``start_psn``: the rest goes out as MIDDLE/LAST without a RETH, as rxe resends it.

    PSN. A new message's first packet takes the QP's ``next_psn``, newest write-back first
    (``fwd_*``, a :class:`~roce_hw.tx.psn.PsnForward`, and ``wb`` while the descriptor waits on
    ``o``); its other packets count on from it. A QP the write-backs moved to ERROR refuses new
    messages. ``flush`` drops the rest of the message with that tag (the packet builder gave it
    up). The segmenter writes nothing back: that is done when packets are committed.

    Refusals (one descriptor, ``refuse`` != 0, ``last`` = 1): QP index >= ``n_qp``, QP not in RTS
    (or in ERROR by a write-back), PMTU code not 1..5, opcode not one of the four, a resume whose
    ``start_packet`` is not a packet of the message (``LOC_QP_OP_ERR``); ``length`` > 2**31
    (``LOC_LEN_ERR``).

    Latency: a request transferred in cycle 0 has its first descriptor valid on ``o`` in cycle 2
    (a resume request with ``start_packet`` > 0 in cycle 4). Throughput: one descriptor per
    cycle, the next message's first one in the cycle after the last one of the message before.
    ``o`` comes from registers; ``wr``/``resume`` wait while the accept register is full.

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

    def __init__(self, config):
        if not isinstance(config, EngineConfig):
            raise TypeError(f"expected an EngineConfig, not {config!r}")
        self._config = config
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

    # Header sizes by variant: IPv4 + UDP + BTH [+ RETH] [+ ImmDt] + iCRC
    @staticmethod
    def _l3_bytes(reth, imm):
        return header_bytes(proto.IPV4, proto.UDP, proto.BTH) + proto.ICRC_BYTES + \
            (proto.RETH.size if reth else 0) + (proto.IMMDT.size if imm else 0)

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        self._n = cfg.data_bytes
        self._lg = (self._n - 1).bit_length()
        a = self._accept(m)
        self._resume_prep(m, a)
        self._emit(m, a)
        return m

    # ------------------------------------------------------------------ precomputes
    def _precompute(self, m, rem, reth, imm, prefix):
        """Values derived from ``rem`` (the bytes left at the first packet to send) with no
        PMTU known yet: for every PMTU code, ``rem - pmtu`` and ``rem <= pmtu`` /
        ``rem <= 2 * pmtu``; the lengths of the packet if it is the last one."""
        out = {}
        out["rem_m"] = [Signal(32, name=f"{prefix}_rem_m{c}") for c in _PMTU_CODES]
        out["le"] = Signal(len(_PMTU_CODES), name=f"{prefix}_le")
        out["le2"] = Signal(len(_PMTU_CODES), name=f"{prefix}_le2")
        for i, c in enumerate(_PMTU_CODES):
            k = 7 + c
            m.d.comb += [out["rem_m"][i].eq(rem - (1 << k)),
                         out["le"][i].eq(_le_pow2(rem, k)),
                         out["le2"][i].eq(_le_pow2(rem, k + 1))]
        out["tl"], out["ul"], out["beats"] = self._last_lengths(m, rem, reth, imm, prefix)
        return out

    def _last_lengths(self, m, rem, reth, imm, prefix):
        """IPv4 total length, UDP length and payload beats of a last packet of ``rem`` bytes:
        one adder each, of the padded length without its two low bits and a constant chosen
        by the header variant and "``rem`` is not a multiple of 4"."""
        tl = Signal(16, name=f"{prefix}_tl")
        ul = Signal(16, name=f"{prefix}_ul")
        beats = Signal(13 - self._lg, name=f"{prefix}_beats")
        nz4 = Signal(name=f"{prefix}_nz4")
        b_tl = Signal(8, name=f"{prefix}_b_tl")
        m.d.comb += nz4.eq(rem[:2] != 0)
        with m.Switch(Cat(nz4, imm, reth)):
            for c in range(8):
                with m.Case(c):
                    m.d.comb += b_tl.eq(self._l3_bytes(c >> 2, (c >> 1) & 1) + 4 * (c & 1))
        a4 = Cat(C(0, 2), rem[2:13])
        m.d.comb += [
            tl.eq(a4 + b_tl),
            ul.eq(a4 + (b_tl - proto.IPV4.size)),
            beats.eq((rem[:13] + (self._n - 1)) >> self._lg),
        ]
        return tl, ul, beats

    # ------------------------------------------------------------------ accept
    def _accept(self, m):
        cfg = self._config
        qw = qp_index_width(cfg.n_qp)
        a = {
            "valid": Signal(name="a_valid"),
            "ready": Signal(name="a_ready"),      # precomputes valid (a resume needs a few cycles)
            "res": Signal(name="a_resume"),
            "w": Signal(wr_layout(cfg), name="a_wr"),
            "spkt": Signal(23, name="a_start_packet"),
            "spsn": Signal(24, name="a_start_psn"),
            "first": Signal(name="a_first"),
            "bad_qp": Signal(name="a_bad_qp"),
            "bad_op": Signal(name="a_bad_op"),
            "bad_len": Signal(name="a_bad_len"),
            "bad_res": Signal(name="a_bad_resume"),
            "rem": Signal(32, name="a_rem"),
            "rem_m": [Signal(32, name=f"a_rem_m{c}") for c in _PMTU_CODES],
            "le": Signal(len(_PMTU_CODES), name="a_le"),
            "le2": Signal(len(_PMTU_CODES), name="a_le2"),
            "tl": Signal(16, name="a_tl"), "ul": Signal(16, name="a_ul"),
            "beats": Signal(13 - self._lg, name="a_beats"),
            "off": Signal(36, name="a_off"),
            "take": Signal(name="a_take"),       # the emitter takes the request this cycle
        }
        go_r = Signal()
        go_w = Signal()
        free = Signal()
        m.d.comb += [
            free.eq(~a["valid"] | a["take"]),
            self.resume.ready.eq(free),
            self.wr.ready.eq(free & ~self.resume.valid),
            go_r.eq(self.resume.valid & self.resume.ready),
            go_w.eq(self.wr.valid & self.wr.ready),
            self.qp_rd.addr.eq(Mux(self.resume.valid, self.resume.payload.qp,
                                   self.wr.payload.qp)),
            self.qp_rd.en.eq(go_r | go_w),
        ]
        w = self.wr.payload
        op = Signal(4)
        m.d.comb += op.eq(w.opcode)
        reth = Signal()
        imm = Signal()
        m.d.comb += [reth.eq((op == _WRITES[0]) | (op == _WRITES[1])),
                     imm.eq((op == _WITH_IMM[0]) | (op == _WITH_IMM[1]))]
        pre = self._precompute(m, w.length, reth, imm, "w")
        wr_in = Signal(wr_layout(cfg))      # the WR part of whichever request is taken
        for name, _ in wr_layout(cfg):
            m.d.comb += wr_in[name].eq(Mux(go_r, self.resume.payload[name], w[name]))
        with m.If(go_r | go_w):
            m.d.sync += [a["valid"].eq(1), a["w"].eq(wr_in), a["res"].eq(go_r)]
        with m.Elif(a["take"]):
            m.d.sync += a["valid"].eq(0)
        opr, qp_in, len_in = wr_in.opcode, wr_in.qp, wr_in.length
        with m.If(go_r | go_w):
            m.d.sync += [
                a["bad_qp"].eq(qp_in >= cfg.n_qp) if cfg.n_qp < (1 << qw) else a["bad_qp"].eq(0),
                a["bad_op"].eq(opr > 3),
                a["bad_len"].eq(len_in[31] & (len_in[:31] != 0)),
                a["spkt"].eq(Mux(go_r, self.resume.payload.start_packet, 0)),
                a["spsn"].eq(self.resume.payload.start_psn),
                a["first"].eq(~go_r | (self.resume.payload.start_packet == 0)),
                a["bad_res"].eq(0),
                a["off"].eq(0),
            ]
        with m.If(go_w):
            m.d.sync += [a["ready"].eq(1), a["rem"].eq(w.length), a["le"].eq(pre["le"]),
                         a["le2"].eq(pre["le2"]), a["tl"].eq(pre["tl"]), a["ul"].eq(pre["ul"]),
                         a["beats"].eq(pre["beats"])]
            m.d.sync += [a["rem_m"][i].eq(pre["rem_m"][i]) for i in range(len(_PMTU_CODES))]
        with m.If(go_r):
            m.d.sync += a["ready"].eq(0)
        return a

    # ------------------------------------------------------------------ resume preparation
    def _resume_prep(self, m, a):
        """A resume request with ``start_packet`` = j: offset = j * PMTU (the row's), rest =
        length - offset, then the precomputes from the rest, one step per cycle."""
        row = self.qp_rd.data
        step = Signal(2, name="res_step")    # 0: offset, 1: rest, 2: precomputes
        going = Signal()
        m.d.comb += going.eq(a["valid"] & a["res"] & ~a["ready"])
        off = Signal(36)
        with m.Switch(row.pmtu):
            for c in _PMTU_CODES:
                with m.Case(c):
                    m.d.comb += off.eq(a["spkt"] << (7 + c))
        rest = Signal(37)
        m.d.comb += rest.eq(Cat(a["w"].length, C(0, 5)) - a["off"])
        w = a["w"]
        reth = Signal()
        imm = Signal()
        m.d.comb += [reth.eq(((w.opcode == _WRITES[0]) | (w.opcode == _WRITES[1])) & a["first"]),
                     imm.eq((w.opcode == _WITH_IMM[0]) | (w.opcode == _WITH_IMM[1]))]
        pre = self._precompute(m, a["rem"], reth, imm, "r")
        with m.If(going):
            m.d.sync += step.eq(step + 1)
            with m.Switch(step):
                with m.Case(0):
                    m.d.sync += a["off"].eq(off)
                with m.Case(1):
                    # not a packet of the message: past its end, or past byte 0 of a 0-byte one
                    m.d.sync += [a["rem"].eq(Mux(rest[36], 0, rest[:32])),
                                 a["bad_res"].eq(rest[36] | ((rest[:32] == 0) & ~a["first"]))]
                with m.Case(2):
                    m.d.sync += [a["ready"].eq(1), step.eq(0), a["le"].eq(pre["le"]),
                                 a["le2"].eq(pre["le2"]), a["tl"].eq(pre["tl"]),
                                 a["ul"].eq(pre["ul"]), a["beats"].eq(pre["beats"])]
                    m.d.sync += [a["rem_m"][i].eq(pre["rem_m"][i])
                                 for i in range(len(_PMTU_CODES))]

    # ------------------------------------------------------------------ emit
    def _emit(self, m, a):
        cfg = self._config
        n, lg = self._n, self._lg
        row = self.qp_rd.data
        d = Signal(desc_layout(cfg), name="d")      # the descriptor on `o`
        d_valid = Signal(name="d_valid")
        # message state beyond the descriptor
        rem_next = Signal(32, name="m_rem_next")    # bytes left after the packet on `o`
        le2 = Signal(name="m_le2")                  # rem_next <= PMTU (the next one is last)
        code = Signal(3, name="m_pmtu")
        pmtu_b = Signal(13, name="m_pmtu_bytes")
        ackcnt = Signal(range(max(2, cfg.ack_req_every)), name="m_ackcnt")
        wrop = Signal(2, name="m_op")
        solicited = Signal(name="m_solicited")
        tag = Signal(name="m_tag")                  # tag of the next message loaded
        m.d.comb += [self.o.valid.eq(d_valid), self.o.payload.eq(d)]

        xfer = Signal()
        m.d.comb += xfer.eq(self.o.valid & self.o.ready)
        flushed = Signal()
        m.d.comb += flushed.eq(self.flush_valid & (self.flush_tag == d.tag))
        free = Signal()
        m.d.comb += free.eq(~d_valid | (xfer & d.last) | flushed)
        load = Signal()
        m.d.comb += [
            load.eq(a["valid"] & a["ready"] & free),
            a["take"].eq(load),
            self.fwd_qp.eq(a["w"].qp),
        ]

        # -------- load: the first packet to send of the request in the accept register
        w = a["w"]
        l_pmtu_b = Signal(13)
        l_le = Signal()
        l_le2 = Signal()
        l_rem_m = Signal(32)
        _select(m, row.pmtu, [128 << c for c in _PMTU_CODES], l_pmtu_b)
        _select(m, row.pmtu, [a["le"][i] for i in range(len(_PMTU_CODES))], l_le)
        _select(m, row.pmtu, [a["le2"][i] for i in range(len(_PMTU_CODES))], l_le2)
        _select(m, row.pmtu, a["rem_m"], l_rem_m)
        bad_pmtu = Signal()
        m.d.comb += bad_pmtu.eq((row.pmtu < _PMTU_CODES[0]) | (row.pmtu > _PMTU_CODES[-1]))
        op_err = Signal()
        m.d.comb += op_err.eq(a["bad_qp"] | a["bad_op"] | bad_pmtu | a["bad_res"] |
                              (row.state != proto.QPState.RTS) | (self.fwd_hit & self.fwd_err))
        refuse = Signal(5)
        m.d.comb += refuse.eq(Mux(op_err, WcStatus.LOC_QP_OP_ERR,
                                  Mux(a["bad_len"], WcStatus.LOC_LEN_ERR, 0)))
        l_last = Signal()
        m.d.comb += l_last.eq(l_le | (refuse != 0))
        l_psn = Signal(24)
        m.d.comb += l_psn.eq(Mux(a["res"], a["spsn"], Mux(self.fwd_hit, self.fwd_psn,
                                                            row.next_psn)))
        tl_full = Signal(16)
        ul_full = Signal(16)
        l_reth = Signal()
        l_imm = Signal()
        m.d.comb += [
            l_reth.eq(((w.opcode == _WRITES[0]) | (w.opcode == _WRITES[1])) & a["first"]),
            l_imm.eq(((w.opcode == _WITH_IMM[0]) | (w.opcode == _WITH_IMM[1])) & l_le),
        ]
        # a full packet's lengths: constants chosen by the PMTU code and "has a RETH"
        _select(m, row.pmtu, [Mux(l_reth, (128 << c) + self._l3_bytes(1, 0),
                                  (128 << c) + self._l3_bytes(0, 0)) for c in _PMTU_CODES],
                tl_full)
        _select(m, row.pmtu, [Mux(l_reth, (128 << c) + self._l3_bytes(1, 0) - proto.IPV4.size,
                                  (128 << c) + self._l3_bytes(0, 0) - proto.IPV4.size)
                              for c in _PMTU_CODES], ul_full)

        def bth_fields(first, last, wrop_v, solicited_v):
            """(opcode, se) of a packet of operation ``wrop_v``."""
            opcode = Signal(8, name="bth_opcode")
            with m.Switch(Cat(last, first, wrop_v)):
                for op, seq in proto.WR_OPCODE_SEQUENCE.items():
                    for f in (0, 1):
                        for l in (0, 1):
                            low = seq[(3 if l else 0) if f else (2 if l else 1)]
                            with m.Case(l | (f << 1) | (int(op) << 2)):
                                m.d.comb += opcode.eq(int(proto.Transport.RC) | low)
            se = Signal(name="bth_se")
            m.d.comb += se.eq(last & solicited_v & (wrop_v != proto.WrOpcode.RDMA_WRITE))
            return opcode, se

        l_opcode, l_se = bth_fields(a["first"], l_le, w.opcode[:2], w.solicited)

        # -------- advance: the packet after the one on `o` (a full one, or the last)
        n_le = le2
        n_pay = Signal(13)
        n_tl, n_ul, n_beats = self._last_lengths(m, rem_next, C(0, 1), C(0, 1), "n")
        n_tl_i, n_ul_i, _ = self._last_lengths(m, rem_next, C(0, 1), C(1, 1), "ni")
        has_imm = Signal()
        m.d.comb += has_imm.eq((wrop == _WITH_IMM[0]) | (wrop == _WITH_IMM[1]))
        n_opcode, n_se = bth_fields(C(0, 1), n_le, wrop, solicited)
        n_full_tl = Signal(16)
        n_full_ul = Signal(16)
        m.d.comb += [
            n_full_tl.eq(pmtu_b + self._l3_bytes(0, 0)),
            n_full_ul.eq(pmtu_b + self._l3_bytes(0, 0) - proto.IPV4.size),
            n_pay.eq(Mux(n_le, rem_next[:13], pmtu_b)),
        ]
        n_le2 = Signal()
        le2_k = Signal(len(_PMTU_CODES))
        for i, c in enumerate(_PMTU_CODES):
            m.d.comb += le2_k[i].eq(_le_pow2(rem_next, 8 + c))
        _select(m, code, [le2_k[i] for i in range(len(_PMTU_CODES))], n_le2)
        ack_wrap = Signal()
        m.d.comb += ack_wrap.eq(ackcnt == cfg.ack_req_every - 1)

        with m.If(xfer & ~d.last):
            m.d.sync += [
                d.first.eq(0), d.last.eq(n_le),
                d.offset.eq(d.offset + pmtu_b),
                d.pay_len.eq(n_pay),
                d.beats.eq(Mux(n_le, n_beats, pmtu_b >> lg)),
                d.tot_len.eq(Mux(n_le, Mux(has_imm, n_tl_i, n_tl), n_full_tl)),
                d.udp_len.eq(Mux(n_le, Mux(has_imm, n_ul_i, n_ul), n_full_ul)),
                d.reth.eq(0), d.imm.eq(has_imm & n_le),
                d.bth.opcode.eq(n_opcode), d.bth.se.eq(n_se),
                d.bth.pad_cnt.eq(Mux(n_le, -rem_next[:2], 0)),
                d.bth.ack_req.eq(n_le | ack_wrap),
                d.bth.psn.eq(d.bth.psn + 1),
                rem_next.eq(rem_next - pmtu_b),
                le2.eq(n_le2),
                ackcnt.eq(Mux(ack_wrap, 0, ackcnt + 1)),
            ]
        with m.If(xfer & d.last):
            m.d.sync += d_valid.eq(0)

        # refresh of a waiting first descriptor by a write-back of its QP
        with m.If(d_valid & d.first & ~d.resumed & self.wb.valid & (self.wb.qp == d.qp) &
                  (d.refuse == 0)):
            m.d.sync += d.bth.psn.eq(self.wb.psn)
            with m.If(self.wb.err):
                m.d.sync += [d.refuse.eq(WcStatus.LOC_QP_OP_ERR), d.last.eq(1)]
        with m.If(flushed):
            m.d.sync += d_valid.eq(0)

        with m.If(load):
            m.d.sync += [
                d_valid.eq(1), tag.eq(~tag),
                d.qp.eq(w.qp), d.wr_id.eq(w.wr_id), d.tag.eq(tag), d.refuse.eq(refuse),
                d.first.eq(a["first"] & ~a["res"]), d.last.eq(l_last), d.resumed.eq(a["res"]),
                d.has_payload.eq(a["rem"] != 0),
                d.offset.eq(a["off"][:32]),
                d.pay_len.eq(Mux(l_le, a["rem"][:13], l_pmtu_b)),
                d.beats.eq(Mux(l_le, a["beats"], l_pmtu_b >> lg)),
                d.tot_len.eq(Mux(l_le, a["tl"], tl_full)),
                d.udp_len.eq(Mux(l_le, a["ul"], ul_full)),
                d.reth.eq(l_reth), d.imm.eq(l_imm),
                d.bth.opcode.eq(l_opcode), d.bth.se.eq(l_se), d.bth.migreq.eq(row.migreq),
                d.bth.pad_cnt.eq(Mux(l_le, -a["rem"][:2], 0)), d.bth.tver.eq(0),
                d.bth.p_key.eq(row.p_key), d.bth.dest_qp.eq(row.remote_qpn),
                d.bth.ack_req.eq(l_le | (cfg.ack_req_every == 1)), d.bth.psn.eq(l_psn),
                d.va.eq(w.remote_addr), d.r_key.eq(w.r_key), d.dma_length.eq(w.length),
                d.imm_data.eq(w.imm),
                d.remote_mac.eq(row.remote_mac), d.remote_ip.eq(row.remote_ip),
                d.udp_sport.eq(row.udp_sport), d.dscp.eq(row.dscp), d.ecn.eq(row.ecn),
                rem_next.eq(l_rem_m), le2.eq(l_le2), code.eq(row.pmtu), pmtu_b.eq(l_pmtu_b),
                ackcnt.eq(0 if cfg.ack_req_every == 1 else 1),
                wrop.eq(w.opcode[:2]), solicited.eq(w.solicited),
            ]
        return d
