# SPDX-License-Identifier: BSD-2-Clause
"""One test vocabulary for the engines, shared by the tests and the tools (``sim.traffic``,
``sim.replay``, ``sim.rxe``, ``bench``): addresses, QP set-up, work requests, management writes
and reads.

Plain data (no Amaranth import at module level):

* :func:`parse_mac` / :func:`parse_ip` / :func:`mac_str` / :func:`ip_str` -- addresses as the
  engine's ports carry them (integers) and as people write them;
* :class:`QPSetup` and :func:`qp_context` -- a QP as the management port writes it;
* :class:`WorkItem` and :func:`wr_fields` -- a work request with its payload, and the payload of
  the ``wr`` stream (:func:`roce_hw.verbs.wr_layout`) it is posted as.

Bus-functional helpers for async testbenches (``ctx`` of ``Simulator.add_testbench``), for any
component with the engines' ``qp_mgmt_req``/``qp_mgmt_rsp``/``wr``/``local_mac``/``local_ip``
members (:class:`roce_hw.engine.TxEngine`, :class:`roce_hw.engine.RoceEngine`):

* :func:`mgmt_write`, :func:`mgmt_read` -- one management request and its response;
* :func:`set_up` -- addresses, then every QP written (each write's response awaited, so a WR
  posted afterwards sees it);
* :func:`post_wr` -- one work request.
"""

import ipaddress
import re
from dataclasses import dataclass

from roce_hw import proto

__all__ = ["parse_mac", "parse_ip", "mac_str", "ip_str", "QPSetup", "qp_context", "WorkItem",
           "wr_fields", "mgmt_write", "mgmt_read", "set_up", "post_wr", "MgmtError"]


# -- addresses -------------------------------------------------------------------------------
def parse_mac(text):
    """48-bit integer of ``aa:bb:cc:dd:ee:ff`` (``-`` also accepted; an ``int`` passes
    through); ``ValueError`` for anything else."""
    if isinstance(text, int) and not isinstance(text, bool):
        if not 0 <= text < 1 << 48:
            raise ValueError(f"bad MAC address {text!r}")
        return text
    t = str(text).strip()
    if not re.fullmatch(r"[0-9A-Fa-f]{2}([:-][0-9A-Fa-f]{2}){5}", t):
        raise ValueError(f"bad MAC address {text!r} (expected aa:bb:cc:dd:ee:ff)")
    return int(re.sub(r"[:-]", "", t), 16)


def parse_ip(text):
    """32-bit integer of a dotted IPv4 address (an ``int`` passes through); ``ValueError``
    for anything else."""
    if isinstance(text, int) and not isinstance(text, bool):
        if not 0 <= text < 1 << 32:
            raise ValueError(f"bad IPv4 address {text!r}")
        return text
    try:
        return int(ipaddress.IPv4Address(str(text).strip()))
    except ipaddress.AddressValueError:
        raise ValueError(f"bad IPv4 address {text!r}") from None


def mac_str(value):
    """``aa:bb:cc:dd:ee:ff`` of a 48-bit integer."""
    return ":".join(f"{b:02x}" for b in int(value).to_bytes(6, "big"))


def ip_str(value):
    """Dotted form of a 32-bit integer."""
    return str(ipaddress.IPv4Address(int(value)))


# -- QPs and work requests -------------------------------------------------------------------
@dataclass
class QPSetup:
    """A QP context as the management port writes it (the fields a user sets; the others are
    0 in :func:`qp_context`)."""
    index: int
    remote_qpn: int
    remote_mac: int
    remote_ip: int
    udp_sport: int = 0xC000
    start_psn: int = 0
    pmtu: int = 1024            #: bytes
    dscp: int = 0
    ecn: int = 0
    p_key: int = 0xFFFF
    migreq: int = 0
    state: proto.QPState = proto.QPState.RTS


def qp_context(q):
    """The whole QP context row (:data:`roce_hw.proto.QP_CONTEXT_FIELDS`) of a
    :class:`QPSetup`: ``next_psn`` = ``una_psn`` = ``start_psn``; fields it does not set are 0."""
    ctx = dict.fromkeys((name for name, _ in proto.QP_CONTEXT_FIELDS), 0)
    ctx.update({
        "state": int(q.state), "remote_qpn": q.remote_qpn, "remote_mac": q.remote_mac,
        "remote_ip": q.remote_ip, "udp_sport": q.udp_sport, "dscp": q.dscp, "ecn": q.ecn,
        "p_key": q.p_key, "migreq": q.migreq, "pmtu": int(proto.pmtu_code(q.pmtu)),
        "next_psn": q.start_psn, "una_psn": q.start_psn,
    })
    return ctx


@dataclass
class WorkItem:
    """A work request and its payload. ``length`` defaults to ``len(payload)``; set it to
    something else to present a length mismatch."""
    qp: int
    opcode: proto.WrOpcode
    payload: bytes
    remote_addr: int = 0
    r_key: int = 0
    imm: int = 0
    solicited: bool = False
    signaled: bool = True
    wr_id: int = 0
    length: int | None = None

    @property
    def wr_length(self):
        return len(self.payload) if self.length is None else self.length


def wr_fields(w, *, wr_id=None):
    """The ``wr`` stream payload (``dict`` of :func:`roce_hw.verbs.wr_layout` fields) of a
    :class:`WorkItem` (``wr_id`` overrides the item's)."""
    return {"wr_id": w.wr_id if wr_id is None else wr_id, "opcode": int(w.opcode), "qp": w.qp,
            "remote_addr": w.remote_addr, "r_key": w.r_key, "length": w.wr_length,
            "imm": w.imm, "signaled": int(w.signaled), "solicited": int(w.solicited)}


# -- bus-functional helpers ------------------------------------------------------------------
class MgmtError(RuntimeError):
    """The management port answered with ``error`` (a QP index >= ``n_qp``)."""


async def _mgmt(ctx, dut, request):
    from .stream import stream_get, stream_put
    await stream_put(ctx, dut.qp_mgmt_req, request)
    rsp = await stream_get(ctx, dut.qp_mgmt_rsp)
    if rsp.error:
        raise MgmtError(f"management request for QP {request['qp']} refused (error)")
    return rsp


async def mgmt_write(ctx, dut, qp, row):
    """Write QP ``qp``'s whole context ``row`` (a ``dict`` of QP context fields; missing ones
    are 0) and wait for the response; :class:`MgmtError` if the port refuses it."""
    return await _mgmt(ctx, dut, {"qp": qp, "write": 1, "ctx": row})


async def mgmt_read(ctx, dut, qp):
    """Read QP ``qp``'s context; returns the response's ``ctx`` (a ``data.Const`` view)."""
    return (await _mgmt(ctx, dut, {"qp": qp, "write": 0})).ctx


async def set_up(ctx, dut, *, local_mac, local_ip, qps=()):
    """Drive ``local_mac``/``local_ip`` and write every :class:`QPSetup` of ``qps``."""
    ctx.set(dut.local_mac, parse_mac(local_mac))
    ctx.set(dut.local_ip, parse_ip(local_ip))
    for q in qps:
        await mgmt_write(ctx, dut, q.index, qp_context(q))


async def post_wr(ctx, dut, w, *, wr_id=None, rng=None, p_idle=0.0):
    """Post :class:`WorkItem` ``w`` on ``dut.wr`` (its payload is sent separately, on ``i``)."""
    from .stream import stream_put
    await stream_put(ctx, dut.wr, wr_fields(w, wr_id=wr_id), rng=rng, p_idle=p_idle)
