# SPDX-License-Identifier: BSD-2-Clause
"""Golden model of the UDP connection manager (CM) responder: the project's reference text.

Pure Python (no Amaranth import). :class:`CmModel` answers the 64-byte datagram of
PROTOCOL.md §7 (layout :data:`roce_hw.proto.CM_DATAGRAM`)
exactly as the hardware CM responder must; :func:`reply_frame` builds the reply's full
Ethernet/IPv4/UDP frame so tests compare hardware frames byte for byte.

Datagram
--------
64 bytes, big-endian. Packing of the reference host script (``send_connection_info.py``):
``struct.pack('>BLLLQLLLLQLHBLLL', flags, loc_qpn, loc_psn, loc_r_key, loc_base_addr, loc_ip,
rem_qpn, rem_psn, rem_r_key, rem_base_addr, rem_ip, reply_port, tx_flags, tx_dma_length,
tx_n_transfers, tx_period)``, ``flags = valid | req_type << 1 | ack_valid << 4 | ack_type << 5``,
``tx_flags = tx_valid | tx_start << 1 | tx_immediate << 2 | tx_type << 3 | tx_resv << 4``.
"loc" = the sender of a datagram, "rem" = its peer. Engine QPN = 256 + QP index
(:data:`proto.LOCAL_QPN_BASE`), index < ``n_qp``.

The RX front end hands the CM only datagrams that passed the frame checks (our MAC, IPv4 ok
including the checksum, our IP, UDP dport 0x4321, UDP length 8 + 64), with the frame's source
MAC, source IP and UDP source port.

Validation, in this order; the first rule that fails decides (reply code, counter)
-------------------------------------------------------------------------------------
1. ``ack_valid`` = 1 or ``ack_type`` != 0 (a request never carries an ack): ERROR, ``bad_flags``.
2. ``tx_resv`` != 0: ERROR, ``bad_txmeta``.
3. ``valid`` = 1 and ``tx_valid`` = 1 (two requests in one) or both 0 (no request): ERROR,
   ``bad_flags``.
4. ``reply_port`` = 0: no reply (dropped), ``bad_port``.
5. A 24-bit field with its top byte set (``loc_qpn``, ``loc_psn``, ``rem_qpn``, ``rem_psn``):
   ERROR, ``bad_field``.
6. ``valid`` = 1 and ``req_type`` not in {OPEN_QP 1, MODIFY_QP_RTS 3, CLOSE_QP 4,
   FETCH_QP_INFO 5}: ERROR, ``bad_req``.
7. The request's own rules below.

(Rules 1 to 3 come before rule 4: an ERROR for them is sent even to a ``reply_port`` of 0.)

Ownership: a QP is "owned" by the requester (frame source IP, ``loc_qpn``) stored in its row
(``remote_ip``, ``remote_qpn``). MODIFY, CLOSE and txmeta are obeyed only from the owner's IP:
the frame source IP must equal the row's ``remote_ip`` (NAK, ``not_owner``). For OPEN,
``loc_ip`` must equal the frame's source IP (ERROR, ``bad_field``; checked first). "Open" = row
``state`` != RESET (0).

OPEN_QP (req_type 1)
--------------------
* ``rem_qpn`` = 0: scan the whole table. An open row with ``remote_ip`` = source IP and
  ``remote_qpn`` = ``loc_qpn`` is a re-open of that connection: use that row. Else take the
  lowest-index row in RESET. None: NO_QP, ``no_qp``.
* ``rem_qpn`` != 0 names the engine QP: not in 256..256+n_qp-1: NAK ``bad_qpn``; open and not
  the same (source IP, ``loc_qpn``): NAK ``in_use``; else use it.
* The whole row is written: state INIT (1), ``remote_qpn`` = loc_qpn, ``remote_mac`` = frame
  source MAC, ``remote_ip`` = loc_ip, ``udp_sport`` = 0xC000 | (engine QPN & 0x3FFF), dscp 0,
  ecn 0, ``p_key`` 0xFFFF, ``migreq`` 1, ``pmtu`` = the build's CM PMTU code (default 3, 1024
  bytes), ``next_psn`` = ``una_psn`` = rem_psn (the requester says where the engine's send PSN
  starts; reset on every (re)open), ``remote_va`` = loc_base_addr, ``r_key`` = loc_r_key,
  ``retry_cnt`` 7, ``rnr_retry`` 7, ``timeout`` 14, ``min_rnr_timer`` 12, ``rq_psn`` = loc_psn.
* Reply ACK: loc_qpn = engine QPN, loc_psn = the engine's start PSN (= request rem_psn),
  loc_r_key 0, loc_base_addr 0, loc_ip = engine IP; rem_* = the request's loc_*.

MODIFY_QP_RTS (req_type 3), rem_qpn = engine QPN
------------------------------------------------
* Out of range: NAK ``bad_qpn``; RESET or ERROR state: NAK ``bad_state``; source IP not the
  owner's: NAK ``not_owner``; ``loc_qpn`` != row ``remote_qpn``: NAK ``not_owner``.
* Row: state RTS (3), ``next_psn`` = ``una_psn`` = rem_psn, ``r_key`` = loc_r_key,
  ``remote_va`` = loc_base_addr, ``rq_psn`` = loc_psn; the other fields are kept. RTS -> RTS is
  allowed (a retried MODIFY works).
* Reply ACK: loc_qpn = engine QPN, loc_psn = rem_psn (the engine's send PSN), loc_r_key 0,
  loc_base_addr 0, loc_ip = engine IP; rem_* = the request's loc_*.

CLOSE_QP (req_type 4), rem_qpn = engine QPN
-------------------------------------------
* Out of range: NAK ``bad_qpn``; RESET: NAK ``bad_state``; not the owner's IP: NAK
  ``not_owner``.
* The generator stops if it runs on this QP; the row is written all-zero (RESET: free).
* Reply ACK, fields as MODIFY's reply with loc_psn = the row's ``next_psn`` before the close.

FETCH_QP_INFO (req_type 5), rem_qpn = engine QPN: a read-only query
-------------------------------------------------------------------
* Out of range: NAK ``bad_qpn``; RESET: NAK ``bad_state``. No owner check, nothing written.
* Reply ACK: loc_qpn = engine QPN, loc_psn = ``next_psn``, loc_r_key = the QP state (0..7),
  loc_base_addr 0, loc_ip = engine IP; rem_qpn = ``remote_qpn``, rem_psn = ``rq_psn``,
  rem_r_key = ``r_key``, rem_base_addr = ``remote_va``, rem_ip = ``remote_ip``.

txmeta (valid = 0, tx_valid = 1): the traffic generator, rem_qpn = engine QPN
-----------------------------------------------------------------------------
* Out of range: NAK ``bad_qpn``; state != RTS: NAK ``bad_state``; not the owner's IP: NAK
  ``not_owner``.
* ``tx_start`` = 0: stop the generator if it runs on this QP; ACK.
* ``tx_start`` = 1: ``tx_dma_length`` > 2**31 or ``tx_n_transfers`` = 0: ERROR ``bad_txmeta``;
  the generator busy (on any QP): NAK ``busy``; else start it: opcode RDMA_WRITE[_WITH_IMM] if
  ``tx_type`` = 1 else SEND[_WITH_IMM] (the immediate forms if ``tx_immediate``), length =
  ``tx_dma_length``, count = ``tx_n_transfers``, period = ``tx_period``; ACK.
* Reply fields as MODIFY's reply with loc_psn = the row's ``next_psn``.

Generator traffic (what the host checks)
----------------------------------------
Message n (0 .. count-1): wr_id n, length L, imm = n (the *_WITH_IMM opcodes), remote_addr =
remote_va + n*L (mod 2**64), r_key = the row's r_key, not solicited. Payload byte k of message n
= (k + n) & 0xFF (:func:`generator_payload`). WR n+1 is posted no earlier than ``period``
cycles after WR n was taken (0 = back to back).

Every reply
-----------
Goes to the frame's source MAC and IP, UDP source port 0x4321, destination port =
``reply_port``; IPv4 as the TX path's (version 4, IHL 5, DF, TTL from the configuration,
identification 0, checksum), UDP checksum 0. Datagram: the request with loc_* and rem_* swapped
(then the fields named above overwritten), loc_ip = engine IP, ``valid``/``req_type``,
``reply_port`` and the whole txmeta (flags, length, count, period) echoed, ``ack_valid`` = 1,
``ack_type`` = the code. An ERROR reply to a malformed request is the request swapped with
loc_ip = engine IP, ack_valid = 1, ack_type = ERROR (req_type echoed as received). NAK and NO_QP
replies likewise carry the request swapped with loc_ip = engine IP.

Counters: ``ok`` (requests obeyed: ACK replies) and one per reason above (:data:`COUNTERS`).
Every datagram is counted exactly once. No request other than an obeyed OPEN, MODIFY, CLOSE or
txmeta changes any QP row or the generator.
"""

from dataclasses import dataclass

from .. import proto
from ..config import check_n_qp
from ..proto import CmAck, CmReq, QPState, WrOpcode
from .generator import GenCommand, generator_payload
from .generator import generator_messages as model_generator_messages
from .header import insert
from .packet import ipv4_checksum

__all__ = ["COUNTERS", "CONTEXT_FIELDS", "CmModel", "CmReply", "GeneratorState",
           "generator_payload", "generator_messages", "open_row", "reply_frame",
           "request_frame", "CM_FRAME", "UDP_LENGTH", "IPV4_TOTAL_LENGTH"]

#: Counter names: ``ok`` first, then the drop/refusal reasons in the order of the rules.
COUNTERS = proto.CM_COUNTERS

#: Field name -> width of a QP context row (:data:`roce_hw.proto.QP_CONTEXT_FIELDS`).
CONTEXT_FIELDS = dict(proto.QP_CONTEXT_FIELDS)

#: The headers of a CM frame: Ethernet, IPv4 (no options), UDP, the datagram.
CM_FRAME = (proto.ETH, proto.IPV4, proto.UDP, proto.CM_DATAGRAM)
#: UDP length of a CM datagram (header + 64 bytes).
UDP_LENGTH = proto.UDP.size + proto.CM_DATAGRAM.size
#: IPv4 total length of a CM frame.
IPV4_TOTAL_LENGTH = proto.IPV4.size + UDP_LENGTH

def _unpack(dgram):
    dgram = bytes(dgram)
    if len(dgram) != proto.CM_DATAGRAM.size:
        raise ValueError(f"a CM datagram is {proto.CM_DATAGRAM.size} bytes, not {len(dgram)}")
    return proto.CM_DATAGRAM.unpack(dgram)


_MASK24 = 0xFFFFFF
_TOP8 = 0xFF000000
_VALID_REQS = (CmReq.OPEN_QP, CmReq.MODIFY_QP_RTS, CmReq.CLOSE_QP, CmReq.FETCH_QP_INFO)


@dataclass(frozen=True)
class CmReply:
    """Where a reply goes and what it says: ``dgram`` is the 64 reply bytes, ``fields`` the
    same decoded. Unpacks as ``(dst_mac, dst_ip, dst_port, dgram)``."""
    dst_mac: int
    dst_ip: int
    dst_port: int
    dgram: bytes

    def __iter__(self):
        return iter((self.dst_mac, self.dst_ip, self.dst_port, self.dgram))

    @property
    def fields(self):
        return _unpack(self.dgram)

    @property
    def ack(self):
        return CmAck(self.fields["ack_type"])


@dataclass
class GeneratorState:
    """A running generator: the command the CM gave it (``gen_cmd_layout`` fields but
    ``start``). ``opcode`` is a :class:`proto.WrOpcode`."""
    qp: int
    opcode: WrOpcode
    length: int
    count: int
    period: int
    remote_va: int
    r_key: int

    def cmd(self):
        """The generator command as a ``dict`` of ``gen_cmd_layout`` fields (``start`` 1)."""
        return {"start": 1, "qp": self.qp, "opcode": int(self.opcode), "length": self.length,
                "count": self.count, "period": self.period, "remote_va": self.remote_va,
                "r_key": self.r_key}


def generator_messages(gen):
    """The work requests a :class:`GeneratorState` posts, in order (the generator's model,
    :mod:`roce_hw.model.generator`): ``dict``\\ s with ``wr_id``, ``opcode``, ``length``, ``imm``
    (``None`` unless a *_WITH_IMM opcode: what the host sees), ``remote_addr``, ``r_key``,
    ``payload``."""
    imm = gen.opcode in (WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE_WITH_IMM)
    cmd = GenCommand(**gen.cmd())
    out = []
    for wr, payload in model_generator_messages(cmd):
        out.append({"wr_id": wr["wr_id"], "opcode": gen.opcode, "length": wr["length"],
                    "imm": wr["imm"] if imm else None, "remote_addr": wr["remote_addr"],
                    "r_key": wr["r_key"], "payload": payload})
    return out


def open_row(index, *, remote_qpn, remote_mac, remote_ip, next_psn, remote_va, r_key, rq_psn,
             pmtu=int(proto.Pmtu.MTU_1024)):
    """The whole QP context row an obeyed OPEN_QP writes for QP ``index``."""
    qpn = proto.LOCAL_QPN_BASE + index
    return {
        "state": int(QPState.INIT), "remote_qpn": remote_qpn, "remote_mac": remote_mac,
        "remote_ip": remote_ip, "udp_sport": 0xC000 | (qpn & 0x3FFF), "dscp": 0, "ecn": 0,
        "p_key": 0xFFFF, "migreq": 1, "pmtu": int(pmtu), "next_psn": next_psn,
        "una_psn": next_psn, "remote_va": remote_va, "r_key": r_key, "retry_cnt": 7,
        "rnr_retry": 7, "timeout": 14, "min_rnr_timer": 12, "rq_psn": rq_psn,
    }


class CmModel:
    """The CM responder with its QP table and traffic-generator state.

    Parameters
    ----------
    n_qp : int
        Rows of the QP table (engine QPNs 256 .. 256 + n_qp - 1).
    local_mac, local_ip : int
        The engine's MAC (48 bits) and IPv4 address (32 bits).
    cm_pmtu : int
        PMTU code (1..5) an OPEN writes into the row (``EngineConfig.cm_pmtu``).
    ttl : int
        IPv4 TTL of the reply frames (:meth:`frame`).

    Attributes
    ----------
    rows : list of dict
        The QP table, one ``dict`` of :data:`CONTEXT_FIELDS` per row (all zero = RESET).
        Tests may edit rows (e.g. ``next_psn`` after traffic) to follow the hardware.
    generator : GeneratorState or None
        The running generator; ``None`` when idle. :meth:`generator_done` marks the end of
        its traffic (the hardware's ``busy`` falling).
    gen_log : list of dict
        Every generator command given, in order: :meth:`GeneratorState.cmd` for a start,
        ``{"start": 0, "qp": index}`` for a stop.
    counters : dict
        ``name -> count`` for :data:`COUNTERS`.
    """

    def __init__(self, n_qp, *, local_mac, local_ip, cm_pmtu=int(proto.Pmtu.MTU_1024), ttl=64):
        check_n_qp(n_qp)
        proto.pmtu_bytes(cm_pmtu)        # raises for a bad code
        self.n_qp = n_qp
        self.local_mac = int(local_mac)
        self.local_ip = int(local_ip)
        self.cm_pmtu = int(cm_pmtu)
        self.ttl = int(ttl)
        self.rows = [self.zero_row() for _ in range(n_qp)]
        self.generator = None
        self.gen_log = []
        self.counters = dict.fromkeys(COUNTERS, 0)

    # -- table helpers -------------------------------------------------------------------------
    @staticmethod
    def zero_row():
        """An all-zero context row (state RESET)."""
        return dict.fromkeys(CONTEXT_FIELDS, 0)

    def index_of(self, qpn):
        """QP index of an engine QPN, or ``None`` if out of range."""
        index = qpn - proto.LOCAL_QPN_BASE
        return index if 0 <= index < self.n_qp else None

    def is_open(self, index):
        return self.rows[index]["state"] != QPState.RESET

    def generator_done(self):
        """The generator finished its messages (idle again)."""
        self.generator = None

    # -- the responder -------------------------------------------------------------------------
    def handle(self, dgram, src_mac, src_ip, src_port=0):
        """Process one datagram (64 bytes) received from ``src_mac``/``src_ip``/``src_port``.

        Applies the row changes and generator start/stop, counts the request once, and returns
        the reply as a :class:`CmReply` (``(dst_mac, dst_ip, dst_port, dgram)``) or ``None``
        when no reply is sent (``bad_port``). A ``dgram`` that is not 64 bytes raises
        ``ValueError`` (the RX front end never passes one)."""
        req = _unpack(dgram)
        code, reason, fields = self._process(req, int(src_mac), int(src_ip))
        self.counters[reason] += 1
        if code is None:
            return None
        reply = dict(fields)
        reply["ack_valid"] = 1
        reply["ack_type"] = int(code)
        return CmReply(int(src_mac), int(src_ip), req["reply_port"], proto.CM_DATAGRAM.pack(reply))

    def _process(self, req, src_mac, src_ip):
        """``(ack code or None, counter name, reply fields before the ack flags)``."""
        base = proto.cm_swap(req)
        base["loc_ip"] = self.local_ip

        def refuse(code, reason):
            return code, reason, base

        # 1-6: the datagram itself, before anything acts
        if req["ack_valid"] or req["ack_type"]:
            return refuse(CmAck.ERROR, "bad_flags")
        if req["tx_resv"]:
            return refuse(CmAck.ERROR, "bad_txmeta")
        if req["valid"] == req["tx_valid"]:
            return refuse(CmAck.ERROR, "bad_flags")
        if req["reply_port"] == 0:
            return None, "bad_port", None
        if any(req[f] & _TOP8 for f in ("loc_qpn", "loc_psn", "rem_qpn", "rem_psn")):
            return refuse(CmAck.ERROR, "bad_field")
        if req["valid"] and req["req_type"] not in _VALID_REQS:
            return refuse(CmAck.ERROR, "bad_req")

        if not req["valid"]:
            return self._txmeta(req, src_ip, base)
        if req["req_type"] == CmReq.OPEN_QP:
            return self._open(req, src_mac, src_ip, base)
        if req["req_type"] == CmReq.FETCH_QP_INFO:
            return self._fetch(req, base)
        return self._modify_or_close(req, src_ip, base)

    def _acked(self, base, index, loc_psn, req):
        """MODIFY-style ACK fields: engine QPN, ``loc_psn``, zero key/address, engine IP."""
        out = dict(base)
        out.update(loc_qpn=proto.LOCAL_QPN_BASE + index, loc_psn=loc_psn, loc_r_key=0,
                   loc_base_addr=0, loc_ip=self.local_ip)
        for loc, rem in zip(proto.CM_LOC_FIELDS, proto.CM_REM_FIELDS):
            out[rem] = req[loc]
        return CmAck.ACK, "ok", out

    def _open(self, req, src_mac, src_ip, base):
        if req["loc_ip"] != src_ip:
            return CmAck.ERROR, "bad_field", base
        mine = [i for i, r in enumerate(self.rows)
                if r["state"] != QPState.RESET and r["remote_ip"] == src_ip
                and r["remote_qpn"] == req["loc_qpn"]]
        if req["rem_qpn"] == 0:
            if mine:
                index = mine[0]
            else:
                free = [i for i, r in enumerate(self.rows) if r["state"] == QPState.RESET]
                if not free:
                    return CmAck.NO_QP, "no_qp", base
                index = free[0]
        else:
            index = self.index_of(req["rem_qpn"])
            if index is None:
                return CmAck.NAK, "bad_qpn", base
            if self.is_open(index) and index not in mine:
                return CmAck.NAK, "in_use", base
        self.rows[index] = open_row(
            index, remote_qpn=req["loc_qpn"], remote_mac=src_mac, remote_ip=req["loc_ip"],
            next_psn=req["rem_psn"], remote_va=req["loc_base_addr"], r_key=req["loc_r_key"],
            rq_psn=req["loc_psn"], pmtu=self.cm_pmtu)
        return self._acked(base, index, req["rem_psn"], req)

    def _modify_or_close(self, req, src_ip, base):
        index = self.index_of(req["rem_qpn"])
        if index is None:
            return CmAck.NAK, "bad_qpn", base
        row = self.rows[index]
        close = req["req_type"] == CmReq.CLOSE_QP
        if row["state"] == QPState.RESET or (not close and row["state"] == QPState.ERROR):
            return CmAck.NAK, "bad_state", base
        if row["remote_ip"] != src_ip:
            return CmAck.NAK, "not_owner", base
        if close:
            psn = row["next_psn"]
            self._stop(index)
            self.rows[index] = self.zero_row()
            return self._acked(base, index, psn, req)
        if req["loc_qpn"] != row["remote_qpn"]:
            return CmAck.NAK, "not_owner", base
        row.update(state=int(QPState.RTS), next_psn=req["rem_psn"], una_psn=req["rem_psn"],
                   r_key=req["loc_r_key"], remote_va=req["loc_base_addr"], rq_psn=req["loc_psn"])
        return self._acked(base, index, req["rem_psn"], req)

    def _fetch(self, req, base):
        index = self.index_of(req["rem_qpn"])
        if index is None:
            return CmAck.NAK, "bad_qpn", base
        row = self.rows[index]
        if row["state"] == QPState.RESET:
            return CmAck.NAK, "bad_state", base
        out = dict(base)
        out.update(loc_qpn=proto.LOCAL_QPN_BASE + index, loc_psn=row["next_psn"],
                   loc_r_key=row["state"], loc_base_addr=0, loc_ip=self.local_ip,
                   rem_qpn=row["remote_qpn"], rem_psn=row["rq_psn"], rem_r_key=row["r_key"],
                   rem_base_addr=row["remote_va"], rem_ip=row["remote_ip"])
        return CmAck.ACK, "ok", out

    def _txmeta(self, req, src_ip, base):
        index = self.index_of(req["rem_qpn"])
        if index is None:
            return CmAck.NAK, "bad_qpn", base
        row = self.rows[index]
        if row["state"] != QPState.RTS:
            return CmAck.NAK, "bad_state", base
        if row["remote_ip"] != src_ip:
            return CmAck.NAK, "not_owner", base
        if req["tx_start"]:
            if req["tx_dma_length"] > 1 << 31 or req["tx_n_transfers"] == 0:
                return CmAck.ERROR, "bad_txmeta", base
            if self.generator is not None:
                return CmAck.NAK, "busy", base
            if req["tx_type"]:
                op = WrOpcode.RDMA_WRITE_WITH_IMM if req["tx_immediate"] else WrOpcode.RDMA_WRITE
            else:
                op = WrOpcode.SEND_WITH_IMM if req["tx_immediate"] else WrOpcode.SEND
            self.generator = GeneratorState(
                qp=index, opcode=op, length=req["tx_dma_length"], count=req["tx_n_transfers"],
                period=req["tx_period"], remote_va=row["remote_va"], r_key=row["r_key"])
            self.gen_log.append(self.generator.cmd())
        else:
            self._stop(index)
        return self._acked(base, index, row["next_psn"], req)

    def _stop(self, index):
        if self.generator is not None and self.generator.qp == index:
            self.generator = None
            self.gen_log.append({"start": 0, "qp": index})

    # -- frames --------------------------------------------------------------------------------
    def frame(self, reply, *, ttl=None):
        """The full Ethernet/IPv4/UDP frame of a :class:`CmReply` from this engine."""
        return reply_frame(reply, local_mac=self.local_mac, local_ip=self.local_ip,
                           ttl=self.ttl if ttl is None else ttl)

    def handle_frame(self, frame):
        """:meth:`handle` for a whole frame that passed the RX front end's CM checks (see
        :func:`parse_cm_frame`); returns the reply frame or ``None``. A frame that is not a CM
        frame for this engine is ignored (``None``, nothing counted)."""
        parsed = parse_cm_frame(frame, local_mac=self.local_mac, local_ip=self.local_ip)
        if parsed is None:
            return None
        reply = self.handle(*parsed)
        return None if reply is None else self.frame(reply)


def _ipv4(src, dst, ttl):
    ip = {"version": 4, "ihl": 5, "total_length": IPV4_TOTAL_LENGTH, "identification": 0,
          "flag_df": 1, "ttl": ttl, "protocol": proto.IP_PROTO_UDP, "checksum": 0,
          "src": src, "dst": dst}
    ip["checksum"] = ipv4_checksum(proto.IPV4.pack(ip))
    return ip


def request_frame(dgram, *, src_mac, dst_mac, src_ip, dst_ip, src_port=proto.CM_REPLY_UDP_PORT,
                  dst_port=proto.CM_UDP_PORT, ttl=64):
    """A CM request frame (Ethernet/IPv4/UDP/datagram, no FCS) as a host sends it."""
    return insert(CM_FRAME[:3], {
        "eth": {"dst": dst_mac, "src": src_mac, "ethertype": proto.ETHERTYPE_IPV4},
        "ipv4": _ipv4(src_ip, dst_ip, ttl),
        "udp": {"src_port": src_port, "dst_port": dst_port, "length": UDP_LENGTH,
                "checksum": 0},
    }, dgram)


def reply_frame(reply, *, local_mac, local_ip, ttl=64):
    """The frame of a :class:`CmReply` (or ``(dst_mac, dst_ip, dst_port, dgram)``): Ethernet to
    ``dst_mac`` from ``local_mac``; IPv4 version 4, IHL 5, DF, ``ttl``, identification 0,
    checksum; UDP source port 0x4321, destination ``dst_port``, checksum 0; the datagram."""
    dst_mac, dst_ip, dst_port, dgram = reply
    return request_frame(dgram, src_mac=local_mac, dst_mac=dst_mac, src_ip=local_ip,
                         dst_ip=dst_ip, src_port=proto.CM_UDP_PORT, dst_port=dst_port, ttl=ttl)


def parse_cm_frame(frame, *, local_mac, local_ip):
    """``(dgram, src_mac, src_ip, src_port)`` of a frame that passes the RX front end's CM
    checks (destination MAC ours, EtherType IPv4, version 4, IHL 5, no fragment, header
    checksum, total length = 92 within the frame, destination IP ours, protocol UDP, UDP
    destination port 0x4321, UDP length 72), else ``None``. Ethernet padding after the IPv4
    packet is allowed."""
    frame = bytes(frame)
    need = sum(h.size for h in CM_FRAME)
    if len(frame) < need:
        return None
    eth = proto.ETH.unpack(frame)
    ip_bytes = frame[proto.ETH.size:proto.ETH.size + proto.IPV4.size]
    ip = proto.IPV4.unpack(ip_bytes)
    udp = proto.UDP.unpack(frame, proto.ETH.size + proto.IPV4.size)
    ok = (eth["dst"] == local_mac and eth["ethertype"] == proto.ETHERTYPE_IPV4
          and ip["version"] == 4 and ip["ihl"] == 5 and not ip["flag_mf"]
          and ip["frag_offset"] == 0 and ipv4_checksum(ip_bytes) == 0
          and ip["total_length"] == IPV4_TOTAL_LENGTH and ip["dst"] == local_ip
          and ip["protocol"] == proto.IP_PROTO_UDP and udp["dst_port"] == proto.CM_UDP_PORT
          and udp["length"] == UDP_LENGTH)
    if not ok:
        return None
    start = proto.ETH.size + proto.IPV4.size + proto.UDP.size
    return frame[start:start + proto.CM_DATAGRAM.size], eth["src"], ip["src"], udp["src_port"]
