# SPDX-License-Identifier: BSD-2-Clause
"""Cycle-timed reference model of the reliable RC requester (issue 35): a shared retransmit
buffer, ACK/NAK handling, go-back-N, the local ACK and RNR timers, and completions (no Amaranth).

:class:`ReliableRequester` takes work requests (:meth:`~ReliableRequester.post`), received frames
(:meth:`~ReliableRequester.receive`, :meth:`~ReliableRequester.push_rx`), management writes of QP
rows (:meth:`~ReliableRequester.write_qp`) and the PFC ``pause`` input
(:meth:`~ReliableRequester.set_pause`); it gives out frames (:meth:`~ReliableRequester.pop_tx`,
stamped with the cycles of their first and last beat) and completions
(:meth:`~ReliableRequester.pop_completions`). It is built on the golden segmentation and frame
builders (:func:`~roce_hw.model.segment.segment_message`,
:func:`~roce_hw.model.packet.build_request_frame`), the QP table and refusal rules of
:class:`~roce_hw.model.requester.RequesterModel` and the RX front end's rules
(:func:`~roce_hw.model.rx.classify`). PROTOCOL.md §5.5-5.10a has the facts; the decisions below
are the engine's.

Time
----
Cycles are integers; :attr:`~ReliableRequester.cycle` is the next cycle not yet simulated.
:meth:`~ReliableRequester.run_until` ``(t)`` simulates cycles ``cycle .. t - 1``; within one
cycle, in this order: (1) received frames due in that cycle, in arrival order; (2) timers due
(QPs in index order): an RNR wait that ends, a local ACK timeout; (3) if the output port is
free, one frame is chosen and occupies the port for ``ceil(len(frame) / (data_width / 8))``
cycles. Arbitration is per message, like the engine's segmenter: a QP that sent a packet other
than the last of its message keeps the port for its next packet (new or replayed) as long as it
can send; otherwise the next QP (round robin, in index order after the last one that sent) that
can send takes it. The model is event driven: it jumps over cycles
in which nothing can happen (:meth:`~ReliableRequester.next_event`).

Sending
-------
* **Retransmit buffer**: one pool of ``buffer_bytes`` shared by all QPs holds the payload of
  every packet sent and not yet acknowledged (each packet takes its payload rounded up to
  ``buffer_unit`` bytes); optionally at most ``qp_cap_bytes`` per QP and ``desc_entries``
  packets (descriptors) in all. A new packet is sent only when it fits; nothing is freed before
  it is acknowledged. A QP whose next packet does not fit waits while the other QPs keep
  sending. PSN arithmetic adds a cap of :data:`PSN_CAP` = 2**23 - 1 unacknowledged packets per QP
  (two PSNs further apart cannot be ordered, PROTOCOL.md §5.6).
* **AckReq**: as the segmentation sets it (last packet of a message, every ``ack_req_every``-th
  packet), and also on a new packet after which the pool, the QP's cap or the descriptors are
  more than half full (less than ``max(limit // 2, 4096)`` bytes, ``max(entries // 2, 1)``
  descriptors free), or 2**22 PSNs are outstanding, or the QP's ACK timer has half its
  timeout or less left. Without the buffer rules a window smaller than ``ack_req_every``
  packets would fill with packets no ACK is asked for, and only timeouts could free it (a replay
  carries the same AckReq bits); without the timer rule a long message would see its timer
  expire before it asks for an ACK whenever ``ack_req_every`` packets take longer than the
  timeout. (Per-message arbitration matters too: packets without AckReq are only ever followed
  at once by the rest of their message, never left waiting behind other QPs.)
* **Go-back-N replay** resends the stored packets from the given PSN on: the same transport
  headers (BTH, RETH with the R_Key, ImmDt) and payload as the first time, so a message acked
  part-way resumes with its MIDDLE/LAST packets without RETH, as rxe's
  ``retry_first_write_send`` does, and later messages are replayed whole. Only the IPv4
  identification differs (one counter for every frame, retransmissions included), and so do
  the IPv4 checksum and the iCRC, which cover it: a replayed frame equals the original from the
  UDP header to the last pad byte.

Receiving (ACKNOWLEDGE, opcode 0x11; CNP, 0x81)
-----------------------------------------------
A frame first passes the RX front end's checks (:func:`~roce_hw.model.rx.classify`: MAC, IPv4,
UDP, iCRC); then the ACK handler's rules judge it, in the hardware's order
(:func:`roce_hw.model.ack.ack_verdict`, one rule set for both models): an ACKNOWLEDGE of BTH +
AETH only or a CNP; a known syndrome (ACK, RNR NAK, NAK 0x60-0x63); a local QP (QPN 256 +
index) in RTS; from the QP's ``remote_ip``; its P_Key; a PSN from ``una`` to the last one sent.
Every packet is counted by its verdict in :attr:`~ReliableRequester.counters` (the names of
:data:`roce_hw.proto.ACK_COUNTERS`: ``acks``, ``naks_seq``, ``rnr_naks``, ``naks_fatal``,
``cnps``, and the drops ``not_ack``, ``bad_syndrome``, ``unknown_qp``, ``qp_not_open``,
``bad_src``, ``bad_pkey``, ``acks_stale`` -- a duplicate ACK for ``una - 1`` among them --,
``naks_stale``, ``psn_unsent``); the NAKs acted on are also counted by code (``nak_seq_err``,
``nak_inv_req``, ``nak_rem_access``, ``nak_rem_op``).

* **ACK** with PSN ``A``: retires every packet up to ``A`` and completes, in posting order,
  every WR whose last packet that covers (one coalesced ACK can complete several).
* **Every NAK** implicitly acknowledges the packets before its PSN ``P`` (the responder executes
  in order; rxe_comp.c ``check_psn`` completes the WQEs before any response PSN, and rdmavt's
  ``do_rc_ack`` does ``ack_psn--`` for every NAK type). **Decision taken here**: this includes
  the RNR NAK, which otherwise retires nothing (the NAKed packet stays), so that an exhausted
  ``rnr_retry`` fails the WR that was not ready, not an earlier one whose ACK was lost.
* **NAK PSN sequence error** (0x60): go-back-N from ``P``, ``retry_cnt`` counter decremented.
  A second sequence NAK for the same ``P`` with no progress since a go-back to ``P`` started
  after a sequence NAK or an RNR wait is a repeat of the first (a responder NAKs a gap once
  until ``P`` arrives): it is ignored (``nak_seq_repeat``). After a timeout a sequence NAK for
  ``P`` acts again (the replayed ``P`` was lost).
* **RNR NAK** (0x20 | code): the QP stops sending; after the RNR time of the code
  (:data:`roce_hw.proto.RNR_TIMER_US`, rounded **up** to whole cycles, counted from the cycle
  the NAK arrives) it resends from ``P``. ``rnr_retry`` counter decremented (7: infinite). The
  ACK timer is off during the wait, so it never cuts it short; sequence NAKs that arrive during
  the wait (the responder NAKs the packets that were in flight behind ``P``) only retire.
  An ACK that covers ``P`` ends the wait early. A duplicated RNR NAK that arrives after the wait
  cannot be told from a new one and starts another wait.
* **Fatal NAKs** 0x61/0x62/0x63: the WR holding ``P`` completes REM_INV_REQ_ERR /
  REM_ACCESS_ERR / REM_OP_ERR, the QP goes to ERROR and every later WR of the QP completes
  WR_FLUSH_ERR; other QPs are not disturbed.
* **CNP**: counted per QP (:meth:`~ReliableRequester.qp_stats`, ``cnp``) when it passes the
  checks (``cnps``).

Timers and retries
------------------
* Local ACK timeout ``4.096 us * 2**timeout`` (QP row ``timeout``; 0: no timer), in cycles of
  ``clock_hz`` rounded up (:meth:`~ReliableRequester.timeout_cycles`). Armed when a packet is
  sent while it is off; re-armed at every forward progress (off when nothing is left) and at
  every go-back-N; off during an RNR wait. It fires exactly when due in this model; the hardware
  may be late by ``timer_slack_cycles`` (one sweep of its timer RAM), and every firing is
  logged in :attr:`~ReliableRequester.events` with ``due`` and ``latest``. On firing: go-back-N
  from the oldest unacknowledged PSN, ``retry_cnt`` counter decremented.
* ``retry_cnt`` 0-7 allows that many retries (IBTA; 7 is not infinite), ``rnr_retry`` 0-6 that
  many, 7 infinite. Both counters reload from the row on forward progress (the oldest
  unacknowledged PSN moves). A retry needed with its counter at 0: the WR holding the oldest
  unacknowledged PSN (or the RNR NAK's PSN) completes RETRY_EXC_ERR / RNR_RETRY_EXC_ERR, the QP
  goes to ERROR, the rest are flushed.
* ``pause`` (PFC) freezes both timers while it is set (timers count unpaused cycles only); it
  does not stop the output (the MAC's backpressure does that).

Completions
-----------
:class:`WorkCompletion` ``{wr_id, qp, opcode, status, byte_len, cycle}``; ``opcode`` a
:class:`~roce_hw.proto.WcOpcode` (SEND for SEND/SEND_WITH_IMM, RDMA_WRITE for the WRITEs;
``None`` for a refused WR whose opcode is not one the engine sends), ``byte_len`` the WR's
length (rxe ``make_send_cqe``: ``wqe->dma.length``) whatever the status. A signaled WR
completes SUCCESS once all its packets are acknowledged; an unsignaled one completes silently;
every failed WR gets an error completion, signaled or not. Refused WRs (the rules of
:func:`~roce_hw.model.requester.refusal`, and a payload whose size differs from ``length``:
LOC_LEN_ERR) complete at once, never enter the send queue and so may overtake earlier WRs of the
QP; a WR posted to a QP in ERROR is refused LOC_QP_OP_ERR, as the engine does (ibverbs would
flush it).

Management writes
-----------------
:meth:`~ReliableRequester.write_qp` writes a whole row, as the management port or the connection
manager do. It ends what the QP was doing: every WR not yet complete completes WR_FLUSH_ERR,
its packets leave the buffer, its timers stop, its retry counters reload from the new row, and
``una_psn`` is set to the row's ``next_psn``: the first packet after carries that PSN. The
statistics (:meth:`~ReliableRequester.qp_stats`) are not reset.
"""

import math
from collections import Counter, deque
from dataclasses import asdict, dataclass, replace
from fractions import Fraction

from .. import proto
from .ack import AckItem, ack_verdict
from .packet import build_request_frame
from .psn import psn_diff
from .requester import RequesterModel, refusal, request_opcode
from .rx import RxCounterModel, classify
from .segment import segment_message
from .timers import ack_timeout_cycles_exact, rnr_wait_cycles_exact

__all__ = ["PSN_CAP", "TxRecord", "WorkCompletion", "TimerEvent", "ReliableRequester",
           "ack_timeout_cycles", "rnr_wait_cycles", "wc_opcode"]

#: Most unacknowledged packets of one QP: two PSNs 2**23 or more apart cannot be ordered.
PSN_CAP = (1 << 23) - 1

#: Fatal NAK code -> the status of the WR it fails.
_FATAL = {int(proto.NakCode.INVALID_REQUEST): proto.WcStatus.REM_INV_REQ_ERR,
          int(proto.NakCode.REMOTE_ACCESS_ERROR): proto.WcStatus.REM_ACCESS_ERR,
          int(proto.NakCode.REMOTE_OPERATIONAL_ERROR): proto.WcStatus.REM_OP_ERR}
#: Per-code counts of the NAKs acted on, beside the ACK handler's verdicts (``naks_seq``,
#: ``naks_fatal``).
_NAK_NAMES = {0: "nak_seq_err", 1: "nak_inv_req", 2: "nak_rem_access", 3: "nak_rem_op"}

_WC = {proto.WrOpcode.SEND: proto.WcOpcode.SEND, proto.WrOpcode.SEND_WITH_IMM: proto.WcOpcode.SEND,
       proto.WrOpcode.RDMA_WRITE: proto.WcOpcode.RDMA_WRITE,
       proto.WrOpcode.RDMA_WRITE_WITH_IMM: proto.WcOpcode.RDMA_WRITE}

_QP_STATS = ("retransmitted", "timeouts", "rnr_waits", "cnp", "naks", "go_backs")
_RTS = proto.QPState.RTS
_INFINITE_RNR = 7


def wc_opcode(opcode):
    """The :class:`~roce_hw.proto.WcOpcode` of a work request opcode (``None`` if the requester
    does not send that opcode)."""
    return _WC.get(request_opcode(opcode))


def ack_timeout_cycles(timeout, clock_hz):
    """Cycles of the local ACK timeout ``4.096 us * 2**timeout`` at ``clock_hz``, rounded up;
    0 for ``timeout`` 0 (no timer). (The exact length: the timers model's.)"""
    if not 0 <= int(timeout) < 32:
        raise ValueError(f"timeout = {timeout} is not a 5-bit value")
    if timeout == 0:
        return 0
    return math.ceil(ack_timeout_cycles_exact(int(timeout), clock_hz))


def rnr_wait_cycles(code, clock_hz):
    """Cycles of the RNR wait of RNR NAK timer ``code`` (:data:`roce_hw.proto.RNR_TIMER_US`) at
    ``clock_hz``, rounded up (never short). (The exact length: the timers model's.)"""
    if not 0 <= int(code) < 32:
        raise ValueError(f"RNR timer code {code} is not a 5-bit value")
    return math.ceil(rnr_wait_cycles_exact(int(code), clock_hz))


@dataclass(frozen=True)
class TxRecord:
    """A frame on the output: cycles of its ``first`` and ``last`` beat, its bytes ``data``, its
    QP index, PSN and BTH opcode, and whether it is a retransmission (a packet sent before)."""
    first: int
    last: int
    data: bytes
    qp: int
    psn: int
    opcode: int
    retransmission: bool


@dataclass(frozen=True)
class WorkCompletion:
    """A send completion (``struct ibv_wc`` fields the engine gives) and the cycle it was made
    in."""
    wr_id: int
    qp: int
    opcode: proto.WcOpcode | None
    status: proto.WcStatus
    byte_len: int
    cycle: int

    def as_dict(self):
        return asdict(self)


@dataclass(frozen=True)
class TimerEvent:
    """Something the timers or a NAK made happen: ``kind`` is ``"ack_timeout"`` (go-back-N from
    ``psn``), ``"rnr_wait"`` (an RNR NAK for ``psn``; ``due`` is when the wait ends),
    ``"rnr_end"`` (the wait ended; resend from ``psn``), ``"go_back"`` (a sequence NAK),
    ``"qp_error"`` (``status`` failed the QP). For timer events ``due`` is the cycle the model
    acts in and ``latest`` = ``due + timer_slack_cycles`` the last cycle the hardware may act in;
    both are ``cycle`` for the others."""
    cycle: int
    qp: int
    kind: str
    psn: int
    due: int
    latest: int
    status: proto.WcStatus | None = None


class _Wr:
    __slots__ = ("wr_id", "qp", "op", "length", "signaled", "payload", "remote_addr", "r_key",
                 "imm", "solicited", "packets", "first_psn", "last_psn", "n_sent")

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)
        self.packets = None
        self.first_psn = self.last_psn = None
        self.n_sent = 0


class _Pkt:
    __slots__ = ("spec", "wr", "charge")

    def __init__(self, spec, wr, charge):
        self.spec, self.wr, self.charge = spec, wr, charge


class _QP:
    """The reliability state of one QP (reset by every management write)."""

    def __init__(self, row, t_cycles):
        self.unsent = deque()       # WRs with packets not yet sent (head may be part-sent)
        self.inflight = deque()     # WRs with a packet sent, not complete (posting order)
        self.out = deque()          # _Pkt sent and not acknowledged: PSNs una .. next - 1
        self.resend = 0             # index in out of the next packet to resend; len(out): none
        self.used = 0               # buffer bytes held
        self.retry_left = row["retry_cnt"]
        self.rnr_left = row["rnr_retry"]
        self.t_cycles = t_cycles    # local ACK timeout (0: none)
        self.deadline = None        # timer time the ACK timer fires at
        self.rnr_until = None       # timer time the RNR wait ends at
        self.rnr_psn = None
        self.nak_armed = True       # a sequence NAK for una starts a go-back-N

    def wrs(self):
        """Every WR not complete, in posting order."""
        out = list(self.inflight)
        out += [w for w in self.unsent if not (out and w is out[-1])]
        return out


class ReliableRequester:
    """The reliable RC requester, transaction level, cycle timed (see the module docstring).

    Parameters
    ----------
    n_qp : int
        Rows of the QP table (local QPN = 256 + index).
    buffer_bytes : int
        Size of the shared retransmit buffer in payload bytes (>= 4096: a packet of the largest
        PMTU must fit).
    qp_cap_bytes : int or None
        Most buffer bytes one QP may hold (>= 4096), ``None`` for no cap.
    buffer_unit : int
        Allocation granularity in bytes: a packet takes its payload rounded up to it.
    desc_entries : int or None
        Most packets held in all (descriptor RAM depth), ``None`` for no limit.
    data_width : int
        Output width in bits: a frame occupies ``ceil(bytes / (data_width / 8))`` cycles.
    clock_hz : int, float or Fraction
        Clock frequency, to turn the timers into cycles.
    timer_slack_cycles : int
        How late the hardware may act on a due timer (logged in :attr:`events`).
    ack_req_every, ttl, ip_id_start, local_mac, local_ip
        As :class:`~roce_hw.model.requester.RequesterModel`.

    Attributes
    ----------
    cycle : int
        The next cycle to simulate.
    counters : collections.Counter
        Event counters: ``ack_items`` and the ACK handler's verdicts
        (:data:`roce_hw.proto.ACK_COUNTERS`, see the module docstring), the NAKs acted on by
        code (``nak_seq_err``, ``nak_inv_req``, ``nak_rem_access``, ``nak_rem_op``), and
        ``tx_frames``, ``tx_new``, ``retransmitted``, ``go_back_nak``, ``timeouts``,
        ``rnr_waits``, ``rnr_ends``, ``nak_seq_repeat``, ``nak_seq_in_rnr_wait``,
        ``rnr_nak_repeat``, ``retry_exceeded``, ``rnr_retry_exceeded``, ``refused``,
        ``flushed``.
    rx : RxCounterModel
        The RX front end's counters of every frame received.
    events : list of TimerEvent
        Timer firings, go-backs, RNR waits and QP errors, in order.

    Raises
    ------
    ValueError
        Bad sizes, widths, clock or slack.
    """

    def __init__(self, n_qp=16, *, buffer_bytes=128 * 1024, qp_cap_bytes=None, buffer_unit=1,
                 desc_entries=None, data_width=512, clock_hz=322_000_000,
                 timer_slack_cycles=0, ack_req_every=64, ttl=64, ip_id_start=0,
                 local_mac=0x02_00_00_00_00_01, local_ip=0x0A_00_00_01):
        def positive(name, v, minimum=1):
            if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
                raise ValueError(f"{name} = {v!r} must be an integer >= {minimum}")
            return v
        self.buffer_bytes = positive("buffer_bytes", buffer_bytes, proto.MAX_PMTU_BYTES)
        self.qp_cap_bytes = None if qp_cap_bytes is None else \
            positive("qp_cap_bytes", qp_cap_bytes, proto.MAX_PMTU_BYTES)
        self.buffer_unit = positive("buffer_unit", buffer_unit)
        self.desc_entries = None if desc_entries is None else \
            positive("desc_entries", desc_entries)
        if data_width not in (64, 128, 256, 512, 1024):
            raise ValueError(f"data_width = {data_width!r} is not 64, 128, 256, 512 or 1024")
        self.data_width = data_width
        self.bytes_per_beat = data_width // 8
        if not Fraction(clock_hz) > 0:
            raise ValueError(f"clock_hz = {clock_hz!r} must be > 0")
        self.clock_hz = clock_hz
        self.timer_slack_cycles = positive("timer_slack_cycles", timer_slack_cycles, 0)
        self.ip_id = int(ip_id_start) & 0xFFFF
        self._req = RequesterModel(n_qp=n_qp, ack_req_every=ack_req_every, ttl=ttl,
                                   local_mac=local_mac, local_ip=local_ip)
        self.n_qp = n_qp
        self.local_mac, self.local_ip = local_mac, local_ip
        self.ack_req_every = ack_req_every
        self.cycle = 0
        self.counters = Counter()
        self.rx = RxCounterModel()
        self.events = []
        self._qp = [_QP(self._req.qps.rows[i], 0) for i in range(n_qp)]
        self._stats = [Counter() for _ in range(n_qp)]
        self._active = set()         # QPs with WRs or packets
        self._rr = -1                # last QP that sent
        self._owner = None           # QP in the middle of a message (it keeps the port)
        self._port_free = 0
        self._used = 0
        self._desc = 0
        self._rxq = deque()          # (cycle, frame, bad), in arrival order
        self._tx = []
        self._completions = []
        self._paused = False
        self._tt_cycle = 0           # timer time = _tt_base + unpaused cycles since _tt_cycle
        self._tt_base = 0

    # ------------------------------------------------------------------ parameters
    def timeout_cycles(self, timeout):
        """Local ACK timeout of QP row value ``timeout`` in cycles (0: none)."""
        return ack_timeout_cycles(timeout, self.clock_hz)

    def rnr_cycles(self, code):
        """RNR wait of timer ``code`` in cycles (rounded up)."""
        return rnr_wait_cycles(code, self.clock_hz)

    # ------------------------------------------------------------------ QP table
    def write_qp(self, index, ctx):
        """Management write of QP row ``index`` (fields of :data:`roce_hw.proto.
        QP_CONTEXT_FIELDS`, missing ones 0), at :attr:`cycle`; see the module docstring."""
        if not 0 <= index < self.n_qp:
            raise ValueError(f"QP index {index} is out of range (n_qp = {self.n_qp})")
        self._fail(index, None, flush_only=True)
        self._req.write_qp(index, ctx)
        row = self._req.qps.rows[index]
        row["una_psn"] = row["next_psn"]
        self._qp[index] = _QP(row, self.timeout_cycles(row["timeout"]))
        self._active.discard(index)

    def read_qp(self, index):
        """A copy of QP row ``index`` (``next_psn``: next new PSN; ``una_psn``: oldest
        unacknowledged)."""
        return dict(self._req.qps.rows[index])

    def qp_stats(self, index):
        """Statistics of QP ``index``: ``retransmitted``, ``timeouts``, ``rnr_waits``, ``cnp``,
        ``naks`` (all kinds), ``go_backs``."""
        return {k: self._stats[index][k] for k in _QP_STATS}

    def outstanding(self, index):
        """``(packets, buffer bytes)`` QP ``index`` holds."""
        st = self._qp[index]
        return len(st.out), st.used

    @property
    def buffer_used(self):
        """Buffer bytes held by all QPs."""
        return self._used

    # ------------------------------------------------------------------ inputs
    def post(self, *, qp, opcode, payload, length=None, wr_id=0, remote_addr=0, r_key=0, imm=0,
             solicited=False, signaled=True):
        """Post a work request at :attr:`cycle`. Returns the :class:`WorkCompletion` of a
        refused WR (also queued for :meth:`pop_completions`), else ``None``."""
        payload = bytes(payload)
        length = len(payload) if length is None else int(length)
        row = self._req.qps.rows[qp] if 0 <= qp < self.n_qp else None
        status = refusal(row, opcode, length)
        if status is None and length != len(payload):
            status = proto.WcStatus.LOC_LEN_ERR
        if status is not None:
            self.counters["refused"] += 1
            return self._complete(wr_id, qp, wc_opcode(opcode), status, length)
        self._qp[qp].unsent.append(_Wr(
            wr_id=wr_id, qp=qp, op=request_opcode(opcode), length=length,
            signaled=bool(signaled), payload=payload, remote_addr=remote_addr, r_key=r_key,
            imm=imm, solicited=solicited))
        self._active.add(qp)
        return None

    def push_rx(self, frame, cycle, *, bad=False):
        """A frame that arrives at ``cycle`` (processed at step 1 of that cycle, or of
        :attr:`cycle` if that is later). ``bad``: the MAC's bad-frame flag."""
        self._rxq.append((int(cycle), bytes(frame), bool(bad)))

    def receive(self, frame, *, bad=False):
        """A frame that arrives now (at :attr:`cycle`), processed at once after the frames
        queued for this cycle."""
        self.push_rx(frame, self.cycle, bad=bad)
        self._do_rx(self.cycle)

    def set_pause(self, on):
        """The PFC ``pause`` input from :attr:`cycle` on (timers freeze while it is set)."""
        on = bool(on)
        if on != self._paused:
            self._tt_base = self._tt(self.cycle)
            self._tt_cycle = self.cycle
            self._paused = on

    # ------------------------------------------------------------------ outputs
    def pop_tx(self):
        """Frames sent since the last call: ``[TxRecord]``."""
        out, self._tx = self._tx, []
        return out

    def pop_completions(self):
        """Completions made since the last call: ``[WorkCompletion]``."""
        out, self._completions = self._completions, []
        return out

    def idle(self):
        """True when no WR, packet, timer or received frame is pending."""
        return not self._active and not self._rxq

    # ------------------------------------------------------------------ running
    def tick(self, n=1):
        """Simulate ``n`` cycles."""
        self.run_until(self.cycle + int(n))

    def run_until(self, cycle):
        """Simulate every cycle before ``cycle``; :attr:`cycle` becomes ``cycle``."""
        cycle = int(cycle)
        while True:
            c = self.next_event()
            if c is None or c >= cycle:
                break
            self._step(c)
        self.cycle = max(self.cycle, cycle)

    def next_event(self):
        """The first cycle (>= :attr:`cycle`) in which something can happen, or ``None``."""
        times = []
        if self._rxq:
            times.append(self._rxq[0][0])
        can_send = False
        for i in self._active:
            st = self._qp[i]
            for due in (st.rnr_until, st.deadline if st.rnr_until is None else None):
                if due is not None and not self._paused:
                    times.append(self._tt_cycle + due - self._tt_base)
            if not can_send and self._can_send(i) is not None:
                can_send = True
        if can_send:
            times.append(self._port_free)
        return max(self.cycle, min(times)) if times else None

    def _tt(self, c):
        return self._tt_base + (0 if self._paused else c - self._tt_cycle)

    def _step(self, c):
        self.cycle = c
        self._do_rx(c)
        tt = self._tt(c)
        for i in sorted(self._active):
            st = self._qp[i]
            if st.rnr_until is not None and tt >= st.rnr_until:
                self._rnr_end(i, c)
            elif st.rnr_until is None and st.deadline is not None and tt >= st.deadline:
                self._timeout(i, c)
        if c >= self._port_free:
            self._send_one(c)
        self.cycle = c + 1

    def _do_rx(self, c):
        while self._rxq and self._rxq[0][0] <= c:
            _, frame, bad = self._rxq.popleft()
            self._receive(frame, bad, c)

    # ------------------------------------------------------------------ sending
    def _charge(self, spec):
        u = self.buffer_unit
        return -(-len(spec.payload) // u) * u

    def _head_packet(self, i):
        """The next new packet of QP ``i`` (segmenting its head WR when it starts)."""
        st = self._qp[i]
        wr = st.unsent[0]
        if wr.packets is None:
            row = self._req.qps.rows[i]
            wr.packets = segment_message(
                wr.op, wr.payload, pmtu=proto.pmtu_bytes(row["pmtu"]),
                start_psn=row["next_psn"], remote_addr=wr.remote_addr, r_key=wr.r_key,
                imm=wr.imm, solicited=wr.solicited, ack_req_every=self.ack_req_every)
            wr.first_psn = wr.packets[0].psn
            wr.last_psn = wr.packets[-1].psn
        return wr, wr.packets[wr.n_sent]

    def _can_send(self, i):
        """What QP ``i`` would send now: ``("replay", _Pkt)``, ``("new", wr, spec, charge)``
        or ``None``."""
        st = self._qp[i]
        if self._req.qps.rows[i]["state"] != _RTS or st.rnr_until is not None:
            return None
        if st.resend < len(st.out):
            return ("replay", st.out[st.resend])
        if not st.unsent or len(st.out) >= PSN_CAP:
            return None
        wr, spec = self._head_packet(i)
        charge = self._charge(spec)
        if self._used + charge > self.buffer_bytes:
            return None
        if self.qp_cap_bytes is not None and st.used + charge > self.qp_cap_bytes:
            return None
        if self.desc_entries is not None and self._desc >= self.desc_entries:
            return None
        return ("new", wr, spec, charge)

    def _closing(self, st, charge, c):
        """A new packet taking ``charge`` bytes leaves a limit more than half used, or goes out
        when less than half the QP's ACK timeout is left."""
        if st.deadline is not None and 2 * (st.deadline - self._tt(c)) <= st.t_cycles:
            return True
        free = self.buffer_bytes - self._used - charge
        if free < max(self.buffer_bytes // 2, proto.MAX_PMTU_BYTES):
            return True
        if self.qp_cap_bytes is not None and \
                self.qp_cap_bytes - st.used - charge < max(self.qp_cap_bytes // 2,
                                                           proto.MAX_PMTU_BYTES):
            return True
        if self.desc_entries is not None and \
                self.desc_entries - self._desc - 1 < max(self.desc_entries // 2, 1):
            return True
        return len(st.out) + 1 >= 1 << 22

    def _send_one(self, c):
        if self._owner is not None and self._can_send(self._owner) is not None:
            order = [self._owner]           # the rest of a message goes first
        else:
            self._owner = None
            order = sorted(self._active)
            k = next((n for n, i in enumerate(order) if i > self._rr), 0)
            order = order[k:] + order[:k]
        for i in order:
            what = self._can_send(i)
            if what is None:
                continue
            st = self._qp[i]
            row = self._req.qps.rows[i]
            if what[0] == "replay":
                pkt = what[1]
                st.resend += 1
                retx = True
                self.counters["retransmitted"] += 1
                self._stats[i]["retransmitted"] += 1
            else:
                _, wr, spec, charge = what
                if not spec.ack_req and self._closing(st, charge, c):
                    spec = replace(spec, ack_req=True)
                    wr.packets[wr.n_sent] = spec
                pkt = _Pkt(spec, wr, charge)
                if wr.n_sent == 0:
                    st.inflight.append(wr)
                wr.n_sent += 1
                if wr.n_sent == len(wr.packets):
                    st.unsent.popleft()
                st.out.append(pkt)
                st.resend += 1
                st.used += charge
                self._used += charge
                self._desc += 1
                row["next_psn"] = (spec.psn + 1) & proto.PSN_MASK
                retx = False
                self.counters["tx_new"] += 1
            frame = build_request_frame(self._req.path(row), pkt.spec, ip_id=self.ip_id)
            self.ip_id = (self.ip_id + 1) & 0xFFFF
            beats = -(-len(frame) // self.bytes_per_beat)
            self._tx.append(TxRecord(c, c + beats - 1, frame, i, pkt.spec.psn,
                                     int(pkt.spec.opcode), retx))
            self.counters["tx_frames"] += 1
            self._port_free = c + beats
            self._rr = i
            self._owner = None if pkt.spec.psn == pkt.wr.last_psn else i
            if st.deadline is None and st.t_cycles:
                st.deadline = self._tt(c) + st.t_cycles
            return

    # ------------------------------------------------------------------ receiving
    def _receive(self, frame, bad, c):
        res = classify(frame, bad=bad, local_mac=self.local_mac, local_ip=self.local_ip)
        self.rx.add(res)
        if res.kind != "roce":
            return
        f = res.fields
        bth = f["bth"]
        index = bth["dest_qp"] - proto.LOCAL_QPN_BASE
        aeth = f.get("aeth") or {}
        item = AckItem(src_ip=f["src_ip"], dest_qp=bth["dest_qp"], psn=bth["psn"],
                       opcode=bth["opcode"], syndrome=aeth.get("syndrome", 0),
                       msn=aeth.get("msn", 0), p_key=bth["p_key"],
                       bth_aeth_only=bool(f.get("bth_aeth_only")))
        local = 0 <= index < self.n_qp
        row = self._req.qps.rows[index] if local else {}
        una = row.get("una_psn", 0)
        # The hardware's rule set (one source): "PSN after the last one sent" is una plus
        # the packets outstanding.
        verdict, kind = ack_verdict(
            item, n_qp=self.n_qp, una=una,
            row=dict(row, next_psn=(una + len(self._qp[index].out)) & proto.PSN_MASK)
            if local else {})
        self.counters["ack_items"] += 1
        self.counters[verdict] += 1
        if kind is None:
            return
        if kind == proto.AckKind.CNP:
            self._stats[index]["cnp"] += 1
            return
        st = self._qp[index]
        psn = bth["psn"]
        d = psn_diff(psn, una)
        code = item.syndrome & 0x1F
        if kind == proto.AckKind.ACK:
            self._retire(index, d + 1, c)
            return
        self._stats[index]["naks"] += 1
        if d:
            self._retire(index, d, c)           # every NAK acknowledges what precedes it
        if kind == proto.AckKind.RNR:
            self._rnr_nak(index, psn, code, c)
            return
        self.counters[_NAK_NAMES[code]] += 1
        if code in _FATAL:
            self._fail(index, _FATAL[code], cycle=c, psn=psn)
            return
        self._seq_nak(index, psn, c)

    def _retire(self, i, n, c):
        """The oldest ``n`` packets of QP ``i`` are acknowledged."""
        st, row = self._qp[i], self._req.qps.rows[i]
        for _ in range(n):
            pkt = st.out.popleft()
            st.used -= pkt.charge
            self._used -= pkt.charge
            self._desc -= 1
        st.resend = max(0, st.resend - n)
        una = row["una_psn"] = (row["una_psn"] + n) & proto.PSN_MASK
        while st.inflight and psn_diff(st.inflight[0].last_psn, una) < 0:
            wr = st.inflight.popleft()
            if wr.signaled:
                self._complete(wr.wr_id, i, _WC[wr.op], proto.WcStatus.SUCCESS, wr.length, c)
        st.retry_left, st.rnr_left = row["retry_cnt"], row["rnr_retry"]
        st.nak_armed = True
        if st.rnr_until is not None and psn_diff(una, st.rnr_psn) > 0:
            st.rnr_until = None                 # the NAKed packet got through after all
        if st.rnr_until is None:
            st.deadline = self._tt(c) + st.t_cycles if st.out and st.t_cycles else None
        self._settle(i)

    def _seq_nak(self, i, psn, c):
        st = self._qp[i]
        if st.rnr_until is not None:
            self.counters["nak_seq_in_rnr_wait"] += 1
            return
        if not st.nak_armed:
            self.counters["nak_seq_repeat"] += 1
            return
        if self._go_back(i, c, psn, nak_armed=False):
            self.counters["go_back_nak"] += 1
            self.events.append(TimerEvent(c, i, "go_back", psn, c, c))

    def _rnr_nak(self, i, psn, code, c):
        st, row = self._qp[i], self._req.qps.rows[i]
        if st.rnr_until is not None:
            self.counters["rnr_nak_repeat"] += 1
            return
        if st.rnr_left == 0:
            self.counters["rnr_retry_exceeded"] += 1
            self._fail(i, proto.WcStatus.RNR_RETRY_EXC_ERR, cycle=c, psn=psn)
            return
        if row["rnr_retry"] != _INFINITE_RNR:
            st.rnr_left -= 1
        wait = self.rnr_cycles(code)
        st.rnr_until = self._tt(c) + wait
        st.rnr_psn = psn
        st.resend = 0
        st.deadline = None
        st.nak_armed = False
        self.counters["rnr_waits"] += 1
        self._stats[i]["rnr_waits"] += 1
        due = c + wait
        self.events.append(TimerEvent(c, i, "rnr_wait", psn, due, due))

    def _rnr_end(self, i, c):
        st = self._qp[i]
        st.rnr_until = None
        self.counters["rnr_ends"] += 1
        self.events.append(TimerEvent(c, i, "rnr_end", st.rnr_psn, c,
                                      c + self.timer_slack_cycles))

    def _timeout(self, i, c):
        st, row = self._qp[i], self._req.qps.rows[i]
        st.deadline = None
        if not st.out:
            return
        self.counters["timeouts"] += 1
        self._stats[i]["timeouts"] += 1
        psn = row["una_psn"]
        self.events.append(TimerEvent(c, i, "ack_timeout", psn, c, c + self.timer_slack_cycles))
        self._go_back(i, c, psn, nak_armed=True)

    def _go_back(self, i, c, psn, *, nak_armed):
        """A retry of QP ``i`` from its oldest unacknowledged packet (``psn``): False (and the
        QP failed) if ``retry_cnt`` retries were spent."""
        st = self._qp[i]
        if st.retry_left == 0:
            self.counters["retry_exceeded"] += 1
            self._fail(i, proto.WcStatus.RETRY_EXC_ERR, cycle=c, psn=psn)
            return False
        st.retry_left -= 1
        st.nak_armed = nak_armed
        st.resend = 0
        self._stats[i]["go_backs"] += 1
        st.deadline = self._tt(c) + st.t_cycles if st.t_cycles else None
        return True

    # ------------------------------------------------------------------ completions
    def _complete(self, wr_id, qp, opcode, status, byte_len, cycle=None):
        wc = WorkCompletion(wr_id, qp, opcode, proto.WcStatus(status), byte_len,
                            self.cycle if cycle is None else cycle)
        self._completions.append(wc)
        self.counters[f"wc_{wc.status.name}"] += 1
        return wc

    def _fail(self, i, status, *, cycle=None, psn=None, flush_only=False):
        """End QP ``i``'s work: the first WR not complete gets ``status`` (unless
        ``flush_only``), the others WR_FLUSH_ERR; its packets leave the buffer; unless
        ``flush_only`` the QP goes to ERROR."""
        st = self._qp[i]
        c = self.cycle if cycle is None else cycle
        for n, wr in enumerate(st.wrs()):
            s = status if n == 0 and not flush_only else proto.WcStatus.WR_FLUSH_ERR
            if s == proto.WcStatus.WR_FLUSH_ERR:
                self.counters["flushed"] += 1
            self._complete(wr.wr_id, i, _WC[wr.op], s, wr.length, c)
        for pkt in st.out:
            self._used -= pkt.charge
            self._desc -= 1
        st.out.clear()
        st.unsent.clear()
        st.inflight.clear()
        st.used = 0
        st.resend = 0
        st.deadline = st.rnr_until = None
        if not flush_only:
            self._req.qps.rows[i]["state"] = proto.QPState.ERROR
            self.events.append(TimerEvent(c, i, "qp_error", psn, c, c, status))
        self._active.discard(i)

    def _settle(self, i):
        st = self._qp[i]
        if not st.unsent and not st.out:
            self._active.discard(i)
