# SPDX-License-Identifier: BSD-2-Clause
"""AckHandler against its model (random ACK/NAK/CNP streams, forged and stale packets, back to
back on one QP, stalls), management writes during a burst, and the window rules on their own."""

import random

import pytest
from amaranth import *
from amaranth.lib import wiring

from roce_hw import proto
from roce_hw.config import EngineConfig
from roce_hw.ctrl.ack import AckHandler
from roce_hw.ctrl.qp_table import QPStateTable
from roce_hw.model.ack import AckItem, AckModel
from roce_hw.rx.items import roce_rx_layout
from sim.harness import run_simulation

__all__ = []

PEER = 0x0A_00_00_02


class _Bench(Elaboratable):
    def __init__(self, config, rows):
        self.table = QPStateTable(config.n_qp, init=[rows.get(q, {}) for q in range(
            max(rows) + 1)] if rows else None)
        self.ack = AckHandler(config, ev_depth=4)

    def elaborate(self, platform):
        m = Module()
        m.submodules.table = self.table
        m.submodules.ack = self.ack
        wiring.connect(m, self.ack.qp_rd, self.table.ack_rd)
        wiring.connect(m, self.ack.una_upd, self.table.una_upd)
        t = self.table.mgmt_req
        m.d.comb += [self.ack.mgmt_write.valid.eq(t.valid & t.ready & t.payload.write),
                     self.ack.mgmt_write.payload.qp.eq(t.payload.qp)]
        return m


def make_rows(rng, n_qp):
    rows = {}
    for q in range(n_qp):
        nxt = rng.getrandbits(24)
        rows[q] = {"state": proto.QPState.RTS if rng.random() < 0.85 else proto.QPState.RTR,
                   "remote_ip": PEER + (q % 3), "p_key": 0xFFFF, "next_psn": nxt,
                   "una_psn": (nxt - rng.randrange(0, 300)) & proto.PSN_MASK, "pmtu": 3}
    return rows


def random_item(rng, rows, n_qp, hot):
    q = rng.choice(hot) if rng.random() < 0.8 else rng.randrange(n_qp)
    row = rows[q]
    una, nxt = row["una_psn"], row["next_psn"]
    outstanding = (nxt - una) & proto.PSN_MASK
    r = rng.random()
    # mostly inside the window, moving forward, with stale, unsent and forged ones mixed in
    if r < 0.55:
        psn = (una + rng.randrange(0, max(1, outstanding))) & proto.PSN_MASK
    elif r < 0.7:
        psn = (una - rng.randrange(1, 40)) & proto.PSN_MASK
    elif r < 0.8:
        psn = (nxt + rng.randrange(0, 40)) & proto.PSN_MASK
    else:
        psn = rng.getrandbits(24)
    syndrome = rng.choice([0x1F, 0x1F, 0x1F, 0x00, 0x60, 0x60, 0x2E, 0x21, 0x61, 0x62, 0x63,
                           0x64, 0x40, 0x9F])
    kw = dict(src_ip=row["remote_ip"], dest_qp=proto.LOCAL_QPN_BASE + q, psn=psn,
              syndrome=syndrome, msn=rng.getrandbits(24))
    f = rng.random()
    if f < 0.05:
        kw["src_ip"] = PEER + 7
    elif f < 0.08:
        kw["p_key"] = 0x7FFE
    elif f < 0.11:
        kw["dest_qp"] = rng.choice([1, proto.LOCAL_QPN_BASE - 1, proto.LOCAL_QPN_BASE + n_qp,
                                    0xFFFFFF])
    elif f < 0.14:
        kw["opcode"] = rng.choice([0x0A, 0x04, 0x10, 0x12])
    elif f < 0.17:
        kw["opcode"] = int(proto.Opcode.CNP)
        kw["bth_aeth_only"] = False
    elif f < 0.19:
        kw["bth_aeth_only"] = False
    return AckItem(**kw)


def item_const(it):
    return roce_rx_layout().const({
        "src_ip": it.src_ip, "src_port": 0xC000, "udp_length": 28,
        "bth_aeth_only": int(it.bth_aeth_only),
        "bth": {"opcode": it.opcode, "p_key": it.p_key, "dest_qp": it.dest_qp, "psn": it.psn},
        "aeth": {"syndrome": it.syndrome, "msn": it.msn}})


def run_bench(config, rows, items, *, seed, p_idle=0.3, p_stall=0.3, mgmt=None,
              sending=None):
    """Feed ``items`` to the handler; returns (events, una writes, counters)."""
    bench = _Bench(config, rows)
    ack = bench.ack
    rng = random.Random(seed)
    events, writes = [], []
    state = {"done": False, "waits": 0}

    async def feed(ctx):
        if sending is not None:
            ctx.set(ack.sending.open, 1)
            ctx.set(ack.sending.qp, sending[0])
            ctx.set(ack.sending.psn_next, sending[1])
        for k, it in enumerate(items):
            while rng.random() < p_idle:
                await ctx.tick()
            ctx.set(ack.i.payload, item_const(it))
            ctx.set(ack.i.valid, 1)
            state["waits"] += not ctx.get(ack.i.ready)
            await ctx.tick().until(ack.i.ready)
            ctx.set(ack.i.valid, 0)
            if mgmt is not None and k == mgmt[0]:
                t = bench.table.mgmt_req
                ctx.set(t.payload.qp, mgmt[1])
                ctx.set(t.payload.write, 1)
                ctx.set(t.payload.ctx, mgmt[2])
                ctx.set(t.valid, 1)
                await ctx.tick().until(t.ready)
                ctx.set(t.valid, 0)
                ctx.set(bench.table.mgmt_rsp.ready, 1)
        for _ in range(40):
            await ctx.tick()
        state["done"] = True

    async def drain(ctx):
        ev_rng = random.Random(seed + 1)
        while not state["done"]:
            ctx.set(ack.ev.ready, ev_rng.random() >= p_stall)
            await ctx.tick()
            if ctx.get(ack.ev.valid) and ctx.get(ack.ev.ready):
                pass

    async def monitor(ctx):
        async for _clk, _rst, ev_v, ev_r, ev_p, u_v, u_r, u_p in ctx.tick().sample(
                ack.ev.valid, ack.ev.ready, ack.ev.payload, ack.una_upd.valid,
                ack.una_upd.ready, ack.una_upd.payload):
            if ev_v and ev_r:
                events.append({"qp": ev_p.qp, "kind": ev_p.kind, "psn": ev_p.psn,
                               "code": ev_p.code, "msn": ev_p.msn})
            if u_v and u_r:
                writes.append((u_p.qp, u_p.una_psn))

    counters = {}

    async def read_counters(ctx):
        while not state["done"]:
            await ctx.tick()
        for name in proto.ACK_COUNTERS:
            counters[name] = ctx.get(getattr(ack.counters, name))

    run_simulation(bench, [feed, drain, read_counters], [monitor],
                   cycles=20 * len(items) + 400)
    counters["_waits"] = state["waits"]
    return events, writes, counters


@pytest.mark.parametrize("n_qp,seed", [(16, 1), (5, 2), (4096, 3)])
def test_against_model(n_qp, seed):
    rng = random.Random(seed)
    config = EngineConfig(data_width=64, n_qp=n_qp)
    rows = make_rows(rng, min(n_qp, 16))
    model_rows = dict(rows)
    hot = [0, 1, min(2, len(rows) - 1)]
    items = [random_item(rng, rows, len(rows), hot) for _ in range(600)]
    model = AckModel(n_qp, model_rows)
    for it in items:
        model.receive(it)
    events, writes, counters = run_bench(config, rows, items, seed=seed)
    counters.pop("_waits")
    assert counters == model.counters
    assert events == model.events
    una = {q: r["una_psn"] for q, r in rows.items()}
    for q, v in writes:
        una[q] = v
    assert una == {q: model.una[q] for q in rows}
    # the mix exercises every verdict
    assert all(counters[name] > 0 for name in proto.ACK_COUNTERS), counters


def test_back_to_back_one_qp_no_stall():
    """A burst of coalesced ACKs for one QP, one per cycle, some out of order: taken one per
    cycle (ready never drops with ``ev`` always ready), una ends at the newest."""
    rng = random.Random(5)
    config = EngineConfig(data_width=512, n_qp=16)
    rows = {0: {"state": proto.QPState.RTS, "remote_ip": PEER, "p_key": 0xFFFF,
                "next_psn": 1000, "una_psn": 0}}
    psns = sorted(rng.sample(range(0, 1000), 200))
    for k in range(0, len(psns) - 1, 7):         # local reordering
        psns[k], psns[k + 1] = psns[k + 1], psns[k]
    items = [AckItem(src_ip=PEER, dest_qp=proto.LOCAL_QPN_BASE, psn=p) for p in psns]
    model = AckModel(16, rows)
    for it in items:
        model.receive(it)
    events, writes, counters = run_bench(config, rows, items, seed=5, p_idle=0, p_stall=0)
    assert counters.pop("_waits") == 0            # one packet per cycle, never a stall
    assert counters == model.counters
    assert events == model.events
    assert writes[-1] == (0, model.una[0]) == (0, max(psns) + 1)
    assert counters["acks_stale"] > 0


def test_management_write_during_burst_wins():
    """A QP rewritten (reopened, nothing outstanding) in the middle of a burst of its ACKs: no
    ACK of the old connection writes over the new row's una_psn."""
    rows = {0: {"state": proto.QPState.RTS, "remote_ip": PEER, "p_key": 0xFFFF,
                "next_psn": 5000, "una_psn": 0}}
    items = [AckItem(src_ip=PEER, dest_qp=proto.LOCAL_QPN_BASE, psn=p)
             for p in range(100, 4000, 20)]
    new = {"state": int(proto.QPState.RTS), "remote_ip": PEER, "p_key": 0xFFFF,
           "next_psn": 0x800000, "una_psn": 0x800000, "pmtu": 3}
    for at in (3, 50, 150):
        events, writes, counters = run_bench(EngineConfig(data_width=64, n_qp=4), rows, items,
                                             seed=at, p_idle=0, p_stall=0.2,
                                             mgmt=(at, 0, new))
        after = [w for w in writes if w[1] >= 0x800000]
        assert not after
        # everything after the write is refused as unsent or killed; una_psn is the new one
        assert counters["acks"] + counters["psn_unsent"] + counters["acks_stale"] + \
            counters["qp_not_open"] == len(items)
        assert counters["acks"] <= at + 1 + 3


def test_sending_extends_the_window():
    """While a new message is being sent, ACKs up to its last committed packet count."""
    rows = {0: {"state": proto.QPState.RTS, "remote_ip": PEER, "p_key": 0xFFFF,
                "next_psn": 100, "una_psn": 90}}
    items = [AckItem(src_ip=PEER, dest_qp=proto.LOCAL_QPN_BASE, psn=p) for p in (95, 130, 150)]
    events, writes, counters = run_bench(EngineConfig(data_width=64, n_qp=4), rows, items,
                                         seed=1, sending=(0, 140))
    assert counters["acks"] == 2 and counters["psn_unsent"] == 1
    assert writes == [(0, 96), (0, 131)]


def test_bad_parameters():
    with pytest.raises(ValueError, match="ev_depth"):
        AckHandler(EngineConfig(data_width=64), ev_depth=1)
    with pytest.raises(TypeError):
        AckHandler(64)


@pytest.mark.parametrize("gap", [1, 2, 3, 4])
def test_interleaved_qps_see_every_earlier_write(gap):
    """ACKs of QP 0 with ``gap`` - 1 packets of other QPs between them, each older than the one
    before: every one after the first is stale (it must see the una the first one wrote,
    whichever stage of the handler that write is in)."""
    rows = {q: {"state": proto.QPState.RTS, "remote_ip": PEER, "p_key": 0xFFFF,
                "next_psn": 1000, "una_psn": 0} for q in range(4)}
    items = []
    for k in range(8):
        items.append(AckItem(src_ip=PEER, dest_qp=proto.LOCAL_QPN_BASE, psn=500 - 10 * k))
        for j in range(gap - 1):
            items.append(AckItem(src_ip=PEER, dest_qp=proto.LOCAL_QPN_BASE + 1 + j % 3,
                                 psn=100 + k))
    model = AckModel(4, rows)
    for it in items:
        model.receive(it)
    events, writes, counters = run_bench(EngineConfig(data_width=64, n_qp=4), rows, items,
                                         seed=gap, p_idle=0, p_stall=0)
    assert counters.pop("_waits") == 0
    assert counters == model.counters
    assert counters["acks_stale"] == 7
    assert [w for w in writes if w[0] == 0] == [(0, 501)]


def _forged_acks(peer_frames):
    """ACK frames the engine must not act on, built from the first real one of the responder:
    PSN never sent, an older PSN, wrong source IP, QP not open, bad iCRC."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.contrib.roce import BTH, AETH
    out = []
    ref = Ether(peer_frames[0])
    for kind in ("unsent", "stale", "src", "qp", "icrc"):
        f = ref.copy()
        if kind == "unsent":
            f[BTH].psn = (f[BTH].psn + 5000) & proto.PSN_MASK
        elif kind == "stale":
            f[BTH].psn = (f[BTH].psn - 1) & proto.PSN_MASK
        elif kind == "src":
            f[IP].src = "10.9.9.9"
        elif kind == "qp":
            f[BTH].dqpn = proto.LOCAL_QPN_BASE + 15         # a QP never opened
        del f[IP].chksum
        f[BTH].icrc = None                  # (scapy computes it again)
        raw = bytearray(bytes(f))
        if kind == "icrc":
            raw[-1] ^= 0x55
        out.append((kind, bytes(raw)))
    return out


@pytest.mark.tools("verilator")
@pytest.mark.parametrize("width", [64])
def test_engine_acks_from_the_responder(width):
    """The whole engine against the independent responder model (sim/peer.py): every QP's
    una_psn reaches its next_psn, every ACK is acted on or counted stale, and forged ACKs
    (PSN never sent, an older PSN, wrong source IP, a QP not open, bad iCRC) change nothing."""
    from sim.backend import open_engine
    from sim.traffic import DEFAULT_LOCAL_IP, DEFAULT_LOCAL_MAC, peer_for, random_workload
    config = EngineConfig(data_width=width, n_qp=16)
    qps, wrs = random_workload(n_qps=4, messages=40, ops=("write", "write_imm", "send",
                                                          "send_imm"),
                               min_size=0, max_size=3000, pmtu=1024, seed=11)
    peer = peer_for(qps, wrs)
    eng = open_engine(config, backend="verilator", top="engine", seed=11)
    eng.set_addr(DEFAULT_LOCAL_MAC, DEFAULT_LOCAL_IP)
    for q in qps:
        eng.write_qp(q)
    for n, w in enumerate(wrs):
        eng.post(w, wr_id=n + 1)
    replies = []
    for _ in range(400):
        eng.run(256)
        for f in eng.pop_tx():
            for r in peer.receive(f.data):
                replies.append(r)
                eng.push_rx(r, cycle=f.last + 100)
    before = eng.counters()
    forged = _forged_acks(replies)
    for _, frame in forged:
        eng.push_rx(frame, cycle=eng.cycle + 10)
    eng.run(2000)
    after = eng.counters()
    eng.pop_mgmt_rsp()                       # (the set-up writes' responses)
    rows = {r["qp"]: r["ctx"] for r in eng.qp_table(range(4))}
    eng.close()
    assert not peer.fatal_violations
    assert len(peer.completions) == len(wrs)
    for q in qps:
        assert rows[q.index]["una_psn"] == rows[q.index]["next_psn"] != q.start_psn
    assert before["ack_acks"] + before["ack_acks_stale"] == len(replies) == \
        before["ack_ack_items"]
    assert before["ack_acks"] > 0
    delta = {k: after[k] - before[k] for k in after if k.startswith(("ack_", "rx_"))}
    assert delta["ack_ack_items"] == 4 and delta["ack_psn_unsent"] == 1
    assert delta["ack_acks_stale"] == 1
    assert delta["ack_bad_src"] + delta["ack_qp_not_open"] == 2 and delta["ack_acks"] == 0
    assert after["rx_icrc"] == before["rx_icrc"] + 1


@pytest.mark.tools("verilator")
def test_engine_absorbs_back_to_back_acks():
    """200 ACK frames back to back on the engine's RX port at 512 bits (one beat each, one per
    cycle): every one reaches the ACK handler (none lost to a full queue) and the QP's una_psn
    ends past the newest."""
    from scapy.contrib.roce import AETH, BTH
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from sim.backend import open_engine
    from sim.bfm import QPSetup
    from sim.traffic import DEFAULT_LOCAL_IP, DEFAULT_LOCAL_MAC
    config = EngineConfig(data_width=512, n_qp=16)
    q = QPSetup(index=2, remote_qpn=0x1234, remote_mac=0x02_00_00_00_10_02,
                remote_ip=0x0A_00_01_02, udp_sport=0xC001, start_psn=0, pmtu=1024)
    eng = open_engine(config, backend="verilator", top="engine", seed=3)
    eng.set_addr(DEFAULT_LOCAL_MAC, DEFAULT_LOCAL_IP)
    eng.write_qp(q)
    # 300 packets sent (a message of 300 PMTU), so the ACKs have something to acknowledge
    from sim.bfm import WorkItem
    eng.post(WorkItem(qp=2, opcode=proto.WrOpcode.RDMA_WRITE, payload=bytes(300 * 1024),
                      r_key=1), wr_id=1)
    eng.run(20000)
    assert len(eng.pop_tx()) == 300
    start = eng.cycle + 10
    for k in range(200):
        frame = bytes(Ether(src="02:00:00:00:10:02", dst="02:00:00:00:00:01") /
                      IP(src="10.0.1.2", dst="10.0.0.1", flags="DF") /
                      UDP(sport=0xC000, dport=4791, chksum=0) /
                      BTH(opcode=0x11, dqpn=proto.LOCAL_QPN_BASE + 2, psn=k + 1) /
                      AETH(syndrome=0x1F, msn=k))
        eng.push_rx(frame, cycle=start + k)
    before = eng.counters()
    eng.run(2000)
    after = eng.counters()
    eng.pop_mgmt_rsp()
    row = eng.qp_table([2])[0]["ctx"]
    eng.close()
    assert after["rx_roce"] - before["rx_roce"] == 200 and after["rx_roce_full"] == 0
    assert after["ack_acks"] - before["ack_acks"] == 200
    assert row["una_psn"] == 201


def test_latency():
    """An ACK taken in cycle t writes una_upd in cycle t + AckHandler.latency, and its event is
    valid on ``ev`` in cycle t + latency + ``ev_latency`` (the FIFO's)."""
    rows = {0: {"state": proto.QPState.RTS, "remote_ip": PEER, "p_key": 0xFFFF,
                "next_psn": 100, "una_psn": 0}}
    bench = _Bench(EngineConfig(data_width=64, n_qp=4), rows)
    ack = bench.ack
    seen = {}

    async def tb(ctx):
        ctx.set(ack.ev.ready, 1)
        ctx.set(ack.i.payload, item_const(AckItem(src_ip=PEER, dest_qp=proto.LOCAL_QPN_BASE,
                                                  psn=7)))
        ctx.set(ack.i.valid, 1)
        for cycle in range(12):
            if cycle == 0:
                assert ctx.get(ack.i.ready)
            if ctx.get(ack.una_upd.valid) and ctx.get(ack.una_upd.ready):
                seen.setdefault("una", cycle)
            if ctx.get(ack.ev.valid):
                seen.setdefault("ev", cycle)
            await ctx.tick()
            ctx.set(ack.i.valid, 0)

    run_simulation(bench, [tb], cycles=100)
    assert seen == {"una": AckHandler.latency, "ev": AckHandler.latency + AckHandler.ev_latency}
