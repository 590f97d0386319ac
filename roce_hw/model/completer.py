# SPDX-License-Identifier: BSD-2-Clause
"""Model of the completer (:class:`roce_hw.ctrl.completer.Completer`): the work requests sent,
the ACK handler's events and QP resets in, ibverbs completions, go-back-N replay requests and QP
errors out."""

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


class CompleterModel:
    """The completer's rules, one input at a time, in the order the inputs are taken.

    Per QP the work requests not yet complete are kept in posting order (which is PSN order).

    * ``post``: a WR the TX path has sent. On a QP in error it completes ``WR_FLUSH_ERR`` at
      once (signaled or not); else it is kept.
    * ACK ``p``: every kept WR whose last PSN is ``p`` or before completes ``SUCCESS``
      (reported if signaled), oldest first.
    * NAK PSN-sequence ``p``: every kept WR whose last PSN is before ``p`` completes ``SUCCESS``
      the same way; then a replay ``{psn: p, rnr: 0, code: 0}``.
    * RNR NAK ``p``: a replay ``{psn: p, rnr: 1, code}``; nothing completes.
    * fatal NAK ``p`` (code 1-3): the kept WRs whose last PSN is before ``p`` complete
      ``SUCCESS`` (reported if signaled); the next one (it holds ``p``) completes with
      :func:`fatal_status` of the code, every later one ``WR_FLUSH_ERR``, all reported; the QP
      is reported on ``qp_errors`` with that status and is in error from then on.
    * every event of a QP in error does nothing (the QP has failed; its list is empty).
    * CNP: counted in ``cnps``.
    * ``reset``: every kept WR of the QP completes ``WR_FLUSH_ERR`` (reported), and the QP is
      clean: not in error, nothing kept.

    A completion is ``{wr_id, qp, status, opcode, byte_len, with_imm, imm}``
    (:func:`roce_hw.verbs.completion_layout`): ``opcode`` is :func:`wc_opcode_of` of the WR,
    ``byte_len`` its length, ``with_imm`` and ``imm`` 0.

    Attributes
    ----------
    completions : list of dict
        In the order made (the order within one QP is the hardware's; across QPs the
        hardware's order depends on which input it took first).
    replays : list of dict
        ``{qp, psn, rnr, code}``.
    qp_errors : list of dict
        ``{qp, status}``.
    cnps : int
    """

    def __init__(self, n_qp):
        self.n_qp = n_qp
        self._wrs = {}
        self._error = set()
        self.completions = []
        self.replays = []
        self.qp_errors = []
        self.cnps = 0

    def outstanding(self, qp):
        """The WRs of ``qp`` kept (not yet complete), oldest first."""
        return list(self._wrs.get(qp, ()))

    def in_error(self, qp):
        return qp in self._error

    def _complete(self, qp, wr, status):
        if wr["signaled"] or status != proto.WcStatus.SUCCESS:
            self.completions.append({"wr_id": wr["wr_id"], "qp": qp, "status": int(status),
                                     "opcode": wc_opcode_of(wr["opcode"]),
                                     "byte_len": wr["length"], "with_imm": 0, "imm": 0})

    def post(self, qp, wr_id, opcode, length, signaled, first_psn, last_psn):
        wr = {"wr_id": wr_id, "opcode": opcode, "length": length, "signaled": bool(signaled),
              "first_psn": first_psn, "last_psn": last_psn}
        if qp in self._error:
            self._complete(qp, wr, proto.WcStatus.WR_FLUSH_ERR)
        else:
            self._wrs.setdefault(qp, deque()).append(wr)

    def _retire_while(self, qp, covered):
        wrs = self._wrs.get(qp, deque())
        while wrs and covered(wrs[0]["last_psn"]):
            self._complete(qp, wrs.popleft(), proto.WcStatus.SUCCESS)

    def event(self, qp, kind, psn, code=0, msn=0):
        kind = proto.AckKind(kind)
        if kind == proto.AckKind.CNP:
            self.cnps += 1
            return
        if qp in self._error:
            return
        if kind == proto.AckKind.ACK:
            self._retire_while(qp, lambda last: psn_le(last, psn))
        elif kind == proto.AckKind.NAK_SEQ:
            self._retire_while(qp, lambda last: psn_lt(last, psn))
            self.replays.append({"qp": qp, "psn": psn, "rnr": 0, "code": 0})
        elif kind == proto.AckKind.RNR:
            self.replays.append({"qp": qp, "psn": psn, "rnr": 1, "code": code})
        else:
            status = fatal_status(code)
            self._retire_while(qp, lambda last: psn_lt(last, psn))
            wrs = self._wrs.pop(qp, deque())
            for k, wr in enumerate(wrs):
                self._complete(qp, wr, status if k == 0 else proto.WcStatus.WR_FLUSH_ERR)
            self._error.add(qp)
            self.qp_errors.append({"qp": qp, "status": status})

    def reset(self, qp):
        for wr in self._wrs.pop(qp, deque()):
            self._complete(qp, wr, proto.WcStatus.WR_FLUSH_ERR)
        self._error.discard(qp)
