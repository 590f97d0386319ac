# SPDX-License-Identifier: BSD-2-Clause
"""QPStateTable against the pure-Python QP state model: random traffic, transparency, errors,
fairness, Verilog lint."""

import gc
import random
import shutil
import subprocess
import time

import pytest
from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from roce_hw import proto
from roce_hw.config import EngineConfig
from roce_hw.model.qp_table import CONTEXT_FIELDS, QPStateModel
from roce_hw.ctrl.qp_table import QPStateTable
from roce_hw.layouts import local_qpn, mgmt_req_layout, mgmt_rsp_layout, QP_CONTEXT, qp_index, qp_index_width, QPReadSignature, tx_upd_layout, una_upd_layout
from sim.harness import run_simulation
from roce_hw.generate import emit, lint

__all__ = []


def row_of(view):
    """A QP_CONTEXT value read from the simulator as a plain dict."""
    return {name: int(view[name]) for name in CONTEXT_FIELDS}


def random_row(rng):
    return {name: rng.getrandbits(width) for name, width in CONTEXT_FIELDS.items()}


def pick_qp(rng, n_qp):
    """Mostly a small hot set (to make same-QP collisions frequent), sometimes any encodable
    index, including out-of-range ones when n_qp is not a power of two."""
    space = 1 << qp_index_width(n_qp)
    r = rng.random()
    if r < 0.6:
        return rng.choice([0, min(1, n_qp - 1), n_qp - 1])
    if r < 0.7 and space > n_qp:
        return rng.randrange(n_qp, space)
    return rng.randrange(space)


class Driver:
    """A stream source obeying the stream rules: once valid, hold the payload until transfer."""

    def __init__(self, port, rng, p_valid, make):
        self.port, self.rng, self.p_valid, self.make = port, rng, p_valid, make
        self.pending = None
        self.waited = 0
        self.max_wait = 0
        self.count = 0
        self.enabled = True

    def drive(self, ctx):
        if self.pending is None and self.enabled and self.rng.random() < self.p_valid:
            self.pending = self.make()
            self.waited = 0
            ctx.set(self.port.payload, self.pending)
        ctx.set(self.port.valid, self.pending is not None)

    def transfer(self, ctx):
        """Return the payload transferred this cycle (``ready`` sampled after driving), or None."""
        if self.pending is None:
            return None
        if ctx.get(self.port.ready):
            p, self.pending = self.pending, None
            self.count += 1
            return p
        self.waited += 1
        self.max_wait = max(self.max_wait, self.waited)
        return None


def run_random(n_qp, seed, cycles, *, p_req=0.5, p_write=0.5, p_tx=0.5, p_una=0.4,
               p_rsp_ready=0.7, p_en=0.7):
    """Random mixed traffic on every port, checked cycle by cycle against QPStateModel.

    Returns statistics (transfer counts, maximal waits, same-cycle collisions seen)."""
    rng = random.Random(seed)
    dut = QPStateTable(n_qp)
    model = QPStateModel(n_qp)
    stats = {"rsp": 0, "trd": 0, "collide": 0, "errors": 0}

    mgmt = Driver(dut.mgmt_req, rng, p_req, lambda: {
        "qp": pick_qp(rng, n_qp), "write": int(rng.random() < p_write), "ctx": random_row(rng)})
    tx = Driver(dut.tx_upd, rng, p_tx, lambda: {
        "qp": pick_qp(rng, n_qp), "psn_we": rng.getrandbits(1),
        "next_psn": rng.getrandbits(24), "state_we": rng.getrandbits(1),
        "state": rng.getrandbits(3)})
    una = Driver(dut.una_upd, rng, p_una, lambda: {
        "qp": pick_qp(rng, n_qp), "una_psn": rng.getrandbits(24)})

    async def testbench(ctx):
        expected_rsp = []
        expected_trd = None   # row the tx_rd port must show in the next cycle
        staged = None         # (qp, row before it) of the management write taken last cycle
        for cycle in range(cycles + 400):
            draining = cycle >= cycles
            for d in (mgmt, tx, una):
                d.enabled = not draining
                d.drive(ctx)
            rsp_ready = draining or rng.random() < p_rsp_ready
            ctx.set(dut.mgmt_rsp.ready, rsp_ready)
            en = (not draining) and rng.random() < p_en
            addr = pick_qp(rng, n_qp)
            ctx.set(dut.tx_rd.en, en)
            ctx.set(dut.tx_rd.addr, addr)

            # Response transfer of this cycle (for a request of an earlier cycle).
            if ctx.get(dut.mgmt_rsp.valid):
                if rsp_ready:
                    assert expected_rsp, f"cycle {cycle}: response without a request"
                    got = ctx.get(dut.mgmt_rsp.payload)
                    exp = expected_rsp.pop(0)
                    assert (int(got.qp), int(got.write), int(got.error), row_of(got.ctx)) == \
                        (exp["qp"], exp["write"], exp["error"], exp["ctx"]), f"cycle {cycle}"
                    stats["rsp"] += 1
            # tx_rd reads the row from before this cycle's writes (not transparent), and a
            # management write is written the cycle after its transfer (the write stage); the
            # management port's reads are transparent.
            if en and staged is not None and staged[0] == addr:
                trd = staged[1]
            else:
                trd = model.read(addr) if en else expected_trd
            m_req = mgmt.transfer(ctx)
            t_upd = tx.transfer(ctx)
            u_upd = una.transfer(ctx)
            assert not (staged is not None and (t_upd or u_upd)), \
                f"cycle {cycle}: internal write together with a staged management write"
            staged = None
            written = set()
            if t_upd:
                model.tx_upd(**t_upd)
                if t_upd["psn_we"] or t_upd["state_we"]:
                    written.add(t_upd["qp"])
            if u_upd:
                model.una_upd(**u_upd)
                written.add(u_upd["qp"])
            if m_req:
                if m_req["write"] and m_req["qp"] < n_qp:
                    staged = (m_req["qp"], model.read(m_req["qp"]))
                rsp = model.mgmt(m_req["qp"], m_req["write"], m_req["ctx"])
                stats["errors"] += rsp["error"]
                expected_rsp.append(rsp)
                if m_req["write"]:
                    written.add(m_req["qp"])
            if en:
                if addr in written and addr < n_qp:
                    stats["collide"] += 1
            await ctx.tick()
            if trd is not None:
                assert row_of(ctx.get(dut.tx_rd.data)) == trd, f"tx_rd after cycle {cycle}"
                stats["trd"] += en
            expected_trd = trd
            assert ctx.get(dut.upd_dropped) == model.dropped
        assert not expected_rsp, f"{len(expected_rsp)} responses missing"
        assert not ctx.get(dut.mgmt_rsp.valid), "extra response"
        for d in (mgmt, tx, una):
            assert d.pending is None

    run_simulation(dut, [testbench], cycles=cycles + 410, vcd_name=f"qp_state_random_{n_qp}")
    stats.update(mgmt=mgmt.count, tx=tx.count, una=una.count, tx_wait=tx.max_wait,
                 una_wait=una.max_wait, mgmt_wait=mgmt.max_wait)
    return stats


@pytest.mark.parametrize("n_qp,seed,cycles", [
    (1, 1, 1000), (16, 2, 3000), (1000, 3, 3000), (1024, 4, 1500)])
def test_random_traffic(n_qp, seed, cycles):
    stats = run_random(n_qp, seed, cycles)
    # The run exercised what it claims to (so the comparisons above could have failed).
    assert stats["rsp"] == stats["mgmt"] > cycles // 5
    assert stats["tx"] > cycles // 5 and stats["una"] > cycles // 5
    assert stats["trd"] > cycles // 2
    assert stats["collide"] > 20
    if n_qp in (1, 1000):
        assert stats["errors"] > 5
    # tx_upd/una_upd are blocked only in a write stage's cycle, then go the next cycle.
    assert stats["tx_wait"] <= 1 and stats["una_wait"] <= 1


@pytest.mark.parametrize("n_qp", [16, 1000])
def test_random_traffic_wait_bounds(n_qp):
    """Busy internal writers, response always ready: a management request waits at most 1
    cycle (the write stage's), an internal write at most 1 (the same)."""
    stats = run_random(n_qp, 6, 1000, p_req=0.8, p_write=0.9, p_tx=0.8, p_una=0.8,
                       p_rsp_ready=1.0)
    assert stats["mgmt"] > 400 and stats["tx"] > 400 and stats["una"] > 400, stats
    assert stats["mgmt_wait"] == 1 and stats["tx_wait"] == 1 and stats["una_wait"] == 1, stats


@pytest.mark.slow
@pytest.mark.parametrize("n_qp", [1, 2, 3, 16, 17, 1000, 1024, 4096])
@pytest.mark.parametrize("seed", [11, 12, 13])
def test_random_traffic_slow(n_qp, seed):
    for p in (dict(), dict(p_req=1.0, p_tx=1.0, p_una=1.0, p_rsp_ready=1.0),
              dict(p_req=0.9, p_write=0.9, p_rsp_ready=0.3, p_en=1.0)):
        run_random(n_qp, seed, 3000, **p)


def _hammer(n_qp, mgmt_write, cycles=200):
    """All of mgmt_req (writes or reads), tx_upd and una_upd valid every cycle, response always
    ready; returns the transfer counts and longest waits."""
    dut = QPStateTable(n_qp)
    rng = random.Random(5)
    res = {}

    async def testbench(ctx):
        counts = dict.fromkeys(("mgmt", "tx", "una"), 0)
        waits = dict.fromkeys(counts, 0)
        longest = dict.fromkeys(counts, 0)
        ctx.set(dut.mgmt_rsp.ready, 1)
        ports = {"mgmt": dut.mgmt_req, "tx": dut.tx_upd, "una": dut.una_upd}
        for _ in range(cycles):
            ctx.set(dut.mgmt_req.payload, {"qp": 0, "write": mgmt_write, "ctx": random_row(rng)})
            ctx.set(dut.tx_upd.payload, {"qp": 0, "psn_we": 1, "next_psn": rng.getrandbits(24),
                                         "state_we": 1, "state": 3})
            ctx.set(dut.una_upd.payload, {"qp": 0, "una_psn": rng.getrandbits(24)})
            for name, port in ports.items():
                ctx.set(port.valid, 1)
            for name, port in ports.items():
                if ctx.get(port.ready):
                    counts[name] += 1
                    waits[name] = 0
                else:
                    waits[name] += 1
                    longest[name] = max(longest[name], waits[name])
            await ctx.tick()
        res.update(counts=counts, longest=longest)

    run_simulation(dut, [testbench], cycles=cycles + 5)
    return res["counts"], res["longest"]


@pytest.mark.parametrize("n_qp", [1, 16])
def test_no_starvation(n_qp):
    counts, longest = _hammer(n_qp, mgmt_write=1)
    # Management writes every other cycle (the write stage), the internal writers in between.
    assert counts["mgmt"] >= 99 and counts["tx"] >= 99 and counts["una"] >= 99, counts
    assert counts["mgmt"] + counts["tx"] == 200 and counts["tx"] == counts["una"], counts
    assert max(longest.values()) <= 1, longest
    # Management reads never conflict with the writers: everyone goes every cycle.
    counts, longest = _hammer(n_qp, mgmt_write=0)
    assert counts == {"mgmt": 200, "tx": 200, "una": 200}, counts


async def _mgmt(ctx, dut, qp, write, row=None):
    """One management transaction; returns the response (qp, write, error, ctx dict)."""
    ctx.set(dut.mgmt_req.payload, {"qp": qp, "write": write, "ctx": row or {}})
    ctx.set(dut.mgmt_req.valid, 1)
    ctx.set(dut.mgmt_rsp.ready, 1)
    await ctx.tick().until(dut.mgmt_req.ready)   # returns after the transfer's clock edge
    ctx.set(dut.mgmt_req.valid, 0)
    assert ctx.get(dut.mgmt_rsp.valid)           # 1-cycle latency
    payload = ctx.get(dut.mgmt_rsp.payload)
    await ctx.tick()                              # the response transfers
    return int(payload.qp), int(payload.write), int(payload.error), row_of(payload.ctx)


def test_read_after_write_and_transparency():
    dut = QPStateTable(16)
    rng = random.Random(7)
    a, b = random_row(rng), random_row(rng)

    async def testbench(ctx):
        # Management write; it is written the cycle after its transfer (the write stage, the
        # response's first cycle), so tx_rd (not transparent) sees the old row when issued in
        # either cycle and the new one two cycles after the transfer. No management request
        # is taken in the stage's cycle; a read right after it sees the new row.
        ctx.set(dut.tx_rd.addr, 9)
        ctx.set(dut.tx_rd.en, 1)
        ctx.set(dut.mgmt_req.payload, {"qp": 9, "write": 1, "ctx": a})
        ctx.set(dut.mgmt_req.valid, 1)
        ctx.set(dut.mgmt_rsp.ready, 1)
        assert ctx.get(dut.mgmt_req.ready)
        await ctx.tick()
        ctx.set(dut.mgmt_req.payload, {"qp": 9, "write": 0, "ctx": {}})
        assert not ctx.get(dut.mgmt_req.ready)         # the write stage's cycle
        assert row_of(ctx.get(dut.tx_rd.data)) == QPStateModel.zero_row()
        assert ctx.get(dut.mgmt_rsp.valid)
        assert row_of(ctx.get(dut.mgmt_rsp.payload.ctx)) == a   # the row as written
        await ctx.tick()
        assert ctx.get(dut.mgmt_req.ready)
        assert row_of(ctx.get(dut.tx_rd.data)) == QPStateModel.zero_row()
        await ctx.tick()
        ctx.set(dut.mgmt_req.valid, 0)
        assert row_of(ctx.get(dut.tx_rd.data)) == a
        assert ctx.get(dut.mgmt_rsp.valid)
        assert row_of(ctx.get(dut.mgmt_rsp.payload.ctx)) == a   # the read
        await ctx.tick()
        ctx.set(dut.tx_rd.en, 0)
        assert row_of(ctx.get(dut.tx_rd.data)) == a
        await ctx.tick()
        # en low: the data is held.
        assert row_of(ctx.get(dut.tx_rd.data)) == a
        # tx_upd and una_upd in the same cycle as a tx_rd of the same QP.
        ctx.set(dut.tx_upd.payload, {"qp": 9, "psn_we": 1, "next_psn": 0xABCDEF,
                                     "state_we": 1, "state": proto.QPState.ERROR})
        ctx.set(dut.tx_upd.valid, 1)
        ctx.set(dut.una_upd.payload, {"qp": 9, "una_psn": 0x123456})
        ctx.set(dut.una_upd.valid, 1)
        ctx.set(dut.tx_rd.en, 1)
        assert ctx.get(dut.tx_upd.ready) and ctx.get(dut.una_upd.ready)
        await ctx.tick()
        ctx.set(dut.tx_upd.valid, 0)
        ctx.set(dut.una_upd.valid, 0)
        expect = dict(a, next_psn=0xABCDEF, state=6, una_psn=0x123456)
        assert row_of(ctx.get(dut.tx_rd.data)) == a
        await ctx.tick()
        ctx.set(dut.tx_rd.en, 0)
        assert row_of(ctx.get(dut.tx_rd.data)) == expect
        # A tx_upd with only state_we leaves next_psn alone, and vice versa.
        ctx.set(dut.tx_upd.payload, {"qp": 9, "psn_we": 0, "next_psn": 1, "state_we": 1,
                                     "state": proto.QPState.RTS})
        ctx.set(dut.tx_upd.valid, 1)
        await ctx.tick()
        ctx.set(dut.tx_upd.payload, {"qp": 9, "psn_we": 1, "next_psn": 2, "state_we": 0,
                                     "state": proto.QPState.RESET})
        await ctx.tick()
        ctx.set(dut.tx_upd.valid, 0)
        assert await _mgmt(ctx, dut, 9, 0) == (9, 0, 0, dict(expect, state=3, next_psn=2))
        # Other rows untouched; a second write replaces the whole row.
        assert await _mgmt(ctx, dut, 8, 0) == (8, 0, 0, QPStateModel.zero_row())
        assert await _mgmt(ctx, dut, 9, 1, b) == (9, 1, 0, b)
        assert await _mgmt(ctx, dut, 9, 0) == (9, 0, 0, b)

    run_simulation(dut, [testbench], cycles=100)


@pytest.mark.parametrize("n_qp", [1, 1000])
def test_out_of_range(n_qp):
    dut = QPStateTable(n_qp)
    rng = random.Random(8)
    space = 1 << qp_index_width(n_qp)
    rows = {qp: random_row(rng) for qp in range(n_qp)}

    async def testbench(ctx):
        for qp, row in rows.items():
            assert await _mgmt(ctx, dut, qp, 1, row) == (qp, 1, 0, row)
        bad = list(range(n_qp, space))
        for qp in bad:
            assert await _mgmt(ctx, dut, qp, 1, random_row(rng)) == \
                (qp, 1, 1, QPStateModel.zero_row())
            assert await _mgmt(ctx, dut, qp, 0) == (qp, 0, 1, QPStateModel.zero_row())
            ctx.set(dut.tx_upd.payload, {"qp": qp, "psn_we": 1, "next_psn": 5, "state_we": 1,
                                         "state": 1})
            ctx.set(dut.tx_upd.valid, 1)
            ctx.set(dut.una_upd.payload, {"qp": qp, "una_psn": 5})
            ctx.set(dut.una_upd.valid, 1)
            await ctx.tick().until(dut.tx_upd.ready & dut.una_upd.ready)
            ctx.set(dut.tx_upd.valid, 0)
            ctx.set(dut.una_upd.valid, 0)
            ctx.set(dut.tx_rd.addr, qp)
            ctx.set(dut.tx_rd.en, 1)
            await ctx.tick()
            ctx.set(dut.tx_rd.en, 0)
            assert row_of(ctx.get(dut.tx_rd.data)) == QPStateModel.zero_row()
        assert ctx.get(dut.upd_dropped) == 2 * len(bad)
        # Nothing was written: every valid row still holds what was written first.
        for qp, row in rows.items():
            ctx.set(dut.tx_rd.addr, qp)
            ctx.set(dut.tx_rd.en, 1)
            await ctx.tick()
            assert row_of(ctx.get(dut.tx_rd.data)) == row, qp

    run_simulation(dut, [testbench], cycles=20 * n_qp + 200)


def test_init_rows():
    rows = [{"state": proto.QPState.RTS, "next_psn": 100, "remote_qpn": 0x11},
            {"state": proto.QPState.INIT, "una_psn": 7, "r_key": 0xDEAD}]
    dut = QPStateTable(4, init=rows)

    async def testbench(ctx):
        for qp in range(4):
            exp = dict(QPStateModel.zero_row(), **rows[qp]) if qp < 2 else \
                QPStateModel.zero_row()
            assert await _mgmt(ctx, dut, qp, 0) == (qp, 0, 0, exp)

    run_simulation(dut, [testbench], cycles=50)


def test_context_layout():
    assert {name: field.width for name, field in QP_CONTEXT} == CONTEXT_FIELDS
    assert QP_CONTEXT.size == sum(CONTEXT_FIELDS.values())


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_parameters():
    for bad in (0, 16385, -1, True, 1.5, "16", None):
        with pytest.raises(ValueError, match="n_qp"):
            QPStateTable(bad)
    with pytest.raises(ValueError, match="init"):
        QPStateTable(2, init=[{}, {}, {}])
    with pytest.raises(Exception):
        QPStateTable(2, init=[{"no_such_field": 1}])
    assert QPStateTable().n_qp == EngineConfig().n_qp == 16
    assert [qp_index_width(n) for n in (1, 2, 16, 17, 1000, 1024, 16384)] == \
        [1, 1, 4, 5, 10, 10, 14]
    assert QPStateTable(1000).idx_width == 10
    gc.collect()   # the UnusedElaboratable warnings of the objects above, under this filter


def test_local_qpn():
    assert local_qpn(0) == 256 and local_qpn(1023) == 1279
    assert qp_index(256 + 5) == 5
    with pytest.raises(ValueError):
        qp_index(255)
    with pytest.raises(ValueError):
        qp_index(256 + 16, n_qp=16)
    idx = Signal(10)
    qpn = Signal(24)
    m = Module()
    m.d.comb += qpn.eq(local_qpn(idx))

    async def testbench(ctx):
        for i in (0, 1, 999, 1023):
            ctx.set(idx, i)
            assert ctx.get(qpn) == 256 + i

    sim = Simulator(m)
    sim.add_testbench(testbench)
    sim.run()


class _Reader(wiring.Component):
    """A minimal reader, the way the TX datapath connects to ``tx_rd``."""

    def __init__(self, idx_width):
        super().__init__({"qp_rd": Out(QPReadSignature(idx_width)), "state": Out(3)})

    def elaborate(self, platform):
        m = Module()
        m.d.comb += [self.qp_rd.addr.eq(3), self.qp_rd.en.eq(1),
                     self.state.eq(self.qp_rd.data.state)]
        return m


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_read_signature_connect():
    assert QPReadSignature(4) == QPReadSignature(4) != QPReadSignature(5)
    assert repr(QPReadSignature(4)) == "QPReadSignature(4)"
    assert QPStateTable(16).signature.members["tx_rd"] == In(QPReadSignature(4))
    with pytest.raises(ValueError):
        QPReadSignature(0)
    m = Module()
    m.submodules.table = table = QPStateTable(16, init=[{}] * 3 + [{"state": 3}])
    m.submodules.reader = reader = _Reader(4)
    wiring.connect(m, reader.qp_rd, table.tx_rd)

    async def testbench(ctx):
        await ctx.tick()
        assert ctx.get(reader.state) == proto.QPState.RTS

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    gc.collect()


@pytest.mark.parametrize("n_qp", [1, 16, 1000, 1024])
def test_verilog_lint(n_qp):
    text = emit(QPStateTable(n_qp), "qp_state")
    lint(text, "qp_state")
    # Rows live in memories (arrays), not per-QP registers.
    assert f"mem_cfg [{max(2, n_qp) - 1}:0]" in text


@pytest.mark.slow
def test_verilog_lint_max():
    text = emit(QPStateTable(16384), "qp_state")
    lint(text, "qp_state")
    assert "mem_cfg [16383:0]" in text


def test_startup_time_1024(capsys):
    # CPU time of this process, not wall time: the bound holds on a loaded machine too
    t0 = time.process_time()
    dut = QPStateTable(1024)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    t1 = time.process_time()
    sim.run_until(1e-8 * 100)
    t2 = time.process_time()
    with capsys.disabled():
        print(f"\nQPStateTable(1024): elaboration+Simulator {t1 - t0:.2f} s of CPU, "
              f"first 100 cycles {t2 - t1:.2f} s")
    assert t2 - t0 < 10


def test_verilog_out_of_range_iverilog(tmp_path):
    """The emitted Verilog, simulated by Icarus: out-of-range reads give an all-zero row (not
    X, which Amaranth's simulator cannot show) and out-of-range writes/updates change nothing."""
    if shutil.which("iverilog") is None:
        pytest.skip("iverilog not installed")
    n_qp = 5
    rng = random.Random(9)
    good, other = random_row(rng), random_row(rng)
    req = mgmt_req_layout(n_qp)
    rsp = mgmt_rsp_layout(n_qp)
    w = QP_CONTEXT.size

    def req_bits(qp, write, row):
        return req.const({"qp": qp, "write": write, "ctx": row}).as_bits()

    def rsp_bits(qp, write, error, row):
        return rsp.const({"qp": qp, "write": write, "error": error, "ctx": row}).as_bits()

    zero = QPStateModel.zero_row()
    steps = [(4, 1, good, rsp_bits(4, 1, 0, good))]
    for qp in range(n_qp, 8):
        steps += [(qp, 1, other, rsp_bits(qp, 1, 1, zero)),
                  (qp, 0, other, rsp_bits(qp, 0, 1, zero))]
    steps += [(4, 0, other, rsp_bits(4, 0, 0, good))]
    upd = tx_upd_layout(n_qp).const({"qp": 6, "psn_we": 1, "next_psn": 9, "state_we": 1,
                                     "state": 3}).as_bits()
    una = una_upd_layout(n_qp).const({"qp": 7, "una_psn": 9}).as_bits()
    lines = []
    for qp, write, row, expect in steps:
        lines.append(f"""
        mgmt_req__payload = {req.size}'h{req_bits(qp, write, row):x}; mgmt_req__valid = 1;
        #1; if (mgmt_req__ready !== 1) begin $display("FAIL ready {qp}"); $finish; end
        @(posedge clk); #1; mgmt_req__valid = 0;
        if (mgmt_rsp__valid !== 1 || mgmt_rsp__payload !== {rsp.size}'h{expect:x})
          begin $display("FAIL rsp qp={qp} write={write} %h", mgmt_rsp__payload); $finish; end
        @(posedge clk); #1;""")
    good_bits = QP_CONTEXT.const(good).as_bits()
    for qp in range(n_qp, 8):
        # An in-range read first: Icarus never runs an ``always @*`` block whose inputs have not
        # changed since time 0, so the gating must see a 1 -> 0 edge to show its output.
        lines.append(f"""
        tx_rd__addr = 4; tx_rd__en = 1; @(posedge clk); #1;
        if (tx_rd__data !== {w}'h{good_bits:x}) begin $display("FAIL row 4 %h", tx_rd__data); $finish; end
        tx_rd__addr = {qp}; tx_rd__en = 1; @(posedge clk); #1; tx_rd__en = 0;
        if (tx_rd__data !== {w}'h0) begin $display("FAIL tx_rd {qp} %h", tx_rd__data); $finish; end""")
    tb = f"""
`timescale 1ns/1ps
module tb;
  reg clk = 0, rst = 1;
  always #5 clk = ~clk;
  reg [{req.size - 1}:0] mgmt_req__payload = 0; reg mgmt_req__valid = 0;
  wire mgmt_req__ready; wire [{rsp.size - 1}:0] mgmt_rsp__payload; wire mgmt_rsp__valid;
  reg [2:0] tx_rd__addr = 0; reg tx_rd__en = 0; wire [{w - 1}:0] tx_rd__data;
  reg [{tx_upd_layout(n_qp).size - 1}:0] tx_upd__payload = {tx_upd_layout(n_qp).size}'h{upd:x};
  reg tx_upd__valid = 0; wire tx_upd__ready;
  reg [{una_upd_layout(n_qp).size - 1}:0] una_upd__payload = {una_upd_layout(n_qp).size}'h{una:x};
  reg una_upd__valid = 0; wire una_upd__ready; wire [15:0] upd_dropped;
  qp5 dut(.clk(clk), .rst(rst), .mgmt_req__payload(mgmt_req__payload),
    .mgmt_req__valid(mgmt_req__valid), .mgmt_req__ready(mgmt_req__ready),
    .mgmt_rsp__payload(mgmt_rsp__payload), .mgmt_rsp__valid(mgmt_rsp__valid),
    .mgmt_rsp__ready(1'b1), .tx_rd__addr(tx_rd__addr), .tx_rd__en(tx_rd__en),
    .tx_rd__data(tx_rd__data), .tx_upd__payload(tx_upd__payload),
    .tx_upd__valid(tx_upd__valid), .tx_upd__ready(tx_upd__ready),
    .una_upd__payload(una_upd__payload), .una_upd__valid(una_upd__valid),
    .una_upd__ready(una_upd__ready), .upd_dropped(upd_dropped));
  initial begin
    @(posedge clk); #1; rst = 0;
    {"".join(lines)}
    tx_upd__valid = 1; una_upd__valid = 1; @(posedge clk); #1; tx_upd__valid = 0; una_upd__valid = 0;
    if (upd_dropped !== 16'd2) begin $display("FAIL dropped %d", upd_dropped); $finish; end
    tx_rd__addr = 4; tx_rd__en = 1; @(posedge clk); #1;
    if (tx_rd__data !== {w}'h{good_bits:x}) begin $display("FAIL row 4 %h", tx_rd__data); $finish; end
    $display("PASS");
    $finish;
  end
endmodule
"""
    (tmp_path / "qp5.v").write_text(emit(QPStateTable(n_qp), "qp5"))
    (tmp_path / "tb.v").write_text(tb)
    subprocess.run(["iverilog", "-g2012", "-o", "sim.vvp", "tb.v", "qp5.v"], cwd=tmp_path,
                   check=True, capture_output=True, text=True)
    res = subprocess.run(["vvp", "-n", "sim.vvp"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert res.stdout.strip().splitlines()[-1] == "PASS", res.stdout + res.stderr
