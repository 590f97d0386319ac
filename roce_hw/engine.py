# SPDX-License-Identifier: BSD-2-Clause
"""The engines, composed from the datapaths (:mod:`roce_hw.tx`, :mod:`roce_hw.rx`) and the
control plane (:mod:`roce_hw.ctrl`): :class:`TxEngine` (the TX datapath and its QP table) and
:class:`RoceEngine` (the whole engine: TX, RX front end, connection manager, ARP, traffic
generator, sharing one MAC)."""
from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .config import check_config
from .ctrl.ack import AckHandler, ack_counters_layout
from .ctrl.cm import CmResponder, cm_counters_layout
from .ctrl.generator import TrafficGenerator
from .ctrl.qp_table import QPStateTable
from .ctrl.reply import ReplyBuilder
from .ctrl.wrmux import WrMux
from .layouts import (QPReadSignature, mgmt_req_layout, mgmt_rsp_layout, qp_index_width,
                      una_upd_layout)
from .lib.arbiter import FrameArbiter
from .lib.compose import connect_through
from .lib.reqrsp import RequestArbiter
from .lib.stream import PacketSignature, frame_layout
from .rx.frontend import RxFrontEnd, rx_counters_layout
from .tx.path import TxPath
from .verbs import resume_layout, status_layout, wr_layout

__all__ = ["TxEngine", "tx_counters_layout", "engine_counters_layout", "RoceEngine"]


class TxEngine(wiring.Component):
    """The RoCEv2 requester's transmitter: the TX datapath
    (:class:`~roce_hw.tx.path.TxPath`, whose docstring states the behaviour, latency and
    backpressure) with its QP table (:class:`~roce_hw.ctrl.qp_table.QPStateTable`). It is what
    ``build.py --top tx`` emits (:class:`~roce_hw.top.TxTop`).

    Members
    -------
    wr, resume, i, o, status, local_mac, local_ip, ip_id_load, frames, frames_aborted,
    wrs_refused, status_dropped : as :class:`~roce_hw.tx.path.TxPath`'s
    qp_mgmt_req : ``In(stream.Signature(mgmt_req_layout(n_qp)))``
    qp_mgmt_rsp : ``Out(stream.Signature(mgmt_rsp_layout(n_qp)))``
        Management port of the QP table (see :class:`~roce_hw.ctrl.qp_table.QPStateTable`):
        one response per request, in order. A WR transferred after a management write's
        response has been received sees the write.

    With ``ack_port`` (the whole engine's, for its ACK handler), also:

    sending : as :class:`~roce_hw.tx.path.TxPath`'s
    ack_rd : ``In(QPReadSignature(idx_width))``
        The QP table's ``ack_rd`` read port.
    una_upd : ``In(stream.Signature(una_upd_layout(n_qp)))``
        The QP table's ``una_upd`` write-back (tied off without ``ack_port``).

    Raises
    ------
    TypeError
        If ``config`` is not an :class:`~roce_hw.config.EngineConfig`.
    """

    def __init__(self, config, *, ack_port=False):
        self._config = check_config(config)
        self._ack_port = bool(ack_port)
        self._path = TxPath(config)
        hidden = ("qp_rd", "qp_upd", "mgmt_write") + (() if ack_port else ("sending",))
        members = {name: member for name, member in self._path.signature.members.items()
                   if name not in hidden}
        members["qp_mgmt_req"] = In(stream.Signature(mgmt_req_layout(config.n_qp)))
        members["qp_mgmt_rsp"] = Out(stream.Signature(mgmt_rsp_layout(config.n_qp)))
        if ack_port:
            qw = qp_index_width(config.n_qp)
            members["ack_rd"] = In(QPReadSignature(qw))
            members["una_upd"] = In(stream.Signature(una_upd_layout(config.n_qp)))
        super().__init__(members)

    @property
    def config(self):
        """The :class:`~roce_hw.config.EngineConfig` of this engine."""
        return self._config

    @property
    def latency(self):
        """Cycles from a WR transfer to the first beat of its first frame (engine idle):
        :attr:`TxPath.latency <roce_hw.tx.path.TxPath.latency>`."""
        return self._path.latency

    payload_first_for = staticmethod(TxPath.payload_first_for)

    def elaborate(self, platform):
        m = Module()
        m.submodules.path = path = self._path
        m.submodules.qp_table = table = QPStateTable(self._config.n_qp)
        wiring.connect(m, wiring.flipped(self.qp_mgmt_req), table.mgmt_req)
        wiring.connect(m, table.mgmt_rsp, wiring.flipped(self.qp_mgmt_rsp))
        wiring.connect(m, path.qp_rd, table.tx_rd)
        wiring.connect(m, path.qp_upd, table.tx_upd)
        if self._ack_port:
            wiring.connect(m, wiring.flipped(self.ack_rd), table.ack_rd)
            wiring.connect(m, wiring.flipped(self.una_upd), table.una_upd)
        else:
            m.d.comb += table.una_upd.valid.eq(0)
        m.d.comb += [
            path.mgmt_write.valid.eq(table.mgmt_req.valid & table.mgmt_req.ready &
                                     table.mgmt_req.payload.write),
            path.mgmt_write.payload.qp.eq(table.mgmt_req.payload.qp),
        ]
        connect_through(m, self, path, exclude=("qp_mgmt_req", "qp_mgmt_rsp", "ack_rd",
                                                "una_upd"))
        return m


def tx_counters_layout():
    """The TX engine's counters (see :class:`~roce_hw.engine.TxEngine`) and the generator's."""
    return data.StructLayout({"frames": 32, "frames_aborted": 32, "wrs_refused": 32,
                              "status_dropped": 16, "gen_sent": 32})


def engine_counters_layout():
    """Every counter of :class:`RoceEngine`: ``tx``, ``rx`` (the RX front end's, by reason),
    ``cm`` (the connection manager's, by reason) and ``ack`` (the ACK handler's, by verdict:
    :data:`roce_hw.proto.ACK_COUNTERS`)."""
    return data.StructLayout({"tx": tx_counters_layout(), "rx": rx_counters_layout(),
                              "cm": cm_counters_layout(), "ack": ack_counters_layout()})


class RoceEngine(wiring.Component):
    """A RoCEv2 RC requester with its own receive path and connection manager.

    Blocks and how they meet:

    * :class:`~roce_hw.rx.frontend.RxFrontEnd` checks and classifies every received frame:
      ARP requests for ``local_ip``, CM datagrams (UDP 0x4321), RoCEv2 frames (UDP 4791, good
      iCRC) and the rest, which leaves untouched on ``rx_other`` (or is dropped and counted
      when ``config.rx_other`` is False).
    * :class:`~roce_hw.ctrl.cm.CmResponder` serves the CM datagrams (PROTOCOL.md §7; the behaviour
      is :mod:`roce_hw.model.cm`'s) through the QP table's management port, which it shares
      with the user's ``qp_mgmt_req``/``qp_mgmt_rsp`` (:class:`~roce_hw.lib.reqrsp.RequestArbiter`,
      round robin, one request outstanding), and starts/stops the traffic generator.
    * :class:`~roce_hw.ctrl.reply.ReplyBuilder` builds the ARP and CM reply frames.
    * :class:`~roce_hw.ctrl.generator.TrafficGenerator` posts WRs and their payload on an RTS QP
      when a txmeta datagram asks; :class:`~roce_hw.ctrl.wrmux.WrMux` merges them with the
      user's ``wr``, ``resume`` and ``i``: one request at a time, round robin between the user
      and the generator, a user resume before a user WR offered in the same cycle; the TX
      engine takes the requests in that order and reads the payload packets in it.
    * :class:`~roce_hw.engine.TxEngine` sends; :class:`~roce_hw.lib.arbiter.FrameArbiter`
      merges its frames with the reply frames at frame boundaries onto ``tx`` (a reply delays a
      data frame by at most one reply frame, 60-106 bytes).
    * :class:`~roce_hw.ctrl.ack.AckHandler` checks every received RoCEv2 packet as an ACK, NAK
      or CNP of one of the QPs (QP open, source IP its peer, PSN outstanding), advances the
      QP's ``una_psn`` in the QP table at one packet per cycle and counts every packet by
      verdict (``counters.ack``). Its events (go back, RNR, fatal NAK, CNP) are counted and
      not yet acted on: retransmission and completions are the next step of the reliability
      layer.

    Latency: a WR transferred on ``wr`` in cycle 0 (engine idle, payload valid) has its first
    beat on ``tx`` in cycle :attr:`TxEngine.latency` + 2 (the WR mux's register and the frame
    arbiter's; 10 at 64 and 512 bits, measured by ``tests/test_engine.py``); a resume 8 to 9
    cycles more (the segmenter works out where the message resumes: 18 at 64 bits, 19 at 512
    measured); CM datagram -> reply 45 to 53 cycles (41 of them the UDP checksum; OPEN_QP
    without a QP number ``5 * n_qp + 49``: it reads the table; see
    :class:`~roce_hw.ctrl.cm.CmResponder`).
    Throughput: the TX engine's (one beat per cycle), shared by the user's and the generator's
    requests; a reply frame delays data frames by at most one reply frame.
    Backpressure: ``tx`` stalls the data frames and replies; ``wr``, ``resume`` and ``i`` wait
    while the TX engine does (through the WR mux: a stalled ``i`` holds ``wr`` and ``resume``
    once 8 granted requests wait for their payload); ``rx`` never waits (full receive queues
    drop and count).

    Members
    -------
    rx : ``In(stream.Signature(frame_layout(W)))``
        Frames from the MAC (``abort`` = bad frame); ``rx.ready`` is constant 1.
    tx : ``Out(stream.Signature(frame_layout(W)))``
        Frames to the MAC: data, CM replies, ARP replies (``abort`` on a frame to discard).
    rx_other : ``Out(stream.Signature(frame_layout(W)))`` (``config.rx_other`` only)
        Received frames not for the engine, unchanged.
    wr, resume, i, status : as :class:`~roce_hw.engine.TxEngine`'s
        The user's work requests and resume requests (both through the WR mux, merged with the
        generator's requests), their payload packets, and the reports. The payload packets on
        ``i`` follow the order of the user's own requests of both kinds as they were
        transferred (a resume before a WR transferred in the same cycle), one per request with
        ``length`` > 0. A resume must name a packet of its message (``start_packet * PMTU`` <
        ``length``, or ``start_packet`` = 0): the TX engine refuses one that does not and reads
        no payload for it, which the WR mux cannot tell (see
        :class:`~roce_hw.ctrl.wrmux.WrMux`). Do not post user requests on the QP the generator
        runs on: the reports do not name their source.
    qp_mgmt_req, qp_mgmt_rsp : as :class:`~roce_hw.engine.TxEngine`'s
        The user's management port of the QP table (shared with the CM).
    local_mac : ``In(48)``, local_ip : ``In(32)``
        The engine's addresses (static).
    ip_id_load : as :class:`~roce_hw.engine.TxEngine`'s
    counters : ``Out(engine_counters_layout())``
    """

    def __init__(self, config):
        self._config = cfg = check_config(config)
        w = cfg.data_width
        members = {
            "rx": In(stream.Signature(frame_layout(w))),
            "tx": Out(stream.Signature(frame_layout(w))),
            "wr": In(stream.Signature(wr_layout(cfg))),
            "resume": In(stream.Signature(resume_layout(cfg))),
            "i": In(PacketSignature(w)),
            "status": Out(stream.Signature(status_layout(cfg))),
            "qp_mgmt_req": In(stream.Signature(mgmt_req_layout(cfg.n_qp))),
            "qp_mgmt_rsp": Out(stream.Signature(mgmt_rsp_layout(cfg.n_qp))),
            "local_mac": In(48),
            "local_ip": In(32),
            "ip_id_load": In(stream.Signature(data.StructLayout({"value": 16}))),
            "counters": Out(engine_counters_layout()),
        }
        if cfg.rx_other:
            members["rx_other"] = Out(stream.Signature(frame_layout(w)))
        super().__init__(members)

    @property
    def config(self):
        return self._config

    def elaborate(self, platform):
        cfg = self._config
        m = Module()
        m.submodules.tx_engine = txe = TxEngine(cfg, ack_port=True)
        m.submodules.ack = ack = AckHandler(cfg)
        m.submodules.rx_front = rxf = RxFrontEnd(cfg, rx_other=cfg.rx_other)
        m.submodules.cm = cm = CmResponder(cfg)
        m.submodules.reply = rb = ReplyBuilder(cfg)
        m.submodules.generator = gen = TrafficGenerator(cfg)
        m.submodules.wr_mux = mux = WrMux(cfg)
        m.submodules.tx_arb = arb = FrameArbiter(cfg.data_width, 2)
        m.submodules.mgmt_arb = marb = RequestArbiter(mgmt_req_layout(cfg.n_qp),
                                                       mgmt_rsp_layout(cfg.n_qp), 2)

        # receive side
        wiring.connect(m, wiring.flipped(self.rx), rxf.i)
        if cfg.rx_other:
            wiring.connect(m, rxf.other, wiring.flipped(self.rx_other))
        wiring.connect(m, rxf.roce, ack.i)
        wiring.connect(m, ack.qp_rd, txe.ack_rd)
        wiring.connect(m, ack.una_upd, txe.una_upd)
        m.d.comb += [
            ack.sending.eq(txe.sending),
            ack.mgmt_write.valid.eq(marb.m_req.valid & marb.m_req.ready &
                                    marb.m_req.payload.write),
            ack.mgmt_write.payload.qp.eq(marb.m_req.payload.qp),
            ack.ev.ready.eq(1),     # (counted; the retransmission scheduler's input)
        ]
        wiring.connect(m, rxf.cm, cm.req)
        wiring.connect(m, rxf.arp, rb.arp)
        wiring.connect(m, cm.reply, rb.cm)

        # management: user (0) and CM (1) share the table's port
        wiring.connect(m, wiring.flipped(self.qp_mgmt_req), marb.s0_req)
        wiring.connect(m, marb.s0_rsp, wiring.flipped(self.qp_mgmt_rsp))
        wiring.connect(m, cm.mgmt_req, marb.s1_req)
        wiring.connect(m, marb.s1_rsp, cm.mgmt_rsp)
        wiring.connect(m, marb.m_req, txe.qp_mgmt_req)
        wiring.connect(m, txe.qp_mgmt_rsp, marb.m_rsp)

        # work requests: user (0) and generator (1)
        wiring.connect(m, cm.gen_cmd, gen.cmd)
        m.d.comb += [cm.gen_busy.eq(gen.busy), cm.gen_qp.eq(gen.qp)]
        wiring.connect(m, wiring.flipped(self.wr), mux.s0_wr)
        wiring.connect(m, wiring.flipped(self.i), mux.s0_i)
        wiring.connect(m, gen.wr, mux.s1_wr)
        wiring.connect(m, gen.i, mux.s1_i)
        wiring.connect(m, wiring.flipped(self.resume), mux.s0_resume)
        wiring.connect(m, mux.wr, txe.wr)
        wiring.connect(m, mux.resume, txe.resume)
        wiring.connect(m, mux.i, txe.i)
        wiring.connect(m, txe.status, wiring.flipped(self.status))
        wiring.connect(m, wiring.flipped(self.ip_id_load), txe.ip_id_load)

        # transmit side: data frames (0) and replies (1)
        wiring.connect(m, txe.o, arb.i[0])
        wiring.connect(m, rb.o, arb.i[1])
        wiring.connect(m, arb.o, wiring.flipped(self.tx))

        m.d.comb += [
            txe.local_mac.eq(self.local_mac), txe.local_ip.eq(self.local_ip),
            rxf.local_mac.eq(self.local_mac), rxf.local_ip.eq(self.local_ip),
            rb.local_mac.eq(self.local_mac), rb.local_ip.eq(self.local_ip),
            cm.local_ip.eq(self.local_ip),
            self.counters.tx.frames.eq(txe.frames),
            self.counters.tx.frames_aborted.eq(txe.frames_aborted),
            self.counters.tx.wrs_refused.eq(txe.wrs_refused),
            self.counters.tx.status_dropped.eq(txe.status_dropped),
            self.counters.tx.gen_sent.eq(gen.sent),
            self.counters.rx.eq(rxf.counters),
            self.counters.cm.eq(cm.counters),
            self.counters.ack.eq(ack.counters),
        ]
        return m
