# SPDX-License-Identifier: BSD-2-Clause
"""Minimal pcap / pcapng reader and pcap writer (pure Python).

Link types read: Ethernet (1) and the Linux "cooked" captures that ``tcpdump -i any`` writes,
SLL (113) and SLL2 (276), in classic pcap (microsecond or nanosecond time stamps) and pcapng
(as tshark, dumpcap and ibdump write it; any ``if_tsresol``). Every packet is returned as an
**Ethernet frame**: a cooked packet gets a synthesised 14-byte Ethernet header -- destination
00:00:00:00:00:00 (a cooked capture does not record it), source the captured link-layer address
(when it is a 6-byte MAC, else zero), EtherType the captured protocol type -- followed by the
captured bytes after the cooked header. The iCRC does not cover the Ethernet header, so RoCEv2
frames check exactly as captured.

Cooked header formats (https://www.tcpdump.org/linktypes/LINKTYPE_LINUX_SLL.html and
LINKTYPE_LINUX_SLL2.html), all fields big-endian:

* SLL, 16 bytes: packet type (2), ARPHRD type (2), link-layer address length (2), link-layer
  address (8, zero padded), protocol type (2);
* SLL2, 20 bytes: protocol type (2), reserved (2), interface index (4), ARPHRD type (2), packet
  type (1), link-layer address length (1), link-layer address (8, zero padded).

:func:`write_pcap` writes any of the three link types (``link="ethernet"``, ``"sll"``,
``"sll2"``) from Ethernet frames by the same rules in reverse (the Ethernet header is replaced by
the cooked one; source MAC as the address, ARPHRD_ETHER).

Errors in the file (bad magic, truncated records, unsupported link type) raise
:class:`CaptureError` with a readable message; callers turn that into an exit status.
"""

import struct
from dataclasses import dataclass

__all__ = ["CaptureError", "Packet", "read_capture", "write_pcap", "LINKTYPES",
           "LINKTYPE_ETHERNET", "LINKTYPE_LINUX_SLL", "LINKTYPE_LINUX_SLL2"]

LINKTYPE_ETHERNET = 1
LINKTYPE_LINUX_SLL = 113
LINKTYPE_LINUX_SLL2 = 276
#: Link types :func:`read_capture` understands, by number.
LINKTYPES = {LINKTYPE_ETHERNET: "Ethernet", LINKTYPE_LINUX_SLL: "Linux cooked (SLL)",
             LINKTYPE_LINUX_SLL2: "Linux cooked v2 (SLL2)"}
_ARPHRD_ETHER = 1
_SLL_OUTGOING = 4          # packet type "sent by us"


def _unsupported(linktype):
    names = ", ".join(f"{k} {v}" for k, v in LINKTYPES.items())
    return CaptureError(f"link type {linktype} is not supported (read: {names})")


def _to_ethernet(linktype, data, where):
    """The Ethernet frame for captured ``data`` of ``linktype`` (see the module docstring)."""
    if linktype == LINKTYPE_ETHERNET:
        return data
    if linktype == LINKTYPE_LINUX_SLL:
        if len(data) < 16:
            raise CaptureError(f"{where}: {len(data)} bytes, shorter than a 16-byte SLL header")
        _, _, alen = struct.unpack_from(">HHH", data, 0)
        addr, proto = data[6:14], data[14:16]
        body = data[16:]
    elif linktype == LINKTYPE_LINUX_SLL2:
        if len(data) < 20:
            raise CaptureError(f"{where}: {len(data)} bytes, shorter than a 20-byte SLL2 header")
        proto = data[0:2]
        alen = data[11]
        addr = data[12:20]
        body = data[20:]
    else:
        raise _unsupported(linktype)
    src = bytes(addr[:6]) if alen == 6 else bytes(6)
    return bytes(6) + src + bytes(proto) + bytes(body)


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
    data: bytes        #: the captured Ethernet frame (may be shorter than the frame if snapped)
    wire_len: int      #: the frame's length on the wire (cooked header replaced as for ``data``)
    time_ns: int | None = None    #: the time stamp in whole nanoseconds (exact)
    resolution: float = 1e-6      #: seconds per tick of the capture's time stamps
    linktype: int = LINKTYPE_ETHERNET   #: link type of the capture the packet came from


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
    if linktype not in LINKTYPES:
        raise _unsupported(linktype)
    pos = 24
    while pos < len(buf):
        if pos + 16 > len(buf):
            raise CaptureError(f"truncated record header at byte {pos} (packet {len(out) + 1})")
        sec, frac, incl, orig = struct.unpack_from(endian + "IIII", buf, pos)
        pos += 16
        if incl > 0x40000 or pos + incl > len(buf):
            raise CaptureError(f"truncated or corrupt record at byte {pos - 16} "
                               f"(packet {len(out) + 1}, {incl} bytes announced)")
        ns = sec * 10**9 + frac * (1 if nano else 1000)
        data = _to_ethernet(linktype, buf[pos:pos + incl], f"packet {len(out) + 1}")
        out.append(Packet(ns / 1e9, data, orig + len(data) - incl, time_ns=ns,
                          resolution=1e-9 if nano else 1e-6, linktype=linktype))
        pos += incl
    return out


def _read_pcapng(buf, out):
    if len(buf) < 12 or struct.unpack_from("<I", buf, 0)[0] != 0x0A0D0D0A:
        raise CaptureError("pcapng file does not start with a section header block")
    pos = 0
    endian = "<"
    interfaces = []   # (linktype, tick seconds, ticks -> ns)
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
            to_ns = _decimal_ns(6)
            opos = 8
            while opos + 4 <= len(body):
                code, olen = struct.unpack_from(endian + "HH", body, opos)
                if code == 0:
                    break
                if opos + 4 + olen > len(body):
                    raise CaptureError(f"corrupt option in interface block at byte {pos}")
                if code == 9 and olen >= 1:          # if_tsresol
                    r = body[opos + 4]
                    if r & 0x80:
                        tick = 2.0 ** -(r & 0x7F)
                        to_ns = (lambda n, b=r & 0x7F: (n * 10**9) >> b)
                    else:
                        tick = 10.0 ** -r
                        to_ns = _decimal_ns(r)
                opos += 4 + (olen + 3) // 4 * 4
            interfaces.append((linktype, tick, to_ns))
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
            linktype, tick, to_ns = interfaces[ifid]
            if linktype not in LINKTYPES:
                raise _unsupported(linktype)
            if data_off + incl > len(body):
                raise CaptureError(f"truncated packet data at byte {pos}")
            ns = to_ns((ts_hi << 32) | ts_lo)
            data = _to_ethernet(linktype, body[data_off:data_off + incl],
                                f"packet block at byte {pos}")
            out.append(Packet(ns / 1e9, data, orig + len(data) - incl, time_ns=ns,
                              resolution=tick, linktype=linktype))
        pos += blen
    return out


def _decimal_ns(r):
    """ticks of 10**-r seconds -> nanoseconds (floored below 1 ns)."""
    if r <= 9:
        return lambda n, k=10 ** (9 - r): n * k
    return lambda n, k=10 ** (r - 9): n // k


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


def _cooked(link, frame):
    """Ethernet ``frame`` -> the captured bytes of link ``"sll"``/``"sll2"`` (module docstring):
    the 14-byte Ethernet header replaced by the cooked header (packet type "outgoing",
    ARPHRD_ETHER, the source MAC as the 6-byte address, the EtherType as protocol type)."""
    frame = bytes(frame)
    if len(frame) < 14:
        raise ValueError("a frame needs a 14-byte Ethernet header to be re-encapsulated")
    src, proto, body = frame[6:12], frame[12:14], frame[14:]
    addr = src + bytes(2)
    if link == "sll":
        return struct.pack(">HHH", _SLL_OUTGOING, _ARPHRD_ETHER, 6) + addr + proto + body
    return proto + bytes(2) + struct.pack(">IHBB", 1, _ARPHRD_ETHER, _SLL_OUTGOING, 6) + \
        addr + body


_LINKS = {"ethernet": LINKTYPE_ETHERNET, "sll": LINKTYPE_LINUX_SLL, "sll2": LINKTYPE_LINUX_SLL2}


def write_pcap(path, frames, *, start_time=0.0, interval=1e-6, nanoseconds=False,
               link="ethernet"):
    """Write Ethernet ``frames`` (bytes, or ``(time, bytes)`` pairs) to a classic pcap file
    that Wireshark and tshark open; microsecond time stamps, or nanosecond ones with
    ``nanoseconds=True`` (for simulated traffic, where frames are a few ns apart). ``link``
    ``"sll"`` or ``"sll2"`` writes a Linux cooked capture instead (see the module docstring)."""
    if link not in _LINKS:
        raise ValueError(f"link must be one of {', '.join(_LINKS)}, not {link!r}")
    scale = 10 ** 9 if nanoseconds else 10 ** 6
    magic = 0xA1B23C4D if nanoseconds else 0xA1B2C3D4
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", magic, 2, 4, 0, 0, 0x40000, _LINKS[link]))
        for i, fr in enumerate(frames):
            t, data = fr if isinstance(fr, tuple) else (start_time + i * interval, fr)
            if link != "ethernet":
                data = _cooked(link, data)
            ticks = int(round(t * scale))
            sec, frac = divmod(ticks, scale)
            f.write(struct.pack("<IIII", sec, frac, len(data), len(data)))
            f.write(bytes(data))
