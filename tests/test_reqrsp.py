# SPDX-License-Identifier: BSD-2-Clause
"""RequestArbiter alone: masters sharing a request/response slave, against its docstring --
one request outstanding, round robin from the master after the one served last, each response
back to its master in order, the request on ``m_req`` a cycle after it was taken, one
transaction per (slave latency + 2) cycles, requests taken while the slave stalls -- with
seeded random idle, backpressure and slave latencies."""

import random

import pytest
from amaranth.lib import data

from roce_hw.lib.reqrsp import RequestArbiter
from roce_hw.generate import emit
from sim.harness import run_simulation
from sim.stream import stream_put

__all__ = []

REQ = data.StructLayout({"master": 3, "seq": 8, "v": 16})
RSP = data.StructLayout({"echo": 11, "v": 16})


def slave_answer(req):
    """The slave's response to a request (any fixed function: the reference applies it too)."""
    return {"echo": req["master"] | req["seq"] << 3, "v": (req["v"] * 5 + 3) & 0xFFFF}


def run_arbiter(n, reqs, *, seed=0, p_idle=0.3, p_stall=0.3, latency=(1, 4), p_rsp_stall=0.3,
                cycles=None):
    """``reqs[k]``: the ``v`` values master ``k`` sends (one testbench per master: send, wait
    for the response, next). The slave takes requests with random ``ready``, answers each
    after a random latency in ``latency`` (cycles from the request's transfer to its response
    offered), and asserts that no second request comes before its response was taken.

    Returns ``rsp[k]`` (the responses master ``k`` got, in order), ``takes`` [(cycle, master,
    valids)] (the cycles a master's ``ready`` was high, with every master's ``valid`` then),
    ``m_req`` [(cycle, payload)] (requests offered to the slave, first cycle each),
    ``m_xfer`` (cycles of request transfers to the slave) and ``rsp_cycles``."""
    dut = RequestArbiter(REQ, RSP, n)
    rng = random.Random(seed)
    rngs = [random.Random(rng.getrandbits(32)) for _ in range(n + 3)]
    res = {"rsp": [[] for _ in range(n)], "takes": [], "m_req": [], "m_xfer": [],
           "rsp_cycles": []}
    total = sum(len(r) for r in reqs)
    reqp = [getattr(dut, f"s{k}_req") for k in range(n)]
    rspp = [getattr(dut, f"s{k}_rsp") for k in range(n)]

    def master(k):
        async def tb(ctx):
            for seq, v in enumerate(reqs[k]):
                await stream_put(ctx, reqp[k], {"master": k, "seq": seq & 0xFF, "v": v},
                                 rng=rngs[k], p_idle=p_idle)
                while True:
                    rdy = not (p_rsp_stall and rngs[n].random() < p_rsp_stall)
                    ctx.set(rspp[k].ready, rdy)
                    _, _, valid, payload = await ctx.tick().sample(rspp[k].valid,
                                                                   rspp[k].payload)
                    if valid and rdy:
                        res["rsp"][k].append({"echo": int(payload.echo), "v": int(payload.v)})
                        ctx.set(rspp[k].ready, 0)
                        break
        return tb

    async def slave(ctx):
        done = 0
        while done < total:
            # take a request
            while True:
                rdy = not (p_stall and rngs[n + 1].random() < p_stall)
                ctx.set(dut.m_req.ready, rdy)
                _, _, valid, payload = await ctx.tick().sample(dut.m_req.valid, dut.m_req.payload)
                if valid and rdy:
                    req = {"master": int(payload.master), "seq": int(payload.seq),
                           "v": int(payload.v)}
                    break
            ctx.set(dut.m_req.ready, 0)
            # answer after the latency; no new request meanwhile (one outstanding)
            for _ in range(rngs[n + 2].randint(*latency) - 1):
                _, _, valid = await ctx.tick().sample(dut.m_req.valid)
                assert not valid, "a second request before the response"
            ctx.set(dut.m_rsp.payload, slave_answer(req))
            ctx.set(dut.m_rsp.valid, 1)
            await ctx.tick().until(dut.m_rsp.ready)
            ctx.set(dut.m_rsp.valid, 0)
            done += 1

    async def monitor(ctx):
        cycle, offered = 0, False
        async for _, _, mv, mr, mp, *v in ctx.tick().sample(
                dut.m_req.valid, dut.m_req.ready, dut.m_req.payload,
                *[p.valid for p in reqp], *[p.ready for p in reqp],
                dut.m_rsp.valid, dut.m_rsp.ready):
            valids, readies = v[:n], v[n:2 * n]
            if any(readies):
                assert sum(map(bool, readies)) == 1, f"cycle {cycle}: two masters taken"
                res["takes"].append((cycle, [bool(r) for r in readies].index(True),
                                     [bool(x) for x in valids]))
            if mv and not offered:
                res["m_req"].append((cycle, int(mp.master)))
            offered = bool(mv and not mr)
            if mv and mr:
                res["m_xfer"].append(cycle)
            if v[2 * n] and v[2 * n + 1]:
                res["rsp_cycles"].append(cycle)
            cycle += 1

    if cycles is None:
        cycles = 1000 + total * (20 + 4 * latency[1]) * (3 if p_idle or p_stall else 1)
    run_simulation(dut, [master(k) for k in range(n)] + [slave], [monitor], cycles=cycles,
                   vcd_name=f"reqrsp_{n}")
    return res


def check(n, reqs, res):
    """Against the docstring: every master's responses are the slave's answers to its own
    requests, in order; a master is taken only while valid, and it is the first valid master
    after the one served last (round robin; after reset master 0 counts as served last); each
    taken request is on ``m_req`` the cycle after."""
    for k in range(n):
        want = [slave_answer({"master": k, "seq": s & 0xFF, "v": v})
                for s, v in enumerate(reqs[k])]
        assert res["rsp"][k] == want, f"master {k}"
    last = 0
    for cycle, k, valids in res["takes"]:
        assert valids[k], f"cycle {cycle}: master {k} taken while not valid"
        want = next((last + 1 + j) % n for j in range(n) if valids[(last + 1 + j) % n])
        assert k == want, f"cycle {cycle}: master {k} taken, round robin says {want}"
        last = k
    assert [(c + 1, k) for c, k, _ in res["takes"]] == res["m_req"]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("seed", [0, 1])
def test_random(n, seed):
    rng = random.Random(100 * n + seed)
    reqs = [[rng.getrandbits(16) for _ in range(rng.randrange(6, 14))] for _ in range(n)]
    res = run_arbiter(n, reqs, seed=seed)
    check(n, reqs, res)
    assert len(res["takes"]) == sum(map(len, reqs))


def test_check_can_fail():
    """The checker rejects a wrong grant order and a response given to the wrong master."""
    reqs = [[1, 2], [3, 4], [5]]
    res = run_arbiter(3, reqs, p_idle=0, p_stall=0, p_rsp_stall=0, latency=(1, 1))
    check(3, reqs, res)
    bad = dict(res, takes=[(c, (k + 1) % 3, [True] * 3) for c, k, _ in res["takes"]])
    with pytest.raises(AssertionError):
        check(3, reqs, bad)
    bad = dict(res, rsp=[res["rsp"][1], res["rsp"][0], res["rsp"][2]])
    with pytest.raises(AssertionError):
        check(3, reqs, bad)


@pytest.mark.parametrize("latency", [1, 2, 4])
def test_round_robin_and_throughput(latency):
    """Every master always valid, the slave always ready and answering after ``latency``
    cycles: masters served 1, 2, 0, 1, ... (master 0 counts as served last after reset) and a
    transaction every ``latency + 2`` cycles."""
    n = 3
    reqs = [[10 * k + j for j in range(4)] for k in range(n)]
    res = run_arbiter(n, reqs, p_idle=0, p_stall=0, p_rsp_stall=0, latency=(latency, latency))
    check(n, reqs, res)
    assert [k for _, k, _ in res["takes"]] == [1, 2, 0] * 4
    cycles = [c for c, _, _ in res["takes"]]
    assert {b - a for a, b in zip(cycles, cycles[1:])} == {latency + 2}


def test_request_taken_while_slave_stalls():
    """``s*_req.ready`` does not wait for ``m_req.ready``: an idle arbiter takes a request with
    the slave stalled, and offers it until the slave takes it."""
    dut = RequestArbiter(REQ, RSP, 2)
    seen = {}

    async def tb(ctx):
        ctx.set(dut.m_req.ready, 0)
        ctx.set(dut.s1_req.payload, {"master": 1, "seq": 7, "v": 0x1234})
        ctx.set(dut.s1_req.valid, 1)
        _, _, ready = await ctx.tick().sample(dut.s1_req.ready)
        seen["ready"] = bool(ready)
        ctx.set(dut.s1_req.valid, 0)
        for _ in range(5):
            _, _, valid, payload, r0, r1 = await ctx.tick().sample(
                dut.m_req.valid, dut.m_req.payload, dut.s0_req.ready, dut.s1_req.ready)
            assert valid and int(payload.v) == 0x1234 and not r0 and not r1
        ctx.set(dut.m_req.ready, 1)
        await ctx.tick()
        ctx.set(dut.m_req.ready, 0)
        _, _, valid = await ctx.tick().sample(dut.m_req.valid)
        assert not valid

    run_simulation(dut, [tb], cycles=100)
    assert seen["ready"]


def test_bad_arguments():
    for n in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            RequestArbiter(REQ, RSP, n)


def test_emit():
    assert "module arb" in emit(RequestArbiter(REQ, RSP, 3), "arb")
