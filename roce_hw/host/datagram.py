# SPDX-License-Identifier: BSD-2-Clause
"""The 64-byte UDP connection-manager datagram (PROTOCOL.md §7): pack, unpack, decode.

Pure Python, standard library and :mod:`roce_hw.proto` only (runs on a host without Amaranth,
e.g. inside the rxe guest). The layout is :data:`roce_hw.proto.CM_DATAGRAM`, the declaration the
hardware's ``data.StructLayout`` is built from; nothing here knows a byte offset.

A datagram is a ``dict`` keyed by the field names of ``CM_DATAGRAM`` (:data:`FIELDS`): the flag
byte as ``valid``, ``req_type``, ``ack_valid``, ``ack_type`` and the txmeta flag byte as
``tx_valid``, ``tx_start``, ``tx_immediate``, ``tx_type``, ``tx_resv``. IPs are 32-bit integers.
"""

import ipaddress

from .. import proto
from ..proto import CmAck, CmReq

__all__ = ["FIELDS", "LOC_FIELDS", "REM_FIELDS", "SIZE", "pack", "unpack", "datagram",
           "swap", "decode", "format_reply", "ip_int", "ip_str", "req_name", "ack_name",
           "open_request", "rts_request", "close_request", "info_request", "txmeta_request"]

#: Field names of the datagram in wire order.
FIELDS = tuple(name for name, _ in proto.CM_DATAGRAM.fields)
#: Size in bytes (64).
SIZE = proto.CM_DATAGRAM.size
assert SIZE == proto.CM_DATAGRAM_BYTES

#: The sender's and the peer's fields, in the same order (``swap`` exchanges them pairwise).
LOC_FIELDS = proto.CM_LOC_FIELDS
REM_FIELDS = proto.CM_REM_FIELDS


def pack(fields=None, **kwargs):
    """The 64 wire bytes of a datagram; missing fields are 0, unknown fields or values that do
    not fit their width raise (``KeyError`` / ``ValueError``)."""
    return proto.CM_DATAGRAM.pack(fields, **kwargs)


def unpack(buf):
    """A datagram's fields from exactly 64 bytes; any other length raises ``ValueError`` (a CM
    datagram is never truncated or padded)."""
    buf = bytes(buf)
    if len(buf) != SIZE:
        raise ValueError(f"a CM datagram is {SIZE} bytes, not {len(buf)}")
    return proto.CM_DATAGRAM.unpack(buf)


def datagram(**fields):
    """A complete field dict: every field of :data:`FIELDS`, 0 unless given."""
    out = dict.fromkeys(FIELDS, 0)
    for key, value in fields.items():
        if key not in out:
            raise KeyError(f"CM datagram has no field {key!r}")
        out[key] = int(value)
    return out


swap = proto.cm_swap


def ip_int(ip):
    """32-bit integer of a dotted IPv4 address (or of an integer)."""
    return int(ipaddress.IPv4Address(ip if not isinstance(ip, str) else ip.strip()))


def ip_str(ip):
    """Dotted form of a 32-bit IPv4 address."""
    return str(ipaddress.IPv4Address(int(ip)))


def req_name(code):
    """Name of a ``req_type`` (``"OPEN_QP"``...), or ``"REQ_<n>"`` for an undefined code."""
    try:
        return CmReq(code).name
    except ValueError:
        return f"REQ_{int(code)}"


def ack_name(code):
    """Name of an ``ack_type`` (``"ACK"``, ``"NO_QP"``...), or ``"ACK_<n>"`` if undefined."""
    try:
        return CmAck(code).name
    except ValueError:
        return f"ACK_{int(code)}"


_IP_FIELDS = ("loc_ip", "rem_ip")
_HEX_FIELDS = ("loc_r_key", "loc_base_addr", "rem_r_key", "rem_base_addr")


def decode(fields):
    """A readable form of a datagram (``dict``, JSON-serialisable): every field as an integer,
    plus ``req`` / ``ack`` (code names), ``tx_op`` (``"WRITE"``/``"SEND"``), and the IPs
    dotted as ``loc_ip_str`` / ``rem_ip_str``."""
    out = {k: int(fields[k]) for k in FIELDS}
    out["req"] = req_name(fields["req_type"])
    out["ack"] = ack_name(fields["ack_type"]) if fields["ack_valid"] else None
    out["tx_op"] = "WRITE" if fields["tx_type"] else "SEND"
    for k in _IP_FIELDS:
        out[k + "_str"] = ip_str(fields[k])
    return out


def format_reply(fields):
    """Lines of text describing a datagram: the ack code by name, every field, IPs dotted."""
    d = decode(fields)
    lines = [f"ack: {d['ack'] if d['ack'] is not None else '(none: ack_valid = 0)'}",
             f"request: {d['req'] if d['valid'] or not d['tx_valid'] else 'txmeta'} "
             f"(valid {d['valid']}, req_type {d['req_type']}, tx_valid {d['tx_valid']})"]
    for k in FIELDS:
        if k in ("valid", "req_type", "ack_valid", "ack_type") or k.startswith("tx_"):
            continue
        v = d[k]
        if k in _IP_FIELDS:
            text = d[k + "_str"]
        elif k in _HEX_FIELDS:
            text = f"{v:#x}"
        else:
            text = f"{v} ({v:#x})"
        lines.append(f"{k}: {text}")
    lines.append(f"txmeta: valid {d['tx_valid']} start {d['tx_start']} immediate "
                 f"{d['tx_immediate']} type {d['tx_type']} ({d['tx_op']}) resv {d['tx_resv']} "
                 f"length {d['tx_dma_length']} count {d['tx_n_transfers']} "
                 f"period {d['tx_period']}")
    return lines


# --- requests as a host sends them -----------------------------------------------------------

def _request(req_type, *, loc_ip, reply_port, qpn=0, psn=0, r_key=0, base_addr=0,
             engine_qpn=0, engine_psn=0):
    return datagram(valid=1, req_type=int(req_type), loc_qpn=qpn, loc_psn=psn, loc_r_key=r_key,
                    loc_base_addr=base_addr, loc_ip=ip_int(loc_ip), rem_qpn=engine_qpn,
                    rem_psn=engine_psn, reply_port=reply_port)


def open_request(*, loc_ip, qpn, psn=0, r_key=0, base_addr=0, engine_psn=0, engine_qpn=0,
                 reply_port=proto.CM_REPLY_UDP_PORT):
    """OPEN_QP: our QP (``qpn``, start ``psn``, ``r_key``, ``base_addr``, ``loc_ip``); the
    engine's send PSN starts at ``engine_psn``; ``engine_qpn`` 0 lets the engine choose."""
    return _request(CmReq.OPEN_QP, loc_ip=loc_ip, reply_port=reply_port, qpn=qpn, psn=psn,
                    r_key=r_key, base_addr=base_addr, engine_qpn=engine_qpn,
                    engine_psn=engine_psn)


def rts_request(*, loc_ip, engine_qpn, qpn, psn=0, r_key=0, base_addr=0, engine_psn=0,
                reply_port=proto.CM_REPLY_UDP_PORT):
    """MODIFY_QP_RTS of the engine's QP ``engine_qpn`` (same fields as the OPEN)."""
    return _request(CmReq.MODIFY_QP_RTS, loc_ip=loc_ip, reply_port=reply_port, qpn=qpn,
                    psn=psn, r_key=r_key, base_addr=base_addr, engine_qpn=engine_qpn,
                    engine_psn=engine_psn)


def close_request(*, loc_ip, engine_qpn, qpn=0, reply_port=proto.CM_REPLY_UDP_PORT):
    """CLOSE_QP of the engine's QP ``engine_qpn``."""
    return _request(CmReq.CLOSE_QP, loc_ip=loc_ip, reply_port=reply_port, qpn=qpn,
                    engine_qpn=engine_qpn)


def info_request(*, loc_ip, engine_qpn, qpn=0, reply_port=proto.CM_REPLY_UDP_PORT):
    """FETCH_QP_INFO of the engine's QP ``engine_qpn`` (read only)."""
    return _request(CmReq.FETCH_QP_INFO, loc_ip=loc_ip, reply_port=reply_port, qpn=qpn,
                    engine_qpn=engine_qpn)


def txmeta_request(*, loc_ip, engine_qpn, start=True, length=0, count=0, period=0, write=True,
                   imm=False, qpn=0, reply_port=proto.CM_REPLY_UDP_PORT):
    """txmeta (``valid`` 0, ``tx_valid`` 1): start (or stop, ``start=False``) the engine's
    generator on ``engine_qpn``: ``count`` messages of ``length`` bytes, ``period`` cycles
    apart, RDMA WRITE (``write``) or SEND, with immediate data (``imm``)."""
    return datagram(valid=0, loc_qpn=qpn, loc_ip=ip_int(loc_ip), rem_qpn=engine_qpn,
                    reply_port=reply_port, tx_valid=1, tx_start=int(bool(start)),
                    tx_immediate=int(bool(imm)), tx_type=int(bool(write)),
                    tx_dma_length=length, tx_n_transfers=count, tx_period=period)
