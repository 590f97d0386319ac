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
    version = b[0] >> 4                # (the first nibble of either IP header)
    if version == 4:
        ip = proto.IPV4
        if len(b) < ip.size:
            raise ValueError(f"{len(b)} bytes is too short for an IPv4 header")
        ihl = ip.unpack(b)["ihl"] * 4
    elif version == 6:
        ip = proto.IPV6
        ihl = ip.size
    else:
        raise ValueError(f"IP version {version} is neither 4 nor 6")
    if len(b) < ihl + proto.UDP.size + proto.BTH.size:
        raise ValueError(f"{len(b)} bytes is too short for IP/UDP/BTH headers")
    for header, base in ((ip, 0), (proto.UDP, ihl), (proto.BTH, ihl + proto.UDP.size)):
        for k, bits in enumerate(header.mask(proto.ICRC_MASKED_FIELDS[header.name])):
            b[base + k] |= bits
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

    ethertype, _, off = proto.split_l2(frame)
    if ethertype == proto.ETHERTYPE_IPV4:
        need(off + proto.IPV4.size, "IPv4 header")
        ip = proto.IPV4.unpack(frame, off)
        ihl = ip["ihl"] * 4
        if ip["version"] != 4 or ihl < proto.IPV4.size or ip["protocol"] != proto.IP_PROTO_UDP:
            raise ValueError("not an IPv4/UDP packet")
    elif ethertype == proto.ETHERTYPE_IPV6:
        need(off + proto.IPV6.size, "IPv6 header")
        ip = proto.IPV6.unpack(frame, off)
        ihl = proto.IPV6.size
        if ip["version"] != 6 or ip["next_header"] != proto.IP_PROTO_UDP:
            raise ValueError("not an IPv6/UDP packet")
    else:
        raise ValueError(f"ethertype {ethertype:#06x} is not IPv4 or IPv6")
    need(off + ihl + proto.UDP.size, "UDP header")
    udp_len = proto.UDP.unpack(frame, off + ihl)["length"]
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
