# SPDX-License-Identifier: BSD-2-Clause
"""The connection manager's third stage: the requests' own rules, through the QP table's
management port and the traffic generator's command stream."""
from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import proto
from ..config import check_config
from ..layouts import QP_CONTEXT, local_qpn, mgmt_req_layout, mgmt_rsp_layout, qp_index_width
from ..rx.frontend import cm_rx_layout
from ..verbs import gen_cmd_layout
from .cm_decoder import REASON_BITS, CmOp, cm_job_layout, reason_code

__all__ = ["cm_outcome_layout", "cm_result_layout", "CmExecutor"]

_ACK = proto.CmAck
_ST = proto.QPState
_OP = proto.WrOpcode


def cm_outcome_layout():
    """How a request ends: ``ack`` (:class:`~roce_hw.proto.CmAck`), ``reason`` (the counter,
    :func:`~roce_hw.ctrl.cm_decoder.reason_code`), ``reply`` (0: none), ``to_src_port`` (to the
    UDP source port), and for an ACK ``qpn`` (the engine QPN), ``fetch`` (the reply carries the
    row: FETCH_QP_INFO) and ``row_psn`` (its ``loc_psn`` is the row's ``next_psn``)."""
    return data.StructLayout({"ack": 3, "reason": REASON_BITS, "reply": 1, "to_src_port": 1,
                              "qpn": proto.QPN_BITS, "fetch": 1, "row_psn": 1})


def cm_result_layout():
    """Payload of :class:`CmExecutor`'s output: the datagram (``req``), the QP row read
    (``row``, before any write) and the ``outcome`` (:func:`cm_outcome_layout`)."""
    return data.StructLayout({"req": cm_rx_layout(), "row": QP_CONTEXT,
                              "outcome": cm_outcome_layout()})


class CmExecutor(wiring.Component):
    """Carries out a decoded request (:class:`~roce_hw.ctrl.cm_decoder.CmDecoder`): reads the QP
    row it names, checks it (state, owner, the generator), writes the row and starts or stops
    the generator when the request is obeyed -- the rules of OPEN_QP, MODIFY_QP_RTS, CLOSE_QP,
    FETCH_QP_INFO and txmeta in :mod:`roce_hw.model.cm`. An OPEN without a QP number reads every
    row in turn: it re-opens the row of the same peer (IP, QPN) if there is one, else takes the
    lowest free (RESET) row. A request the decoder already answered passes through.

    Latency from ``i.valid`` to ``o.valid`` (the management port through a
    :class:`~roce_hw.lib.reqrsp.RequestArbiter`, idle): 1 cycle for an answered request; 6 for
    FETCH_QP_INFO and a refusal after the row check; 7 for a generator command; 9 for a request
    that writes the row;
    ``5 * n_qp + 5`` at most for an OPEN that scans (5 cycles a row). Throughput and
    backpressure: one request at a time; waits for ``mgmt_req``, ``mgmt_rsp``, ``gen_cmd`` and
    ``o`` as long as they are not ready; ``i`` is taken in the cycle ``o`` is. ``o``'s payload
    is ``i``'s datagram with this stage's row and outcome registers.

    Members
    -------
    i : ``In(stream.Signature(cm_job_layout(n_qp)))``
    o : ``Out(stream.Signature(cm_result_layout()))``
    mgmt_req : ``Out(stream.Signature(mgmt_req_layout(n_qp)))``
    mgmt_rsp : ``In(stream.Signature(mgmt_rsp_layout(n_qp)))``
        Master side of the QP table's management port (one response per request, in order).
    gen_cmd : ``Out(stream.Signature(gen_cmd_layout(config)))``
    gen_busy : ``In(1)``, gen_qp : ``In(idx_width)``
        The generator's state.
    """

    def __init__(self, config):
        self._config = check_config(config)
        n_qp = config.n_qp
        super().__init__({
            "i": In(stream.Signature(cm_job_layout(n_qp))),
            "o": Out(stream.Signature(cm_result_layout())),
            "mgmt_req": Out(stream.Signature(mgmt_req_layout(n_qp))),
            "mgmt_rsp": In(stream.Signature(mgmt_rsp_layout(n_qp))),
            "gen_cmd": Out(stream.Signature(gen_cmd_layout(config))),
            "gen_busy": In(1),
            "gen_qp": In(qp_index_width(n_qp)),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        n_qp = cfg.n_qp
        rq = self.i.payload.req
        d = rq.dgram
        cmd = self.i.payload.cmd
        op = cmd.op
        row = Signal(QP_CONTEXT)               # the row read
        out = Signal(cm_outcome_layout())
        idx = Signal(qp_index_width(n_qp))     # the QP named / the scan position
        qpn = Signal(proto.QPN_BITS)
        m.d.comb += [qpn.eq(local_qpn(idx)),
                     self.o.payload.req.eq(rq), self.o.payload.row.eq(row),
                     self.o.payload.outcome.eq(out)]

        # checks of the row read, registered in "Check"
        r_open = Signal()
        r_err = Signal()
        r_rts = Signal()
        r_ip = Signal()          # the row's remote_ip is the frame's source IP
        r_qpn = Signal()         # the row's remote_qpn is the request's loc_qpn
        r_gen = Signal()         # the generator runs on this QP
        bad_len = Signal()       # txmeta: the length is above 2**31 or the count 0
        last_row = Signal()
        found_free = Signal()    # scan: a free row was seen
        free_idx = Signal.like(idx)

        def finish(ack, reason, *, fetch=0, row_psn=0):
            m.d.sync += [out.ack.eq(ack), out.reason.eq(reason_code(reason)), out.reply.eq(1),
                         out.fetch.eq(fetch), out.row_psn.eq(row_psn), out.qpn.eq(qpn)]
            m.next = "Out"

        with m.FSM():
            with m.State("Idle"):
                m.d.sync += [idx.eq(Mux(op == CmOp.OPEN_SCAN, 0, cmd.idx)), found_free.eq(0),
                             out.to_src_port.eq(cmd.to_src_port)]
                with m.If(self.i.valid):
                    with m.If(op == CmOp.NONE):
                        m.d.sync += [out.ack.eq(cmd.ack), out.reason.eq(cmd.reason),
                                     out.reply.eq(cmd.reply), out.fetch.eq(0),
                                     out.row_psn.eq(0)]
                        m.next = "Out"
                    with m.Else():
                        m.next = "Read"

            with m.State("Read"):
                m.d.comb += [self.mgmt_req.valid.eq(1), self.mgmt_req.payload.qp.eq(idx),
                             self.mgmt_req.payload.write.eq(0)]
                with m.If(self.mgmt_req.ready):
                    m.next = "ReadRsp"

            with m.State("ReadRsp"):
                m.d.comb += self.mgmt_rsp.ready.eq(1)
                with m.If(self.mgmt_rsp.valid):
                    m.d.sync += row.eq(self.mgmt_rsp.payload.ctx)
                    m.next = "Check"

            with m.State("Check"):
                m.d.sync += [
                    r_open.eq(row.state != _ST.RESET),
                    r_err.eq(row.state == _ST.ERROR),
                    r_rts.eq(row.state == _ST.RTS),
                    r_ip.eq(row.remote_ip == rq.src_ip),
                    r_qpn.eq(row.remote_qpn == d.loc_qpn[:proto.QPN_BITS]),
                    r_gen.eq(self.gen_busy & (self.gen_qp == idx)),
                    bad_len.eq((d.tx_dma_length > proto.MAX_MESSAGE_BYTES) |
                               (d.tx_n_transfers == 0)),
                    last_row.eq(idx == n_qp - 1),
                ]
                m.next = "Decide"

            with m.State("Decide"):
                same_peer = r_open & r_ip & r_qpn
                with m.Switch(op):
                    with m.Case(CmOp.OPEN_SCAN):
                        with m.If(same_peer):
                            m.next = "Write"
                        with m.Else():
                            with m.If(~r_open & ~found_free):
                                m.d.sync += [found_free.eq(1), free_idx.eq(idx)]
                            with m.If(last_row):
                                m.next = "ScanEnd"
                            with m.Else():
                                m.d.sync += idx.eq(idx + 1)
                                m.next = "Read"
                    with m.Case(CmOp.OPEN):
                        with m.If(r_open & ~(r_ip & r_qpn)):
                            finish(_ACK.NAK, "in_use")
                        with m.Else():
                            m.next = "Write"
                    with m.Case(CmOp.FETCH):
                        with m.If(~r_open):
                            finish(_ACK.NAK, "bad_state")
                        with m.Else():
                            finish(_ACK.ACK, "ok", fetch=1, row_psn=1)
                    with m.Case(CmOp.MODIFY):
                        with m.If(~r_open | r_err):
                            finish(_ACK.NAK, "bad_state")
                        with m.Elif(~r_ip | ~r_qpn):
                            finish(_ACK.NAK, "not_owner")
                        with m.Else():
                            m.next = "Write"
                    with m.Case(CmOp.CLOSE):
                        with m.If(~r_open):
                            finish(_ACK.NAK, "bad_state")
                        with m.Elif(~r_ip):
                            finish(_ACK.NAK, "not_owner")
                        with m.Elif(r_gen):
                            m.next = "Gen"
                        with m.Else():
                            m.next = "Write"
                    with m.Default():         # TX
                        with m.If(~r_rts):
                            finish(_ACK.NAK, "bad_state")
                        with m.Elif(~r_ip):
                            finish(_ACK.NAK, "not_owner")
                        with m.Elif(~d.tx_start):
                            with m.If(r_gen):
                                m.next = "Gen"
                            with m.Else():
                                finish(_ACK.ACK, "ok", row_psn=1)
                        with m.Elif(bad_len):
                            finish(_ACK.ERROR, "bad_txmeta")
                        with m.Elif(self.gen_busy):
                            finish(_ACK.NAK, "busy")
                        with m.Else():
                            m.next = "Gen"

            with m.State("ScanEnd"):
                with m.If(found_free):
                    m.d.sync += idx.eq(free_idx)
                    m.next = "Write"
                with m.Else():
                    finish(_ACK.NO_QP, "no_qp")

            with m.State("Gen"):
                # start (txmeta, tx_start) or stop (CLOSE, txmeta stop) the generator
                c = self.gen_cmd.payload
                m.d.comb += [
                    self.gen_cmd.valid.eq(1),
                    c.start.eq((op == CmOp.TX) & d.tx_start), c.qp.eq(idx),
                    c.opcode.eq(Mux(d.tx_type,
                                    Mux(d.tx_immediate, _OP.RDMA_WRITE_WITH_IMM, _OP.RDMA_WRITE),
                                    Mux(d.tx_immediate, _OP.SEND_WITH_IMM, _OP.SEND))),
                    c.length.eq(d.tx_dma_length), c.count.eq(d.tx_n_transfers),
                    c.period.eq(d.tx_period), c.remote_va.eq(row.remote_va), c.r_key.eq(row.r_key),
                ]
                with m.If(self.gen_cmd.ready):
                    with m.If(op == CmOp.CLOSE):      # now free the row
                        m.next = "Write"
                    with m.Else():
                        finish(_ACK.ACK, "ok", row_psn=1)

            with m.State("Write"):
                new = Signal(QP_CONTEXT)
                with m.Switch(op):
                    with m.Case(CmOp.OPEN, CmOp.OPEN_SCAN):
                        m.d.comb += [new[name].eq(value)
                                     for name, value in proto.CM_OPEN_ROW.items()]
                        m.d.comb += [
                            new.state.eq(_ST.INIT), new.remote_qpn.eq(d.loc_qpn),
                            new.remote_mac.eq(rq.src_mac), new.remote_ip.eq(d.loc_ip),
                            new.udp_sport.eq(proto.CM_UDP_SPORT_BASE |
                                             qpn[:proto.CM_UDP_SPORT_QPN_BITS]),
                            new.pmtu.eq(cfg.cm_pmtu),
                            new.next_psn.eq(d.rem_psn), new.una_psn.eq(d.rem_psn),
                            new.remote_va.eq(d.loc_base_addr), new.r_key.eq(d.loc_r_key),
                            new.rq_psn.eq(d.loc_psn),
                        ]
                    with m.Case(CmOp.MODIFY):
                        m.d.comb += [
                            new.eq(row), new.state.eq(_ST.RTS),
                            new.next_psn.eq(d.rem_psn), new.una_psn.eq(d.rem_psn),
                            new.r_key.eq(d.loc_r_key), new.remote_va.eq(d.loc_base_addr),
                            new.rq_psn.eq(d.loc_psn),
                        ]
                    # CLOSE: all-zero (RESET)
                m.d.comb += [self.mgmt_req.valid.eq(1), self.mgmt_req.payload.qp.eq(idx),
                             self.mgmt_req.payload.write.eq(1), self.mgmt_req.payload.ctx.eq(new)]
                with m.If(self.mgmt_req.ready):
                    m.next = "WriteRsp"

            with m.State("WriteRsp"):
                m.d.comb += self.mgmt_rsp.ready.eq(1)
                with m.If(self.mgmt_rsp.valid):
                    finish(_ACK.ACK, "ok", row_psn=op == CmOp.CLOSE)

            with m.State("Out"):
                m.d.comb += [self.o.valid.eq(1), self.i.ready.eq(self.o.ready)]
                with m.If(self.o.ready):
                    m.next = "Idle"
        return m
