# SPDX-License-Identifier: BSD-2-Clause
"""Independent model of the remote RoCEv2 responder (Linux rxe behaviour), an oracle for TX frames.

:class:`ResponderModel` receives Ethernet frames the way a receiving NIC does and answers them the
way the Linux soft-RoCE driver's responder does (``rxe_recv.c`` ``hdr_check``/iCRC check and the
``rxe_resp.c`` state machine: check_psn -> check_op_seq -> check_op_valid -> check_resource ->
check_length -> check_rkey -> execute -> complete -> acknowledge; PROTOCOL.md §5.6-5.9).

It deliberately shares no code with the project's segmentation model or frame parser
(``roce_hw.model.segment`` / ``roce_hw.model.packet``): it only uses the header field lists of
:mod:`roce_hw.proto` and the iCRC of :mod:`roce_hw.model.icrc`, and parses every frame itself.

Typical use::

    peer = ResponderModel()
    peer.add_qp(0x11, epsn=0, pmtu=1024, remote_qpn=0x100)
    peer.register_mr(va=0x1000, length=65536, r_key=5)
    peer.post_recv(0x11, size=4096, count=8)
    messages = deliver(tx_frames, peer)        # completed messages, in order
    assert not peer.violations, peer.violations
"""

import struct
from collections import Counter, deque
from dataclasses import dataclass, field

from roce_hw import proto
from roce_hw.model.icrc import icrc_bytes

__all__ = ["MemoryRegion", "Completion", "Violation", "ResponderModel", "deliver"]


# --- The responder's view of the RC/UC opcodes (rxe_opcode.c masks), low 5 bits of the opcode --

_FIRST, _MIDDLE, _LAST, _ONLY = "FIRST", "MIDDLE", "LAST", "ONLY"

#: low 5 opcode bits -> (message kind, position, extension headers after the BTH in wire order)
_REQUESTS = {
    0x00: ("SEND", _FIRST, ()),
    0x01: ("SEND", _MIDDLE, ()),
    0x02: ("SEND", _LAST, ()),
    0x03: ("SEND_IMM", _LAST, (proto.IMMDT,)),
    0x04: ("SEND", _ONLY, ()),
    0x05: ("SEND_IMM", _ONLY, (proto.IMMDT,)),
    0x06: ("WRITE", _FIRST, (proto.RETH,)),
    0x07: ("WRITE", _MIDDLE, ()),
    0x08: ("WRITE", _LAST, ()),
    0x09: ("WRITE_IMM", _LAST, (proto.IMMDT,)),
    0x0A: ("WRITE", _ONLY, (proto.RETH,)),
    0x0B: ("WRITE_IMM", _ONLY, (proto.RETH, proto.IMMDT)),
    0x0C: ("READ", _ONLY, (proto.RETH,)),
}
_RC_ONLY = {0x0C}                                  # RDMA READ does not exist on UC
_RWR = {0x00, 0x04, 0x05, 0x09, 0x0B}              # consumes a receive WQE (RXE_RWR_MASK)
_COMP = {0x02, 0x03, 0x04, 0x05, 0x09, 0x0B}       # generates a receive completion
_SEND_CONT = {0x01, 0x02, 0x03}                    # may follow SEND_FIRST/MIDDLE
_WRITE_CONT = {0x07, 0x08, 0x09}                   # may follow WRITE_FIRST/MIDDLE
_NEEDS_FIRST = _SEND_CONT | _WRITE_CONT | {0x16}
_RESPONSES = {0x0D, 0x0E, 0x0F, 0x10, 0x11, 0x12}  # go to the completer, never to a responder

_OP_ACK = 0x11
_OP_READ_FIRST, _OP_READ_MIDDLE, _OP_READ_LAST, _OP_READ_ONLY = 0x0D, 0x0E, 0x0F, 0x10

_SYN_ACK = proto.aeth_syndrome(proto.AethType.ACK, proto.AETH_ACK_UNLIMITED)                # 0x1F
_SYN_NAK_SEQ = proto.aeth_syndrome(proto.AethType.NAK, proto.NakCode.PSN_SEQUENCE_ERROR)     # 0x60
_SYN_NAK_INV = proto.aeth_syndrome(proto.AethType.NAK, proto.NakCode.INVALID_REQUEST)        # 0x61
_SYN_NAK_ACC = proto.aeth_syndrome(proto.AethType.NAK, proto.NakCode.REMOTE_ACCESS_ERROR)    # 0x62
_SYN_NAK_OP = proto.aeth_syndrome(proto.AethType.NAK, proto.NakCode.REMOTE_OPERATIONAL_ERROR)

_MTUS = (256, 512, 1024, 2048, 4096)


def _psn_diff(a, b):
    """rxe ``psn_compare(a, b)``: >0 if ``a`` is ahead of ``b``, <0 if behind, 0 if equal."""
    d = (a - b) & proto.PSN_MASK
    if d == 0:
        return 0
    return d if d < 0x800000 else d - 0x1000000


def _ones_sum(data):
    if len(data) % 2:
        data += b"\x00"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def _ipv4_checksum(header):
    """Header checksum of a 20+ byte IPv4 header whose checksum field is zero."""
    return (~_ones_sum(bytes(header))) & 0xFFFF


def _mac(b):
    return ":".join(f"{x:02x}" for x in b)


# --- Observable records -----------------------------------------------------------------------

@dataclass
class MemoryRegion:
    """A registered memory region: ``length`` bytes at virtual address ``va``, reachable remotely
    with ``r_key``. ``data`` is its contents (zeros unless given)."""
    va: int
    length: int
    r_key: int
    remote_write: bool = True
    remote_read: bool = True
    data: bytearray = None

    def __post_init__(self):
        if self.va < 0 or self.length < 0 or self.va + self.length > 1 << 64:
            raise ValueError(f"memory region va={self.va:#x} length={self.length} does not fit "
                             f"in the 64-bit address space")
        if not 0 <= self.r_key < 1 << 32:
            raise ValueError(f"R_Key {self.r_key:#x} does not fit in 32 bits")
        if self.data is None:
            self.data = bytearray(self.length)
        else:
            self.data = bytearray(self.data)
            if len(self.data) != self.length:
                raise ValueError(f"memory region data is {len(self.data)} bytes, "
                                 f"length is {self.length}")

    def contains(self, va, n):
        return self.va <= va and va + n <= self.va + self.length


@dataclass
class Completion:
    """One completed message, in the order the responder completed them.

    ``kind`` is ``"SEND"``, ``"SEND_IMM"``, ``"WRITE"``, ``"WRITE_IMM"`` or ``"READ"``. ``data`` is
    the message's bytes (the receive buffer contents for a SEND; the memory contents written for a
    WRITE; the bytes returned for a READ). ``va`` and ``length`` are the RETH address and DMA length
    (None for SENDs, where ``length`` is the received byte count). ``msn`` is the responder's MSN
    after the message.
    """
    kind: str
    qpn: int
    data: bytes
    length: int
    va: int = None
    r_key: int = None
    imm: int = None
    solicited: bool = False
    first_psn: int = 0
    last_psn: int = 0
    msn: int = 0


@dataclass
class Violation:
    """A frame a receiving NIC would reject (``fatal``: it was dropped, NAKed or moved the QP to
    the error state) or that breaks a rule real senders follow (``fatal=False``: still processed).
    ``index`` is the 0-based number of the frame given to :meth:`ResponderModel.receive`."""
    index: int
    kind: str
    reason: str
    qpn: int = None
    psn: int = None
    fatal: bool = True

    def __str__(self):
        where = "" if self.qpn is None else f" QP {self.qpn:#x}"
        where += "" if self.psn is None else f" PSN {self.psn}"
        return f"frame {self.index}{where}: {self.kind}: {self.reason}"


# --- Internal state ---------------------------------------------------------------------------

@dataclass
class _Packet:
    index: int
    dst_mac: bytes
    src_mac: bytes
    vlan: bytes            # the 4 tag bytes after the source MAC, or b""
    ethertype: int
    ip_version: int
    src_ip: bytes
    dst_ip: bytes
    ip_tos: int
    udp_sport: int
    bth: dict
    opcode: int
    ext: dict
    payload: bytes
    pad: int

    @property
    def psn(self):
        return self.bth["psn"]

    @property
    def low(self):
        return self.opcode & 0x1F

    @property
    def kind(self):
        return _REQUESTS[self.low][0]

    @property
    def position(self):
        return _REQUESTS[self.low][1]

    @property
    def start(self):
        return self.position in (_FIRST, _ONLY)

    @property
    def end(self):
        return self.position in (_LAST, _ONLY)


@dataclass
class _QP:
    qpn: int
    transport: str
    pmtu: int
    epsn: int
    remote_qpn: int
    p_key: int
    min_rnr_timer: int
    udp_sport: int
    allow_write: bool
    allow_read: bool
    recv: deque = field(default_factory=deque)
    ack_psn: int = 0
    msn: int = 0
    opcode: int = -1            # last executed request opcode (rxe qp->resp.opcode)
    sent_psn_nak: bool = False
    drop_msg: bool = False      # UC: drop until the next FIRST/ONLY
    error: str = None           # set when a class A/C error moved the QP to the error state
    # message in progress
    wqe: dict = None            # {"size": int, "data": bytearray}
    mr: MemoryRegion = None
    va: int = 0
    msg_va: int = 0
    r_key: int = 0
    resid: int = 0
    length: int = 0
    first_psn: int = 0
    reads: list = field(default_factory=list)   # responder resources of executed READs


class _Drop(Exception):
    """A packet-level rejection: ``kind``, ``reason``, ``state`` (what rxe would do)."""

    def __init__(self, state, kind, reason):
        super().__init__(reason)
        self.state = state
        self.kind = kind
        self.reason = reason


# rxe responder error states we model
_ERR_LENGTH = "ERR_LENGTH"                     # RC class C: NAK invalid request, QP -> error
_ERR_MISSING_FIRST = "ERR_MISSING_OPCODE_FIRST"
_ERR_MISSING_LAST_C = "ERR_MISSING_OPCODE_LAST_C"
_ERR_MISSING_LAST_D1E = "ERR_MISSING_OPCODE_LAST_D1E"   # UC: drop this packet, abandon message
_ERR_UNSUPPORTED = "ERR_UNSUPPORTED_OPCODE"
_ERR_RKEY = "ERR_RKEY_VIOLATION"               # RC class C: NAK remote access error
_ERR_RNR = "ERR_RNR"                           # RC class B: RNR NAK, nothing else changes
_ERR_MALFORMED_WQE = "ERR_MALFORMED_WQE"


class ResponderModel:
    """The remote RDMA responder (RC and UC), checking frames as Linux rxe does.

    Feed it frames with :meth:`receive`; it returns the frames it would send back (ACKs, NAKs,
    RDMA READ responses). Everything it decides is observable afterwards:

    * :attr:`completions` - completed messages in order (:class:`Completion`);
    * :attr:`violations` - every rejected frame with a reason (:class:`Violation`);
    * :attr:`counters` - ``frames``, ``accepted``, ``duplicates``, ``seq_errors`` (NAKed PSN
      ahead), ``out_of_seq_dropped`` (silently dropped while a NAK is outstanding), ``bad_icrc``,
      ``malformed``, ``not_roce``, ``unknown_qp``, ``rejected``, ``naks_sent``, ``rnr_naks_sent``,
      ``acks_sent``, ``read_responses_sent``, ``uc_dropped``, ``qp_error_dropped``,
      ``duplicates_dropped`` (duplicate READs matching no saved READ), ``end_without_ackreq``
      (RC LAST/ONLY packets without AckReq: accepted, but never ACKed by themselves);
    * :attr:`sent` - every response frame, in order; :meth:`read_memory` - memory contents;
      :meth:`qp_state` - ePSN, MSN and error state of a QP.

    This is a pure-Python, transaction-level model: no latency or throughput; it never raises on
    bad input frames (they become violations), only on bad configuration. A violation is
    ``fatal`` when the frame was dropped, NAKed or moved the QP to the error state (RC class C
    errors: NAK, then every later frame of that QP is dropped as ``qp_error``); ``fatal=False``
    marks frames that were processed but break a rule real senders follow (``ipv4_no_df``,
    ``pad_nonzero``). Duplicates (retransmissions) are not violations; PSN-ahead frames are.

    Where it is stricter than, or differs from, rxe (on purpose):

    * a WRITE must end exactly at its RETH DMA length; rxe only checks this when the remaining
      length is at most one PMTU, so it would complete a too-short message silently;
    * BTH..pad must be a multiple of 4 bytes (IBA); rxe does not check it, so a PadCnt that
      disagrees with the pad bytes actually sent becomes ``bad_padcnt``;
    * on a UC opcode-sequence error (rxe class D1) the unfinished message is always abandoned;
      rxe forgets it only when it holds a receive WQE (a WRITE stays "in progress" there);
    * some kernel versions test ``pkt->opcode & RXE_START_MASK`` in ``check_length`` (a typo for
      ``pkt->mask``); the model applies the intended PMTU rules (FIRST/MIDDLE == PMTU,
      LAST 1..PMTU, ONLY 0..PMTU);
    * the iCRC is checked before the BTH fields (rxe checks TVer/QPN/P_Key first); this only
      changes which reason a doubly-broken frame gets;
    * not modelled (reported as ``unsupported_opcode``): atomics, SEND with invalidate, FLUSH,
      ATOMIC_WRITE, UD/RD/XRC, RoCEv1, SRQs. ImmDt/RETH placement follows from the opcode (rxe
      ``rxe_opcode[]`` offsets), so a misplaced header shows up as a size/length violation.

    Parameters
    ----------
    mac : bytes or str, optional
        This peer's MAC address. If given, frames for another unicast MAC are rejected.
    ip : bytes or str, optional
        This peer's IPv4 (4 bytes / dotted) or IPv6 (16 bytes) address. If given, frames for another
        address are rejected.
    ip_id_start : int
        First IPv4 identification of the frames it sends (incremented per frame).
    strict_l3 : bool
        Also report the non-fatal violations (DF clear, non-zero pad bytes). Default True.

    Raises
    ------
    ValueError
        On bad configuration (unknown transport, PMTU, duplicate QPN, addresses of wrong size).
    """

    def __init__(self, *, mac=None, ip=None, ip_id_start=0, strict_l3=True):
        self.mac = self._parse_mac(mac) if mac is not None else None
        self.ip = self._parse_ip(ip) if ip is not None else None
        self._ip_id = ip_id_start & 0xFFFF
        self.strict_l3 = strict_l3
        self._qps = {}
        self.regions = []
        self.completions = []
        self.violations = []
        self.sent = []
        self.counters = Counter()
        self._index = -1

    # --- configuration ----------------------------------------------------------------------

    @staticmethod
    def _parse_mac(mac):
        if isinstance(mac, str):
            mac = bytes(int(x, 16) for x in mac.split(":"))
        mac = bytes(mac)
        if len(mac) != 6:
            raise ValueError(f"MAC address must be 6 bytes, got {len(mac)}")
        return mac

    @staticmethod
    def _parse_ip(ip):
        if isinstance(ip, str):
            import ipaddress
            ip = ipaddress.ip_address(ip).packed
        ip = bytes(ip)
        if len(ip) not in (4, 16):
            raise ValueError(f"IP address must be 4 (IPv4) or 16 (IPv6) bytes, got {len(ip)}")
        return ip

    def add_qp(self, qpn, *, epsn, pmtu=1024, transport="RC", remote_qpn=0, p_key=0xFFFF,
               min_rnr_timer=12, udp_sport=None, allow_write=True, allow_read=True):
        """Create a responder QP in the ready-to-receive state.

        Parameters
        ----------
        qpn : int
            Local QP number (1..0xFFFFFF; QP 0 is not supported, as in rxe).
        epsn : int
            Expected PSN of the first request (the Starting PSN this side advertised).
        pmtu : int
            Path MTU in payload bytes: 256, 512, 1024, 2048 or 4096.
        transport : str
            ``"RC"`` or ``"UC"`` (UC: no ACKs, a broken message is dropped until the next
            FIRST/ONLY).
        remote_qpn : int
            The requester's QPN, written into the BTH of ACKs/NAKs/READ responses.
        p_key : int
            The QP's partition key (matched like rxe ``pkey_match``).
        min_rnr_timer : int
            RNR timer code (0-31) put into RNR NAKs.
        udp_sport : int or None
            UDP source port of the response frames; None echoes the request's source port.
        """
        if transport not in ("RC", "UC"):
            raise ValueError(f"transport {transport!r} is not one of 'RC', 'UC'")
        if pmtu not in _MTUS:
            raise ValueError(f"PMTU {pmtu!r} is not one of {', '.join(map(str, _MTUS))}")
        if not 1 <= qpn <= proto.QPN_MASK:
            raise ValueError(f"QPN {qpn:#x} is not in 1..0xFFFFFF")
        if qpn in self._qps:
            raise ValueError(f"QP {qpn:#x} already exists")
        if not 0 <= epsn <= proto.PSN_MASK:
            raise ValueError(f"ePSN {epsn:#x} does not fit in 24 bits")
        if not 0 <= remote_qpn <= proto.QPN_MASK:
            raise ValueError(f"remote QPN {remote_qpn:#x} does not fit in 24 bits")
        if not 0 <= min_rnr_timer < 32:
            raise ValueError(f"RNR timer code {min_rnr_timer} is not in 0..31")
        if udp_sport is not None and not 0 <= udp_sport <= 0xFFFF:
            raise ValueError(f"UDP source port {udp_sport} is not in 0..65535")
        qp = _QP(qpn=qpn, transport=transport, pmtu=pmtu, epsn=epsn, remote_qpn=remote_qpn,
                 p_key=p_key, min_rnr_timer=min_rnr_timer, udp_sport=udp_sport,
                 allow_write=allow_write, allow_read=allow_read)
        qp.ack_psn = epsn
        self._qps[qpn] = qp
        return qpn

    def register_mr(self, va, length, r_key, *, data=None, remote_write=True, remote_read=True):
        """Register a memory region; returns the :class:`MemoryRegion`."""
        for mr in self.regions:
            if mr.r_key == r_key:
                raise ValueError(f"R_Key {r_key:#x} is already registered")
        mr = MemoryRegion(va=va, length=length, r_key=r_key, data=data,
                          remote_write=remote_write, remote_read=remote_read)
        self.regions.append(mr)
        return mr

    def post_recv(self, qpn, size, count=1):
        """Post ``count`` receive buffers of ``size`` bytes on QP ``qpn`` (consumed by SEND and
        WRITE-with-immediate messages, in order)."""
        qp = self._qp_or_raise(qpn)
        if size < 0 or count < 0:
            raise ValueError("receive buffer size and count must be >= 0")
        qp.recv.extend([size] * count)

    def _qp_or_raise(self, qpn):
        try:
            return self._qps[qpn]
        except KeyError:
            known = ", ".join(hex(q) for q in sorted(self._qps))
            raise ValueError(f"no QP {qpn:#x}; known: {known or 'none'}") from None

    # --- observation ------------------------------------------------------------------------

    def qp_state(self, qpn):
        """``dict`` with ``epsn``, ``msn``, ``error`` (None or the reason), ``recv_posted``."""
        qp = self._qp_or_raise(qpn)
        in_message = qp.opcode >= 0 and (qp.opcode & 0x1F) in (0x00, 0x01, 0x06, 0x07)
        return {"epsn": qp.epsn, "msn": qp.msn, "error": qp.error, "recv_posted": len(qp.recv),
                "in_message": in_message}

    def read_memory(self, va, length):
        """Bytes ``[va, va + length)`` of the registered memory (must lie in one region)."""
        for mr in self.regions:
            if mr.contains(va, length):
                off = va - mr.va
                return bytes(mr.data[off:off + length])
        raise ValueError(f"[{va:#x}, {va + length:#x}) is not inside one registered region")

    @property
    def fatal_violations(self):
        return [v for v in self.violations if v.fatal]

    # --- receive path -----------------------------------------------------------------------

    def receive(self, frame):
        """Process one Ethernet frame (no FCS needed; trailing Ethernet padding is ignored).
        Returns the list of frames the responder sends in reply (possibly empty)."""
        self._index += 1
        self.counters["frames"] += 1
        out = []
        pkt = self._parse(bytes(frame))
        if pkt is not None:
            qp = self._qps[pkt.bth["dest_qp"]]
            self._respond(qp, pkt, out)
        self.sent.extend(out)
        return out

    def _violate(self, kind, reason, *, qpn=None, psn=None, fatal=True, counter=None):
        self.violations.append(Violation(self._index, kind, reason, qpn, psn, fatal))
        if counter:
            self.counters[counter] += 1

    def _parse(self, f):
        """Layer 2-4 checks, iCRC, BTH checks. Returns a _Packet or None (violation recorded)."""
        if len(f) < proto.ETH.size:
            self._violate("malformed", f"frame of {len(f)} bytes is shorter than an Ethernet "
                          "header", counter="malformed")
            return None
        eth = proto.ETH.unpack(f)
        off = proto.ETH.size
        vlan = b""
        ethertype = eth["ethertype"]
        if ethertype == proto.ETHERTYPE_VLAN:
            if len(f) < off + 4:
                self._violate("malformed", "truncated 802.1Q tag", counter="malformed")
                return None
            vlan = f[12:16]
            ethertype = struct.unpack_from("!H", f, 16)[0]
            off += 4
        dst_mac = f[0:6]
        if self.mac is not None and dst_mac != self.mac and not dst_mac[0] & 1:
            self._violate("wrong_mac", f"destination MAC {_mac(dst_mac)} is not this peer's "
                          f"{_mac(self.mac)}", counter="not_roce")
            return None
        if ethertype == proto.ETHERTYPE_IPV4:
            ip = self._parse_ipv4(f, off)
        elif ethertype == proto.ETHERTYPE_IPV6:
            ip = self._parse_ipv6(f, off)
        else:
            self._violate("not_roce", f"ethertype {ethertype:#06x} is neither IPv4 nor IPv6 "
                          "(RoCEv1 0x8915 is not modelled)", counter="not_roce")
            return None
        if ip is None:
            return None
        l3, l4, l4_end, src_ip, dst_ip, tos = ip
        if self.ip is not None and dst_ip != self.ip:
            self._violate("wrong_ip", f"destination IP {dst_ip.hex()} is not this peer's "
                          f"{self.ip.hex()}", counter="not_roce")
            return None
        # UDP
        if l4_end - l4 < proto.UDP.size:
            self._violate("malformed", f"IP payload of {l4_end - l4} bytes cannot hold a UDP "
                          "header", counter="malformed")
            return None
        udp = proto.UDP.unpack(f, l4)
        if udp["dst_port"] != proto.ROCEV2_UDP_PORT:
            self._violate("not_roce", f"UDP destination port {udp['dst_port']} is not 4791",
                          counter="not_roce")
            return None
        if udp["length"] != l4_end - l4:
            self._violate("malformed", f"UDP length {udp['length']} != IP payload length "
                          f"{l4_end - l4}", counter="malformed")
            return None
        min_len = proto.UDP.size + proto.BTH.size + proto.ICRC_BYTES
        if udp["length"] < min_len:
            self._violate("malformed", f"UDP length {udp['length']} < {min_len} (UDP + BTH + "
                          "iCRC)", counter="malformed")
            return None
        if udp["checksum"] != 0 and not self._udp_checksum_ok(f, l3, l4, l4_end, src_ip, dst_ip):
            self._violate("bad_udp_checksum", f"non-zero UDP checksum {udp['checksum']:#06x} "
                          "is wrong (the kernel drops the datagram)", counter="malformed")
            return None
        # iCRC (rxe_rcv: verified before the packet reaches the QP)
        ib = f[l3:l4_end]
        if icrc_bytes(ib[:-proto.ICRC_BYTES]) != ib[-proto.ICRC_BYTES:]:
            want = icrc_bytes(ib[:-proto.ICRC_BYTES]).hex()
            self._violate("bad_icrc", f"iCRC on the wire {ib[-4:].hex()} != computed {want}; "
                          "dropped silently", counter="bad_icrc")
            return None
        # BTH
        bo = l4 + proto.UDP.size
        bth = proto.BTH.unpack(f, bo)
        opcode = bth["opcode"]
        qpn = bth["dest_qp"]
        psn = bth["psn"]
        if bth["tver"] != 0:
            self._violate("bad_tver", f"BTH TVer {bth['tver']} != 0", qpn=qpn, psn=psn,
                          counter="malformed")
            return None
        if qpn == 0 or qpn not in self._qps:
            self._violate("unknown_qp", f"no QP matches destination QPN {qpn:#x}", qpn=qpn,
                          psn=psn, counter="unknown_qp")
            return None
        qp = self._qps[qpn]
        transport = opcode & 0xE0
        want_transport = proto.Transport.RC if qp.transport == "RC" else proto.Transport.UC
        low = opcode & 0x1F
        if transport != want_transport:
            self._violate("bad_transport", f"opcode {opcode:#04x} is not an {qp.transport} opcode "
                          f"but QP {qpn:#x} is {qp.transport}", qpn=qpn, psn=psn,
                          counter="malformed")
            return None
        if not self._pkey_match(bth["p_key"], qp.p_key):
            self._violate("bad_pkey", f"P_Key {bth['p_key']:#06x} does not match the QP's "
                          f"{qp.p_key:#06x}", qpn=qpn, psn=psn, counter="malformed")
            return None
        if low in _RESPONSES:
            self._violate("not_a_request", f"opcode {opcode:#04x} is a response/ACK; this model "
                          "is a responder only", qpn=qpn, psn=psn, counter="malformed")
            return None
        if low not in _REQUESTS or (transport == proto.Transport.UC and low in _RC_ONLY):
            self._violate("unsupported_opcode", f"opcode {opcode:#04x} is reserved or not "
                          "modelled (atomics, invalidate, flush)", qpn=qpn, psn=psn,
                          counter="malformed")
            return None
        # extension headers, payload, pad
        ext_hdrs = _REQUESTS[low][2]
        eo = bo + proto.BTH.size
        ext = {}
        for h in ext_hdrs:
            if eo + h.size > l4_end - proto.ICRC_BYTES:
                self._violate("malformed", f"{_REQUESTS[low][0]} {_REQUESTS[low][1]} needs "
                              f"{h.name}, but the packet ends first", qpn=qpn, psn=psn,
                              counter="malformed")
                return None
            ext[h.name] = h.unpack(f, eo)
            eo += h.size
        pad = bth["pad_cnt"]
        pay_end = l4_end - proto.ICRC_BYTES - pad
        if pay_end < eo:
            self._violate("bad_padcnt", f"PadCnt {pad} is larger than the {l4_end - 4 - eo} bytes "
                          "left after the headers", qpn=qpn, psn=psn, counter="malformed")
            return None
        transport_len = l4_end - proto.ICRC_BYTES - bo
        if transport_len % 4:
            self._violate("bad_padcnt", f"BTH..pad is {transport_len} bytes, not a multiple of 4: "
                          f"PadCnt {pad} does not make payload {pay_end - eo} + pad 4-byte aligned",
                          qpn=qpn, psn=psn, counter="malformed")
            return None
        payload = f[eo:pay_end]
        pad_bytes = f[pay_end:pay_end + pad]
        if any(pad_bytes) and self.strict_l3:
            self._violate("pad_nonzero", f"pad bytes {pad_bytes.hex()} are not zero", qpn=qpn,
                          psn=psn, fatal=False)
        return _Packet(index=self._index, dst_mac=dst_mac, src_mac=f[6:12], vlan=vlan,
                       ethertype=ethertype, ip_version=4 if len(src_ip) == 4 else 6,
                       src_ip=src_ip, dst_ip=dst_ip, ip_tos=tos, udp_sport=udp["src_port"],
                       bth=bth, opcode=opcode, ext=ext, payload=payload, pad=pad)

    def _parse_ipv4(self, f, off):
        if len(f) < off + proto.IPV4.size:
            self._violate("malformed", "truncated IPv4 header", counter="malformed")
            return None
        ip = proto.IPV4.unpack(f, off)
        ihl = ip["ihl"] * 4
        if ip["version"] != 4 or ihl < 20 or len(f) < off + ihl:
            self._violate("malformed", f"bad IPv4 version {ip['version']} / IHL {ip['ihl']}",
                          counter="malformed")
            return None
        if _ones_sum(f[off:off + ihl]) != 0xFFFF:
            hdr = bytearray(f[off:off + ihl])
            hdr[10:12] = b"\0\0"
            self._violate("bad_ip_checksum", f"IPv4 header checksum {ip['checksum']:#06x} != "
                          f"{_ipv4_checksum(hdr):#06x}", counter="malformed")
            return None
        total = ip["total_length"]
        if total < ihl or off + total > len(f):
            self._violate("malformed", f"IPv4 total length {total} does not fit the "
                          f"{len(f) - off} bytes after the Ethernet header", counter="malformed")
            return None
        if ip["flag_mf"] or ip["frag_offset"]:
            self._violate("fragmented", "IPv4 fragment (MF or fragment offset set); RoCEv2 is "
                          "never fragmented", counter="malformed")
            return None
        if ip["protocol"] != proto.IP_PROTO_UDP:
            self._violate("not_roce", f"IP protocol {ip['protocol']} is not UDP",
                          counter="not_roce")
            return None
        if ip["ttl"] == 0:
            self._violate("malformed", "IPv4 TTL 0", counter="malformed")
            return None
        if not ip["flag_df"] and self.strict_l3:
            self._violate("ipv4_no_df", "IPv4 DF is clear (RoCEv2 senders set DF)", fatal=False)
        src = ip["src"].to_bytes(4, "big")
        dst = ip["dst"].to_bytes(4, "big")
        tos = (ip["dscp"] << 2) | ip["ecn"]
        return off, off + ihl, off + total, src, dst, tos

    def _parse_ipv6(self, f, off):
        if len(f) < off + proto.IPV6.size:
            self._violate("malformed", "truncated IPv6 header", counter="malformed")
            return None
        ip = proto.IPV6.unpack(f, off)
        if ip["version"] != 6:
            self._violate("malformed", f"bad IPv6 version {ip['version']}", counter="malformed")
            return None
        if ip["next_header"] != proto.IP_PROTO_UDP:
            self._violate("not_roce", f"IPv6 next header {ip['next_header']} is not UDP",
                          counter="not_roce")
            return None
        end = off + proto.IPV6.size + ip["payload_length"]
        if end > len(f):
            self._violate("malformed", f"IPv6 payload length {ip['payload_length']} exceeds the "
                          "frame", counter="malformed")
            return None
        src = ip["src"].to_bytes(16, "big")
        dst = ip["dst"].to_bytes(16, "big")
        return off, off + proto.IPV6.size, end, src, dst, ip["traffic_class"]

    @staticmethod
    def _udp_checksum_ok(f, l3, l4, l4_end, src, dst):
        n = l4_end - l4
        if len(src) == 4:
            pseudo = src + dst + struct.pack("!BBH", 0, proto.IP_PROTO_UDP, n)
        else:
            pseudo = src + dst + struct.pack("!IxxxB", n, proto.IP_PROTO_UDP)
        return _ones_sum(pseudo + f[l4:l4_end]) == 0xFFFF

    @staticmethod
    def _pkey_match(a, b):
        """rxe/IBA pkey_match: same 15-bit key, at least one full member, key not 0."""
        return (a & 0x7FFF) != 0 and (a & 0x7FFF) == (b & 0x7FFF) and bool((a | b) & 0x8000)

    # --- responder state machine (rxe_resp.c) -------------------------------------------------

    def _respond(self, qp, p, out):
        qpn, psn = qp.qpn, p.psn
        if qp.error is not None:
            self._violate("qp_error", f"QP is in the error state ({qp.error}); dropped", qpn=qpn,
                          psn=psn, counter="qp_error_dropped")
            return
        # check_psn
        diff = _psn_diff(psn, qp.epsn)
        if qp.transport == "RC":
            if diff > 0:
                if qp.sent_psn_nak:
                    self._violate("psn_ahead", f"PSN ahead of ePSN {qp.epsn}; a sequence NAK is "
                                  "outstanding, dropped silently", qpn=qpn, psn=psn,
                                  counter="out_of_seq_dropped")
                    return
                qp.sent_psn_nak = True
                self._violate("psn_ahead", f"PSN ahead of ePSN {qp.epsn} (a packet is missing); "
                              f"NAK PSN-sequence-error with PSN {qp.epsn}, packet dropped",
                              qpn=qpn, psn=psn, counter="seq_errors")
                self._send_ack(qp, p, out, _SYN_NAK_SEQ, qp.epsn)
                return
            if diff < 0:
                self.counters["duplicates"] += 1
                self._duplicate(qp, p, out)
                return
            qp.sent_psn_nak = False
        else:
            if qp.drop_msg or diff != 0:
                if p.start:
                    qp.drop_msg = False
                else:
                    qp.drop_msg = True
                    why = ("the current message is being dropped" if diff == 0 else
                           f"PSN != ePSN {qp.epsn}")
                    self._violate("uc_dropped", f"UC {p.kind} {p.position}: {why}; dropped until "
                                  "the next FIRST/ONLY", qpn=qpn, psn=psn, counter="uc_dropped")
                    return
        try:
            self._check_op_seq(qp, p)
            self._check_op_valid(qp, p)
            self._check_resource(qp, p)
            self._check_length(qp, p)
            self._check_rkey(qp, p)
            self._execute(qp, p, out)
        except _Drop as e:
            self._error(qp, p, out, e)

    def _check_op_seq(self, qp, p):
        prev = qp.opcode & 0x1F if qp.opcode >= 0 else -1
        name = f"{p.kind} {p.position} (opcode {p.opcode:#04x})"
        uc = qp.transport == "UC"
        if prev in (0x00, 0x01):
            if p.low not in _SEND_CONT:
                raise _Drop(_ERR_MISSING_LAST_D1E if uc else _ERR_MISSING_LAST_C, "bad_op_seq",
                            f"a SEND message is in progress, so only SEND MIDDLE/LAST may follow, "
                            f"got {name}")
        elif prev in (0x06, 0x07):
            if p.low not in _WRITE_CONT:
                raise _Drop(_ERR_MISSING_LAST_D1E if uc else _ERR_MISSING_LAST_C, "bad_op_seq",
                            f"a WRITE message is in progress, so only WRITE MIDDLE/LAST may "
                            f"follow, got {name}")
        elif p.low in _NEEDS_FIRST:
            raise _Drop("UC_DROP" if uc else _ERR_MISSING_FIRST, "bad_op_seq",
                        f"{name} without a preceding FIRST")

    def _check_op_valid(self, qp, p):
        if p.kind.startswith("WRITE") and not qp.allow_write:
            raise _Drop("UC_DROP" if qp.transport == "UC" else _ERR_UNSUPPORTED, "access",
                        "remote WRITE is not enabled on this QP")
        if p.kind == "READ" and not qp.allow_read:
            raise _Drop(_ERR_UNSUPPORTED, "access", "remote READ is not enabled on this QP")

    def _check_resource(self, qp, p):
        if p.low in _RWR:
            if not qp.recv:
                raise _Drop(_ERR_RNR, "rnr", f"{p.kind} {p.position} needs a receive buffer but "
                            "none is posted (receiver not ready)")
            qp.wqe = {"size": qp.recv[0], "data": bytearray()}

    def _check_length(self, qp, p):
        n, mtu = len(p.payload), qp.pmtu
        pos = p.position
        if pos == _ONLY and n > mtu:
            raise _Drop(_ERR_LENGTH, "bad_length", f"{p.kind} ONLY payload {n} > PMTU {mtu}")
        if pos in (_FIRST, _MIDDLE) and n != mtu:
            raise _Drop(_ERR_LENGTH, "bad_length", f"{p.kind} {pos} payload {n} != PMTU {mtu} "
                        "(FIRST and MIDDLE carry exactly PMTU bytes)")
        if pos == _LAST and not 1 <= n <= mtu:
            raise _Drop(_ERR_LENGTH, "bad_length", f"{p.kind} LAST payload {n} is not in "
                        f"1..PMTU ({mtu})")
        if p.kind == "READ" and len(p.payload):
            raise _Drop(_ERR_LENGTH, "bad_length", f"RDMA READ request carries {n} payload bytes")
        if "RETH" in p.ext and p.ext["RETH"]["dma_length"] > 1 << 31:
            raise _Drop(_ERR_LENGTH, "bad_length", f"RETH DMA length "
                        f"{p.ext['RETH']['dma_length']} > 2^31")

    def _check_rkey(self, qp, p):
        if not (p.kind.startswith("WRITE") or p.kind == "READ"):
            return
        if "RETH" in p.ext:
            reth = p.ext["RETH"]
            qp.va = qp.msg_va = reth["va"]
            qp.r_key = reth["r_key"]
            qp.resid = qp.length = reth["dma_length"]
            qp.first_psn = p.psn
            qp.mr = None
            if reth["dma_length"] == 0:
                if p.payload:
                    raise _Drop(_ERR_LENGTH, "reth_length", f"RETH DMA length 0 but the "
                                f"{p.kind} ONLY packet carries {len(p.payload)} bytes")
                return    # C9-88: a zero-byte op needs no valid address or R_Key
        elif qp.length == 0 and qp.mr is None:
            raise _Drop(_ERR_LENGTH, "reth_length", f"{p.kind} {p.position} continues a message "
                        "whose RETH DMA length was 0")
        is_write = p.kind != "READ"
        mr = None
        for r in self.regions:
            if r.r_key == qp.r_key:
                mr = r
        if mr is None or not (mr.remote_write if is_write else mr.remote_read):
            what = "no memory region has" if mr is None else "the region does not allow " \
                   f"remote {'WRITE' if is_write else 'READ'} with"
            raise _Drop(_ERR_RKEY, "rkey", f"{what} R_Key {qp.r_key:#x}")
        if not mr.contains(qp.va, qp.resid):
            raise _Drop(_ERR_RKEY, "out_of_region", f"{p.kind} [{qp.va:#x}, {qp.va + qp.resid:#x})"
                        f" is outside the memory region [{mr.va:#x}, {mr.va + mr.length:#x}) of "
                        f"R_Key {qp.r_key:#x}")
        qp.mr = mr
        if is_write:
            n, mtu, resid = len(p.payload), qp.pmtu, qp.resid
            done = qp.length - resid
            if p.end and n != resid:
                # rxe itself only checks this when resid <= PMTU; IBA C9-90 (and this model)
                # require the message to end exactly at the DMA length.
                raise _Drop(_ERR_LENGTH, "reth_length",
                            f"RETH DMA length {qp.length} != bytes delivered: the message ends "
                            f"with this {p.position} packet after {done + n} bytes")
            if resid > mtu:
                if n != mtu or p.pad:
                    raise _Drop(_ERR_LENGTH, "reth_length",
                                f"RETH DMA length {qp.length}: {resid} bytes remain after "
                                f"{done}, so this packet must carry PMTU {mtu} bytes without pad, "
                                f"it carries {n} (pad {p.pad}) as {p.position}")
            else:
                if n != resid:
                    raise _Drop(_ERR_LENGTH, "reth_length",
                                f"RETH DMA length {qp.length} != bytes delivered: {resid} bytes "
                                f"remain after {done}, but the {p.position} packet carries {n}")
                if p.pad != (-resid) & 3:
                    raise _Drop(_ERR_LENGTH, "bad_padcnt", f"PadCnt {p.pad} != {(-resid) & 3} "
                                f"for the last {resid} bytes of the WRITE")

    def _execute(self, qp, p, out):
        if p.kind.startswith("SEND"):
            if qp.wqe is None:   # cannot happen after the op-seq check; guard anyway
                raise _Drop(_ERR_MALFORMED_WQE, "internal", "SEND continuation without a WQE")
            if len(qp.wqe["data"]) + len(p.payload) > qp.wqe["size"]:
                raise _Drop(_ERR_LENGTH, "recv_overflow",
                            f"SEND of at least {len(qp.wqe['data']) + len(p.payload)} bytes "
                            f"exceeds the {qp.wqe['size']}-byte receive buffer")
            qp.wqe["data"] += p.payload
            if p.start:
                qp.first_psn = p.psn
        elif p.kind.startswith("WRITE"):
            if p.payload:
                off = qp.va - qp.mr.va
                qp.mr.data[off:off + len(p.payload)] = p.payload
            qp.va += len(p.payload)
            qp.resid -= len(p.payload)
        else:  # READ
            qp.msn = (qp.msn + 1) & proto.PSN_MASK
            self.counters["accepted"] += 1
            self._read_reply(qp, p, out, qp.mr, qp.msg_va, qp.length, p.psn, new=True)
            self.completions.append(Completion(
                "READ", qp.qpn, self.read_memory(qp.msg_va, qp.length) if qp.length else b"",
                qp.length, va=qp.msg_va, r_key=qp.r_key, first_psn=p.psn,
                last_psn=(qp.epsn - 1) & proto.PSN_MASK, msn=qp.msn))
            qp.opcode = -1
            qp.mr = None
            return
        self.counters["accepted"] += 1
        if p.end:
            qp.msn = (qp.msn + 1) & proto.PSN_MASK
        qp.epsn = (p.psn + 1) & proto.PSN_MASK
        qp.ack_psn = qp.epsn
        qp.opcode = p.opcode
        if p.end:
            self._complete(qp, p)
            if qp.transport == "RC" and not p.bth["ack_req"]:
                self.counters["end_without_ackreq"] += 1
        if qp.transport == "RC" and p.bth["ack_req"]:
            self._send_ack(qp, p, out, _SYN_ACK, p.psn)

    def _complete(self, qp, p):
        imm = p.ext["IMMDT"]["imm"] if "IMMDT" in p.ext else None
        solicited = bool(p.bth["se"])
        if p.kind.startswith("SEND"):
            data = bytes(qp.wqe["data"])
            c = Completion(p.kind, qp.qpn, data, len(data), imm=imm, solicited=solicited,
                           first_psn=qp.first_psn, last_psn=p.psn, msn=qp.msn)
        else:
            data = (bytes(qp.mr.data[qp.msg_va - qp.mr.va:qp.msg_va - qp.mr.va + qp.length])
                    if qp.length else b"")
            c = Completion(p.kind, qp.qpn, data, qp.length, va=qp.msg_va, r_key=qp.r_key,
                           imm=imm, solicited=solicited, first_psn=qp.first_psn, last_psn=p.psn,
                           msn=qp.msn)
        if p.low in _COMP and qp.wqe is not None:
            qp.recv.popleft()
        qp.wqe = None
        qp.mr = None
        self.completions.append(c)

    def _read_reply(self, qp, p, out, mr, va, length, psn, *, new):
        """Send READ responses for ``length`` bytes at ``va`` from ``mr``, starting at ``psn``
        (rxe read_reply). ``new``: the first response is ONLY/FIRST, else MIDDLE/LAST (replay
        from the middle). Moves ePSN past the last response if that is ahead of it."""
        mtu = qp.pmtu
        if new:
            npkts = max(1, -(-length // mtu))
            qp.reads.append({"first_psn": psn, "last_psn": (psn + npkts - 1) & proto.PSN_MASK,
                             "va": va, "length": length, "r_key": qp.r_key})
            del qp.reads[:-16]
        resid, cur, first = length, psn, new
        while True:
            n = min(resid, mtu)
            if first:
                op = _OP_READ_ONLY if resid <= mtu else _OP_READ_FIRST
            else:
                op = _OP_READ_MIDDLE if resid > mtu else _OP_READ_LAST
            first = False
            data = bytes(mr.data[va - mr.va:va - mr.va + n]) if n else b""
            syn = None if op == _OP_READ_MIDDLE else _SYN_ACK
            out.append(self._response(qp, p, op, cur, syndrome=syn, payload=data))
            self.counters["read_responses_sent"] += 1
            va += n
            resid -= n
            cur = (cur + 1) & proto.PSN_MASK
            if resid <= 0:
                break
        if _psn_diff(cur, qp.epsn) >= 0:
            qp.epsn = cur

    def _duplicate(self, qp, p, out):
        """rxe duplicate_request(): re-ACK SEND/WRITE with ePSN-1, replay READ responses."""
        if p.kind != "READ":
            self._send_ack(qp, p, out, _SYN_ACK, (qp.ack_psn - 1) & proto.PSN_MASK)
            return
        reth = p.ext["RETH"]
        for res in reversed(qp.reads):
            if (_psn_diff(p.psn, res["first_psn"]) >= 0
                    and _psn_diff(p.psn, res["last_psn"]) <= 0):
                va, n = reth["va"], reth["dma_length"]
                if (va < res["va"] or va + n > res["va"] + res["length"]
                        or reth["r_key"] != res["r_key"]):
                    break
                mr = next((r for r in self.regions if r.r_key == res["r_key"]), None)
                if n and (mr is None or not mr.contains(va, n)):
                    break
                self._read_reply(qp, p, out, mr, va, n, p.psn, new=p.psn == res["first_psn"])
                return
        self.counters["duplicates_dropped"] += 1

    def _error(self, qp, p, out, e):
        qpn, psn = qp.qpn, p.psn
        reason = f"{p.kind} {p.position}: {e.reason}"
        if e.state == _ERR_RNR:
            if qp.transport == "RC":
                self._violate(e.kind, reason + f"; RNR NAK (timer code {qp.min_rnr_timer})",
                              qpn=qpn, psn=psn, counter="rejected")
                self._send_ack(qp, p, out,
                               proto.aeth_syndrome(proto.AethType.RNR_NAK, qp.min_rnr_timer), psn)
                self.counters["rnr_naks_sent"] += 1
            else:
                qp.drop_msg = True
                self._violate(e.kind, reason + "; UC message dropped", qpn=qpn, psn=psn,
                              counter="rejected")
            qp.wqe = None if p.start else qp.wqe
            return
        if qp.transport == "UC":
            if e.state == _ERR_MISSING_LAST_D1E:
                qp.opcode = -1
                qp.wqe = None
                qp.mr = None
                self._violate(e.kind, reason + "; the unfinished UC message is abandoned and this "
                              "packet dropped", qpn=qpn, psn=psn, counter="rejected")
            else:
                qp.drop_msg = True
                self._violate(e.kind, reason + "; UC message dropped until the next FIRST/ONLY",
                              qpn=qpn, psn=psn, counter="rejected")
            return
        syn = {_ERR_RKEY: _SYN_NAK_ACC, _ERR_MALFORMED_WQE: _SYN_NAK_OP}.get(e.state,
                                                                            _SYN_NAK_INV)
        names = {_SYN_NAK_ACC: "remote access error", _SYN_NAK_INV: "invalid request",
                 _SYN_NAK_OP: "remote operational error"}
        self._violate(e.kind, reason + f"; NAK {names[syn]} ({syn:#04x}) and the QP goes to the "
                      "error state", qpn=qpn, psn=psn, counter="rejected")
        self._send_ack(qp, p, out, syn, psn)
        qp.error = f"{e.kind} at PSN {psn}"

    # --- response frames --------------------------------------------------------------------

    def _send_ack(self, qp, p, out, syndrome, psn):
        kind = proto.aeth_decode(syndrome)[0]
        if kind == proto.AethType.ACK:
            self.counters["acks_sent"] += 1
        else:
            self.counters["naks_sent"] += 1
        out.append(self._response(qp, p, _OP_ACK, psn, syndrome=syndrome))

    def _response(self, qp, p, opcode, psn, *, syndrome=None, payload=b""):
        """A response frame to packet ``p``: addresses swapped, BTH to ``qp.remote_qpn``."""
        opcode |= 0 if qp.transport == "RC" else 0x20
        pad = (-len(payload)) & 3
        ib = proto.BTH.pack(opcode=opcode, pad_cnt=pad, p_key=0xFFFF, dest_qp=qp.remote_qpn,
                            psn=psn)
        if syndrome is not None:
            ib += proto.AETH.pack(syndrome=syndrome, msn=qp.msn)
        ib += payload + bytes(pad)
        sport = p.udp_sport if qp.udp_sport is None else qp.udp_sport
        udp = proto.UDP.pack(src_port=sport, dst_port=proto.ROCEV2_UDP_PORT,
                             length=proto.UDP.size + len(ib) + proto.ICRC_BYTES)
        if p.ip_version == 4:
            hdr = bytearray(proto.IPV4.pack(
                total_length=proto.IPV4.size + len(udp) + len(ib) + proto.ICRC_BYTES,
                identification=self._ip_id, src=int.from_bytes(p.dst_ip, "big"),
                dst=int.from_bytes(p.src_ip, "big")))
            self._ip_id = (self._ip_id + 1) & 0xFFFF
            hdr[10:12] = struct.pack("!H", _ipv4_checksum(hdr))
            ethertype = proto.ETHERTYPE_IPV4
        else:
            hdr = proto.IPV6.pack(payload_length=len(udp) + len(ib) + proto.ICRC_BYTES,
                                  src=int.from_bytes(p.dst_ip, "big"),
                                  dst=int.from_bytes(p.src_ip, "big"))
            ethertype = proto.ETHERTYPE_IPV6
        l3 = bytes(hdr) + udp + ib
        eth = proto.ETH.pack(dst=int.from_bytes(p.src_mac, "big"),
                             src=int.from_bytes(p.dst_mac, "big"), ethertype=ethertype)
        eth = eth[:12] + p.vlan + eth[12:]
        return eth + l3 + icrc_bytes(l3)


def deliver(frames, peer, *, strict=False):
    """Feed ``frames`` (e.g. the TX engine's output, in wire order) to ``peer`` and return the
    messages completed meanwhile (list of :class:`Completion`). The responses stay in
    ``peer.sent``. With ``strict=True``, raise ``AssertionError`` listing every fatal violation
    those frames caused."""
    n_comp, n_viol = len(peer.completions), len(peer.violations)
    for f in frames:
        peer.receive(f)
    if strict:
        bad = [v for v in peer.violations[n_viol:] if v.fatal]
        if bad:
            raise AssertionError("responder rejected frames:\n" + "\n".join(map(str, bad)))
    return peer.completions[n_comp:]
