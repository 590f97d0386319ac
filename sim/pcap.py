# SPDX-License-Identifier: BSD-2-Clause
"""Minimal pcap / pcapng reader and pcap writer (pure Python, Ethernet link type only).

Errors in the file (bad magic, truncated records, unsupported link type) raise
:class:`CaptureError` with a readable message; callers turn that into an exit status.
"""

import struct
from dataclasses import dataclass

__all__ = ["CaptureError", "Packet", "read_capture", "write_pcap"]

LINKTYPE_ETHERNET = 1


class CaptureError(Exception):
    """The capture file is unreadable, truncated or of an unsupported kind.

    ``packets`` holds the packets read before the problem (empty if none), so a tool can still
    report on the readable part of a truncated capture.
    """

    def __init__(self, message, packets=None):
        super().__init__(message)
        self.packets = list(packets or [])


@dataclass
class Packet:
    time: float        #: seconds since the epoch
    data: bytes        #: the captured bytes (may be shorter than the frame if snapped)
    wire_len: int      #: the frame's length on the wire


def _read_pcap(buf, out):
    magic = buf[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        endian = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        endian = ">"
    else:  # pragma: no cover - dispatched by read_capture
        raise CaptureError("not a pcap file")
    nano = magic in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")
    if len(buf) < 24:
        raise CaptureError("truncated pcap file header")
    linktype = struct.unpack_from(endian + "I", buf, 20)[0] & 0x0FFFFFFF
    if linktype != LINKTYPE_ETHERNET:
        raise CaptureError(f"link type {linktype} is not Ethernet (1)")
    pos = 24
    while pos < len(buf):
        if pos + 16 > len(buf):
            raise CaptureError(f"truncated record header at byte {pos} (packet {len(out) + 1})")
        sec, frac, incl, orig = struct.unpack_from(endian + "IIII", buf, pos)
        pos += 16
        if incl > 0x40000 or pos + incl > len(buf):
            raise CaptureError(f"truncated or corrupt record at byte {pos - 16} "
                               f"(packet {len(out) + 1}, {incl} bytes announced)")
        out.append(Packet(sec + frac * (1e-9 if nano else 1e-6), buf[pos:pos + incl], orig))
        pos += incl
    return out


def _read_pcapng(buf, out):
    if len(buf) < 12 or struct.unpack_from("<I", buf, 0)[0] != 0x0A0D0D0A:
        raise CaptureError("pcapng file does not start with a section header block")
    pos = 0
    endian = "<"
    interfaces = []   # (linktype, tick seconds)
    while pos < len(buf):
        if pos + 12 > len(buf):
            raise CaptureError(f"truncated pcapng block at byte {pos}")
        btype = struct.unpack_from(endian + "I", buf, pos)[0]
        if btype == 0x0A0D0D0A:   # section header: byte-order magic decides the endianness
            bom = buf[pos + 8:pos + 12]
            if bom == b"\x4d\x3c\x2b\x1a":
                endian = "<"
            elif bom == b"\x1a\x2b\x3c\x4d":
                endian = ">"
            else:
                raise CaptureError(f"bad pcapng byte-order magic at byte {pos}")
            interfaces = []
        blen = struct.unpack_from(endian + "I", buf, pos + 4)[0]
        if blen < 12 or blen % 4 or pos + blen > len(buf):
            raise CaptureError(f"truncated or corrupt pcapng block at byte {pos} ({blen} bytes)")
        body = buf[pos + 8:pos + blen - 4]
        if btype == 0x00000001:          # interface description
            if len(body) < 8:
                raise CaptureError(f"truncated interface description block at byte {pos}")
            linktype = struct.unpack_from(endian + "H", body, 0)[0]
            tick = 1e-6
            opos = 8
            while opos + 4 <= len(body):
                code, olen = struct.unpack_from(endian + "HH", body, opos)
                if code == 0:
                    break
                if opos + 4 + olen > len(body):
                    raise CaptureError(f"corrupt option in interface block at byte {pos}")
                if code == 9 and olen >= 1:          # if_tsresol
                    r = body[opos + 4]
                    tick = 2.0 ** -(r & 0x7F) if r & 0x80 else 10.0 ** -r
                opos += 4 + (olen + 3) // 4 * 4
            interfaces.append((linktype, tick))
        elif btype in (0x00000006, 0x00000003):   # enhanced / simple packet
            if btype == 6:
                if len(body) < 20:
                    raise CaptureError(f"truncated enhanced packet block at byte {pos}")
                ifid, ts_hi, ts_lo, incl, orig = struct.unpack_from(endian + "IIIII", body, 0)
                data_off = 20
            else:
                if len(body) < 4:
                    raise CaptureError(f"truncated simple packet block at byte {pos}")
                ifid, ts_hi, ts_lo = 0, 0, 0
                orig = struct.unpack_from(endian + "I", body, 0)[0]
                incl, data_off = min(orig, len(body) - 4), 4
            if ifid >= len(interfaces):
                raise CaptureError(f"packet block at byte {pos} names unknown interface {ifid}")
            linktype, tick = interfaces[ifid]
            if linktype != LINKTYPE_ETHERNET:
                raise CaptureError(f"link type {linktype} is not Ethernet (1)")
            if data_off + incl > len(body):
                raise CaptureError(f"truncated packet data at byte {pos}")
            out.append(Packet(((ts_hi << 32) | ts_lo) * tick,
                              body[data_off:data_off + incl], orig))
        pos += blen
    return out


def read_capture(path):
    """Read every packet of a pcap or pcapng file as a list of :class:`Packet`."""
    try:
        with open(path, "rb") as f:
            buf = f.read()
    except OSError as e:
        raise CaptureError(f"cannot read {path}: {e.strerror}") from None
    if len(buf) < 4:
        raise CaptureError(f"{path}: file too short to be a capture")
    magic = buf[:4]
    out = []
    try:
        if magic == b"\x0a\x0d\x0d\x0a":
            _read_pcapng(buf, out)
            return out
        if magic in (b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\xc3\xd4", b"\x4d\x3c\xb2\xa1",
                     b"\xa1\xb2\x3c\x4d"):
            _read_pcap(buf, out)
            return out
    except CaptureError as e:
        raise CaptureError(f"{path}: {e}", out) from None
    except (struct.error, IndexError, ValueError, OverflowError) as e:   # belt and braces
        raise CaptureError(f"{path}: corrupt capture ({e})", out) from None
    raise CaptureError(f"{path}: not a pcap or pcapng file (magic {magic.hex()})")


def write_pcap(path, frames, *, start_time=0.0, interval=1e-6, nanoseconds=False):
    """Write Ethernet ``frames`` (bytes, or ``(time, bytes)`` pairs) to a classic pcap file
    that Wireshark and tshark open; microsecond time stamps, or nanosecond ones with
    ``nanoseconds=True`` (for simulated traffic, where frames are a few ns apart)."""
    scale = 10 ** 9 if nanoseconds else 10 ** 6
    magic = 0xA1B23C4D if nanoseconds else 0xA1B2C3D4
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", magic, 2, 4, 0, 0, 0x40000, LINKTYPE_ETHERNET))
        for i, fr in enumerate(frames):
            t, data = fr if isinstance(fr, tuple) else (start_time + i * interval, fr)
            ticks = int(round(t * scale))
            sec, frac = divmod(ticks, scale)
            f.write(struct.pack("<IIII", sec, frac, len(data), len(data)))
            f.write(bytes(data))
