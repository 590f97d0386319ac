# SPDX-License-Identifier: BSD-2-Clause
"""Model of the ACK handler (:class:`roce_hw.ctrl.ack.AckHandler`): received RoCEv2 packets in
order, the QP rows they are checked against, the verdict and the event of each."""

from dataclasses import dataclass

from .. import proto
from .psn import psn_diff

__all__ = ["AckItem", "ack_verdict", "AckModel"]

_RESERVED_NAK = proto.NakCode.REMOTE_OPERATIONAL_ERROR


@dataclass(frozen=True)
class AckItem:
    """One received RoCEv2 packet as the RX front end hands it on (``roce_rx_layout``)."""
    src_ip: int
    dest_qp: int
    psn: int
    opcode: int = int(proto.Opcode.RC_ACKNOWLEDGE)
    syndrome: int = 0x1F
    msn: int = 0
    p_key: int = 0xFFFF
    bth_aeth_only: bool = True


def ack_verdict(it, *, n_qp, row, una):
    """The ACK handler's verdict on one :class:`AckItem`, in the hardware's order of checks:
    ``(counter, kind)``, ``counter`` a name of :data:`roce_hw.proto.ACK_COUNTERS` and ``kind``
    the :class:`roce_hw.proto.AckKind` of the event it gives (None: nothing changes).

    ``row`` is the destination QP's row (``state``, ``remote_ip``, ``p_key``, ``next_psn``: the
    PSN after the last one sent; empty for a QP in RESET), ``una`` its oldest unacknowledged
    PSN. Both :class:`AckModel` and the reliable requester model
    (:class:`roce_hw.model.reliable.ReliableRequester`) judge by it: one rule set.
    """
    is_ack = it.opcode == proto.Opcode.RC_ACKNOWLEDGE and it.bth_aeth_only
    is_cnp = it.opcode == proto.Opcode.CNP
    if not (is_ack or is_cnp):
        return "not_ack", None
    typ, value = (it.syndrome >> 5) & 3, it.syndrome & 0x1F
    if is_ack and (it.syndrome & 0x80 or typ == 2 or
                   (typ == proto.AethType.NAK and value > _RESERVED_NAK)):
        return "bad_syndrome", None
    qp = it.dest_qp - proto.LOCAL_QPN_BASE
    if not 0 <= qp < n_qp:
        return "unknown_qp", None
    if row.get("state", 0) != proto.QPState.RTS:
        return "qp_not_open", None
    if it.src_ip != row.get("remote_ip", 0):
        return "bad_src", None
    if (it.p_key ^ row.get("p_key", 0)) & 0x7FFF:
        return "bad_pkey", None
    if is_cnp:
        return "cnps", proto.AckKind.CNP
    if typ == proto.AethType.ACK:
        kind = proto.AckKind.ACK
    elif typ == proto.AethType.RNR_NAK:
        kind = proto.AckKind.RNR
    elif value == proto.NakCode.PSN_SEQUENCE_ERROR:
        kind = proto.AckKind.NAK_SEQ
    else:
        kind = proto.AckKind.FATAL
    if psn_diff(it.psn, una) < 0:
        return ("acks_stale" if kind == proto.AckKind.ACK else "naks_stale"), None
    if psn_diff(it.psn, row.get("next_psn", 0)) >= 0:
        return "psn_unsent", None
    return {proto.AckKind.ACK: "acks", proto.AckKind.NAK_SEQ: "naks_seq",
            proto.AckKind.RNR: "rnr_naks", proto.AckKind.FATAL: "naks_fatal"}[kind], kind


class AckModel:
    """The ACK handler's rules (see :class:`roce_hw.ctrl.ack.AckHandler`), one packet at a time.

    Parameters
    ----------
    n_qp : int
    rows : dict
        QP index -> row (``state``, ``remote_ip``, ``p_key``, ``next_psn``, ``una_psn``); missing
        QPs are in RESET. ``next_psn`` is the PSN after the last one sent.

    Attributes
    ----------
    una : dict
        QP index -> ``una_psn`` as the handler leaves it.
    counters : dict
        :data:`roce_hw.proto.ACK_COUNTERS` -> count.
    events : list of dict
        ``{qp, kind, psn, code, msn}`` per event, in order.
    """

    def __init__(self, n_qp, rows):
        self.n_qp = n_qp
        self.rows = {q: dict(r) for q, r in rows.items()}
        self.una = {q: r.get("una_psn", 0) for q, r in self.rows.items()}
        self.counters = dict.fromkeys(proto.ACK_COUNTERS, 0)
        self.events = []

    def _verdict(self, it):
        qp = it.dest_qp - proto.LOCAL_QPN_BASE
        return ack_verdict(it, n_qp=self.n_qp, row=self.rows.get(qp, {}),
                           una=self.una.get(qp, 0))

    def receive(self, it):
        """Handle one :class:`AckItem`; returns its verdict (a counter name)."""
        verdict, kind = self._verdict(it)
        self.counters["ack_items"] += 1
        self.counters[verdict] += 1
        if kind is None:
            return verdict
        qp = it.dest_qp - proto.LOCAL_QPN_BASE
        if kind == proto.AckKind.ACK:
            self.una[qp] = (it.psn + 1) & proto.PSN_MASK
        elif kind != proto.AckKind.CNP:          # every NAK acknowledges what precedes it
            self.una[qp] = it.psn
        self.events.append({"qp": qp, "kind": int(kind), "psn": it.psn,
                            "code": it.syndrome & 0x1F if kind != proto.AckKind.CNP else 0,
                            "msn": it.msn if kind != proto.AckKind.CNP else 0})
        return verdict
