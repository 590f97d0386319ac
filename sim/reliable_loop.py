# SPDX-License-Identifier: BSD-2-Clause
"""A requester, a lossy network both ways and the independent responder, in one cycle-timed loop
that checks reliable delivery (issue 35).

::

    requester --(port, data_width)--> LossyLink fwd --> ResponderModel
        ^                                                     |
        +--------- LossyLink rev <--(port, data_width)--------+

The requester sits behind the small interface :class:`LoopRequester`; :class:`ModelRequester`
puts :class:`roce_hw.model.reliable.ReliableRequester` behind it, :class:`HardwareRequester` the
whole engine (:class:`roce_hw.top.EngineTop` through :class:`sim.backend.EngineApi`, either back
end): see :class:`LoopRequester` for what each method must do. The responder is
:class:`sim.peer.ResponderModel` (Linux rxe's responder rules, independent of the requester
model); it answers in the cycle a frame arrives (plus ``responder_latency``) and sends its
replies through a port of the same width.

:func:`run_reliable_loop` runs until every work request is finished and the network is empty,
then checks and reports (:class:`LoopReport`):

* every message arrived exactly once, in order, byte-identical: per QP, the responder's
  completed messages (kind, bytes, immediate) are the QP's accepted WRs in posting order -- all
  of them on a QP that did not fail, a prefix on one that failed;
* completions exact: on a QP that did not fail, the SUCCESS completions are the signaled WRs in
  posting order and there is no other; on every QP each WR has at most one completion, no WR
  completes SUCCESS unless the responder completed its message, and a failed QP has exactly one
  error completion that is not WR_FLUSH_ERR, after its SUCCESSes, then only flushes;
* counts: frames, retransmitted packets seen on the wire (a data packet whose (QP, PSN) went out
  before), ACKs and NAKs by kind the responder sent, the requester's counters (timeouts, RNR
  waits, ...), completions by status, the network's fault counts;
* goodput: payload bytes of the messages delivered / (cycles x bytes per beat), cycles from 0
  (all WRs posted) to the cycle after the last completion -- or, for a requester that makes no
  completions yet (``completes = False``: the hardware today), after the last message the
  responder completed; ``delivery_goodput`` always uses the latter, so both kinds of requester
  compare on the same basis.

A requester with ``completes = False`` is not held to "every signaled WR completes SUCCESS"
(``completions_ok`` is then ``None``, not checked, unless a completion it did make is wrong: a
WR twice, or SUCCESS for a message never delivered); every message must still be delivered
(``all_delivered``) for :attr:`LoopReport.ok`.
"""

import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from roce_hw import proto
from roce_hw.model.reliable import ReliableRequester, wc_opcode
from sim.bfm import QPSetup, WorkItem, qp_context
from sim.lossy import LossyNetwork, frame_class
from sim.peer import ResponderModel

__all__ = ["CLOCK_HZ", "LoopRequester", "ModelRequester", "HardwareRequester", "LoopReport",
           "reliable_context", "loop_workload", "make_responder", "run_reliable_loop",
           "EXPECTED_KIND"]

#: Clock per width (Hz), as :data:`sim.traffic.CLOCK_MHZ`.
CLOCK_HZ = {64: 156_250_000, 128: 250_000_000, 256: 250_000_000, 512: 322_000_000,
            1024: 322_000_000}

#: What the responder calls the message of each WR opcode.
EXPECTED_KIND = {proto.WrOpcode.SEND: "SEND", proto.WrOpcode.SEND_WITH_IMM: "SEND_IMM",
                 proto.WrOpcode.RDMA_WRITE: "WRITE",
                 proto.WrOpcode.RDMA_WRITE_WITH_IMM: "WRITE_IMM"}

_WITH_IMM = (proto.WrOpcode.SEND_WITH_IMM, proto.WrOpcode.RDMA_WRITE_WITH_IMM)
_WRITES = (proto.WrOpcode.RDMA_WRITE, proto.WrOpcode.RDMA_WRITE_WITH_IMM)
_NEEDS_RECV = (proto.WrOpcode.SEND, proto.WrOpcode.SEND_WITH_IMM,
               proto.WrOpcode.RDMA_WRITE_WITH_IMM)


class LoopRequester:
    """What :func:`run_reliable_loop` needs of a requester (the model or the hardware).

    Attributes: ``data_width`` (bits), ``cycle`` (the next cycle not yet simulated) and
    ``completes`` (True: every signaled WR gets a completion; False: only some do -- the
    hardware's status stream reports refused WRs only, for now).
    Methods, all at :attr:`cycle` unless said otherwise:

    * ``write_qp(index, ctx)``: management write of a whole QP row (a dict of
      :data:`roce_hw.proto.QP_CONTEXT_FIELDS`);
    * ``post(item)``: post a :class:`sim.bfm.WorkItem` (its ``wr_id``, ``signaled`` ...);
    * ``push_rx(frame, cycle)``: a frame that reaches the requester's receive port at ``cycle``
      (>= :attr:`cycle`; hardware: ``EngineApi.push_rx(frame, cycle=cycle)``);
    * ``run_until(cycle)``: simulate every cycle before ``cycle``;
    * ``next_event()``: the first cycle in which the requester may act on its own (send, a timer)
      -- ``None`` if it is idle. A slice-driven back end may return ``cycle + slice``: it is only
      a hint of how far the loop may jump;
    * ``idle()``: nothing left to do (no WR, packet, timer or received frame pending);
    * ``pop_tx()``: frames sent since the last call, each with ``first``/``last`` (cycles of its
      first and last beat) and ``data`` (bytes) -- :class:`sim.backend.TxFrame` and
      :class:`roce_hw.model.reliable.TxRecord` both have them;
    * ``pop_completions()``: completions since the last call, dicts ``{wr_id, qp, opcode,
      status, byte_len, cycle}`` (hardware: its completion stream);
    * ``set_pause(on)``: the PFC pause input;
    * ``counters()``: a dict of the requester's counters (names of
      :attr:`roce_hw.model.reliable.ReliableRequester.counters`; a back end may give fewer).
    """

    data_width = 512
    cycle = 0
    completes = True

    def write_qp(self, index, ctx):
        raise NotImplementedError

    def post(self, item):
        raise NotImplementedError

    def push_rx(self, frame, cycle):
        raise NotImplementedError

    def run_until(self, cycle):
        raise NotImplementedError

    def next_event(self):
        raise NotImplementedError

    def idle(self):
        raise NotImplementedError

    def pop_tx(self):
        raise NotImplementedError

    def pop_completions(self):
        raise NotImplementedError

    def set_pause(self, on):
        raise NotImplementedError

    def counters(self):
        raise NotImplementedError


class ModelRequester(LoopRequester):
    """:class:`~roce_hw.model.reliable.ReliableRequester` behind :class:`LoopRequester`; keyword
    arguments go to it (``data_width`` and ``clock_hz`` default to the width's clock)."""

    def __init__(self, n_qp=16, *, data_width=512, clock_hz=None, **kwargs):
        self.model = ReliableRequester(n_qp, data_width=data_width,
                                       clock_hz=clock_hz or CLOCK_HZ[data_width], **kwargs)
        self.data_width = data_width

    @property
    def cycle(self):
        return self.model.cycle

    def write_qp(self, index, ctx):
        self.model.write_qp(index, ctx)

    def post(self, item):
        self.model.post(qp=item.qp, opcode=item.opcode, payload=item.payload,
                        length=item.length, wr_id=item.wr_id, remote_addr=item.remote_addr,
                        r_key=item.r_key, imm=item.imm, solicited=item.solicited,
                        signaled=item.signaled)

    def push_rx(self, frame, cycle):
        self.model.push_rx(frame, cycle)

    def run_until(self, cycle):
        self.model.run_until(cycle)

    def next_event(self):
        return self.model.next_event()

    def idle(self):
        return self.model.idle()

    def pop_tx(self):
        return self.model.pop_tx()

    def pop_completions(self):
        return [wc.as_dict() for wc in self.model.pop_completions()]

    def set_pause(self, on):
        self.model.set_pause(on)

    def counters(self):
        return dict(self.model.counters)


class HardwareRequester(LoopRequester):
    """The whole engine (:class:`roce_hw.top.EngineTop`, the ``roce_engine`` module) behind
    :class:`LoopRequester`, driven through :class:`sim.backend.EngineApi` on either back end.

    What the engine has today (docs/reliability.md): its TX path sends every WR once; the ACK
    handler checks each received ACK/NAK, advances the QP's ``una_psn`` and counts it
    (``ack_*`` counters, :data:`roce_hw.proto.ACK_COUNTERS`); nothing is sent again and there
    is no completion queue. So ``completes = False``: :meth:`pop_completions` gives the status
    stream's reports, which are refused WRs only (``LOC_QP_OP_ERR``, ``LOC_LEN_ERR``), with
    ``opcode`` taken from the posted WR (the status stream does not carry it) and ``byte_len``
    0. There are no timers, so ``timeouts``/``rnr_waits`` do not exist in :meth:`counters`
    (the engine's counters, by port name: ``tx_frames``, ``rx_icrc``, ``ack_acks``, ...).

    Parameters
    ----------
    engine : EngineApi, optional
        An engine top opened with ``top="engine"``; default: :func:`sim.backend.open_engine`
        of ``config`` on ``backend`` with ``seed`` (its idle/stall generators, all off unless
        set with ``engine.set_random``).
    local_mac, local_ip
        The engine's addresses (``set_addr``).
    slice_cycles : int
        Cycles the loop may run the engine without looking at the network
        (:meth:`next_event`). Frames and replies are exact to the cycle when it is at most the
        network's delay; else a reply can be late by up to ``slice_cycles - delay``.
    quiet_cycles : int
        The engine is :meth:`idle` once no input is pending and ``m_axis_tx`` has had no beat
        for this many cycles.
    keep_tx : bool
        Keep every frame sent in :attr:`sent` as well (:class:`sim.backend.TxFrame`).
    progress : callable, optional
        Called each time the engine has run, as ``progress(cycle, wrs_accepted, frames_sent)``
        (e.g. :meth:`sim.harness.Progress.update`, which prints at most every few seconds).

    :meth:`run_until` only records its cycle; the engine runs up to it when an output is asked
    for (:meth:`pop_tx`, :meth:`idle`, ...) or before a WR or a management write, so one loop
    step costs one back-end call. Received frames carry their cycle and wait for it in the back
    end's queue.
    """

    completes = False

    def __init__(self, engine=None, *, config=None, backend="amaranth", seed=0,
                 local_mac=0x02_00_00_00_00_01, local_ip=0x0A_00_00_01, slice_cycles=128,
                 quiet_cycles=200, keep_tx=False, progress=None, log=None):
        if engine is None:
            if config is None:
                raise ValueError("give an engine or a config")
            from sim.backend import open_engine
            engine = open_engine(config, backend=backend, top="engine", seed=seed, log=log)
        if "RX" not in engine.features:
            raise ValueError("the engine top has no receive port: open it with top='engine'")
        if slice_cycles < 1 or quiet_cycles < 1:
            raise ValueError("slice_cycles and quiet_cycles must be >= 1")
        self.eng = engine
        self.data_width = engine.config.data_width
        self.slice_cycles, self.quiet_cycles = int(slice_cycles), int(quiet_cycles)
        self.sent = [] if keep_tx else None
        self.progress = progress
        self.frames_sent = 0
        engine.set_addr(local_mac, local_ip)
        self._tx, self._status = [], []
        self._posted = {}                # (qp, wr_id) -> WorkItem
        self._beats = engine.count("tx_beats_total")
        self._active = engine.cycle      # last cycle with a beat or an input pending
        self._target = engine.cycle      # run_until's cycle, reached by _flush

    @property
    def cycle(self):
        return self._target

    def write_qp(self, index, ctx):
        self._flush()
        self.eng.push_mgmt(index, 1, ctx)

    def post(self, item):
        self._flush()
        self._posted[(item.qp, item.wr_id)] = item
        self.eng.post(item, wr_id=item.wr_id)

    def push_rx(self, frame, cycle):
        # A received frame carries its cycle: the engine may still be before it (run_until is
        # lazy), it waits for that cycle in the back end's queue.
        self.eng.push_rx(frame, cycle=cycle)

    def _pending(self):
        e = self.eng
        return any(e.count(q) for q in ("wr_pending", "payload_pending", "rx_pending",
                                        "mgmt_pending", "mgmt_outstanding", "resume_pending"))

    def run_until(self, cycle):
        # Lazy: the engine runs when an output is asked for, so that the loop's two calls per
        # step (before and after it hands over the network's frames) cost one back-end call.
        self._target = max(self._target, int(cycle))

    def _flush(self):
        n = self._target - self.eng.cycle
        if n <= 0:
            return
        busy = self._pending()
        self.eng.run(n)
        frames = self.eng.pop_tx()
        self._tx += frames
        self.frames_sent += len(frames)
        if self.sent is not None:
            self.sent += frames
        self._status += self.eng.pop_status()
        beats = self.eng.count("tx_beats_total")
        if beats != self._beats or busy or self._pending():
            self._beats = beats
            self._active = self.eng.cycle
        if self.progress is not None:
            self.progress(self.eng.cycle, self.eng.count("wrs_accepted"), self.frames_sent)

    def idle(self):
        self._flush()
        return not self._pending() and self.eng.cycle - self._active >= self.quiet_cycles

    def next_event(self):
        return None if self.idle() else self.eng.cycle + self.slice_cycles

    def pop_tx(self):
        self._flush()
        out, self._tx = self._tx, []
        return out

    def pop_completions(self):
        self._flush()
        out = []
        for s in self._status:
            item = self._posted.get((int(s["qp"]), int(s["wr_id"])))
            out.append({"wr_id": int(s["wr_id"]), "qp": int(s["qp"]),
                        "opcode": None if item is None else wc_opcode(item.opcode),
                        "status": proto.WcStatus(int(s["status"])), "byte_len": 0,
                        "cycle": int(s["cycle"])})
        self._status = []
        return out

    def set_pause(self, on):
        raise NotImplementedError("the engine has no PFC pause input yet (issue 35)")

    def counters(self):
        self._flush()
        out = dict(self.eng.counters())
        out.pop("cycle", None)
        return out

    def close(self):
        self.eng.close()


def reliable_context(q, *, retry_cnt=7, rnr_retry=7, timeout=10, min_rnr_timer=1):
    """The QP row of a :class:`sim.bfm.QPSetup` with the reliability fields set."""
    ctx = qp_context(q)
    ctx.update(retry_cnt=retry_cnt, rnr_retry=rnr_retry, timeout=timeout,
               min_rnr_timer=min_rnr_timer)
    return ctx


def loop_workload(*, n_qps=4, messages=100, sizes=(0, 3 * 1024), ops=tuple(EXPECTED_KIND),
                  pmtu=1024, seed=0, start_psns=None, signaled=True):
    """Seeded QPs and WRs for the loop: ``messages`` WRs spread at random over ``n_qps`` QPs,
    opcodes drawn from ``ops``, payload sizes uniform in ``sizes`` (inclusive), every WRITE at
    its own address with its own R_Key (so the responder's memory shows each one). QP ``i``
    talks to responder QPN ``0x11 + i``; its start PSN is ``start_psns[i]`` or random."""
    rng = random.Random(seed)
    qps = [QPSetup(index=i, remote_qpn=0x11 + i, remote_mac=0x02_00_00_00_10_00 | i,
                   remote_ip=0x0A_00_01_01 + i, udp_sport=0xC000 | i,
                   start_psn=rng.randrange(1 << 24) if start_psns is None else start_psns[i],
                   pmtu=pmtu) for i in range(n_qps)]
    wrs = []
    va = 0x10_0000
    for n in range(messages):
        op = proto.WrOpcode(rng.choice(list(ops)))
        size = rng.randint(*sizes)
        wrs.append(WorkItem(qp=rng.randrange(n_qps), opcode=op, payload=rng.randbytes(size),
                            remote_addr=va, r_key=0x1000 + n, imm=rng.getrandbits(32),
                            signaled=signaled, wr_id=n + 1))
        va += max(size, 1) + 64
    return qps, wrs


def make_responder(qps, wrs, *, min_rnr_timer=1, recv=True, skip_rkeys=(), mac=None, ip=None):
    """A :class:`sim.peer.ResponderModel` ready for ``wrs``: a responder QP per QPSetup
    (expecting its start PSN, answering local QPN 256 + index), a memory region per non-empty
    WRITE (except those whose R_Key is in ``skip_rkeys``) and, with ``recv``, one receive buffer
    per SEND or WRITE-with-immediate."""
    peer = ResponderModel(mac=mac, ip=ip)
    for q in qps:
        peer.add_qp(q.remote_qpn, epsn=q.start_psn, pmtu=q.pmtu,
                    remote_qpn=proto.LOCAL_QPN_BASE + q.index, min_rnr_timer=min_rnr_timer)
    need = Counter()
    size = defaultdict(lambda: 1)
    for w in wrs:
        if w.opcode in _WRITES and w.payload and w.r_key not in skip_rkeys:
            peer.register_mr(w.remote_addr, len(w.payload), w.r_key)
        if w.opcode in _NEEDS_RECV:
            need[w.qp] += 1
            size[w.qp] = max(size[w.qp], len(w.payload))
    if recv:
        for q in qps:
            if need[q.index]:
                peer.post_recv(q.remote_qpn, size[q.index], need[q.index])
    return peer


@dataclass
class LoopReport:
    """What :func:`run_reliable_loop` found (see the module docstring)."""
    finished: bool = False            #: everything done before ``max_cycles``
    #: 0 .. the cycle after the last completion (``completes = False``: ``delivered_cycles``)
    cycles: int = 0
    delivered_cycles: int = 0         #: 0 .. the cycle after the responder's last message
    data_width: int = 512
    messages: int = 0                 #: WRs posted
    delivered: int = 0                #: messages the responder completed
    payload_bytes: int = 0            #: their payload bytes
    goodput: float = 0.0              #: payload_bytes / (cycles * bytes per beat)
    delivery_goodput: float = 0.0     #: payload_bytes / (delivered_cycles * bytes per beat)
    delivery_ok: bool = False         #: exactly once, in order, byte-identical
    #: completions exact; ``None``: not checked (the requester makes no completions yet)
    completions_ok: bool | None = False
    all_delivered: bool = False       #: every WR of every QP that did not fail delivered
    failed_qps: dict = field(default_factory=dict)     #: QP -> the error status that failed it
    problems: list = field(default_factory=list)       #: what is wrong, in words
    completions: list = field(default_factory=list)    #: the requester's, in order
    by_status: dict = field(default_factory=dict)      #: completion status name -> count
    wire: dict = field(default_factory=dict)           #: frames seen on the wire, by kind
    requester: dict = field(default_factory=dict)      #: the requester's counters
    responder: dict = field(default_factory=dict)      #: the responder's counters
    network: dict = field(default_factory=dict)        #: {"fwd": counts, "rev": counts}

    @property
    def ok(self):
        """Finished; every message delivered exactly once, in order, byte-identical (on every
        QP that did not fail); completions exact or, without completions, not wrong."""
        return self.finished and self.delivery_ok and self.all_delivered and \
            self.completions_ok is not False

    def summary(self):
        """The figures as a JSON-ready dict."""
        keys = ("finished", "cycles", "delivered_cycles", "data_width", "messages",
                "delivered", "payload_bytes", "goodput", "delivery_goodput", "delivery_ok",
                "completions_ok", "all_delivered")
        out = {k: getattr(self, k) for k in keys}
        out.update(failed_qps={str(k): v for k, v in self.failed_qps.items()},
                   problems=self.problems[:20], by_status=self.by_status, wire=self.wire,
                   requester=self.requester, responder=self.responder,
                   network={k: dict(v) for k, v in self.network.items()})
        return out


def run_reliable_loop(qps, wrs, *, requester=None, data_width=512, n_qp=None, qp_params=None,
                      qp_overrides=None, responder=None, network=None, seed=0, delay=200,
                      responder_latency=0, actions=(), max_cycles=10**9, **requester_kwargs):
    """Run ``wrs`` (:class:`sim.bfm.WorkItem`, all posted at cycle 0) on ``qps``
    (:class:`sim.bfm.QPSetup`) through the loop of the module docstring.

    Parameters
    ----------
    requester : LoopRequester, optional
        Default: a :class:`ModelRequester` of ``n_qp`` rows (default ``max(16, QPs)``) at
        ``data_width``, built with ``requester_kwargs``.
    qp_params : dict
        Reliability fields of every QP row (:func:`reliable_context` keywords);
        ``qp_overrides`` ``{index: {...}}`` on top, per QP.
    responder : ResponderModel, optional
        Default :func:`make_responder` (its ``min_rnr_timer`` from ``qp_params``).
    network : LossyNetwork or dict, optional
        The network, or keyword arguments of :class:`sim.lossy.LossyNetwork` (``seed`` and
        ``delay`` given here by default). Default: lossless, ``delay`` cycles each way.
    actions : iterable of (cycle, callable)
        ``callable(loop)`` runs at the start of ``cycle`` (``loop`` has ``requester``,
        ``responder``, ``network``, ``cycle`` and ``post(item)``); if it returns a cycle, it
        runs again then.
    max_cycles : int
        Stop there (the report says ``finished=False``).
    """
    qp_params = dict(qp_params or {})
    if requester is None:
        requester = ModelRequester(n_qp or max([16] + [q.index + 1 for q in qps]),
                                   data_width=data_width, **requester_kwargs)
    elif requester_kwargs:
        raise ValueError("requester keyword arguments given with a requester")
    if responder is None:
        responder = make_responder(qps, wrs, min_rnr_timer=qp_params.get("min_rnr_timer", 1))
    if network is None or isinstance(network, dict):
        network = LossyNetwork(**{"seed": seed, "delay": delay, **(network or {})})
    loop = _Loop(requester, responder, network, responder_latency)
    for q in qps:
        loop.requester.write_qp(q.index, reliable_context(
            q, **{**qp_params, **(qp_overrides or {}).get(q.index, {})}))
    for w in wrs:
        loop.post(w)
    loop.run(sorted(actions, key=lambda a: a[0]), max_cycles)
    return loop.report(qps)


class _Loop:
    def __init__(self, requester, responder, network, responder_latency):
        self.requester, self.responder, self.network = requester, responder, network
        self.latency = int(responder_latency)
        self.bytes_per_beat = requester.data_width // 8
        self.posted = []                 # accepted or not, in posting order
        self.completions = []
        self.wire = Counter()
        self._seen = set()
        self._port_free = 0
        self.finished = False
        self.end = 0
        self.delivered_end = 0          # the cycle after the responder's last message
        self.cycle = 0

    def post(self, item):
        self.posted.append(item)
        self.requester.post(item)

    def run(self, actions, max_cycles):
        req, net = self.requester, self.network
        actions = list(actions)
        while True:
            times = [req.next_event(), net.fwd.next_time(), net.rev.next_time(),
                     actions[0][0] if actions else None]
            times = [t for t in times if t is not None]
            if not times:
                self.finished = req.idle()
                break
            h = max(min(times), req.cycle)
            if h >= max_cycles:
                break
            req.run_until(h)
            self.cycle = h
            while actions and actions[0][0] <= h:
                _, act = actions.pop(0)
                again = act(self)
                if again is not None:            # the action asks to run again then
                    actions.append((max(int(again), h + 1), act))
                    actions.sort(key=lambda a: a[0])
            for t, frame in net.fwd.pop(h):
                self._to_responder(t, frame)
            for t, frame in net.rev.pop(h):
                req.push_rx(frame, t)
            req.run_until(h + 1)
            for f in req.pop_tx():
                self._count("tx", f.data)
                net.fwd.put(f.data, f.last)
            for wc in req.pop_completions():
                self.completions.append(wc)
                self.end = max(self.end, wc["cycle"] + 1)

    def _count(self, where, frame):
        cls, qp, psn, syn = frame_class(frame)
        self.wire[f"{where}_{cls}"] += 1
        if where == "tx" and cls == "data":
            if (qp, psn) in self._seen:
                self.wire["tx_retransmitted"] += 1
            self._seen.add((qp, psn))
        if cls == "nak":
            kind, code = proto.aeth_decode(syn)
            name = "rnr" if kind == proto.AethType.RNR_NAK else f"{0x60 | code:#04x}"
            self.wire[f"{where}_nak_{name}"] += 1

    def _to_responder(self, t, frame):
        done = len(self.responder.completions)
        replies = self.responder.receive(frame)
        if len(self.responder.completions) != done:
            self.delivered_end = max(self.delivered_end, t + 1)
        for reply in replies:
            self._count("rsp", reply)
            start = max(t + self.latency, self._port_free)
            beats = -(-len(reply) // self.bytes_per_beat)
            self._port_free = start + beats
            self.network.rev.put(reply, start + beats - 1)

    # -- the checks ------------------------------------------------------------------------------
    def report(self, qps):
        completes = getattr(self.requester, "completes", True)
        r = LoopReport(finished=self.finished,
                       cycles=self.end if completes else self.delivered_end,
                       delivered_cycles=self.delivered_end,
                       data_width=self.requester.data_width, messages=len(self.posted))
        r.completions = self.completions
        r.by_status = dict(Counter(proto.WcStatus(c["status"]).name for c in self.completions))
        r.wire = dict(self.wire)
        r.requester = self.requester.counters()
        r.responder = dict(self.responder.counters)
        r.network = self.network.counts
        problems = r.problems
        by_qpn = defaultdict(list)
        for c in self.responder.completions:
            by_qpn[c.qpn].append(c)
        comps = defaultdict(list)
        for c in self.completions:
            comps[c["qp"]].append(c)
        refused = {c["wr_id"] for c in self.completions if proto.WcStatus(c["status"]) in (
            proto.WcStatus.LOC_QP_OP_ERR, proto.WcStatus.LOC_LEN_ERR)}
        delivery_ok = completions_ok = all_delivered = True
        for q in qps:
            wrs = [w for w in self.posted if w.qp == q.index and w.wr_id not in refused]
            got = by_qpn.get(q.remote_qpn, [])
            errors = [c for c in comps[q.index] if proto.WcStatus(c["status"]) not in (
                proto.WcStatus.SUCCESS, proto.WcStatus.WR_FLUSH_ERR,
                proto.WcStatus.LOC_QP_OP_ERR, proto.WcStatus.LOC_LEN_ERR)]
            failed = bool(errors)
            if failed:
                r.failed_qps[q.index] = proto.WcStatus(errors[0]["status"]).name
            # exactly once, in order, byte-identical
            if len(got) > len(wrs):
                delivery_ok = False
                problems.append(f"QP {q.index}: {len(got)} messages delivered for {len(wrs)} WRs")
            for k, (c, w) in enumerate(zip(got, wrs)):
                want = (EXPECTED_KIND[w.opcode], w.payload,
                        w.imm if w.opcode in _WITH_IMM else None)
                if (c.kind, c.data, c.imm) != want:
                    delivery_ok = False
                    problems.append(f"QP {q.index}: message {k} (wr_id {w.wr_id}) arrived as "
                                    f"{c.kind} of {len(c.data)} bytes, expected {want[0]} of "
                                    f"{len(w.payload)} bytes (or different bytes/immediate)")
                    break
                r.delivered += 1
                r.payload_bytes += len(w.payload)
            if not failed and len(got) != len(wrs):
                all_delivered = False
                problems.append(f"QP {q.index}: {len(got)} of {len(wrs)} messages delivered")
            # completions
            delivered_ids = {w.wr_id for w in wrs[:len(got)]}
            accepted = [c for c in comps[q.index] if c["wr_id"] not in refused]
            ids = [c["wr_id"] for c in accepted]
            if len(ids) != len(set(ids)):
                completions_ok = False
                problems.append(f"QP {q.index}: a WR completed twice")
            for c in accepted:
                if proto.WcStatus(c["status"]) == proto.WcStatus.SUCCESS and \
                        c["wr_id"] not in delivered_ids:
                    completions_ok = False
                    problems.append(f"QP {q.index}: wr_id {c['wr_id']} completed SUCCESS but "
                                    "the responder never completed its message")
            if not completes:
                pass            # only refusals and wrong completions are checked (above)
            elif not failed:
                want_ids = [w.wr_id for w in wrs if w.signaled]
                if [(c["wr_id"], c["status"]) for c in accepted] != \
                        [(i, proto.WcStatus.SUCCESS) for i in want_ids]:
                    completions_ok = False
                    problems.append(f"QP {q.index}: completions {ids[:8]}... are not the "
                                    f"signaled WRs {want_ids[:8]}... all SUCCESS, in order")
            else:
                statuses = [proto.WcStatus(c["status"]) for c in accepted]
                n_ok = sum(1 for s in statuses if s == proto.WcStatus.SUCCESS)
                shape = statuses[n_ok:n_ok + 1] == [proto.WcStatus(errors[0]["status"])] and all(
                    s == proto.WcStatus.WR_FLUSH_ERR for s in statuses[n_ok + 1:]) and \
                    statuses[:n_ok] == [proto.WcStatus.SUCCESS] * n_ok
                order = [c["wr_id"] for c in accepted] == \
                    [w.wr_id for w in wrs if w.wr_id in set(ids)]
                first_bad = next(k for k, w in enumerate(wrs) if w.wr_id == errors[0]["wr_id"])
                flushed_all = {w.wr_id for w in wrs[first_bad:]} <= set(ids)
                if not (shape and order and flushed_all and len(errors) == 1):
                    completions_ok = False
                    problems.append(f"QP {q.index}: failed QP's completions are not SUCCESS..., "
                                    f"one error, WR_FLUSH_ERR... in posting order: "
                                    f"{[s.name for s in statuses][:10]}")
        if not completes and completions_ok:
            completions_ok = None           # not checked: the requester does not complete
        r.delivery_ok, r.completions_ok, r.all_delivered = delivery_ok, completions_ok, \
            all_delivered
        if not self.finished:
            problems.append("the loop did not finish")
        if r.cycles:
            r.goodput = r.payload_bytes / (r.cycles * self.bytes_per_beat)
        if r.delivered_cycles:
            r.delivery_goodput = r.payload_bytes / (r.delivered_cycles * self.bytes_per_beat)
        return r
