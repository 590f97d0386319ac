# SPDX-License-Identifier: BSD-2-Clause
"""The segmenter's accept stage: a work or resume request + its QP row -> a request record."""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .. import proto
from ..config import check_config
from ..layouts import QPReadSignature, qp_index_width
from ..lib.arith import load_flags
from ..verbs import resume_layout, wr_layout
from .psn import PsnLookupSignature, WriteBackSignature
from .seg_common import (HZ, LEN_BITS, PMTU_CODES, PSN_FLAG_BITS, Q_CHUNK, WITH_IMM, WR_OPS,
                         WRITES, ResumePrepSignature, keep_decode, precompute, request_layout)

__all__ = ["RequestAccept"]


class RequestAccept(wiring.Component):
    """Takes a request from ``resume`` (priority) or ``wr`` into the accept register, reads its
    QP row (``qp_rd``), looks up the newest write-back of its QP (``fwd``, again in every cycle
    it waits) and offers it on ``o`` as a :func:`~roce_hw.tx.seg_common.request_layout` record.

    A work request's checks and precomputes (:func:`~roce_hw.tx.seg_common.precompute`, the
    keep code, the packet counter's flags per PMTU) are made as it is taken; a resume request's
    rest and its precomputes by the :class:`~roce_hw.tx.seg_resume.ResumePrep` on ``prep``,
    from the cycle after it was taken (``prep.done`` makes it ready).

    Latency: a work request transferred in cycle 0 is valid on ``o`` in cycle 1 (cycle 2 with
    ``fwd_registered``: its look-up answers a cycle late); a resume request in cycle 10.
    Throughput: one request per two cycles (the register is free the cycle after ``o``
    transfers). Backpressure: ``wr``/``resume`` wait while the register is full (their
    ``ready`` is a flip-flop, not the ``o`` transfer of the same cycle). ``o.valid`` is a
    flip-flop ("the register holds a request to load", set from the next values of the
    register's state); ``o.payload`` comes from registers, but for ``row`` (the table's read
    data).

    Parameters
    ----------
    config : EngineConfig
    fwd_registered : bool
        The look-up answers a cycle after the key.

    Members
    -------
    wr : ``In(stream.Signature(wr_layout(config)))``
    resume : ``In(stream.Signature(resume_layout(config)))``
    qp_rd : ``Out(QPReadSignature(idx_width))``
    fwd : ``Out(PsnLookupSignature(idx_width))``
    wb : ``In(WriteBackSignature(idx_width))``
        The write-backs (``o.payload.wb_req``: this cycle's is of the request's QP).
    prep : ``Out(ResumePrepSignature(config))``
    o : ``Out(stream.Signature(request_layout(config)))``
    """

    def __init__(self, config, *, fwd_registered=False):
        self._config = check_config(config)
        self._fwd_registered = bool(fwd_registered)
        qw = qp_index_width(config.n_qp)
        super().__init__({
            "wr": In(stream.Signature(wr_layout(config))),
            "resume": In(stream.Signature(resume_layout(config))),
            "qp_rd": Out(QPReadSignature(qw)),
            "fwd": Out(PsnLookupSignature(qw)),
            "wb": In(WriteBackSignature(qw)),
            "prep": Out(ResumePrepSignature(config)),
            "o": Out(stream.Signature(request_layout(config))),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        lg = (cfg.data_bytes - 1).bit_length()
        qw = qp_index_width(cfg.n_qp)
        o = self.o.payload
        # the accept register
        valid = Signal(name="a_valid")
        ready = Signal(name="a_ready")         # the values below are valid (a resume: later)
        res = Signal(name="a_resume")
        wr = Signal(wr_layout(cfg), name="a_wr")
        spkt = Signal.like(o.spkt, name="a_start_packet")
        spsn = Signal.like(o.spsn, name="a_start_psn")
        first = Signal(name="a_first")         # the first packet to send is the message's first
        reth = Signal(name="a_reth")
        imm = Signal(name="a_imm")
        bad_qp = Signal(name="a_bad_qp")
        bad_op = Signal(name="a_bad_op")
        bad_len = Signal(name="a_bad_len")
        bad_res = Signal(name="a_bad_resume")
        rem = Signal(LEN_BITS, name="a_rem")   # bytes from the first packet to send on
        # lengths of a first packet that is also the last, and rem <= PMTU per PMTU code, of a
        # WR as it is taken (a resume's come from the preparation)
        pre_w = Signal.like(o.w, name="a_w")
        hit = Signal(name="a_hit")
        hpsn = Signal.like(o.hpsn, name="a_hit_psn")
        herr = Signal(name="a_hit_err")
        take = Signal()                        # the emitter takes the request this cycle
        m.d.comb += take.eq(self.o.valid & self.o.ready)

        go_r = Signal()
        go_w = Signal()
        free = Signal()
        m.d.comb += [
            free.eq(~valid),              # (not in the cycle it is taken: keeps `go` shallow)
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
        w_reth = Signal()
        w_imm = Signal()
        m.d.comb += [w_reth.eq((wr_in.opcode == WRITES[0]) | (wr_in.opcode == WRITES[1])),
                     w_imm.eq((wr_in.opcode == WITH_IMM[0]) | (wr_in.opcode == WITH_IMM[1]))]
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
        p_len = Signal(LEN_BITS, name="a_pre_len")
        p_op = Signal.like(self.wr.payload.opcode, name="a_pre_op")
        with m.If(p_empty):
            m.d.sync += [p_len.eq(wr_in.length), p_op.eq(wr_in.opcode)]
        pre_len = Signal(LEN_BITS)
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

        w_lo_nz = port_flag(length[:lg].any(), "w_lo_nz")
        # (and the carry in of the length adders: `pre_len`'s multiplexed bits and their OR
        # were two LUTs in front of the carry chain; only where a beat is 8 bytes: with more,
        # ABC builds the beat flag's OR from this one, a LUT level more, 7 cells at 128 bits)
        w_nz4 = port_flag(length[:2].any(), "w_nz4") if lg <= 3 else None
        # the zero tests of the PMTU compares the same way (the resume's precompute has them
        # as registers): "the high part is zero", "nibble i is not zero" (ECP5: built from the
        # multiplexed length bits, the compares were 7-8 cells deep)
        w_hz = port_flag(~length[HZ:].any(), "w_hz")
        w_nib = [port_flag(length[4 * i:4 * i + 4].any(), f"w_nib{i}") for i in range(4)]
        pre = precompute(m, cfg, pre_len, w_reth, w_imm, "w", opcode=pre_op, hz=w_hz, nib=w_nib,
                         lo_nz=w_lo_nz, nz4=w_nz4)
        # (length > MAX_MESSAGE_BYTES: its top bit and any other)
        top = LEN_BITS - 1
        assert proto.MAX_MESSAGE_BYTES == 1 << top
        with m.If(go_r | go_w):
            m.d.sync += [
                valid.eq(1), wr.eq(wr_in), res.eq(go_r),
                bad_qp.eq(wr_in.qp >= cfg.n_qp) if cfg.n_qp < (1 << qw) else bad_qp.eq(0),
                bad_op.eq(wr_in.opcode > int(max(WR_OPS))),
                bad_len.eq(wr_in.length[top] & (wr_in.length[:top] != 0)),
                spkt.eq(self.resume.payload.start_packet),
                spsn.eq(self.resume.payload.start_psn),
                first.eq(~go_r | (self.resume.payload.start_packet == 0)),
                reth.eq(w_reth & (~go_r | (self.resume.payload.start_packet == 0))),
                imm.eq(w_imm),
                bad_res.eq(0),
                ready.eq(go_w), rem.eq(length),
            ]
        m.d.sync += pre_w.eq(pre)
        with m.If(valid & take):
            m.d.sync += valid.eq(0)
        with m.If(go_r | go_w):
            m.d.sync += p_empty.eq(0)
        with m.Elif(valid & take):
            m.d.sync += p_empty.eq(1)
        # (a resume's start PSN flags: registered with it, from the port)
        spsn_f = Signal.like(o.spsn_f, name="a_spsn_f")
        with m.If(go_r | go_w):
            m.d.sync += spsn_f.eq(Cat(*load_flags(m, self.resume.payload.start_psn, "res_psn",
                                                  flag_bits=PSN_FLAG_BITS)))

        # -------- the resume preparation: the request, its updates
        p = self.prep
        m.d.comb += [
            p.busy.eq(valid & res & ~ready),
            p.spkt.eq(spkt), p.length.eq(wr.length), p.rem.eq(rem), p.first.eq(first),
            p.reth.eq(reth), p.imm.eq(imm), p.pmtu.eq(self.qp_rd.data.pmtu),
        ]
        with m.If(p.set_rem):
            m.d.sync += rem.eq(p.rem_next)
        with m.If(p.bad):
            m.d.sync += bad_res.eq(1)
        with m.If(p.done):
            m.d.sync += ready.eq(1)

        # The keep-mask compares and the packet counter's load flags per PMTU, one register set
        # for both kinds of request: from the WR port while the accept register is empty, then
        # from the request taken (a resume's rest has its length's low bits; its a_rem is final
        # from step 6).
        k_src = Signal(lg)
        m.d.comb += k_src.eq(Mux(p_empty, length[:lg], p_len[:lg]))
        keep = keep_decode(m, cfg, k_src, "a_k")
        q_src = Signal(LEN_BITS)
        m.d.comb += q_src.eq(Mux(valid, rem, length))
        qz = Signal(len(PMTU_CODES), name="a_qz")
        m.d.sync += [qz[i].eq(q_src[proto.pmtu_shift(c):proto.pmtu_shift(c) + Q_CHUNK] == 0)
                     for i, c in enumerate(PMTU_CODES)]
        # the newest write-back of the request's QP, looked up again every cycle it waits (the
        # result is for the request in the accept register unless that one was replaced; with
        # a registered look-up key, for the request of the cycle before: a request's first
        # result then comes a cycle after it was taken)
        m.d.comb += self.fwd.qp.eq(Mux(valid, wr.qp, wr_in.qp))
        m.d.sync += [hit.eq(self.fwd.hit), hpsn.eq(self.fwd.psn), herr.eq(self.fwd.err)]
        # "This cycle's write-back is of the request's QP" as a flip-flop compared a cycle
        # ahead from the write-back's `qp_next` (ECP5 timing: the compare was two LUTs in front
        # of the PSN counter's load or enable): a request is loaded a cycle after it was taken
        # at the earliest, and `fwd.qp` is its QP in the cycle before any cycle it is loaded in.
        wb_req = Signal(name="wb_is_req")
        eq_req = Signal()
        m.d.comb += eq_req.eq(self.wb.qp_next == self.fwd.qp)
        m.d.sync += wb_req.eq(eq_req)

        # "the accept register holds a request to load" (valid & ready & not taken) as a
        # flip-flop of its own, from the next values of the three: the emitter's `load`, which
        # selects the whole descriptor register's input, is then one LUT of flip-flops (ECP5
        # timing). A request taken (a_valid low) is ready at once only for a WR without the
        # registered look-up (whose first answer is then in); one held stays ready until it is
        # loaded, and a resume becomes ready at its last preparation step.
        first_look = C(0, 1) if self._fwd_registered else go_r | go_w
        req_ok = Signal(name="a_req_ok")
        m.d.sync += req_ok.eq(Mux(valid, ~take & (ready | p.done), first_look & go_w))
        m.d.comb += [
            self.o.valid.eq(req_ok),
            o.res.eq(res), o.wr.eq(wr), o.spkt.eq(spkt), o.spsn.eq(spsn), o.spsn_f.eq(spsn_f),
            o.first.eq(first), o.reth.eq(reth), o.imm.eq(imm),
            o.bad_qp.eq(bad_qp), o.bad_op.eq(bad_op), o.bad_len.eq(bad_len),
            o.bad_res.eq(bad_res), o.rem.eq(rem),
            o.w.eq(pre_w), o.r.eq(p.pre), o.keep.eq(keep), o.qz.eq(qz),
            o.hit.eq(hit), o.hpsn.eq(hpsn), o.herr.eq(herr), o.wb_req.eq(wb_req),
            o.row.eq(self.qp_rd.data),
        ]
        return m
