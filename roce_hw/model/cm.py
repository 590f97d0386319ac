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
including the header checksum, our IP, UDP dport 0x4321, UDP length 8 + 64), with the frame's
source MAC, source IP, UDP source port and the UDP header's checksum field as received.

Validation, in this order; the first rule that fails decides (reply code, counter)
-------------------------------------------------------------------------------------
1. The UDP checksum is not 0 and wrong (RFC 768: the one's-complement sum of the IPv4
   pseudo-header -- source IP, the engine's IP, protocol 17, UDP length 72 --, the UDP header
   and the 64 bytes is not 0xFFFF): no reply, ``bad_checksum``. It is the datagram's only
   integrity check (a CM datagram has no iCRC), and the reply address of a corrupted datagram
   cannot be trusted. A checksum of 0 means "not computed" and is accepted.
2. Nowhere to reply: ``reply_port`` = 0 and the UDP source port 0 too: no reply, ``bad_port``.
   (``reply_port`` = 0 means "reply to the datagram's UDP source port": the reference script's
   txmeta datagram carries 0 there.)
3. ``ack_valid`` = 1 or ``ack_type`` != 0 (a request never carries an ack): ERROR, ``bad_flags``.
4. ``tx_resv`` != 0: ERROR, ``bad_txmeta``.
5. ``valid`` = 1 and ``tx_valid`` = 1 (two requests in one) or both 0 (no request): ERROR,
   ``bad_flags``.
6. ``valid`` = 1 and ``req_type`` = SEND_QP_INFO (2), the message the reference design sends
   when it opens a connection itself: ignored as the reference ignores it (no reply),
   ``ignored``.
7. A 24-bit field with its top byte set (``loc_qpn``, ``loc_psn``, ``rem_qpn``, ``rem_psn``):
   ERROR, ``bad_field``.
8. ``valid`` = 1 and ``req_type`` not in {OPEN_QP 1, MODIFY_QP_RTS 3, CLOSE_QP 4,
   FETCH_QP_INFO 5}: ERROR, ``bad_req``.
9. The request's own rules below.

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
  source MAC, ``remote_ip`` = loc_ip, ``udp_sport`` = :func:`proto.cm_udp_sport` (0xC000 |
  (engine QPN & 0x3FFF)), ``pmtu`` = the build's CM PMTU code (default 3, 1024 bytes),
  ``next_psn`` = ``una_psn`` = rem_psn (the requester says where the engine's send PSN starts;
  reset on every (re)open), ``remote_va`` = loc_base_addr, ``r_key`` = loc_r_key, ``rq_psn`` =
  loc_psn, and the fixed fields of :data:`proto.CM_OPEN_ROW` (dscp 0, ecn 0, ``p_key`` 0xFFFF,
  ``migreq`` 1, ``retry_cnt`` 7, ``rnr_retry`` 7, ``timeout`` 14, ``min_rnr_timer`` 12).
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
``reply_port``, or the request's UDP source port when ``reply_port`` is 0; IPv4 as the TX
path's (:data:`proto.IPV4_FIXED`: version 4, IHL 5, DF; TTL from the configuration,
identification 0, checksum), UDP checksum 0. Datagram: the request with loc_* and rem_* swapped
(then the fields named above overwritten), loc_ip = engine IP, ``valid``/``req_type``,
``reply_port`` (as received, 0 included) and the whole txmeta (flags, length, count, period)
echoed, ``ack_valid`` = 1, ``ack_type`` = the code. An ERROR reply to a malformed request is the
request swapped with loc_ip = engine IP, ack_valid = 1, ack_type = ERROR (req_type echoed as
received). NAK and NO_QP replies likewise carry the request swapped with loc_ip = engine IP.

Counters: ``ok`` (requests obeyed: ACK replies) and one per reason above (:data:`COUNTERS`).
Every datagram is counted exactly once. No request other than an obeyed OPEN, MODIFY, CLOSE or
txmeta changes any QP row or the generator.

Compatibility with the reference design
---------------------------------------
The reference is 100G-verilog-RoCEv2-lite's ``udp_RoCE_connection_manager`` in its "Slave"
mode (``rtl/connection_manager/*.sv``) and its host script ``Scripts/send_connection_info.py``.
Every datagram the script can send gets from us what the reference gives it, except where
marked *we differ* (``tests/test_cm_reference.py`` replays each one through the engine):

* OPEN_QP (``-r 1``): ACK from the next free QP (256 up), loc_psn 0 (= the script's rem_psn),
  loc_r_key 0, loc_base_addr 0, loc_ip = engine IP, rem_* = the request's loc_*; NO_QP when none
  is free. *We differ*: the lowest free row, not the reference's FIFO of closed QPNs; a re-open
  of the same (IP, QPN) keeps its row; ``loc_ip`` must be the frame's source IP (the script puts
  the address it listens on there).
* MODIFY_QP_RTS (``-r 3``): ACK, loc_* = the request's rem_* (the script's rem_psn, rem_r_key,
  rem_base_addr are 0: our loc_psn = rem_psn, loc_r_key 0, loc_base_addr 0 are the same bytes).
  *We differ*: a QP number out of range, a QP not open or not the requester's gets NAK (the
  reference's QP table answers ERROR unless the QP is in INIT); RTS -> RTS is obeyed.
* CLOSE_QP (``-r 4``): ACK; NAK out of range, as the reference. *We differ*: NAK also for a
  free QP or another owner; loc_psn = the QP's send PSN (the reference echoes rem_psn, 0).
* txmeta (``-s``): starts the generator on QP rem_qpn with length, count and period (``-rt``:
  clock / rate cycles). *We differ*: we reply (ACK, or NAK/ERROR after our checks: the QP must
  be in RTS and the requester's, the generator idle); the reference sends nothing and ignores a
  start while it runs. Its length is rounded down to a multiple of 4 and its immediate data is
  0xABCD1234 constant; ours sends exactly the length asked for, imm = message number
  (:mod:`roce_hw.model.generator`). A txmeta with ``tx_start`` 0 stops our generator on that
  QP; the reference does nothing.
* SEND_QP_INFO (``send_qp_info()``): the script sends it to UDP port 0x4322, not the CM's: the
  RX front end passes it on as other traffic. Sent to 0x4321 it is ignored (rule 6), as the
  reference ignores it.
* Replies: *we differ* in the reply's bytes 49-63 (ours echo ``reply_port`` and the txmeta, the
  reference sends its own port 0x4321 and zeros; the script decodes bytes 0-48 only), in the UDP
  source port (0x4321; the reference's example design uses 0x8765), and NAK/NO_QP/ERROR replies
  carry the request swapped (the reference repeats its previous reply's fields with the new code).
* *We validate more*: the UDP checksum, the flag bits, the reserved txmeta bits, the top bytes of
  the 24-bit fields and unknown request codes (the reference ignores all of these; we ERROR the
  malformed ones and ignore only SEND_QP_INFO), FETCH_QP_INFO (5) is ours (the reference uses
  code 5 internally only).
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
           "request_frame", "parse_cm_frame", "udp_checksum", "udp_checksum_ok", "CM_FRAME",
           "UDP_LENGTH", "IPV4_TOTAL_LENGTH"]

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


#: The bits above a 24-bit QPN/PSN in its 32-bit field (they must be 0).
_TOP = ((1 << 32) - 1) ^ proto.PSN_MASK
_VALID_REQS = (CmReq.OPEN_QP, CmReq.MODIFY_QP_RTS, CmReq.CLOSE_QP, CmReq.FETCH_QP_INFO)


def _udp_sum(dgram, src_ip, dst_ip, src_port, dst_port, checksum):
    """RFC 1071 check value over the IPv4 pseudo-header, the UDP header and ``dgram``: 0 when
    the one's-complement sum of all of it is 0xFFFF."""
    pseudo = (src_ip.to_bytes(4, "big") + dst_ip.to_bytes(4, "big")
              + bytes((0, proto.IP_PROTO_UDP)) + UDP_LENGTH.to_bytes(2, "big"))
    header = proto.UDP.pack(src_port=src_port, dst_port=dst_port, length=UDP_LENGTH,
                            checksum=checksum)
    return ipv4_checksum(pseudo + header + bytes(dgram))


def udp_checksum(dgram, *, src_ip, dst_ip, src_port, dst_port=proto.CM_UDP_PORT):
    """The UDP checksum a sender puts in a CM datagram's header (RFC 768; a computed 0 is sent
    as 0xFFFF, 0 meaning "not computed")."""
    return _udp_sum(dgram, src_ip, dst_ip, src_port, dst_port, 0) or 0xFFFF


def udp_checksum_ok(dgram, *, src_ip, dst_ip, src_port, checksum, dst_port=proto.CM_UDP_PORT):
    """Whether a received CM datagram's UDP ``checksum`` is right (or 0: not computed)."""
    return checksum == 0 or _udp_sum(dgram, src_ip, dst_ip, src_port, dst_port, checksum) == 0


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
    row = dict(proto.CM_OPEN_ROW)
    row.update(state=int(QPState.INIT), remote_qpn=remote_qpn, remote_mac=remote_mac,
               remote_ip=remote_ip, udp_sport=proto.cm_udp_sport(proto.LOCAL_QPN_BASE + index),
               pmtu=int(pmtu), next_psn=next_psn, una_psn=next_psn, remote_va=remote_va,
               r_key=r_key, rq_psn=rq_psn)
    return {name: row[name] for name in CONTEXT_FIELDS}


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
    def handle(self, dgram, src_mac, src_ip, src_port=0, udp_checksum=0):
        """Process one datagram (64 bytes) received from ``src_mac``/``src_ip``/``src_port``
        with the UDP checksum field ``udp_checksum`` (0: not computed).

        Applies the row changes and generator start/stop, counts the request once, and returns
        the reply as a :class:`CmReply` (``(dst_mac, dst_ip, dst_port, dgram)``) or ``None``
        when no reply is sent (``bad_checksum``, ``bad_port``, ``ignored``). A ``dgram`` that
        is not 64 bytes raises ``ValueError`` (the RX front end never passes one)."""
        req = _unpack(dgram)
        src_port = int(src_port)
        if udp_checksum_ok(dgram, src_ip=int(src_ip), dst_ip=self.local_ip, src_port=src_port,
                           checksum=int(udp_checksum)):
            code, reason, fields = self._process(req, int(src_mac), int(src_ip), src_port)
        else:
            code, reason = None, "bad_checksum"
        self.counters[reason] += 1
        if code is None:
            return None
        reply = dict(fields)
        reply["ack_valid"] = 1
        reply["ack_type"] = int(code)
        return CmReply(int(src_mac), int(src_ip), req["reply_port"] or src_port,
                       proto.CM_DATAGRAM.pack(reply))

    def _process(self, req, src_mac, src_ip, src_port):
        """``(ack code or None, counter name, reply fields before the ack flags)`` of a
        datagram whose checksum is right (rule 1)."""
        base = proto.cm_swap(req)
        base["loc_ip"] = self.local_ip

        def refuse(code, reason):
            return code, reason, base

        # 2-8: the datagram itself, before anything acts
        if req["reply_port"] == 0 and src_port == 0:
            return None, "bad_port", None
        if req["ack_valid"] or req["ack_type"]:
            return refuse(CmAck.ERROR, "bad_flags")
        if req["tx_resv"]:
            return refuse(CmAck.ERROR, "bad_txmeta")
        if req["valid"] == req["tx_valid"]:
            return refuse(CmAck.ERROR, "bad_flags")
        if req["valid"] and req["req_type"] == CmReq.SEND_QP_INFO:
            return None, "ignored", None
        if any(req[f] & _TOP for f in ("loc_qpn", "loc_psn", "rem_qpn", "rem_psn")):
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
        :func:`parse_cm_frame`, UDP checksum included); returns the reply frame or ``None``. A
        frame that is not a CM frame for this engine is ignored (``None``, nothing counted)."""
        parsed = parse_cm_frame(frame, local_mac=self.local_mac, local_ip=self.local_ip)
        if parsed is None:
            return None
        reply = self.handle(*parsed)
        return None if reply is None else self.frame(reply)


def _ipv4(src, dst, ttl):
    ip = dict(proto.IPV4_FIXED, total_length=IPV4_TOTAL_LENGTH, identification=0, ttl=ttl,
              protocol=proto.IP_PROTO_UDP, checksum=0, src=src, dst=dst)
    ip["checksum"] = ipv4_checksum(proto.IPV4.pack(ip))
    return ip


def request_frame(dgram, *, src_mac, dst_mac, src_ip, dst_ip, src_port=proto.CM_REPLY_UDP_PORT,
                  dst_port=proto.CM_UDP_PORT, ttl=64, checksum=0):
    """A CM request frame (Ethernet/IPv4/UDP/datagram, no FCS) as a host sends it. The UDP
    checksum field is ``checksum`` (an integer; 0: not computed), or the right one
    (:func:`udp_checksum`) with ``checksum=True``."""
    if checksum is True:
        checksum = udp_checksum(dgram, src_ip=src_ip, dst_ip=dst_ip, src_port=src_port,
                                dst_port=dst_port)
    return insert(CM_FRAME[:3], {
        "eth": {"dst": dst_mac, "src": src_mac, "ethertype": proto.ETHERTYPE_IPV4},
        "ipv4": _ipv4(src_ip, dst_ip, ttl),
        "udp": {"src_port": src_port, "dst_port": dst_port, "length": UDP_LENGTH,
                "checksum": int(checksum)},
    }, dgram)


def reply_frame(reply, *, local_mac, local_ip, ttl=64):
    """The frame of a :class:`CmReply` (or ``(dst_mac, dst_ip, dst_port, dgram)``): Ethernet to
    ``dst_mac`` from ``local_mac``; IPv4 version 4, IHL 5, DF, ``ttl``, identification 0,
    checksum; UDP source port 0x4321, destination ``dst_port``, checksum 0; the datagram."""
    dst_mac, dst_ip, dst_port, dgram = reply
    return request_frame(dgram, src_mac=local_mac, dst_mac=dst_mac, src_ip=local_ip,
                         dst_ip=dst_ip, src_port=proto.CM_UDP_PORT, dst_port=dst_port, ttl=ttl)


def parse_cm_frame(frame, *, local_mac, local_ip):
    """``(dgram, src_mac, src_ip, src_port, udp_checksum)`` of a frame that passes the RX front
    end's CM
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
    return (frame[start:start + proto.CM_DATAGRAM.size], eth["src"], ip["src"], udp["src_port"],
            udp["checksum"])
