# SPDX-License-Identifier: BSD-2-Clause
"""Transaction-level model of the requester (the TX engine): QP table, work and resume requests
in, frames and status reports out (no Amaranth).

One model for the tests, ``sim.traffic`` and the co-simulation; the reliability issue extends it
(ACKs, go-back-N, completions). It follows the engine's documented behaviour
(:class:`roce_hw.engine.TxEngine`), built on the golden segmentation and packet builders.
"""

from dataclasses import dataclass, field

from .. import proto
from .packet import QPPath, build_request_frame
from .qp_table import QPStateModel
from .segment import segment_message

__all__ = ["Sent", "RequesterModel", "PathRequester", "refusal", "request_opcode"]

LOC_LEN_ERR = proto.WcStatus.LOC_LEN_ERR
LOC_QP_OP_ERR = proto.WcStatus.LOC_QP_OP_ERR

_OPS = (proto.WrOpcode.RDMA_WRITE, proto.WrOpcode.RDMA_WRITE_WITH_IMM, proto.WrOpcode.SEND,
        proto.WrOpcode.SEND_WITH_IMM)


def request_opcode(opcode):
    """The :class:`~roce_hw.proto.WrOpcode` of ``opcode`` if the requester sends it, else
    ``None``."""
    try:
        op = proto.WrOpcode(opcode)
    except ValueError:
        return None
    return op if op in _OPS else None


def refusal(row, opcode, length):
    """Why the engine refuses a work request, or ``None`` if it takes it: ``LOC_QP_OP_ERR`` when
    the QP ``row`` is missing (``None``: index out of range) or not in RTS, the opcode is not
    one the requester sends or the row's PMTU code is invalid; ``LOC_LEN_ERR`` when ``length``
    exceeds 2**31 bytes."""
    if row is None or row["state"] != proto.QPState.RTS or request_opcode(opcode) is None or \
            row["pmtu"] not in {int(c) for c in proto.PMTU_BYTES}:
        return LOC_QP_OP_ERR
    if length > 1 << 31:
        return LOC_LEN_ERR
    return None


@dataclass
class Sent:
    """A frame the engine puts on its output: ``frame`` is ``None`` for an aborted one (its
    bytes are unspecified), else the whole frame; ``qp`` its QP index, ``packet`` its
    :class:`~roce_hw.model.segment.PacketSpec` (``None`` if aborted)."""
    qp: int
    ip_id: int
    frame: bytes | None
    packet: object = None


@dataclass
class RequesterModel:
    """The engine's requester side as a sequence of transactions.

    Parameters
    ----------
    n_qp, ack_req_every, ttl, ip_id_start
        As :class:`roce_hw.config.EngineConfig`.
    local_mac, local_ip : int
        The engine's addresses.

    Attributes
    ----------
    qps : QPStateModel
        The QP table (write rows with :meth:`write_qp`).
    sent : list of Sent
        Every frame, in order.
    statuses : list of dict
        Every report ``{wr_id, qp, status}``, in order.
    """
    n_qp: int = 16
    ack_req_every: int = 64
    ttl: int = 64
    ip_id_start: int = 0
    local_mac: int = 0x02_00_00_00_00_01
    local_ip: int = 0x0A_00_00_01
    qps: QPStateModel = field(init=False)
    sent: list = field(init=False, default_factory=list)
    statuses: list = field(init=False, default_factory=list)

    def __post_init__(self):
        self.qps = QPStateModel(self.n_qp)
        self.ip_id = self.ip_id_start

    # ------------------------------------------------------------------ set-up
    def write_qp(self, index, ctx):
        """Write QP row ``index`` (fields of :data:`roce_hw.proto.QP_CONTEXT_FIELDS`; missing
        ones are 0)."""
        rsp = self.qps.mgmt(index, 1, ctx)
        if rsp["error"]:
            raise ValueError(f"QP index {index} is out of range (n_qp = {self.n_qp})")

    def path(self, row):
        """The :class:`~roce_hw.model.packet.QPPath` of a QP row."""
        return QPPath(src_mac=self.local_mac, dst_mac=row["remote_mac"], src_ip=self.local_ip,
                      dst_ip=row["remote_ip"], dest_qp=row["remote_qpn"],
                      udp_sport=row["udp_sport"], dscp=row["dscp"], ecn=row["ecn"],
                      ttl=self.ttl, p_key=row["p_key"], migreq=row["migreq"])

    @property
    def frames(self):
        """The frames that were not aborted."""
        return [s.frame for s in self.sent if s.frame is not None]

    @property
    def aborted(self):
        """Number of aborted frames."""
        return sum(1 for s in self.sent if s.frame is None)

    # ------------------------------------------------------------------ requests
    def _refuse(self, wr_id, qp, status):
        self.statuses.append({"wr_id": wr_id, "qp": qp, "status": status})

    def _emit(self, qp, frame, packet=None):
        self.sent.append(Sent(qp, self.ip_id, frame, packet))
        self.ip_id = (self.ip_id + 1) & 0xFFFF

    def post(self, *, qp, opcode, payload, length=None, wr_id=0, remote_addr=0, r_key=0,
             imm=0, solicited=False, start_packet=None, start_psn=0,
             transport=proto.Transport.RC):
        """One work request (or, with ``start_packet``, a resume request: ``payload`` is the
        whole message, the engine is given its bytes from ``start_packet * PMTU`` on).

        ``length`` is the length the request declares (default ``len(payload)``): a different
        value is a length mismatch. ``transport`` is RC, as the engine sends; UC gives the
        frames a UC requester would send (for test traffic: the engine has no UC yet). Returns
        the :class:`Sent` records of this request.
        """
        first_sent = len(self.sent)
        length = len(payload) if length is None else int(length)
        row = self.qps.rows[qp] if 0 <= qp < self.n_qp else None
        resume = start_packet is not None
        op = request_opcode(opcode)
        refused = refusal(row, opcode, length)
        if refused is not None:
            self._refuse(wr_id, qp, refused)
            return self.sent[first_sent:]
        pmtu = proto.pmtu_bytes(row["pmtu"])
        j = start_packet or 0
        npk = max(1, -(-length // pmtu))
        if resume and j >= npk:
            self._refuse(wr_id, qp, LOC_QP_OP_ERR)
            return self.sent[first_sent:]
        given = payload[j * pmtu:] if resume else payload        # what the engine is given
        want = length - j * pmtu if resume else length            # what it expects of it
        body = (bytes(payload[:length]) + bytes(max(0, length - len(payload))))
        pkts = segment_message(op, body, pmtu=pmtu,
                               start_psn=start_psn if resume else row["next_psn"],
                               remote_addr=remote_addr, r_key=r_key, imm=imm,
                               solicited=solicited, ack_req_every=self.ack_req_every,
                               start_packet=j, transport=transport)
        path = self.path(row)
        if len(given) == want:
            for p in pkts:
                self._emit(qp, build_request_frame(path, p, ip_id=self.ip_id), p)
            if not resume:
                row["next_psn"] = (pkts[-1].psn + 1) & proto.PSN_MASK
            return self.sent[first_sent:]
        # length mismatch: the packet holding the last byte seen (short) or the declared last
        # byte (long) is aborted; the packets before it went out
        n = min(len(given), want)
        bad = max(0, n - 1) // pmtu
        for p in pkts[:bad]:
            self._emit(qp, build_request_frame(path, p, ip_id=self.ip_id), p)
        self._emit(qp, None)
        self._refuse(wr_id, qp, LOC_LEN_ERR)
        if bad > 0:
            row["state"] = proto.QPState.ERROR
            row["next_psn"] = pkts[bad].psn
        return self.sent[first_sent:]


class PathRequester:
    """The requester model addressed by connection path instead of QP index, for test traffic
    and tools that have no QP table: each destination QP of a :class:`QPPath` gets a row of a
    :class:`RequesterModel` (in order of first use, at most ``n_qp``), which keeps its next PSN,
    and the one IPv4 identification counter of all of them.

    :meth:`post` returns the frames of one work request. The first post to a destination QP
    must give a start PSN; a later one may give ``None`` to continue (or a PSN to restart).
    ``ip_id`` may be set between posts (a retransmission's new identifications).
    """

    def __init__(self, *, ip_id_start=0, ack_req_every=64, n_qp=64):
        if not 0 <= int(ip_id_start) <= 0xFFFF:
            raise ValueError(f"ip_id_start = {ip_id_start} is not a 16-bit value")
        if int(ack_req_every) < 1:
            raise ValueError(f"ack_req_every = {ack_req_every} must be >= 1")
        self.model = RequesterModel(n_qp=n_qp, ack_req_every=int(ack_req_every),
                                    ip_id_start=int(ip_id_start))
        self._row = {}          # destination QPN -> row index
        self.packets = []       #: every PacketSpec posted, in order

    @property
    def ip_id(self):
        """The identification of the next frame."""
        return self.model.ip_id

    @ip_id.setter
    def ip_id(self, value):
        if not 0 <= int(value) <= 0xFFFF:
            raise ValueError(f"ip_id = {value} is not a 16-bit value")
        self.model.ip_id = int(value)

    def next_psn(self, dest_qp):
        """Next PSN of ``dest_qp``, or ``None`` if nothing was posted to it yet."""
        k = self._row.get(dest_qp)
        return None if k is None else self.model.qps.rows[k]["next_psn"]

    def post(self, path, pmtu, start_psn_or_None, wr_opcode, payload, *, remote_addr=0,
             r_key=0, imm=0, solicited=False, transport=proto.Transport.RC):
        """Frames of one work request on ``path`` (untagged), ``pmtu`` bytes a packet; see the
        class docstring. A request the model refuses raises ``ValueError``."""
        if path.vlan is not None:
            raise ValueError("the requester sends untagged frames (path.vlan must be None)")
        k = self._row.get(path.dest_qp)
        psn = start_psn_or_None
        if psn is None:
            if k is None:
                raise ValueError(f"first post to QP {path.dest_qp:#x} needs a start PSN")
            psn = self.model.qps.rows[k]["next_psn"]
        row = {"state": proto.QPState.RTS, "remote_qpn": path.dest_qp,
               "remote_mac": path.dst_mac, "remote_ip": path.dst_ip,
               "udp_sport": path.udp_sport, "dscp": path.dscp, "ecn": path.ecn,
               "p_key": path.p_key, "migreq": path.migreq, "pmtu": proto.pmtu_code(pmtu),
               "next_psn": psn, "una_psn": psn}
        if k is None:
            if len(self._row) >= self.model.n_qp:
                raise ValueError(f"more than {self.model.n_qp} destination QPs")
            k = len(self._row)
        before = dict(self.model.qps.rows[k])
        self.model.write_qp(k, row)
        self.model.local_mac, self.model.local_ip = path.src_mac, path.src_ip
        self.model.ttl = path.ttl
        n_status = len(self.model.statuses)
        sent = self.model.post(qp=k, opcode=wr_opcode, payload=payload, remote_addr=remote_addr,
                               r_key=r_key, imm=imm, solicited=solicited, transport=transport)
        if len(self.model.statuses) > n_status:
            self.model.qps.rows[k] = before             # (nothing was sent)
            raise ValueError(f"request refused: {self.model.statuses[-1]['status']!r}")
        self._row[path.dest_qp] = k
        self.packets.extend(s.packet for s in sent)
        return [s.frame for s in sent]
