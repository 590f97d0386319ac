# SPDX-License-Identifier: BSD-2-Clause
"""The hardware CM responder (with a real QP table) against the CM model, request by request:
replies, generator commands, rows and counters."""

import random

import pytest
from amaranth import Elaboratable, Module
from amaranth.lib import wiring

from roce_hw import proto
from roce_hw.config import EngineConfig
from roce_hw.host import datagram
from roce_hw.lib.reqrsp import RequestArbiter
from roce_hw.model.cm import CmModel
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
    """(dgram bytes, src_mac, src_ip, src_port): mostly well-formed OPEN/MODIFY/CLOSE/FETCH/
    txmeta from a few hosts (so that state builds up), plus mutated and random ones."""
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
        raw = bytearray(_dgram(**f))
        if kind != "junk" and rng.random() < 0.15:       # one flipped bit anywhere
            bit = rng.randrange(8 * len(raw))
            raw[bit // 8] ^= 1 << (bit % 8)
        out.append((bytes(raw), h.mac, src_ip, rng.getrandbits(16)))
    return out


def run_cm(n_qp, requests, rng, *, p_stall=0.3, done_every=6):
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
        for n, (dgram, mac, ip, port) in enumerate(requests):
            if busy is not None and n % done_every == 0:
                busy = None          # the generator finished its traffic
                model.generator_done()
            ctx.set(cm.gen_busy, busy is not None)
            ctx.set(cm.gen_qp, busy or 0)
            want = model.handle(dgram, mac, ip, port)
            want_gen = list(model.gen_log)
            model.gen_log.clear()
            fields = datagram.unpack(dgram)
            await stream_put(ctx, cm.req, {"src_mac": mac, "src_ip": ip, "src_port": port,
                                           "dgram": fields})
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
    assert {"bad_flags", "bad_field", "bad_qpn", "bad_state", "not_owner", "bad_port"} <= hit, \
        model.counters


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
