# SPDX-License-Identifier: BSD-2-Clause
"""RX front end (roce_hw.rx.frontend.RxFrontEnd) against its golden model (roce_hw.model.rx), the
model against scapy, and the new generic blocks (IPv4HeaderCheck, DeferredFrameFifo)."""

import random
import struct

import pytest
from amaranth import Elaboratable, Module
from amaranth.lib.fifo import SyncFIFOBuffered
from scapy.contrib import roce as sroce
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.utils import checksum as scapy_checksum

from roce_hw import proto
from roce_hw.config import EngineConfig
from roce_hw.lib.deferred_fifo import DeferredFrameFifo
from roce_hw.lib.drop_queue import DropQueue
from roce_hw.lib.icrc import MAX_FRAME_BYTES
from roce_hw.lib.ipv4_check import IPv4HeaderCheck
from roce_hw.model import rx as model
from roce_hw.model.packet import QPPath, build_ack_frame, build_frame, ipv4_checksum
from roce_hw.proto import Opcode
from roce_hw.rx.frontend import (RxFrontEnd, arp_req_layout, cm_rx_layout, roce_rx_layout,
                                 rx_counters_layout)
from roce_hw.rx.rules import verdict_layout
from sim.harness import run_simulation
from sim.stream import beats_of

__all__ = []

FAST = [64, 512]
SLOW = [pytest.param(w, marks=pytest.mark.slow) for w in (128, 256, 1024)]
WIDTHS = FAST + SLOW

LOCAL_MAC = 0x02_00_00_00_00_01
LOCAL_IP = 0xC0A8_0001                     # 192.168.0.1
BCAST = (1 << 48) - 1


# --- frame generators ------------------------------------------------------------------------

def _rand_mac(rng):
    return rng.getrandbits(48) & ~(1 << 40)         # unicast


def _peer(rng):
    return _rand_mac(rng), 0x0A00_0000 | rng.getrandbits(24)


def ipv4_udp_frame(rng, *, dst_mac=LOCAL_MAC, src_mac=None, dst_ip=LOCAL_IP, src_ip=None,
                   sport=None, dport, body=b"", ip=None, udp=None, options=b"",
                   protocol=proto.IP_PROTO_UDP, pad=True):
    """Eth / IPv4 (+ options) / UDP / body, lengths and checksum computed unless given in
    ``ip``/``udp``; zero-padded to 60 bytes with ``pad``."""
    src_mac = _rand_mac(rng) if src_mac is None else src_mac
    src_ip = (0x0A00_0000 | rng.getrandbits(24)) if src_ip is None else src_ip
    sport = rng.getrandbits(16) if sport is None else sport
    u = {"src_port": sport, "dst_port": dport, "length": proto.UDP.size + len(body),
         "checksum": 0}
    u.update(udp or {})
    l4 = proto.UDP.pack(u) + bytes(body)
    f = {"src": src_ip, "dst": dst_ip, "identification": rng.getrandbits(16), "flag_df": 1,
         "ttl": 64, "protocol": protocol, "ihl": 5 + len(options) // 4,
         "total_length": proto.IPV4.size + len(options) + len(l4), "checksum": 0}
    f.update(ip or {})
    if "checksum" not in (ip or {}):
        f["checksum"] = ipv4_checksum(proto.IPV4.pack(f) + bytes(options))
    frame = proto.ETH.pack(dst=dst_mac, src=src_mac, ethertype=proto.ETHERTYPE_IPV4) + \
        proto.IPV4.pack(f) + bytes(options) + l4
    if pad and len(frame) < 60:
        frame += bytes(60 - len(frame))
    return frame


def cm_dgram_bytes(rng):
    return proto.CM_DATAGRAM.pack({n: rng.getrandbits(w) for n, w in proto.CM_DATAGRAM.fields})


def cm_frame(rng, **kw):
    return ipv4_udp_frame(rng, dport=proto.CM_UDP_PORT, body=kw.pop("body", None) or
                          cm_dgram_bytes(rng), **kw)


_ROCE_OPS = [op for op in Opcode if op.transport in (proto.Transport.RC, proto.Transport.UC)]


def roce_frame(rng, *, dst_mac=LOCAL_MAC, dst_ip=LOCAL_IP, ip_version=4, maxlen=200):
    """A RoCEv2 frame of a random opcode from the golden model; ACKs a third of the time."""
    src_mac, src_ip = _peer(rng)
    if rng.random() < 0.3:
        path = QPPath(src_mac=src_mac, dst_mac=dst_mac, src_ip=src_ip, dst_ip=dst_ip,
                      dest_qp=rng.getrandbits(24), udp_sport=0xC000 | rng.getrandbits(14))
        return build_ack_frame(path, psn=rng.getrandbits(24), syndrome=rng.getrandbits(8),
                               msn=rng.getrandbits(24), ip_id=rng.getrandbits(16))
    op = rng.choice(_ROCE_OPS)
    headers = {}
    for h in proto.opcode_headers(op):
        name = {proto.RETH: "RETH", proto.AETH: "AETH", proto.IMMDT: "IMMDT",
                proto.IETH: "IETH"}.get(h, h.name)
        headers[name] = {f: rng.getrandbits(w) for f, w in h.fields}
    size = rng.choice([k for k in (0, 1, 3, 4, 17) if k <= maxlen] + [rng.randrange(maxlen + 1)])
    payload = bytes(rng.getrandbits(8) for _ in range(size))
    ip = {"src": src_ip, "dst": dst_ip, "identification": rng.getrandbits(16)}
    if ip_version == 6:
        ip = {"src": rng.getrandbits(128), "dst": rng.getrandbits(128)}
    bth = {f: rng.getrandbits(w) for f, w in proto.BTH.fields
           if f not in ("opcode", "pad_cnt")}
    frame = build_frame(op, eth={"dst": dst_mac, "src": src_mac}, ip_version=ip_version,
                        ip=ip, udp={"src_port": rng.getrandbits(16)}, bth=bth,
                        headers=headers, payload=payload)
    if len(frame) < 60:
        frame += bytes(60 - len(frame))              # Ethernet padding (BTH-only packets)
    return frame


def arp_frame(rng, *, oper=proto.ArpOper.REQUEST, tpa=LOCAL_IP, dst_mac=BCAST, fields=None):
    src_mac, src_ip = _peer(rng)
    a = {"oper": oper, "sha": src_mac, "spa": src_ip, "tha": 0, "tpa": tpa}
    a.update(fields or {})
    return proto.ETH.pack(dst=dst_mac, src=src_mac, ethertype=proto.ETHERTYPE_ARP) + \
        proto.ARP.pack(a) + proto.ARP_PAD.pack()


def random_frame(rng, nbytes):
    return bytes(rng.getrandbits(8) for _ in range(nbytes))


def _flip(rng, frame, lo=0, hi=None):
    b = bytearray(frame)
    hi = len(b) if hi is None else min(hi, len(b))
    b[rng.randrange(lo, hi)] ^= 1 << rng.randrange(8)
    return bytes(b)


def _set_ip(frame, **fields):
    """Rewrite IPv4 header fields of an Eth/IPv4 frame and recompute the checksum."""
    ip = proto.IPV4.unpack(frame, 14)
    ip.update(fields)
    ip["checksum"] = 0
    ip["checksum"] = ipv4_checksum(proto.IPV4.pack(ip))
    return frame[:14] + proto.IPV4.pack(ip) + frame[34:]


def frame_mix(rng, count, *, maxlen=200):
    """``count`` ``(frame, bad)`` pairs: valid RoCE/CM/ARP frames and every kind of "other" and
    malformed frame the front end must sort out."""
    def valid_any():
        return rng.choice([roce_frame(rng, maxlen=maxlen), cm_frame(rng), arp_frame(rng)])

    makers = [
        (8, lambda: roce_frame(rng, maxlen=maxlen)),
        (2, lambda: _flip(rng, roce_frame(rng, maxlen=maxlen), 42)),        # bad iCRC
        (5, lambda: cm_frame(rng)),
        (2, lambda: cm_frame(rng, body=cm_dgram_bytes(rng)[:rng.choice([0, 8, 63])] +
                             (b"" if rng.random() < 0.5 else bytes(9)))),  # wrong UDP length
        (3, lambda: arp_frame(rng, dst_mac=rng.choice([BCAST, LOCAL_MAC]))),
        (1, lambda: arp_frame(rng, tpa=LOCAL_IP ^ 1)),
        (1, lambda: arp_frame(rng, oper=proto.ArpOper.REPLY, dst_mac=LOCAL_MAC)),
        (1, lambda: arp_frame(rng, fields=rng.choice([{"htype": 6}, {"ptype": 0x86DD},
                                                       {"hlen": 8}, {"plen": 16}]))),
        (1, lambda: arp_frame(rng, dst_mac=_rand_mac(rng))),
        (1, lambda: arp_frame(rng)[:rng.randrange(14, 42)]),                # truncated ARP
        (2, lambda: roce_frame(rng, ip_version=6, maxlen=maxlen)),          # IPv6: other
        (2, lambda: proto.ETH.pack(dst=rng.choice([LOCAL_MAC, BCAST]), src=_rand_mac(rng),
                                   ethertype=rng.choice([0x88CC, 0x8100, 0x86DD, 0x0842,
                                                         rng.getrandbits(16)])) +
            random_frame(rng, rng.randrange(46, 120))),
        (2, lambda: ipv4_udp_frame(rng, dport=rng.choice([53, 4790, 4792, 0x4320, 0x4322,
                                                          rng.getrandbits(16)]),
                                   body=random_frame(rng, rng.randrange(0, 80)))),
        (1, lambda: ipv4_udp_frame(rng, dport=4791, protocol=rng.choice([1, 6, 0x11 ^ 0x80]),
                                   body=random_frame(rng, 40))),            # not UDP: other
        (1, lambda: ipv4_udp_frame(rng, dst_ip=LOCAL_IP + 1, dport=4791,
                                   body=random_frame(rng, 40))),            # other IP: other
        (2, lambda: proto.ETH.pack(dst=_rand_mac(rng), src=_rand_mac(rng)) +
            valid_any()[14:]),                                              # other MAC
        (1, lambda: ipv4_udp_frame(rng, dst_mac=BCAST, dport=proto.CM_UDP_PORT,
                                   body=cm_dgram_bytes(rng))),              # broadcast IPv4
        (1, lambda: _set_ip(valid_any_ip(rng, maxlen), flag_mf=1)),         # fragments
        (1, lambda: _set_ip(valid_any_ip(rng, maxlen), frag_offset=rng.randrange(1, 8192))),
        (1, lambda: cm_frame(rng, options=bytes([1, 1, 1, 0]) * rng.randrange(1, 3))),
        (1, lambda: _set_ip(valid_any_ip(rng, maxlen), version=rng.choice([0, 6, 15]))),
        (2, lambda: _flip(rng, valid_any_ip(rng, maxlen), 14, 34)),          # header bit flip
        (2, lambda: _set_ip(valid_any_ip(rng, maxlen),
                            total_length=rng.choice([0, 19, 20, 27, 45, 46, 47,
                                                     rng.getrandbits(16)]))),
        (1, lambda: valid_any_ip(rng, maxlen) + random_frame(rng, rng.randrange(1, 9))),
        (1, lambda: ipv4_udp_frame(rng, dport=rng.choice([4791, proto.CM_UDP_PORT, 7]),
                                   body=random_frame(rng, rng.randrange(0, 30)),
                                   udp={"length": rng.choice([0, 7, 8, 9, 24, 72, 200])})),
        (1, lambda: ipv4_udp_frame(rng, dport=4791, body=random_frame(rng,
                                                                      rng.randrange(0, 16)))),
        (2, lambda: valid_any()[:rng.randrange(1, 60)]),                    # runts
        (1, lambda: _flip(rng, valid_any(), 0, 60)),
    ]
    total = sum(w for w, _ in makers)
    frames = []
    for _ in range(count):
        x = rng.randrange(total)
        for w, make in makers:
            if x < w:
                break
            x -= w
        frame = make()
        frames.append((frame, rng.random() < 0.04))
    return frames


def valid_any_ip(rng, maxlen):
    return rng.choice([roce_frame(rng, maxlen=maxlen), cm_frame(rng),
                       ipv4_udp_frame(rng, dport=7, body=random_frame(rng, 30))])


# --- scapy oracle ----------------------------------------------------------------------------

def _mac_int(text):
    return int(text.replace(":", ""), 16)


def _ip_int(text):
    return struct.unpack("!I", bytes(int(x) for x in text.split(".")))[0]


_CM_PACK = ">BLLLQLLLLQLHBLLL"
_CM_NAMES = ("flags", "loc_qpn", "loc_psn", "loc_r_key", "loc_base_addr", "loc_ip", "rem_qpn",
             "rem_psn", "rem_r_key", "rem_base_addr", "rem_ip", "reply_port", "tx_flags",
             "tx_dma_length", "tx_n_transfers", "tx_period")


def scapy_classify(frame, *, bad, local_mac=LOCAL_MAC, local_ip=LOCAL_IP):
    """The rules of roce_hw.model.rx, with every field decoded by scapy (Ether, ARP, IP, UDP,
    contrib.roce BTH/AETH), the checksum by ``scapy.utils.checksum``, the iCRC by scapy's
    ``BTH.compute_icrc`` and the CM datagram by the reference script's ``struct`` format."""
    def drop(reason):
        return ("drop", reason, None)

    other = ("other", "other", None)
    size = len(frame)
    if bad:
        return drop("mac_bad")
    if size < 14:
        return drop("runt")
    e = Ether(frame)
    dst = _mac_int(e.dst)
    if e.type == 0x0806:
        if dst in (local_mac, BCAST) and size >= 42:
            a = e[ARP]
            if (a.hwtype, a.ptype, a.hwlen, a.plen, a.op) == (1, 0x0800, 6, 4, 1) and \
                    _ip_int(a.pdst) == local_ip:
                return ("arp", "arp", {"sha": _mac_int(a.hwsrc), "spa": _ip_int(a.psrc)})
        return other
    if dst != local_mac or e.type != 0x0800:
        return other
    if size < 34:
        return drop("runt")
    ip = IP(frame[14:])
    if ip.version != 4 or ip.ihl != 5:
        return drop("ip_header")
    if ip.flags.MF or ip.frag:
        return drop("ip_fragment")
    if scapy_checksum(frame[14:34]) != 0:
        return drop("ip_checksum")
    tl = ip.len
    if tl < 20 or not (size - 14 == tl or (size == 60 and tl < 46)):
        return drop("ip_length")
    if _ip_int(ip.dst) != local_ip or ip.proto != 17:
        return other
    if tl < 28:
        return drop("udp_length")
    pkt = Ether(frame[:14 + tl])
    u = pkt[UDP]
    if u.len != tl - 20:
        return drop("udp_length")
    if u.dport == 4791:
        if u.len < 24:
            return drop("roce_length")
        b = pkt[sroce.BTH]
        if size > 16384 or b.compute_icrc(None) != frame[14 + tl - 4:14 + tl]:
            return drop("icrc")
        a = sroce.AETH(bytes(b.payload)[:4] if bytes(b.payload)[:4] else
                       frame[14 + tl - 4:14 + tl])
        bth = {"opcode": b.opcode, "se": b.solicited, "migreq": b.migreq,
               "pad_cnt": b.padcount, "tver": b.version, "p_key": b.pkey, "fecn": b.fecn,
               "becn": b.becn, "resv6": b.resv6, "dest_qp": b.dqpn, "ack_req": b.ackreq,
               "resv7": b.resv7, "psn": b.psn}
        return ("roce", "roce", {"src_ip": _ip_int(ip.src), "src_port": u.sport,
                                 "udp_length": u.len, "bth_aeth_only": int(u.len == 28),
                                 "bth": bth, "aeth": {"syndrome": a.syndrome, "msn": a.msn}})
    if u.dport == 0x4321:
        if u.len != 72:
            return drop("cm_length")
        v = dict(zip(_CM_NAMES, struct.unpack(_CM_PACK, bytes(u.payload)[:64])))
        f, t = v.pop("flags"), v.pop("tx_flags")
        v.update(ack_type=f >> 5, ack_valid=(f >> 4) & 1, req_type=(f >> 1) & 7, valid=f & 1,
                 tx_resv=t >> 4, tx_type=(t >> 3) & 1, tx_immediate=(t >> 2) & 1,
                 tx_start=(t >> 1) & 1, tx_valid=t & 1)
        return ("cm", "cm", {"src_mac": _mac_int(pkt.src), "src_ip": _ip_int(ip.src),
                             "src_port": u.sport, "udp_checksum": u.chksum, "dgram": v})
    return other


def test_model_constants():
    assert model.ICRC_MAX_FRAME_BYTES == MAX_FRAME_BYTES
    assert tuple(rx_counters_layout().members) == model.RX_COUNTERS
    assert len(set(model.RX_COUNTERS)) == len(model.RX_COUNTERS)
    # the rules' verdicts: the kinds passed on, then every reason of a drop
    assert proto.RX_VERDICTS[:4] == model.KINDS[:4]
    assert set(proto.RX_VERDICTS) == set(model.OUTCOMES) - {"arp_full", "cm_full", "roce_full",
                                                             "other_dropped"}
    assert tuple(verdict_layout().members["verdict"].members) == proto.RX_VERDICTS


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_model_against_scapy(seed):
    """classify() and the scapy oracle agree on random and mutated frames, and every reason is
    exercised."""
    rng = random.Random(seed)
    reasons = set()
    for frame, bad in frame_mix(rng, 600):
        got = model.classify(frame, bad=bad, local_mac=LOCAL_MAC, local_ip=LOCAL_IP)
        want = scapy_classify(frame, bad=bad)
        assert tuple(got) == want, (frame.hex(), bad)
        reasons.add(got.reason)
    assert reasons == set(model.OUTCOMES) - {"arp_full", "cm_full", "roce_full",
                                             "other_dropped"}


def test_model_edge_cases():
    rng = random.Random(5)
    classify = lambda f, bad=False: model.classify(f, bad=bad, local_mac=LOCAL_MAC,  # noqa
                                                   local_ip=LOCAL_IP)
    # a BTH-only RoCE packet (58 bytes) padded to 60: total length 44 < 46 is accepted
    f = build_frame(Opcode.RC_SEND_MIDDLE, eth={"dst": LOCAL_MAC, "src": 2},
                    ip={"src": 3, "dst": LOCAL_IP}, bth={"dest_qp": 9})
    assert len(f) == 58
    assert classify(f).kind == "roce" and classify(f + b"\0\0").kind == "roce"
    assert classify(f + b"\0").reason == "ip_length"            # 59 bytes: not the minimum
    # an ACK is exactly BTH + AETH + iCRC
    r = classify(build_ack_frame(QPPath(1, LOCAL_MAC, 3, LOCAL_IP, 7, 0xC000), psn=5))
    assert r.kind == "roce" and r.fields["bth_aeth_only"] == 1 and r.fields["bth"]["psn"] == 5
    # bad flag wins over everything, runts
    assert classify(cm_frame(rng), bad=True).reason == "mac_bad"
    assert classify(b"\xff" * 13).reason == "runt"
    assert classify(cm_frame(rng)[:33]).reason == "runt"
    # a header checksum of 0xFFFF for a sum that gives 0 is accepted (RFC 1071 check)
    h = bytearray(proto.IPV4.pack(version=4, ihl=5, total_length=20))
    assert model.ipv4_header_ok(bytes(h[:10]) + struct.pack("!H", ipv4_checksum(bytes(h)))
                                + bytes(h[12:]))
    assert not model.ipv4_header_ok(bytes(20))


# --- IPv4HeaderCheck ---------------------------------------------------------------------------

def test_ipv4_header_check():
    rng = random.Random(11)
    headers = []
    for k in range(200):
        f = {n: rng.getrandbits(w) for n, w in proto.IPV4.fields}
        if k % 2:
            f["checksum"] = 0
            f["checksum"] = ipv4_checksum(proto.IPV4.pack(f))
        headers.append(proto.IPV4.pack(f))
    headers.append(bytes(20))
    dut = IPv4HeaderCheck()
    got = []

    async def tb(ctx):
        for k, h in enumerate(headers + [None] * (dut.latency + 1)):
            ctx.set(dut.i.valid, h is not None)
            if h is not None:
                ctx.set(dut.i.payload, proto.IPV4.unpack(h))
            await ctx.tick()
            if ctx.get(dut.o.valid):
                got.append((k, ctx.get(dut.o.payload.ok)))

    run_simulation(dut, [tb], cycles=len(headers) + 50)
    assert [k for k, _ in got] == [k + dut.latency - 1 for k in range(len(headers))]
    assert [ok for _, ok in got] == [int(model.ipv4_header_ok(h)) for h in headers]
    assert {ok for _, ok in got} == {0, 1}


# --- the front end against the model ---------------------------------------------------------

def _as_dict(value, layout):
    """A struct ``data.Const`` as nested dicts of ints."""
    out = {}
    for name, member in layout:
        v = value[name]
        shape = member.shape
        out[name] = _as_dict(v, shape) if hasattr(shape, "members") else int(v)
    return out


def _subsequence(got, want):
    """True if ``got`` is ``want`` with some items left out, order kept."""
    it = iter(want)
    return all(any(g == w for w in it) for g in got)


class Run:
    """Results of :func:`run_frontend`: items per stream, ``other`` frames as beat lists,
    counters, the beats sent per frame and the model's verdicts."""


def run_frontend(width, frames, seed, *, rx_other=True, queue_depth=None, other_bytes=8192,
                 p_stall=0.2, p_gap=0.5, p_idle=0.05, hold=False, max_cycles=None):
    """Send ``frames`` (``(bytes, bad)``) into an RxFrontEnd, collect every output.

    Gaps: with probability ``p_gap`` a frame follows the previous one with no idle cycle, else
    after 1-3 idle cycles; inside a frame a beat is preceded by an idle cycle with probability
    ``p_idle``. Lanes beyond ``keep`` carry random bytes; ``abort`` is random on beats other than
    the last. Consumers stall with probability ``p_stall``; with ``hold`` they take nothing
    until every frame has been counted."""
    depths = {} if queue_depth is None else {f"rx_{kind}_depth": queue_depth
                                             for kind in ("arp", "cm", "roce")}
    config = EngineConfig(data_width=width, **depths)
    dut = RxFrontEnd(config, rx_other=rx_other, other_bytes=other_bytes)
    n = width // 8
    rng = random.Random(seed)
    sent = []
    for frame, bad in frames:
        beats = []
        for beat in beats_of(frame, width):
            used = beat["keep"].bit_length()
            beat["data"] |= (rng.getrandbits(8 * (n - used)) << 8 * used) if n > used else 0
            beat["abort"] = int(bad) if beat["last"] else rng.getrandbits(1)
            beats.append(beat)
        sent.append(beats)
    res = Run()
    res.sent = sent
    res.verdicts = [model.classify(f, bad=b, local_mac=LOCAL_MAC, local_ip=LOCAL_IP)
                    for f, b in frames]
    res.items = {"arp": [], "cm": [], "roce": []}
    res.other = []
    state = {"sent": False, "stop": False}
    layouts_ = {"arp": arp_req_layout(), "cm": cm_rx_layout(), "roce": roce_rx_layout()}

    async def producer(ctx):
        ctx.set(dut.local_mac, LOCAL_MAC)
        ctx.set(dut.local_ip, LOCAL_IP)
        await ctx.tick().repeat(2)
        for beats in sent:
            if rng.random() >= p_gap:
                ctx.set(dut.i.valid, 0)
                await ctx.tick().repeat(rng.randrange(1, 4))
            for k, beat in enumerate(beats):
                if k and rng.random() < p_idle:
                    ctx.set(dut.i.valid, 0)
                    await ctx.tick()
                ctx.set(dut.i.payload, beat)
                ctx.set(dut.i.valid, 1)
                assert ctx.get(dut.i.ready) == 1
                await ctx.tick()
        ctx.set(dut.i.valid, 0)
        state["sent"] = True
        # every frame counted, then the outputs quiet for a while: done
        while ctx.get(dut.counters.rx_frames) != len(sent):
            await ctx.tick()
        state["counted"] = True
        quiet = 0
        while quiet < 64:
            await ctx.tick()
            busy = any(ctx.get(getattr(dut, s).valid) for s in ("arp", "cm", "roce")) or \
                (rx_other and ctx.get(dut.other.valid))
            quiet = 0 if busy else quiet + 1
        res.counters = {name: ctx.get(dut.counters[name]) for name in model.RX_COUNTERS}
        state["stop"] = True

    def consumer(name, crng):
        port = getattr(dut, name)

        async def tb(ctx):
            beats = []
            while not state["stop"]:
                ready = bool(not hold or state.get("counted")) and crng.random() >= p_stall
                ctx.set(port.ready, ready)
                _, _, valid, p = await ctx.tick().sample(port.valid, port.payload)
                if not (valid and ready):
                    continue
                if name == "other":
                    beats.append({"data": int(p.data), "keep": int(p.keep),
                                  "first": int(p.first), "last": int(p.last),
                                  "abort": int(p.abort)})
                    if p.last:
                        res.other.append(beats)
                        beats = []
                else:
                    res.items[name].append(_as_dict(p, layouts_[name]))
            assert not beats, "other: a frame was cut"
        return tb

    names = ["arp", "cm", "roce"] + (["other"] if rx_other else [])
    tbs = [producer] + [consumer(name, random.Random(seed * 10 + k))
                        for k, name in enumerate(names)]
    beats = sum(len(b) for b in sent) + 3 * len(sent)
    run_simulation(dut, tbs, cycles=max_cycles or (4 * beats + 2000),
                   vcd_name=f"rx_frontend_{width}")
    return res


def check_run(res, *, rx_other=True, exact=False):
    """Every output item is the model's, in order; every frame is in exactly one counter; the
    counters agree with the model (full queues: what was not delivered)."""
    want = {"arp": [], "cm": [], "roce": [], "other": []}
    drops = {}
    for beats, r in zip(res.sent, res.verdicts):
        if r.kind == "drop":
            drops[r.reason] = drops.get(r.reason, 0) + 1
        elif r.kind == "other":
            want["other"].append(beats)
        else:
            want[r.kind].append(r.fields)
    c = res.counters
    assert c["rx_frames"] == len(res.sent)
    assert sum(c[name] for name in model.OUTCOMES) == len(res.sent)
    for name in ("mac_bad", "runt", "ip_header", "ip_fragment", "ip_checksum", "ip_length",
                 "udp_length", "roce_length", "icrc", "cm_length"):
        assert c[name] == drops.get(name, 0), name
    for kind in ("arp", "cm", "roce"):
        got = res.items[kind]
        if exact:
            assert got == want[kind], kind
        else:
            assert _subsequence(got, want[kind]), kind
        assert c[kind] == len(got), kind
        assert c[f"{kind}_full"] == len(want[kind]) - len(got), kind
    if rx_other:
        if exact:
            assert res.other == want["other"]
        else:
            assert _subsequence(res.other, want["other"])
        assert c["other"] == len(res.other)
        assert c["other_dropped"] == len(want["other"]) - len(res.other)
    else:
        assert c["other"] == 0 and c["other_dropped"] == len(want["other"])
    if exact:
        counts = model.RxCounterModel()
        for r in res.verdicts:
            counts.add(r, taken=rx_other or r.kind != "other")
        assert c == counts.counts
    return want


@pytest.mark.parametrize("width", WIDTHS)
def test_frontend_random_mix(width):
    """A random mix of every kind of frame, random gaps (none half of the time), random
    backpressure: outputs and counters as the model says."""
    rng = random.Random(width)
    frames = frame_mix(rng, 120, maxlen=120)
    res = run_frontend(width, frames, width + 1)
    want = check_run(res)
    assert all(want[k] for k in want)


# --- DeferredFrameFifo ---------------------------------------------------------------------------

def run_deferred(width, frames, seed, *, depth, max_frames=8, p_stall=0.3, hold=False,
                 decide_delay=(1, 12)):
    """Frames (lists of beat dicts) into a DeferredFrameFifo; a decision ``keep`` (from the
    frame's own list entry) is given a random number of cycles after each ``stored`` pulse with
    ``ok``. Returns ``(oks, out)``: the ``ok`` of every frame and the frames seen on ``o``."""
    dut = DeferredFrameFifo(width, depth, max_frames=max_frames)
    rng = random.Random(seed)
    oks, out, pending = [], [], []
    state = {"done": False}

    async def producer(ctx):
        for beats, _ in frames:
            if rng.random() < 0.5:
                ctx.set(dut.i.valid, 0)
                await ctx.tick().repeat(rng.randrange(1, 3))
            for beat in beats:
                ctx.set(dut.i.payload, beat)
                ctx.set(dut.i.valid, 1)
                assert ctx.get(dut.i.ready)
                await ctx.tick()
        ctx.set(dut.i.valid, 0)
        await ctx.tick().repeat(40)
        while pending or any(ctx.get(x) for x in (dut.o.valid,)):
            await ctx.tick()
        await ctx.tick().repeat(20 + 2 * depth)
        state["done"] = True

    async def decider(ctx):
        # decisions in order, each no earlier than its stored pulse, after a random delay
        cycle, index, queue = 0, 0, []
        while not state["done"]:
            _, _, sv, ok = await ctx.tick().sample(dut.stored.valid, dut.stored.payload.ok)
            cycle += 1
            ctx.set(dut.decide.valid, 0)
            if sv:
                oks.append(int(ok))
                if ok:
                    ready_at = max([cycle + rng.randrange(*decide_delay)] +
                                   [c for c, _ in queue])
                    queue.append((ready_at, frames[index][1]))
                    pending.append(index)
                index += 1
            if queue and queue[0][0] <= cycle:
                ctx.set(dut.decide.valid, 1)
                ctx.set(dut.decide.payload.keep, queue.pop(0)[1])
                pending.pop(0)

    async def consumer(ctx):
        beats = []
        while not state["done"]:
            ready = (not hold or len(oks) == len(frames)) and rng.random() >= p_stall
            ctx.set(dut.o.ready, ready)
            _, _, valid, p = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            if valid and ready:
                beats.append({"data": int(p.data), "keep": int(p.keep), "first": int(p.first),
                              "last": int(p.last), "abort": int(p.abort)})
                if p.last:
                    out.append(beats)
                    beats = []
        assert not beats

    total = sum(len(b) for b, _ in frames)
    run_simulation(dut, [producer, decider, consumer], cycles=20 * total + 4000)
    return oks, out


def _frame_beats(rng, width, nbytes):
    beats = beats_of(random_frame(rng, nbytes), width)
    for b in beats:
        b["abort"] = rng.getrandbits(1) if b["last"] else 0
        used = b["keep"].bit_length()
        b["data"] |= (rng.getrandbits(8 * (width // 8 - used)) << 8 * used) \
            if used < width // 8 else 0
    return beats


@pytest.mark.parametrize("width", [64, 512])
def test_deferred_fifo_kept_frames_in_order(width):
    """Kept frames come out byte-identical and in order, discarded ones never; with room for
    everything every frame is stored."""
    rng = random.Random(width + 7)
    n = width // 8
    frames = [(_frame_beats(rng, width, rng.choice([1, n, n + 1, rng.randrange(1, 6 * n)])),
               rng.random() < 0.6) for _ in range(60)]
    oks, out = run_deferred(width, frames, 3, depth=64, max_frames=32)
    assert oks == [1] * len(frames)
    assert out == [b for b, keep in frames if keep]


@pytest.mark.parametrize("width", [64, 512])
def test_deferred_fifo_overflow(width):
    """With the consumer stalled and little room, frames are dropped whole (``ok`` = 0), never
    cut; exactly the frames stored and kept come out once the consumer runs; a frame longer than
    ``depth`` beats never fits; ``max_frames`` limits the frames held."""
    rng = random.Random(width + 9)
    n = width // 8
    frames = [(_frame_beats(rng, width, rng.randrange(1, 5 * n)), rng.random() < 0.8)
              for _ in range(30)]
    frames.insert(3, (_frame_beats(rng, width, 16 * n + 1), True))  # 17 beats: never fits
    oks, out = run_deferred(width, frames, 5, depth=16, max_frames=4, hold=True)
    assert oks[3] == 0
    assert 0 < sum(oks) < len(frames)
    assert sum(oks) <= 4 + 1                    # frames held while nothing leaves
    assert out == [b for (b, keep), ok in zip(frames, oks) if ok and keep]
    # the same frames with room enough and no stall all pass (but the 17-beat one)
    oks, out = run_deferred(width, frames, 6, depth=16, max_frames=32, p_stall=0,
                            decide_delay=(1, 2))
    assert oks == [int(k != 3) for k in range(len(frames))]
    assert out == [b for k, (b, keep) in enumerate(frames) if keep and k != 3]


# --- DropQueue ---------------------------------------------------------------------------------

class _QueuePair(Elaboratable):
    """A DropQueue and amaranth's own SyncFIFOBuffered (the oracle) side by side, fed alike."""

    def __init__(self, width, depth):
        self.q = DropQueue(width, depth)
        self.ref = SyncFIFOBuffered(width=width, depth=depth)

    def elaborate(self, platform):
        m = Module()
        m.submodules.q, m.submodules.ref = self.q, self.ref
        m.d.comb += [self.ref.w_en.eq(self.q.i.valid), self.ref.w_data.eq(self.q.i.payload),
                     self.ref.r_en.eq(self.q.o.ready)]
        return m


@pytest.mark.parametrize("depth", [2, 3, 4, 5, 8, 33])
def test_drop_queue_is_a_buffered_fifo(depth):
    """Cycle by cycle, DropQueue takes (``room``) and gives (``o``) exactly what
    ``amaranth.lib.fifo.SyncFIFOBuffered`` of the same depth does, under random offers and
    stalls, in bursts that fill it; every item taken comes out once, in order."""
    rng = random.Random(depth)
    dut = _QueuePair(16, depth)
    q, ref = dut.q, dut.ref
    seen = {"taken": [], "out": [], "full": 0}

    async def tb(ctx):
        for cycle in range(1500):
            phase = (cycle // 100) % 3          # offers mostly, stalls mostly, both
            valid = rng.random() < (0.9, 0.2, 0.5)[phase]
            ready = rng.random() < (0.1, 0.9, 0.5)[phase]
            item = rng.getrandbits(16)
            ctx.set(q.i.valid, valid)
            ctx.set(q.i.payload, item)
            ctx.set(q.o.ready, ready)
            room, ov, op = ctx.get(q.room), ctx.get(q.o.valid), ctx.get(q.o.payload)
            assert (room, ov) == (ctx.get(ref.w_rdy), ctx.get(ref.r_rdy)), cycle
            if ov:
                assert op == ctx.get(ref.r_data), cycle
            if valid:
                seen["taken" if room else "full"] += [item] if room else 1
            if ov and ready:
                seen["out"].append(op)
            await ctx.tick()

    run_simulation(dut, [tb], cycles=1600)
    assert seen["out"] == seen["taken"][:len(seen["out"])]
    assert len(seen["taken"]) - len(seen["out"]) <= depth
    assert seen["full"] > 0 and len(seen["out"]) > 100


@pytest.mark.parametrize("width", WIDTHS)
def test_frontend_back_to_back_exact(width):
    """Frames with no idle cycle between them (one-beat frames at 512 bits: ARP, ACKs, runts)
    and consumers always ready: every item and every "other" frame arrives, none is dropped."""
    rng = random.Random(width + 3)
    frames = frame_mix(rng, 80, maxlen=40)
    frames += [(arp_frame(rng), False) for _ in range(6)]
    frames += [(roce_frame(rng, maxlen=0), False) for _ in range(6)]
    rng.shuffle(frames)
    res = run_frontend(width, frames, width + 4, p_stall=0, p_gap=1.0, p_idle=0)
    check_run(res, exact=True)


@pytest.mark.parametrize("width", FAST)
def test_frontend_queue_full(width):
    """Consumers stalled until every frame is counted: each queue keeps its first
    ``queue_depth`` items, the rest are counted as ``*_full``; ``other`` keeps what fits."""
    rng = random.Random(width + 5)
    frames = [(arp_frame(rng), False) for _ in range(6)] + \
        [(cm_frame(rng), False) for _ in range(6)] + \
        [(roce_frame(rng, maxlen=60), False) for _ in range(6)] + \
        [(ipv4_udp_frame(rng, dport=53, body=random_frame(rng, 200)), False) for _ in range(6)]
    rng.shuffle(frames)
    res = run_frontend(width, frames, width + 6, queue_depth=3, other_bytes=512, hold=True,
                       p_stall=0)
    want = check_run(res)
    for kind in ("arp", "cm", "roce"):
        assert res.items[kind] == want[kind][:3]
        assert res.counters[f"{kind}_full"] == 3
    assert 0 < res.counters["other"] < 6 and res.counters["other_dropped"] > 0


@pytest.mark.parametrize("width", FAST)
def test_frontend_without_other(width):
    """``rx_other=False``: no ``other`` stream; those frames are dropped and counted. (Queues
    of two entries.)"""
    rng = random.Random(width + 8)
    frames = frame_mix(rng, 50, maxlen=60)
    dut = RxFrontEnd(EngineConfig(data_width=width), rx_other=False)
    assert "other" not in dut.signature.members
    res = run_frontend(width, frames, width + 9, rx_other=False, queue_depth=2)
    want = check_run(res, rx_other=False)
    assert want["other"]


@pytest.mark.parametrize("width", FAST)
def test_frontend_other_too_long(width):
    """A frame longer than the ``other`` FIFO is dropped whole and counted; the frames around
    it pass."""
    rng = random.Random(width + 10)
    other = [ipv4_udp_frame(rng, dport=53, body=random_frame(rng, k)) for k in (30, 600, 30)]
    frames = [(f, False) for f in other]
    res = run_frontend(width, frames, width + 11, other_bytes=256, p_stall=0)
    assert res.other == [res.sent[0], res.sent[2]]
    assert res.counters["other_dropped"] == 1 and res.counters["other"] == 2


def _latency(width, frame, port):
    """Cycles from the last beat of ``frame`` on ``i`` to the first ``valid`` on ``port``."""
    dut = RxFrontEnd(EngineConfig(data_width=width))
    seen = {}

    async def tb(ctx):
        ctx.set(dut.local_mac, LOCAL_MAC)
        ctx.set(dut.local_ip, LOCAL_IP)
        ctx.set(getattr(dut, port).ready, 1)
        await ctx.tick().repeat(2)
        for beat in beats_of(frame, width):
            ctx.set(dut.i.payload, dict(beat, abort=0))
            ctx.set(dut.i.valid, 1)
            await ctx.tick()
        ctx.set(dut.i.valid, 0)
        for cycle in range(1, 40):
            if ctx.get(getattr(dut, port).valid) and port not in seen:
                seen[port] = cycle
            if ctx.get(dut.counters.rx_frames) and "counted" not in seen:
                seen["counted"] = cycle
            await ctx.tick()

    run_simulation(dut, [tb], cycles=200)
    return seen


@pytest.mark.parametrize("width", FAST)
def test_frontend_latency(width):
    """With the last beat of a frame on ``i`` in cycle t, its item (empty queue) or its first
    "other" beat (empty FIFO) is valid in cycle t + ``RxFrontEnd.latency``, the cycle the
    counters show it."""
    rng = random.Random(width + 12)
    lat = RxFrontEnd.latency
    for frame, port in ((arp_frame(rng), "arp"), (cm_frame(rng), "cm"),
                        (roce_frame(rng), "roce"),
                        (ipv4_udp_frame(rng, dport=53, body=bytes(100)), "other")):
        seen = _latency(width, frame, port)
        assert seen[port] == lat, (port, seen)
        assert seen["counted"] == lat, (port, seen)


def test_frontend_parameters():
    config = EngineConfig(data_width=64)
    with pytest.raises(TypeError):
        RxFrontEnd(object())
    with pytest.raises(TypeError):
        RxFrontEnd(config, rx_other=1)
    for depth in (0, 1, 4097, True, 2.0):
        for kind in ("arp", "cm", "roce"):
            with pytest.raises(ValueError):
                EngineConfig(data_width=64, **{f"rx_{kind}_depth": depth})
    assert RxFrontEnd(EngineConfig(data_width=64, rx_cm_depth=5)).queue_depths == \
        {"arp": 32, "cm": 5, "roce": 32}
    with pytest.raises(ValueError):
        RxFrontEnd(config, other_bytes=8)
    assert RxFrontEnd(config, other_bytes=1000).other_bytes == 1024
    with pytest.raises(ValueError):
        DeferredFrameFifo(64, 6)
    with pytest.raises(ValueError):
        DeferredFrameFifo(64, 8, max_frames=1)


@pytest.mark.slow
@pytest.mark.parametrize("width", [64, 128, 256, 512, 1024])
@pytest.mark.parametrize("seed", [21, 22])
def test_frontend_random_mix_long(width, seed):
    """Many more frames, longer payloads, stalls on every stream."""
    rng = random.Random(seed * 1000 + width)
    frames = frame_mix(rng, 600, maxlen=1100)
    res = run_frontend(width, frames, seed, p_stall=0.3)
    check_run(res)


def edge_frames(rng):
    """Frames on every boundary of the rules: each length of a truncated CM frame, padded
    60-byte frames with every interesting total length, UDP lengths around 8 / 24 / 28 / 72,
    ARP packets of 41 and 42 bytes, checksum fields 0x0000 and 0xFFFF."""
    frames = []
    cm = cm_frame(rng)
    frames += [cm[:k] for k in range(1, len(cm) + 1)]
    for dport in (7, 4791, proto.CM_UDP_PORT):
        base = ipv4_udp_frame(rng, dport=dport, body=random_frame(rng, 4))
        assert len(base) == 60
        for tl in (0, 19, 20, 27, 28, 31, 32, 33, 45, 46, 47):
            frames.append(_set_ip(base, total_length=tl))
        frames += [base[:59], base + b"\0"]
        for ulen in (0, 7, 8, 9, 23, 24, 27, 28, 29, 71, 72, 73):
            body = random_frame(rng, max(0, ulen - 8))
            frames.append(ipv4_udp_frame(rng, dport=dport, body=body))
            frames.append(ipv4_udp_frame(rng, dport=dport, body=body, udp={"length": ulen ^ 1}))
    arp = arp_frame(rng)
    frames += [arp[:41], arp[:42], arp[:43]]
    # a header whose checksum may be written either way (sum of the other words 0xFFFF)
    for csum in (0x0000, 0xFFFF):
        f = bytearray(ipv4_udp_frame(rng, dport=7, body=bytes(4)))
        ip = proto.IPV4.unpack(f, 14)
        ip["checksum"] = 0
        rest = sum(struct.unpack("!10H", proto.IPV4.pack(ip)))
        while rest > 0xFFFF:
            rest = (rest & 0xFFFF) + (rest >> 16)
        ip["identification"] = (ip["identification"] + (0xFFFF - rest)) % 0xFFFF
        ip["checksum"] = csum
        f[14:34] = proto.IPV4.pack(ip)
        frames.append(bytes(f))
    return [(f, False) for f in frames]


@pytest.mark.parametrize("width", FAST)
def test_frontend_edges(width):
    """Every boundary of the length, checksum and ARP rules, back to back: the hardware does
    what the model says, frame for frame."""
    rng = random.Random(width + 13)
    frames = edge_frames(rng)
    reasons = {model.classify(f, bad=b, local_mac=LOCAL_MAC, local_ip=LOCAL_IP).reason
               for f, b in frames}
    assert {"runt", "ip_length", "udp_length", "roce_length", "cm_length", "other", "arp",
            "cm", "icrc"} <= reasons
    res = run_frontend(width, frames, width + 14, p_stall=0, p_gap=1.0, p_idle=0)
    check_run(res, exact=True)
