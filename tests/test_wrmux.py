# SPDX-License-Identifier: BSD-2-Clause
"""WrMux alone: its documented behaviour against a reference written here -- per-source order,
one request offered at a time (so a consumer that takes ``resume`` before ``wr`` keeps the
grant order), payloads whole in grant order, round robin, resume before WR within source 0,
the FIFO bound, latencies, line rate -- under seeded random idle and backpressure."""

import random

import pytest

from roce_hw.config import EngineConfig
from roce_hw.ctrl.wrmux import WrMux
from roce_hw.generate import emit
from roce_hw.verbs import START_PACKET_BITS, resume_layout, wr_layout
from sim.harness import run_simulation
from sim.stream import PacketAssembler, send_packet, stream_put

__all__ = []

FAST = [64, 512]
SLOW = [pytest.param(w, marks=pytest.mark.slow) for w in (128, 256, 1024)]
WR_FIELDS = tuple(name for name, _ in wr_layout(EngineConfig()))
RES_FIELDS = tuple(name for name, _ in resume_layout(EngineConfig()))
#: the request streams: source 0's resumes, source 0's WRs, source 1's WRs
STREAMS = ("s0_resume", "s0_wr", "s1_wr")


def _dict(p, names):
    return {f: int(getattr(p, f)) for f in names}


def make_requests(rng, config, counts, *, lengths=None):
    """``{stream: [(fields, payload)]}``; ``wr_id`` = stream << 60 | index, so every request
    names its stream and place; ``lengths`` (a list) to draw lengths from."""
    nb = config.data_bytes
    pool = lengths or [0, 0, 1, nb - 1, nb, nb + 1, 2 * nb, 3 * nb + 1, 300]
    out = {}
    for s, (name, count) in enumerate(zip(STREAMS, counts)):
        items = []
        for j in range(count):
            length = rng.choice(pool)
            f = {"wr_id": (s << 60) | j, "opcode": rng.randrange(4),
                 "qp": rng.randrange(config.n_qp), "remote_addr": rng.getrandbits(64),
                 "r_key": rng.getrandbits(32), "length": length, "imm": rng.getrandbits(32),
                 "signaled": rng.randrange(2), "solicited": rng.randrange(2)}
            if name == "s0_resume":
                f.update(start_packet=rng.getrandbits(START_PACKET_BITS),
                         start_psn=rng.getrandbits(24))
            items.append((f, rng.randbytes(length)))
        out[name] = items
    return out


def run_mux(config, reqs, *, seed=0, p_idle=0.3, p_stall=0.3, depth=8, i_hold=0,
            resume_first=True, split=False, cycles=None):
    """Drive ``reqs`` (see :func:`make_requests`) into a WrMux and take its outputs as the TX
    engine does: ``resume`` before ``wr`` (``wr.ready`` low while ``resume.valid``; with
    ``resume_first`` False ``wr`` is taken whenever valid), with random backpressure;
    ``i.ready`` is held low for the first ``i_hold`` cycles.

    Source 0's resumes and WRs go in in a random order drawn from ``seed`` (one testbench), its
    payloads in that order from another, which may run ahead of the requests; with ``split``
    each of its two streams has a testbench of its own (they may then be offered together) and
    a packet is sent only once its request has been transferred (the order is known only
    then). Source 1: one testbench for the WRs, one for the payloads.

    Returns a dict: ``taken`` [(port, fields, cycle)] in the order the consumer took the
    requests, ``pkts`` [(bytes, first beat cycle)], ``beats`` (cycles with a beat taken),
    ``inputs`` {stream: [cycle of each transfer]}, ``payload_in`` {source: [beat cycles]},
    ``first_offer`` {n: cycle request n was first offered}, ``both`` (cycles with
    ``wr.valid`` and ``resume.valid`` high together)."""
    dut = WrMux(config, depth=depth)
    w = config.data_width
    rng = random.Random(seed)
    rngs = [random.Random(rng.getrandbits(32)) for _ in range(8)]
    n_req = sum(len(v) for v in reqs.values())
    n_pkt = sum(1 for v in reqs.values() for _, p in v if p)
    res = {"taken": [], "pkts": [], "beats": [], "inputs": {s: [] for s in STREAMS},
           "payload_in": {0: [], 1: []}, "both": [], "first_offer": {}}
    # source 0's order when one testbench posts both of its streams
    s0 = [("s0_resume", j) for j in range(len(reqs["s0_resume"]))] + \
         [("s0_wr", j) for j in range(len(reqs["s0_wr"]))]
    rngs[7].shuffle(s0)
    # (a random interleaving of the two streams, each in its own order)
    nxt = {"s0_resume": 0, "s0_wr": 0}
    order0 = []
    for name, _ in s0:
        order0.append((name, nxt[name]))
        nxt[name] += 1

    def post_tb(k, items):
        async def tb(ctx):
            for name, j in items:
                await stream_put(ctx, getattr(dut, name), reqs[name][j][0], rng=rngs[k],
                                 p_idle=p_idle)
        return tb

    def payload_tb(k, port, items, wait):
        async def tb(ctx):
            for n, (name, j) in enumerate(items):
                if wait:
                    # (split streams: the order is known once the requests went in)
                    while True:
                        order = sorted((c, nm, i) for nm in ("s0_resume", "s0_wr")
                                       for i, c in enumerate(res["inputs"][nm]))
                        if len(order) > n:
                            _, name, j = order[n]
                            break
                        await ctx.tick()
                payload = reqs[name][j][1]
                if payload:
                    await send_packet(ctx, port, payload, w, rng=rngs[k], p_idle=p_idle)
        return tb

    s1 = [("s1_wr", j) for j in range(len(reqs["s1_wr"]))]
    if split:
        tbs = [post_tb(0, [x for x in order0 if x[0] == "s0_resume"]),
               post_tb(1, [x for x in order0 if x[0] == "s0_wr"])]
    else:
        tbs = [post_tb(0, order0)]
    tbs += [post_tb(2, s1), payload_tb(3, dut.s0_i, order0, split),
            payload_tb(4, dut.s1_i, s1, False)]

    async def monitor(ctx):
        cycle = 0
        async for _, _, *v in ctx.tick().sample(
                dut.s0_resume.valid, dut.s0_resume.ready, dut.s0_wr.valid, dut.s0_wr.ready,
                dut.s1_wr.valid, dut.s1_wr.ready, dut.s0_i.valid, dut.s0_i.ready,
                dut.s1_i.valid, dut.s1_i.ready):
            for k, name in enumerate(STREAMS):
                if v[2 * k] and v[2 * k + 1]:
                    res["inputs"][name].append(cycle)
            for src in (0, 1):
                if v[6 + 2 * src] and v[7 + 2 * src]:
                    res["payload_in"][src].append(cycle)
            cycle += 1

    async def consumer(ctx):
        cycle, asm, first = 0, PacketAssembler(w), None
        while len(res["taken"]) < n_req or len(res["pkts"]) < n_pkt:
            stall = p_stall and rngs[5].random() < p_stall
            ctx.set(dut.resume.ready, not stall)
            ctx.set(dut.wr.ready, not stall and not (resume_first and ctx.get(dut.resume.valid)))
            i_rdy = cycle >= i_hold and not (p_stall and rngs[6].random() < p_stall)
            ctx.set(dut.i.ready, i_rdy)
            _, _, wv, wr, wp, rv, rr, rp, iv, ip = await ctx.tick().sample(
                dut.wr.valid, dut.wr.ready, dut.wr.payload, dut.resume.valid, dut.resume.ready,
                dut.resume.payload, dut.i.valid, dut.i.payload)
            if wv and rv:
                res["both"].append(cycle)
            if wv or rv:
                res["first_offer"].setdefault(len(res["taken"]), cycle)
            if rv and rr:
                res["taken"].append(("resume", _dict(rp, RES_FIELDS), cycle))
            elif wv and wr:
                res["taken"].append(("wr", _dict(wp, WR_FIELDS), cycle))
            if iv and i_rdy:
                if asm.index == 0:
                    first = cycle
                pkt = asm.add(ip)
                res["beats"].append(cycle)
                if pkt is not None:
                    res["pkts"].append((pkt, first))
            cycle += 1

    if cycles is None:
        beats = sum(-(-len(p) // config.data_bytes) for v in reqs.values() for _, p in v)
        cycles = 2000 + i_hold + 12 * (n_req + beats)
    run_simulation(dut, tbs + [consumer], [monitor], cycles=cycles, vcd_name="wrmux")
    return res


def check(reqs, res):
    """The run against the reference, which is what the docstring says, from the inputs alone:
    each stream's requests leave unchanged and in order, a resume on ``resume`` and a WR on
    ``wr``, never both offered at once; source 0's resumes and WRs in the order they were
    transferred; the payload of every request with ``length`` > 0, whole, in the order the
    consumer took the requests."""
    by_id = {f["wr_id"]: (name, f, p) for name in STREAMS for f, p in reqs[name]}
    assert not res["both"], f"wr and resume both valid in cycles {res['both'][:5]}"
    assert len(res["taken"]) == len(by_id)
    seen = {s: [] for s in STREAMS}
    for port, f, _ in res["taken"]:
        name, fields, _ = by_id[f["wr_id"]]
        assert port == ("resume" if name == "s0_resume" else "wr")
        assert f == {k: fields[k] for k in f}
        seen[name].append(f["wr_id"])
    for name in STREAMS:
        assert seen[name] == [f["wr_id"] for f, _ in reqs[name]], f"{name}: order"
    s0_in = sorted([(c, f["wr_id"]) for name in ("s0_resume", "s0_wr")
                    for (f, _), c in zip(reqs[name], res["inputs"][name])])
    assert [f["wr_id"] for _, f, _ in res["taken"] if f["wr_id"] >> 60 < 2] == \
        [i for _, i in s0_in]
    want_pkts = [by_id[f["wr_id"]][2] for _, f, _ in res["taken"] if f["length"]]
    assert [p for p, _ in res["pkts"]] == want_pkts


@pytest.mark.parametrize("width", FAST + SLOW)
@pytest.mark.parametrize("depth", [1, 3, 8])
def test_random(width, depth):
    """Random requests of the three streams (lengths 0, one beat +- 1, several beats), random
    idle on every input and backpressure on every output: the requests leave unchanged, each
    stream's in order (source 0's resumes and WRs in their transfer order), one at a time; the
    payloads whole, in the order the requests were taken."""
    rng = random.Random(width * 10 + depth)
    config = EngineConfig(data_width=width, n_qp=4)
    reqs = make_requests(rng, config, [10, 10, 14])
    res = run_mux(config, reqs, seed=depth, depth=depth)
    check(reqs, res)


@pytest.mark.parametrize("seed", range(3))
def test_random_without_resume_priority(seed):
    """The same with a consumer that takes ``wr`` whenever it is valid (no priority): the mux
    never offers both, so nothing changes."""
    rng = random.Random(seed)
    config = EngineConfig(data_width=64, n_qp=4)
    reqs = make_requests(rng, config, [8, 8, 8])
    res = run_mux(config, reqs, seed=seed, resume_first=False, p_idle=0.1)
    check(reqs, res)


def test_check_can_fail():
    """The checker rejects a swapped pair of requests and a wrong payload."""
    rng = random.Random(1)
    config = EngineConfig(data_width=64, n_qp=4)
    reqs = make_requests(rng, config, [3, 3, 3], lengths=[5, 9])
    res = run_mux(config, reqs, p_idle=0, p_stall=0)
    check(reqs, res)
    bad = dict(res, taken=list(res["taken"]))
    bad["taken"][0], bad["taken"][1] = bad["taken"][1], bad["taken"][0]
    with pytest.raises(AssertionError):
        check(reqs, bad)
    bad = dict(res, pkts=[(b"x" + p[1:], c) for p, c in res["pkts"]])
    with pytest.raises(AssertionError):
        check(reqs, bad)


@pytest.mark.parametrize("width", FAST)
def test_round_robin_and_resume_priority(width):
    """Every stream always valid and the consumer always ready: a request per cycle, sources
    alternating; source 0's resumes before its WRs (both offered together); a source alone
    gets every cycle."""
    rng = random.Random(width)
    config = EngineConfig(data_width=width, n_qp=4)
    reqs = make_requests(rng, config, [4, 4, 8], lengths=[0])
    res = run_mux(config, reqs, p_idle=0, p_stall=0, split=True)
    check(reqs, res)
    cycles = [c for _, _, c in res["taken"]]
    assert cycles == list(range(cycles[0], cycles[0] + 16))
    assert [f["wr_id"] >> 60 for _, f, _ in res["taken"]] == [0, 2] * 4 + [1, 2] * 4
    for alone in ("s0_resume", "s0_wr", "s1_wr"):
        one = {s: reqs[s] if s == alone else [] for s in STREAMS}
        res = run_mux(config, one, p_idle=0, p_stall=0, split=True)
        cycles = [c for _, _, c in res["taken"]]
        assert cycles == list(range(cycles[0], cycles[0] + len(one[alone])))


@pytest.mark.parametrize("width", FAST)
def test_latency_and_line_rate(width):
    """A request transferred in cycle t is offered in cycle t + 1, a payload beat likewise;
    payloads of one and two beats from both sources at full rate leave a beat every cycle."""
    rng = random.Random(width + 1)
    config = EngineConfig(data_width=width, n_qp=4)
    nb = width // 8
    reqs = make_requests(rng, config, [6, 6, 12], lengths=[1, nb, nb + 1, 2 * nb])
    res = run_mux(config, reqs, p_idle=0, p_stall=0)
    check(reqs, res)
    beats = res["beats"]
    assert beats == list(range(beats[0], beats[0] + len(beats))), "payload bubble"
    first_in = min(c for v in res["inputs"].values() for c in v)
    assert res["first_offer"][0] == first_in + 1
    first_beat_in = min(c for v in res["payload_in"].values() for c in v)
    assert beats[0] == first_beat_in + 1


@pytest.mark.parametrize("depth", [1, 4])
def test_full_fifo_holds_requests(depth):
    """With ``i`` stalled, exactly ``depth`` requests with payload are granted (and no request
    at all after them, not even one without payload); they pass once ``i`` moves."""
    rng = random.Random(depth)
    config = EngineConfig(data_width=64, n_qp=4)
    reqs = make_requests(rng, config, [2, 3, 4], lengths=[17])
    reqs["s1_wr"].append((dict(reqs["s1_wr"][0][0], wr_id=(2 << 60) | 9, length=0), b""))
    hold = 300
    res = run_mux(config, reqs, p_idle=0, p_stall=0, depth=depth, i_hold=hold)
    check(reqs, res)
    early = [c for _, _, c in res["taken"] if c < hold]
    assert len(early) == depth
    granted = sorted(c for v in res["inputs"].values() for c in v)
    assert sum(1 for c in granted if c < hold) == depth


def test_bad_arguments():
    config = EngineConfig(data_width=64)
    for depth in (0, 65, 2.5, True):
        with pytest.raises(ValueError):
            WrMux(config, depth=depth)
    with pytest.raises(TypeError):
        WrMux(64)


@pytest.mark.parametrize("width", FAST)
def test_emit(width):
    assert "module mux" in emit(WrMux(EngineConfig(data_width=width)), "mux")
