# SPDX-License-Identifier: BSD-2-Clause
"""Independent test oracles written straight from the protocol reference, PROTOCOL.md section 2
(carried verbatim in tests/reference/PROTOCOL_excerpt.md); no roce_hw import."""

import struct
import zlib

__all__ = ["protocol_icrc", "protocol_icrc_bytes"]


def protocol_icrc(l3):
    """PROTOCOL.md §2 ``rocev2_icrc`` (tests/reference/PROTOCOL_excerpt.md), line for line: the
    iCRC register value of ``l3`` (IPv4 or
    IPv6 header .. UDP .. BTH .. extension headers .. payload .. pad, **without** the iCRC).

    Kept apart from :mod:`roce_hw.model.icrc` on purpose, so that tests comparing the model or
    the hardware with it compare two independent implementations of the rule."""
    l3 = bytes(l3)
    if l3[0] >> 4 == 4:
        ihl = (l3[0] & 0x0F) * 4
        ip = bytearray(l3[:ihl]); ip[1] = 0xFF; ip[8] = 0xFF; ip[10:12] = b"\xff\xff"
    else:
        ihl = 40
        ip = bytearray(l3[:40]); ip[0] |= 0x0F; ip[1:4] = b"\xff\xff\xff"; ip[7] = 0xFF
    udp = bytearray(l3[ihl:ihl + 8]); udp[6:8] = b"\xff\xff"
    bth = bytearray(l3[ihl + 8:ihl + 20]); bth[4] = 0xFF
    return zlib.crc32(b"\xff" * 8 + bytes(ip) + bytes(udp) + bytes(bth) + l3[ihl + 20:]) \
        & 0xFFFFFFFF


def protocol_icrc_bytes(l3):
    """The 4 wire bytes of :func:`protocol_icrc` (``struct.pack('<I', crc)``, PROTOCOL.md §2)."""
    return struct.pack("<I", protocol_icrc(l3))
