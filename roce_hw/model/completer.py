# SPDX-License-Identifier: BSD-2-Clause
"""Model of the completer (:class:`roce_hw.ctrl.completer.Completer`): the work requests sent,
the ACK handler's events, the retransmission timers' decisions and QP resets in; ibverbs
completions, go-back-N resume requests (the walk), timer news and QP errors out."""

from collections import deque

from .. import proto
from .psn import psn_lt, psn_le

__all__ = ["wc_opcode_of", "fatal_status", "CompleterModel"]

_WC = {proto.WrOpcode.RDMA_WRITE: proto.WcOpcode.RDMA_WRITE,
       proto.WrOpcode.RDMA_WRITE_WITH_IMM: proto.WcOpcode.RDMA_WRITE,
       proto.WrOpcode.SEND: proto.WcOpcode.SEND,
       proto.WrOpcode.SEND_WITH_IMM: proto.WcOpcode.SEND,
       proto.WrOpcode.RDMA_READ: proto.WcOpcode.RDMA_READ}

_FATAL = {proto.NakCode.INVALID_REQUEST: proto.WcStatus.REM_INV_REQ_ERR,
          proto.NakCode.REMOTE_ACCESS_ERROR: proto.WcStatus.REM_ACCESS_ERR,
          proto.NakCode.REMOTE_OPERATIONAL_ERROR: proto.WcStatus.REM_OP_ERR}

#: ``start_packet`` is a packet index within a message: below 2**31 bytes / 256 bytes (the
#: smallest PMTU), as ``verbs.START_PACKET_BITS``.
_START_PACKET_MASK = proto.MAX_MESSAGE_BYTES // min(proto.PMTU_BYTES.values()) - 1

#: The fields of a WR the walk sends again (``verbs.resume_layout`` less ``qp``,
#: ``start_packet``, ``start_psn``).
_RESUME_FIELDS = ("wr_id", "opcode", "remote_addr", "r_key", "length", "imm", "signaled",
                  "solicited")


def wc_opcode_of(opcode):
    """The ``ibv_wc_opcode`` of a send completion for a :class:`~roce_hw.proto.WrOpcode`, as
    libibverbs reports it (a ``*_WITH_IMM`` request completes as its plain opcode; the
    immediate is a receive-side flag). A value no WR opcode has (the TX path refuses those and
    never posts them) completes as SEND."""
    return int(_WC.get(opcode, proto.WcOpcode.SEND))


def fatal_status(code):
    """The completion status of the WR a fatal NAK of AETH NAK ``code`` names (PROTOCOL.md
    §5.5): invalid request, remote access, remote operational error; any other code (the ACK
    handler passes only these three) is taken as a remote operational error."""
    return int(_FATAL.get(code, proto.WcStatus.REM_OP_ERR))


class _QP:
    __slots__ = ("wrs", "una", "err", "nak_hold", "rnr_wait", "pending")

    def __init__(self):
        self.wrs = deque()
        self.una = 0
        self.err = False
        self.nak_hold = False       # a sequence NAK without progress since does not go back
        self.rnr_wait = False       # an RNR wait runs (until RNR_DONE or progress)
        self.pending = False        # in the walk queue


class CompleterModel:
    """The completer's rules, one input at a time, in the order the inputs are taken; the
    go-back-N walk one step at a time (:meth:`walk_step`), or to its end (:meth:`walk_all`).

    Per QP the work requests not yet complete are kept in posting order (which is PSN order),
    and ``una``, the oldest PSN not acknowledged: ACK ``p`` sets it to ``p + 1``, every NAK
    ``p`` to ``p``; a WR posted to a QP with none kept sets it to the WR's first PSN.
    *Progress* is an event that moves ``una``.

    * ``post``: a WR the TX path has sent. On a QP in error it completes ``WR_FLUSH_ERR`` at
      once (signaled or not); else it is kept. Then ``arm {qp, outstanding: not in error,
      progress 0}``.
    * ACK ``p``: every kept WR whose last PSN is ``p`` or before completes ``SUCCESS``
      (reported if signaled), oldest first.
    * every NAK ``p`` (PSN sequence, RNR, fatal): every kept WR whose last PSN is before ``p``
      completes the same way (implicitly acknowledged; as rxe and rdmavt, and
      :class:`~roce_hw.model.reliable.ReliableRequester`). Then:

      - PSN sequence: the QP goes back (a walk request), unless an RNR wait runs or a sequence
        NAK went back with no progress since (a repeat: the responder NAKs a gap once);
      - RNR: unless an RNR wait runs already (a repeat), ``rnr {qp, code}`` for the timers,
        the QP's walk (if it runs) stops, and the QP waits for ``fire`` RNR_DONE;
      - fatal (code 1-3): the next WR (it holds ``p``) completes with :func:`fatal_status` of
        the code, every later one ``WR_FLUSH_ERR``, all reported; the QP is reported on
        ``qp_errors`` and is in error from then on (its walk stops).

      Progress ends an RNR wait (the NAKed packet got through; an ACK that ends one goes
      back, as the packets after it were refused) and re-arms the sequence NAK.
    * after every ACK or NAK: ``arm {qp, outstanding: WRs kept, progress}``, before the
      ``rnr`` of an RNR NAK (the timers reload the retry counts first).
    * every event of a QP in error does nothing (the QP has failed; its list is empty), and
      gives no ``arm``; CNPs are counted in ``cnps`` and give no ``arm``.
    * ``fire`` (:class:`~roce_hw.proto.TimerKind`): TIMEOUT goes back (and re-arms the
      sequence NAK); RNR_DONE ends the RNR wait and goes back; RETRY_EXC / RNR_RETRY_EXC: the
      first kept WR completes ``RETRY_EXC_ERR`` / ``RNR_RETRY_EXC_ERR``, the rest
      ``WR_FLUSH_ERR``, the QP is reported on ``qp_errors`` and is in error, ``arm {qp, 0,
      0}``. A fire for a QP with nothing kept or in error, a TIMEOUT during an RNR wait, an
      RNR_DONE with no RNR wait running, are ignored and counted (``fires_ignored``).
    * ``reset``: every kept WR of the QP completes ``WR_FLUSH_ERR`` (reported), and the QP is
      clean: not in error, nothing kept, no wait; its walk stops; ``arm {qp, 0, 0}``.

    The walk. A QP going back while its walk runs restarts it; with no walk running and none
    queued its walk starts; else the QP joins the walk queue (once: a QP already queued stays
    where it is). A walk step: with no walk running,
    the next QP of the queue starts one, from its first kept WR, if it has WRs kept, is not in
    error and no RNR wait runs (else the step ends it); the first WR of a walk goes from
    packet ``(una - first_psn) mod 2**24`` (``start_psn`` = ``una``), every later WR of the QP
    whole (``start_packet`` 0, ``start_psn`` its first PSN), in posting order, one per step,
    each a ``resume_layout`` request on ``resumes`` (WRs posted meanwhile are walked too); the
    walk ends after the last WR kept. An ACK or NAK that completes the WR the walk is about to
    send makes the walk start again from the (new) first kept WR and ``una``.

    A completion is ``{wr_id, qp, status, opcode, byte_len, with_imm, imm}``
    (:func:`roce_hw.verbs.completion_layout`): ``opcode`` is :func:`wc_opcode_of` of the WR,
    ``byte_len`` its length, ``with_imm`` and ``imm`` 0.

    Attributes
    ----------
    completions : list of dict
    resumes : list of dict
        ``verbs.resume_layout`` fields with ``qp``.
    qp_errors : list of dict
        ``{qp, status}``.
    arms : list of dict
        ``{qp, outstanding, progress}``.
    rnrs : list of dict
        ``{qp, code}``.
    cnps, fires_ignored : int
    """

    def __init__(self, n_qp):
        self.n_qp = n_qp
        self._qp = {}
        self._queue = deque()
        self._walk = None           # {"qp", "ptr": WR about to be sent, "new": from una}
        self.completions = []
        self.resumes = []
        self.qp_errors = []
        self.arms = []
        self.rnrs = []
        self.cnps = 0
        self.fires_ignored = 0

    def _q(self, qp):
        return self._qp.setdefault(qp, _QP())

    def outstanding(self, qp):
        """The WRs of ``qp`` kept (not yet complete), oldest first."""
        return list(self._q(qp).wrs)

    def in_error(self, qp):
        return self._q(qp).err

    def una(self, qp):
        return self._q(qp).una

    @property
    def rewinding(self):
        """A walk runs or QPs wait to be walked."""
        return self._walk is not None or bool(self._queue)

    # ---------------------------------------------------------------- completions
    def _complete(self, qp, wr, status):
        if wr["signaled"] or status != proto.WcStatus.SUCCESS:
            self.completions.append({"wr_id": wr["wr_id"], "qp": qp, "status": int(status),
                                     "opcode": wc_opcode_of(wr["opcode"]),
                                     "byte_len": wr["length"], "with_imm": 0, "imm": 0})

    def _retire_while(self, qp, covered):
        q = self._q(qp)
        w = self._walk
        while q.wrs and covered(q.wrs[0]["last_psn"]):
            wr = q.wrs.popleft()
            if w is not None and w["qp"] == qp and w["ptr"] is wr:
                w["new"] = True         # the WR the walk was to send is acknowledged
            self._complete(qp, wr, proto.WcStatus.SUCCESS)

    def _fail(self, qp, status):
        q = self._q(qp)
        for k, wr in enumerate(q.wrs):
            self._complete(qp, wr, status if k == 0 else proto.WcStatus.WR_FLUSH_ERR)
        q.wrs.clear()
        q.err = True
        self.qp_errors.append({"qp": qp, "status": int(status)})
        self._stop_walk(qp)

    def _stop_walk(self, qp):
        if self._walk is not None and self._walk["qp"] == qp:
            self._walk = None

    def _go_back(self, qp):
        if not self._q(qp).wrs:
            return                      # nothing to send again
        if self._walk is not None and self._walk["qp"] == qp:
            self._walk["new"] = True
        elif self._walk is None and not self._queue:
            self._walk = {"qp": qp, "ptr": None, "new": True}
        elif not self._q(qp).pending:
            self._q(qp).pending = True
            self._queue.append(qp)

    def _arm(self, qp, outstanding, progress):
        self.arms.append({"qp": qp, "outstanding": int(outstanding),
                          "progress": int(progress)})

    # ---------------------------------------------------------------- inputs
    def post(self, qp, wr_id, opcode, length, signaled, first_psn, last_psn, remote_addr=0,
             r_key=0, imm=0, solicited=0):
        wr = {"wr_id": wr_id, "opcode": opcode, "length": length, "signaled": int(signaled),
              "first_psn": first_psn, "last_psn": last_psn, "remote_addr": remote_addr,
              "r_key": r_key, "imm": imm, "solicited": int(solicited)}
        q = self._q(qp)
        if q.err:
            self._complete(qp, wr, proto.WcStatus.WR_FLUSH_ERR)
        else:
            if not q.wrs:
                q.una = first_psn
            q.wrs.append(wr)
        self._arm(qp, not q.err, 0)

    def event(self, qp, kind, psn, code=0, msn=0):
        kind = proto.AckKind(kind)
        if kind == proto.AckKind.CNP:
            self.cnps += 1
            return
        q = self._q(qp)
        if kind not in (proto.AckKind.ACK, proto.AckKind.NAK_SEQ, proto.AckKind.RNR,
                        proto.AckKind.FATAL) or q.err:
            return
        old = q.una
        if kind == proto.AckKind.ACK:
            self._retire_while(qp, lambda last: psn_le(last, psn))
            q.una = (psn + 1) & proto.PSN_MASK
        else:
            self._retire_while(qp, lambda last: psn_lt(last, psn))
            q.una = psn
        progress = q.una != old
        ended = q.rnr_wait and progress         # the NAKed packet got through after all
        if progress:
            q.rnr_wait = q.nak_hold = False
        rnr = None
        if kind == proto.AckKind.FATAL:
            self._fail(qp, fatal_status(code))
        elif kind == proto.AckKind.NAK_SEQ:
            if not q.rnr_wait and not q.nak_hold:
                q.nak_hold = True
                self._go_back(qp)
        elif kind == proto.AckKind.ACK and ended:
            self._go_back(qp)
        elif kind == proto.AckKind.RNR and not q.rnr_wait:
            q.rnr_wait = q.nak_hold = True
            self._stop_walk(qp)
            rnr = {"qp": qp, "code": code}
        self._arm(qp, bool(q.wrs), progress)
        if rnr is not None:
            self.rnrs.append(rnr)

    def fire(self, qp, kind):
        kind = proto.TimerKind(kind)
        q = self._q(qp)
        if not q.wrs or q.err:
            self.fires_ignored += 1
            if kind == proto.TimerKind.RNR_DONE:
                q.rnr_wait = False
            return
        if kind == proto.TimerKind.TIMEOUT:
            if q.rnr_wait:
                self.fires_ignored += 1
                return
            q.nak_hold = False
            self._go_back(qp)
        elif kind == proto.TimerKind.RNR_DONE:
            if not q.rnr_wait:
                self.fires_ignored += 1
                return
            q.rnr_wait = False
            self._go_back(qp)
        else:
            self._fail(qp, proto.WcStatus.RETRY_EXC_ERR if kind == proto.TimerKind.RETRY_EXC
                       else proto.WcStatus.RNR_RETRY_EXC_ERR)
            self._arm(qp, 0, 0)

    def reset(self, qp):
        q = self._q(qp)
        for wr in q.wrs:
            self._complete(qp, wr, proto.WcStatus.WR_FLUSH_ERR)
        q.wrs.clear()
        q.err = q.nak_hold = q.rnr_wait = False
        self._stop_walk(qp)
        self._arm(qp, 0, 0)

    # ---------------------------------------------------------------- the walk
    def walk_step(self):
        """One step of the walk: the resume request it sends (also appended to
        :attr:`resumes`), or ``None`` (nothing to walk, or a walk ended without sending)."""
        w = self._walk
        if w is None:
            if not self._queue:
                return None
            qp = self._queue.popleft()
            self._q(qp).pending = False
            w = self._walk = {"qp": qp, "ptr": None, "new": True}
        q = self._q(w["qp"])
        if not q.wrs or q.err or q.rnr_wait:
            self._walk = None
            return None
        if w["new"]:
            wr = q.wrs[0]
            start_psn = q.una
            start_packet = (q.una - wr["first_psn"]) & proto.PSN_MASK & _START_PACKET_MASK
        else:
            wr = w["ptr"]
            start_psn, start_packet = wr["first_psn"], 0
        req = {"qp": w["qp"], **{k: wr[k] for k in _RESUME_FIELDS},
               "start_packet": start_packet, "start_psn": start_psn}
        self.resumes.append(req)
        k = next(n for n, x in enumerate(q.wrs) if x is wr)
        if k == len(q.wrs) - 1:
            self._walk = None
        else:
            w["ptr"], w["new"] = q.wrs[k + 1], False
        return req

    def walk_all(self):
        """Step the walk until nothing is left to walk; the requests sent."""
        out = []
        while self.rewinding:
            r = self.walk_step()
            if r is not None:
                out.append(r)
        return out
