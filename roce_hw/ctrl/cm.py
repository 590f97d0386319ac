# SPDX-License-Identifier: BSD-2-Clause
"""The UDP connection manager (PROTOCOL.md §7): validated datagrams in; QP table writes, traffic
generator commands and reply datagrams out."""
from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import layouts, proto
from ..config import check_config
from ..layouts import QP_CONTEXT, mgmt_req_layout, mgmt_rsp_layout, qp_index_width
from ..lib.arith import event_counter
from ..rx.frontend import cm_rx_layout
from ..verbs import gen_cmd_layout

__all__ = ["CM_COUNTERS", "cm_reply_layout", "cm_counters_layout", "CmResponder"]

#: The connection manager's counters: requests obeyed, then one per reason of refusal
#: (:data:`roce_hw.proto.CM_COUNTERS`; the rule behind each is in :mod:`roce_hw.model.cm`).
CM_COUNTERS = proto.CM_COUNTERS


def cm_reply_layout():
    """A reply datagram and where it goes (UDP source port 0x4321)."""
    return data.StructLayout({"dst_mac": 48, "dst_ip": 32, "dst_port": 16,
                              "dgram": layouts.CM_DATAGRAM})


def cm_counters_layout():
    """:data:`CM_COUNTERS`, 32-bit wrapping counts."""
    return data.StructLayout({name: 32 for name in CM_COUNTERS})


_REQ = proto.CmReq
_ACK = proto.CmAck
_ST = proto.QPState


class CmResponder(wiring.Component):
    """Connection-manager responder: one datagram at a time, through the QP table's management
    port.

    The behaviour -- validation order, ownership, OPEN_QP (allocation, re-open), MODIFY_QP_RTS,
    CLOSE_QP, FETCH_QP_INFO, the txmeta generator command, every reply field and the counter of
    each refusal -- is the one of the pure-Python model :class:`roce_hw.model.cm.CmModel`, and
    the tests compare the two. In short: malformed datagrams get an ERROR reply (or none if
    ``reply_port`` is 0), a request naming a QP that is out of range, free, in the wrong state or
    owned by another peer gets a NAK, OPEN_QP with no free QP gets NO_QP; only an obeyed request
    (ACK) writes a row or commands the generator. No other row is ever written.

    Structure: a state machine over registers. A datagram is latched; its static checks are
    registered flags; a named QP's row is read through ``mgmt_req``/``mgmt_rsp``, its checks
    registered, then the row is written and the reply sent. OPEN_QP without a QP number reads
    every row in turn (about 4 cycles a row): it re-opens the row of the same peer (IP, QPN) if
    there is one, else takes the lowest free (RESET) row.

    Latency: from ``req`` to ``reply.valid`` about 10 cycles for a request naming a QP (plus the
    management port's waits), about ``4 * n_qp + 10`` for OPEN_QP without one. Throughput: one
    datagram at a time (``req.ready`` is high only when idle): the RX front end queues them.

    Backpressure: waits for ``mgmt_req``, ``gen_cmd`` and ``reply`` as long as they are not
    ready; every output is a register.

    Parameters
    ----------
    config : EngineConfig
        ``n_qp``; ``cm_pmtu`` is the PMTU code of the QPs it opens.

    Members
    -------
    req : ``In(stream.Signature(cm_rx_layout()))``
        Datagrams that passed the frame checks (our MAC and IP, UDP port 0x4321, 64 bytes).
    reply : ``Out(stream.Signature(cm_reply_layout()))``
        Reply datagrams and their destination (the request's source MAC and IP, its ``reply_port``).
    mgmt_req : ``Out(stream.Signature(mgmt_req_layout(n_qp)))``
    mgmt_rsp : ``In(stream.Signature(mgmt_rsp_layout(n_qp)))``
        Master side of the QP table's management port (one response per request, in order).
    gen_cmd : ``Out(stream.Signature(gen_cmd_layout(config)))``
        Start/stop commands for the :class:`~roce_hw.ctrl.generator.TrafficGenerator`.
    gen_busy : ``In(1)``, gen_qp : ``In(idx_width)``
        The generator's state.
    local_ip : ``In(32)``
        The engine's IPv4 address (``loc_ip`` of the replies).
    counters : ``Out(cm_counters_layout())``
    """

    def __init__(self, config):
        self._config = check_config(config)
        n_qp = config.n_qp
        super().__init__({
            "req": In(stream.Signature(cm_rx_layout())),
            "reply": Out(stream.Signature(cm_reply_layout())),
            "mgmt_req": Out(stream.Signature(mgmt_req_layout(n_qp))),
            "mgmt_rsp": In(stream.Signature(mgmt_rsp_layout(n_qp))),
            "gen_cmd": Out(stream.Signature(gen_cmd_layout(config))),
            "gen_busy": In(1),
            "gen_qp": In(qp_index_width(n_qp)),
            "local_ip": In(32),
            "counters": Out(cm_counters_layout()),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        n_qp = cfg.n_qp
        iw = qp_index_width(n_qp)

        rq = Signal(cm_rx_layout())           # the datagram being served
        d = rq.dgram
        row = Signal(QP_CONTEXT)               # the row read
        idx = Signal(iw)                       # the QP it names / the scan position
        qpn = Signal(24)                       # local QPN of idx (256 + idx)
        rp = Signal(cm_reply_layout())         # the reply being built

        # --- static checks of the latched datagram (registered in CHECK) -------------------
        f_ack = Signal()        # rule 1 of the model: a request carries no ack
        f_flags = Signal()      # rule 3: not exactly one of valid / tx_valid
        f_txresv = Signal()
        f_port = Signal()
        f_field = Signal()      # rule 5
        f_req = Signal()        # rule 6
        f_ip = Signal()         # OPEN: loc_ip is not the frame's source IP
        f_rem0 = Signal()       # rem_qpn == 0
        qhi = Signal(17)        # rem_qpn[8:24] - 1 (bit 16: below 256)
        in_range = Signal()
        f_len = Signal()        # txmeta: length > 2**31 or count == 0
        # --- checks of the row read (registered in EVAL) ------------------------------------
        r_open = Signal()
        r_err = Signal()
        r_rts = Signal()
        r_ip = Signal()         # row remote_ip == frame source IP
        r_qpn = Signal()        # row remote_qpn == loc_qpn
        r_gen = Signal()        # the generator runs on this QP
        scanning = Signal()
        found = Signal()        # scan: a row of the same peer
        have_free = Signal()
        free_idx = Signal(iw)
        last_row = Signal()     # idx == n_qp - 1

        # one strobe per counter, registered
        count = Signal(len(CM_COUNTERS))
        m.d.sync += count.eq(0)
        for k, name in enumerate(CM_COUNTERS):
            m.d.comb += self.counters[name].eq(event_counter(m, 32, count[k], f"cm_{name}"))

        def refuse(code, reason):
            """Reply ``code`` to the request swapped, count ``reason``."""
            m.d.sync += [rp.dgram.ack_type.eq(code),
                         count[CM_COUNTERS.index(reason)].eq(1)]
            m.next = "REPLY"

        def accept(loc_psn, fields=()):
            m.d.sync += [rp.dgram.ack_type.eq(_ACK.ACK), rp.dgram.loc_qpn.eq(qpn),
                         rp.dgram.loc_psn.eq(loc_psn), rp.dgram.loc_r_key.eq(0),
                         rp.dgram.loc_base_addr.eq(0),
                         count[CM_COUNTERS.index("ok")].eq(1), *fields]

        m.d.comb += [
            self.reply.payload.eq(rp),
            qpn.eq((idx + proto.LOCAL_QPN_BASE)[:24]),
        ]
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.req.ready.eq(1)
                with m.If(self.req.valid):
                    m.d.sync += [rq.eq(self.req.payload), scanning.eq(0), found.eq(0),
                                 have_free.eq(0)]
                    m.next = "CHECK"

            with m.State("CHECK"):
                top = lambda v: v[24:32].any()
                m.d.sync += [
                    f_ack.eq(d.ack_valid | d.ack_type.any()),
                    f_flags.eq(~(d.valid ^ d.tx_valid)),
                    f_txresv.eq(d.tx_resv.any()),
                    f_port.eq(d.reply_port == 0),
                    f_field.eq(top(d.loc_qpn) | top(d.loc_psn) | top(d.rem_qpn) | top(d.rem_psn)),
                    f_req.eq(d.valid & ~d.req_type.matches(_REQ.OPEN_QP, _REQ.MODIFY_QP_RTS,
                                                           _REQ.CLOSE_QP, _REQ.FETCH_QP_INFO)),
                    f_ip.eq(d.loc_ip != rq.src_ip),
                    f_rem0.eq(d.rem_qpn[:24] == 0),
                    qhi.eq(d.rem_qpn[8:24] - 1),
                    f_len.eq((d.tx_dma_length > (1 << 31)) | (d.tx_n_transfers == 0)),
                    # the reply starts as the request with loc_* and rem_* swapped
                    rp.dst_mac.eq(rq.src_mac), rp.dst_ip.eq(rq.src_ip),
                    rp.dst_port.eq(d.reply_port),
                    rp.dgram.eq(d),
                    rp.dgram.ack_valid.eq(1),
                    rp.dgram.loc_qpn.eq(d.rem_qpn), rp.dgram.loc_psn.eq(d.rem_psn),
                    rp.dgram.loc_r_key.eq(d.rem_r_key), rp.dgram.loc_base_addr.eq(d.rem_base_addr),
                    rp.dgram.loc_ip.eq(self.local_ip),
                    rp.dgram.rem_qpn.eq(d.loc_qpn), rp.dgram.rem_psn.eq(d.loc_psn),
                    rp.dgram.rem_r_key.eq(d.loc_r_key), rp.dgram.rem_base_addr.eq(d.loc_base_addr),
                    rp.dgram.rem_ip.eq(d.loc_ip),
                ]
                m.next = "RANGE"

            with m.State("RANGE"):
                # QPN 256 + i for i < n_qp: rem_qpn[8:24] - 1 did not borrow and, with the low
                # byte, is below n_qp
                m.d.sync += [
                    in_range.eq(~qhi[16] & (Cat(d.rem_qpn[:8], qhi[:16]) < n_qp)),
                    idx.eq(Cat(d.rem_qpn[:8], qhi)[:iw]),
                ]
                m.next = "DECODE"

            with m.State("DECODE"):
                with m.If(f_ack):
                    refuse(_ACK.ERROR, "bad_flags")
                with m.Elif(f_txresv):
                    refuse(_ACK.ERROR, "bad_txmeta")
                with m.Elif(f_flags):
                    refuse(_ACK.ERROR, "bad_flags")
                with m.Elif(f_port):
                    m.d.sync += count[CM_COUNTERS.index("bad_port")].eq(1)
                    m.next = "IDLE"
                with m.Elif(f_field):
                    refuse(_ACK.ERROR, "bad_field")
                with m.Elif(f_req):
                    refuse(_ACK.ERROR, "bad_req")
                with m.Elif(d.valid & (d.req_type == _REQ.OPEN_QP) & f_ip):
                    refuse(_ACK.ERROR, "bad_field")
                with m.Elif(d.valid & (d.req_type == _REQ.OPEN_QP) & f_rem0):
                    m.d.sync += [idx.eq(0), scanning.eq(1)]
                    m.next = "READ"
                with m.Elif(~in_range):
                    refuse(_ACK.NAK, "bad_qpn")
                with m.Else():
                    m.next = "READ"

            with m.State("READ"):
                m.d.comb += [self.mgmt_req.valid.eq(1), self.mgmt_req.payload.qp.eq(idx),
                             self.mgmt_req.payload.write.eq(0)]
                with m.If(self.mgmt_req.ready):
                    m.next = "READ_RSP"

            with m.State("READ_RSP"):
                m.d.comb += self.mgmt_rsp.ready.eq(1)
                with m.If(self.mgmt_rsp.valid):
                    m.d.sync += row.eq(self.mgmt_rsp.payload.ctx)
                    m.next = "EVAL"

            with m.State("EVAL"):
                m.d.sync += [
                    r_open.eq(row.state != _ST.RESET),
                    r_err.eq(row.state == _ST.ERROR),
                    r_rts.eq(row.state == _ST.RTS),
                    r_ip.eq(row.remote_ip == rq.src_ip),
                    r_qpn.eq(row.remote_qpn == d.loc_qpn[:24]),
                    r_gen.eq(self.gen_busy & (self.gen_qp == idx)),
                    last_row.eq(idx == n_qp - 1),
                ]
                m.next = "DECIDE"

            with m.State("DECIDE"):
                is_open = d.valid & (d.req_type == _REQ.OPEN_QP)
                same_peer = r_open & r_ip & r_qpn
                with m.If(scanning):
                    with m.If(same_peer):
                        m.d.sync += [found.eq(1), scanning.eq(0)]
                        m.next = "WRITE"
                    with m.Else():
                        with m.If(~r_open & ~have_free):
                            m.d.sync += [have_free.eq(1), free_idx.eq(idx)]
                        with m.If(last_row):
                            m.d.sync += scanning.eq(0)
                            m.next = "SCAN_END"
                        with m.Else():
                            m.d.sync += idx.eq(idx + 1)
                            m.next = "READ"
                with m.Elif(is_open):
                    with m.If(r_open & ~(r_ip & r_qpn)):
                        refuse(_ACK.NAK, "in_use")
                    with m.Else():
                        m.next = "WRITE"
                with m.Elif(d.valid & (d.req_type == _REQ.FETCH_QP_INFO)):
                    with m.If(~r_open):
                        refuse(_ACK.NAK, "bad_state")
                    with m.Else():
                        accept(row.next_psn, [
                            rp.dgram.loc_r_key.eq(row.state),
                            rp.dgram.rem_qpn.eq(row.remote_qpn), rp.dgram.rem_psn.eq(row.rq_psn),
                            rp.dgram.rem_r_key.eq(row.r_key),
                            rp.dgram.rem_base_addr.eq(row.remote_va),
                            rp.dgram.rem_ip.eq(row.remote_ip)])
                        m.next = "REPLY"
                with m.Elif(d.valid & (d.req_type == _REQ.MODIFY_QP_RTS)):
                    with m.If(~r_open | r_err):
                        refuse(_ACK.NAK, "bad_state")
                    with m.Elif(~r_ip | ~r_qpn):
                        refuse(_ACK.NAK, "not_owner")
                    with m.Else():
                        m.next = "WRITE"
                with m.Elif(d.valid):     # CLOSE_QP
                    with m.If(~r_open):
                        refuse(_ACK.NAK, "bad_state")
                    with m.Elif(~r_ip):
                        refuse(_ACK.NAK, "not_owner")
                    with m.Elif(r_gen):
                        m.next = "GEN"
                    with m.Else():
                        m.next = "WRITE"
                with m.Else():            # txmeta
                    with m.If(~r_rts):
                        refuse(_ACK.NAK, "bad_state")
                    with m.Elif(~r_ip):
                        refuse(_ACK.NAK, "not_owner")
                    with m.Elif(~d.tx_start):
                        with m.If(r_gen):
                            m.next = "GEN"
                        with m.Else():
                            accept(row.next_psn)
                            m.next = "REPLY"
                    with m.Elif(f_len):
                        refuse(_ACK.ERROR, "bad_txmeta")
                    with m.Elif(self.gen_busy):
                        refuse(_ACK.NAK, "busy")
                    with m.Else():
                        m.next = "GEN"

            with m.State("SCAN_END"):
                with m.If(have_free):
                    m.d.sync += idx.eq(free_idx)
                    m.next = "WRITE"
                with m.Else():
                    refuse(_ACK.NO_QP, "no_qp")

            with m.State("GEN"):
                # start (txmeta, tx_start) or stop (CLOSE, txmeta stop) the generator
                c = self.gen_cmd.payload
                m.d.comb += [
                    self.gen_cmd.valid.eq(1),
                    c.start.eq(~d.valid & d.tx_start), c.qp.eq(idx),
                    c.opcode.eq(Mux(d.tx_type,
                                    Mux(d.tx_immediate, proto.WrOpcode.RDMA_WRITE_WITH_IMM,
                                        proto.WrOpcode.RDMA_WRITE),
                                    Mux(d.tx_immediate, proto.WrOpcode.SEND_WITH_IMM,
                                        proto.WrOpcode.SEND))),
                    c.length.eq(d.tx_dma_length), c.count.eq(d.tx_n_transfers),
                    c.period.eq(d.tx_period), c.remote_va.eq(row.remote_va), c.r_key.eq(row.r_key),
                ]
                with m.If(self.gen_cmd.ready):
                    with m.If(d.valid):          # CLOSE: now free the row
                        m.next = "WRITE"
                    with m.Else():
                        accept(row.next_psn)
                        m.next = "REPLY"

            with m.State("WRITE"):
                new = Signal(QP_CONTEXT)
                is_open = d.valid & (d.req_type == _REQ.OPEN_QP)
                is_modify = d.valid & (d.req_type == _REQ.MODIFY_QP_RTS)
                with m.If(is_open):
                    m.d.comb += [
                        new.state.eq(_ST.INIT), new.remote_qpn.eq(d.loc_qpn),
                        new.remote_mac.eq(rq.src_mac), new.remote_ip.eq(d.loc_ip),
                        new.udp_sport.eq(0xC000 | qpn[:14]), new.p_key.eq(0xFFFF),
                        new.migreq.eq(1), new.pmtu.eq(cfg.cm_pmtu),
                        new.next_psn.eq(d.rem_psn), new.una_psn.eq(d.rem_psn),
                        new.remote_va.eq(d.loc_base_addr), new.r_key.eq(d.loc_r_key),
                        new.retry_cnt.eq(7), new.rnr_retry.eq(7), new.timeout.eq(14),
                        new.min_rnr_timer.eq(12), new.rq_psn.eq(d.loc_psn),
                    ]
                with m.Elif(is_modify):
                    m.d.comb += [
                        new.eq(row), new.state.eq(_ST.RTS),
                        new.next_psn.eq(d.rem_psn), new.una_psn.eq(d.rem_psn),
                        new.r_key.eq(d.loc_r_key), new.remote_va.eq(d.loc_base_addr),
                        new.rq_psn.eq(d.loc_psn),
                    ]
                # CLOSE: all-zero
                m.d.comb += [self.mgmt_req.valid.eq(1), self.mgmt_req.payload.qp.eq(idx),
                             self.mgmt_req.payload.write.eq(1), self.mgmt_req.payload.ctx.eq(new)]
                with m.If(self.mgmt_req.ready):
                    m.next = "WRITE_RSP"

            with m.State("WRITE_RSP"):
                m.d.comb += self.mgmt_rsp.ready.eq(1)
                with m.If(self.mgmt_rsp.valid):
                    with m.If(d.valid & (d.req_type == _REQ.CLOSE_QP)):
                        accept(row.next_psn)
                    with m.Else():
                        accept(d.rem_psn)
                    m.next = "REPLY"

            with m.State("REPLY"):
                m.d.comb += self.reply.valid.eq(1)
                with m.If(self.reply.ready):
                    m.next = "IDLE"
        return m
