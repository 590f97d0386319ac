# SPDX-License-Identifier: BSD-2-Clause
"""The UDP connection manager (PROTOCOL.md §7): validated datagrams in; QP table writes, traffic
generator commands and reply datagrams out."""
from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .. import proto
from ..config import check_config
from ..layouts import mgmt_req_layout, mgmt_rsp_layout, qp_index_width
from ..rx.frontend import cm_rx_layout
from ..verbs import gen_cmd_layout
from .cm_checksum import CmChecksum
from .cm_decoder import CmDecoder
from .cm_executor import CmExecutor
from .cm_replier import CmReplier, cm_counters_layout, cm_reply_layout

__all__ = ["CM_COUNTERS", "cm_reply_layout", "cm_counters_layout", "CmResponder"]

#: The connection manager's counters: requests obeyed, then one per reason of refusal or drop
#: (:data:`roce_hw.proto.CM_COUNTERS`; the rule behind each is in :mod:`roce_hw.model.cm`).
CM_COUNTERS = proto.CM_COUNTERS


class CmResponder(wiring.Component):
    """Connection-manager responder: one datagram at a time, through the QP table's management
    port.

    The behaviour -- validation order, the UDP checksum, ownership, OPEN_QP (allocation,
    re-open), MODIFY_QP_RTS, CLOSE_QP, FETCH_QP_INFO, the txmeta generator command, every reply
    field and the counter of each refusal -- is the one of the pure-Python model
    :class:`roce_hw.model.cm.CmModel`, and the tests compare the two. In short: a datagram with
    a wrong UDP checksum, or with no port to reply to, is dropped; SEND_QP_INFO is ignored;
    malformed datagrams get an ERROR reply; a request naming a QP that is out of range, free, in
    the wrong state or owned by another peer gets a NAK, OPEN_QP with no free QP gets NO_QP;
    only an obeyed request (ACK) writes a row or commands the generator. No other row is ever
    written.

    Structure: four stages in a row, each a component joined to the next by a stream::

        req -> CmChecksum -> CmDecoder -> CmExecutor -> CmReplier -> reply
               holds the     rules on the   the QP row,   the reply,
               datagram,     datagram       generator     counters
               UDP checksum  alone

    :class:`~roce_hw.ctrl.cm_checksum.CmChecksum` holds the datagram in the only register that
    holds it; each later stage's payload is its predecessor's with that stage's result added
    (:func:`~roce_hw.ctrl.cm_decoder.cm_job_layout`,
    :func:`~roce_hw.ctrl.cm_executor.cm_result_layout`), and a stage takes its input in the
    cycle its output is taken, so the datagram is released when the reply has gone.

    Latency, from a transfer on ``req`` to ``reply.valid`` (the management port answering
    through a :class:`~roce_hw.lib.reqrsp.RequestArbiter` as in the engine, nothing else on it):
    45 cycles for a datagram answered or dropped without the table, 41 of them the UDP checksum;
    50 for FETCH_QP_INFO and a refusal after the row check (read, check); 51 for a txmeta that
    commands the generator; 53 for OPEN_QP of a named QP, MODIFY_QP_RTS and CLOSE_QP (read,
    check, write); ``5 * n_qp + 49`` at most for OPEN_QP without a QP number (it reads the rows
    in turn until the peer's own). ``tests/test_cm.py`` measures these. Throughput: one
    datagram at a time (``req.ready`` is high only when idle): the RX front end queues them.

    Backpressure: waits for ``mgmt_req``, ``mgmt_rsp``, ``gen_cmd`` and ``reply`` as long as they
    are not ready. ``reply``, ``gen_cmd`` and ``mgmt_req`` are combinational from registers.

    Parameters
    ----------
    config : EngineConfig
        ``n_qp``; ``cm_pmtu`` is the PMTU code of the QPs it opens.

    Members
    -------
    req : ``In(stream.Signature(cm_rx_layout()))``
        Datagrams that passed the frame checks (our MAC and IP, UDP port 0x4321, 64 bytes), with
        their source MAC, IP and UDP port and the UDP checksum as received.
    reply : ``Out(stream.Signature(cm_reply_layout()))``
        Reply datagrams and their destination (the request's source MAC and IP, its
        ``reply_port`` or, if that is 0, its UDP source port).
    mgmt_req : ``Out(stream.Signature(mgmt_req_layout(n_qp)))``
    mgmt_rsp : ``In(stream.Signature(mgmt_rsp_layout(n_qp)))``
        Master side of the QP table's management port (one response per request, in order).
    gen_cmd : ``Out(stream.Signature(gen_cmd_layout(config)))``
        Start/stop commands for the :class:`~roce_hw.ctrl.generator.TrafficGenerator`.
    gen_busy : ``In(1)``, gen_qp : ``In(idx_width)``
        The generator's state.
    local_ip : ``In(32)``
        The engine's IPv4 address (the UDP checksum's destination, ``loc_ip`` of the replies).
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
        m.submodules.checksum = checksum = CmChecksum()
        m.submodules.decoder = decoder = CmDecoder(cfg.n_qp)
        m.submodules.executor = executor = CmExecutor(cfg)
        m.submodules.replier = replier = CmReplier()
        wiring.connect(m, wiring.flipped(self.req), checksum.i)
        wiring.connect(m, checksum.o, decoder.i)
        wiring.connect(m, decoder.o, executor.i)
        wiring.connect(m, executor.o, replier.i)
        wiring.connect(m, replier.reply, wiring.flipped(self.reply))
        wiring.connect(m, executor.mgmt_req, wiring.flipped(self.mgmt_req))
        wiring.connect(m, wiring.flipped(self.mgmt_rsp), executor.mgmt_rsp)
        wiring.connect(m, executor.gen_cmd, wiring.flipped(self.gen_cmd))
        m.d.comb += [
            executor.gen_busy.eq(self.gen_busy), executor.gen_qp.eq(self.gen_qp),
            checksum.local_ip.eq(self.local_ip), replier.local_ip.eq(self.local_ip),
            self.counters.eq(replier.counters),
        ]
        return m
