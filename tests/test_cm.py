# SPDX-License-Identifier: BSD-2-Clause
"""The hardware CM responder (with a real QP table) against the CM model, request by request:
replies, generator commands, rows and counters; the regressions of issue 33 (items 1.3, 1.4,
1.7) against independent oracles (the reference script's packing, scapy's UDP checksum)."""

import ipaddress
import random
import struct

import pytest
from amaranth import Elaboratable, Module
from amaranth.lib import wiring

from roce_hw import proto
from roce_hw.config import EngineConfig
from roce_hw.host import datagram
from roce_hw.lib.reqrsp import RequestArbiter
from roce_hw.model.cm import CmModel, udp_checksum
from roce_hw.ctrl.qp_table import QPStateTable
from roce_hw.layouts import mgmt_req_layout, mgmt_rsp_layout
from roce_hw.ctrl.cm import CM_COUNTERS, CmResponder
from sim.harness import run_simulation
from sim.stream import stream_get, stream_put

LOCAL_MAC = 0x02_00_00_00_00_01
LOCAL_IP = 0x0A_00_00_01
REQ, ACK = proto.CmReq, proto.CmAck
FIELDS = [name for name, _ in proto.QP_CONTEXT_FIELDS]


class CmBench(Elaboratable):
    """CmResponder + QPStateTable, the table's management port shared with the testbench."""

    def __init__(self, config):
        self.cm = CmResponder(config)
        self.table = QPStateTable(config.n_qp)
        self.arb = RequestArbiter(mgmt_req_layout(config.n_qp), mgmt_rsp_layout(config.n_qp), 2)

    def elaborate(self, platform):
        m = Module()
        m.submodules.cm, m.submodules.table, m.submodules.arb = self.cm, self.table, self.arb
        wiring.connect(m, self.cm.mgmt_req, self.arb.s1_req)
        wiring.connect(m, self.arb.s1_rsp, self.cm.mgmt_rsp)
        wiring.connect(m, self.arb.m_req, self.table.mgmt_req)
        wiring.connect(m, self.table.mgmt_rsp, self.arb.m_rsp)
        m.d.comb += [self.table.tx_upd.valid.eq(0), self.table.una_upd.valid.eq(0),
                     self.table.tx_rd.en.eq(0)]
        return m


class Host:
    def __init__(self, rng, k):
        self.mac = 0x02_00_00_00_10_00 + k
        self.ip = 0x0A_00_00_10 + k
        self.qpns = [rng.randrange(1, 1 << 24) for _ in range(3)]


def _dgram(**fields):
    return datagram.pack(datagram.datagram(**fields))


def make_requests(rng, n_qp, count, hosts):
    """(dgram bytes, src_mac, src_ip, src_port, udp_checksum): mostly well-formed OPEN/MODIFY/
    CLOSE/FETCH/txmeta from a few hosts (so that state builds up), plus mutated and random ones;
    the UDP checksum not computed (0), right, or (1 in 20) wrong."""
    own = [256 + i for i in range(n_qp)]
    odd = [0, 255, 256 + n_qp, rng.getrandbits(24)]

    def engine_qpn():
        return rng.choice(own if rng.random() < 0.85 else odd)
    out = []
    for _ in range(count):
        h = rng.choice(hosts)
        src_ip = h.ip if rng.random() < 0.9 else rng.choice(hosts).ip
        qpn = rng.choice(h.qpns)
        kind = rng.choices(["open", "modify", "close", "fetch", "tx", "junk"],
                           [4, 3, 2, 1, 2, 2])[0]
        common = {"loc_qpn": qpn, "loc_psn": rng.getrandbits(24), "loc_r_key": rng.getrandbits(32),
                  "loc_base_addr": rng.getrandbits(64), "loc_ip": h.ip,
                  "reply_port": proto.CM_REPLY_UDP_PORT if rng.random() < 0.97 else 0}
        if kind == "open":
            f = dict(common, valid=1, req_type=REQ.OPEN_QP, rem_psn=rng.getrandbits(24),
                     rem_qpn=0 if rng.random() < 0.7 else engine_qpn())
        elif kind in ("modify", "close", "fetch"):
            req = {"modify": REQ.MODIFY_QP_RTS, "close": REQ.CLOSE_QP,
                   "fetch": REQ.FETCH_QP_INFO}[kind]
            f = dict(common, valid=1, req_type=req, rem_qpn=engine_qpn(),
                     rem_psn=rng.getrandbits(24))
        elif kind == "tx":
            f = dict(common, tx_valid=1, tx_start=int(rng.random() < 0.8),
                     tx_type=rng.getrandbits(1), tx_immediate=rng.getrandbits(1),
                     rem_qpn=engine_qpn(),
                     tx_dma_length=rng.choice([0, 1, 4096, (1 << 31), (1 << 31) + 1]),
                     tx_n_transfers=rng.choice([0, 1, 100]), tx_period=rng.getrandbits(32))
        else:
            f = {name: rng.getrandbits(bits) for name, bits in proto.CM_DATAGRAM.fields}
        if kind != "junk" and rng.random() < 0.04:       # a 24-bit field's top byte set
            name = rng.choice(("loc_qpn", "loc_psn", "rem_qpn", "rem_psn"))
            f[name] = f.get(name, 0) | rng.randrange(1, 256) << 24
        raw = bytearray(_dgram(**f))
        if kind != "junk" and rng.random() < 0.15:       # one flipped bit anywhere
            bit = rng.randrange(8 * len(raw))
            raw[bit // 8] ^= 1 << (bit % 8)
        port = rng.getrandbits(16) if rng.random() < 0.97 else 0
        checksum = 0
        if rng.random() < 0.4:
            checksum = udp_checksum(bytes(raw), src_ip=src_ip, dst_ip=LOCAL_IP, src_port=port)
            if rng.random() < 0.12:
                checksum ^= 1 << rng.randrange(16)
        out.append((bytes(raw), h.mac, src_ip, port, checksum))
    return out


def run_cm(n_qp, requests, rng, *, p_stall=0.3, done_every=6, log=None):
    """Every request (``(dgram, src_mac, src_ip, src_port[, udp_checksum])``) through the CM
    and the model; replies, generator commands, rows and counters must be the model's. With
    ``log`` (a list), the hardware's ``(reply or None, generator commands)`` of each request is
    appended to it."""
    cfg = EngineConfig(data_width=64, n_qp=n_qp)
    bench = CmBench(cfg)
    cm = bench.cm
    model = CmModel(n_qp, local_mac=LOCAL_MAC, local_ip=LOCAL_IP, cm_pmtu=cfg.cm_pmtu,
                    ttl=cfg.ttl)
    mismatches = []
    hw_rows = []
    hw_counters = {}

    async def tb(ctx):
        ctx.set(cm.local_ip, LOCAL_IP)
        busy = None                  # (qp) while the emulated generator runs
        for n, (dgram, mac, ip, port, *checksum) in enumerate(requests):
            checksum = checksum[0] if checksum else 0
            if busy is not None and n % done_every == 0:
                busy = None          # the generator finished its traffic
                model.generator_done()
            ctx.set(cm.gen_busy, busy is not None)
            ctx.set(cm.gen_qp, busy or 0)
            want = model.handle(dgram, mac, ip, port, checksum)
            want_gen = list(model.gen_log)
            model.gen_log.clear()
            fields = datagram.unpack(dgram)
            await stream_put(ctx, cm.req, {"src_mac": mac, "src_ip": ip, "src_port": port,
                                           "udp_checksum": checksum, "dgram": fields})
            got, got_gen = None, []
            while True:
                ready_reply = rng.random() >= p_stall
                ctx.set(cm.reply.ready, ready_reply)
                ctx.set(cm.gen_cmd.ready, 1)
                _, _, rv, rp, gv, gp, idle = await ctx.tick().sample(
                    cm.reply.valid, cm.reply.payload, cm.gen_cmd.valid, cm.gen_cmd.payload,
                    cm.req.ready)
                if gv:
                    cmd = {name: int(getattr(gp, name)) for name in
                           ("start", "qp", "opcode", "length", "count", "period", "remote_va",
                            "r_key")}
                    got_gen.append(cmd if cmd["start"] else {"start": 0, "qp": cmd["qp"]})
                    busy = cmd["qp"] if cmd["start"] else None
                    ctx.set(cm.gen_busy, busy is not None)
                    ctx.set(cm.gen_qp, busy or 0)
                if rv and ready_reply:
                    got = (int(rp.dst_mac), int(rp.dst_ip), int(rp.dst_port), datagram.pack(
                        {name: int(getattr(rp.dgram, name)) for name, _ in
                         proto.CM_DATAGRAM.fields}))
                if idle:
                    break
            ctx.set(cm.reply.ready, 0)
            if log is not None:
                log.append((got, got_gen))
            if want is not None:
                want = tuple(want)
            if got != want or got_gen != want_gen:
                mismatches.append((n, datagram.unpack(dgram), want and datagram.unpack(want[3]),
                                   got and datagram.unpack(got[3]), want_gen, got_gen))
        # read the whole table back through the shared management port
        for q in range(n_qp):
            await stream_put(ctx, bench.arb.s0_req, {"qp": q, "write": 0})
            r = await stream_get(ctx, bench.arb.s0_rsp)
            hw_rows.append({name: int(getattr(r.ctx, name)) for name in FIELDS})
        for name in CM_COUNTERS:
            hw_counters[name] = ctx.get(getattr(cm.counters, name))

    run_simulation(bench, [tb], cycles=200 * len(requests) + 50 * n_qp * len(requests) + 1000)
    assert not mismatches, mismatches[:3]
    assert hw_rows == model.rows
    assert hw_counters == model.counters
    return model


@pytest.mark.parametrize("n_qp,seed", [(4, 1), (3, 2), (1, 3)])
def test_cm_matches_model(n_qp, seed):
    rng = random.Random(seed)
    hosts = [Host(rng, k) for k in range(3)]
    model = run_cm(n_qp, make_requests(rng, n_qp, 150, hosts), rng)
    # the mix exercised every outcome
    assert model.counters["ok"] >= 15, model.counters
    hit = {name for name, v in model.counters.items() if v}
    assert {"bad_flags", "bad_field", "bad_qpn", "bad_state", "not_owner",
            "bad_checksum"} <= hit, model.counters


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_cm_matches_model_slow(seed):
    rng = random.Random(100 + seed)
    hosts = [Host(rng, k) for k in range(4)]
    run_cm(16, make_requests(rng, 16, 600, hosts), rng)


def test_cm_reference_cycle():
    """OPEN / MODIFY_QP_RTS / CLOSE packed as the reference script packs them, on every QP, then
    NO_QP when full; the hardware's replies decoded field by field."""
    import struct
    rng = random.Random(7)
    n_qp = 3
    host_mac, host_ip = 0x02_00_00_00_00_02, 0x0A_00_00_02

    def ref(req, loc_qpn, loc_psn, rem_qpn=0, rem_psn=0):
        flags = 0x1 | (req << 1)
        return struct.pack('>BLLLQLLLLQLHBLLL', flags, loc_qpn, loc_psn, 0x234, 0x12341242,
                           host_ip, rem_qpn, rem_psn, 0, 0, 0, 0x4322, 0, 0, 0, 0)

    reqs = [(ref(1, 0x11 + q, q), host_mac, host_ip, 0x4322) for q in range(n_qp + 1)]
    reqs += [(ref(3, 0x11 + q, q, 256 + q, 1000 + q), host_mac, host_ip, 0x4322)
             for q in range(n_qp)]
    reqs += [(ref(4, 0x11 + q, 0, 256 + q), host_mac, host_ip, 0x4322) for q in range(n_qp)]
    model = run_cm(n_qp, reqs, rng)
    assert model.counters == dict(dict.fromkeys(CM_COUNTERS, 0), ok=3 * n_qp, no_qp=1)


# -- issue 33: the reference host script, the UDP checksum, SEND_QP_INFO ------------------------
HOST_MAC, HOST_IP = 0x02_00_00_00_00_02, 0x0A_00_00_02
EPHEMERAL = 0xD431           # the UDP source port of an unbound socket (send_connection_info.py)


def script_datagram(flags, loc_qpn, loc_psn, loc_r_key, loc_base_addr, loc_ip, rem_qpn, rem_psn,
                    rem_r_key, rem_base_addr, rem_ip, port, txmeta_flags, length, count, rate):
    """A datagram packed as ``send_connection_info.py`` packs it: one ``struct.pack`` per field,
    in its order and formats (">B", ">L" x 3, ">Q", ">L" x 4, ">Q", ">L", ">H", ">B", ">L" x 3)."""
    out = struct.pack(">B", flags)
    for fmt, v in ((">L", loc_qpn), (">L", loc_psn), (">L", loc_r_key), (">Q", loc_base_addr),
                   (">L", loc_ip), (">L", rem_qpn), (">L", rem_psn), (">L", rem_r_key),
                   (">Q", rem_base_addr), (">L", rem_ip), (">H", port), (">B", txmeta_flags),
                   (">L", length), (">L", count), (">L", rate)):
        out += struct.pack(fmt, v)
    return out


def script_open():
    """``-r 1`` with the script's defaults (loc_qpn 0x12, loc_rkey 0x234, base 0x12341242)."""
    return script_datagram(0x1 | 1 << 1, 0x12, 0, 0x234, 0x12341242, HOST_IP, 0, 0, 0, 0,
                           LOCAL_IP, 0x4322, 0, 0, 0, 0)


def script_modify(rem_qpn):
    """``-r 3 -rq <rem_qpn>``."""
    return script_datagram(0x1 | 3 << 1, 0x12, 0, 0x234, 0x12341242, HOST_IP, rem_qpn, 0, 0, 0,
                           LOCAL_IP, 0x4322, 0, 0, 0, 0)


def script_txmeta(rem_qpn, *, start, length, count, rate=0, immediate=False, write=True):
    """``send_txmeta()``: flags 0, loc_qpn 0x12 (its default), listening port 0."""
    txmeta_flags = 0x1 | (start << 1) | (immediate << 2) | (write << 3)
    return script_datagram(0, 0x12, 0, 0, 0, HOST_IP, rem_qpn, 0, 0, 0, LOCAL_IP, 0,
                           txmeta_flags, length, count, rate)


def test_reference_start_with_reply_port_zero():
    """Issue 33 item 1.3: the reference script's ``-s -l 16000 -n 100`` (reply port 0) starts the
    generator -- RDMA WRITE (its default type), 16000 bytes, 100 messages, back to back, on the
    QP the host opened -- and is answered ACK at the datagram's UDP source port."""
    rng = random.Random(33)
    reqs = [(script_open(), HOST_MAC, HOST_IP, EPHEMERAL),
            (script_modify(256), HOST_MAC, HOST_IP, EPHEMERAL),
            (script_txmeta(256, start=True, length=16000, count=100), HOST_MAC, HOST_IP,
             EPHEMERAL)]
    log = []
    run_cm(2, reqs, rng, log=log)
    reply, gen = log[2]
    assert reply is not None, "the start datagram was dropped"
    dst_mac, dst_ip, dst_port, dgram = reply
    assert (dst_mac, dst_ip, dst_port) == (HOST_MAC, HOST_IP, EPHEMERAL)
    assert dgram[0] == 1 << 5 | 1 << 4         # ack_type ACK, ack_valid 1; valid 0, req_type 0
    assert gen == [{"start": 1, "qp": 0, "opcode": int(proto.WrOpcode.RDMA_WRITE),
                    "length": 16000, "count": 100, "period": 0, "remote_va": 0x12341242,
                    "r_key": 0x234}]


def test_send_qp_info_is_ignored():
    """Issue 33 item 1.7: SEND_QP_INFO, packed as the script's ``send_qp_info()`` packs it (its
    listening-port field holds 0x4321), sent to the CM: no reply, nothing changes, counted
    ``ignored`` -- before and after a connection is open."""
    def send_qp_info(rem_qpn):
        return script_datagram(0x1 | 2 << 1, 0x12, 0, 0x1234, 0x12345678, HOST_IP, rem_qpn, 0,
                               0x1234, 0x12345678, LOCAL_IP, 0x4321, 0, 0, 0, 0)
    reqs = [(send_qp_info(0x100), HOST_MAC, HOST_IP, EPHEMERAL),
            (script_open(), HOST_MAC, HOST_IP, EPHEMERAL),
            (send_qp_info(0x100), HOST_MAC, HOST_IP, EPHEMERAL)]
    log = []
    model = run_cm(2, reqs, random.Random(7), log=log)
    assert [r is None for r, _ in log] == [True, False, True]
    assert all(g == [] for _, g in log)
    assert model.counters == dict(dict.fromkeys(CM_COUNTERS, 0), ok=1, ignored=2)


def _scapy_frame(dgram, sport):
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw
    return bytes(Ether(dst="02:00:00:00:00:01", src="02:00:00:00:00:02")
                 / IP(src="10.0.0.2", dst="10.0.0.1", flags="DF")
                 / UDP(sport=sport, dport=proto.CM_UDP_PORT) / Raw(dgram))


def _scapy_fields(frame):
    """The CM's request item of a frame, read by scapy, and scapy's verdict on its checksum."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    pkt = Ether(frame)
    fresh = pkt.copy()
    fresh[IP].chksum = fresh[UDP].chksum = None
    right = pkt[UDP].chksum in (0, Ether(bytes(fresh))[UDP].chksum)
    return (bytes(pkt[UDP].payload), int(pkt.src.replace(":", ""), 16),
            int.from_bytes(bytes(map(int, pkt[IP].src.split("."))), "big"), pkt[UDP].sport,
            pkt[UDP].chksum), right


def test_bad_udp_checksum_is_dropped():
    """Issue 33 item 1.4: scapy-built frames (scapy computes the UDP checksum) of a MODIFY that
    would change the QP, with single-bit corruptions in the bytes the checksum covers (source
    IP, UDP source port and checksum, the datagram): each corrupted one is dropped -- no reply,
    no change -- as scapy's recomputed checksum says; the good ones between them are obeyed."""
    rng = random.Random(1768)
    open_ = script_open()
    frames = []
    for k in range(24):
        psn = rng.getrandbits(24)
        good = _scapy_frame(script_datagram(0x1 | 3 << 1, 0x12, psn, 0x234, 0x12341242, HOST_IP,
                                            256, psn, 0, 0, LOCAL_IP, 0x4322, 0, 0, 0, 0),
                            EPHEMERAL)
        for _ in range(4):
            byte = rng.choice([*range(26, 30), 34, 35, 40, 41, *range(42, 106)])
            bad = bytearray(good)
            bad[byte] ^= 1 << rng.randrange(8)
            if byte < 34:                          # the source IP: IPv4 header checksum redone
                from scapy.layers.inet import IP
                ip = IP(bytes(bad[14:34]))
                ip.chksum = None
                bad[14:34] = bytes(IP(bytes(ip)))
            frames.append(bytes(bad))
        frames.append(good)
    items, verdicts = zip(*[_scapy_fields(f) for f in frames])
    assert verdicts.count(True) == 24
    log = []
    model = run_cm(1, [(open_, HOST_MAC, HOST_IP, EPHEMERAL)] + list(items), rng, log=log)
    assert [r is not None for r, _ in log[1:]] == list(verdicts)
    assert model.counters["bad_checksum"] == 4 * 24 and model.counters["ok"] == 1 + 24


def test_checksum_stage_against_scapy():
    """CmChecksum alone: its verdict is scapy's on frames with right, wrong and absent (0) UDP
    checksums from random sources (a checksum computing to 0, sent as 0xFFFF, included); its
    latency is the one it states; the datagram stays on ``o`` until taken."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw
    from roce_hw.ctrl.cm_checksum import CmChecksum
    rng = random.Random(768)
    cases = []
    for k in range(40):
        src = rng.getrandbits(32)
        sport = rng.getrandbits(16)
        dgram = rng.randbytes(64)
        if k == 0:                        # the checksum computes to 0: sent as 0xFFFF
            fix = udp_checksum(dgram[:62] + bytes(2), src_ip=src, dst_ip=LOCAL_IP,
                               src_port=sport)
            dgram = dgram[:62] + fix.to_bytes(2, "big")
        pkt = Ether(bytes(Ether() / IP(src=str(ipaddress.IPv4Address(src)), dst="10.0.0.1")
                          / UDP(sport=sport, dport=proto.CM_UDP_PORT) / Raw(dgram)))
        chk = pkt[UDP].chksum
        if k == 0:
            assert chk == 0xFFFF
        kind = rng.choice(("right", "wrong", "zero")) if k else "right"
        if kind == "wrong":
            chk ^= 1 << rng.randrange(16)
        elif kind == "zero":
            chk = 0
        fresh = pkt.copy()
        fresh[UDP].chksum = chk
        fresh2 = fresh.copy()
        fresh2[UDP].chksum = None
        want = chk == 0 or Ether(bytes(fresh2))[UDP].chksum == chk
        cases.append(({"src_mac": rng.getrandbits(48), "src_ip": src, "src_port": sport,
                       "udp_checksum": chk, "dgram": datagram.unpack(dgram)}, want))
    assert {w for _, w in cases} == {True, False}
    dut = CmChecksum()
    got = []

    async def tb(ctx):
        ctx.set(dut.local_ip, LOCAL_IP)
        for item, _ in cases:
            await stream_put(ctx, dut.i, item)
            start = 0
            while not ctx.get(dut.o.valid):
                await ctx.tick()
                start += 1
            for _ in range(rng.randrange(3)):         # held while not taken
                await ctx.tick()
                assert ctx.get(dut.o.valid) and not ctx.get(dut.i.ready)
            p = ctx.get(dut.o.payload)
            assert int(p.req.udp_checksum) == item["udp_checksum"]
            assert int(p.req.dgram.tx_period) == item["dgram"]["tx_period"]
            got.append((bool(p.checksum_ok), start))
            ctx.set(dut.o.ready, 1)
            await ctx.tick()
            ctx.set(dut.o.ready, 0)

    run_simulation(dut, [tb], cycles=100 * len(cases))
    assert [ok for ok, _ in got] == [w for _, w in cases]
    # stream_put returns in the cycle after the transfer: one cycle of the latency has passed
    assert {t + 1 for _, t in got} == {CmChecksum.latency}


@pytest.mark.parametrize("n_qp", [4, 16])
def test_latency_is_the_documented_one(n_qp):
    """From a transfer on ``req`` to ``reply.valid``, as CmResponder's docstring states: 45
    cycles answered without the table, 50 for FETCH_QP_INFO or a refusal after the row check,
    51 for a txmeta start, 53 for a request that writes a row, ``5 * n_qp + 49`` for an OPEN
    that reads every row."""
    cfg = EngineConfig(data_width=64, n_qp=n_qp)
    bench = CmBench(cfg)
    cm = bench.cm

    def req(**f):
        return dict(f, loc_ip=HOST_IP, reply_port=proto.CM_REPLY_UDP_PORT)
    cases = [(req(valid=1, req_type=REQ.OPEN_QP, ack_valid=1), 45),
             (req(valid=1, req_type=REQ.OPEN_QP, loc_qpn=5), 5 * n_qp + 49),
             (req(valid=1, req_type=REQ.MODIFY_QP_RTS, loc_qpn=5, rem_qpn=256), 53),
             (req(valid=1, req_type=REQ.FETCH_QP_INFO, rem_qpn=256), 50),
             (req(valid=1, req_type=REQ.MODIFY_QP_RTS, rem_qpn=257), 50),
             (req(tx_valid=1, tx_start=1, tx_dma_length=8, tx_n_transfers=1, rem_qpn=256), 51),
             (req(valid=1, req_type=REQ.CLOSE_QP, rem_qpn=256), 53)]
    got = []

    async def tb(ctx):
        ctx.set(cm.local_ip, LOCAL_IP)
        ctx.set(cm.reply.ready, 1)
        ctx.set(cm.gen_cmd.ready, 1)
        for fields, _ in cases:
            await stream_put(ctx, cm.req, {"src_mac": HOST_MAC, "src_ip": HOST_IP,
                                           "src_port": EPHEMERAL, "udp_checksum": 0,
                                           "dgram": datagram.datagram(**fields)})
            n = 1                         # stream_put returns the cycle after the transfer
            while not ctx.get(cm.reply.valid):
                await ctx.tick()
                n += 1
            got.append(n)
            await ctx.tick()

    run_simulation(bench, [tb], cycles=2000)
    assert got == [want for _, want in cases]
