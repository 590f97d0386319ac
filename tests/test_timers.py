# SPDX-License-Identifier: BSD-2-Clause
"""Retransmission timers against their model (random input streams with pause, several clock
rates), the rules on directed sequences checked against results written out here, the timing
bounds at the edges (timeout 31 and the 34-bit wrap by setting the tick count, the 655.36 ms
RNR code 0, the real tick at 250 and 100 MHz), 4096 QPs with few armed, throughput, and a fire
not taken for a long time."""

import math
import random
from fractions import Fraction

import pytest

from roce_hw import proto
from roce_hw.config import EngineConfig
from roce_hw.ctrl.timers import (MIN_CLOCK_HZ, RetxTimers, rnr_ticks, tick_period,
                                 TIMER_COUNTERS)
from roce_hw.model.timers import TimerError, TimersModel
from sim.harness import run_simulation

__all__ = []

K = proto.TimerKind
SLOW_HZ = 244_141          # a tick of 1.0000015 cycles: the shortest timers
STREAMS = ("setup", "arm", "rnr")


# ---------------------------------------------------------------- the bench

class Bench:
    """Drives ``setup``/``arm``/``rnr`` from per-stream queues of ``(cycle, payload)`` (each
    presented from its cycle on, in order), ``pause`` and ``fire.ready`` from functions of the
    cycle; records the transfers: ``accepted`` ``[(cycle, stream, payload)]``, ``fires``
    ``[(cycle, qp, kind)]``, and ``wait`` the longest an input waited for ``ready``."""

    def __init__(self, dut, *, cycles, pause=None, ready=None, pokes=None, stop=None):
        self.dut = dut
        self.cycles = cycles
        self.queues = {s: [] for s in STREAMS}
        self.pause = pause or (lambda c: 0)
        self.ready = ready or (lambda c: 1)
        self.pokes = pokes or {}         # cycle -> f(ctx)
        self.stop = stop
        self.accepted = []
        self.fires = []
        self.wait = 0
        self.counters = None

    def put(self, stream, cycle, **payload):
        self.queues[stream].append((cycle, payload))

    async def tb(self, ctx):
        dut = self.dut
        ports = {s: getattr(dut, s) for s in STREAMS}
        for q in self.queues.values():
            q.sort(key=lambda e: e[0])
        pos = {s: 0 for s in STREAMS}
        since = {s: None for s in STREAMS}
        for c in range(self.cycles):
            if c in self.pokes:
                await self.pokes[c](ctx)
            for s, port in ports.items():
                q = self.queues[s]
                on = pos[s] < len(q) and q[pos[s]][0] <= c
                if on:
                    ctx.set(port.payload, q[pos[s]][1])
                    if since[s] is None:
                        since[s] = c
                ctx.set(port.valid, on)
            ctx.set(dut.pause, self.pause(c))
            ctx.set(dut.fire.ready, self.ready(c))
            _, _, sr, ar, rr, fv, fr, fp = await ctx.tick().sample(
                dut.setup.ready, dut.arm.ready, dut.rnr.ready, dut.fire.valid, dut.fire.ready,
                dut.fire.payload)
            for s, rdy in zip(STREAMS, (sr, ar, rr)):
                q = self.queues[s]
                if pos[s] < len(q) and q[pos[s]][0] <= c and rdy:
                    self.accepted.append((c, s, q[pos[s]][1]))
                    self.wait = max(self.wait, c - since[s])
                    since[s] = None
                    pos[s] += 1
            if fv and fr:
                self.fires.append((c, fp.qp, K(fp.kind)))
            if self.stop is not None and self.stop(self, c):
                break
        self.counters = {n: ctx.get(getattr(dut.counters, n)) for n in TIMER_COUNTERS}
        for s in STREAMS:
            ctx.set(ports[s].valid, 0)

    def run(self):
        run_simulation(self.dut, [self.tb], cycles=self.cycles + 300)
        return self


def check_with_model(bench, model):
    """Replay the hardware's run into ``model`` in the hardware's order (an input acts two cycles
    after it is taken, a fire is decided the cycle before it is valid; ``fire.ready``
    was high throughout): every fire must be due and of the kind the rules give, and no timer
    may be left beyond its latest. Returns the largest lateness seen, in cycles."""
    events = []
    for c, s, p in bench.accepted:
        events.append((c + 2, 0, s, p))
    for c, qp, kind in bench.fires:
        events.append((c - 1, 1, qp, kind))
    last = 0
    for c in range(bench.cycles):        # pause changes
        v = bench.pause(c)
        if c == 0 or v != last:
            events.append((c, -1, "pause", v))
            last = v
    events.sort(key=lambda e: (e[0], e[1]))
    own = {}                             # cycle -> fire decided by an input in that cycle
    worst = 0
    for c, order, a, b in events:
        if order == -1:
            model.pause(c, b)
            continue
        model.check(c)
        if order == 0:
            if a == "setup":
                model.setup(c, b["qp"], b["timeout"], b["retry_cnt"], b["rnr_retry"])
            elif a == "arm":
                model.arm(c, b["qp"], b["outstanding"], b["progress"])
            else:
                kind = model.rnr(c, b["qp"], b["code"])
                if kind is not None:
                    own[c] = (b["qp"], kind)
        else:
            if c in own:
                assert own.pop(c) == (a, b), f"cycle {c}: fire {a} {b.name}"
                continue
            t = model.timer(a)
            kind = model.fire(c, a)
            assert kind == b, f"cycle {c}: QP {a} fired {b.name}, the rules say {kind.name}"
            worst = max(worst, float(model._u - t[1]))
    assert not own, f"fires the rules decided and the hardware did not: {own}"
    model.check(max(model._cycle, bench.cycles - 2))
    return worst


def random_script(bench, rng, n_qp, cycles, *, p_in=0.15, timeouts=range(1, 6),
                  codes=range(1, 8)):
    """Random inputs: every QP set up first, then arms (mostly outstanding, some progress),
    RNR NAKs and now and then a new setup, at random cycles."""
    c = 0
    for qp in range(n_qp):
        bench.put("setup", c, qp=qp, timeout=rng.choice(timeouts), retry_cnt=rng.randrange(8),
                  rnr_retry=rng.randrange(8))
        c += 1
    for s in STREAMS:
        t = c
        while True:
            t += 1 + int(rng.expovariate(p_in / 3))
            if t >= cycles - 50:
                break
            qp = rng.randrange(n_qp)
            if s == "setup":
                if rng.random() < 0.2:
                    bench.put(s, t, qp=qp, timeout=rng.choice(list(timeouts) + [0]),
                              retry_cnt=rng.randrange(8), rnr_retry=rng.randrange(8))
            elif s == "arm":
                bench.put(s, t, qp=qp, outstanding=int(rng.random() < 0.85),
                          progress=int(rng.random() < 0.3))
            else:
                if rng.random() < 0.4:
                    bench.put(s, t, qp=qp, code=rng.choice(codes))


def make(n_qp, clock_hz=SLOW_HZ):
    return RetxTimers(EngineConfig(n_qp=n_qp), clock_hz=clock_hz)


def slack(dut):
    # the documented bound: fire.valid by start + (K + 1) ticks + n_qp + 10, so decided a
    # cycle before that
    return dut._config.n_qp + 9


# ---------------------------------------------------------------- the tick

def test_tick_period():
    assert tick_period(250_000_000) == 1024
    assert tick_period(156_250_000) == 640
    assert tick_period(322_265_625) == 1320
    p = tick_period(100_000_000)              # 409.6 cycles: rounded up, by < 2**-36
    assert Fraction(2048, 5) <= p < Fraction(2048, 5) + Fraction(1, 2**36)
    for bad in (0, -5, 1.5e8, True, "100e6", 1000, MIN_CLOCK_HZ - 1, 5 * 10**9):
        with pytest.raises(ValueError, match="clock_hz"):
            RetxTimers(EngineConfig(n_qp=4), clock_hz=bad)
    assert tick_period(MIN_CLOCK_HZ) >= 1
    # RNR ticks: the microseconds rounded up to 4.096 us
    assert rnr_ticks(1) == 3 and rnr_ticks(0) == 160000 and rnr_ticks(12) == 157
    for code in range(32):
        assert rnr_ticks(code) * 4096 >= proto.RNR_TIMER_US[code] * 1000 > \
            (rnr_ticks(code) - 1) * 4096


@pytest.mark.parametrize("clock_hz", [250_000_000, 100_000_000])
def test_real_tick(clock_hz):
    """The tick derived from real clocks: timeout 1 (8.192 us) and 2 on two QPs, RNR code 1
    (10 us) on a third, each fires between its exact length and the bound."""
    dut = make(4, clock_hz)
    b = Bench(dut, cycles=int(5 * 4.096e-6 * clock_hz) + 200)
    b.put("setup", 0, qp=0, timeout=1, retry_cnt=0, rnr_retry=0)
    b.put("setup", 1, qp=1, timeout=2, retry_cnt=1, rnr_retry=0)
    b.put("setup", 2, qp=2, timeout=0, retry_cnt=0, rnr_retry=1)
    b.put("arm", 3, qp=0, outstanding=1, progress=0)
    b.put("arm", 17, qp=1, outstanding=1, progress=0)
    b.put("rnr", 40, qp=2, code=1)
    b.run()
    got = {qp: (c, k) for c, qp, k in b.fires}
    p = Fraction(proto.TIMER_TICK_NS * clock_hz, 10**9)
    start = {qp: c + 2 for c, s, pl in b.accepted if s != "setup" for qp in [pl["qp"]]}
    for qp, ticks, d, kind in ((0, 2, 2 * p, K.RETRY_EXC), (1, 4, 4 * p, K.TIMEOUT),
                               (2, 3, Fraction(10 * clock_hz, 10**6), K.RNR_DONE)):
        c, k = got[qp]
        assert k == kind
        assert start[qp] + d < c <= start[qp] + math.ceil((ticks + 1) * p) + 4 + 10, (qp, c)
    assert len(b.fires) == 3


# ---------------------------------------------------------------- against the model

@pytest.mark.parametrize("n_qp,clock_hz,seed", [
    (5, SLOW_HZ, 1), (4, SLOW_HZ, 2), (1, SLOW_HZ, 3), (16, 1_000_000, 4), (3, 750_000, 5)])
def test_random_against_model(n_qp, clock_hz, seed):
    """Random setups, arms and RNR NAKs on a few QPs with pause toggling: the hardware's fires
    are the rules' (kind, QP, order), never early, never beyond the bound."""
    rng = random.Random(seed)
    cycles = 6000
    dut = make(n_qp, clock_hz)
    pauses = sorted(rng.sample(range(cycles), 40))

    def pause(c):
        # high in every other interval between the random change points
        k = sum(1 for p in pauses if p <= c)
        return k % 2

    b = Bench(dut, cycles=cycles, pause=pause)
    scale = float(Fraction(proto.TIMER_TICK_NS * clock_hz, 10**9))
    random_script(b, rng, n_qp, cycles, p_in=min(0.3, 0.5 / scale))
    b.run()
    kinds = {k: sum(1 for f in b.fires if f[2] == k) for k in K}
    model = TimersModel(n_qp, clock_hz, slack=slack(dut))
    worst = check_with_model(b, model)
    assert all(kinds.values()), kinds          # the run exercised every kind
    assert worst >= 0


def test_model_catches_early_and_late():
    """The checker itself: an early fire, a late one and a wrong kind are errors."""
    m = TimersModel(2, SLOW_HZ, slack=3)
    m.setup(0, 0, 2, 1, 0)
    m.arm(1, 0, 1, 0)
    with pytest.raises(TimerError, match="early"):
        m.fire(4, 0)
    m2 = TimersModel(2, SLOW_HZ, slack=3)
    m2.setup(0, 0, 2, 1, 0)
    m2.arm(1, 0, 1, 0)
    with pytest.raises(TimerError, match="late"):
        m2.check(1 + 5 + 3 + 2)
    m2 = TimersModel(2, SLOW_HZ, slack=3)
    m2.setup(0, 0, 2, 1, 0)
    m2.arm(1, 0, 1, 0)
    m2.check(9)
    assert m2.fire(6 + 3, 0) == K.TIMEOUT
    assert m2.fire(14, 0) == K.RETRY_EXC
    with pytest.raises(TimerError, match="no timer"):
        m2.fire(30, 0)


# ---------------------------------------------------------------- the rules, directed

def _fire_kinds(b, qp):
    return [k for _, q, k in b.fires if q == qp]


def test_rules_directed():
    """Each rule on its own QP (slow-clock ticks of one cycle), with the outcome written out:

    QP 0 retry_cnt 0: the first timeout is RETRY_EXC, then arms are ignored.
    QP 1 retry_cnt 7: seven TIMEOUTs, then RETRY_EXC (7 is not infinite).
    QP 2 rnr_retry 0: the first RNR NAK is RNR_RETRY_EXC at once.
    QP 3 rnr_retry 7: RNR NAKs never run out; each wait ends in RNR_DONE, and an arm
         (progress) in the middle of a wait does not cut it short; a repeat is ignored.
    QP 4 timeout 0: no ACK timer at all; an RNR wait still works.
    QP 5 retry_cnt 2, progress before the count runs out refills it: 2 + 2 TIMEOUTs, then
         RETRY_EXC.
    QP 6 outstanding 0 stops the timer: nothing fires.
    QP 7 arms without progress while the timer runs leave the deadline alone: it fires at
         2**3 ticks after the first arm although arms keep coming.
    QP 8 the ACK timer runs again after an RNR wait: RNR_DONE, TIMEOUT, RETRY_EXC.
    """
    dut = make(9)
    b = Bench(dut, cycles=2600)
    for qp, t, rc, rr in ((0, 2, 0, 0), (1, 2, 7, 0), (2, 2, 0, 0), (3, 0, 0, 7), (4, 0, 0, 2),
                          (5, 7, 2, 0), (6, 2, 0, 0), (7, 3, 0, 0), (8, 3, 1, 1)):
        b.put("setup", qp, qp=qp, timeout=t, retry_cnt=rc, rnr_retry=rr)
    for qp in (0, 1, 5, 6, 7):
        b.put("arm", 20 + qp, qp=qp, outstanding=1, progress=0)
    b.put("arm", 200, qp=0, outstanding=1, progress=1)         # ignored: QP 0 failed
    b.put("arm", 28, qp=6, outstanding=0, progress=1)
    for k in range(10):
        b.put("arm", 30 + k, qp=7, outstanding=1, progress=0)
    b.put("rnr", 30, qp=2, code=1)
    # QP 3: waits of code 9 (240 us = 59 ticks); an arm with progress at +20 and a repeated
    # NAK at +30 change nothing
    for k in range(3):
        b.put("rnr", 100 + 300 * k, qp=3, code=9)
        b.put("arm", 120 + 300 * k, qp=3, outstanding=1, progress=1)
    b.put("rnr", 130, qp=3, code=9)
    b.put("rnr", 50, qp=4, code=2)
    b.put("arm", 20, qp=8, outstanding=1, progress=0)
    b.put("rnr", 22, qp=8, code=1)
    # QP 5: timeouts of 128 ticks, one every 135 cycles (from about 155 on): progress
    # between the second and the third
    b.put("arm", 360, qp=5, outstanding=1, progress=1)
    b.run()
    assert _fire_kinds(b, 0) == [K.RETRY_EXC]
    assert _fire_kinds(b, 1) == [K.TIMEOUT] * 7 + [K.RETRY_EXC]
    assert _fire_kinds(b, 2) == [K.RNR_RETRY_EXC]
    rnr2 = [c for c, q, k in b.fires if q == 2]
    acc = [c for c, s, p in b.accepted if s == "rnr" and p["qp"] == 2]
    assert rnr2[0] == acc[0] + dut.input_latency
    f3 = [(c, k) for c, q, k in b.fires if q == 3]
    assert [k for _, k in f3] == [K.RNR_DONE] * 3
    starts = [c for c, s, p in b.accepted if s == "rnr" and p["qp"] == 3 and c != 130]
    for (c, _), s in zip(f3, starts):
        assert s + 1 + 240 * SLOW_HZ / 1e6 < c <= s + 1 + 60 + 16, (c, s)
    assert _fire_kinds(b, 8) == [K.RNR_DONE, K.TIMEOUT, K.RETRY_EXC]
    assert _fire_kinds(b, 4) == [K.RNR_DONE]
    assert _fire_kinds(b, 5) == [K.TIMEOUT] * 4 + [K.RETRY_EXC]
    assert _fire_kinds(b, 6) == []
    f7 = [c for c, q, k in b.fires if q == 7]
    assert f7 and f7[0] <= 20 + 7 + 1 + 9 + 8 + 9
    assert b.counters["rnr_repeat"] == 1
    assert b.counters["dead_input"] >= 1
    assert b.counters["retry_exc"] == sum(1 for f in b.fires if f[2] == K.RETRY_EXC)


def test_bad_qp_dropped():
    dut = make(5)
    b = Bench(dut, cycles=200)
    b.put("setup", 0, qp=6, timeout=1, retry_cnt=0, rnr_retry=0)
    b.put("arm", 1, qp=7, outstanding=1, progress=0)
    b.put("rnr", 2, qp=5, code=1)
    b.run()
    assert len(b.accepted) == 3 and b.fires == []
    assert b.counters["bad_qp"] == 3


# ---------------------------------------------------------------- edges of the timing

def _set_now(ctx, dut, value):
    value %= 1 << 34
    ctx.set(dut._probe["now"], value)
    for lo, f in dut._probe["now_flags"].items():
        ctx.set(f, (value & ((1 << lo) - 1)) == (1 << lo) - 1)


def _jump(bench, dut, qp, base, before):
    """Pokes: the tick count set to ``base`` in cycle 0; QP ``qp``'s start read from the sweep
    in cycles 50-65; the count set ``before`` ticks short of ``start + offset`` in cycle 100,
    ``offset`` given later as ``bench.offset``."""
    seen = {}

    async def at0(ctx):
        _set_now(ctx, dut, base)

    async def look(ctx):
        if ctx.get(dut._probe["s3_qp"]) == qp:
            seen["start"] = ctx.get(dut._probe["s3"]).start

    async def at100(ctx):
        _set_now(ctx, dut, seen["start"] + bench.offset - before)

    bench.pokes = {0: at0, 100: at100, **{c: look for c in range(50, 66)}}
    return seen


@pytest.mark.parametrize("base", [123, (1 << 34) - (1 << 31) - 3])
def test_timeout_31(base):
    """timeout 31 (2**31 ticks, 2.4 hours): the tick count is set forward to one tick short of
    the end (start + 2**31 + 1) and frozen there (``pause``) for 100 cycles: no fire, the
    sweep passes the row 33 times; once the tick moves the fire comes after the sweep and
    the pipeline. The second case ends a tick after the 34-bit count wraps."""
    dut = make(3)
    b = Bench(dut, cycles=400, pause=lambda c: 100 <= c < 200)
    b.put("setup", 0, qp=1, timeout=31, retry_cnt=1, rnr_retry=0)
    b.put("arm", 1, qp=1, outstanding=1, progress=0)
    b.offset = (1 << 31) + 1
    seen = _jump(b, dut, 1, base, 1)
    b.run()
    assert base <= seen["start"] <= base + 3
    assert [k for _, _, k in b.fires] == [K.TIMEOUT]
    c = b.fires[0][0]
    # the last tick at most 2 cycles after cycle 200, then the sweep (3 rows), the pipeline
    assert 200 + dut.sweep_latency <= c <= 200 + 2 + 3 + dut.sweep_latency, c


def test_rnr_code0_jump():
    """The 655.36 ms RNR wait (160000 ticks) with the tick count set forward to one tick short
    of its end and frozen there for 100 cycles: the fire comes after the last tick."""
    dut = make(2)
    b = Bench(dut, cycles=300, pause=lambda c: 100 <= c < 200)
    b.put("setup", 0, qp=0, timeout=0, retry_cnt=0, rnr_retry=1)
    b.put("rnr", 1, qp=0, code=0)
    b.offset = 160000 + 1
    _jump(b, dut, 0, 1000, 1)
    b.run()
    assert [k for _, _, k in b.fires] == [K.RNR_DONE]
    assert 200 + dut.sweep_latency <= b.fires[0][0] <= 200 + 2 + 2 + dut.sweep_latency


@pytest.mark.slow
def test_rnr_code0_full():
    """The 655.36 ms RNR wait (160000 ticks) simulated in full at one cycle a tick."""
    dut = make(2)
    b = Bench(dut, cycles=160_200)
    b.put("setup", 0, qp=0, timeout=0, retry_cnt=0, rnr_retry=1)
    b.put("rnr", 1, qp=0, code=0)
    b.run()
    assert [k for _, _, k in b.fires] == [K.RNR_DONE]
    d = Fraction(655360 * SLOW_HZ, 10**6)
    start = 1 + 2                          # the rnr taken in cycle 1 acts in cycle 3
    assert start + d < b.fires[0][0] <= \
        start + math.ceil(160001 * tick_period(SLOW_HZ)) + 2 + dut.sweep_latency


def test_pause_freezes():
    """A timer of 2**5 ticks with pause high for 1000 cycles in the middle fires 1000 cycles
    later than without."""
    fires = []
    for paused in (False, True):
        dut = make(2)
        b = Bench(dut, cycles=1300,
                  pause=(lambda c: 20 <= c < 1020) if paused else None)
        b.put("setup", 0, qp=0, timeout=5, retry_cnt=1, rnr_retry=0)
        b.put("arm", 1, qp=0, outstanding=1, progress=0)
        b.run()
        fires.append(b.fires[0][0])
    assert fires[1] - fires[0] == 1000


# ---------------------------------------------------------------- scale, throughput, stalls

@pytest.mark.slow
def test_4096_qps_few_armed():
    """4096 QPs, five armed (timeouts of 2**11-2**13 ticks, some RNR): every fire within the
    bound of one 4096-cycle sweep, checked with the model."""
    rng = random.Random(7)
    dut = make(4096)
    b = Bench(dut, cycles=40_000)
    qps = rng.sample(range(4096), 5)
    for k, qp in enumerate(qps):
        b.put("setup", k, qp=qp, timeout=11 + k % 3, retry_cnt=2, rnr_retry=1)
        b.put("arm", 10 + k, qp=qp, outstanding=1, progress=0)
    b.put("rnr", 3000, qp=qps[0], code=14)     # 1.28 ms = 313 ticks
    b.run()
    model = TimersModel(4096, SLOW_HZ, slack=slack(dut))
    check_with_model(b, model)
    assert len(b.fires) >= 8


def test_inputs_every_cycle():
    """With the sweep running and nothing expiring, an input is taken every cycle."""
    dut = make(16)
    b = Bench(dut, cycles=600)
    for qp in range(16):
        b.put("setup", 0, qp=qp, timeout=20, retry_cnt=3, rnr_retry=3)
    for c in range(16, 500):
        b.put("arm", 0, qp=c % 16, outstanding=1, progress=c % 3 == 0)
    b.run()
    acc = [c for c, _, _ in b.accepted]
    assert acc == list(range(len(acc))) and len(acc) == 16 + 484


def test_fire_not_taken():
    """``fire.ready`` low for 20000 cycles while 12 QPs time out (retry_cnt 1: TIMEOUT, then
    after delivery RETRY_EXC): inputs keep being taken at once, no fire is lost or doubled
    once ``ready`` is back, and the counters agree."""
    n = 12
    dut = make(n)
    b = Bench(dut, cycles=23_000, ready=lambda c: c >= 20_000 and c % 3 != 0)
    for qp in range(n):
        b.put("setup", qp, qp=qp, timeout=3, retry_cnt=1, rnr_retry=0)
        b.put("arm", 20 + qp, qp=qp, outstanding=1, progress=0)
    # a steady stream of arms (no progress) on other... the same QPs: taken at once
    for c in range(100, 19_000, 7):
        b.put("arm", c, qp=c % n, outstanding=1, progress=0)
    b.run()
    assert b.wait <= 8, b.wait
    per = {qp: _fire_kinds(b, qp) for qp in range(n)}
    assert all(v == [K.TIMEOUT, K.RETRY_EXC] for v in per.values()), per
    assert all(c >= 20_000 for c, _, _ in b.fires)
    assert b.counters["timeout"] == n and b.counters["retry_exc"] == n
