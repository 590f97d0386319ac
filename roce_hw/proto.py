# SPDX-License-Identifier: BSD-2-Clause
"""The one RoCEv2 protocol definition: header field lists in wire order, opcodes, syndromes, tables.

This module is pure Python (no Amaranth import) so that the golden models in :mod:`roce_hw.model`
can use it without depending on the hardware. The hardware builds its ``data.StructLayout``\\ s from
the very same field lists (:mod:`roce_hw.layouts`), so hardware, models and tests share one
declaration of every header.

Field lists are in **wire order**: the first field is the most significant bits of the first byte
on the wire; within a byte the first field listed takes the most significant bits (IBTA / RFC
bit-numbering, "bit 7 = MSB"). All multi-byte fields are big-endian (network byte order).

Sources for every value are in ``../shared/PROTOCOL.md`` (Linux ``rxe``, ``ib_pack.h``, Wireshark,
scapy ``contrib.roce``; IBTA Vol. 1 Annex 17 for RoCEv2).
"""

import enum

__all__ = [
    "Header",
    "ETH", "VLAN_TAG", "split_l2", "IPV4", "IPV6", "UDP", "BTH", "RETH", "AETH", "IMMDT", "IETH",
    "DETH",
    "CNP_PAD", "CM_DATAGRAM", "ARP", "ARP_PAD", "ArpOper",
    "Opcode", "Transport", "OPCODE_HEADERS", "opcode_headers",
    "AethType", "NakCode", "AETH_ACK_UNLIMITED", "CREDIT_TABLE", "RNR_TIMER_US",
    "TIMER_TICK_NS",
    "aeth_syndrome", "aeth_decode",
    "Pmtu", "PMTU_BYTES", "pmtu_bytes", "pmtu_code",
    "QPState", "QP_CONTEXT_FIELDS", "ACK_COUNTERS", "AckKind", "TimerKind", "WcStatus", "WcOpcode", "WrOpcode", "WR_OPCODE_SEQUENCE",
    "CmReq", "CmAck",
    "ROCEV2_UDP_PORT", "CM_UDP_PORT", "CM_REPLY_UDP_PORT", "ETHERTYPE_IPV4", "ETHERTYPE_IPV6",
    "ETHERTYPE_VLAN", "ETHERTYPE_ARP", "IP_PROTO_UDP", "PSN_BITS", "PSN_MASK", "QPN_MASK", "GSI_QKEY",
    "ICRC_BYTES", "ICRC_MASKED_FIELDS", "CM_DATAGRAM_BYTES", "LOCAL_QPN_BASE",
    "ETH_PREAMBLE_BYTE", "ETH_PREAMBLE_BYTES", "ETH_SFD", "ETH_FCS_BYTES", "ETH_IFG_BYTES",
    "MAC_TX_COUNTERS", "MAC_RX_COUNTERS",
]


class Header:
    """A protocol header: named bit fields in wire order.

    Parameters
    ----------
    name : str
        Header name, e.g. ``"BTH"``.
    fields : list of (str, int)
        ``(field name, width in bits)`` in wire order (MSB of the first byte first). The total
        must be a whole number of bytes.
    defaults : dict, optional
        Values used by :meth:`pack` for fields that are not given (everything else defaults to 0).

    Attributes
    ----------
    size : int
        Size in bytes.
    bits : int
        Size in bits.
    fields : tuple of (str, int)
    """

    def __init__(self, name, fields, defaults=None):
        self.name = name
        self.fields = tuple((str(n), int(w)) for n, w in fields)
        self.bits = sum(w for _, w in self.fields)
        if self.bits % 8:
            raise ValueError(f"{name}: {self.bits} bits is not a whole number of bytes")
        names = [n for n, _ in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"{name}: duplicate field names")
        self.size = self.bits // 8
        self.defaults = dict(defaults or {})
        for key in self.defaults:
            if key not in names:
                raise ValueError(f"{name}: default for unknown field {key!r}")
        self._widths = dict(self.fields)
        self._shift = {}
        pos = self.bits
        for n, w in self.fields:
            pos -= w
            self._shift[n] = pos     # LSB position of the field in the big-endian integer

    def __repr__(self):
        return f"Header({self.name!r}, {self.size} bytes)"

    def __contains__(self, field):
        return field in self._widths

    def width(self, field):
        """Width of ``field`` in bits."""
        return self._widths[field]

    def offset(self, field):
        """``(byte offset, bit offset within that byte counted from the MSB)`` of a field's first bit."""
        first = self.bits - self._shift[field] - self._widths[field]
        return first // 8, first % 8

    def byte_span(self, field):
        """``range`` of the byte offsets a field occupies."""
        first = self.bits - self._shift[field] - self._widths[field]
        last = self.bits - self._shift[field] - 1
        return range(first // 8, last // 8 + 1)

    def lsb(self, field):
        """Position of a field's least significant bit in the header read as a big-endian integer.

        This is also the field's offset in an Amaranth ``StructLayout`` built from this header
        (see :func:`roce_hw.layouts.network_struct`).
        """
        return self._shift[field]

    def mask(self, fields):
        """Wire bytes of the header with the bits of ``fields`` set and every other bit 0."""
        word = 0
        for field in fields:
            word |= ((1 << self._widths[field]) - 1) << self._shift[field]
        return word.to_bytes(self.size, "big")

    def pack_int(self, values=None, **kwargs):
        """The header as a big-endian integer; unknown fields or out-of-range values raise."""
        v = dict(self.defaults)
        v.update(values or {})
        v.update(kwargs)
        word = 0
        for key, val in v.items():
            if key not in self._widths:
                raise KeyError(f"{self.name} has no field {key!r}")
            val = int(val)
            w = self._widths[key]
            if not 0 <= val < (1 << w):
                raise ValueError(f"{self.name}.{key} = {val:#x} does not fit in {w} bits")
            word |= val << self._shift[key]
        return word

    def pack(self, values=None, **kwargs):
        """Wire bytes of the header."""
        return self.pack_int(values, **kwargs).to_bytes(self.size, "big")

    def unpack(self, buf, offset=0):
        """Decode ``self.size`` bytes of ``buf`` at ``offset`` into a ``dict`` of field values."""
        chunk = bytes(buf[offset:offset + self.size])
        if len(chunk) != self.size:
            raise ValueError(f"{self.name}: need {self.size} bytes at offset {offset}, "
                             f"have {len(chunk)}")
        word = int.from_bytes(chunk, "big")
        return {n: (word >> self._shift[n]) & ((1 << w) - 1) for n, w in self.fields}


# --- Layer 2/3/4 -------------------------------------------------------------------------------

ETHERTYPE_IPV4 = 0x0800
ETHERTYPE_IPV6 = 0x86DD
ETHERTYPE_VLAN = 0x8100
ETHERTYPE_ARP = 0x0806
IP_PROTO_UDP = 17
ROCEV2_UDP_PORT = 4791          #: IANA RoCEv2 port
CM_UDP_PORT = 0x4321            #: the UDP connection manager of PROTOCOL.md §7
CM_REPLY_UDP_PORT = 0x4322      #: where the reference host tools listen for CM replies

#: Ethernet II header (14 bytes). An 802.1Q tag, when present, sits between ``src`` and
#: ``ethertype`` (see :data:`VLAN_TAG`).
ETH = Header("ETH", [("dst", 48), ("src", 48), ("ethertype", 16)],
             defaults={"ethertype": ETHERTYPE_IPV4})

class ArpOper(enum.IntEnum):
    """ARP ``oper`` (RFC 826)."""
    REQUEST = 1
    REPLY = 2


#: ARP for IPv4 over Ethernet (RFC 826), 28 bytes after the Ethernet header.
ARP = Header("ARP", [
    ("htype", 16), ("ptype", 16), ("hlen", 8), ("plen", 8), ("oper", 16),
    ("sha", 48), ("spa", 32), ("tha", 48), ("tpa", 32),
], defaults={"htype": 1, "ptype": ETHERTYPE_IPV4, "hlen": 6, "plen": 4})

#: The fields of ARP for IPv4 over Ethernet (RFC 826): hardware type 1 (Ethernet), protocol
#: IPv4, 6-byte and 4-byte addresses. The RX front end takes only requests with these.
ARP_FIXED = {"htype": 1, "ptype": ETHERTYPE_IPV4, "hlen": 6, "plen": 4}

#: Zero padding that brings an Ethernet + ARP frame (42 bytes) to the 60-byte minimum (the MAC
#: adds the 4-byte FCS).
ARP_PAD = Header("ARP_PAD", [("reserved", 18 * 8)])

#: IEEE 802.1Q tag (4 bytes) as it appears after the source MAC: TPID, PCP, DEI, VID.
VLAN_TAG = Header("VLAN_TAG", [("tpid", 16), ("pcp", 3), ("dei", 1), ("vid", 12)],
                  defaults={"tpid": ETHERTYPE_VLAN})


def split_l2(frame):
    """``(ethertype, tag, l3_offset)`` of an Ethernet ``frame`` with at most one 802.1Q tag:
    the ethertype after the tag, the tag's fields without ``tpid`` (``None`` untagged), and
    the offset of the L3 header. Raises ``ValueError`` if the frame ends inside the Ethernet
    header or the tag."""
    if len(frame) < ETH.size:
        raise ValueError(f"frame of {len(frame)} bytes is shorter than an Ethernet header")
    # a tag's TPID sits where the ethertype would be; the real ethertype follows the tag
    at = ETH.offset("ethertype")[0]
    nbytes = ETH.width("ethertype") // 8
    ethertype = int.from_bytes(frame[at:at + nbytes], "big")
    if ethertype != ETHERTYPE_VLAN:
        return ethertype, None, ETH.size
    if len(frame) < ETH.size + VLAN_TAG.size:
        raise ValueError(f"frame of {len(frame)} bytes is truncated inside the 802.1Q tag")
    tag = VLAN_TAG.unpack(frame, at)
    del tag["tpid"]
    at += VLAN_TAG.size
    return int.from_bytes(frame[at:at + nbytes], "big"), tag, at + nbytes

#: IPv4 header without options (RFC 791), 20 bytes. RoCEv2 senders set DF and never fragment.
IPV4 = Header("IPV4", [
    ("version", 4), ("ihl", 4), ("dscp", 6), ("ecn", 2), ("total_length", 16),
    ("identification", 16), ("flag_rsv", 1), ("flag_df", 1), ("flag_mf", 1), ("frag_offset", 13),
    ("ttl", 8), ("protocol", 8), ("checksum", 16),
    ("src", 32), ("dst", 32),
], defaults={"version": 4, "ihl": 5, "flag_df": 1, "ttl": 64, "protocol": IP_PROTO_UDP})

#: The fields every IPv4 header the engine sends has (and the RX front end requires of a frame
#: it takes): version 4, no options, DF set, not a fragment. Protocol, TTL, lengths, checksum and
#: addresses vary.
IPV4_FIXED = {"version": 4, "ihl": IPV4.size // 4, "flag_rsv": 0, "flag_df": 1, "flag_mf": 0,
              "frag_offset": 0}

#: IPv6 fixed header (RFC 8200), 40 bytes.
IPV6 = Header("IPV6", [
    ("version", 4), ("traffic_class", 8), ("flow_label", 20),
    ("payload_length", 16), ("next_header", 8), ("hop_limit", 8),
    ("src", 128), ("dst", 128),
], defaults={"version": 6, "next_header": IP_PROTO_UDP, "hop_limit": 64})

#: UDP header (RFC 768), 8 bytes. RoCEv2 senders put 0 in the checksum.
UDP = Header("UDP", [("src_port", 16), ("dst_port", 16), ("length", 16), ("checksum", 16)],
             defaults={"dst_port": ROCEV2_UDP_PORT})

# --- InfiniBand transport headers (IBTA Vol. 1 §9.2-9.3; rxe_hdr.h) --------------------------

#: Base Transport Header, 12 bytes (PROTOCOL.md §5.2). ``fecn``/``becn``/``resv6`` form the
#: iCRC-masked byte 4 ("Resv8a").
BTH = Header("BTH", [
    ("opcode", 8), ("se", 1), ("migreq", 1), ("pad_cnt", 2), ("tver", 4), ("p_key", 16),
    ("fecn", 1), ("becn", 1), ("resv6", 6), ("dest_qp", 24),
    ("ack_req", 1), ("resv7", 7), ("psn", 24),
], defaults={"p_key": 0xFFFF})

#: RDMA Extended Transport Header, 16 bytes: VA, R_Key, DMA length of the whole message.
RETH = Header("RETH", [("va", 64), ("r_key", 32), ("dma_length", 32)])

#: ACK Extended Transport Header, 4 bytes: syndrome (bit 7 reserved, 6:5 type, 4:0 value) and MSN.
AETH = Header("AETH", [("syndrome", 8), ("msn", 24)])

#: Immediate data, 4 bytes, opaque (copied as a big-endian 32-bit word).
IMMDT = Header("IMMDT", [("imm", 32)])

#: Invalidate Extended Transport Header, 4 bytes.
IETH = Header("IETH", [("r_key", 32)])

#: Datagram Extended Transport Header, 8 bytes (UD).
DETH = Header("DETH", [("q_key", 32), ("resv", 8), ("src_qp", 24)])

#: The 16 reserved zero bytes that follow the BTH of a RoCEv2 CNP (PROTOCOL.md §5.11).
CNP_PAD = Header("CNP_PAD", [("reserved", 128)])

#: The 64-byte UDP connection-manager datagram of 100G-verilog-RoCEv2-lite (PROTOCOL.md §7).
#: Byte 0 is ``ack_type[7:5] ack_valid[4] req_type[3:1] valid[0]``; byte 51 is
#: ``resv[7:4] tx_type[3] tx_immediate[2] tx_start[1] tx_valid[0]``.
CM_DATAGRAM = Header("CM_DATAGRAM", [
    ("ack_type", 3), ("ack_valid", 1), ("req_type", 3), ("valid", 1),
    ("loc_qpn", 32), ("loc_psn", 32), ("loc_r_key", 32), ("loc_base_addr", 64), ("loc_ip", 32),
    ("rem_qpn", 32), ("rem_psn", 32), ("rem_r_key", 32), ("rem_base_addr", 64), ("rem_ip", 32),
    ("reply_port", 16),
    ("tx_resv", 4), ("tx_type", 1), ("tx_immediate", 1), ("tx_start", 1), ("tx_valid", 1),
    ("tx_dma_length", 32), ("tx_n_transfers", 32), ("tx_period", 32),
])
CM_DATAGRAM_BYTES = 64

ICRC_BYTES = 4
#: The iCRC-variant fields of each header the iCRC covers, taken as all 1s (PROTOCOL.md §2),
#: by header name.
ICRC_MASKED_FIELDS = {"IPV4": ("dscp", "ecn", "ttl", "checksum"),
                      "IPV6": ("traffic_class", "flow_label", "hop_limit"),
                      "UDP": ("checksum",), "BTH": ("fecn", "becn", "resv6")}
PSN_BITS = 24                   #: BTH PSN width; every PSN field and counter has it
PSN_MASK = (1 << PSN_BITS) - 1
QPN_BITS = 24                   #: BTH destination QP width
#: Largest message a work request may carry, in bytes (IBTA: 2**31).
MAX_MESSAGE_BYTES = 1 << 31
QPN_MASK = 0xFFFFFF
GSI_QKEY = 0x80010000           #: Q_Key of QP1 (GSI) MADs
LOCAL_QPN_BASE = 256            #: local QPN = 256 + QP index, as in the reference design


# --- Opcodes (IBTA Vol. 1 Table 38; ib_pack.h) ---------------------------------------------

class Transport(enum.IntEnum):
    """BTH opcode bits [7:5]."""
    RC = 0x00   #: reliable connection
    UC = 0x20   #: unreliable connection
    RD = 0x40   #: reliable datagram
    UD = 0x60   #: unreliable datagram
    CNP = 0x80  #: RoCEv2 congestion notification
    XRC = 0xA0  #: extended reliable connection


class Opcode(enum.IntEnum):
    """Every RC, UC and UD opcode and the RoCEv2 CNP (8 bits, the BTH ``opcode`` field)."""
    RC_SEND_FIRST = 0x00
    RC_SEND_MIDDLE = 0x01
    RC_SEND_LAST = 0x02
    RC_SEND_LAST_WITH_IMMEDIATE = 0x03
    RC_SEND_ONLY = 0x04
    RC_SEND_ONLY_WITH_IMMEDIATE = 0x05
    RC_RDMA_WRITE_FIRST = 0x06
    RC_RDMA_WRITE_MIDDLE = 0x07
    RC_RDMA_WRITE_LAST = 0x08
    RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09
    RC_RDMA_WRITE_ONLY = 0x0A
    RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0B
    RC_RDMA_READ_REQUEST = 0x0C
    RC_RDMA_READ_RESPONSE_FIRST = 0x0D
    RC_RDMA_READ_RESPONSE_MIDDLE = 0x0E
    RC_RDMA_READ_RESPONSE_LAST = 0x0F
    RC_RDMA_READ_RESPONSE_ONLY = 0x10
    RC_ACKNOWLEDGE = 0x11
    RC_ATOMIC_ACKNOWLEDGE = 0x12
    RC_COMPARE_SWAP = 0x13
    RC_FETCH_ADD = 0x14
    RC_SEND_LAST_WITH_INVALIDATE = 0x16
    RC_SEND_ONLY_WITH_INVALIDATE = 0x17
    RC_FLUSH = 0x1C
    RC_ATOMIC_WRITE = 0x1D

    UC_SEND_FIRST = 0x20
    UC_SEND_MIDDLE = 0x21
    UC_SEND_LAST = 0x22
    UC_SEND_LAST_WITH_IMMEDIATE = 0x23
    UC_SEND_ONLY = 0x24
    UC_SEND_ONLY_WITH_IMMEDIATE = 0x25
    UC_RDMA_WRITE_FIRST = 0x26
    UC_RDMA_WRITE_MIDDLE = 0x27
    UC_RDMA_WRITE_LAST = 0x28
    UC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x29
    UC_RDMA_WRITE_ONLY = 0x2A
    UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x2B

    UD_SEND_ONLY = 0x64
    UD_SEND_ONLY_WITH_IMMEDIATE = 0x65

    CNP = 0x81  #: RoCEv2 CNP as it appears on the wire (ib_pack.h IB_OPCODE_CNP = 0x80 base)

    @property
    def transport(self):
        return Transport(self & 0xE0)

    @property
    def short_name(self):
        """Name without the transport prefix, e.g. ``RDMA_WRITE_FIRST``."""
        return self.name.split("_", 1)[1] if self.name != "CNP" else "CNP"


_RC_EXT = {
    0x00: (), 0x01: (), 0x02: (), 0x03: ("IMMDT",), 0x04: (), 0x05: ("IMMDT",),
    0x06: ("RETH",), 0x07: (), 0x08: (), 0x09: ("IMMDT",), 0x0A: ("RETH",),
    0x0B: ("RETH", "IMMDT"),
    0x0C: ("RETH",), 0x0D: ("AETH",), 0x0E: (), 0x0F: ("AETH",), 0x10: ("AETH",),
    0x11: ("AETH",), 0x12: ("AETH", "ATOMICACKETH"), 0x13: ("ATOMICETH",),
    0x14: ("ATOMICETH",), 0x16: ("IETH",), 0x17: ("IETH",), 0x1C: ("FETH", "RETH"),
    0x1D: ("RETH",),
}

_EXTRA_HEADERS = {
    "ATOMICETH": Header("ATOMICETH", [("va", 64), ("r_key", 32), ("swap_add", 64), ("compare", 64)]),
    "ATOMICACKETH": Header("ATOMICACKETH", [("orig", 64)]),
    "FETH": Header("FETH", [("resv", 26), ("sel", 2), ("plt", 4)]),
}

_BY_NAME = {"RETH": RETH, "AETH": AETH, "IMMDT": IMMDT, "IETH": IETH, "DETH": DETH,
            "CNP_PAD": CNP_PAD, **_EXTRA_HEADERS}


def _build_opcode_headers():
    table = {}
    for op in Opcode:
        low = op & 0x1F
        if op.transport in (Transport.RC, Transport.UC):
            names = _RC_EXT[low]
        elif op == Opcode.UD_SEND_ONLY:
            names = ("DETH",)
        elif op == Opcode.UD_SEND_ONLY_WITH_IMMEDIATE:
            names = ("DETH", "IMMDT")
        elif op == Opcode.CNP:
            names = ("CNP_PAD",)
        else:  # pragma: no cover - every enum member is covered above
            raise AssertionError(op)
        table[op] = tuple(_BY_NAME[n] for n in names)
    return table


#: ``Opcode -> tuple of Header`` of the extension headers that follow the BTH, in wire order
#: (PROTOCOL.md §5.3-5.4: BTH, [DETH], [RETH | AtomicETH], [ImmDt | IETH], [AETH], ...).
OPCODE_HEADERS = _build_opcode_headers()


def opcode_headers(opcode):
    """Extension headers after the BTH for ``opcode`` (an :class:`Opcode` or int); raises
    ``ValueError`` for a reserved/unknown opcode."""
    try:
        return OPCODE_HEADERS[Opcode(opcode)]
    except ValueError:
        raise ValueError(f"unknown or reserved BTH opcode {int(opcode):#04x}") from None


# --- AETH syndromes (PROTOCOL.md §5.5) ---------------------------------------------------------

class AethType(enum.IntEnum):
    """AETH syndrome bits [6:5]."""
    ACK = 0        #: ACK; bits [4:0] are the credit code
    RNR_NAK = 1    #: receiver not ready; bits [4:0] are the RNR timer code
    RESERVED = 2
    NAK = 3        #: NAK; bits [4:0] are a :class:`NakCode`


class NakCode(enum.IntEnum):
    PSN_SEQUENCE_ERROR = 0          #: syndrome 0x60
    INVALID_REQUEST = 1             #: syndrome 0x61
    REMOTE_ACCESS_ERROR = 2         #: syndrome 0x62
    REMOTE_OPERATIONAL_ERROR = 3    #: syndrome 0x63
    INVALID_RD_REQUEST = 4          #: syndrome 0x64


AETH_ACK_UNLIMITED = 0x1F   #: ACK credit code 31: no end-to-end credits (rxe always sends it)

#: ACK credit code (0-30) -> number of credits (rdmavt rc.c ``credit_table``).
CREDIT_TABLE = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768,
                1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768)

#: RNR NAK timer code (0-31) -> minimum delay in microseconds (IBTA Table 45; tshark's
#: value strings; rxe's ``rnrnak_usec`` has a typo for code 25).
RNR_TIMER_US = (655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
                2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880,
                163840, 245760, 327680, 491520)

#: The time unit of the local ACK timeout in nanoseconds: ``ibv_qp_attr.timeout`` t means
#: 4.096 us * 2**t (t = 0: no timer); PROTOCOL.md §5.10.
TIMER_TICK_NS = 4096


def aeth_syndrome(kind, code):
    """Syndrome byte from an :class:`AethType` and its 5-bit code."""
    kind = AethType(kind)
    if not 0 <= int(code) < 32:
        raise ValueError(f"AETH code {code} does not fit in 5 bits")
    return (int(kind) << 5) | int(code)


def aeth_decode(syndrome):
    """``(AethType, code)`` of a syndrome byte; bit 7 is reserved and ignored."""
    return AethType((syndrome >> 5) & 3), syndrome & 0x1F


# --- Path MTU --------------------------------------------------------------------------------

class Pmtu(enum.IntEnum):
    """``enum ib_mtu``: the path MTU code (payload bytes per packet)."""
    MTU_256 = 1
    MTU_512 = 2
    MTU_1024 = 3
    MTU_2048 = 4
    MTU_4096 = 5


PMTU_BYTES = {Pmtu.MTU_256: 256, Pmtu.MTU_512: 512, Pmtu.MTU_1024: 1024,
              Pmtu.MTU_2048: 2048, Pmtu.MTU_4096: 4096}


#: The largest path MTU, in bytes (code 5).
MAX_PMTU_BYTES = max(PMTU_BYTES.values())


def pmtu_shift(code):
    """log2 of the payload bytes of PMTU code ``code`` (1..5 -> 8..12): hardware cuts and counts
    packets with shifts of this."""
    return pmtu_bytes(code).bit_length() - 1


def pmtu_bytes(code):
    """Payload bytes for a PMTU code (1-5)."""
    try:
        return PMTU_BYTES[Pmtu(code)]
    except ValueError:
        raise ValueError(f"PMTU code {code!r} is not one of 1..5 (256..4096 bytes)") from None


def pmtu_code(nbytes):
    """PMTU code for 256, 512, 1024, 2048 or 4096 bytes."""
    for code, n in PMTU_BYTES.items():
        if n == nbytes:
            return code
    raise ValueError(f"PMTU of {nbytes} bytes is not one of 256, 512, 1024, 2048, 4096")


# --- Verbs-level enumerations ----------------------------------------------------------------

class QPState(enum.IntEnum):
    """``enum ibv_qp_state`` values (libibverbs)."""
    RESET = 0
    INIT = 1
    RTR = 2
    RTS = 3
    SQD = 4
    SQE = 5
    ERROR = 6


#: The QP context of the engine's QP table, ``(field, width in bits)``: declared once, used by the
#: hardware (:data:`roce_hw.layouts.QP_CONTEXT`), the models and the tools. ``state`` holds
#: :class:`QPState` values, ``pmtu`` a :class:`Pmtu` code (1..5); ``next_psn`` is the PSN of the
#: next packet to send, ``una_psn`` the oldest unacknowledged PSN; ``remote_va``/``r_key``
#: describe the peer's buffer; ``retry_cnt``, ``rnr_retry``, ``timeout`` (``ibv_qp_attr.timeout``
#: exponent) and ``min_rnr_timer`` are for the retransmission of a later issue; ``rq_psn`` is the
#: peer's start PSN (from the connection manager's OPEN_QP; for a responder side, unused by TX).
#: MACs and IPs are plain integers (0x0200_0000_0001 is the wire MAC 02:00:00:00:00:01).
QP_CONTEXT_FIELDS = (
    ("state", 3), ("remote_qpn", 24), ("remote_mac", 48), ("remote_ip", 32), ("udp_sport", 16),
    ("dscp", 6), ("ecn", 2), ("p_key", 16), ("migreq", 1), ("pmtu", 3), ("next_psn", 24),
    ("una_psn", 24), ("remote_va", 64), ("r_key", 32), ("retry_cnt", 3), ("rnr_retry", 3),
    ("timeout", 5), ("min_rnr_timer", 5), ("rq_psn", 24),
)


class WcStatus(enum.IntEnum):
    """Status codes of the ``status`` stream, numbered as libibverbs ``enum ibv_wc_status``."""
    SUCCESS = 0
    LOC_LEN_ERR = 1        #: payload length disagrees with ``length``, or ``length`` > 2**31
    LOC_QP_OP_ERR = 2      #: QP not in RTS, QP index >= n_qp, bad PMTU code, unsupported opcode
    LOC_EEC_OP_ERR = 3
    LOC_PROT_ERR = 4
    WR_FLUSH_ERR = 5
    MW_BIND_ERR = 6
    BAD_RESP_ERR = 7
    LOC_ACCESS_ERR = 8
    REM_INV_REQ_ERR = 9
    REM_ACCESS_ERR = 10
    REM_OP_ERR = 11
    RETRY_EXC_ERR = 12
    RNR_RETRY_EXC_ERR = 13
    LOC_RDD_VIOL_ERR = 14
    REM_INV_RD_REQ_ERR = 15
    REM_ABORT_ERR = 16
    INV_EECN_ERR = 17
    INV_EEC_STATE_ERR = 18
    FATAL_ERR = 19
    RESP_TIMEOUT_ERR = 20
    GENERAL_ERR = 21


class WcOpcode(enum.IntEnum):
    """``enum ibv_wc_opcode`` values (libibverbs ``verbs.h``) of the completions this engine can
    make: a receive completion has bit 7 set (``opcode & RECV``)."""
    SEND = 0
    RDMA_WRITE = 1
    RDMA_READ = 2
    RECV = 128
    RECV_RDMA_WITH_IMM = 129


class WrOpcode(enum.IntEnum):
    """``enum ibv_wr_opcode`` values (libibverbs) for the operations a work request can ask for."""
    RDMA_WRITE = 0
    RDMA_WRITE_WITH_IMM = 1
    SEND = 2
    SEND_WITH_IMM = 3
    RDMA_READ = 4


#: ``WrOpcode -> (FIRST, MIDDLE, LAST, ONLY)``: the low 5 bits of the BTH opcodes of a message of
#: that operation (IBTA Table 38; OR the :class:`Transport` for the full opcode). The requester
#: sends ONLY for a one-packet message, else FIRST, MIDDLE..., LAST (rxe ``next_opcode_rc``).
WR_OPCODE_SEQUENCE = {
    WrOpcode.SEND: (0x00, 0x01, 0x02, 0x04),
    WrOpcode.SEND_WITH_IMM: (0x00, 0x01, 0x03, 0x05),
    WrOpcode.RDMA_WRITE: (0x06, 0x07, 0x08, 0x0A),
    WrOpcode.RDMA_WRITE_WITH_IMM: (0x06, 0x07, 0x09, 0x0B),
}


# --- UDP connection manager (PROTOCOL.md §7) -------------------------------------------------

class CmReq(enum.IntEnum):
    """``req_type`` of the CM datagram."""
    NULL = 0
    OPEN_QP = 1
    SEND_QP_INFO = 2
    MODIFY_QP_RTS = 3
    CLOSE_QP = 4
    FETCH_QP_INFO = 5
    ERROR = 7


class CmAck(enum.IntEnum):
    """``ack_type`` of the CM datagram."""
    NULL = 0
    ACK = 1
    NO_QP = 2
    NAK = 3
    ERROR = 7


#: The sender's (``loc_*``) and the peer's (``rem_*``) fields of a CM datagram, in the same
#: order: :func:`cm_swap` exchanges them pairwise.
CM_LOC_FIELDS = ("loc_qpn", "loc_psn", "loc_r_key", "loc_base_addr", "loc_ip")
CM_REM_FIELDS = ("rem_qpn", "rem_psn", "rem_r_key", "rem_base_addr", "rem_ip")


def cm_swap(fields):
    """A CM datagram's ``fields`` (a ``dict``) with loc_* and rem_* exchanged: what a reply
    starts from."""
    out = dict(fields)
    for loc, rem in zip(CM_LOC_FIELDS, CM_REM_FIELDS):
        out[loc], out[rem] = fields[rem], fields[loc]
    return out


#: The connection manager's counters (hardware :class:`roce_hw.ctrl.cm.CmResponder`, model
#: :class:`roce_hw.model.cm.CmModel`, whose docstring has the rule behind each): ``ok`` counts
#: requests obeyed, the others one reason of refusal or drop each, in the order of the rules.
CM_COUNTERS = ("ok", "bad_checksum", "bad_port", "bad_flags", "bad_txmeta", "ignored",
               "bad_field", "bad_req", "bad_qpn", "in_use", "bad_state", "not_owner", "no_qp",
               "busy")

#: The UDP source port of the RoCEv2 packets of a QP the connection manager opens:
#: ``CM_UDP_SPORT_BASE | (QPN & (2**CM_UDP_SPORT_QPN_BITS - 1))``, in the dynamic port range
#: of RFC 6335 (0xC000 up).
CM_UDP_SPORT_BASE = 0xC000
CM_UDP_SPORT_QPN_BITS = 14

#: The row fields an obeyed OPEN_QP writes with the same value every time (the others come from
#: the request, the QP number and the configuration: :class:`roce_hw.model.cm.CmModel`).
#: ``retry_cnt``/``rnr_retry`` 7 (the most; 7 is "infinite" for RNR), ``timeout`` 14
#: (4.096 us * 2**14 = 67 ms), ``min_rnr_timer`` 12 (:data:`RNR_TIMER_US`: 640 us).
CM_OPEN_ROW = {"dscp": 0, "ecn": 0, "p_key": 0xFFFF, "migreq": 1, "retry_cnt": 7,
               "rnr_retry": 7, "timeout": 14, "min_rnr_timer": 12}


def cm_udp_sport(qpn):
    """The UDP source port of a QP the connection manager opens (:data:`CM_UDP_SPORT_BASE`)."""
    return CM_UDP_SPORT_BASE | (qpn & ((1 << CM_UDP_SPORT_QPN_BITS) - 1))


def generator_payload(n, length):
    """Payload of the traffic generator's message ``n`` (what the host checks): ``length``
    bytes, byte ``k`` = ``(k + n) & 0xFF``."""
    pattern = bytes((k + n) & 0xFF for k in range(256))
    reps, rest = divmod(length, 256)
    return pattern * reps + pattern[:rest]


# --- The RX front end's outcomes -------------------------------------------------------------

#: The RX front end's counters (hardware :class:`roce_hw.rx.frontend.RxFrontEnd`, model
#: :mod:`roce_hw.model.rx`): every frame is counted in ``rx_frames`` and in exactly one of the
#: others. ``arp``/``cm``/``roce``: taken into that stream's queue; ``other``: put into the
#: ``other`` frame FIFO; ``*_full``: of that kind but its queue was full; ``other_dropped``: not
#: for the engine and not passed on (no ``other`` stream, or the frame did not fit in its FIFO).
RX_COUNTERS = (
    "rx_frames",
    "arp", "cm", "roce", "other",
    "mac_bad", "runt", "ip_header", "ip_fragment", "ip_checksum", "ip_length", "udp_length",
    "roce_length", "icrc", "cm_length",
    "arp_full", "cm_full", "roce_full", "other_dropped",
)

#: What the ACK handler (:class:`roce_hw.ctrl.ack.AckHandler`, model :mod:`roce_hw.model.ack`)
#: made of each RoCEv2 packet it received, one counter each (32 bits, wrapping); every packet
#: is counted in ``ack_items`` and in exactly one of the others:
#:
#: * acted on: ``acks`` (an ACK that acknowledges at least one outstanding packet),
#:   ``naks_seq`` (NAK PSN-sequence error), ``rnr_naks``, ``naks_fatal`` (NAK invalid request,
#:   remote access or remote operational error), ``cnps``;
#: * harmless, nothing done: ``acks_stale`` (an ACK of nothing outstanding: a duplicate or an
#:   old one), ``naks_stale`` (a NAK for an acknowledged PSN);
#: * dropped: ``not_ack`` (a RoCEv2 packet that is neither an ACK nor a CNP: this engine is no
#:   responder), ``bad_syndrome`` (a reserved AETH syndrome: bit 7, type 10, NAK code 4 or
#:   more), ``unknown_qp`` (destination QP not a local QP), ``qp_not_open`` (the QP is not in
#:   RTS), ``bad_src`` (source IP not the QP's peer), ``bad_pkey``, ``psn_unsent`` (an ACK or
#:   NAK for a PSN never sent).
ACK_COUNTERS = (
    "ack_items",
    "acks", "naks_seq", "rnr_naks", "naks_fatal", "cnps",
    "acks_stale", "naks_stale",
    "not_ack", "bad_syndrome", "unknown_qp", "qp_not_open", "bad_src", "bad_pkey", "psn_unsent",
)


class TimerKind(enum.IntEnum):
    """What a QP's retransmission timer reports (:func:`roce_hw.layouts.timer_fire_layout`)."""
    TIMEOUT = 0         #: local ACK timeout: go back to the oldest unacknowledged PSN
    RNR_DONE = 1        #: the RNR wait is over: go back to the oldest unacknowledged PSN
    RETRY_EXC = 2       #: local ACK timeout with no retry left (``retry_cnt``)
    RNR_RETRY_EXC = 3   #: RNR NAK with no RNR retry left (``rnr_retry``; 7 is infinite)


class AckKind(enum.IntEnum):
    """The kind of an ACK handler event (:func:`roce_hw.layouts.ack_event_layout`)."""
    ACK = 0         #: acknowledges every packet up to and including ``psn``
    NAK_SEQ = 1     #: acknowledges every packet before ``psn``; go back to ``psn``
    RNR = 2         #: receiver not ready for ``psn``; ``code`` is the RNR timer code
    FATAL = 3       #: NAK ``code`` 1-3 (invalid request, remote access, remote operational)
    CNP = 4         #: congestion notification for the QP


#: What the RX front end's rules make of a frame (the ``reason`` of
#: :func:`roce_hw.model.rx.classify`): one of the four kinds it passes on, or the reason it is
#: dropped. The counters above are these, less the frames a full queue or FIFO did not take.
RX_VERDICTS = RX_COUNTERS[1:RX_COUNTERS.index("cm_length") + 1]

#: The Ethernet minimum frame without its FCS (IEEE 802.3: 64 bytes with it); a shorter IPv4
#: packet arrives zero-padded to this length.
ETH_MIN_FRAME = 60

#: The Ethernet broadcast address (ARP requests), as an integer.
BROADCAST_MAC = (1 << 48) - 1

# --- The Ethernet physical layer (IEEE 802.3 clause 35, GMII) ---------------------------------

#: Preamble byte, sent 7 times before the start frame delimiter.
ETH_PREAMBLE_BYTE = 0x55
#: Preamble bytes before the start frame delimiter.
ETH_PREAMBLE_BYTES = 7
#: Start frame delimiter: the byte after the preamble; the frame's first byte follows it.
ETH_SFD = 0xD5
#: Frame check sequence: ``zlib.crc32`` of the frame, sent least significant byte first.
ETH_FCS_BYTES = 4
#: Minimum inter-frame gap, in byte times (96 bit times).
ETH_IFG_BYTES = 12

#: The 1G MAC's transmit counters (:class:`roce_hw.mac.tx.TxMac`): ``frames`` sent with a good
#: FCS; ``aborted``: sent with an inverted FCS because ``abort`` was set on the last byte;
#: ``underruns``: cut short (inverted FCS) because the next byte was missing inside a frame.
MAC_TX_COUNTERS = ("frames", "aborted", "underruns")
#: The 1G MAC's receive counters (:class:`roce_hw.mac.rx.RxMac` and the clock crossing after it):
#: every frame that got past its start frame delimiter or failed in its preamble is counted in
#: exactly one of the first five. ``frames``: good; ``bad_fcs``: FCS wrong; ``runt``: under
#: 64 bytes with its FCS; ``bad_preamble``: a byte other than the preamble or the SFD before the
#: SFD (or more than 7 preamble bytes, or the end of the frame before the SFD); ``phy_error``:
#: the PHY signalled an error (RX_ER) inside the frame. ``overflow`` counts, besides, the frames
#: the receive queue had no room for (cut, ending in ``abort``, or not passed on at all).
MAC_RX_COUNTERS = ("frames", "bad_fcs", "runt", "bad_preamble", "phy_error", "overflow")


# --- Header lists ----------------------------------------------------------------------------

def common_prefix(variants):
    """The headers all ``variants`` (tuples of :class:`Header`) start with (longest common
    prefix), as a tuple."""
    prefix = []
    for headers in zip(*variants):
        if all(h is headers[0] for h in headers):
            prefix.append(headers[0])
        else:
            break
    return tuple(prefix)
