# SPDX-License-Identifier: BSD-2-Clause
"""Completer against its model (random WR, event, fire and reset streams: coalesced ACKs over
several WRs of several QPs, NAK PSN-sequence walks, RNR waits, fatal NAKs and flushes,
exhausted retries, resets, a small pool filling up, stalls of every output), directed cases of
the go-back-N walk checked against results written out here, the walk with ``retx`` blocked
while WRs and events keep flowing, the model against the reference requester
(:class:`roce_hw.model.reliable.ReliableRequester`) in the lossy loop, and the completer with
the retransmission timers (:class:`roce_hw.ctrl.timers.RetxTimers`)."""

import random
from collections import Counter

import pytest
from amaranth import Elaboratable, Module
from amaranth.lib import wiring

from roce_hw import proto
from roce_hw.config import EngineConfig
from roce_hw.ctrl.completer import Completer
from roce_hw.ctrl.timers import RetxTimers
from roce_hw.layouts import ack_event_layout, posted_layout, timer_fire_layout
from roce_hw.model.completer import CompleterModel
from roce_hw.model.reliable import ReliableRequester
from roce_hw.model.rx import classify
from sim.bfm import WorkItem
from sim.harness import run_simulation
from sim.reliable_loop import (CLOCK_HZ, ModelRequester, loop_workload, make_responder,
                               run_reliable_loop)

__all__ = []

K = proto.AckKind
T = proto.TimerKind
S = proto.WcStatus
MASK = proto.PSN_MASK


# ---------------------------------------------------------------- the script generator

class _Script:
    """A random, consistent order of inputs: WRs sent per QP in PSN order, events only for
    PSNs sent and not yet acknowledged (what the ACK handler passes on), timer fires (some for
    QPs with nothing outstanding), resets."""

    def __init__(self, rng, n_qp, hot, *, cap, p_signaled=0.6, max_pkts=4):
        self.rng = rng
        # at most `cap` WRs kept: the bench feeds an event only after every post before it,
        # so more WRs kept than the pool holds could wait for each other for ever (a peer
        # cannot acknowledge WRs the TX path could not send)
        self.cap = cap
        self.model = CompleterModel(n_qp)
        self.n_qp = n_qp
        self.hot = hot
        self.p_signaled = p_signaled
        self.max_pkts = max_pkts
        # start near the wrap of the PSN space on some QPs
        self.next = {q: (MASK - rng.randrange(0, 40)) if q % 2 else rng.getrandbits(24)
                     for q in range(n_qp)}
        self.ops = []
        self.wr_id = 0

    def qp(self):
        return self.rng.choice(self.hot) if self.rng.random() < 0.85 \
            else self.rng.randrange(self.n_qp)

    def _add(self, what, f):
        self.ops.append((what, f))
        apply_op(self.model, what, f)
        self.model.walk_all()

    def post(self, q, npkts=None, signaled=None, opcode=None):
        rng = self.rng
        npkts = npkts or rng.randrange(1, self.max_pkts + 1)
        first = self.next[q]
        last = (first + npkts - 1) & MASK
        self.next[q] = (last + 1) & MASK
        self.wr_id += 1
        self._add("post", {
            "qp": q, "wr_id": (self.wr_id << 20) | rng.getrandbits(20),
            "opcode": rng.choice([0, 1, 2, 3, 3, 4]) if opcode is None else opcode,
            "length": rng.randrange(0, 1 << 32) if rng.random() < 0.1
            else rng.randrange(max(0, npkts - 1) * 1024, npkts * 1024 + 1),
            "signaled": int(rng.random() < self.p_signaled) if signaled is None
            else int(signaled),
            "first_psn": first, "last_psn": last, "remote_addr": rng.getrandbits(64),
            "r_key": rng.getrandbits(32), "imm": rng.getrandbits(32),
            "solicited": rng.getrandbits(1)})

    def outstanding(self, q):
        if not self.model.outstanding(q):
            return 0
        return (self.next[q] - self.model.una(q)) & MASK

    def event(self, q, kind, psn=None, code=0):
        if psn is None:
            psn = (self.model.una(q) + self.rng.randrange(self.outstanding(q))) & MASK
        self._add("ev", {"qp": q, "kind": int(kind), "psn": psn, "code": code,
                         "msn": self.rng.getrandbits(24)})

    def fire(self, q, kind):
        self._add("fire", {"qp": q, "kind": int(kind)})

    def reset(self, q):
        self.next[q] = self.rng.getrandbits(24)
        self._add("reset", {"qp": q})

    def random_op(self, weights):
        rng = self.rng
        r = rng.random() * sum(weights.values())
        for what, w in weights.items():
            r -= w
            if r < 0:
                break
        q = self.qp()
        if what in ("ack", "nak", "rnr", "fatal") and not self.outstanding(q):
            what = "post"
        kept = {p: len(self.model.outstanding(p)) for p in range(self.n_qp)}
        if what == "post" and sum(kept.values()) >= self.cap:
            q = max(kept, key=kept.get)
            self.event(q, K.ACK, psn=(self.next[q] - 1) & MASK)
        elif what == "post":
            self.post(q)
        elif what == "cnp":
            self.event(q, K.CNP, psn=0)
        elif what == "reset":
            self.reset(q)
        elif what == "ack":
            # anywhere in the window: inside a WR, or coalescing several
            self.event(q, K.ACK)
        elif what == "nak":
            self.event(q, K.NAK_SEQ)
        elif what == "rnr":
            self.event(q, K.RNR, code=rng.randrange(32))
        elif what == "fatal":
            self.event(q, K.FATAL, code=rng.choice([1, 2, 3]))
        else:
            self.fire(q, {"to": T.TIMEOUT, "done": T.RNR_DONE, "exc": T.RETRY_EXC,
                          "rnr_exc": T.RNR_RETRY_EXC}[what])


def apply_op(model, what, f):
    if what == "post":
        model.post(**f)
    elif what == "ev":
        model.event(**f)
    elif what == "fire":
        model.fire(**f)
    elif what == "reset":
        model.reset(**f)
    elif what == "wait_retx":
        while len(model.resumes) < f:
            assert model.rewinding
            model.walk_step()


def run_model(n_qp, ops, *, atomic=True):
    """The model after ``ops``; ``atomic``: each walk runs to its end before the next input,
    else the walk moves only at ``wait_retx`` marks and at the end."""
    model = CompleterModel(n_qp)
    for what, f in ops:
        apply_op(model, what, f)
        if atomic:
            model.walk_all()
    model.walk_all()
    return model


# ---------------------------------------------------------------- the bench

_INPUTS = ("post", "ev", "fire", "reset")


def run_bench(config, ops, *, n_desc=256, seed=0, p_idle=0.3, p_stall=0.3, stalls=(),
              retx_stalls=(), aux_stalls=(), serial=True, atomic=True, cycles=None):
    """Feed ``ops`` to a Completer and record every output.

    ``ops``: ``("post" | "ev" | "fire" | "reset", fields)`` inputs, and marks for the bench:
    ``("hold", None)`` / ``("release", None)`` stop and restart reading ``retx``;
    ``("wait_retx", n)`` waits until ``n`` requests have been offered on ``retx``. With
    ``serial`` one driver offers the inputs in script order, each once the one before was
    taken, and (``atomic``) once every walk the model says the inputs before it start has
    been sent; else (no marks) posts come from one driver and the rest from another, an event
    only once every post before it was taken and a post only once every reset before it was
    (the ordering contract). ``cq`` is read with probability ``1 - p_stall``, not at all
    during ``stalls``, ``retx`` likewise during ``retx_stalls`` (``(start, length)`` cycle
    ranges); the other outputs with probability ``1 - p_stall``, not at all during
    ``aux_stalls``."""
    dut = Completer(config, n_desc=n_desc)
    expect = []
    if atomic:
        model = CompleterModel(config.n_qp)
        for what, f in ops:
            expect.append(len(model.resumes))
            apply_op(model, what, f)
            model.walk_all()
    else:
        expect = [0] * len(ops)
    state = {"taken": 0, "posts": 0, "others": 0, "resets": 0, "post_done": False,
             "other_done": False, "cycle": 0, "post_waits": 0, "other_cycles": [],
             "post_cycles": [], "max_used": 0, "posted_while_full": 0, "hold": False,
             "retx_offered": 0, "rewinding_cycles": 0, "taken_cycles": []}
    out = {k: [] for k in ("cq", "retx", "qp_error", "arm", "rnr", "cq_cycles",
                           "retx_cycles", "arm_cycles", "rnr_cycles")}
    layouts = {"post": (dut.posted, posted_layout(config.n_qp)),
               "ev": (dut.ev, ack_event_layout(config.n_qp)),
               "fire": (dut.fire, timer_fire_layout(config.n_qp)),
               "reset": (dut.reset, None)}

    async def offer(ctx, what, f):
        port, layout = layouts[what]
        if layout is None:
            ctx.set(port.payload.qp, f["qp"])
        else:
            ctx.set(port.payload, layout.const(f))
        ctx.set(port.valid, 1)
        await ctx.tick().until(port.ready)
        ctx.set(port.valid, 0)
        state["taken_cycles"].append(state["cycle"])

    async def serial_driver(ctx):
        irng = random.Random(seed + 1)
        for k, (what, f) in enumerate(ops):
            if what == "hold":
                state["hold"] = True
                continue
            if what == "release":
                state["hold"] = False
                continue
            if what == "wait_retx":
                while state["retx_offered"] < f:
                    await ctx.tick()
                continue
            while irng.random() < p_idle or len(out["retx"]) < expect[k]:
                await ctx.tick()
            await offer(ctx, what, f)
            key = "posts" if what == "post" else "others"
            state[key] += 1
            state[f"{key[:-1]}_cycles"].append(state["cycle"])
        state["post_done"] = state["other_done"] = True

    posts = [(k, f) for k, (w, f) in enumerate(ops) if w == "post"]
    others = [(k, w, f) for k, (w, f) in enumerate(ops) if w != "post"]

    async def post_driver(ctx):
        prng = random.Random(seed + 1)
        for k, f in posts:
            while prng.random() < p_idle or \
                    state["resets"] < sum(1 for j, w, _ in others if j < k and w == "reset"):
                await ctx.tick()
            await offer(ctx, "post", f)
            state["posts"] += 1
            state["post_cycles"].append(state["cycle"])
        state["post_done"] = True

    async def other_driver(ctx):
        orng = random.Random(seed + 2)
        for k, w, f in others:
            while orng.random() < p_idle or state["posts"] < sum(1 for j, _ in posts if j < k):
                await ctx.tick()
            await offer(ctx, w, f)
            state["others"] += 1
            state["resets"] += w == "reset"
            state["other_cycles"].append(state["cycle"])
        state["other_done"] = True

    def busy(ctx):
        return any(ctx.get(p.valid) for p in (dut.cq, dut.retx, dut.qp_error, dut.arm,
                                              dut.rnr)) or ctx.get(dut.rewinding)

    async def reader(ctx):
        crng = random.Random(seed + 3)
        quiet = 0
        while not (state["post_done"] and state["other_done"]) or quiet < 60:
            now = state["cycle"]
            stalled = any(s <= now < s + n for s, n in stalls)
            rstalled = state["hold"] or any(s <= now < s + n for s, n in retx_stalls)
            ctx.set(dut.cq.ready, not stalled and crng.random() >= p_stall)
            ctx.set(dut.retx.ready, not rstalled and crng.random() >= p_stall)
            astalled = any(s <= now < s + n for s, n in aux_stalls)
            for p in (dut.qp_error, dut.arm, dut.rnr):
                ctx.set(p.ready, not astalled and crng.random() >= p_stall)
            await ctx.tick()
            quiet = 0 if busy(ctx) or not (state["post_done"] and state["other_done"]) \
                else quiet + 1

    def record(name, payload, fields):
        out[name].append({k: int(getattr(payload, k)) for k in fields})
        out.get(f"{name}_cycles", []).append(state["cycle"])

    retx_fields = [n for n, _ in dut.retx.payload.shape()]
    cq_fields = ("wr_id", "qp", "status", "opcode", "byte_len", "with_imm", "imm")

    async def monitor(ctx):
        async for _clk, _rst, *v in ctx.tick().sample(
                dut.cq.valid, dut.cq.ready, dut.cq.payload,
                dut.retx.valid, dut.retx.ready, dut.retx.payload,
                dut.qp_error.valid, dut.qp_error.ready, dut.qp_error.payload,
                dut.arm.valid, dut.arm.ready, dut.arm.payload,
                dut.rnr.valid, dut.rnr.ready, dut.rnr.payload,
                dut.posted.valid, dut.posted.ready, dut.slots_used, dut.rewinding):
            (cv, cr, cp, xv, xr, xp, ev_, er, ep, av, ar, ap, nv, nr, np_, pv, pr, used,
             rew) = v
            state["cycle"] += 1
            state["max_used"] = max(state["max_used"], used)
            state["rewinding_cycles"] += rew
            if pv and not pr:
                state["post_waits"] += 1
            if pv and pr and used >= n_desc:
                state["posted_while_full"] += 1
            if cv and cr:
                record("cq", cp, cq_fields)
            state["retx_offered"] = len(out["retx"]) + bool(xv)
            if xv and xr:
                record("retx", xp, retx_fields)
                state["retx_offered"] = len(out["retx"])
            if ev_ and er:
                record("qp_error", ep, ("qp", "status"))
            if av and ar:
                record("arm", ap, ("qp", "outstanding", "progress"))
            if nv and nr:
                record("rnr", np_, ("qp", "code"))

    counts = {}

    async def final(ctx):
        while not (state["post_done"] and state["other_done"]):
            await ctx.tick()
        for _ in range(20):
            await ctx.tick()
        counts["cnps"] = ctx.get(dut.cnps)
        counts["fires_ignored"] = ctx.get(dut.fires_ignored)

    drivers = [serial_driver] if serial else [post_driver, other_driver]
    run_simulation(dut, drivers + [reader, final], [monitor],
                   cycles=cycles or (60 * len(ops) + 20 * sum(n for _, n in stalls) +
                                     20 * sum(n for _, n in retx_stalls) +
                                     20 * sum(n for _, n in aux_stalls) + 3000))
    out.update(counts)
    out["stats"] = state
    return out


def per_qp(items):
    by = {}
    for c in items:
        by.setdefault(c["qp"], []).append(c)
    return by


def check_against_model(n_qp, ops, out, *, atomic=True, serial=True):
    model = run_model(n_qp, ops, atomic=atomic)
    same = (lambda a, b: a == b) if serial else (lambda a, b: per_qp(a) == per_qp(b))
    assert len(out["cq"]) == len(model.completions)
    assert same(out["cq"], model.completions)
    assert same(out["retx"], model.resumes)
    assert same(out["qp_error"], model.qp_errors)
    assert same(out["rnr"], model.rnrs)
    if serial:
        assert out["arm"] == model.arms
    assert out["cnps"] == model.cnps
    assert out["fires_ignored"] == model.fires_ignored
    assert out["stats"]["posted_while_full"] == 0
    return model


# ---------------------------------------------------------------- random, against the model

MIX = {"post": 10, "ack": 4, "nak": 2, "rnr": 0.8, "fatal": 0.25, "reset": 0.2,
       "cnp": 0.5, "to": 1, "done": 0.6, "exc": 0.1, "rnr_exc": 0.1}


@pytest.mark.parametrize("n_qp,n_desc,seed", [(16, 256, 1), (5, 16, 2), (4096, 32, 3)])
def test_against_model(n_qp, n_desc, seed):
    """Random posts, events and fires over hot QPs (coalesced ACKs over several WRs of several
    QPs, NAK PSN-sequence walks, RNR waits and their ends, timeouts, fatal NAK + flush,
    exhausted retries, resets), random idle and backpressure on every output, a long ``cq``
    stall that fills the small pools (posting waits), a long ``retx`` stall, and a stall of
    the timers' outputs (``arm``, ``rnr``: the completer waits, then goes on)."""
    rng = random.Random(seed)
    script = _Script(rng, min(n_qp, 8), hot=[0, 1, 2], cap=n_desc)
    for _ in range(500):
        script.random_op(MIX)
    # everything acknowledged at the end, so that most WRs complete
    for q in range(script.n_qp):
        if script.outstanding(q):
            script.event(q, K.ACK, psn=(script.next[q] - 1) & MASK)
    # (QP indices spread over the whole table)
    spread = {q: (q * 523 + 4095 * (q == 7)) % n_qp if n_qp > 8 else q for q in range(8)}
    ops = [(w, dict(f, qp=spread[f["qp"]])) for w, f in script.ops]
    config = EngineConfig(data_width=64, n_qp=n_qp)
    out = run_bench(config, ops, n_desc=n_desc, seed=seed, stalls=[(300, 600)],
                    retx_stalls=[(2000, 500)], aux_stalls=[(1200, 300)])
    model = check_against_model(n_qp, ops, out)
    # with arm not read the completer stopped taking inputs (after the two arms of room)
    taken = out["stats"]["taken_cycles"]
    assert not [c for c in taken if 1220 < c < 1500] and taken[-1] > 1600
    statuses = {c["status"] for c in model.completions}
    # the mix exercises every outcome
    assert {S.SUCCESS, S.WR_FLUSH_ERR} <= statuses and statuses & {9, 10, 11} and \
        statuses & {S.RETRY_EXC_ERR, S.RNR_RETRY_EXC_ERR}
    assert len(model.resumes) > 20 and any(r["start_packet"] for r in model.resumes)
    assert model.rnrs and model.qp_errors and model.cnps and model.fires_ignored
    assert any(a["progress"] for a in model.arms)
    if n_desc < 64:
        assert out["stats"]["max_used"] == n_desc and out["stats"]["post_waits"] > 0


def test_against_model_no_backpressure():
    """The same, with every output always ready and inputs back to back."""
    rng = random.Random(7)
    script = _Script(rng, 6, hot=[0, 1, 2], cap=64)
    for _ in range(400):
        script.random_op(MIX)
    out = run_bench(EngineConfig(data_width=64, n_qp=6), script.ops, n_desc=64, seed=7,
                    p_idle=0, p_stall=0)
    check_against_model(6, script.ops, out)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(10, 16))
def test_against_model_more_seeds(seed):
    rng = random.Random(seed)
    n_qp = rng.choice([3, 16, 64])
    n_desc = rng.choice([8, 32, 256])
    script = _Script(rng, min(n_qp, 10), hot=list(range(min(n_qp, 4))), max_pkts=6,
                     cap=n_desc)
    for _ in range(1500):
        script.random_op(MIX)
    out = run_bench(EngineConfig(data_width=64, n_qp=n_qp), script.ops, n_desc=n_desc,
                    seed=seed, stalls=[(rng.randrange(2000), rng.randrange(100, 1500))],
                    retx_stalls=[(rng.randrange(4000), rng.randrange(100, 1500))])
    check_against_model(n_qp, script.ops, out)


# ---------------------------------------------------------------- directed

def _wr(q, wr_id, first, npkts, *, signaled=1, opcode=0, length=None):
    return ("post", {"qp": q, "wr_id": wr_id, "opcode": opcode,
                     "length": npkts * 100 if length is None else length,
                     "signaled": signaled, "first_psn": first & MASK,
                     "last_psn": (first + npkts - 1) & MASK,
                     "remote_addr": 0x1000 * wr_id, "r_key": 0x500 + wr_id,
                     "imm": 0xAB000000 | wr_id, "solicited": wr_id & 1})


def _ev(q, kind, psn, code=0):
    return ("ev", {"qp": q, "kind": int(kind), "psn": psn & MASK, "code": code, "msn": 0})


def _fire(q, kind):
    return ("fire", {"qp": q, "kind": int(kind)})


def _strip(items, keys=("qp", "wr_id", "status", "opcode")):
    return [{k: c[k] for k in keys} for c in items]


def _resumes(out):
    """``(qp, wr_id, start_packet, start_psn)`` of each request on ``retx``, and a check of
    the WR fields it carries against what was posted."""
    for r in out["retx"]:
        w = r["wr_id"]
        assert (r["remote_addr"], r["r_key"], r["imm"], r["solicited"]) == \
            (0x1000 * w, 0x500 + w, 0xAB000000 | w, w & 1)
    return [(r["qp"], r["wr_id"], r["start_packet"], r["start_psn"]) for r in out["retx"]]


@pytest.mark.parametrize("m_wrs", [1, 5, 12])
def test_one_ack_completes_m_wrs_in_order(m_wrs):
    """One ACK for N packets of M messages: M completions in posting order, one per cycle,
    WRs of the other QP untouched; the PSNs wrap in the middle."""
    rng = random.Random(m_wrs)
    first = MASK - 7
    ops, psn = [], first
    for j in range(m_wrs):
        n = rng.randrange(1, 5)
        ops.append(_wr(0, 100 + j, psn, n, opcode=j % 4))
        psn = (psn + n) & MASK
    ops.append(_wr(1, 999, 50, 3))
    ops.append(_wr(0, 500, psn, 2))                  # not covered
    ops.append(_ev(0, K.ACK, psn - 1))               # the last PSN of WR 100 + m - 1
    out = run_bench(EngineConfig(data_width=64, n_qp=4), ops, p_idle=0, p_stall=0)
    wc = {0: proto.WcOpcode.RDMA_WRITE, 1: proto.WcOpcode.RDMA_WRITE, 2: proto.WcOpcode.SEND,
          3: proto.WcOpcode.SEND}
    assert _strip(out["cq"]) == [{"qp": 0, "wr_id": 100 + j, "status": 0,
                                  "opcode": int(wc[j % 4])} for j in range(m_wrs)]
    assert [c["byte_len"] for c in out["cq"]] == [f["length"] for w, f in ops[:m_wrs]]
    cyc = out["cq_cycles"]
    assert cyc == list(range(cyc[0], cyc[0] + m_wrs))        # one per cycle
    assert out["stats"]["max_used"] == m_wrs + 2
    # the ACK moved una: progress, WR 500 still outstanding
    assert out["arm"][-1] == {"qp": 0, "outstanding": 1, "progress": 1}
    assert out["retx"] == []


def test_nak_inside_a_message_resumes_it_then_later_wrs_whole():
    """NAK PSN-sequence in the middle of a 5-packet message whose PSNs wrap: the WRs before it
    complete (implicit ACK), the message is resumed from its third packet at the NAK's PSN,
    the two later WRs follow whole at their first PSNs; the WR of another QP is not touched."""
    base = MASK - 3                                   # WR 2: FFFFFC .. 000000
    ops = [_wr(0, 1, base - 2, 2), _wr(0, 2, base, 5), _wr(3, 9, 70, 2), _wr(0, 3, base + 5, 1),
           _wr(0, 4, base + 6, 3, signaled=0),
           _ev(0, K.NAK_SEQ, base + 2)]               # PSN 0xFFFFFE, packet 2 of WR 2
    out = run_bench(EngineConfig(data_width=64, n_qp=4), ops, seed=11)
    assert [(c["wr_id"], c["status"]) for c in out["cq"]] == [(1, 0)]
    assert _resumes(out) == [(0, 2, 2, MASK - 1), (0, 3, 0, 1), (0, 4, 0, 2)]
    assert out["retx"][0]["length"] == 500 and out["retx"][0]["opcode"] == 0
    # a repeat of the NAK (no progress since) does nothing; a timeout goes back again from
    # una, and then the NAK acts again
    ops += [_ev(0, K.NAK_SEQ, base + 2), _fire(0, T.TIMEOUT), _ev(0, K.NAK_SEQ, base + 2)]
    out = run_bench(EngineConfig(data_width=64, n_qp=4), ops, seed=12)
    assert _resumes(out) == [(0, 2, 2, MASK - 1), (0, 3, 0, 1), (0, 4, 0, 2)] * 3
    # arms: 5 posts, then {outstanding, progress}: the first NAK moved una, the repeat did not
    assert [(a["qp"], a["outstanding"], a["progress"]) for a in out["arm"]] == \
        [(0, 1, 0), (0, 1, 0), (3, 1, 0), (0, 1, 0), (0, 1, 0), (0, 1, 1), (0, 1, 0),
         (0, 1, 0)]
    check_against_model(4, ops, out)


def test_unsignaled_partial_acks_and_rnr_wait():
    """ACKs inside a WR complete nothing; unsignaled WRs complete without a report; an RNR NAK
    completes the WRs before its PSN, tells the timers (after the arm), walks nothing until
    RNR_DONE, which walks from the NAKed PSN; a second RNR NAK during the wait is a repeat;
    a timeout during the wait is ignored."""
    ops = [_wr(2, 1, 1000, 4), _wr(2, 2, 1004, 1, signaled=0), _wr(2, 3, 1005, 3),
           _wr(2, 4, 1008, 2, signaled=0), _wr(2, 5, 1010, 1),
           _ev(2, K.ACK, 1002),                       # inside WR 1: nothing
           _ev(2, K.ACK, 1004),                       # WR 1, WR 2 (silent)
           _ev(2, K.RNR, 1006, code=14),              # nothing completes; wait
           _ev(2, K.RNR, 1006, code=14),              # a repeat: nothing
           _fire(2, T.TIMEOUT),                       # ignored during the wait
           _fire(2, T.RNR_DONE),                      # walk from 1006 (packet 1 of WR 3)
           _fire(2, T.RNR_DONE),                      # no wait: ignored
           _ev(2, K.ACK, 1010)]                       # WR 3, 4 (silent), 5
    out = run_bench(EngineConfig(data_width=64, n_qp=4), ops, seed=3)
    assert _strip(out["cq"], ("wr_id", "status")) == [
        {"wr_id": w, "status": 0} for w in (1, 3, 5)]
    assert out["rnr"] == [{"qp": 2, "code": 14}]
    assert _resumes(out) == [(2, 3, 1, 1006), (2, 4, 0, 1008), (2, 5, 0, 1010)]
    assert out["fires_ignored"] == 2 and out["qp_error"] == []
    # the RNR NAK's arm (progress: una 1005 -> 1006) left before its rnr
    k = [a["progress"] for a in out["arm"]].index(1, 6)   # (the ACK 1004's)
    assert out["arm_cycles"][k + 1] < out["rnr_cycles"][0]
    check_against_model(4, ops, out)


@pytest.mark.parametrize("code,status", [(1, S.REM_INV_REQ_ERR), (2, S.REM_ACCESS_ERR),
                                         (3, S.REM_OP_ERR)])
def test_fatal_nak_leaves_other_qps_alone(code, status):
    """A fatal NAK on QP 1: its WRs before the PSN complete SUCCESS (an unsignaled one
    silently), the WR holding the PSN fails with the NAK's status, every later one and every
    one posted after is flushed (signaled or not), its events are ignored, its fires too;
    QPs 0 and 2 keep completing as if nothing happened. After a reset QP 1 works again."""
    ops = []
    for q in (0, 1, 2):
        for j in range(4):
            ops.append(_wr(q, 10 * q + j, 100 + 3 * j, 3, signaled=int(j != 1)))
    ops += [_ev(0, K.ACK, 105),                      # QP 0: WRs 0, 1 (silent)
            _ev(1, K.FATAL, 104, code=code),         # QP 1: see below
            _ev(2, K.ACK, 111),                      # QP 2: all four
            _wr(1, 50, 112, 1, signaled=0),          # flushed at once
            _ev(1, K.ACK, 111),                      # ignored (QP 1 failed)
            _ev(1, K.NAK_SEQ, 110),                  # ignored
            _fire(1, T.TIMEOUT),                     # ignored (counted)
            _ev(0, K.ACK, 111),                      # QP 0: WRs 2, 3
            ("reset", {"qp": 1}),
            _wr(1, 60, 7000, 2), _ev(1, K.ACK, 7001)]
    out = run_bench(EngineConfig(data_width=64, n_qp=4), ops, seed=code)
    by = per_qp(out["cq"])
    assert [(c["wr_id"], c["status"]) for c in by[0]] == [(0, 0), (2, 0), (3, 0)]
    assert [(c["wr_id"], c["status"]) for c in by[2]] == [(20, 0), (22, 0), (23, 0)]
    # PSN 104 is in WR 11 (103-105): WR 10 before it, WR 11 fails, 12 and 13 flushed
    assert [(c["wr_id"], c["status"]) for c in by[1]] == [
        (10, 0), (11, status), (12, S.WR_FLUSH_ERR), (13, S.WR_FLUSH_ERR),
        (50, S.WR_FLUSH_ERR), (60, 0)]
    assert out["qp_error"] == [{"qp": 1, "status": status}]
    assert out["retx"] == [] and out["fires_ignored"] == 1
    check_against_model(4, ops, out)


def test_retry_exhausted():
    """RETRY_EXC: the first WR kept completes RETRY_EXC_ERR (signaled or not), the rest are
    flushed, the QP is reported and stops its walk; RNR_RETRY_EXC after an RNR NAK fails the
    NAKed WR (the ones before it completed by the NAK); fires for a QP with nothing kept or
    in error are ignored and counted."""
    ops = [_wr(0, 1, 10, 2, signaled=0), _wr(0, 2, 12, 1), _wr(0, 3, 13, 4),
           _wr(1, 7, 500, 2), _wr(1, 8, 502, 2),
           _fire(0, T.TIMEOUT),                       # walk 1, 2, 3 from 10
           _fire(0, T.RETRY_EXC),
           _fire(0, T.RETRY_EXC), _fire(0, T.TIMEOUT), _fire(3, T.TIMEOUT),   # ignored
           _ev(1, K.RNR, 502, code=3),                # WR 7 done; wait
           _fire(1, T.RNR_RETRY_EXC)]
    out = run_bench(EngineConfig(data_width=64, n_qp=4), ops, seed=5)
    assert [(c["qp"], c["wr_id"], c["status"]) for c in out["cq"]] == [
        (0, 1, S.RETRY_EXC_ERR), (0, 2, S.WR_FLUSH_ERR), (0, 3, S.WR_FLUSH_ERR),
        (1, 7, S.SUCCESS), (1, 8, S.RNR_RETRY_EXC_ERR)]
    assert out["qp_error"] == [{"qp": 0, "status": S.RETRY_EXC_ERR},
                               {"qp": 1, "status": S.RNR_RETRY_EXC_ERR}]
    assert _resumes(out) == [(0, 1, 0, 10), (0, 2, 0, 12), (0, 3, 0, 13)]
    assert out["fires_ignored"] == 3
    assert {"qp": 0, "outstanding": 0, "progress": 0} in out["arm"]
    check_against_model(4, ops, out)


def test_reset_flushes_the_list():
    """A reset flushes every WR kept (signaled or not) with WR_FLUSH_ERR, in order, and the QP
    starts clean (una from its next WR); an RNR NAK on an empty list only tells the timers."""
    ops = [_wr(3, 1, 10, 2), _wr(3, 2, 12, 2, signaled=0), _wr(3, 3, 14, 1),
           _ev(3, K.ACK, 11), ("reset", {"qp": 3}), ("reset", {"qp": 3}),
           _ev(3, K.ACK, 20), _ev(3, K.RNR, 5, code=3), ("reset", {"qp": 3}),
           _wr(3, 4, 500, 3), _fire(3, T.TIMEOUT), _ev(3, K.ACK, 502)]
    out = run_bench(EngineConfig(data_width=64, n_qp=4), ops, seed=9)
    assert [(c["wr_id"], c["status"]) for c in out["cq"]] == [
        (1, 0), (2, S.WR_FLUSH_ERR), (3, S.WR_FLUSH_ERR), (4, 0)]
    assert out["rnr"] == [{"qp": 3, "code": 3}]
    assert _resumes(out) == [(3, 4, 0, 500)]
    check_against_model(4, ops, out)


def test_replay_after_the_pool_wrapped():
    """A pool of 8 descriptors used round and round (the free list is a ring): after 30 WRs
    acknowledged, 6 kept WRs sit on wrapped entries; a NAK walks them in posting order."""
    ops = []
    for j in range(30):
        ops += [_wr(1, j, 100 + 2 * j, 2), _ev(1, K.ACK, 101 + 2 * j)]
    ops += [_wr(1, 40 + j, 200 + 3 * j, 3) for j in range(6)]
    ops += [_wr(0, 90, 7, 1)]
    ops += [_ev(1, K.NAK_SEQ, 204), _ev(1, K.ACK, 217)]
    out = run_bench(EngineConfig(data_width=64, n_qp=2), ops, n_desc=8, seed=4)
    assert _resumes(out) == [(1, 41, 1, 204)] + [(1, 40 + j, 0, 200 + 3 * j)
                                                 for j in range(2, 6)]
    check_against_model(2, ops, out)


# ---------------------------------------------------------------- the walk with retx blocked

def _qp0_wrs():
    """QP 0: WR 1 (PSN 10-12), WR 2 (13-16), WR 3 (17), WR 4 (18-19)."""
    return [_wr(0, 1, 10, 3), _wr(0, 2, 13, 4), _wr(0, 3, 17, 1), _wr(0, 4, 18, 2)]


_HELD = {
    # a second NAK (progress) while the first walk waits: the walk starts again from it
    "back_to_back": ([_ev(0, K.NAK_SEQ, 11), ("wait_retx", 1), _ev(0, K.NAK_SEQ, 14)],
                     [(0, 1, 1, 11), (0, 2, 1, 14), (0, 3, 0, 17), (0, 4, 0, 18)]),
    # an RNR NAK during the replay stops it; RNR_DONE walks again from the NAKed PSN
    "rnr_during_replay": ([_ev(0, K.NAK_SEQ, 11), ("wait_retx", 1), _ev(0, K.RNR, 17, code=1),
                           ("release", None), ("wait_retx", 1), _fire(0, T.RNR_DONE)],
                          [(0, 1, 1, 11), (0, 3, 0, 17), (0, 4, 0, 18)]),
    # an ACK completes the WR the walk was to send next: it starts again from una
    "ack_passes_the_walk": ([_ev(0, K.NAK_SEQ, 10), ("wait_retx", 1), _ev(0, K.ACK, 17)],
                            [(0, 1, 0, 10), (0, 4, 0, 18)]),
    # an ACK behind the walk changes nothing; a WR posted meanwhile is walked too
    "posted_during_walk": ([_ev(0, K.NAK_SEQ, 14), ("wait_retx", 1), _ev(0, K.ACK, 14),
                            _wr(0, 5, 20, 1)],
                           [(0, 2, 1, 14), (0, 3, 0, 17), (0, 4, 0, 18), (0, 5, 0, 20)]),
    # a reset stops the walk; the new connection's WRs are walked on a timeout
    "reset_during_walk": ([_ev(0, K.NAK_SEQ, 11), ("wait_retx", 1), ("reset", {"qp": 0}),
                           _wr(0, 6, 900, 2), ("release", None), ("wait_retx", 1),
                           _fire(0, T.TIMEOUT)],
                          [(0, 1, 1, 11), (0, 6, 0, 900)]),
    # two QPs go back: the second waits in the queue (once, though asked twice)
    "queued_qp": ([_wr(1, 30, 70, 2), _ev(0, K.NAK_SEQ, 17), ("wait_retx", 1),
                   _fire(1, T.TIMEOUT), _ev(1, K.NAK_SEQ, 71)],
                  [(0, 3, 0, 17), (0, 4, 0, 18), (1, 30, 1, 71)]),
}


@pytest.mark.parametrize("case", sorted(_HELD))
def test_walk_while_retx_is_blocked(case):
    """With ``retx`` not read the walk stops after one request (held on ``retx``); events,
    WRs, fires and resets are taken meanwhile and change the walk (the model's rules, and the
    requests written out here); then ``retx`` is read again."""
    steps, expected = _HELD[case]
    ops = _qp0_wrs() + [("hold", None)] + steps + [("release", None)]
    out = run_bench(EngineConfig(data_width=64, n_qp=4), ops, seed=21, atomic=False)
    assert _resumes(out) == expected
    check_against_model(4, ops, out, atomic=False)


def test_posted_and_events_flow_while_retx_blocks_for_long():
    """The deadlock rule: ``retx`` is not read for 4,000 cycles in the middle of a walk; 150
    WRs on three other QPs (and two on the walked QP) are taken and completed meanwhile, at
    full rate, their completions leave on ``cq``; ``rewinding`` stays high; once ``retx`` is
    read the walk ends with the WRs posted meanwhile."""
    ops = _qp0_wrs() + [("hold", None), _ev(0, K.NAK_SEQ, 11), ("wait_retx", 1)]
    psn = {1: 100, 2: 5000, 3: MASK - 100}
    for j in range(150):
        q = 1 + j % 3
        ops.append(_wr(q, 1000 + j, psn[q], 2))
        ops.append(_ev(q, K.ACK, psn[q] + 1))
        psn[q] = (psn[q] + 2) & MASK
        if j in (40, 90):
            ops.append(_wr(0, 5 + j, 20 + j, 1))
    ops += [("release", None)]
    out = run_bench(EngineConfig(data_width=64, n_qp=4), ops, seed=22, atomic=False,
                    p_idle=0, p_stall=0, retx_stalls=[(0, 4000)])
    st = out["stats"]
    # every input was taken while retx was blocked
    assert st["taken_cycles"][-1] < 4000 < out["retx_cycles"][1]
    assert len([c for c in out["cq_cycles"] if c < 4000]) == 150
    assert st["rewinding_cycles"] > 4000 - 100
    assert _resumes(out) == [(0, 1, 1, 11), (0, 2, 0, 13), (0, 3, 0, 17), (0, 4, 0, 18),
                             (0, 45, 0, 60), (0, 95, 0, 110)]
    check_against_model(4, ops, out, atomic=False)


def test_full_pool_waits_and_loses_nothing():
    """Posting into a full pool: with ``cq`` not read, 8 slots take 8 WRs and ``posted``
    waits (the ACKs are processed meanwhile: the ACK handler is not held up); once ``cq`` is
    read again the rest go in and every completion comes out, in order."""
    n_desc = 8
    ops = []
    for j in range(30):
        ops.append(_wr(j % 2, j, 100 + j, 1))
        ops.append(_ev(j % 2, K.ACK, 100 + j))
    # (QP 0 and 1 share the PSN numbers 100.. by parity: each QP's WRs are in PSN order)
    out = run_bench(EngineConfig(data_width=64, n_qp=2), ops, n_desc=n_desc, seed=4,
                    p_idle=0, p_stall=0, stalls=[(0, 400)], serial=False)
    st = out["stats"]
    assert st["max_used"] == n_desc and st["post_waits"] > 300
    assert [c["wr_id"] for c in out["cq"]] == list(range(30))
    assert out["cq_cycles"][0] > 400
    check_against_model(2, ops, out, serial=False)


def test_events_flow_while_cq_stalls():
    """With ``cq`` not read, events keep being taken at their documented rate: 12 ACKs that
    complete 12 WRs already kept are all taken within the stall."""
    ops = [_wr(0, j, 10 * j, 10) for j in range(12)]
    ops += [_ev(0, K.ACK, 10 * j + 9) for j in range(12)]
    out = run_bench(EngineConfig(data_width=64, n_qp=2), ops, seed=5, p_idle=0, p_stall=0,
                    stalls=[(0, 300)], serial=False)
    assert [c["wr_id"] for c in out["cq"]] == list(range(12))
    assert out["cq_cycles"][0] > 300
    # every event was taken before the stall ended
    assert max(out["stats"]["other_cycles"]) < 300


def test_rates_and_turns():
    """The documented rates: a WR taken every 2 cycles; an event 5 cycles plus 1 per WR it
    completes (4 + M when it empties the list), 3 on an empty list, + 4 for an RNR's report
    (its arm leaves first), a CNP 2; the
    first completion on ``cq`` 6 cycles after its event, then one per cycle; a walk sends its
    first request 7 cycles after a timeout, then one per 5 cycles; with WRs and events both
    waiting they are taken in turn."""
    ops = [_wr(0, j, 10 * j, 10) for j in range(20)]
    ops += [_ev(0, K.ACK, 10 * j + 9) for j in range(3)]         # 1 WR each
    ops += [_ev(0, K.ACK, 35 + j) for j in range(3)]             # none
    ops += [_ev(0, K.ACK, 199)]                                  # the other 17
    ops += [_ev(0, K.RNR, 300), _ev(0, K.CNP, 0), _ev(0, K.CNP, 0), _ev(0, K.NAK_SEQ, 300)]
    ops += [("reset", {"qp": 3})]             # (the WRs below wait for it: the bench's rule)
    ops += [_ev(1, K.ACK, 1, code=j) for j in range(6)]          # with the WRs below
    ops += [_wr(2, 100 + j, 1000 + j, 1) for j in range(6)]
    out = run_bench(EngineConfig(data_width=64, n_qp=4), ops, p_idle=0, p_stall=0,
                    serial=False, atomic=False)
    st = out["stats"]
    pc, oc = st["post_cycles"], st["other_cycles"]
    assert [b - a for a, b in zip(pc[:20], pc[1:20])] == [2] * 19
    assert [b - a for a, b in zip(oc, oc[1:11])] == [6, 6, 6, 5, 5, 5, 4 + 17, 3 + 4, 2, 2]
    assert out["cq_cycles"][0] - oc[0] == 6
    assert out["cq_cycles"][3:20] == list(range(out["cq_cycles"][3], out["cq_cycles"][3] + 17))
    # the last 6 events and 6 WRs alternate: an event, then a WR, ...
    turns = sorted([(c, "ev") for c in oc[12:]] + [(c, "wr") for c in pc[20:]])
    assert [w for _, w in turns] == ["ev", "wr"] * 6 or [w for _, w in turns] == \
        ["wr", "ev"] * 6
    # a walk of 8 WRs on a timeout, nothing else waiting: the first request 7 cycles after
    # the fire, then one per 5 cycles
    ops = [_wr(0, j, 10 * j, 10) for j in range(8)] + [_fire(0, T.TIMEOUT)]
    out = run_bench(EngineConfig(data_width=64, n_qp=4), ops, p_idle=0, p_stall=0)
    rc = out["retx_cycles"]
    assert len(rc) == 8 and [b - a for a, b in zip(rc, rc[1:])] == [5] * 7
    assert rc[0] - out["stats"]["other_cycles"][0] == 7


# ---------------------------------------------------------------- the model alone

def test_model_rules():
    m = CompleterModel(4)
    m.post(0, 1, proto.WrOpcode.SEND_WITH_IMM, 10, 1, 5, 7)
    m.post(0, 2, proto.WrOpcode.RDMA_WRITE_WITH_IMM, 0, 1, 8, 8)
    m.post(0, 3, proto.WrOpcode.RDMA_READ, 20, 0, 9, 9)
    m.event(0, K.ACK, 6)
    assert m.completions == [] and m.una(0) == 7
    m.event(0, K.NAK_SEQ, 8)
    assert [c["wr_id"] for c in m.completions] == [1]
    assert m.completions[0]["opcode"] == proto.WcOpcode.SEND
    assert m.rewinding and m.walk_step()["wr_id"] == 2 and m.walk_step()["wr_id"] == 3
    assert not m.rewinding and m.walk_step() is None
    m.event(0, K.FATAL, 9, code=2)
    assert [(c["wr_id"], c["status"], c["opcode"]) for c in m.completions[1:]] == [
        (2, S.SUCCESS, proto.WcOpcode.RDMA_WRITE), (3, S.REM_ACCESS_ERR,
                                                    proto.WcOpcode.RDMA_READ)]
    assert m.qp_errors == [{"qp": 0, "status": S.REM_ACCESS_ERR}] and m.in_error(0)
    m.post(0, 4, 0, 0, 0, 10, 10)
    assert m.completions[-1]["status"] == S.WR_FLUSH_ERR
    m.reset(0)
    assert not m.in_error(0) and m.outstanding(0) == []
    assert [a["outstanding"] for a in m.arms] == [1, 1, 1, 1, 1, 0, 0, 0]


def test_bad_parameters():
    with pytest.raises(ValueError, match="n_desc"):
        Completer(EngineConfig(data_width=64), n_desc=100)
    with pytest.raises(ValueError, match="n_desc"):
        Completer(EngineConfig(data_width=64), n_desc=1)
    with pytest.raises(ValueError, match="aux_depth"):
        Completer(EngineConfig(data_width=64), aux_depth=1)
    with pytest.raises(TypeError):
        Completer(64)


# ---------------------------------------------------------------- the model against the reference

class _Shadow(ReliableRequester):
    """The reference requester with a :class:`CompleterModel` beside it: the model sees the WRs
    the reference starts sending (``posted``), the ACKs and NAKs the reference acts on (the
    ACK handler's events), its timer decisions (``fire``); at every go-back the model's walk
    (expanded to packets) must be the packets the reference sends again, and its completions
    the reference's for the WRs it was given."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cm = CompleterModel(self.n_qp)
        self.wrs = {}
        self.go_backs = 0
        self.walked = 0
        self.ended = 0              # ACKs that ended an RNR wait early

    def _send_one(self, c):
        n = len(self._tx)
        super()._send_one(c)
        for rec in self._tx[n:]:
            st = self._qp[rec.qp]
            if not rec.retransmission and st.inflight and \
                    st.inflight[-1].first_psn == rec.psn and st.inflight[-1].n_sent == 1:
                wr = st.inflight[-1]
                self.wrs[wr.wr_id] = wr
                self.cm.post(qp=rec.qp, wr_id=wr.wr_id, opcode=int(wr.op), length=wr.length,
                             signaled=wr.signaled, first_psn=wr.first_psn,
                             last_psn=wr.last_psn, remote_addr=wr.remote_addr,
                             r_key=wr.r_key, imm=wr.imm, solicited=int(wr.solicited))

    def _expected(self, i):
        """The packets (wr_id, PSN) QP ``i`` sends from its oldest unacknowledged one on: the
        ones sent, then the rest of a message begun."""
        st = self._qp[i]
        out = [(p.wr.wr_id, p.spec.psn) for p in st.out]
        if st.unsent and st.unsent[0].n_sent:
            wr = st.unsent[0]
            out += [(wr.wr_id, s.psn) for s in wr.packets[wr.n_sent:]]
        return out

    def _walk(self, i, went_back):
        got = []
        for r in self.cm.walk_all():
            assert r["qp"] == i
            wr = self.wrs[r["wr_id"]]
            n = (wr.last_psn - wr.first_psn) % (1 << 24) + 1
            assert r["start_psn"] == (wr.first_psn + r["start_packet"]) % (1 << 24)
            assert (r["opcode"], r["remote_addr"], r["r_key"], r["imm"], r["length"]) == \
                (int(wr.op), wr.remote_addr, wr.r_key, wr.imm, wr.length)
            got += [(wr.wr_id, (r["start_psn"] + k) % (1 << 24))
                    for k in range(n - r["start_packet"])]
        if went_back:
            self.go_backs += 1
            assert got == self._expected(i), (i, got, self._expected(i))
            self.walked += bool(got)
        else:
            assert got == [], (i, got)

    def _receive(self, frame, bad, c):
        res = classify(frame, bad=bad, local_mac=self.local_mac, local_ip=self.local_ip)
        f = res.fields if res.kind == "roce" else {}
        i = f["bth"]["dest_qp"] - proto.LOCAL_QPN_BASE if f else -1
        if not (f.get("aeth") and 0 <= i < self.n_qp):
            super()._receive(frame, bad, c)
            return
        una = self._req.qps.rows[i]["una_psn"]
        go_backs = self._stats[i]["go_backs"]
        waiting = self._qp[i].rnr_until is not None
        rnr_exceeded = self.counters["rnr_retry_exceeded"]
        self._acted = False
        super()._receive(frame, bad, c)
        typ, code = proto.aeth_decode(f["aeth"]["syndrome"])
        kind = {proto.AethType.ACK: K.ACK, proto.AethType.RNR_NAK: K.RNR}.get(
            typ, K.NAK_SEQ if code == 0 else K.FATAL)
        # an ACK the reference took moved una; a NAK it took reached its NAK rules
        if not (self._acted if kind != K.ACK else self._req.qps.rows[i]["una_psn"] != una):
            return
        assert self.counters["retry_exceeded"] == getattr(self, "_retry_exceeded", 0), \
            "a sequence NAK with no retry left: not comparable"
        self.cm.event(i, kind, f["bth"]["psn"], code)
        if self.counters["rnr_retry_exceeded"] > rnr_exceeded:
            self.cm.fire(i, proto.TimerKind.RNR_RETRY_EXC)
        # (progress during an RNR wait ends it: the reference sends again from una)
        ended = waiting and self._qp[i].rnr_until is None and kind != K.FATAL and \
            self.counters["rnr_retry_exceeded"] == rnr_exceeded
        self.ended += ended and kind == K.ACK
        self._walk(i, self._stats[i]["go_backs"] > go_backs or ended)

    def _seq_nak(self, i, psn, c):
        self._acted = True
        super()._seq_nak(i, psn, c)

    def _rnr_nak(self, i, psn, code, c):
        self._acted = True
        super()._rnr_nak(i, psn, code, c)

    def _fail(self, i, status, **kwargs):
        self._acted = True
        super()._fail(i, status, **kwargs)

    def _rnr_end(self, i, c):
        super()._rnr_end(i, c)
        self.cm.fire(i, proto.TimerKind.RNR_DONE)
        self._walk(i, True)

    def _timeout(self, i, c):
        acted = bool(self._qp[i].out)
        before = self.counters["retry_exceeded"]
        super()._timeout(i, c)
        if acted:
            failed = self.counters["retry_exceeded"] > before
            self._retry_exceeded = self.counters["retry_exceeded"]
            self.cm.fire(i, proto.TimerKind.RETRY_EXC if failed else proto.TimerKind.TIMEOUT)
            self._walk(i, not failed)

    def check_completions(self, completions):
        ref = per_qp([{"qp": c["qp"], "wr_id": c["wr_id"], "status": int(c["status"]),
                       "byte_len": c["byte_len"]}
                      for c in completions if c["wr_id"] in self.wrs])
        mine = per_qp([{k: c[k] for k in ("qp", "wr_id", "status", "byte_len")}
                       for c in self.cm.completions])
        assert mine == ref


class _ShadowRequester(ModelRequester):
    def __init__(self, n_qp, *, data_width, **kwargs):
        super().__init__(n_qp, data_width=data_width, **kwargs)
        self.model = _Shadow(n_qp, data_width=data_width, clock_hz=CLOCK_HZ[data_width],
                             **kwargs)


def _shadow_run(qps, wrs, *, n_qp=8, data_width=64, **kwargs):
    req = _ShadowRequester(n_qp, data_width=data_width)
    r = run_reliable_loop(qps, wrs, requester=req, **kwargs)
    assert r.finished and r.delivery_ok, r.problems
    req.model.check_completions(r.completions)
    return r, req.model


_LOSSY = dict(drop=0.04, dup=0.01, reorder=0.01, corrupt=0.01, reorder_depth=3)
#: duplicated ACKs and NAKs: repeats of a sequence NAK (the second does not go back)
_DUP_BACK = {"fwd": dict(drop=0.03), "rev": dict(dup=0.2, drop=0.02)}


@pytest.mark.parametrize("seed,network", [(1, _LOSSY), (2, _DUP_BACK)])
def test_model_walk_is_the_references_go_back(seed, network):
    """Lossy network (drops, duplicates, reordering, corruption), 4 QPs, multi-packet
    messages, PSNs wrapping on two QPs: at every sequence NAK, timeout and RNR end the model's
    walk sends exactly the packets the reference sends again (and nothing when the reference
    ignores a repeated NAK), and the completions agree."""
    qps, wrs = loop_workload(n_qps=4, messages=150, sizes=(0, 3000), seed=seed, pmtu=512,
                             start_psns=[0xFFFFF0, 5, 0xFFFFFE, 1000])
    r, sh = _shadow_run(qps, wrs, network=network, qp_params={"timeout": 4}, seed=seed)
    assert r.all_delivered and sh.go_backs > 10 and sh.walked > 10
    assert r.requester["timeouts"] > 0 and r.requester["go_back_nak"] > 0
    if network is _DUP_BACK:
        assert r.requester["nak_seq_repeat"] > 0


@pytest.mark.parametrize("dup", [False, True])
def test_model_rnr_and_retry_exceeded_as_the_reference(dup):
    """RNR NAKs until receives are posted (sequence NAKs during the waits, RNR_DONE walks;
    with duplicates both ways, repeated RNR NAKs too), and a QP whose frames are all lost
    ending in RETRY_EXC_ERR and flushes."""
    qps, wrs = loop_workload(n_qps=3, messages=40, sizes=(1, 2500), seed=5, pmtu=1024)
    wrs = [WorkItem(qp=0, opcode=proto.WrOpcode.SEND, payload=b"hello" * 300, wr_id=100)] + wrs
    peer = make_responder(qps, wrs, recv=False)

    def post_all(loop):
        for q in qps:
            need = sum(1 for w in wrs
                       if w.qp == q.index and w.opcode != proto.WrOpcode.RDMA_WRITE)
            loop.responder.post_recv(q.remote_qpn, 4096, need)
    network = {"fwd": {"qp_drop": {qps[2].remote_qpn: 1.0}, "drop": 0.02}}
    if dup:
        network = {"fwd": {"qp_drop": {qps[2].remote_qpn: 1.0}, "drop": 0.03, "dup": 0.05},
                   "rev": {"dup": 0.2, "reorder": 0.05}}
    r, sh = _shadow_run(qps, wrs, responder=peer, qp_params={"timeout": 3, "retry_cnt": 3},
                        network=network, actions=[(100_000, post_all)])
    assert r.failed_qps[2] == "RETRY_EXC_ERR"
    assert r.requester["rnr_waits"] >= 3 and sh.cm.rnrs and sh.walked > 3
    assert r.requester["nak_seq_in_rnr_wait"] > 0
    assert {e["status"] for e in sh.cm.qp_errors} == {S.RETRY_EXC_ERR}
    if dup:
        assert r.requester["rnr_nak_repeat"] > 0


# ---------------------------------------------------------------- with the timers

class _WithTimers(Elaboratable):
    """The completer and the retransmission timers, connected as the design note has it
    (``arm``/``rnr`` to the timers, their ``fire`` back)."""

    def __init__(self, config, clock_hz):
        self.c = Completer(config)
        self.t = RetxTimers(config, clock_hz=clock_hz)

    def elaborate(self, platform):
        m = Module()
        m.submodules.c, m.submodules.t = self.c, self.t
        wiring.connect(m, self.c.arm, self.t.arm)
        wiring.connect(m, self.c.rnr, self.t.rnr)
        wiring.connect(m, self.t.fire, self.c.fire)
        return m


def test_with_the_timers():
    """The completer and RetxTimers together (1 MHz: a 4.096 us tick is 4 cycles). QP 0 is
    never acknowledged: two timeouts walk its 3 WRs again (retry_cnt 2), then RETRY_EXC fails
    the first and flushes the rest (a RETRY_EXC during a walk would stop it). QP 1's RNR NAK
    with rnr_retry 0 fails its WR RNR_RETRY_EXC_ERR. QP 2's RNR NAK waits (code 1: 10 us),
    RNR_DONE walks it from the NAKed PSN, an ACK completes it, and its timers stop (no more
    fires)."""
    config = EngineConfig(data_width=64, n_qp=4)
    dut = _WithTimers(config, 1_000_000)
    c, t = dut.c, dut.t
    # timeout, retry_cnt, rnr_retry (QP 0: 32.8 us, long enough for a walk of 3 WRs)
    setups = {0: (3, 2, 0), 1: (1, 7, 0), 2: (3, 7, 1)}
    inputs = [_wr(0, 1, 100, 2), _wr(0, 2, 102, 1), _wr(0, 3, 103, 3), _wr(1, 10, 50, 1),
              _ev(1, K.RNR, 50, code=1), _wr(2, 20, 7, 2), _wr(2, 21, 9, 1),
              _ev(2, K.ACK, 7), _ev(2, K.RNR, 8, code=1)]
    out = {"cq": [], "retx": [], "qp_error": []}
    state = {}

    async def driver(ctx):
        for q, (timeout, retry, rnr_retry) in setups.items():
            ctx.set(t.setup.payload, {"qp": q, "timeout": timeout, "retry_cnt": retry,
                                      "rnr_retry": rnr_retry})
            ctx.set(t.setup.valid, 1)
            await ctx.tick().until(t.setup.ready)
        ctx.set(t.setup.valid, 0)
        ports = {"post": (c.posted, posted_layout(4)), "ev": (c.ev, ack_event_layout(4))}
        for what, f in inputs:
            port, layout = ports[what]
            ctx.set(port.payload, layout.const(f))
            ctx.set(port.valid, 1)
            await ctx.tick().until(port.ready)
            ctx.set(port.valid, 0)
        # QP 2: acknowledged once its walk was sent
        while not any(r["qp"] == 2 for r in out["retx"]):
            await ctx.tick()
        await ctx.tick().repeat(5)
        port, layout = ports["ev"]
        ctx.set(port.payload, layout.const(_ev(2, K.ACK, 9)[1]))
        ctx.set(port.valid, 1)
        await ctx.tick().until(port.ready)
        ctx.set(port.valid, 0)
        await ctx.tick().repeat(3000)
        state["ignored"] = ctx.get(c.fires_ignored)

    async def monitor(ctx):
        for p in (c.cq, c.retx, c.qp_error):
            ctx.set(p.ready, 1)
        async for _clk, _rst, *v in ctx.tick().sample(
                c.cq.valid, c.cq.payload, c.retx.valid, c.retx.payload, c.qp_error.valid,
                c.qp_error.payload):
            for name, (valid, payload) in zip(out, zip(v[::2], v[1::2])):
                if valid:
                    out[name].append({k: int(getattr(payload, k)) for k, _ in payload.shape()})

    run_simulation(dut, [driver], [monitor], cycles=20000)
    by = per_qp(out["cq"])
    walks = [(r["qp"], r["wr_id"], r["start_packet"], r["start_psn"]) for r in out["retx"]]
    assert [(x["wr_id"], x["status"]) for x in by[0]] == [
        (1, S.RETRY_EXC_ERR), (2, S.WR_FLUSH_ERR), (3, S.WR_FLUSH_ERR)]
    assert [(x["wr_id"], x["status"]) for x in by[1]] == [(10, S.RNR_RETRY_EXC_ERR)]
    assert [(x["wr_id"], x["status"]) for x in by[2]] == [(20, S.SUCCESS), (21, S.SUCCESS)]
    assert [w for w in walks if w[0] == 0] == [(0, 1, 0, 100), (0, 2, 0, 102),
                                               (0, 3, 0, 103)] * 2
    assert [w for w in walks if w[0] == 2] == [(2, 20, 1, 8), (2, 21, 0, 9)]
    assert {(e["qp"], e["status"]) for e in out["qp_error"]} == {
        (0, S.RETRY_EXC_ERR), (1, S.RNR_RETRY_EXC_ERR)}
    # every fire acted on: none came for a QP done or failed
    assert state["ignored"] == 0
