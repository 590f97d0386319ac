# SPDX-License-Identifier: BSD-2-Clause
"""Property-based fuzzing (hypothesis) of the whole engine with whole frames.

One hypothesis example is a *sequence* of frames run in one simulation of
:class:`roce_hw.engine.RoceEngine` from its power-on state: a set-up prefix of valid OPEN/MODIFY
requests from two hosts, a body of 20 to 40 (``--slow``: 40 to 100) random and mutated frames,
and a last, valid OPEN from a host never seen before. Two harnesses run the sequences:

* the default suite: the whole engine (``roce_engine``) compiled by Verilator, driven through
  :mod:`sim.backend` in slices of cycles (:class:`BackendHarness`, a fresh engine per example),
  in the suite's two Verilator builds, 64 and 512 bits with 16 QPs. The sequences work on QPs
  0 to 3 as with 4 QPs; rows 4 to 15 are opened by another host (:data:`FILLER`) first and
  stay its, so the table scans, the full table and the requests past the table (QP 16) are as
  with 4 QPs;
* ``--slow``: RoceEngine with 4 QPs in Amaranth's simulator (:class:`EngineHarness`, driven per
  cycle), built once per width and reset between examples
  (:meth:`amaranth.sim.Simulator.reset`), which saves the seconds of elaboration an example
  would otherwise cost.

Frames: host sessions (OPEN by table scan or of a named QP, MODIFY_QP_RTS, a short generator
run, then stop, CLOSE or FETCH_QP_INFO -- steered while drawing by a copy of the model towards
QPs that are free or the host's own, so that they get far); single CM requests of every kind
from three hosts and strangers, with random field values or one validation rule broken, from
any UDP port (0 included), with the UDP checksum not computed, right or wrong; ARP
requests (for our IP or another, broadcast or unicast, requests and replies);
RoCEv2 frames with a good iCRC (ACK, CNP, SEND/WRITE); other traffic (IPv6, ICMP, UDP to another
port or IP, another MAC or EtherType, VLAN-tagged, broadcast); random bytes; and mutations of
all of those: bit flips anywhere, in the headers and in the tail, random header bytes and
header fields, truncation, extension, with or without the IPv4 checksum, the lengths and the
iCRC made consistent again afterwards; the MAC's bad-frame flag; idle cycles inside frames and
``tx`` backpressure in some sequences.

The oracle is :class:`sim.replay.EngineModel` (the RX front end's, the CM's and the requester's
models composed): every frame the engine sends (ARP replies, CM replies, generator data: in
order per kind), every ``rx_other`` frame, the final QP table and the RX and CM counters must be
the model's. The properties are also checked without the model:

* every received frame is counted once: ``rx_frames`` = frames sent = the sum of the disjoint
  outcome counters, and every CM datagram taken is counted once by the CM;
* nothing overflows at this spacing (``*_full``, ``other_dropped`` 0), no TX abort, no refused WR;
* a QP row that no obeyed (ACK) OPEN/MODIFY/CLOSE/txmeta reply of the body names is unchanged;
* the engine is not wedged: the last OPEN gets ACK, or NO_QP with the table full.

Spacing: an ARP request or CM datagram is sent only when the engine has answered everything
before it (as a host waiting for its reply does: the model assumes no queue overflows); the
other frames follow each other with random gaps, back to back included, also during generator
traffic. :func:`test_flood_is_counted` floods CM datagrams and ARP requests with the MAC's ``tx``
stalled, and checks that the ``cm_full``/``arp_full`` drops account for every frame.

Default tier: 30 sequences at 64 and 30 at 512 bits on Verilator (about 900 body frames a
width, 4 s a width), and the flood, the requests during a generator run and the checks that a
wrong model fails, on Verilator; ``--slow`` adds 12 sequences at 64 bits (about 340 frames, 2
minutes), more than 10,000 frames at 64 and 512 bits and those tests on Amaranth's simulator.
Fixed seeds (``derandomize=True``, or ``@seed``). With ``-s`` the module prints what the
sequences did (frames by outcome counter, CM replies by reason).
"""

import copy
import importlib
import random
import time
import warnings
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from roce_hw import proto
from roce_hw.config import EngineConfig
from roce_hw.host import datagram as dg
from roce_hw.model.cm import CmModel, generator_messages, request_frame, udp_checksum
from roce_hw.model.icrc import frame_l3, icrc_bytes
from roce_hw.model.packet import QPPath, build_ack_frame, build_cnp_frame, build_frame, \
    ipv4_checksum
from roce_hw.model.rx import OUTCOMES, classify
from roce_hw.ctrl.cm import CM_COUNTERS
from sim.replay import EngineModel, struct_to_dict

__all__ = []

# Hypothesis imports its patch writer (libcst) when a test fails; libcst uses a deprecated
# mypy_extensions API and DeprecationWarnings are errors here: import it quietly beforehand so
# a failure is reported, not an INTERNALERROR.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    try:
        importlib.import_module("hypothesis.extra._patching")
    except ImportError:
        pass

LOCAL_MAC = 0x02_00_00_00_00_01
LOCAL_IP = 0x0A_00_00_01
BROADCAST = (1 << 48) - 1
#: The hosts of the body (A and B also own the prefix's QPs); NEW only sends the last OPEN.
HOSTS = ((0x02_00_00_00_00_0A, 0x0A_00_00_0A), (0x02_00_00_00_00_0B, 0x0A_00_00_0B),
         (0x02_00_00_00_00_0C, 0x0A_00_00_0C))
NEW_HOST = (0x02_00_00_00_00_0D, 0x0A_00_00_0D)
OTHER_MAC = 0x02_00_00_00_00_77
OTHER_IP = 0x0A_00_00_63
#: The QP rows the sequences work on: the whole table of the Amaranth build (4 QPs). The
#: Verilator build of the default suite has 16 QPs: rows N_QP and up are then opened by
#: FILLER at the start of every sequence and stay its (see :func:`filler_frames`), so that the
#: sequences meet the same free/owned rows and a full table as with 4 QPs.
N_QP = 4
#: The table of the default suite's Verilator builds (``EngineConfig(data_width=64 or 512,
#: n_qp=16)``: no other configuration may be built by the default suite).
VERILATOR_N_QP = 16
#: The host that owns rows N_QP and up of a bigger table; it sends nothing else.
FILLER = (0x02_00_00_00_00_0F, 0x0A_00_00_0F)
#: Host QPNs: the prefix's QP i belongs to LOC_QPNS[i]; the body draws from all of them.
LOC_QPNS = (0x11, 0x12, 0x13, 0x14, 0x15)
REPLY_PORT = proto.CM_REPLY_UDP_PORT
Q = proto.LOCAL_QPN_BASE

#: Generator runs longer than this are left out of a sequence (a mutated count or period could
#: keep the simulation busy for hours): messages, bytes, period in cycles.
GEN_MAX_COUNT, GEN_MAX_BYTES, GEN_MAX_PERIOD = 16, 12288, 600

FUZZ = settings(derandomize=True, database=None, deadline=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.large_base_example])


# -- frames ------------------------------------------------------------------------------------
def eth(dst, src, ethertype):
    return proto.ETH.pack({"dst": dst, "src": src, "ethertype": ethertype})


def ipv4(src, dst, protocol, payload, **fields):
    """An IPv4 header (checksum computed unless given) + ``payload``."""
    ip = {"version": 4, "ihl": 5, "total_length": proto.IPV4.size + len(payload),
          "flag_df": 1, "ttl": 64, "protocol": protocol, "checksum": 0, "src": src, "dst": dst}
    ip.update(fields)
    if "checksum" not in fields:
        ip["checksum"] = ipv4_checksum(proto.IPV4.pack(ip))
    return proto.IPV4.pack(ip) + payload


def udp(sport, dport, payload):
    return proto.UDP.pack({"src_port": sport, "dst_port": dport,
                           "length": proto.UDP.size + len(payload), "checksum": 0}) + payload


def pad60(frame):
    """Ethernet padding to the 60-byte minimum (no FCS)."""
    return frame + bytes(max(0, 60 - len(frame)))


def cm_frame(fields, host, *, sport=REPLY_PORT, checksum=0):
    """A CM request frame; its UDP checksum ``checksum`` (0: not computed; True: right)."""
    mac, ip = host
    return request_frame(dg.pack(fields), src_mac=mac, dst_mac=LOCAL_MAC, src_ip=ip,
                         dst_ip=LOCAL_IP, src_port=sport, checksum=checksum)


def arp_frame(*, sender, target=LOCAL_IP, dst=BROADCAST, oper=proto.ArpOper.REQUEST, pad=18):
    mac, ip = sender
    return (eth(dst, mac, proto.ETHERTYPE_ARP)
            + proto.ARP.pack({"oper": oper, "sha": mac, "spa": ip, "tha": 0, "tpa": target})
            + bytes(pad))


_IP_OFF = proto.ETH.size
_UDP_OFF = _IP_OFF + proto.IPV4.size


def fix_frame(frame, *, lengths, icrc):
    """After a mutation: make the IPv4 header checksum right again (with ``lengths`` after
    setting the IPv4 total length and the UDP length to what the frame holds; with ``icrc``
    then also the iCRC of a RoCEv2 frame) -- so that a mutation also reaches the checks behind
    these."""
    f = bytearray(frame)
    if len(f) < _UDP_OFF or proto.ETH.unpack(bytes(f))["ethertype"] != proto.ETHERTYPE_IPV4:
        return bytes(f)
    ip = proto.IPV4.unpack(bytes(f), _IP_OFF)
    if lengths:
        ip["total_length"] = len(f) - _IP_OFF
        if ip["protocol"] == proto.IP_PROTO_UDP and len(f) >= _UDP_OFF + proto.UDP.size:
            u = proto.UDP.unpack(bytes(f), _UDP_OFF)
            u["length"] = len(f) - _UDP_OFF
            f[_UDP_OFF:_UDP_OFF + proto.UDP.size] = proto.UDP.pack(u)
    ip["checksum"] = 0
    ip["checksum"] = ipv4_checksum(proto.IPV4.pack(ip))
    f[_IP_OFF:_UDP_OFF] = proto.IPV4.pack(ip)
    if icrc:
        try:
            start, end = frame_l3(bytes(f))
        except ValueError:
            return bytes(f)
        if ip["ihl"] == 5:
            f[end - proto.ICRC_BYTES:end] = icrc_bytes(bytes(f[start:end - proto.ICRC_BYTES]))
    return bytes(f)


# -- strategies --------------------------------------------------------------------------------
u24 = st.integers(0, (1 << 24) - 1)
u32 = st.integers(0, (1 << 32) - 1)
u64 = st.integers(0, (1 << 64) - 1)
#: Field widths of the datagram.
WIDTHS = dict(proto.CM_DATAGRAM.fields)


def _chance(n, k):
    """``k`` in ``n``, drawn away from the bounds hypothesis favours."""
    return st.integers(0, n - 1).map(lambda v: 1 <= v <= k)


@st.composite
def prefixes(draw):
    """Valid OPEN (named) and MODIFY requests that give each QP a state (free, INIT, RTS) and an
    owner (host A or B)."""
    frames = []
    for i in range(N_QP):
        state = draw(st.sampled_from(("free", "free", "init", "rts", "rts")))
        if state == "free":
            continue
        host = HOSTS[draw(st.integers(0, 1))]
        frames.append(cm_frame(dg.open_request(
            loc_ip=host[1], qpn=LOC_QPNS[i], psn=draw(u24), r_key=draw(u32),
            base_addr=draw(u64), engine_psn=draw(u24), engine_qpn=Q + i), host))
        if state == "rts":
            frames.append(cm_frame(dg.rts_request(
                loc_ip=host[1], engine_qpn=Q + i, qpn=LOC_QPNS[i], psn=draw(u24),
                r_key=draw(u32), base_addr=draw(u64), engine_psn=draw(u24)), host))
    return frames


def filler_frames(table):
    """Named OPENs (and a MODIFY_QP_RTS for every other row) from FILLER for rows N_QP to
    ``table - 1``: none for the 4-QP table."""
    frames = []
    for i in range(N_QP, table):
        common = dict(loc_ip=FILLER[1], qpn=0x100 + i, psn=0x1000 * i, r_key=i,
                      base_addr=i << 32, engine_psn=0x10000 * i)
        frames.append(cm_frame(dg.open_request(**common, engine_qpn=Q + i), FILLER))
        if i % 2:
            frames.append(cm_frame(dg.rts_request(**common, engine_qpn=Q + i), FILLER))
    return frames


def _rows(table):
    """The engine QP index a CM request names: one of the N_QP rows, or just past the table;
    with a bigger table also FILLER's rows."""
    rows = st.sampled_from(range(N_QP)) | st.just(table)
    if table > N_QP:
        rows = rows | st.integers(N_QP, table - 1)
    return rows


@st.composite
def cm_frames(draw, table=N_QP):
    """A CM request frame: a valid request of any kind from one of the hosts (or a stranger),
    sometimes with random field values; ``table``: the QP table's size."""
    who = draw(st.sampled_from((0, 0, 0, 0, 1, 1, 1, 1, 2, 3)))     # mostly the owners A, B
    host = HOSTS[who] if who < 3 else (draw(st.integers(0, BROADCAST)), draw(u32))
    ip = host[1]
    kind = draw(st.sampled_from(("open", "open_named", "modify", "close", "fetch", "start",
                                 "start", "stop")))
    qpn = draw(st.sampled_from(LOC_QPNS) | u24)
    eq = Q + draw(_rows(table))                   # table: past the table
    if kind in ("open", "open_named", "modify"):
        make = dg.rts_request if kind == "modify" else dg.open_request
        extra = {} if kind == "open" else {"engine_qpn": eq}
        fields = make(loc_ip=ip, qpn=qpn, psn=draw(u24), r_key=draw(u32), base_addr=draw(u64),
                      engine_psn=draw(u24), **extra)
    elif kind == "close":
        fields = dg.close_request(loc_ip=ip, engine_qpn=eq, qpn=qpn)
    elif kind == "fetch":
        fields = dg.info_request(loc_ip=ip, engine_qpn=eq, qpn=qpn)
    else:
        fields = dg.txmeta_request(
            loc_ip=ip, engine_qpn=eq, qpn=qpn, start=kind == "start",
            length=draw(st.sampled_from((0, 1, 4, 64, 1024, 1025)) | st.integers(0, 2100)),
            count=draw(st.integers(1, 3)), period=draw(st.sampled_from((0, 1, 2, 3, 40))),
            write=draw(st.booleans()), imm=draw(st.booleans()))
    for _ in range(draw(st.sampled_from((0, 0, 0, 0, 1, 2)))):
        name = draw(st.sampled_from(dg.FIELDS))
        fields[name] = draw(st.just(0) | st.integers(0, (1 << WIDTHS[name]) - 1))
    if draw(_chance(6, 1)):
        # one rule of the validation broken on purpose (the CM spec's order decides)
        rule = draw(st.sampled_from(("ack", "resv", "both", "none", "port", "top", "req",
                                     "loc_ip")))
        if rule == "ack":
            fields[draw(st.sampled_from(("ack_valid", "ack_type")))] = 1
        elif rule == "resv":
            fields["tx_resv"] = draw(st.integers(1, 15))
        elif rule in ("both", "none"):
            fields["valid"] = fields["tx_valid"] = int(rule == "both")
        elif rule == "port":
            fields["reply_port"] = 0
        elif rule == "top":
            name = draw(st.sampled_from(("loc_qpn", "loc_psn", "rem_qpn", "rem_psn")))
            fields[name] |= draw(st.integers(1, 255)) << 24
        elif rule == "req":
            fields["valid"], fields["tx_valid"] = 1, 0
            fields["req_type"] = draw(st.sampled_from((0, 2, 6, 7)))
        else:
            fields["loc_ip"] ^= 1 << draw(st.integers(0, 31))
    sport = draw(st.sampled_from((REPLY_PORT, REPLY_PORT, proto.CM_UDP_PORT, 0)) | u24.map(
        lambda v: v & 0xFFFF))
    # the UDP checksum: not computed, right, or (1 in 10) wrong in one bit
    how = draw(st.sampled_from(("none", "none", "none", "right", "right", "right", "right",
                                "right", "right", "wrong")))
    if how == "none":
        return cm_frame(fields, host, sport=sport)
    right = udp_checksum(dg.pack(fields), src_ip=ip, dst_ip=LOCAL_IP, src_port=sport)
    if how == "wrong":
        right ^= 1 << draw(st.integers(0, 15))
    return cm_frame(fields, host, sport=sport, checksum=right)


@st.composite
def arp_frames(draw):
    sender = HOSTS[draw(st.integers(0, 2))]
    return arp_frame(sender=sender,
                     target=draw(st.sampled_from((LOCAL_IP, LOCAL_IP, OTHER_IP))),
                     dst=draw(st.sampled_from((BROADCAST, BROADCAST, LOCAL_MAC, OTHER_MAC))),
                     oper=draw(st.sampled_from((1, 1, 1, 2))),
                     pad=draw(st.sampled_from((18, 18, 0, 40))))


@st.composite
def roce_frames(draw, table=N_QP):
    """RoCEv2 frames with a good iCRC, to the engine (mostly) or elsewhere."""
    mac, ip = HOSTS[draw(st.integers(0, 2))]
    path = QPPath(src_mac=mac, dst_mac=draw(st.sampled_from((LOCAL_MAC, LOCAL_MAC, OTHER_MAC))),
                  src_ip=ip, dst_ip=draw(st.sampled_from((LOCAL_IP, LOCAL_IP, OTHER_IP))),
                  dest_qp=Q + draw(st.integers(0, table)), udp_sport=draw(u32) & 0xFFFF)
    kind = draw(st.sampled_from(("ack", "ack", "cnp", "send", "write")))
    if kind == "ack":
        return build_ack_frame(path, psn=draw(u24), msn=draw(u24),
                               syndrome=draw(st.sampled_from((proto.AETH_ACK_UNLIMITED, 0x60,
                                                              0x20))))
    if kind == "cnp":
        return build_cnp_frame(path)
    eth_f = {"dst": path.dst_mac, "src": mac}
    ip_f = {"flag_df": 1, "ttl": 64, "src": ip, "dst": path.dst_ip}
    udp_f = {"src_port": path.udp_sport, "dst_port": proto.ROCEV2_UDP_PORT}
    bth = {"dest_qp": path.dest_qp, "psn": draw(u24), "p_key": 0xFFFF}
    payload = draw(st.binary(min_size=0, max_size=80))
    if kind == "send":
        return build_frame(proto.Opcode.RC_SEND_ONLY, eth=eth_f, ip=ip_f, udp=udp_f, bth=bth,
                           payload=payload)
    return build_frame(proto.Opcode.RC_RDMA_WRITE_ONLY, eth=eth_f, ip=ip_f, udp=udp_f, bth=bth,
                       headers={"RETH": {"va": draw(u64), "r_key": draw(u32),
                                         "dma_length": len(payload)}}, payload=payload)


@st.composite
def other_frames(draw):
    """Traffic that is not the engine's: it leaves on ``rx_other`` untouched."""
    mac, ip = HOSTS[draw(st.integers(0, 2))]
    pay = draw(st.binary(min_size=0, max_size=120))
    if draw(_chance(8, 1)):
        pay *= draw(st.integers(2, 12))            # up to 1500 bytes now and then
    kind = draw(st.sampled_from(("udp_port", "icmp", "other_ip", "other_mac", "ipv6",
                                 "ethertype", "vlan", "bcast_ip")))
    if kind == "udp_port":
        port = draw(st.sampled_from((9999, 53, proto.CM_UDP_PORT + 1, proto.ROCEV2_UDP_PORT - 1)))
        return pad60(eth(LOCAL_MAC, mac, proto.ETHERTYPE_IPV4)
                     + ipv4(ip, LOCAL_IP, proto.IP_PROTO_UDP, udp(1234, port, pay)))
    if kind == "icmp":
        return pad60(eth(LOCAL_MAC, mac, proto.ETHERTYPE_IPV4)
                     + ipv4(ip, LOCAL_IP, 1, b"\x08\x00\x00\x00" + pay))
    if kind == "other_ip":
        dport = draw(st.sampled_from((proto.CM_UDP_PORT, proto.ROCEV2_UDP_PORT, 7)))
        return pad60(eth(LOCAL_MAC, mac, proto.ETHERTYPE_IPV4)
                     + ipv4(ip, OTHER_IP, proto.IP_PROTO_UDP, udp(1234, dport, pay)))
    if kind == "other_mac":
        return pad60(eth(OTHER_MAC, mac, proto.ETHERTYPE_IPV4)
                     + ipv4(ip, LOCAL_IP, proto.IP_PROTO_UDP, udp(1, proto.CM_UDP_PORT, pay)))
    if kind == "ipv6":
        u = udp(1234, proto.ROCEV2_UDP_PORT, pay)
        return eth(LOCAL_MAC, mac, proto.ETHERTYPE_IPV6) + proto.IPV6.pack(
            {"version": 6, "payload_length": len(u), "next_header": proto.IP_PROTO_UDP,
             "hop_limit": 64, "src": ip, "dst": LOCAL_IP}) + u
    if kind == "ethertype":
        return pad60(eth(LOCAL_MAC, mac, draw(st.sampled_from((0x88B5, 0x88CC, 0x0801))))
                     + pay)
    if kind == "vlan":
        return pad60(eth(LOCAL_MAC, mac, proto.ETHERTYPE_VLAN)[:12]
                     + proto.VLAN_TAG.pack({"tpid": proto.ETHERTYPE_VLAN, "vid": 5})
                     + proto.ETHERTYPE_IPV4.to_bytes(2, "big")
                     + ipv4(ip, LOCAL_IP, proto.IP_PROTO_UDP, udp(1, proto.CM_UDP_PORT, pay)))
    return pad60(eth(BROADCAST, mac, proto.ETHERTYPE_IPV4)
                 + ipv4(ip, 0xFFFFFFFF, proto.IP_PROTO_UDP, udp(1, 2, pay)))


@st.composite
def random_frames(draw):
    """Random bytes, or random bytes behind an Ethernet header to our MAC (IPv4 or ARP)."""
    if draw(st.booleans()):
        return draw(st.binary(min_size=1, max_size=160))
    et = draw(st.sampled_from((proto.ETHERTYPE_IPV4, proto.ETHERTYPE_ARP)))
    return eth(LOCAL_MAC, HOSTS[0][0], et) + draw(st.binary(min_size=0, max_size=120))


#: Headers whose fields :func:`mutate_field` changes, with their offsets in an untagged frame.
MUTABLE_HEADERS = ((proto.ETH, 0), (proto.IPV4, proto.ETH.size),
                   (proto.UDP, proto.ETH.size + proto.IPV4.size),
                   (proto.BTH, proto.ETH.size + proto.IPV4.size + proto.UDP.size),
                   (proto.ARP, proto.ETH.size))


def mutate_field(frame, draw):
    """One header field of ``frame`` set to a random value, 0, all ones, or +-1 (the header
    decoded and packed again with :mod:`roce_hw.proto`)."""
    header, off = draw(st.sampled_from(MUTABLE_HEADERS))
    if len(frame) < off + header.size:
        return bytes(frame)
    fields = header.unpack(bytes(frame), off)
    name, width = draw(st.sampled_from(header.fields))
    top = (1 << width) - 1
    how = draw(st.sampled_from(("random", "zero", "ones", "inc", "dec")))
    fields[name] = {"random": draw(st.integers(0, top)), "zero": 0, "ones": top,
                    "inc": (fields[name] + 1) & top, "dec": (fields[name] - 1) & top}[how]
    return bytes(frame[:off]) + header.pack(fields) + bytes(frame[off + header.size:])


def position(n):
    """An integer in ``range(n)``, spread more evenly than ``st.integers`` (which favours the
    low end)."""
    return st.integers(0, (1 << 24) - 1).map(lambda v: v % n)


@st.composite
def mutate(draw, frame):
    """Bit flips (anywhere, in the first 64 bytes -- the headers -- or in the last 32: payload,
    datagram, iCRC), random header bytes, header fields, truncation, extension; then maybe the
    IPv4 checksum, the lengths and the iCRC made consistent again."""
    f = bytearray(frame)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(("flip", "flip_head", "flip_head", "flip_tail", "byte_head",
                                   "field", "field", "cut", "extend")))
        if op in ("flip", "flip_head", "flip_tail"):
            span = len(f) if op == "flip" else min(len(f), 64 if op == "flip_head" else 32)
            bit = draw(position(8 * span)) + (8 * (len(f) - span) if op == "flip_tail" else 0)
            f[bit // 8] ^= 1 << (bit % 8)
        elif op == "byte_head":
            f[draw(position(min(len(f), 64)))] = draw(st.integers(0, 255))
        elif op == "field":
            f = bytearray(mutate_field(f, draw))
        elif op == "cut" and len(f) > 1:
            f = f[:1 + draw(position(len(f) - 1))]
        elif op == "extend":
            f += draw(st.binary(min_size=1, max_size=48))
    fix = draw(st.sampled_from(("none", "checksum", "lengths", "all")))
    if fix != "none":
        f = fix_frame(f, lengths=fix in ("lengths", "all"), icrc=fix == "all")
    return bytes(f)


@dataclass
class Item:
    """One received frame: its bytes, the MAC's bad flag, idle cycles after it."""
    frame: bytes
    bad: bool = False
    gap: int = 0


def kind_strategies(table=N_QP):
    return {"cm": cm_frames(table), "arp": arp_frames(), "roce": roce_frames(table),
            "other": other_frames(), "random": random_frames()}


KIND_STRATEGIES = {N_QP: kind_strategies(N_QP), VERILATOR_N_QP: kind_strategies(VERILATOR_N_QP)}


@st.composite
def items(draw, table=N_QP):
    """One frame of any kind, mutated 4 times in 10, flagged bad by the MAC once in 20."""
    kind = draw(st.sampled_from(("cm", "cm", "cm", "arp", "arp", "roce", "roce", "other",
                                 "other", "random")))
    frame = draw(KIND_STRATEGIES[table][kind])
    if draw(_chance(10, 4)):
        frame = draw(mutate(frame))
    return Item(frame, bad=draw(_chance(20, 1)), gap=draw(GAPS))


GAPS = st.sampled_from((0, 0, 0, 1, 2, 5, 13, 40))


@st.composite
def sessions(draw, rows):
    """What a host does to get traffic: OPEN (of a named QP, or by table scan), MODIFY_QP_RTS,
    a generator run, then maybe a stop or CLOSE -- valid requests with one set of parameters,
    cut short at a random step, a frame mutated now and then. ``rows`` (the QP table as the
    model has it now) steers the host, most of the time, to a QP that is free or its own, so
    that sessions get far; the rest of the time to any QP."""
    host = HOSTS[draw(st.sampled_from((0, 0, 1, 1, 2)))]
    ip = host[1]
    mine = [i for i, r in enumerate(rows) if not r["state"] or r["remote_ip"] == ip]
    if mine and draw(_chance(4, 3)):
        index = draw(st.sampled_from(mine))
    else:
        index = draw(st.integers(0, N_QP - 1))
    eq = Q + index
    own = rows[index]["state"] and rows[index]["remote_ip"] == ip
    qpn = rows[index]["remote_qpn"] if own and draw(_chance(4, 3)) else \
        draw(st.sampled_from(LOC_QPNS))
    common = dict(loc_ip=ip, qpn=qpn, psn=draw(u24), r_key=draw(u32), base_addr=draw(u64),
                  engine_psn=draw(u24))
    free = [i for i, r in enumerate(rows) if not r["state"]]
    scan = not own and free and free[0] == index and draw(_chance(2, 1))
    steps = [dg.open_request(**common, engine_qpn=0 if scan else eq),
             dg.rts_request(**common, engine_qpn=eq),
             dg.txmeta_request(
                 loc_ip=ip, engine_qpn=eq, qpn=qpn,
                 length=draw(st.sampled_from((0, 1, 4, 64, 1024, 1025)) | st.integers(0, 2100)),
                 count=draw(st.integers(1, 3)), period=draw(st.sampled_from((0, 1, 2, 3, 40))),
                 write=draw(st.booleans()), imm=draw(st.booleans()))]
    end = draw(st.sampled_from(("close", "none", "stop", "close", "fetch")))
    if end == "stop":
        steps.append(dg.txmeta_request(loc_ip=ip, engine_qpn=eq, qpn=qpn, start=False))
    elif end == "close":
        steps.append(dg.close_request(loc_ip=ip, engine_qpn=eq, qpn=qpn))
    elif end == "fetch":
        steps.append(dg.info_request(loc_ip=ip, engine_qpn=eq))
    first = 1 if own and rows[index]["state"] == proto.QPState.RTS and draw(_chance(2, 1)) \
        else 0
    last = len(steps) if draw(_chance(3, 2)) else draw(st.integers(first + 1, len(steps)))
    steps = steps[first:last]
    out = []
    for fields in steps:
        frame = cm_frame(fields, host)
        if draw(_chance(10, 1)):
            frame = draw(mutate(frame))
        out.append(Item(frame, gap=draw(GAPS)))
    return out


def guide_model(n_qp=N_QP):
    """The model that steers :func:`sessions` while a sequence is drawn."""
    return EngineModel(n_qp, local_mac=LOCAL_MAC, local_ip=LOCAL_IP)


@st.composite
def sequences(draw, min_size, max_size, table=N_QP):
    """``(prefix frames, body items, p_idle, seed, p_stall)``: the body is single frames and
    host sessions, ``min_size`` to ``max_size`` frames; ``p_idle`` is the chance of an idle
    cycle before a beat on ``rx``, ``p_stall`` of ``tx.ready`` low in a cycle. For a QP table
    of ``table`` rows (more than N_QP: the prefix starts with :func:`filler_frames`)."""
    prefix = filler_frames(table) + draw(prefixes())
    guide = guide_model(table)
    for f in prefix:
        guide.receive(f)
    body = []
    while len(body) < min_size or (len(body) < max_size and draw(_chance(max_size, max_size - 3))):
        new = draw(sessions(guide.rows)) if draw(_chance(4, 1)) else [draw(items(table))]
        for it in new:
            guide.receive(it.frame, bad=it.bad)
        body += new
    return (prefix, body[:max_size], draw(st.sampled_from((0.0, 0.0, 0.05))),
            draw(st.integers(0, 2 ** 32 - 1)), draw(st.sampled_from((0.0, 0.0, 0.3))))


def final_open():
    """The last frame of every sequence: a valid OPEN from a host never seen before."""
    return cm_frame(dg.open_request(loc_ip=NEW_HOST[1], qpn=0xFEDCBA, psn=0x123, r_key=0x55,
                                    base_addr=0x1000, engine_psn=0x456), NEW_HOST)


# -- the oracle: the frame-level model ---------------------------------------------------------
def tx_kind(frame):
    """``"arp"``, ``"cm"`` (a CM reply: UDP source port 0x4321) or ``"data"``."""
    if len(frame) >= 14 and int.from_bytes(frame[12:14], "big") == proto.ETHERTYPE_ARP:
        return "arp"
    if len(frame) >= 42 and int.from_bytes(frame[12:14], "big") == proto.ETHERTYPE_IPV4 and \
            int.from_bytes(frame[34:36], "big") == proto.CM_UDP_PORT:
        return "cm"
    return "data"


def gen_cost_ok(dgram):
    n, length, period = dgram["tx_n_transfers"], dgram["tx_dma_length"], dgram["tx_period"]
    return n <= GEN_MAX_COUNT and n * length <= GEN_MAX_BYTES and period <= GEN_MAX_PERIOD


@dataclass
class Prediction:
    """What the model says about a plan of frames."""
    items: list                                     #: the frames kept (see :func:`predict`)
    kinds: list                                     #: classify() kind of each
    tx_before: list                                 #: model tx frames before frame k
    tx_cycles: list                                 #: rough cycles the tx of frame k takes
    tx: dict = field(default_factory=dict)          #: kind -> [(input index, frame)]
    other: list = field(default_factory=list)       #: [(input index, frame)]
    model: EngineModel = None
    left_out: int = 0


def predict(plan, cfg):
    """Run the model over ``plan`` (a list of :class:`Item`); a txmeta datagram that would
    start a run longer than the GEN_MAX_* limits is left out of the plan (counted)."""
    m = EngineModel(cfg.n_qp, local_mac=LOCAL_MAC, local_ip=LOCAL_IP, cm_pmtu=cfg.cm_pmtu,
                    ttl=cfg.ttl, ack_req_every=cfg.ack_req_every, ip_id_start=cfg.ip_id_start,
                    rx_other=cfg.rx_other)
    p = Prediction([], [], [], [], {"arp": [], "cm": [], "data": []})
    n_tx = 0
    nbytes = cfg.data_width // 8
    for it in plan:
        res = classify(it.frame, bad=it.bad, local_mac=LOCAL_MAC, local_ip=LOCAL_IP)
        if res.kind == "cm":
            d = res.fields["dgram"]
            if d["tx_valid"] and d["tx_start"] and not gen_cost_ok(d):
                trial = copy.deepcopy(m.cm)
                trial.handle(dg.pack(d), res.fields["src_mac"], res.fields["src_ip"],
                             res.fields["src_port"], res.fields["udp_checksum"])
                if trial.generator is not None and m.cm.generator is None:
                    p.left_out += 1
                    continue
        k = len(p.items)
        p.items.append(it)
        p.kinds.append(res.kind)
        p.tx_before.append(n_tx)
        tx, other = m.receive(it.frame, bad=it.bad)
        cycles = 0
        for f in tx:
            p.tx[tx_kind(f)].append((k, f))
            cycles += -(-len(f) // nbytes) + 4
        if res.kind == "cm" and tx:
            d = res.fields["dgram"]
            cycles += d["tx_period"] * d["tx_n_transfers"] if d["tx_start"] else 0
        p.tx_cycles.append(cycles)
        n_tx += len(tx)
        p.other += [(k, o) for o in other]
    p.tx_before.append(n_tx)
    p.model = m
    return p


# -- the hardware harness ----------------------------------------------------------------------
class EngineHarness:
    """One simulation of :class:`RoceEngine` per build, run again from the power-on state for
    every script (:meth:`run`): one testbench drives ``rx`` (a beat per cycle, with idle cycles
    before a beat at random when ``p_idle`` is given, random bytes beyond ``keep``, ``abort``
    on the last beat of a bad frame) and collects ``tx``, ``rx_other`` and ``status`` every
    cycle (``ready`` 1; ``tx.ready`` low at random when ``p_stall`` is given, and held low
    between ``("tx_ready", 0)`` and ``("tx_ready", 1)``).

    Steps: ``("send", Item)``; ``("quiet", tx_frames, timeout, label)``: wait until ``tx``
    brought at least ``tx_frames`` frames (``(kind, n)``: ``n`` frames of that :func:`tx_kind`;
    ``None``: until ``tx`` and ``rx_other`` were idle for 100 cycles), every frame sent is counted (``rx_frames``) and every CM datagram taken is
    counted by the CM -- at most ``timeout`` cycles, else the label is noted in
    :attr:`timeouts`; ``("idle", n)``; ``("table", name)``: read the QP table through the
    management port into ``tables[name]`` and note the frames sent so far in ``marks[name]``;
    ``("tx_ready", 0 or 1)``. At the end the counters are read."""

    def __init__(self, width, n_qp):
        from amaranth.sim import Simulator
        from roce_hw.engine import RoceEngine
        self.cfg = EngineConfig(data_width=width, n_qp=n_qp)
        self.dut = RoceEngine(self.cfg)
        self.nbytes = width // 8
        self.sim = Simulator(self.dut)
        self.sim.add_clock(1e-8)
        self.sim.add_testbench(self._bench)
        self.runs = 0
        self._start(0, 0.0, [])

    def _start(self, seed, p_idle, script, p_stall=0.0):
        self.rng = random.Random(seed)
        self.p_idle = p_idle
        self.p_stall = p_stall
        self.tx_hold = False
        self.script = list(script)
        self.cycle = 0
        self.sent = 0
        self.tx, self.tx_aborted, self.other, self.statuses = [], 0, [], []
        self.timeouts, self.tables, self.marks = [], {}, {}
        self.counters = {}
        self.seconds = 0.0
        self._quiet = 0

    async def _bench(self, ctx):
        dut = self.dut
        n = self.nbytes
        ctx.set(dut.local_mac, LOCAL_MAC)
        ctx.set(dut.local_ip, LOCAL_IP)
        ctx.set(dut.tx.ready, 1)
        ctx.set(dut.rx_other.ready, 1)
        ctx.set(dut.status.ready, 1)
        outs = (dut.tx.valid, dut.tx.ready, dut.tx.payload, dut.rx_other.valid,
                dut.rx_other.payload, dut.status.valid, dut.status.payload)
        cur = {"tx": bytearray(), "other": bytearray()}

        async def step():
            ctx.set(dut.tx.ready, not self.tx_hold and not (
                self.p_stall and self.rng.random() < self.p_stall))
            _, _, tv, tr, tp, ov, op, sv, sp = await ctx.tick().sample(*outs)
            self.cycle += 1
            moved = False
            if tv and tr:
                moved = True
                cur["tx"] += int(tp.data).to_bytes(n, "little")[:int(tp.keep).bit_length()]
                if tp.last:
                    if tp.abort:
                        self.tx_aborted += 1
                    else:
                        self.tx.append((self.cycle, bytes(cur["tx"])))
                    cur["tx"] = bytearray()
            if ov:
                moved = True
                cur["other"] += int(op.data).to_bytes(n, "little")[:int(op.keep).bit_length()]
                if op.last:
                    self.other.append((self.cycle, bytes(cur["other"])))
                    cur["other"] = bytearray()
            if sv:
                self.statuses.append({"wr_id": int(sp.wr_id), "qp": int(sp.qp),
                                      "status": int(sp.status)})
            self._quiet = 0 if moved else self._quiet + 1

        def settled():
            rx_frames = ctx.get(dut.counters.rx.rx_frames)
            taken = ctx.get(dut.counters.rx.cm)
            raw = ctx.get(dut.counters.cm).as_value().value
            done = sum((raw >> (32 * k)) & 0xFFFFFFFF for k in range(len(CM_COUNTERS)))
            return rx_frames == self.sent and done == taken

        async def send(it):
            data = it.frame
            beats = [data[i:i + n] for i in range(0, len(data), n)]
            for k, chunk in enumerate(beats):
                while self.p_idle and self.rng.random() < self.p_idle:
                    ctx.set(dut.rx.valid, 0)
                    await step()
                last = k == len(beats) - 1
                junk = self.rng.getrandbits(8 * (n - len(chunk))) if len(chunk) < n else 0
                ctx.set(dut.rx.payload, {
                    "data": int.from_bytes(chunk, "little") | (junk << (8 * len(chunk))),
                    "keep": (1 << len(chunk)) - 1, "first": int(k == 0), "last": int(last),
                    "abort": int(last and it.bad)})
                ctx.set(dut.rx.valid, 1)
                assert ctx.get(dut.rx.ready), f"cycle {self.cycle}: rx.ready is 0"
                await step()
            ctx.set(dut.rx.valid, 0)
            self.sent += 1
            self._quiet = 0
            for _ in range(it.gap):
                await step()

        async def quiet(want, timeout, label):
            end = self.cycle + timeout
            while self.cycle < end:
                if want is None:
                    if self._quiet >= 100 and settled():
                        return
                elif self.cycle % 2 == 0 and settled() and (
                        len(self.tx) >= want if isinstance(want, int) else
                        sum(tx_kind(f) == want[0] for _, f in self.tx) >= want[1]):
                    return
                await step()
            self.timeouts.append(label)

        async def read_table(name):
            rows = []
            from roce_hw.layouts import QP_CONTEXT
            for q in range(self.cfg.n_qp):
                ctx.set(dut.qp_mgmt_req.payload, {"qp": q, "write": 0})
                ctx.set(dut.qp_mgmt_req.valid, 1)
                while True:
                    ready = ctx.get(dut.qp_mgmt_req.ready)
                    await step()
                    if ready:
                        break
                ctx.set(dut.qp_mgmt_req.valid, 0)
                ctx.set(dut.qp_mgmt_rsp.ready, 1)
                while True:
                    valid = ctx.get(dut.qp_mgmt_rsp.valid)
                    rsp = ctx.get(dut.qp_mgmt_rsp.payload)
                    await step()
                    if valid:
                        break
                ctx.set(dut.qp_mgmt_rsp.ready, 0)
                assert not rsp.error and int(rsp.qp) == q, (q, rsp)
                row = struct_to_dict(QP_CONTEXT, rsp.ctx)
                rows.append({k: row[k] for k, _ in proto.QP_CONTEXT_FIELDS})
            self.tables[name] = rows
            self.marks[name] = len(self.tx)

        for s in self.script:
            if s[0] == "send":
                await send(s[1])
            elif s[0] == "quiet":
                await quiet(*s[1:])
            elif s[0] == "idle":
                for _ in range(s[1]):
                    await step()
            elif s[0] == "table":
                await read_table(s[1])
            elif s[0] == "tx_ready":
                self.tx_hold = not s[1]
            else:
                raise ValueError(s)
        self.counters = struct_to_dict(dut.counters.shape(), ctx.get(dut.counters))

    def run(self, script, *, seed=0, p_idle=0.0, p_stall=0.0):
        """Run ``script`` from the power-on state (:meth:`Simulator.reset` restores every
        signal and memory: the same as a new simulation, without elaborating again)."""
        if self.runs:
            self.sim.reset()
        self.runs += 1
        self._start(seed, p_idle, script, p_stall)
        t0 = time.monotonic()
        self.sim.run()             # until the testbench returns (every wait has a time limit)
        self.seconds = time.monotonic() - t0
        return self


class BackendHarness:
    """:class:`EngineHarness`'s scripts on a back end of :mod:`sim.backend` (the whole engine,
    ``roce_engine``; the Verilator back end in the default suite), driven in slices of cycles,
    a fresh engine for every script. The same steps and results, with these differences:

    * ``rx`` idle (``p_idle``) and ``tx`` stalls (``p_stall``) are the back end's per-stream
      generators (seeded by the script's ``seed``), and ``rx`` carries zeros beyond ``keep``;
    * ``rx.ready`` must be high in every cycle a beat is offered: each frame is given exactly
      the cycles its beats and the ``rx`` stream's idle draws take (the generator replayed
      here, :class:`sim.backend.Splitmix64`), and must be in after them;
    * ``("tx_ready", 0)`` sets the ``tx`` stall probability to its maximum (ready high in 1
      cycle in 2**32) and ``("tx_ready", 1)`` checks that ``ready`` stayed low meanwhile;
    * a ``("quiet", ...)`` step is checked every :attr:`STEP` cycles (``None``: ``tx`` silent
      for 100 cycles, as the back end counts it, and everything counted);
    * every frame on ``tx`` and ``rx_other`` must have good framing (no ``keep`` hole, full
      beats before the last, no empty beat)."""

    STEP = 8

    def __init__(self, width, n_qp, backend="verilator"):
        self.cfg = EngineConfig(data_width=width, n_qp=n_qp)
        self.backend = backend
        self.nbytes = width // 8

    def run(self, script, *, seed=0, p_idle=0.0, p_stall=0.0):
        """Run ``script`` on a fresh engine, closed when done, also on a failure (Verilator's
        thread context is left dangling when the newest of several live engines of a library
        is destroyed, and destroying another one afterwards hangs or crashes the process -- as
        an engine kept alive by the traceback of a failed example would be, later)."""
        from sim.backend import open_engine
        with open_engine(self.cfg, backend=self.backend, seed=seed) as eng:
            return self._run(eng, script, seed, p_idle, p_stall)

    def _run(self, eng, script, seed, p_idle, p_stall):
        from sim.backend import STREAMS, Splitmix64, framing_errors, threshold
        eng.set_addr(LOCAL_MAC, LOCAL_IP)
        rx_draws = Splitmix64(seed, STREAMS.index("rx"))
        rx_draws.threshold = threshold(p_idle)
        eng.set_random(rx=p_idle, tx=p_stall)
        self.tx, self.tx_aborted, self.other, self.statuses = [], 0, [], []
        self.timeouts, self.tables, self.marks = [], {}, {}
        self.sent = 0
        held = None
        n = self.nbytes
        t0 = time.monotonic()

        def collect():
            for f in eng.pop_tx():
                assert not f.errors, f"tx frame ending in cycle {f.last}: " + \
                    ", ".join(framing_errors(f.errors))
                if f.tuser:
                    self.tx_aborted += 1
                else:
                    self.tx.append((f.last, f.data))
            for f in eng.pop_rx_other():
                assert not f.errors and not f.tuser, f"rx_other frame ending in cycle " \
                    f"{f.last}: " + ", ".join(framing_errors(f.errors))
                self.other.append((f.last, f.data))
            self.statuses += [{k: r[k] for k in ("wr_id", "qp", "status")}
                              for r in eng.pop_status()]

        def settled():
            c = eng.counters()
            return c["rx_rx_frames"] == self.sent and \
                sum(c["cm_" + k] for k in CM_COUNTERS) == c["rx_cm"]

        def quiet(want, timeout, label):
            end = eng.cycle + timeout
            while True:
                collect()
                left = end - eng.cycle
                if want is None:
                    # tx silent for 100 cycles (run() stops as soon as it is: at once when
                    # it already is) and everything counted
                    if left > 0:
                        k = min(left, 100)
                        if eng.run(k, quiet=100) < k:
                            collect()
                            if settled():
                                return
                            eng.run(max(0, min(self.STEP, end - eng.cycle)))
                        continue
                else:
                    if isinstance(want, int):
                        enough = len(self.tx) >= want
                    else:
                        enough = sum(tx_kind(f) == want[0] for _, f in self.tx) >= want[1]
                    if enough and settled():
                        return
                    if left > 0:
                        eng.run(min(self.STEP, left))
                        continue
                self.timeouts.append(label)
                return

        def send(it):
            beats = -(-len(it.frame) // n)
            cycles = beats
            for _ in range(beats):
                while rx_draws.draw():
                    cycles += 1
            eng.push_rx(it.frame, cycle=eng.cycle, tuser=int(it.bad))
            eng.run(cycles)
            assert not eng.count("rx_pending"), \
                f"cycle {eng.cycle}: rx.ready was low (a frame of {beats} beats not in after " \
                f"{cycles} cycles)"
            self.sent += 1
            eng.run(it.gap)

        def read_table(name):
            rows = eng.qp_table()
            assert [r["qp"] for r in rows] == list(range(self.cfg.n_qp)), rows
            assert not any(r["error"] for r in rows), rows
            self.tables[name] = [{k: r["ctx"][k] for k, _ in proto.QP_CONTEXT_FIELDS}
                                 for r in rows]
            collect()
            self.marks[name] = len(self.tx)

        for step in script:
            if step[0] == "send":
                send(step[1])
            elif step[0] == "quiet":
                quiet(*step[1:])
            elif step[0] == "idle":
                eng.run(step[1])
            elif step[0] == "table":
                read_table(step[1])
            elif step[0] == "tx_ready":
                if step[1]:
                    assert held is not None and eng.count("tx_ready_cycles") == held, \
                        "tx.ready was not held low"
                    held = None
                    eng.set_random(rx=p_idle, tx=p_stall)
                else:
                    eng.set_random(rx=p_idle, tx=1.0 - 2.0 ** -32)
                    held = eng.count("tx_ready_cycles")
            else:
                raise ValueError(step)
        collect()
        flat = eng.counters()
        self.counters = {block: {name[len(block) + 1:]: v for name, v in flat.items()
                                 if name.startswith(block + "_")}
                         for block in ("tx", "rx", "cm")}
        self.cycle = eng.cycle
        self.seconds = time.monotonic() - t0
        return self


_HARNESSES = {}


def harness(width, n_qp=N_QP, backend="amaranth"):
    """One :class:`EngineHarness` per build, reused by every example (Amaranth), or a
    :class:`BackendHarness` (``backend="verilator"``)."""
    key = (width, n_qp, backend)
    if key not in _HARNESSES:
        _HARNESSES[key] = EngineHarness(width, n_qp) if backend == "amaranth" else \
            BackendHarness(width, n_qp, backend)
    return _HARNESSES[key]


# -- the fuzz run ------------------------------------------------------------------------------
def _hex(b):
    return bytes(b).hex()


def cm_reply_fields(frame):
    return dg.unpack(frame[42:42 + dg.SIZE])


def obeyed_qp(fields):
    """The QP index an ACK reply to a row-writing request (OPEN/MODIFY/CLOSE/txmeta) names,
    else ``None``."""
    if fields["ack_type"] != proto.CmAck.ACK:
        return None
    if fields["valid"] and fields["req_type"] == proto.CmReq.FETCH_QP_INFO:
        return None
    return fields["loc_qpn"] - Q


STATS = {"examples": 0, "frames": 0, "seconds": 0.0, "cycles": 0, "left_out": 0, "data": 0,
         "replies": 0,
         "rx": dict.fromkeys(OUTCOMES, 0), "cm": dict.fromkeys(CM_COUNTERS, 0)}


def run_sequence(width, prefix, body, p_idle, seed, p_stall=0.0, *, n_qp=N_QP,
                 backend="amaranth"):
    """Simulate ``prefix`` + ``body`` + :func:`final_open` and check everything (see the module
    docstring) on ``backend`` (``"verilator"``: :class:`BackendHarness`). Returns the
    harness."""
    cfg = EngineConfig(data_width=width, n_qp=n_qp)
    plan = [Item(f) for f in prefix] + list(body) + [Item(final_open())]
    pred = predict(plan, cfg)
    items = pred.items
    n_prefix = len(prefix)             # the prefix is never left out (no txmeta in it)
    script = []
    for k, it in enumerate(items):
        if k == n_prefix:
            script += [("quiet", pred.tx_before[k], 4000, f"before the body (frame {k})"),
                       ("idle", 20), ("table", "start")]
        if pred.kinds[k] in ("arp", "cm"):
            # a host waits for the answers to what it sent before (and for the generator run)
            since = max([j for j in range(k) if pred.kinds[j] in ("arp", "cm")], default=0)
            budget = 2000 + 4 * sum(pred.tx_cycles[since:k])
            script.append(("quiet", pred.tx_before[k], budget, f"before frame {k}"))
        script.append(("send", it))
    script += [("quiet", pred.tx_before[-1], 2000 + 4 * pred.tx_cycles[-1], "at the end"),
               ("idle", 150), ("table", "end")]
    h = harness(width, n_qp, backend).run(script, seed=seed, p_idle=p_idle, p_stall=p_stall)
    m = pred.model

    def where(k):
        it = items[k]
        return f"input frame {k} (bad={it.bad}, {len(it.frame)} bytes): {_hex(it.frame)}"

    # every frame the engine sent, kind by kind, in order
    got = {"arp": [], "cm": [], "data": []}
    for _, f in h.tx:
        got[tx_kind(f)].append(f)
    for kind, want in pred.tx.items():
        for i, (g, (k, w)) in enumerate(zip(got[kind], want)):
            assert g == w, (f"{kind} frame {i} differs; from {where(k)}\n expected {_hex(w)}\n"
                            f" got      {_hex(g)}")
        if len(got[kind]) != len(want):
            k = want[len(got[kind])][0] if len(want) > len(got[kind]) else None
            raise AssertionError(f"{len(got[kind])} {kind} frames sent, the model says "
                                 f"{len(want)}" + (f"; first missing from {where(k)}"
                                                   if k is not None else
                                                   f"; extra: {_hex(got[kind][len(want)])}"))
    others = [f for _, f in h.other]
    for i, (g, (k, w)) in enumerate(zip(others, pred.other)):
        assert g == w, f"rx_other frame {i} differs; from {where(k)}\n got {_hex(g)}"
    assert len(others) == len(pred.other), (len(others), len(pred.other))
    assert not h.timeouts, f"engine did not answer in time: {h.timeouts}"
    # the final QP table and the counters
    want_rows = [{k: int(m.rows[q][k]) for k, _ in proto.QP_CONTEXT_FIELDS} for q in range(n_qp)]
    for q in range(n_qp):
        assert h.tables["end"][q] == want_rows[q], \
            f"QP {q} differs: got {h.tables['end'][q]}, the model has {want_rows[q]}"
    for block in ("rx", "cm"):
        diff = {k: (v, m.counters[block][k]) for k, v in h.counters[block].items()
                if v != m.counters[block][k]}
        assert not diff, f"{block} counters differ (got, model): {diff}"
    # the properties, without the model
    rx, cm = h.counters["rx"], h.counters["cm"]
    assert rx["rx_frames"] == len(items) == sum(rx[k] for k in OUTCOMES), rx
    assert sum(cm.values()) == rx["cm"], (cm, rx)
    assert rx["arp_full"] == rx["cm_full"] == rx["roce_full"] == rx["other_dropped"] == 0, rx
    assert h.counters["tx"]["frames"] == len(got["data"])
    assert h.counters["tx"]["frames_aborted"] == h.counters["tx"]["wrs_refused"] == 0
    assert h.tx_aborted == 0 and h.statuses == []
    replies = [cm_reply_fields(f) for _, f in h.tx[h.marks["start"]:] if tx_kind(f) == "cm"]
    named = {obeyed_qp(r) for r in replies}
    for q in range(n_qp):
        if q not in named:
            assert h.tables["end"][q] == h.tables["start"][q], \
                f"QP {q} changed, but no obeyed request named it"
    last = replies[-1]
    assert last["rem_qpn"] == 0xFEDCBA and last["rem_ip"] == NEW_HOST[1], last
    if last["ack_type"] == proto.CmAck.NO_QP:
        assert all(r["state"] != proto.QPState.RESET for r in h.tables["end"])
    else:
        assert last["ack_type"] == proto.CmAck.ACK, last
        row = h.tables["end"][last["loc_qpn"] - Q]
        assert (row["state"], row["remote_ip"], row["remote_qpn"]) == \
            (proto.QPState.INIT, NEW_HOST[1], 0xFEDCBA)
    STATS["examples"] += 1
    STATS["frames"] += len(items)
    STATS["seconds"] += h.seconds
    STATS["cycles"] += h.cycle
    STATS["left_out"] += pred.left_out
    STATS["data"] += len(got["data"])
    STATS["replies"] += len(got["cm"]) + len(got["arp"])
    for k in OUTCOMES:
        STATS["rx"][k] += rx[k]
    for k in CM_COUNTERS:
        STATS["cm"][k] += cm[k]
    return h


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    if STATS["examples"]:
        print(f"\nengine fuzz: {STATS['examples']} sequences, {STATS['frames']} frames, "
              f"{STATS['cycles']} cycles, {STATS['seconds']:.1f} s simulated; "
              f"{STATS['data']} data frames and {STATS['replies']} replies out, "
              f"{STATS['left_out']} long generator runs left out\n  rx {STATS['rx']}\n"
              f"  cm {STATS['cm']}")


@pytest.fixture(autouse=True)
def _build_once(monkeypatch):
    """Every :class:`BackendHarness` run opens a fresh engine, and ``sim.verilator.build`` hashes
    the emitted Verilog and runs ``verilator --version`` at every open (0.1 s): look the library
    up once per configuration in this module."""
    import sim.verilator
    real = sim.verilator.build

    def build(config, *, top="engine", log=None, jobs=None):
        if (config, top) not in _LIBRARIES:
            _LIBRARIES[config, top] = real(config, top=top, log=log, jobs=jobs)
        return _LIBRARIES[config, top]
    monkeypatch.setattr(sim.verilator, "build", build)


_LIBRARIES = {}


@pytest.mark.slow
@settings(FUZZ, max_examples=12)
@given(sequences(20, 40))
def test_fuzz_engine_64(seq):
    """A few hundred random and mutated frames at 64 bits (12 sequences), RoceEngine with 4 QPs
    in Amaranth's simulator; the default suite runs :func:`test_fuzz_engine_verilator`."""
    run_sequence(64, *seq)


#: Sequences per width of :func:`test_fuzz_engine_verilator`.
VERILATOR_EXAMPLES = 30
#: No shrinking on Verilator: in the 5 minutes hypothesis gives it, it would try some 1,500
#: sequences (0.2 s each) and its record of them grows by about 1 MB a sequence. A failure names
#: the input frame and the bytes that differ; the falsifying example is printed as drawn.
VERILATOR_PHASES = (Phase.explicit, Phase.reuse, Phase.generate)


@pytest.mark.tools("verilator")
@pytest.mark.parametrize("width", [64, 512])
def test_fuzz_engine_verilator(width):
    """The fuzz sequences on the whole engine compiled by Verilator, 16 QPs (rows 4 to 15
    FILLER's, the sequences work on rows 0 to 3 as with 4 QPs): 30 sequences a width (about 900
    frames besides the set-up)."""
    @settings(FUZZ, max_examples=VERILATOR_EXAMPLES, phases=VERILATOR_PHASES)
    @given(sequences(20, 40, VERILATOR_N_QP))
    def run(seq):
        run_sequence(width, *seq, n_qp=VERILATOR_N_QP, backend="verilator")
    before = STATS["frames"]
    run()
    assert STATS["frames"] - before >= VERILATOR_EXAMPLES * 20


@pytest.mark.slow
@pytest.mark.parametrize("width,examples", [(64, 90), (512, 90)])
def test_fuzz_engine_slow(width, examples):
    """More than 10,000 frames in total: at 64 and 512 bits, 90 sequences of 40 to 100 frames
    each (plus prefix and last OPEN), other sequences for each width (fixed seeds)."""
    @seed(20_000 + width)
    @settings(FUZZ, derandomize=False, max_examples=examples)
    @given(sequences(40, 100))
    def run(seq):
        run_sequence(width, *seq)
    before = STATS["frames"]
    run()
    assert STATS["frames"] - before >= 5000          # the budget of the issue is kept


# -- flooding: queue overflows are counted -----------------------------------------------------
def _flood_frames(n_cm, n_arp):
    """Tagged CM requests on QP 0 (FETCH_QP_INFO and MODIFY_QP_RTS from its owner A, tag k in
    ``tx_period``, echoed by every reply) and ARP requests (tag k in the sender's address),
    interleaved; ``[(kind, tag, frame)]``."""
    out = []
    mac, ip = HOSTS[0]
    for k in range(max(n_cm, n_arp)):
        if k < n_cm:
            if k % 2:
                d = dg.rts_request(loc_ip=ip, engine_qpn=Q, qpn=LOC_QPNS[0], psn=k,
                                   engine_psn=0x1000 + k)
            else:
                d = dg.info_request(loc_ip=ip, engine_qpn=Q)
            d["tx_period"] = k + 1
            out.append(("cm", k + 1, cm_frame(d, HOSTS[0])))
        if k < n_arp:
            out.append(("arp", k + 1, arp_frame(sender=(0x02_00_00_00_10_00 + k + 1,
                                                        0x0A_00_01_00 + k + 1))))
    return out


#: ``(width, n_qp, backend)`` of the tests that run one build on both back ends: the Verilator
#: builds of the default suite (16 QPs), and RoceEngine with 4 QPs in Amaranth's simulator
#: (``--slow``).
BUILDS = [pytest.param(64, VERILATOR_N_QP, "verilator", marks=pytest.mark.tools("verilator"),
                         id="verilator-64"),
            pytest.param(512, VERILATOR_N_QP, "verilator",
                         marks=pytest.mark.tools("verilator"), id="verilator-512"),
            pytest.param(64, N_QP, "amaranth", marks=pytest.mark.slow, id="amaranth-64"),
            pytest.param(512, N_QP, "amaranth", marks=pytest.mark.slow, id="amaranth-512")]


@pytest.mark.parametrize("width, n_qp, backend", BUILDS)
def test_flood_is_counted(width, n_qp, backend):
    """CM datagrams and ARP requests back to back while the MAC holds ``tx`` (the replies
    cannot leave): the queues overflow, and every frame is either answered or counted as
    ``cm_full``/``arp_full``; the datagrams that got through are answered exactly as the model
    answers that subsequence (rows included); afterwards a valid OPEN works."""
    n_cm, n_arp = 48, 48          # more than the queues hold (rx_cm_depth, rx_arp_depth: 32)
    mac, ip = HOSTS[0]
    setup = [cm_frame(dg.open_request(loc_ip=ip, qpn=LOC_QPNS[0], psn=5, r_key=0x77,
                                      base_addr=0x5000, engine_psn=0x100, engine_qpn=Q),
                      HOSTS[0]),
             cm_frame(dg.rts_request(loc_ip=ip, engine_qpn=Q, qpn=LOC_QPNS[0], psn=6,
                                     r_key=0x78, base_addr=0x6000, engine_psn=0x200),
                      HOSTS[0])]
    flood = _flood_frames(n_cm, n_arp)
    script = []
    for f in setup:
        script += [("quiet", None, 5000, "setup"), ("send", Item(f))]
    script += [("quiet", None, 5000, "before the flood"), ("table", "start"), ("tx_ready", 0)]
    script += [("send", Item(f)) for _, _, f in flood]
    script += [("idle", 300), ("tx_ready", 1), ("quiet", None, 20000, "after the flood"),
               ("table", "flood"), ("send", Item(final_open())),
               ("quiet", None, 5000, "final OPEN"), ("table", "end")]
    h = harness(width, n_qp, backend).run(script, seed=width)
    assert not h.timeouts, h.timeouts
    rx, cm = h.counters["rx"], h.counters["cm"]
    total = len(setup) + len(flood) + 1
    assert rx["rx_frames"] == total == sum(rx[k] for k in OUTCOMES), rx
    assert rx["cm"] + rx["cm_full"] == n_cm + len(setup) + 1, rx
    assert rx["arp"] + rx["arp_full"] == n_arp, rx
    assert rx["cm_full"] > 0 and rx["arp_full"] > 0, rx          # the test did overflow
    assert sum(cm.values()) == rx["cm"], (cm, rx)
    # which tagged frames got through, from the replies (tags strictly increasing)
    replies = [f for _, f in h.tx[h.marks["start"]:h.marks["flood"]]]
    cm_tags = [cm_reply_fields(f)["tx_period"] for f in replies if tx_kind(f) == "cm"]
    arp_tags = [proto.ARP.unpack(f, proto.ETH.size)["tpa"] - 0x0A_00_01_00
                for f in replies if tx_kind(f) == "arp"]
    assert len(cm_tags) == rx["cm"] - len(setup) - 1 and len(arp_tags) == rx["arp"]
    assert cm_tags == sorted(set(cm_tags)) and arp_tags == sorted(set(arp_tags))
    assert all(tx_kind(f) != "data" for f in replies)
    # the model, given the frames that got through, answers the same, byte for byte
    taken = [f for kind, tag, f in flood
             if tag in (cm_tags if kind == "cm" else arp_tags)]
    pred = predict([Item(f) for f in setup + taken + [final_open()]], h.cfg)
    for kind in ("arp", "cm"):
        assert [f for _, f in h.tx if tx_kind(f) == kind] == [f for _, f in pred.tx[kind]], kind
    m = pred.model
    assert h.tables["end"] == [{k: int(m.rows[q][k]) for k, _ in proto.QP_CONTEXT_FIELDS}
                               for q in range(n_qp)]
    assert cm == m.counters["cm"], (cm, m.counters["cm"])
    last = cm_reply_fields(h.tx[-1][1])
    assert (last["ack_type"], last["loc_qpn"]) == (proto.CmAck.ACK, Q + 1)


# -- the checks can fail -----------------------------------------------------------------------
def _wrong_fetch(self, req, base):
    code, reason, out = _ORIGINAL["fetch"](self, req, base)
    if code == proto.CmAck.ACK:
        out = dict(out, loc_psn=(out["loc_psn"] + 1) & 0xFFFFFF)
    return code, reason, out


def _wrong_modify(self, req, src_ip, base):
    out = _ORIGINAL["modify"](self, req, src_ip, base)
    index = self.index_of(req["rem_qpn"])
    if out[0] == proto.CmAck.ACK and req["req_type"] == proto.CmReq.MODIFY_QP_RTS:
        self.rows[index]["r_key"] ^= 1
    return out


def _wrong_count(self, result, taken=True):
    return _ORIGINAL["add"](self, result, taken=taken and result.kind != "other")


_ORIGINAL = {}


@pytest.mark.parametrize("width, n_qp, backend", BUILDS[:1] + BUILDS[2:3])
@pytest.mark.parametrize("fault,words", [("fetch", "cm frame 2 differs"),
                                         ("modify", "cm frame 2 differs|QP 0 differs"),
                                         ("count", "rx counters differ")])
def test_a_wrong_model_is_caught(monkeypatch, fault, words, width, n_qp, backend):
    """The comparison is live: a model that answers FETCH_QP_INFO with another PSN, writes
    another R_Key on MODIFY_QP_RTS, or counts passed-on frames as dropped fails the check."""
    from roce_hw.model.cm import CmModel
    from roce_hw.model.rx import RxCounterModel
    _ORIGINAL.update(fetch=CmModel._fetch, modify=CmModel._modify_or_close,
                     add=RxCounterModel.add)
    target, name, fn = {"fetch": (CmModel, "_fetch", _wrong_fetch),
                        "modify": (CmModel, "_modify_or_close", _wrong_modify),
                        "count": (RxCounterModel, "add", _wrong_count)}[fault]
    mac, ip = HOSTS[0]
    prefix = [cm_frame(dg.open_request(loc_ip=ip, qpn=0x11, psn=1, engine_psn=2, engine_qpn=Q),
                       HOSTS[0]),
              cm_frame(dg.rts_request(loc_ip=ip, engine_qpn=Q, qpn=0x11, psn=3, r_key=4,
                                      engine_psn=5), HOSTS[0])]
    body = [Item(cm_frame(dg.info_request(loc_ip=ip, engine_qpn=Q), HOSTS[0])),
            Item(arp_frame(sender=HOSTS[1])),
            Item(pad60(eth(LOCAL_MAC, mac, proto.ETHERTYPE_IPV4)
                       + ipv4(ip, LOCAL_IP, proto.IP_PROTO_UDP, udp(1, 9, b"x" * 20))))]
    run_sequence(width, prefix, body, 0.0, 1, n_qp=n_qp, backend=backend)   # right as it is
    monkeypatch.setattr(target, name, fn)
    with pytest.raises(AssertionError, match=words):
        run_sequence(width, prefix, body, 0.0, 1, n_qp=n_qp, backend=backend)


# -- requests while the generator runs ---------------------------------------------------------
@pytest.mark.parametrize("width, n_qp, backend", BUILDS[:1] + BUILDS[2:3])
def test_requests_while_the_generator_runs(width, n_qp, backend):
    """Requests that arrive while the generator runs on QP 0 (owner A): a start on QP 1 from
    its owner B gets NAK ``busy``, B's CLOSE of QP 1 is obeyed and does not stop the run on
    QP 0, a stranger's CLOSE of QP 0 is refused; every message of the run arrives as the model
    sends it, and the rows are the model's."""
    ip_a, ip_b = HOSTS[0][1], HOSTS[1][1]
    m = guide_model(n_qp)
    setup = []
    for host, i, qpn in ((HOSTS[0], 0, 0x11), (HOSTS[1], 1, 0x22)):
        setup += [cm_frame(dg.open_request(loc_ip=host[1], qpn=qpn, psn=7, r_key=0x100 + i,
                                           base_addr=0x9000, engine_psn=0xFFFFF0,
                                           engine_qpn=Q + i), host),
                  cm_frame(dg.rts_request(loc_ip=host[1], engine_qpn=Q + i, qpn=qpn, psn=8,
                                          r_key=0x200 + i, base_addr=0xA000,
                                          engine_psn=0xFFFFF8), host)]
    count, period = 6, 400
    start = cm_frame(dg.txmeta_request(loc_ip=ip_a, engine_qpn=Q, length=1500, count=count,
                                       period=period, write=False, imm=True), HOSTS[0])
    during = [cm_frame(dg.txmeta_request(loc_ip=ip_b, engine_qpn=Q + 1, length=8, count=1),
                       HOSTS[1]),
              cm_frame(dg.close_request(loc_ip=ip_b, engine_qpn=Q + 1), HOSTS[1]),
              cm_frame(dg.close_request(loc_ip=HOSTS[2][1], engine_qpn=Q), HOSTS[2])]
    want = {"cm": [], "data": []}
    for f in setup:
        tx, _ = m.receive(f)
        want["cm"] += tx
    # the start, by hand: the model's generator keeps running while the requests arrive
    reply = m.cm.handle(*_cm_args(start))
    want["cm"].append(m.cm.frame(reply))
    gen = m.cm.generator
    assert gen is not None and gen.qp == 0
    for wr in generator_messages(gen):
        for sent in m.req.post(qp=gen.qp, opcode=wr["opcode"], payload=wr["payload"],
                               wr_id=wr["wr_id"], remote_addr=wr["remote_addr"],
                               r_key=wr["r_key"], imm=wr["imm"] or 0):
            want["data"].append(sent.frame)
    for f in during:
        want["cm"].append(m.cm.frame(m.cm.handle(*_cm_args(f))))
    assert [cm_reply_fields(f)["ack_type"] for f in want["cm"][-3:]] == \
        [proto.CmAck.NAK, proto.CmAck.ACK, proto.CmAck.NAK]
    assert m.cm.counters["busy"] == 1 and m.cm.generator is gen
    m.cm.generator_done()
    tx, _ = m.receive(final_open())
    want["cm"] += tx

    script = []
    n_cm = 0
    for f in setup + [start] + during:
        script += [("quiet", ("cm", n_cm), 3000, f"reply {n_cm}"), ("send", Item(f))]
        n_cm += 1
    script += [("quiet", ("cm", n_cm), 3000, "last reply during the run"), ("table", "during"),
               ("quiet", ("data", len(want["data"])), 20 * count * period, "the run"),
               ("send", Item(final_open())),
               ("quiet", ("cm", n_cm + 1), 3000, "final OPEN"), ("idle", 200), ("table", "end")]
    h = harness(width, n_qp, backend).run(script, seed=5)
    assert not h.timeouts, h.timeouts
    got = {k: [f for _, f in h.tx if tx_kind(f) == k] for k in ("cm", "data")}
    assert got == want
    # the requests arrived while the run went on (the test is about that)
    first_data = next(c for c, f in h.tx if tx_kind(f) == "data")
    last_data = [c for c, f in h.tx if tx_kind(f) == "data"][-1]
    replies_at = [c for c, f in h.tx if tx_kind(f) == "cm"]
    assert first_data < replies_at[len(setup) + 3] < last_data, (first_data, replies_at,
                                                                 last_data)
    assert h.tables["during"][1] == CmModel.zero_row()
    assert h.tables["end"] == [{k: int(m.rows[q][k]) for k, _ in proto.QP_CONTEXT_FIELDS}
                               for q in range(n_qp)]
    assert h.counters["cm"] == m.counters["cm"]


def _cm_args(frame):
    """``CmModel.handle`` arguments of a CM request frame."""
    r = classify(frame, local_mac=LOCAL_MAC, local_ip=LOCAL_IP)
    assert r.kind == "cm"
    f = r.fields
    return dg.pack(f["dgram"]), f["src_mac"], f["src_ip"], f["src_port"], f["udp_checksum"]
