# SPDX-License-Identifier: BSD-2-Clause
"""Golden RoCEv2 frame model: build any frame from fields, parse one back, TX requester model.

Every header is packed and unpacked with the :class:`roce_hw.proto.Header` objects and the
iCRC comes from :mod:`roce_hw.model.icrc`; nothing here knows a field's byte offset. No
Amaranth import, so tests and tools can use it without the hardware.

Frame layout (PROTOCOL.md §5.1): ``Eth [+802.1Q] / IPv4 or IPv6 / UDP(dport 4791) / BTH /
extension headers (proto.opcode_headers) / payload / zero pad (PadCnt) / iCRC`` — no FCS.
"""

import struct
from dataclasses import dataclass

from .. import proto
from ..proto import Opcode
from .icrc import icrc_bytes

__all__ = [
    "QPPath", "RoceFrame", "build_frame", "build_request_frame", "build_ack_frame",
    "build_cnp_frame", "parse_frame", "ipv4_checksum",
]

_HEADER_NAMES = {h: name for name, h in (
    ("RETH", proto.RETH), ("AETH", proto.AETH), ("IMMDT", proto.IMMDT), ("IETH", proto.IETH),
    ("DETH", proto.DETH), ("CNP_PAD", proto.CNP_PAD))}


def _header_name(h):
    return _HEADER_NAMES.get(h, h.name)


def ipv4_checksum(header):
    """RFC 791 header checksum of ``header`` (bytes, with its checksum field set to 0)."""
    if len(header) % 2:
        header = header + b"\0"
    s = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


@dataclass
class QPPath:
    """Addressing of one connection as the requester sends it (IPv4 only for TX).

    MACs are 48-bit ints, IPs 32-bit ints. ``vlan`` is the VID of an 802.1Q tag (PCP/DEI 0),
    or ``None`` for an untagged frame.
    """
    src_mac: int
    dst_mac: int
    src_ip: int
    dst_ip: int
    dest_qp: int
    udp_sport: int
    dscp: int = 0
    ecn: int = 0
    ttl: int = 64
    p_key: int = 0xFFFF
    migreq: int = 0
    vlan: int | None = None


@dataclass
class RoceFrame:
    """A parsed RoCEv2 frame (see :func:`parse_frame`).

    ``headers`` maps the extension-header name (``"RETH"``, ``"AETH"``, ``"IMMDT"``,
    ``"IETH"``, ``"DETH"``, ``"CNP_PAD"``, ``"ATOMICETH"``, ``"ATOMICACKETH"``, ``"FETH"``) to
    its field dict, in wire order. ``icrc`` is the 4 wire bytes; ``trailer`` is whatever the
    frame holds after the UDP-length-bounded packet (Ethernet padding or an FCS).
    """
    eth: dict
    vlan: dict | None
    ip_version: int
    ip: dict
    udp: dict
    bth: dict
    opcode: Opcode
    headers: dict
    payload: bytes
    pad: int
    pad_bytes: bytes
    icrc: bytes
    icrc_ok: bool
    ip_options: bytes = b""
    trailer: bytes = b""

    @property
    def reth(self):
        return self.headers.get("RETH")

    @property
    def aeth(self):
        return self.headers.get("AETH")

    @property
    def immdt(self):
        return self.headers.get("IMMDT")

    @property
    def imm(self):
        h = self.headers.get("IMMDT")
        return None if h is None else h["imm"]

    @property
    def deth(self):
        return self.headers.get("DETH")

    @property
    def psn(self):
        return self.bth["psn"]

    @property
    def dest_qp(self):
        return self.bth["dest_qp"]

    def build_args(self):
        """Keyword arguments for :func:`build_frame` that rebuild this frame, **without** the
        fields :func:`build_frame` derives (IP lengths and checksum, UDP length, PadCnt, pad,
        iCRC), so a rebuild recomputes them."""
        ip = dict(self.ip)
        for k in ("total_length", "checksum", "payload_length", "ihl"):
            ip.pop(k, None)
        udp = dict(self.udp)
        udp.pop("length", None)
        bth = dict(self.bth)
        bth.pop("pad_cnt", None)
        bth.pop("opcode", None)
        return dict(opcode=self.opcode, eth=dict(self.eth),
                    vlan=None if self.vlan is None else dict(self.vlan),
                    ip_version=self.ip_version, ip=ip, ip_options=self.ip_options, udp=udp,
                    bth=bth, headers={k: dict(v) for k, v in self.headers.items()},
                    payload=self.payload)


def _vlan_fields(vlan):
    if vlan is None:
        return None
    if isinstance(vlan, dict):
        return dict(vlan)
    vid = int(vlan)
    if not 0 <= vid < 4096:
        raise ValueError(f"VLAN ID {vid} is not in 0..4095")
    return {"vid": vid}


def build_frame(opcode, *, eth=None, vlan=None, ip_version=4, ip=None, ip_options=b"", udp=None,
                bth=None, headers=None, payload=b"", pad_bytes=None, icrc=None):
    """Build a complete RoCEv2 Ethernet frame (no FCS) for any opcode.

    Parameters
    ----------
    opcode : proto.Opcode or int
        BTH opcode (RC, UC, UD or CNP).
    eth : dict
        :data:`proto.ETH` fields ``dst``, ``src`` (``ethertype`` is derived).
    vlan : int, dict or None
        802.1Q VID, or a :data:`proto.VLAN_TAG` field dict, or ``None`` (untagged).
    ip_version : int
        4 or 6.
    ip : dict
        :data:`proto.IPV4` / :data:`proto.IPV6` fields. IPv4 ``total_length``, ``ihl`` and
        ``checksum`` and IPv6 ``payload_length`` are computed unless given.
    ip_options : bytes
        IPv4 options (multiple of 4 bytes).
    udp : dict
        :data:`proto.UDP` fields; ``dst_port`` defaults to 4791, ``checksum`` to 0, ``length``
        is computed unless given.
    bth : dict
        :data:`proto.BTH` fields other than ``opcode``; ``pad_cnt`` is computed unless given.
    headers : dict
        Extension-header name -> field dict. Names must be among
        ``proto.opcode_headers(opcode)``; a missing one is packed with its defaults (zeros).
    payload : bytes
    pad_bytes : bytes, optional
        Pad contents (default ``pad_cnt`` zero bytes).
    icrc : int, bytes or None
        Override the iCRC (int = CRC register value, bytes = wire bytes) to build a bad frame.

    Raises
    ------
    ValueError
        Unknown opcode, unknown extension header for this opcode, field out of range, bad IP
        version.
    """
    op = Opcode(opcode) if opcode in Opcode._value2member_map_ else None
    if op is None:
        raise ValueError(f"unknown or reserved BTH opcode {int(opcode):#04x}")
    payload = bytes(payload)
    headers = dict(headers or {})
    allowed = proto.opcode_headers(op)
    allowed_names = [_header_name(h) for h in allowed]
    for name in headers:
        if name not in allowed_names:
            raise ValueError(f"{op.name} carries {allowed_names or 'no extension headers'}, "
                             f"not {name!r}")
    ext = b"".join(h.pack(headers.get(_header_name(h), {})) for h in allowed)

    bth_f = dict(bth or {})
    if "opcode" in bth_f and int(bth_f.pop("opcode")) != int(op):
        raise ValueError("bth['opcode'] disagrees with opcode")
    bth_f.setdefault("pad_cnt", (-len(payload)) & 3)
    if pad_bytes is None:
        pad_bytes = bytes(bth_f["pad_cnt"])
    bth_b = proto.BTH.pack(bth_f, opcode=int(op))
    ib = bth_b + ext + payload + bytes(pad_bytes)

    udp_f = dict(udp or {})
    udp_f.setdefault("checksum", 0)
    udp_f.setdefault("length", proto.UDP.size + len(ib) + proto.ICRC_BYTES)
    udp_b = proto.UDP.pack(udp_f)

    ip_f = dict(ip or {})
    if ip_version == 4:
        if len(ip_options) % 4:
            raise ValueError(f"IPv4 options of {len(ip_options)} bytes are not a multiple of 4")
        ip_f.setdefault("ihl", 5 + len(ip_options) // 4)
        hdr_len = proto.IPV4.size + len(ip_options)
        ip_f.setdefault("total_length", hdr_len + len(udp_b) + len(ib) + proto.ICRC_BYTES)
        if "checksum" not in ip_f:
            ip_f["checksum"] = 0
            ip_f["checksum"] = ipv4_checksum(proto.IPV4.pack(ip_f) + bytes(ip_options))
        ip_b = proto.IPV4.pack(ip_f) + bytes(ip_options)
        ethertype = proto.ETHERTYPE_IPV4
    elif ip_version == 6:
        if ip_options:
            raise ValueError("IPv6 extension headers are not supported")
        ip_f.setdefault("payload_length", len(udp_b) + len(ib) + proto.ICRC_BYTES)
        ip_b = proto.IPV6.pack(ip_f)
        ethertype = proto.ETHERTYPE_IPV6
    else:
        raise ValueError(f"ip_version {ip_version!r} is not 4 or 6")

    l3 = ip_b + udp_b + ib
    if icrc is None:
        crc = icrc_bytes(l3)
    elif isinstance(icrc, (bytes, bytearray)):
        if len(icrc) != 4:
            raise ValueError("icrc override must be 4 bytes")
        crc = bytes(icrc)
    else:
        crc = struct.pack("<I", int(icrc) & 0xFFFFFFFF)

    eth_f = dict(eth or {})
    vlan_f = _vlan_fields(vlan)
    if vlan_f is None:
        l2 = proto.ETH.pack(eth_f, ethertype=ethertype)
    else:
        # the tag (its TPID where the ethertype was) between the addresses and the ethertype
        at = proto.ETH.offset("ethertype")[0]
        l2 = proto.ETH.pack(eth_f)[:at] + proto.VLAN_TAG.pack(vlan_f) + \
            ethertype.to_bytes(proto.ETH.width("ethertype") // 8, "big")
    return l2 + l3 + crc


def _path_args(path, ip_id):
    return dict(
        eth={"dst": path.dst_mac, "src": path.src_mac},
        vlan=path.vlan,
        ip_version=4,
        ip={"dscp": path.dscp, "ecn": path.ecn, "identification": int(ip_id) & 0xFFFF,
            "flag_df": 1, "ttl": path.ttl, "src": path.src_ip, "dst": path.dst_ip},
        udp={"src_port": path.udp_sport, "dst_port": proto.ROCEV2_UDP_PORT, "checksum": 0},
    )


def build_request_frame(path, pkt, *, ip_id):
    """Complete Ethernet frame (no FCS) of one request packet ``pkt`` (a
    :class:`~roce_hw.model.segment.PacketSpec`) on ``path`` (a :class:`QPPath`):
    Eth [+VLAN] / IPv4 (DF, TTL, DSCP/ECN, ``ip_id``, checksum, total length) / UDP (dport 4791,
    checksum 0) / BTH / [RETH] / [ImmDt] / payload / zero pad / iCRC."""
    headers = {}
    if pkt.reth is not None:
        headers["RETH"] = dict(pkt.reth)
    if pkt.imm is not None:
        headers["IMMDT"] = {"imm": pkt.imm}
    expect = [_header_name(h) for h in proto.opcode_headers(pkt.opcode)]
    if sorted(headers) != sorted(expect):
        raise ValueError(f"{Opcode(pkt.opcode).name} needs headers {expect}, the PacketSpec "
                         f"provides {sorted(headers)}")
    bth = {"se": int(pkt.se), "migreq": path.migreq, "p_key": path.p_key,
           "dest_qp": path.dest_qp, "ack_req": int(pkt.ack_req), "psn": pkt.psn}
    return build_frame(pkt.opcode, bth=bth, headers=headers, payload=pkt.payload,
                       **_path_args(path, ip_id))


def build_ack_frame(path, *, psn, syndrome=proto.AETH_ACK_UNLIMITED, msn=0, ip_id=0):
    """An RC ACKNOWLEDGE (ACK/RNR NAK/NAK per ``syndrome``) frame on ``path``."""
    bth = {"migreq": path.migreq, "p_key": path.p_key, "dest_qp": path.dest_qp, "psn": psn}
    return build_frame(Opcode.RC_ACKNOWLEDGE, bth=bth,
                       headers={"AETH": {"syndrome": syndrome, "msn": msn}},
                       **_path_args(path, ip_id))


def build_cnp_frame(path, *, ip_id=0):
    """A RoCEv2 CNP (opcode 0x81, BECN set, 16 zero bytes) to ``path.dest_qp``."""
    bth = {"becn": 1, "p_key": path.p_key, "dest_qp": path.dest_qp}
    return build_frame(Opcode.CNP, bth=bth, **_path_args(path, ip_id))


def parse_frame(frame):
    """Decode an Ethernet frame carrying RoCEv2 into a :class:`RoceFrame`.

    Accepts one optional 802.1Q tag, IPv4 (with options) or IPv6, UDP dport 4791. Bytes after
    the UDP-length-bounded packet are kept as ``trailer``.

    Raises
    ------
    ValueError
        With a message naming the problem, for frames that are not RoCEv2 or are malformed
        (too short, inconsistent lengths, unknown opcode, PadCnt larger than the payload).
    """
    frame = bytes(frame)
    ethertype, vlan, off = proto.split_l2(frame)
    eth = proto.ETH.unpack(frame)
    ip_options = b""
    if ethertype == proto.ETHERTYPE_IPV4:
        ip_version = 4
        ip = proto.IPV4.unpack(frame, off) if len(frame) >= off + proto.IPV4.size else None
        if ip is None:
            raise ValueError("frame truncated inside the IPv4 header")
        if ip["version"] != 4 or ip["ihl"] * 4 < proto.IPV4.size:
            raise ValueError(f"bad IPv4 version/IHL {ip['version']}/{ip['ihl']}")
        hlen = ip["ihl"] * 4
        ip_options = frame[off + proto.IPV4.size:off + hlen]
        if ip["protocol"] != proto.IP_PROTO_UDP:
            raise ValueError(f"IP protocol {ip['protocol']} is not UDP")
        if ip["flag_mf"] or ip["frag_offset"]:
            raise ValueError("fragmented IPv4 packet")
        ip_end = off + ip["total_length"]
    elif ethertype == proto.ETHERTYPE_IPV6:
        ip_version = 6
        if len(frame) < off + proto.IPV6.size:
            raise ValueError("frame truncated inside the IPv6 header")
        ip = proto.IPV6.unpack(frame, off)
        if ip["version"] != 6:
            raise ValueError(f"bad IPv6 version {ip['version']}")
        if ip["next_header"] != proto.IP_PROTO_UDP:
            raise ValueError(f"IPv6 next header {ip['next_header']} is not UDP")
        hlen = proto.IPV6.size
        ip_end = off + hlen + ip["payload_length"]
    else:
        raise ValueError(f"ethertype {ethertype:#06x} is not IPv4 or IPv6")
    l3_start = off
    off += hlen
    if len(frame) < off + proto.UDP.size:
        raise ValueError("frame truncated inside the UDP header")
    udp = proto.UDP.unpack(frame, off)
    if udp["dst_port"] != proto.ROCEV2_UDP_PORT:
        raise ValueError(f"UDP destination port {udp['dst_port']} is not {proto.ROCEV2_UDP_PORT}")
    end = off + udp["length"]
    if ip_end > len(frame):
        raise ValueError(f"IP length ({ip_end - l3_start} bytes) exceeds the frame "
                         f"({len(frame) - l3_start} bytes after L2): truncated frame")
    if end > ip_end:
        raise ValueError(f"UDP length {udp['length']} exceeds the IP packet")
    minimum = proto.UDP.size + proto.BTH.size + proto.ICRC_BYTES
    if udp["length"] < minimum:
        raise ValueError(f"UDP length {udp['length']} is shorter than UDP+BTH+iCRC ({minimum})")
    off += proto.UDP.size
    bth = proto.BTH.unpack(frame, off)
    try:
        op = Opcode(bth["opcode"])
    except ValueError:
        raise ValueError(f"unknown or reserved BTH opcode {bth['opcode']:#04x}") from None
    off += proto.BTH.size
    headers = {}
    for h in proto.opcode_headers(op):
        if off + h.size > end - proto.ICRC_BYTES:
            raise ValueError(f"{op.name}: packet too short for its {_header_name(h)}")
        headers[_header_name(h)] = h.unpack(frame, off)
        off += h.size
    data_end = end - proto.ICRC_BYTES
    pad = bth["pad_cnt"]
    if off + pad > data_end:
        raise ValueError(f"PadCnt {pad} exceeds the {data_end - off} bytes after the headers")
    payload = frame[off:data_end - pad]
    pad_b = frame[data_end - pad:data_end]
    crc = frame[data_end:end]
    ok = icrc_bytes(frame[l3_start:data_end]) == crc
    return RoceFrame(eth=eth, vlan=vlan, ip_version=ip_version, ip=ip, udp=udp, bth=bth,
                     opcode=op, headers=headers, payload=payload, pad=pad, pad_bytes=pad_b,
                     icrc=crc, icrc_ok=ok, ip_options=ip_options, trailer=frame[end:])

