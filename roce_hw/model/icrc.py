# SPDX-License-Identifier: BSD-2-Clause
"""Golden model of the RoCEv2 invariant CRC (PROTOCOL.md §2; Linux rxe_icrc.c).

The iCRC is the standard reflected CRC-32 (``zlib.crc32``) over 8 bytes of 0xFF (standing in
for the InfiniBand LRH), then the IP header with its variant fields set to 1s, the UDP header
with its checksum set to 1s, the BTH with byte 4 (FECN/BECN/resv6) set to 1s, and the rest of
the packet (extension headers, payload and pad). It goes on the wire little-endian.
"""

import struct
import zlib

from .. import proto

__all__ = ["masked_l3", "icrc", "icrc_bytes", "frame_l3", "frame_icrc_ok"]


def masked_l3(l3):
    """``l3`` (IP header .. pad, without the iCRC) with the iCRC-variant fields set to 1s."""
    b = bytearray(l3)
    version = b[0] >> 4
    if version == 4:
        ihl = (b[0] & 0x0F) * 4
        b[1] = 0xFF                    # TOS (DSCP/ECN)
        b[8] = 0xFF                    # TTL
        b[10:12] = b"\xff\xff"         # header checksum
    elif version == 6:
        ihl = proto.IPV6.size
        b[0] |= 0x0F                   # traffic class, high nibble
        b[1:4] = b"\xff\xff\xff"       # traffic class low nibble, flow label
        b[7] = 0xFF                    # hop limit
    else:
        raise ValueError(f"IP version {version} is neither 4 nor 6")
    if len(b) < ihl + proto.UDP.size + proto.BTH.size:
        raise ValueError(f"{len(b)} bytes is too short for IP/UDP/BTH headers")
    b[ihl + 6:ihl + 8] = b"\xff\xff"   # UDP checksum
    b[ihl + 8 + 4] = 0xFF              # BTH byte 4: FECN, BECN, resv6
    return bytes(b)


def icrc(l3):
    """iCRC of ``l3`` = IP header .. payload .. pad, **not** including the iCRC itself.
    Returns the CRC register value; the wire bytes are :func:`icrc_bytes`."""
    return zlib.crc32(b"\xff" * 8 + masked_l3(l3)) & 0xFFFFFFFF


def icrc_bytes(l3):
    """The 4 iCRC bytes as they go on the wire."""
    return struct.pack("<I", icrc(l3))


def frame_l3(frame):
    """Return ``(l3_start, l3_end)`` byte offsets of the UDP-length-bounded IB packet in an
    Ethernet ``frame`` (with or without one 802.1Q tag): ``frame[l3_start:l3_end]`` is the IP
    header through the iCRC. Raises ``ValueError`` if it is not IPv4/IPv6 + UDP, or if the
    frame ends before the UDP length field."""
    def need(n, where):
        if len(frame) < n:
            raise ValueError(f"frame of {len(frame)} bytes is truncated inside the {where}")

    need(proto.ETH.size, "Ethernet header")
    off = 12
    ethertype = struct.unpack_from("!H", frame, off)[0]
    off += 2
    if ethertype == proto.ETHERTYPE_VLAN:
        need(off + proto.VLAN_TAG.size, "802.1Q tag")
        ethertype = struct.unpack_from("!H", frame, off + 2)[0]
        off += 4
    if ethertype == proto.ETHERTYPE_IPV4:
        need(off + proto.IPV4.size, "IPv4 header")
        ihl = (frame[off] & 0x0F) * 4
        if frame[off] >> 4 != 4 or ihl < 20 or frame[off + 9] != proto.IP_PROTO_UDP:
            raise ValueError("not an IPv4/UDP packet")
    elif ethertype == proto.ETHERTYPE_IPV6:
        need(off + proto.IPV6.size, "IPv6 header")
        ihl = proto.IPV6.size
        if frame[off] >> 4 != 6 or frame[off + 6] != proto.IP_PROTO_UDP:
            raise ValueError("not an IPv6/UDP packet")
    else:
        raise ValueError(f"ethertype {ethertype:#06x} is not IPv4 or IPv6")
    need(off + ihl + proto.UDP.size, "UDP header")
    udp_len = struct.unpack_from("!H", frame, off + ihl + 4)[0]
    end = off + ihl + udp_len
    if udp_len < proto.UDP.size + proto.BTH.size + proto.ICRC_BYTES or end > len(frame):
        raise ValueError(f"UDP length {udp_len} does not fit the frame")
    return off, end


def frame_icrc_ok(frame):
    """True if the iCRC of an Ethernet ``frame`` carrying RoCEv2 is correct (trailing Ethernet
    padding or FCS beyond the UDP length is ignored)."""
    start, end = frame_l3(frame)
    l3 = frame[start:end]
    return icrc_bytes(l3[:-4]) == l3[-4:]
