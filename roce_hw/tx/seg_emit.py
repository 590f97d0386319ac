# SPDX-License-Identifier: BSD-2-Clause
"""The segmenter's emitter: a request record -> its message's packet descriptors."""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .. import proto
from ..config import check_config
from ..layouts import qp_index_width
from ..lib.arith import FastCounter
from ..verbs import WcStatus
from .psn import WriteBackSignature
from .seg_common import (BYTES_BITS, PMTU_CODES, Q_BITS, Q_CHUNK, desc_layout,
                         flush_signature, keep_lanes, l3_bytes, last_lengths, pre_layout,
                         request_layout, select_by_pmtu)

__all__ = ["DescriptorEmitter"]


class DescriptorEmitter(wiring.Component):
    """Request records -> packet descriptors (:func:`~roce_hw.tx.seg_common.desc_layout`).

    A request is loaded into the descriptor register as the first packet to send (or as its
    refusal) when the register is free; the message's later packets are made one at a time from
    the message registers (``q`` full PMTU packets left, the one on ``o`` included, ``r`` bytes
    of a partial last packet), the next descriptor chosen from flags (``q`` == 1, 2, 3) kept one
    step ahead, so no byte count is ever subtracted. PSNs: a new message's first packet takes the
    newest of the write-back of this cycle (``wb``), the request's look-up and its row's
    ``next_psn``, refreshed by a write-back of its QP while it waits on ``o``; its other packets
    count on. ``flush`` drops the rest of the message with that tag.

    Latency: a request transferred on ``i`` in cycle 0 is on ``o`` in cycle 1. Throughput: a
    message's next descriptor is on ``o`` two cycles after the one before it left; ``i`` is
    ready when the descriptor register is free (the cycle after the message's last descriptor
    left ``o``). ``o`` comes from registers.

    Parameters
    ----------
    config : EngineConfig
    fwd_registered : bool
        A request is loaded two cycles after it was taken at the earliest: what depends on the
        request and its row alone is then registered first (the row's PMTU code and the
        multiplexers it selects are a cycle off the path to the descriptor register).

    Members
    -------
    i : ``In(stream.Signature(request_layout(config)))``
    o : ``Out(stream.Signature(desc_layout(config)))``
    wb : ``In(WriteBackSignature(idx_width))``
    flush : ``In(flush_signature())``
    """

    def __init__(self, config, *, fwd_registered=False):
        self._config = check_config(config)
        self._fwd_registered = bool(fwd_registered)
        super().__init__({
            "i": In(stream.Signature(request_layout(config))),
            "o": Out(stream.Signature(desc_layout(config))),
            "wb": In(WriteBackSignature(qp_index_width(config.n_qp))),
            "flush": In(flush_signature()),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        n = cfg.data_bytes
        lg = (n - 1).bit_length()
        rq = self.i.payload                         # the request offered
        row = rq.row
        d = Signal(desc_layout(cfg), name="d")      # the descriptor on `o`
        d_valid = Signal(name="d_valid")
        adv = Signal(name="adv")                    # make the message's next descriptor now
        # the message beyond the descriptor
        q = FastCounter(m, Q_BITS, "m_q", down=True, chunk=Q_CHUNK)  # full PMTU packets left,
        assert q.flag_bits == (Q_CHUNK,)                             # d's included
        psn = FastCounter(m, proto.PSN_BITS, "psn")          # d's PSN
        index = FastCounter(m, len(d.index), "index")        # d's packet index
        eq1 = Signal(name="m_q_eq1")
        eq2 = Signal(name="m_q_eq2")
        eq3 = Signal(name="m_q_eq3")
        r = Signal(BYTES_BITS, name="m_r")          # bytes of a partial last packet (0: none)
        r_nz = Signal(name="m_r_nz")
        pmtu_b = Signal(BYTES_BITS, name="m_pmtu_bytes")
        pmtu_beats = Signal(BYTES_BITS - lg, name="m_pmtu_beats")
        full = {key: Signal(len(d.tot_len), name=f"m_full_{key}")
                for key in ("tl", "ul", "tl_i", "ul_i")}
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
        m.d.comb += [
            xfer.eq(self.o.valid & self.o.ready),
            flushed.eq(self.flush.valid & (self.flush.tag == d.tag)),
            self.i.ready.eq(~d_valid & ~adv),
            load.eq(self.i.valid & self.i.ready),
        ]

        # -------- load: the first packet to send of the request offered
        w = rq.wr
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

        l_pmtu_b = Signal(BYTES_BITS)
        l_le = Signal()
        l_q = Signal(Q_BITS)
        l_r = Signal(BYTES_BITS)
        select_by_pmtu(m, code, [proto.pmtu_bytes(c) for c in PMTU_CODES], l_pmtu_b)
        pre = Signal(pre_layout(cfg), name="l_pre")
        m.d.comb += pre.eq(Mux(rq.res, rq.r, rq.w))
        select_by_pmtu(m, code, [pre.le[i] for i in range(len(PMTU_CODES))], l_le)
        select_by_pmtu(m, code, [rq.rem[proto.pmtu_shift(c):] for c in PMTU_CODES], l_q)
        select_by_pmtu(m, code, [rq.rem[:proto.pmtu_shift(c)] for c in PMTU_CODES], l_r)
        bad_pmtu = Signal()
        m.d.comb += bad_pmtu.eq((code < PMTU_CODES[0]) | (code > PMTU_CODES[-1]))
        l_pmtu_b, l_le, l_q, l_r = (stage(l_pmtu_b, "l_pmtu_b"), stage(l_le, "l_le"),
                                    stage(l_q, "l_q"), stage(l_r, "l_r"))
        pre = stage(pre, "l_pre")
        # "This cycle's write-back is of the first descriptor's QP" (`wb_first`, with d.first
        # folded in) as a flip-flop compared a cycle ahead from the write-back's `qp_next`
        # (ECP5 timing: the compare was two LUTs in front of the PSN counter's load or enable);
        # a descriptor's QP changes only with a load. (`rq.wb_req` is the same for the request.)
        wb_first = Signal(name="wb_is_first")
        # (a request loaded now is compared with its QP in the record)
        m.d.sync += wb_first.eq(Mux(load, (self.wb.qp_next == w.qp) & ~rq.res,
                                    (self.wb.qp_next == d.qp) & d.first & ~adv))
        wb_hit = Signal()
        m.d.comb += wb_hit.eq(self.wb.valid & rq.wb_req)
        q_err = Signal()
        m.d.comb += q_err.eq(Mux(wb_hit, self.wb.err, rq.hit & rq.herr))
        op_err = Signal()
        m.d.comb += op_err.eq(rq.bad_qp | rq.bad_op | bad_pmtu | rq.bad_res |
                              (row.state != proto.QPState.RTS) | q_err)
        refuse = Signal(len(d.refuse))
        m.d.comb += refuse.eq(Mux(op_err, WcStatus.LOC_QP_OP_ERR,
                                  Mux(rq.bad_len, WcStatus.LOC_LEN_ERR, 0)))
        refused = Signal()
        m.d.comb += refused.eq(op_err | rq.bad_len)
        l_psn = Signal(proto.PSN_BITS)
        m.d.comb += l_psn.eq(Mux(rq.res, rq.spsn,
                                 Mux(wb_hit, self.wb.psn,
                                     Mux(rq.hit, rq.hpsn, row.next_psn))))
        # the counters' look-ahead flags of every source, chosen like the value (a resume's
        # start PSN flags come registered with it)
        wb_f = psn.load_flags(m, self.wb.psn, "wb_psn")
        l_psn_f = [Signal(name=f"l_psn_f{k}") for k in range(len(wb_f))]
        row_f = [stage(f, f"row_psn_f{k}")
                 for k, f in enumerate(psn.load_flags(m, row.next_psn, "row_psn"))]
        for k, (fh, fr) in enumerate(zip(psn.load_flags(m, rq.hpsn, "a_hpsn"), row_f)):
            m.d.comb += l_psn_f[k].eq(Mux(rq.res, rq.spsn_f[k],
                                          Mux(wb_hit, wb_f[k], Mux(rq.hit, fh, fr))))
        l_q_f = Signal(name=f"l_q_f{Q_CHUNK}")
        select_by_pmtu(m, code, [rq.qz[i] for i in range(len(PMTU_CODES))], l_q_f)
        l_q_f = [stage(l_q_f, "l_q_f")]
        l_pk, l_lik, l_pkc = keep_lanes(m, cfg, rq.keep, "l")
        # lengths of full packets: constants chosen by the PMTU code (and the variant)
        l_full = {}
        for key, (reth, imm) in {"tl": (0, 0), "ul": (0, 0), "tl_i": (0, 1), "ul_i": (0, 1),
                                 "tl_r": (1, 0), "ul_r": (1, 0)}.items():
            sub = proto.IPV4.size if key.startswith("ul") else 0
            l_full[key] = Signal(len(d.tot_len), name=f"l_full_{key}")
            select_by_pmtu(m, code, [proto.pmtu_bytes(c) + l3_bytes(reth, imm) - sub
                                     for c in PMTU_CODES], l_full[key])
            l_full[key] = stage(l_full[key], f"l_full_{key}")
        l_imm = Signal()
        m.d.comb += l_imm.eq(rq.imm & l_le)

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

        l_opcode, l_se = bth_fields(rq.first, l_le, w.opcode[:2], w.solicited, "l")

        # -------- advance: the packet after the one on `o`
        n_last = Signal()
        n_part = Signal()          # the next packet is the partial last one
        m.d.comb += [n_last.eq((eq1 & r_nz) | (eq2 & ~r_nz)), n_part.eq(eq1)]
        # a partial last packet's lengths: constant per message, registered the cycle after the
        # load (the first advance comes two cycles after it at the earliest)
        r_len = last_lengths(m, lg, r, C(0, 1), has_imm, "p")
        # its keep masks are the first packet's (functions of the byte count's low lg bits,
        # which a PMTU, a whole number of beats, leaves alone): loaded with it
        assert all(proto.pmtu_bytes(c) % n == 0 for c in PMTU_CODES)
        r_pk = Signal(n, name="m_r_pk")
        r_lik = Signal(n, name="m_r_lik")
        r_pkc = Signal.like(l_pkc, name="m_r_pkc")
        r_tl = Signal(len(d.tot_len), name="m_r_tl")
        r_ul = Signal(len(d.udp_len), name="m_r_ul")
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
            # (a new message's packets count from 0; `spkt` holds the resume port's value for
            # a WR too)
            m.d.sync += (psn.load(l_psn, l_psn_f) + index.load(Mux(rq.res, rq.spkt, 0)) +
                         q.load(l_q, l_q_f))
            m.d.sync += [
                d_valid.eq(1), tag.eq(~tag),
                d.qp.eq(w.qp), d.wr_id.eq(w.wr_id), d.tag.eq(tag), d.refuse.eq(refuse),
                d.refused.eq(refused),
                d.first.eq(~rq.res), d.last.eq(l_le | refused), d.resumed.eq(rq.res),
                d.has_payload.eq(pre.nz),
                d.pay_len.eq(Mux(l_le, rq.rem[:BYTES_BITS], l_pmtu_b)),
                d.has_pay.eq(pre.nz),
                d.beats.eq(Mux(l_le, pre.beats, l_pmtu_b >> lg)),
                d.pk.eq(Mux(l_le, l_pk, (1 << n) - 1)),
                d.lik.eq(Mux(l_le, l_lik, (1 << n) - 1)),
                d.pkc.eq(Mux(l_le, l_pkc, n)),
                # a last packet's lengths were computed with the request; a full first one
                # has the RETH of a WRITE and no ImmDt
                d.tot_len.eq(Mux(l_le, pre.tl, Mux(rq.reth, l_full["tl_r"], l_full["tl"]))),
                d.udp_len.eq(Mux(l_le, pre.ul, Mux(rq.reth, l_full["ul_r"], l_full["ul"]))),
                d.reth.eq(rq.reth), d.imm.eq(l_imm),
                d.bth.opcode.eq(l_opcode), d.bth.se.eq(l_se), d.bth.migreq.eq(row.migreq),
                d.bth.pad_cnt.eq(Mux(l_le, -rq.rem[:2], 0)), d.bth.tver.eq(0),
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
                wrop.eq(w.opcode[:2]), solicited.eq(w.solicited), has_imm.eq(rq.imm),
            ]
        return m
