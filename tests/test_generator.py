# SPDX-License-Identifier: BSD-2-Clause
"""TrafficGenerator: requests and payloads against roce_hw.model.generator, stop, period, rates
and the ``sent`` count; the generator -> WrMux -> TxEngine chain against the requester model
(WrMux alone: tests/test_wrmux.py)."""

import copy
import random

import pytest
from amaranth.hdl import Elaboratable, Module, Signal
from amaranth.lib import wiring

from roce_hw import proto
from roce_hw.config import EngineConfig
from roce_hw.generate import emit
from roce_hw.model.generator import (ADDR_MASK, GenCommand, generator_messages,
                                     generator_payload, generator_wr)
from roce_hw.model.requester import RequesterModel
from roce_hw.engine import TxEngine
from roce_hw.ctrl.generator import TrafficGenerator, _AddressSequence
from roce_hw.ctrl.wrmux import WrMux
from sim.harness import run_simulation
from sim.stream import PacketAssembler, send_packet, stream_put
from sim.bfm import QPSetup, mgmt_write, qp_context

FAST = [64, 512]
SLOW = [pytest.param(w, marks=pytest.mark.slow) for w in (128, 256, 1024)]
WIDTHS = FAST + SLOW
WO = proto.WrOpcode
OPS = (WO.RDMA_WRITE, WO.RDMA_WRITE_WITH_IMM, WO.SEND, WO.SEND_WITH_IMM)
WR_FIELDS = ("wr_id", "opcode", "qp", "remote_addr", "r_key", "length", "imm", "signaled",
             "solicited")
LOCAL_MAC = 0x02_00_00_00_00_01
LOCAL_IP = 0x0A_00_00_01
USER = 1 << 63                 # wr_id bit of the user's requests in the chain tests


def wr_dict(p):
    return {f: int(getattr(p, f)) for f in WR_FIELDS}


# ------------------------------------------------------------------------------ the model

def test_model_against_spec():
    """The model against the CM spec's words, written out independently."""
    cmd = GenCommand(qp=3, opcode=int(WO.SEND_WITH_IMM), length=300, count=3, period=5,
                     remote_va=ADDR_MASK - 400, r_key=0xABCD)
    msgs = generator_messages(cmd)
    assert len(msgs) == 3
    for n, (wr, payload) in enumerate(msgs):
        assert wr == {"wr_id": n, "opcode": 3, "qp": 3, "remote_addr": (2**64 - 401 + 300 * n)
                      % 2**64, "r_key": 0xABCD, "length": 300, "imm": n, "signaled": 0,
                      "solicited": 0}
        rot = bytes(range(n, 256)) + bytes(range(n))
        assert payload == (rot * 2)[:300]
    assert msgs[2][0]["remote_addr"] == 199
    assert generator_payload(7, 0) == b""
    assert generator_payload(300, 3) == bytes([44, 45, 46])
    with pytest.raises(ValueError):
        generator_wr(cmd, 1 << 32)


# ------------------------------------------------------------------------------ addresses

class _AddrDut(Elaboratable):
    def __init__(self, chunk):
        self.chunk = chunk
        self.base = Signal(64)
        self.step = Signal(32)
        self.load = Signal()
        self.advance = Signal()
        self.value = Signal(64)
        self.ready = Signal()

    def elaborate(self, platform):
        m = Module()
        seq = _AddressSequence(m, self.base, self.step, load=self.load, advance=self.advance,
                               chunk=self.chunk)
        m.d.comb += [self.value.eq(seq.value), self.ready.eq(seq.ready)]
        return m


@pytest.mark.parametrize("chunk", [12, 7])
def test_address_sequence(chunk):
    """The skewed accumulator gives base + n * step for carries into every piece and
    wrapping at 2**64, under random advance patterns and reloads."""
    dut = _AddrDut(chunk)
    rng = random.Random(chunk)
    cases = [(ADDR_MASK - 5, 1 << 31), ((1 << 64) - (1 << 40), (1 << 32) - 1),
             (0xFFF_FFF_FFF, 1), (0, 0), (rng.randrange(1 << 64), rng.randrange(1 << 32)),
             (0x7FF, 0x801), (rng.randrange(1 << 64), 4096)]

    async def tb(ctx):
        for base, step in cases:
            ctx.set(dut.base, base)
            ctx.set(dut.step, step)
            ctx.set(dut.load, 1)
            await ctx.tick()
            ctx.set(dut.load, 0)
            ctx.set(dut.base, rng.randrange(1 << 64))      # only read while loading
            n = 0
            while n < 40:
                rdy = ctx.get(dut.ready)
                if rdy:
                    assert ctx.get(dut.value) == (base + n * step) & ADDR_MASK, (base, step, n)
                adv = rng.random() < 0.7
                ctx.set(dut.advance, adv)
                await ctx.tick()
                n += adv and rdy
            ctx.set(dut.advance, 0)

    run_simulation(dut, [tb], cycles=20000)


# ------------------------------------------------------------------------------ generator alone

def run_generator(config, script, *, seed=0, p_wr=0.0, p_i=0.0, max_cycles=20000):
    """Run a TrafficGenerator through ``script``: ``("start", GenCommand)``, ``("stop",)``,
    ``("wait", cycles)``, ``("idle",)`` (until ``busy`` is low). Returns a dict of events on
    one clock: ``wrs`` [(fields, offer cycle, take cycle)], ``pkts`` [(bytes, first beat
    cycle)], ``cmds`` [(cycle, start, sent before)], ``busy`` (cycle -> busy), ``sent``,
    ``beats`` (cycles with a payload beat taken), ``latency`` (the generator's)."""
    dut = TrafficGenerator(config)
    rng = random.Random(seed)
    rng_wr, rng_i = random.Random(rng.getrandbits(32)), random.Random(rng.getrandbits(32))
    res = {"wrs": [], "pkts": [], "cmds": [], "busy": [], "beats": [], "wr_valid": [],
           "latency": dut.latency}
    st = {"done": False}

    async def commands(ctx):
        for action in script:
            if action[0] == "start":
                await stream_put(ctx, dut.cmd, action[1].fields())
            elif action[0] == "stop":
                await stream_put(ctx, dut.cmd, {"start": 0})
            elif action[0] == "wait":
                await ctx.tick().repeat(action[1])
            elif action[0] == "idle":
                await ctx.tick()
                await ctx.tick().until(~dut.busy)
            elif action[0] == "offer":
                # hold a start while busy for a while: it must not be taken
                ctx.set(dut.cmd.payload, action[1].fields())
                ctx.set(dut.cmd.valid, 1)
                for _ in range(action[2]):
                    _, _, rdy, busy = await ctx.tick().sample(dut.cmd.ready, dut.busy)
                    assert busy and not rdy, "a start was taken while busy"
                ctx.set(dut.cmd.valid, 0)
        await ctx.tick()
        await ctx.tick().until(~dut.busy)
        await ctx.tick().repeat(20)
        st["done"] = True

    async def monitor(ctx):
        cycle, offer, asm, first = 0, None, PacketAssembler(config.data_width), None
        while not st["done"]:
            wr_rdy = not (p_wr and rng_wr.random() < p_wr)
            i_rdy = not (p_i and rng_i.random() < p_i)
            ctx.set(dut.wr.ready, wr_rdy)
            ctx.set(dut.i.ready, i_rdy)
            _, _, cv, cr, cp, wv, wp, iv, ip, busy, sent = await ctx.tick().sample(
                dut.cmd.valid, dut.cmd.ready, dut.cmd.payload, dut.wr.valid, dut.wr.payload,
                dut.i.valid, dut.i.payload, dut.busy, dut.sent)
            res["busy"].append(bool(busy))
            res["wr_valid"].append(bool(wv))
            res["sent"] = int(sent)
            if cv and cr:
                res["cmds"].append((cycle, int(cp.start), int(sent)))
            if wv and offer is None:
                offer = cycle
            if wv and wr_rdy:
                res["wrs"].append((wr_dict(wp), offer, cycle))
                offer = None
            if iv and i_rdy:
                if asm.index == 0:
                    first = cycle
                pkt = asm.add(ip)
                res["beats"].append(cycle)
                if pkt is not None:
                    res["pkts"].append((pkt, first))
            cycle += 1
        assert asm.index == 0, "payload packet left unfinished"

    run_simulation(dut, [commands, monitor], cycles=max_cycles, vcd_name="generator")
    return res


def check_runs(res, script):
    """Every run of ``script`` against the model; returns per run the number of requests."""
    starts = [c for c in res["cmds"] if c[1] == 1]
    stops = [c[0] for c in res["cmds"] if c[1] == 0]
    cmds = [a[1] for a in script if a[0] == "start"]
    assert len(starts) == len(cmds)
    bounds = [s[0] for s in starts] + [1 << 60]
    # `sent` counts every request posted since reset (a start does not clear it)
    sent_after = [s[2] for s in starts[1:]] + [res["sent"]]
    sent_total = starts[0][2] if starts else 0
    counts = []
    for r, cmd in enumerate(cmds):
        lo, hi = bounds[r], bounds[r + 1]
        wrs = [w for w in res["wrs"] if lo < w[1] < hi]
        pkts = [p for p in res["pkts"] if lo < p[1] < hi]
        stop = min((t for t in stops if lo < t < hi), default=None)
        k = len(wrs)
        counts.append(k)
        if stop is None:
            assert k == cmd.count, f"run {r}: {k} requests, want {cmd.count}"
        else:
            assert k <= cmd.count
            assert all(offer <= stop for _, offer, _ in wrs), \
                f"run {r}: a request offered after the stop in cycle {stop}"
        sent_total = (sent_total + k) & 0xFFFF_FFFF
        assert sent_after[r] == sent_total, \
            f"run {r}: sent = {sent_after[r]}, {k} taken, {sent_total} in all"
        want = generator_messages(cmd, k)
        for n, ((got, offer, take), (exp, _)) in enumerate(zip(wrs, want)):
            assert got == exp, f"run {r}, request {n}: {got} != {exp}"
        for n in range(k - 1):
            assert wrs[n + 1][1] - wrs[n][2] >= max(cmd.period, 1), \
                f"run {r}: request {n + 1} offered {wrs[n + 1][1] - wrs[n][2]} cycles " \
                f"after request {n} was taken, period {cmd.period}"
        want_pkts = [p for _, p in want if p]
        assert [p for p, _ in pkts] == want_pkts, f"run {r}: payloads differ"
        if cmd.length:
            for (_, offer, _), (_, first) in zip(wrs, pkts):
                assert first > offer, "payload before its request"
        # busy from the start until the end of the run, then low
        beats = [b for b in res["beats"] if lo < b < hi]
        end = max([take for _, _, take in wrs] + beats + [lo])
        assert all(res["busy"][lo + 1:end + 1]), f"run {r}: busy fell inside the run"
        if hi < 1 << 60:
            assert not res["busy"][hi], "start taken while busy"
    assert not res["busy"][-1]
    return counts


def test_sent_counts_over_runs():
    """Bug 6 (regression): ``sent`` (the engine's ``counters_tx_gen_sent``) is a wrapping
    count of every request posted since reset: runs of 4, 2 and 1 messages read 4, 6, 7 (it
    read 4, 2, 1: cleared by every start)."""
    config = EngineConfig(data_width=64, n_qp=4)
    script = []
    for count in (4, 2, 1):
        script += [("start", GenCommand(qp=1, opcode=int(WO.SEND), length=9, count=count)),
                   ("idle",)]
    res = run_generator(config, script, seed=6, p_wr=0.3, p_i=0.3)
    assert [c[2] for c in res["cmds"]] == [0, 4, 6] and res["sent"] == 7
    assert check_runs(res, script) == [4, 2, 1]


def lengths(width, rng, count):
    n = width // 8
    pool = [0, 1, 2, n - 1, n, n + 1, 2 * n, 3 * n + 1, 256, 1024, 4096,
            rng.randrange(1, 3 * n + 2), rng.randrange(1, 3 * n + 2)]
    return [rng.choice(pool) for _ in range(count)]


def random_command(rng, config, length):
    return GenCommand(qp=rng.randrange(config.n_qp), opcode=rng.choice(range(5)),
                      length=length, count=rng.choice([1, 2, 3, rng.randrange(1, 9)])
                      if length < 1024 else rng.choice([1, 2]),
                      period=rng.choice([0, 1, 2, 3, rng.randrange(4, 12)]),
                      remote_va=rng.choice([rng.randrange(1 << 64), ADDR_MASK - 2000,
                                            0xFFF_F00]),
                      r_key=rng.randrange(1 << 32))


@pytest.mark.parametrize("width", WIDTHS)
def test_random_commands(width):
    """Random commands (opcodes, lengths 0 .. 3 beats + 1 and PMTU multiples, counts, periods)
    under random ready on both outputs: requests, payloads and timing as the model says."""
    rng = random.Random(width)
    config = EngineConfig(data_width=width, n_qp=8)
    cmds = [random_command(rng, config, ln) for ln in lengths(width, rng, 10)]
    script = []
    for cmd in cmds:
        script += [("start", cmd), ("idle",)]
    res = run_generator(config, script, seed=width, p_wr=0.4, p_i=0.4, max_cycles=60000)
    check_runs(res, script)


@pytest.mark.parametrize("width", FAST)
def test_back_to_back_starts(width):
    """A start offered while the generator is busy waits (cmd.ready low) and is taken once it
    is idle; a start with count 0 sends nothing; a stop while idle does nothing."""
    config = EngineConfig(data_width=width, n_qp=4)
    a = GenCommand(qp=1, opcode=2, length=100, count=4, period=3, remote_va=10, r_key=1)
    b = GenCommand(qp=2, opcode=0, length=0, count=0)
    c = GenCommand(qp=3, opcode=1, length=1, count=3, remote_va=ADDR_MASK)
    script = [("start", a), ("offer", b, 5), ("start", b), ("stop",), ("wait", 5),
              ("start", c), ("start", a)]
    res = run_generator(config, script, seed=1, p_wr=0.3, p_i=0.3)
    assert check_runs(res, script) == [4, 0, 3, 4]


@pytest.mark.parametrize("width", FAST)
def test_stop_in_the_middle(width):
    """A stop ends the run after the request in progress and its payload; the next start
    begins again at message 0."""
    rng = random.Random(width + 1)
    config = EngineConfig(data_width=width, n_qp=4)
    script = []
    for k in range(8):
        cmd = GenCommand(qp=k % 4, opcode=k % 4, length=rng.choice([0, 7, 300, 1024]),
                         count=1000, period=rng.choice([0, 0, 2, 9]),
                         remote_va=rng.randrange(1 << 64), r_key=k)
        script += [("start", cmd), ("wait", rng.randrange(0, 60)), ("stop",), ("idle",)]
    script += [("start", GenCommand(length=3, count=(1 << 32) - 1, remote_va=ADDR_MASK)),
               ("wait", 40), ("stop",), ("idle",)]
    script += [("stop",), ("start", GenCommand(length=5, count=2)), ("idle",)]
    res = run_generator(config, script, seed=3, p_wr=0.3, p_i=0.3)
    counts = check_runs(res, script)
    assert counts[-1] == 2 and 0 < sum(counts[:-1]) < 9000 and counts[-2] > 5


@pytest.mark.parametrize("width", FAST)
def test_rates_and_latency(width):
    """Outputs always ready: the first request `latency` cycles after the start, one request
    per cycle with period 0 or 1, exactly `period` cycles from a request taken to the next
    otherwise; one payload beat per cycle across packets."""
    config = EngineConfig(data_width=width, n_qp=4)
    nb = width // 8
    runs = [GenCommand(length=0, count=20, period=0), GenCommand(length=nb, count=20, period=1),
            GenCommand(length=3, count=10, period=2), GenCommand(length=1, count=6, period=7),
            GenCommand(length=5 * nb + 3, count=6, period=0)]
    script = []
    for cmd in runs:
        script += [("start", cmd), ("idle",)]
    res = run_generator(config, script)
    check_runs(res, script)
    starts = [c[0] for c in res["cmds"]]
    for r, cmd in enumerate(runs):
        wrs = [w for w in res["wrs"] if starts[r] < w[1] < (starts + [1 << 60])[r + 1]]
        assert wrs[0][1] - starts[r] == res["latency"] == 7
        gaps = {wrs[n + 1][1] - wrs[n][2] for n in range(len(wrs) - 1)}
        if cmd.length <= nb:
            assert gaps == {max(1, cmd.period)}, (cmd, gaps)
        beats = [b for b in res["beats"] if starts[r] < b < (starts + [1 << 60])[r + 1]]
        if cmd.period == 0 and cmd.length:
            assert beats == list(range(beats[0], beats[0] + len(beats))), "payload bubble"
            assert beats[0] == wrs[0][1] + 1


def test_checks_can_fail():
    """check_runs rejects a wrong address, a missing payload and a period violation."""
    config = EngineConfig(data_width=64, n_qp=4)
    cmd = GenCommand(length=3, count=3, period=4, remote_va=100)
    script = [("start", cmd), ("idle",)]
    res = run_generator(config, script)
    check_runs(res, script)
    bad = copy.deepcopy(res)
    bad["wrs"][1][0]["remote_addr"] += 1
    with pytest.raises(AssertionError):
        check_runs(bad, script)
    bad = copy.deepcopy(res)
    del bad["pkts"][2]
    with pytest.raises(AssertionError):
        check_runs(bad, script)
    bad = copy.deepcopy(res)
    w = bad["wrs"][2]
    bad["wrs"][2] = (w[0], bad["wrs"][1][2] + 1, w[2])
    with pytest.raises(AssertionError):
        check_runs(bad, script)


# (WrMux alone: tests/test_wrmux.py)


# ------------------------------------------------------------------------------ the chain

class Chain(Elaboratable):
    """The user on WrMux source 0, TrafficGenerator -> WrMux source 1, WrMux -> TxEngine, as
    in RoceEngine (or the user straight into the TxEngine with ``mux=False``)."""

    def __init__(self, config, *, mux=True):
        self.config = config
        self.mux = WrMux(config) if mux else None
        self.gen = TrafficGenerator(config) if mux else None
        self.eng = TxEngine(config)
        self.user_wr = self.mux.s0_wr if mux else self.eng.wr
        self.user_i = self.mux.s0_i if mux else self.eng.i

    def elaborate(self, platform):
        m = Module()
        m.submodules.eng = self.eng
        if self.mux is not None:
            m.submodules.gen = self.gen
            m.submodules.mux = self.mux
            wiring.connect(m, self.gen.wr, self.mux.s1_wr)
            wiring.connect(m, self.gen.i, self.mux.s1_i)
            wiring.connect(m, self.mux.wr, self.eng.wr)
            wiring.connect(m, self.mux.resume, self.eng.resume)
            wiring.connect(m, self.mux.i, self.eng.i)
        return m


def run_chain(config, qps, cmds, user, *, seed=0, p=0.0, gen_after=0):
    """Set up ``qps`` (QPSetup), then start each generator command (waiting for the one before
    to finish) while posting the user's ``[(fields, payload)]``. Returns the requests as the
    engine took them, the frames ``[(bytes, aborted)]``, status reports and beat cycles."""
    dut = Chain(config, mux=cmds is not None)
    eng = dut.eng
    w = config.data_width
    rng = random.Random(seed)
    rngs = [random.Random(rng.getrandbits(32)) for _ in range(4)]
    st = {"setup": False, "done": 0}
    res = {"wrs": [], "frames": [], "statuses": [], "beats": [], "ready": 0}
    n_tbs = 3 if cmds is not None else 2

    async def setup(ctx):
        ctx.set(eng.local_mac, LOCAL_MAC)
        ctx.set(eng.local_ip, LOCAL_IP)
        for q in qps:
            await mgmt_write(ctx, eng, q.index, qp_context(q))
        st["setup"] = True
        if cmds is not None:
            if gen_after:
                await ctx.tick().repeat(gen_after)
            for cmd in cmds:
                await stream_put(ctx, dut.gen.cmd, cmd.fields())
                await ctx.tick()
                await ctx.tick().until(~dut.gen.busy)
            st["done"] += 1

    async def user_wr(ctx):
        while not st["setup"]:
            await ctx.tick()
        for fields, _ in user:
            await stream_put(ctx, dut.user_wr, fields, rng=rngs[0], p_idle=p)
        st["done"] += 1

    async def user_i(ctx):
        while not st["setup"]:
            await ctx.tick()
        for _, payload in user:
            if payload:
                await send_packet(ctx, dut.user_i, payload, w, rng=rngs[1], p_idle=p)
        st["done"] += 1

    async def out(ctx):
        cycle, asm, quiet = 0, PacketAssembler(w), 0
        ctx.set(eng.status.ready, 1)
        while quiet < 200 or st["done"] < n_tbs:
            rdy = not (p and rngs[2].random() < p)
            ctx.set(eng.o.ready, rdy)
            _, _, wv, wr, wp, ov, op, sv, sp = await ctx.tick().sample(
                eng.wr.valid, eng.wr.ready, eng.wr.payload, eng.o.valid, eng.o.payload,
                eng.status.valid, eng.status.payload)
            quiet += 1
            if wv and wr:
                res["wrs"].append(wr_dict(wp))
            if sv:
                res["statuses"].append((int(sp.wr_id), int(sp.status)))
            if rdy and st["setup"]:
                res["ready"] += 1
            if ov and rdy:
                quiet = 0
                frame = asm.add(op)
                res["beats"].append((cycle, res["ready"]))
                if frame is not None:
                    res["frames"].append((frame, bool(op.abort)))
            cycle += 1

    total = sum(len(p) for _, p in user) + sum(c.length * c.count for c in (cmds or []))
    run_simulation(dut, [setup, user_wr, user_i, out], cycles=20000 + 12 * total // (w // 8)
                   + 200 * (len(user) + sum(c.count for c in (cmds or []))),
                   vcd_name=f"gen_chain_{w}")
    return res


def chain_expected(config, qps, cmds, user, wrs):
    """The requester model fed the requests in the order the engine took them; generator
    requests get the generator model's payloads."""
    model = RequesterModel(n_qp=config.n_qp, ack_req_every=config.ack_req_every,
                           ttl=config.ttl, ip_id_start=config.ip_id_start,
                           local_mac=LOCAL_MAC, local_ip=LOCAL_IP)
    for q in qps:
        model.write_qp(q.index, qp_context(q))
    user_payload = {f["wr_id"]: p for f, p in user}
    for wr in wrs:
        payload = user_payload[wr["wr_id"]] if wr["wr_id"] & USER else \
            generator_payload(wr["wr_id"], wr["length"])
        model.post(qp=wr["qp"], opcode=wr["opcode"], payload=payload, length=wr["length"],
                   wr_id=wr["wr_id"], remote_addr=wr["remote_addr"], r_key=wr["r_key"],
                   imm=wr["imm"], solicited=bool(wr["solicited"]))
    return model


def make_qps(rng, n):
    pmtus = [256, 1024, 4096, 512]
    return [QPSetup(index=k, remote_qpn=rng.randrange(1 << 24), remote_mac=0x02_00_00_00_10_00
                    + k, remote_ip=0x0A_00_01_00 + k, udp_sport=0xC000 + k,
                    start_psn=rng.choice([rng.randrange(1 << 24), (1 << 24) - 3]),
                    pmtu=pmtus[k % 4]) for k in range(n)]


def user_wrs(rng, config, qps, count):
    out = []
    for j in range(count):
        q = rng.choice(qps)
        length = rng.choice([0, rng.randrange(1, 3 * config.data_bytes + 2), q.pmtu,
                             q.pmtu + 1, rng.randrange(1, 2 * q.pmtu)])
        out.append(({"wr_id": USER | j, "opcode": int(rng.choice(OPS)), "qp": q.index,
                     "remote_addr": rng.randrange(1 << 64), "r_key": rng.randrange(1 << 32),
                     "length": length, "imm": rng.randrange(1 << 32), "signaled": 1,
                     "solicited": rng.randrange(2)}, rng.randbytes(length)))
    return out


def _chain(width, seed, *, p):
    rng = random.Random(seed)
    config = EngineConfig(data_width=width, n_qp=4, ack_req_every=rng.choice([2, 64]))
    qps = make_qps(rng, 4)
    cmds = []
    for ln in (0, rng.randrange(1, 3 * config.data_bytes + 2), 1024, 4096 + 3):
        q = rng.choice(qps)
        cmds.append(GenCommand(qp=q.index, opcode=int(rng.choice(OPS)), length=ln,
                               count=rng.randrange(2, 6) if ln < 1024 else 2,
                               period=rng.choice([0, 1, 5]), remote_va=rng.randrange(1 << 64),
                               r_key=rng.randrange(1 << 32)))
    user = user_wrs(rng, config, qps, 10)
    res = run_chain(config, qps, cmds, user, seed=seed, p=p)
    got_gen = [wr for wr in res["wrs"] if not wr["wr_id"] & USER]
    want_gen = [wr for cmd in cmds for wr, _ in generator_messages(cmd)]
    assert got_gen == want_gen
    assert [wr for wr in res["wrs"] if wr["wr_id"] & USER] == [f for f, _ in user]
    model = chain_expected(config, qps, cmds, user, res["wrs"])
    assert not model.statuses and not res["statuses"]
    frames = [f for f, ab in res["frames"]]
    assert not any(ab for _, ab in res["frames"])
    assert len(frames) == len(model.frames)
    for k, (got, want) in enumerate(zip(frames, model.frames)):
        assert got == want, f"frame {k}\n got {got.hex()}\nwant {want.hex()}"


@pytest.mark.parametrize("width", WIDTHS)
def test_chain_matches_requester_model(width):
    """Generator -> WrMux -> TxEngine with a user source interleaving random requests: the
    frames are the requester model's for the requests in the order the engine took them."""
    _chain(width, seed=width, p=0.2)


@pytest.mark.parametrize("width", FAST)
def test_chain_without_stalls(width):
    _chain(width, seed=width + 1, p=0.0)


def _utilisation(res):
    (_, r0), (_, r1) = res["beats"][0], res["beats"][-1]
    return len(res["beats"]) / (r1 - r0 + 1)


@pytest.mark.parametrize("width", FAST)
def test_mux_keeps_line_rate(width):
    """A long run of back-to-back 64-byte WRITEs (always valid, output always ready) reaches
    the same bus utilisation through the WrMux as straight into the TxEngine, and so does the
    generator's own traffic through it (bench/throughput.py's measure)."""
    count = 32
    config = EngineConfig(data_width=width, n_qp=4)
    qps = [QPSetup(index=0, remote_qpn=0x11, remote_mac=0x02_00_00_00_00_02,
                   remote_ip=0x0A000002, start_psn=0xFFFF00, pmtu=1024)]
    user = [({"wr_id": USER | j, "opcode": 0, "qp": 0, "remote_addr": 0x1000 * j, "r_key": 7,
              "length": 64, "imm": 0, "signaled": 1, "solicited": 0},
             bytes((j + k) & 0xFF for k in range(64))) for j in range(count)]
    direct = run_chain(config, qps, None, user)
    muxed = run_chain(config, qps, [], user)
    gen = run_chain(config, qps, [GenCommand(qp=0, opcode=0, length=64, count=count,
                                             remote_va=0, r_key=7)], [])
    for res in (direct, muxed, gen):
        assert len(res["frames"]) == count
    base = _utilisation(direct)
    assert base > 0.9
    assert _utilisation(muxed) == base
    assert _utilisation(gen) == base
    model = chain_expected(config, qps, None, user, direct["wrs"])
    assert [f for f, _ in muxed["frames"]] == model.frames


@pytest.mark.parametrize("width", FAST)
def test_emit(width):
    config = EngineConfig(data_width=width)
    assert "module gen" in emit(TrafficGenerator(config), "gen")
