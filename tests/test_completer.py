# SPDX-License-Identifier: BSD-2-Clause
"""Completer against its model (random WR and event streams: coalesced ACKs over several WRs of
several QPs, NAK PSN-sequence, RNR, fatal NAKs and flushes, resets, a small pool filling up,
``cq`` stalls), directed cases checked against results written out here, and the model's own
rules on hand-made cases."""

import random

import pytest

from roce_hw import proto
from roce_hw.config import EngineConfig
from roce_hw.ctrl.completer import Completer
from roce_hw.layouts import ack_event_layout, posted_layout
from roce_hw.model.completer import CompleterModel
from sim.harness import run_simulation

__all__ = []

K = proto.AckKind
S = proto.WcStatus
MASK = proto.PSN_MASK


# ---------------------------------------------------------------- the script generator

class _Script:
    """A random, consistent order of inputs: WRs sent per QP in PSN order, events only for
    PSNs sent and not yet acknowledged (what the ACK handler passes on), resets."""

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
        self.una = dict(self.next)
        self.failed = set()
        self.ops = []
        self.wr_id = 0

    def qp(self):
        return self.rng.choice(self.hot) if self.rng.random() < 0.85 \
            else self.rng.randrange(self.n_qp)

    def post(self, q, npkts=None, signaled=None, opcode=None):
        rng = self.rng
        npkts = npkts or rng.randrange(1, self.max_pkts + 1)
        first = self.next[q]
        last = (first + npkts - 1) & MASK
        self.next[q] = (last + 1) & MASK
        self.wr_id += 1
        op = {"qp": q, "wr_id": (self.wr_id << 20) | rng.getrandbits(20),
              "opcode": rng.choice([0, 1, 2, 3, 3, 4]) if opcode is None else opcode,
              "length": rng.randrange(0, 1 << 32) if rng.random() < 0.1
              else rng.randrange(max(0, npkts - 1) * 1024, npkts * 1024 + 1),
              "signaled": int(rng.random() < self.p_signaled) if signaled is None
              else int(signaled),
              "first_psn": first, "last_psn": last}
        self.ops.append(("post", op))
        self.model.post(**op)

    def outstanding(self, q):
        return (self.next[q] - self.una[q]) & MASK

    def event(self, q, kind, psn=None, code=0):
        if psn is None:
            psn = (self.una[q] + self.rng.randrange(self.outstanding(q))) & MASK
        if kind == K.ACK:
            self.una[q] = (psn + 1) & MASK
        elif kind == K.NAK_SEQ:
            self.una[q] = psn
        elif kind == K.FATAL:
            self.failed.add(q)
        self.ops.append(("ev", {"qp": q, "kind": int(kind), "psn": psn, "code": code,
                                "msn": self.rng.getrandbits(24)}))
        self.model.event(**self.ops[-1][1])

    def reset(self, q):
        self.next[q] = self.una[q] = self.rng.getrandbits(24)
        self.failed.discard(q)
        self.ops.append(("reset", {"qp": q}))
        self.model.reset(q)

    def random_op(self, weights):
        rng = self.rng
        r = rng.random() * sum(weights.values())
        for what, w in weights.items():
            r -= w
            if r < 0:
                break
        q = self.qp()
        if what in ("ack", "nak", "rnr", "fatal") and not (
                self.outstanding(q) and (q not in self.failed or rng.random() < 0.3)):
            # (events of a failed QP still in the ACK handler's FIFO are ignored: a few)
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
        else:
            self.event(q, K.FATAL, code=rng.choice([1, 2, 3]))


def run_model(n_qp, ops):
    model = CompleterModel(n_qp)
    for what, f in ops:
        if what == "post":
            model.post(**f)
        elif what == "ev":
            model.event(**f)
        else:
            model.reset(**f)
    return model


# ---------------------------------------------------------------- the bench

def run_bench(config, ops, *, n_desc=256, seed=0, p_idle=0.3, p_stall=0.3, stalls=(),
              cycles=None):
    """Feed ``ops`` (``("post" | "ev" | "reset", fields)``) to a Completer: the posts from one
    driver, events and resets from another, each in script order, an event or reset only once
    every post before it was taken and a post only once every reset before it was (the
    ordering contract); ``cq`` read with probability ``1 - p_stall``, not at all during the
    ``stalls`` (``(start, length)`` cycle ranges). Returns the outputs and statistics."""
    dut = Completer(config, n_desc=n_desc)
    rng = random.Random(seed)
    posts = [(k, f) for k, (w, f) in enumerate(ops) if w == "post"]
    others = [(k, w, f) for k, (w, f) in enumerate(ops) if w != "post"]
    state = {"posts": 0, "others": 0, "resets": 0, "post_done": False, "other_done": False,
             "cycle": 0, "post_waits": 0, "other_cycles": [], "post_cycles": [], "max_used": 0, "posted_while_full": 0}
    out = {"cq": [], "replay": [], "qp_error": [], "cq_cycles": []}
    pl = posted_layout(config.n_qp)
    el = ack_event_layout(config.n_qp)

    def posts_before(k):
        return sum(1 for j, _ in posts if j < k)

    def resets_before(k):
        return sum(1 for j, w, _ in others if j < k and w == "reset")

    async def post_driver(ctx):
        prng = random.Random(seed + 1)
        for k, f in posts:
            while prng.random() < p_idle or state["resets"] < resets_before(k):
                await ctx.tick()
            ctx.set(dut.posted.payload, pl.const(f))
            ctx.set(dut.posted.valid, 1)
            await ctx.tick().until(dut.posted.ready)
            ctx.set(dut.posted.valid, 0)
            state["posts"] += 1
            state["post_cycles"].append(state["cycle"])
        state["post_done"] = True

    async def other_driver(ctx):
        orng = random.Random(seed + 2)
        for k, w, f in others:
            while orng.random() < p_idle or state["posts"] < posts_before(k):
                await ctx.tick()
            if w == "ev":
                ctx.set(dut.ev.payload, el.const(f))
                ctx.set(dut.ev.valid, 1)
                await ctx.tick().until(dut.ev.ready)
                ctx.set(dut.ev.valid, 0)
            else:
                ctx.set(dut.reset.payload.qp, f["qp"])
                ctx.set(dut.reset.valid, 1)
                await ctx.tick().until(dut.reset.ready)
                ctx.set(dut.reset.valid, 0)
            state["others"] += 1
            state["resets"] += w == "reset"
            state["other_cycles"].append(state["cycle"])
        state["other_done"] = True

    async def reader(ctx):
        crng = random.Random(seed + 3)
        quiet = 0
        while not (state["post_done"] and state["other_done"]) or quiet < 40:
            now = state["cycle"]
            stalled = any(s <= now < s + n for s, n in stalls)
            ctx.set(dut.cq.ready, not stalled and crng.random() >= p_stall)
            ctx.set(dut.replay.ready, crng.random() >= p_stall)
            ctx.set(dut.qp_error.ready, crng.random() >= p_stall)
            await ctx.tick()
            busy = ctx.get(dut.cq.valid) or ctx.get(dut.replay.valid) or \
                ctx.get(dut.qp_error.valid)
            quiet = 0 if busy or not (state["post_done"] and state["other_done"]) \
                else quiet + 1

    async def monitor(ctx):
        async for _clk, _rst, *v in ctx.tick().sample(
                dut.cq.valid, dut.cq.ready, dut.cq.payload,
                dut.replay.valid, dut.replay.ready, dut.replay.payload,
                dut.qp_error.valid, dut.qp_error.ready, dut.qp_error.payload,
                dut.posted.valid, dut.posted.ready, dut.slots_used):
            (cv, cr, cp, rv, rr, rp, ev_, er, ep, pv, pr, used) = v
            state["cycle"] += 1
            state["max_used"] = max(state["max_used"], used)
            if pv and not pr:
                state["post_waits"] += 1
            if pv and pr and used >= n_desc:
                state["posted_while_full"] += 1
            if cv and cr:
                out["cq"].append({"wr_id": cp.wr_id, "qp": cp.qp, "status": cp.status,
                                  "opcode": cp.opcode, "byte_len": cp.byte_len,
                                  "with_imm": cp.with_imm, "imm": cp.imm})
                out["cq_cycles"].append(state["cycle"])
            if rv and rr:
                out["replay"].append({"qp": rp.qp, "psn": rp.psn, "rnr": rp.rnr,
                                      "code": rp.code})
            if ev_ and er:
                out["qp_error"].append({"qp": ep.qp, "status": ep.status})

    cnps = {}

    async def final(ctx):
        while not (state["post_done"] and state["other_done"]):
            await ctx.tick()
        for _ in range(20):
            await ctx.tick()
        cnps["n"] = ctx.get(dut.cnps)

    run_simulation(dut, [post_driver, other_driver, reader, final], [monitor],
                   cycles=cycles or (40 * len(ops) + 20 * sum(n for _, n in stalls) + 2000))
    out["cnps"] = cnps["n"]
    out["stats"] = state
    return out


def per_qp(completions):
    by = {}
    for c in completions:
        by.setdefault(c["qp"], []).append(c)
    return by


def check_against_model(n_qp, ops, out):
    model = run_model(n_qp, ops)
    assert len(out["cq"]) == len(model.completions)
    assert per_qp(out["cq"]) == per_qp(model.completions)
    assert out["replay"] == model.replays
    assert out["qp_error"] == model.qp_errors
    assert out["cnps"] == model.cnps
    assert out["stats"]["posted_while_full"] == 0
    return model


# ---------------------------------------------------------------- random, against the model

MIX = {"post": 10, "ack": 6, "nak": 1.2, "rnr": 0.8, "fatal": 0.25, "reset": 0.2,
       "cnp": 0.5}


@pytest.mark.parametrize("n_qp,n_desc,seed", [(16, 256, 1), (5, 16, 2), (4096, 32, 3)])
def test_against_model(n_qp, n_desc, seed):
    """Random posts and events over hot QPs (coalesced ACKs over several WRs of several QPs,
    NAK PSN-sequence, RNR, fatal NAK + flush, reset), random idle and ``cq`` backpressure,
    with a long ``cq`` stall that fills the small pools (posting waits)."""
    rng = random.Random(seed)
    script = _Script(rng, min(n_qp, 8), hot=[0, 1, 2], cap=n_desc)
    for _ in range(500):
        script.random_op(MIX)
    # everything acknowledged at the end, so that most WRs complete
    for q in range(script.n_qp):
        if script.outstanding(q) and q not in script.failed:
            script.event(q, K.ACK, psn=(script.next[q] - 1) & MASK)
    # (QP indices spread over the whole table)
    spread = {q: (q * 523 + 4095 * (q == 7)) % n_qp if n_qp > 8 else q for q in range(8)}
    ops = [(w, dict(f, qp=spread[f["qp"]])) for w, f in script.ops]
    config = EngineConfig(data_width=64, n_qp=n_qp)
    out = run_bench(config, ops, n_desc=n_desc, seed=seed, stalls=[(300, 600)])
    model = check_against_model(n_qp, ops, out)
    statuses = {c["status"] for c in model.completions}
    # the mix exercises every outcome
    assert {S.SUCCESS, S.WR_FLUSH_ERR} <= statuses and statuses & {9, 10, 11}
    assert model.replays and any(r["rnr"] for r in model.replays)
    assert model.qp_errors and model.cnps
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
                    seed=seed,
                    stalls=[(rng.randrange(2000), rng.randrange(100, 1500))])
    check_against_model(n_qp, script.ops, out)


# ---------------------------------------------------------------- directed

def _wr(q, wr_id, first, npkts, *, signaled=1, opcode=0, length=None):
    return ("post", {"qp": q, "wr_id": wr_id, "opcode": opcode,
                     "length": npkts * 100 if length is None else length,
                     "signaled": signaled, "first_psn": first,
                     "last_psn": (first + npkts - 1) & MASK})


def _ev(q, kind, psn, code=0):
    return ("ev", {"qp": q, "kind": int(kind), "psn": psn & MASK, "code": code, "msn": 0})


def _done(q, wr_id, status=S.SUCCESS, opcode=proto.WcOpcode.RDMA_WRITE, byte_len=None):
    return {"qp": q, "wr_id": wr_id, "status": int(status), "opcode": int(opcode),
            "byte_len": byte_len}


def _strip(cq, keys=("qp", "wr_id", "status", "opcode")):
    return [{k: c[k] for k in keys} for c in cq]


@pytest.mark.parametrize("m_wrs", [1, 5, 12])
def test_one_ack_completes_m_wrs_in_order(m_wrs):
    """One ACK for N packets of M messages: M completions in posting order, one per cycle,
    the first 3 cycles after the event's transfer (the FIFO adds 2), WRs of the other QP
    untouched; the PSNs wrap in the middle."""
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


def test_unsignaled_complete_silently_and_partial_acks():
    """ACKs inside a WR complete nothing; unsignaled WRs complete without a report; a NAK
    PSN-sequence error completes the WRs before its PSN and asks for a replay there."""
    ops = [_wr(2, 1, 1000, 4), _wr(2, 2, 1004, 1, signaled=0), _wr(2, 3, 1005, 3),
           _wr(2, 4, 1008, 2, signaled=0), _wr(2, 5, 1010, 1),
           _ev(2, K.ACK, 1002),                       # inside WR 1: nothing
           _ev(2, K.ACK, 1004),                       # WR 1, WR 2 (silent)
           _ev(2, K.NAK_SEQ, 1008),                   # WR 3 (last 1007); replay 1008
           _ev(2, K.RNR, 1008, code=14),              # nothing; replay after RNR 14
           _ev(2, K.ACK, 1010)]                       # WR 4 (silent), WR 5
    out = run_bench(EngineConfig(data_width=64, n_qp=4), ops, seed=3)
    assert _strip(out["cq"], ("wr_id", "status")) == [
        {"wr_id": w, "status": 0} for w in (1, 3, 5)]
    assert out["replay"] == [{"qp": 2, "psn": 1008, "rnr": 0, "code": 0},
                             {"qp": 2, "psn": 1008, "rnr": 1, "code": 14}]
    assert out["qp_error"] == [] and out["stats"]["max_used"] <= 5


@pytest.mark.parametrize("code,status", [(1, S.REM_INV_REQ_ERR), (2, S.REM_ACCESS_ERR),
                                         (3, S.REM_OP_ERR)])
def test_fatal_nak_leaves_other_qps_alone(code, status):
    """A fatal NAK on QP 1: its WRs before the PSN complete SUCCESS (an unsignaled one
    silently), the WR holding the PSN fails with the NAK's status, every later one and every
    one posted after is flushed (signaled or not), its events are ignored; QPs 0 and 2 keep
    completing as if nothing happened. After a reset QP 1 works again."""
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
    assert out["replay"] == []
    check_against_model(4, ops, out)


def test_reset_flushes_the_list():
    """A reset flushes every WR kept (signaled or not) with WR_FLUSH_ERR, in order, and the QP
    starts clean; an RNR NAK or an ACK on an empty list does nothing."""
    ops = [_wr(3, 1, 10, 2), _wr(3, 2, 12, 2, signaled=0), _wr(3, 3, 14, 1),
           _ev(3, K.ACK, 11), ("reset", {"qp": 3}), ("reset", {"qp": 3}),
           _ev(3, K.ACK, 20), _ev(3, K.RNR, 5, code=3), _wr(3, 4, 500, 1),
           _ev(3, K.ACK, 500)]
    out = run_bench(EngineConfig(data_width=64, n_qp=4), ops, seed=9)
    assert [(c["wr_id"], c["status"]) for c in out["cq"]] == [
        (1, 0), (2, S.WR_FLUSH_ERR), (3, S.WR_FLUSH_ERR), (4, 0)]
    assert out["replay"] == [{"qp": 3, "psn": 5, "rnr": 1, "code": 3}]


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
                    p_idle=0, p_stall=0, stalls=[(0, 400)])
    st = out["stats"]
    assert st["max_used"] == n_desc and st["post_waits"] > 300
    assert [c["wr_id"] for c in out["cq"]] == list(range(30))
    assert out["cq_cycles"][0] > 400
    check_against_model(2, ops, out)


def test_events_flow_while_cq_stalls():
    """With ``cq`` not read, events keep being taken at their documented rate: 12 ACKs that
    complete 12 WRs already kept are all taken within the stall."""
    ops = [_wr(0, j, 10 * j, 10) for j in range(12)]
    ops += [_ev(0, K.ACK, 10 * j + 9) for j in range(12)]
    out = run_bench(EngineConfig(data_width=64, n_qp=2), ops, seed=5, p_idle=0, p_stall=0,
                    stalls=[(0, 300)])
    assert [c["wr_id"] for c in out["cq"]] == list(range(12))
    assert out["cq_cycles"][0] > 300
    # every event was taken before the stall ended
    assert max(out["stats"]["other_cycles"]) < 300


def test_rates_and_turns():
    """The documented rates: a WR taken every 2 cycles; an event 4 cycles plus 1 per WR it
    completes (3 + M when it empties the list), an RNR 3, a CNP 2; the first completion on
    ``cq`` 6 cycles after its event, then one per cycle; with WRs and events both waiting
    they are taken in turn."""
    ops = [_wr(0, j, 10 * j, 10) for j in range(20)]
    ops += [_ev(0, K.ACK, 10 * j + 9) for j in range(3)]         # 1 WR each
    ops += [_ev(0, K.ACK, 35 + j) for j in range(3)]             # none
    ops += [_ev(0, K.ACK, 199)]                                  # the other 17
    ops += [_ev(0, K.RNR, 300), _ev(0, K.CNP, 0), _ev(0, K.CNP, 0), _ev(0, K.NAK_SEQ, 300)]
    ops += [("reset", {"qp": 3})]             # (the WRs below wait for it: the bench's rule)
    ops += [_ev(1, K.RNR, 1, code=j) for j in range(6)]          # with the WRs below
    ops += [_wr(2, 100 + j, 1000 + j, 1) for j in range(6)]
    out = run_bench(EngineConfig(data_width=64, n_qp=4), ops, p_idle=0, p_stall=0)
    st = out["stats"]
    pc, oc = st["post_cycles"], st["other_cycles"]
    assert [b - a for a, b in zip(pc[:20], pc[1:20])] == [2] * 19
    assert [b - a for a, b in zip(oc, oc[1:11])] == [5, 5, 5, 4, 4, 4, 3 + 17, 3, 2, 2]
    assert out["cq_cycles"][0] - oc[0] == 6
    assert out["cq_cycles"][3:20] == list(range(out["cq_cycles"][3], out["cq_cycles"][3] + 17))
    # the last 6 events (RNR) and 6 WRs alternate: an event, then a WR, ...
    turns = sorted([(c, "ev") for c in oc[12:]] + [(c, "wr") for c in pc[20:]])
    assert [w for _, w in turns] == ["ev", "wr"] * 6 or [w for _, w in turns] == \
        ["wr", "ev"] * 6
    assert len(out["replay"]) == 8


# ---------------------------------------------------------------- the model alone

def test_model_rules():
    m = CompleterModel(4)
    m.post(0, 1, proto.WrOpcode.SEND_WITH_IMM, 10, 1, 5, 7)
    m.post(0, 2, proto.WrOpcode.RDMA_WRITE_WITH_IMM, 0, 1, 8, 8)
    m.post(0, 3, proto.WrOpcode.RDMA_READ, 20, 0, 9, 9)
    m.event(0, K.ACK, 6)
    assert m.completions == []
    m.event(0, K.NAK_SEQ, 8)
    assert [c["wr_id"] for c in m.completions] == [1]
    assert m.completions[0]["opcode"] == proto.WcOpcode.SEND
    assert m.replays == [{"qp": 0, "psn": 8, "rnr": 0, "code": 0}]
    m.event(0, K.FATAL, 9, code=2)
    assert [(c["wr_id"], c["status"], c["opcode"]) for c in m.completions[1:]] == [
        (2, S.SUCCESS, proto.WcOpcode.RDMA_WRITE), (3, S.REM_ACCESS_ERR,
                                                    proto.WcOpcode.RDMA_READ)]
    assert m.qp_errors == [{"qp": 0, "status": S.REM_ACCESS_ERR}] and m.in_error(0)
    m.post(0, 4, 0, 0, 0, 10, 10)
    assert m.completions[-1]["status"] == S.WR_FLUSH_ERR
    m.reset(0)
    assert not m.in_error(0) and m.outstanding(0) == []


def test_bad_parameters():
    with pytest.raises(ValueError, match="n_desc"):
        Completer(EngineConfig(data_width=64), n_desc=100)
    with pytest.raises(ValueError, match="n_desc"):
        Completer(EngineConfig(data_width=64), n_desc=1)
    with pytest.raises(ValueError, match="aux_depth"):
        Completer(EngineConfig(data_width=64), aux_depth=1)
    with pytest.raises(TypeError):
        Completer(64)
