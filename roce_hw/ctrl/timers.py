# SPDX-License-Identifier: BSD-2-Clause
"""The retransmission timers: every QP's local ACK timer and RNR wait, one RAM row per QP,
swept one row per cycle against a coarse 4.096 us tick."""

import math
from fractions import Fraction

from amaranth import *
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import proto
from ..config import check_config
from ..layouts import (qp_index_width, timer_arm_layout, timer_fire_layout, timer_rnr_layout,
                       timer_setup_layout)
from ..lib.arith import FastCounter, event_counter, or_tree

__all__ = ["TIMER_COUNTERS", "timer_counters_layout", "tick_period", "rnr_ticks",
           "RetxTimers"]

#: Bits of the tick count and of the timer start stamps: a wait spans at most 2**31 + 1
#: ticks (``timeout`` 31), so the elapsed time of a running timer, modulo 2**34, is never
#: read as negative (about 9.8 hours of ticks of headroom for a fire held back by ``fire``).
NOW_BITS = 34
#: Fraction bits of the tick period (rounded up: the tick is never short; the rounding adds
#: less than 2**-36 cycles per tick, under a cycle over the longest timeout).
_FRAC_BITS = 36
_CHUNK = 12
#: The slowest clock: one tick must last at least a cycle.
MIN_CLOCK_HZ = -(-10**9 // proto.TIMER_TICK_NS)
MAX_CLOCK_HZ = 4 * 10**9

#: The timers' counters, in :func:`timer_counters_layout` order: fires taken on ``fire`` by
#: :class:`~roce_hw.proto.TimerKind`, inputs naming a QP index beyond ``n_qp`` (dropped), RNR
#: NAKs during an RNR wait (a repeat: ignored), ``arm``/``rnr`` for a QP whose retries ran out
#: (ignored until its next ``setup``).
TIMER_COUNTERS = ("timeout", "rnr_done", "retry_exc", "rnr_retry_exc", "bad_qp", "rnr_repeat",
                  "dead_input")

_KIND_COUNTER = {proto.TimerKind.TIMEOUT: "timeout", proto.TimerKind.RNR_DONE: "rnr_done",
                 proto.TimerKind.RETRY_EXC: "retry_exc",
                 proto.TimerKind.RNR_RETRY_EXC: "rnr_retry_exc"}


def timer_counters_layout():
    """The timers' 32-bit wrapping counters, one per name of :data:`TIMER_COUNTERS`."""
    return data.StructLayout({name: 32 for name in TIMER_COUNTERS})


def tick_period(clock_hz):
    """The tick of :class:`RetxTimers` at ``clock_hz``, in cycles: 4.096 us rounded up to
    ``2**-36`` cycle, as a ``Fraction`` (exact when 4.096 us is a multiple of that).

    Raises ``ValueError`` unless ``clock_hz`` is an integer from :data:`MIN_CLOCK_HZ`
    (a tick of at least one cycle) to :data:`MAX_CLOCK_HZ`."""
    if isinstance(clock_hz, bool) or not isinstance(clock_hz, int):
        raise ValueError(f"clock_hz must be an integer number of hertz, not {clock_hz!r}")
    if not MIN_CLOCK_HZ <= clock_hz <= MAX_CLOCK_HZ:
        raise ValueError(f"clock_hz = {clock_hz} is out of range: the timers need "
                         f"{MIN_CLOCK_HZ} Hz (a 4.096 us tick of at least one cycle) to "
                         f"{MAX_CLOCK_HZ} Hz")
    exact = Fraction(proto.TIMER_TICK_NS * clock_hz, 10**9)
    return Fraction(math.ceil(exact * 2**_FRAC_BITS), 2**_FRAC_BITS)


def rnr_ticks(code):
    """Ticks of the RNR wait of timer ``code``: :data:`~roce_hw.proto.RNR_TIMER_US` rounded up
    to whole 4.096 us ticks (independent of the clock)."""
    return math.ceil(Fraction(proto.RNR_TIMER_US[code] * 1000, proto.TIMER_TICK_NS))


# One QP's row, in two RAMs: the read-modify-write stage's (``_ROW``) and the sweep's
# (``_VIEW``), each with one read port (a RAM with two read ports is two RAMs). ``start``: the
# tick count when the running timer (ACK timer or RNR wait) started, and ``rnr_code``, are read
# by the sweep only (written with each start); ``seq`` changes with every start or stop, so the
# sweep's view of a row (read a few cycles before it acts) is known to be stale; ``pend`` a
# fire decided while ``fire`` was full. The view's first 13-bit piece is written with every
# write of the row, its last three (start and code) only when a timer starts.
_ROW = data.StructLayout({
    "timeout": 5, "retry_cnt": 3, "rnr_retry": 3, "retry_left": 3, "rnr_left": 3,
    "out": 1, "ack_run": 1, "rnr_wait": 1, "pend": 1, "pend_kind": 2, "dead": 1, "seq": 3,
})
_VIEW_FLAGS = ("timeout", "ack_run", "rnr_wait", "pend", "dead", "seq")
_VIEW = data.StructLayout({
    **{name: _ROW.members[name] for name in _VIEW_FLAGS}, "pad": 1,
    "start": NOW_BITS, "rnr_code": 5,
})
_VIEW_PIECE = 13
assert _VIEW.size == 4 * _VIEW_PIECE and _VIEW["start"].offset == _VIEW_PIECE

_SETUP, _ARM, _RNR, _SWEEP = range(4)
_INFINITE_RNR = 7


def _step(x, down=False):
    """``x + 1`` (``x - 1`` when ``down``) modulo ``2**len(x)`` as gates: an adder would be a
    carry chain, two cells where the read-modify-write stage has none to spare."""
    return Cat(x[i] ^ (~x[:i] if down else x[:i]).all() if i else ~x[0]
               for i in range(len(x)))


class RetxTimers(wiring.Component):
    """Per-QP local ACK timers and RNR waits for the requester's retransmission (the rules of
    ``docs/reliability.md``; model: :class:`roce_hw.model.timers.TimersModel`).

    Time is counted in ticks of 4.096 us (:func:`tick_period`: rounded up to 2**-36 cycle at
    ``clock_hz``; the ticks are spread exactly over the cycles, none shorter than the rounded
    period on average, a ``2**-36``-cycle accumulator deciding which are a cycle longer).
    ``pause`` high freezes the tick: no timer comes closer while it is high. A QP's row holds
    the tick count when its running timer started; a timer of ``K`` ticks is over once the
    count is ``K + 1`` past its start: the ACK timer ``K`` = ``2**timeout`` (``timeout`` 0: no
    ACK timer), the RNR wait ``K`` = :func:`rnr_ticks` ``(code)`` (its microseconds rounded up
    to ticks).

    Rules, per QP, in the order the inputs and the sweep reach the row:

    * ``setup``: the row starts afresh with the QP's ``timeout``, ``retry_cnt`` and
      ``rnr_retry`` (both retry counts full), nothing running, nothing pending (a fire the
      consumer had not yet taken for the old connection is dropped);
    * ``arm``: ``progress`` refills both retry counts; ``outstanding`` 0 stops the ACK timer;
      ``outstanding`` 1 starts it (again) when ``progress``, or when it is stopped and no fire
      for it is waiting; else an arm leaves the deadline alone. No arm touches an RNR wait:
      the ACK timer starts when the wait is over, if the QP still has something outstanding;
    * ``rnr``: during an RNR wait, a repeat, ignored (``rnr_repeat``); with no RNR retry left
      (``rnr_retry`` 7 is infinite) RNR_RETRY_EXC; else an RNR retry is counted and the wait
      starts, the ACK timer stopped;
    * the ACK timer over: TIMEOUT, a retry counted and the timer started again, or RETRY_EXC
      when ``retry_cnt`` retries were used (``retry_cnt`` 0: the first timeout; 7 is seven
      retries, not infinite);
    * the RNR wait over: RNR_DONE, then the ACK timer runs again (``outstanding``, ``timeout``
      not 0);
    * after RETRY_EXC or RNR_RETRY_EXC the QP's timers stop and its ``arm``/``rnr`` are
      ignored (``dead_input``) until its next ``setup``.

    Timing. Let a timer start at cycle ``c`` (the cycle after its input was taken; for a
    restart, the cycle its fire was put on ``fire``) and ``D`` be its length in cycles (4.096
    us * 2**timeout or the RNR microseconds, times ``clock_hz``), counting cycles without
    ``pause`` only. Its fire is never decided before ``c + D``: ``fire.valid`` rises after
    ``c + D + 1``. With ``fire.ready`` high it rises by
    ``c + (K + 1) * P + n_qp + 10`` (:meth:`latest`; ``P`` the tick period): late by at most
    one tick (the start is anywhere in a tick), the rounding of an RNR wait up to ticks, one
    sweep (``n_qp`` cycles), and the pipeline.

    Latency: an input taken in cycle t is written into its row in cycle t + 2 (a RNR_RETRY_EXC
    it decides is valid on ``fire`` in cycle t + 3, :attr:`input_latency`); a row read by the
    sweep in cycle t fires in cycle t + 8 (:attr:`sweep_latency`).
    Throughput: the sweep reads one row per cycle, all the time; an input is taken every cycle
    but those in which the sweep acts on a row (an expiry, or a held fire to deliver): ``setup``
    before ``rnr`` before ``arm``. A row is kept in two RAMs, each with one write and one read
    port: the sweep's view (the start tick, the RNR code, the flags it reads) and the
    read-modify-write stage's row. The inputs and the sweep's acts share that stage, which reads
    the row again (transparently, and with the row the request just ahead writes forwarded into
    its register), so nothing is ever written from a stale row; the sweep's earlier read only
    says that the row may need it, and ``seq`` tells whether its timer was restarted or stopped
    meanwhile.
    Backpressure: a fire decided while ``fire`` holds one not taken is kept in its QP's row
    (``pend``) and put on ``fire`` by a later sweep, only when ``fire`` is free (so a stalled
    consumer does not take input slots); the QP's ACK timer does not run meanwhile (it starts
    when the fire goes out). A row holds one waiting fire: a RNR_RETRY_EXC replaces a waiting
    TIMEOUT or RNR_DONE (the QP fails; a go-back would be ignored). No timer of a QP with a
    waiting fire is acted on until it is out.

    Parameters
    ----------
    config : EngineConfig
        ``n_qp``.
    clock_hz : int
        The clock frequency (a build parameter): see :func:`tick_period`.

    Members
    -------
    setup : ``In(stream.Signature(timer_setup_layout(n_qp)))``
        A QP set up again (a management write).
    arm : ``In(stream.Signature(timer_arm_layout(n_qp)))``
        The completer's news after a WR or an event.
    rnr : ``In(stream.Signature(timer_rnr_layout(n_qp)))``
        An RNR NAK.
    fire : ``Out(stream.Signature(timer_fire_layout(n_qp)))``
        What a QP's timer decided (:class:`~roce_hw.proto.TimerKind`).
    pause : ``In(1)``
        PFC pause: the tick stops while it is high.
    counters : ``Out(timer_counters_layout())``
        :data:`TIMER_COUNTERS`.

    Raises
    ------
    ValueError
        ``clock_hz`` out of range.
    """

    #: Cycles from the sweep's read of a row to its fire on ``fire``.
    sweep_latency = 8
    #: Cycles from an input taken to the fire it decides (RNR_RETRY_EXC) on ``fire``.
    input_latency = 3

    def __init__(self, config, *, clock_hz):
        self._config = cfg = check_config(config)
        self._period = tick_period(clock_hz)
        self._clock_hz = clock_hz
        super().__init__({
            "setup": In(stream.Signature(timer_setup_layout(cfg.n_qp))),
            "arm": In(stream.Signature(timer_arm_layout(cfg.n_qp))),
            "rnr": In(stream.Signature(timer_rnr_layout(cfg.n_qp))),
            "fire": Out(stream.Signature(timer_fire_layout(cfg.n_qp))),
            "pause": In(1),
            "counters": Out(timer_counters_layout()),
        })

    @property
    def period(self):
        """The tick period in cycles (a ``Fraction``)."""
        return self._period

    def latest(self, ticks):
        """The last cycle, counted from a timer's start, in which the first ``fire.valid`` of
        a timer of ``ticks`` ticks may rise (``fire.ready`` high, no ``pause``)."""
        return math.ceil((ticks + 1) * self._period) + self._config.n_qp + 10

    def elaborate(self, platform):
        cfg = self._config
        m = Module()
        n_qp = cfg.n_qp
        qw = qp_index_width(n_qp)

        # ---------------------------------------------------------------- the tick
        # A tick lasts q or q + 1 cycles; the carry out of a 36-bit accumulator of the period's
        # fraction says which. The accumulator is three 12-bit pieces with registered carries
        # between them (one step per tick), so its carry sequence is that of one 36-bit adder
        # from another start (a tick whose extra cycle comes two ticks late is a shifted
        # phase): every run of ticks is as long as the period says, to a cycle.
        q = math.floor(self._period)
        frac = int((self._period - q) * 2**_FRAC_BITS)
        now = FastCounter(m, NOW_BITS, "now")
        # for tests only: the tick count, to set it forward (timeout 31 lasts 2**31 ticks)
        self._probe = {"now": now.value, "now_flags": dict(now._flags)}
        tick = Signal()
        # the first tick lasts a cycle more when the period has a fraction (the accumulator's
        # carries start at 1): no run of ticks is shorter than the period says
        left = Signal(range(q + 1), init=q if frac else q - 1)
        extra = C(0, 1)
        if frac:
            cin = C(0, 1)
            for k in range(0, _FRAC_BITS, _CHUNK):
                part = Signal(_CHUNK, name=f"acc{k}")
                cout = Signal(name=f"acc{k}_c", init=1)
                s = Signal(_CHUNK + 1, name=f"acc{k}_s")
                m.d.comb += s.eq(part + ((frac >> k) & ((1 << _CHUNK) - 1)) + cin)
                with m.If(tick):
                    m.d.sync += [part.eq(s[:_CHUNK]), cout.eq(s[_CHUNK])]
                cin = cout
            extra = cin
        m.d.comb += tick.eq((left == 0) & ~self.pause)
        with m.If(tick):
            m.d.sync += now.advance()
            m.d.sync += left.eq(q - 1 + extra)
        with m.Elif(~self.pause):
            m.d.sync += left.eq(left - 1)

        # ---------------------------------------------------------------- the RAM
        rows = memory.Memory(shape=_ROW, depth=max(2, n_qp), init=[])
        views = memory.Memory(shape=_VIEW.size, depth=max(2, n_qp), init=[])
        m.submodules.rows = rows
        m.submodules.views = views
        wp = rows.write_port()
        up = rows.read_port(transparent_for=(wp,))    # the read-modify-write stage
        vp = views.write_port(granularity=_VIEW_PIECE)
        sp = views.read_port()                        # the sweep (its view is re-checked)

        # ---------------------------------------------------------------- the sweep
        # S0: read row r. S1: the elapsed ticks minus one, e = now + ~start, in 12-bit pieces
        # with both carries in. S2: e. S3: e against the timer's length. S4: the hint.
        r = Signal(qw)
        m.d.sync += r.eq(Mux(r == n_qp - 1, 0, r + 1))
        m.d.comb += [sp.addr.eq(r), sp.en.eq(1)]

        rd_qp = Signal(qw)      # the row on sp.data
        s1_qp = Signal(qw)
        m.d.sync += [rd_qp.eq(r), s1_qp.eq(rd_qp)]
        srow = _VIEW(sp.data)
        nowv = now.value
        nst = Signal(NOW_BITS)
        m.d.comb += nst.eq(~srow.start)
        lo = Signal(_CHUNK + 1)
        mid0, mid1 = Signal(_CHUNK + 1), Signal(_CHUNK + 1)
        hw_ = NOW_BITS - 2 * _CHUNK
        hi0, hi1 = Signal(hw_), Signal(hw_)
        m.d.sync += [
            lo.eq(nowv[:_CHUNK] + nst[:_CHUNK]),
            mid0.eq(nowv[_CHUNK:2 * _CHUNK] + nst[_CHUNK:2 * _CHUNK]),
            # now + ~start + 1 = now - start: one carry chain; carry out = no borrow
            mid1.eq(Cat((nowv[_CHUNK:2 * _CHUNK] - srow.start[_CHUNK:2 * _CHUNK])[:_CHUNK],
                        nowv[_CHUNK:2 * _CHUNK] >= srow.start[_CHUNK:2 * _CHUNK])),
            hi0.eq(nowv[2 * _CHUNK:] + nst[2 * _CHUNK:]),
            hi1.eq(nowv[2 * _CHUNK:] - srow.start[2 * _CHUNK:]),
        ]
        s1 = Signal(_VIEW)
        m.d.sync += s1.eq(srow)

        # S2
        e = Signal(NOW_BITS)
        s2 = Signal(_VIEW)
        s2_qp = Signal(qw)
        c_mid = Mux(lo[_CHUNK], mid1[_CHUNK], mid0[_CHUNK])
        m.d.sync += [
            e.eq(Cat(lo[:_CHUNK], Mux(lo[_CHUNK], mid1[:_CHUNK], mid0[:_CHUNK]),
                     Mux(c_mid, hi1, hi0))),
            s2.eq(s1), s2_qp.eq(s1_qp),
        ]
        # the ACK timer's mask (bits at and above ``timeout``) and the RNR wait's length
        mask = Signal(NOW_BITS - 1)
        m.d.sync += mask.eq(Cat(s1.timeout <= j for j in range(NOW_BITS - 1)))
        kval = Signal(18)
        with m.Switch(s1.rnr_code):
            for code in range(32):
                with m.Case(code):
                    m.d.sync += kval.eq(rnr_ticks(code))

        # S3: "e >= 2**timeout" and "e >= K" (e is non-negative unless the start is this tick)
        s3 = Signal(_VIEW)
        s3_qp = Signal(qw)
        ack_hit = Signal()
        neg = Signal()
        hi_nz, k_gt, k_eq, k_ge = Signal(), Signal(), Signal(), Signal()
        m.d.sync += [
            s3.eq(s2), s3_qp.eq(s2_qp),
            neg.eq(e[NOW_BITS - 1]),
            ack_hit.eq(or_tree([e[j] & mask[j] for j in range(NOW_BITS - 1)])),
            hi_nz.eq(e[18:NOW_BITS - 1] != 0),
            k_gt.eq(e[9:18] > kval[9:18]),
            k_eq.eq(e[9:18] == kval[9:18]),
            k_ge.eq(e[:9] >= kval[:9]),
        ]
        # S4: the hint, registered: the row may need the read-modify-write stage
        fire_free = Signal()
        m.d.comb += fire_free.eq(~self.fire.valid | self.fire.ready)
        rnr_hit = hi_nz | k_gt | (k_eq & k_ge)
        expired = ~neg & ~s3.dead & ~s3.pend & (
            (s3.ack_run & ack_hit) | (s3.rnr_wait & rnr_hit))
        hint = Signal()
        h_qp = Signal(qw)
        h_seq = Signal(3)
        h_exp = Signal()
        h_rnr = Signal()
        m.d.sync += [
            hint.eq(expired | (s3.pend & fire_free)),
            h_qp.eq(s3_qp), h_seq.eq(s3.seq), h_exp.eq(expired), h_rnr.eq(s3.rnr_wait),
        ]

        self._probe.update(s3=s3, s3_qp=s3_qp)

        # ---------------------------------------------------------------- R0: one request
        setup, arm, rnr = self.setup, self.arm, self.rnr
        m.d.comb += [
            setup.ready.eq(~hint),
            rnr.ready.eq(~hint & ~setup.valid),
            arm.ready.eq(~hint & ~setup.valid & ~rnr.valid),
        ]
        sel_qp = Signal(qw)
        with m.If(hint):
            m.d.comb += sel_qp.eq(h_qp)
        with m.Elif(setup.valid):
            m.d.comb += sel_qp.eq(setup.payload.qp)
        with m.Elif(rnr.valid):
            m.d.comb += sel_qp.eq(rnr.payload.qp)
        with m.Else():
            m.d.comb += sel_qp.eq(arm.payload.qp)
        m.d.comb += [up.addr.eq(sel_qp), up.en.eq(1)]

        rq_valid = Signal()
        rq_kind = Signal(2)
        rq_qp = Signal(qw)
        rq_setup = Signal(timer_setup_layout(n_qp))
        rq_arm = Signal(timer_arm_layout(n_qp))
        rq_code = Signal(5)
        rq_seq, rq_exp, rq_rnr = Signal(3), Signal(), Signal()
        bad_qp = Signal()
        # the request one stage ahead writes its row only after this one's read: its new row
        # is forwarded into R1's register, selected by a register (not on R2's paths)
        fwd = Signal()
        in_bad = (sel_qp >= n_qp) if (1 << qw) != n_qp else C(0, 1)
        taken = setup.valid | rnr.valid | arm.valid
        m.d.sync += [
            rq_qp.eq(sel_qp), rq_setup.eq(setup.payload), rq_arm.eq(arm.payload),
            rq_code.eq(rnr.payload.code), rq_seq.eq(h_seq), rq_exp.eq(h_exp),
            rq_rnr.eq(h_rnr),
            rq_valid.eq(hint | (taken & ~in_bad)),
            fwd.eq(rq_valid & (rq_qp == sel_qp)),
            bad_qp.eq(~hint & taken & in_bad),
            rq_kind.eq(Mux(hint, _SWEEP, Mux(setup.valid, _SETUP, Mux(rnr.valid, _RNR, _ARM)))),
        ]

        # ---------------------------------------------------------------- R1: the row, registered
        # (a deep RAM's output multiplexer takes three cells), with the new row of the request
        # one stage ahead when it is the same QP's: R2 acts on a register, no multiplexer
        r1_valid, r1_kind, r1_qp = Signal(), Signal(2), Signal(qw)
        # what the request may do, one-hot and registered: R2 is a flat sum of products of
        # these and of the row's bits (a priority chain or a case on the row is deeper)
        is_k = [Signal(name=f"r1_is{k}") for k in range(4)]
        m.d.sync += [is_k[k].eq(rq_valid & (rq_kind == k)) for k in range(4)]
        arm_stop, arm_go, sw_rnr, sw_ack = (
            Signal(name=n) for n in ("r1_arm_stop", "r1_arm_go", "r1_sw_rnr", "r1_sw_ack"))
        in_arm = rq_valid & (rq_kind == _ARM)
        in_sweep = rq_valid & (rq_kind == _SWEEP)
        m.d.sync += [
            arm_stop.eq(in_arm & ~rq_arm.outstanding), arm_go.eq(in_arm & rq_arm.outstanding),
            sw_rnr.eq(in_sweep & rq_exp & rq_rnr), sw_ack.eq(in_sweep & rq_exp & ~rq_rnr),
        ]
        r1_setup = Signal(timer_setup_layout(n_qp))
        r1_arm = Signal(timer_arm_layout(n_qp))
        r1_code, r1_seq, r1_exp, r1_rnr = Signal(5), Signal(3), Signal(), Signal()
        r1_row = Signal(_ROW)
        new = Signal(_ROW)
        m.d.sync += [
            r1_valid.eq(rq_valid), r1_kind.eq(rq_kind), r1_qp.eq(rq_qp),
            r1_setup.eq(rq_setup), r1_arm.eq(rq_arm), r1_code.eq(rq_code),
            r1_seq.eq(rq_seq), r1_exp.eq(rq_exp), r1_rnr.eq(rq_rnr),
            r1_row.eq(Mux(fwd, new, up.data)),
        ]
        rq_valid, rq_kind, rq_qp = r1_valid, r1_kind, r1_qp
        rq_setup, rq_arm, rq_code = r1_setup, r1_arm, r1_code
        rq_seq, rq_exp, rq_rnr = r1_seq, r1_exp, r1_rnr

        # ---------------------------------------------------------------- R2: act on the row
        # The rules as events (exclusive, but for the ACK timer's restart after a fire), and
        # each field of the new row as a sum of products of them: no priority chain.
        row = r1_row
        is_setup, is_rnr, is_sweep = is_k[_SETUP], is_k[_RNR], is_k[_SWEEP]
        is_arm = arm_stop | arm_go
        live = ~row.dead
        has_t, rnr_out, retry_out, seq_ok = Signal(), Signal(), Signal(), Signal()
        m.d.comb += [
            has_t.eq(row.timeout != 0),
            rnr_out.eq((row.rnr_left == 0) & (row.rnr_retry != _INFINITE_RNR)),
            retry_out.eq(row.retry_left == 0),
            seq_ok.eq(rq_seq == row.seq),
        ]
        ev = {n: Signal(name=f"ev_{n}") for n in (
            "stop", "arm_start", "rnr_exc", "rnr_start", "pend_out", "rnr_done", "ack_over",
            "decided", "kept", "restart", "seq")}
        # the sweep's expiry stands if its view is still the row's: nothing waiting, same seq
        sweep_ok = is_sweep & ~row.pend & live & seq_ok
        m.d.comb += [
            ev["stop"].eq(arm_stop & live & row.ack_run),
            ev["arm_start"].eq(arm_go & live & ~row.rnr_wait & has_t &
                               (rq_arm.progress | (~row.ack_run & ~row.pend))),
            ev["rnr_exc"].eq(is_rnr & live & ~row.rnr_wait & rnr_out),
            ev["rnr_start"].eq(is_rnr & live & ~row.rnr_wait & ~rnr_out),
            ev["pend_out"].eq(is_sweep & row.pend & fire_free),
            ev["rnr_done"].eq(sweep_ok & sw_rnr & row.rnr_wait),
            ev["ack_over"].eq(sweep_ok & sw_ack & row.ack_run),
            # a fire decided: put on ``fire`` if it is free, else kept in the row
            ev["decided"].eq(ev["rnr_exc"] | ev["rnr_done"] | ev["ack_over"]),
            ev["kept"].eq(ev["decided"] & ~fire_free),
            # the ACK timer started: by an arm, or as a go-back (TIMEOUT, RNR_DONE) goes out
            ev["restart"].eq(
                ev["arm_start"] |
                (ev["pend_out"] & live & ~row.rnr_wait & row.out & has_t &
                 ~row.pend_kind[1]) |    # a TIMEOUT or RNR_DONE kept
                ((ev["rnr_done"] | (ev["ack_over"] & ~retry_out)) & fire_free & row.out &
                 has_t)),
            ev["seq"].eq(is_setup | ev["stop"] | ev["restart"] | ev["rnr_exc"] |
                         ev["rnr_start"] | ev["rnr_done"] | ev["ack_over"]),
        ]
        # the decided fire's kind (TimerKind's encoding; one event at a time)
        dkind = Signal(2)
        m.d.comb += dkind.eq(Cat(is_rnr | sw_rnr, is_rnr | (sw_ack & retry_out)))
        refill = Signal()
        m.d.comb += refill.eq(is_arm & live & rq_arm.progress)
        we = Signal()
        emit = Signal()
        kind = Signal(2)
        rnr_repeat = Signal()
        dead_input = Signal()
        seq_next = Signal(3)
        m.d.comb += [
            seq_next.eq(_step(row.seq)),
            we.eq(is_setup | (is_arm & live) | ev["rnr_exc"] | ev["rnr_start"] |
                  ev["pend_out"] | ev["rnr_done"] | ev["ack_over"]),
            emit.eq(ev["pend_out"] | (ev["decided"] & fire_free)),
            kind.eq(Mux(is_sweep & row.pend, row.pend_kind, dkind)),
            rnr_repeat.eq(is_rnr & live & row.rnr_wait),
            dead_input.eq((is_arm | is_rnr) & row.dead),
            new.seq.eq(Mux(ev["seq"], seq_next, row.seq)),
            new.timeout.eq(Mux(is_setup, rq_setup.timeout, row.timeout)),
            new.retry_cnt.eq(Mux(is_setup, rq_setup.retry_cnt, row.retry_cnt)),
            new.rnr_retry.eq(Mux(is_setup, rq_setup.rnr_retry, row.rnr_retry)),
            new.retry_left.eq(Mux(is_setup, rq_setup.retry_cnt,
                                  Mux(refill, row.retry_cnt,
                                      Mux(ev["ack_over"] & ~retry_out,
                                          _step(row.retry_left, down=True), row.retry_left)))),
            new.rnr_left.eq(Mux(is_setup, rq_setup.rnr_retry,
                                Mux(refill, row.rnr_retry,
                                    Mux(ev["rnr_start"] & (row.rnr_retry != _INFINITE_RNR),
                                        _step(row.rnr_left, down=True), row.rnr_left)))),
            new.out.eq(Mux(is_arm & live, arm_go, row.out & ~is_setup)),
            new.ack_run.eq(ev["restart"] |
                           (row.ack_run & ~(is_setup | ev["stop"] | ev["rnr_exc"] |
                                            ev["rnr_start"] | ev["ack_over"]))),
            new.rnr_wait.eq(ev["rnr_start"] | (row.rnr_wait & ~is_setup & ~ev["rnr_done"])),
            new.dead.eq(ev["rnr_exc"] | (ev["ack_over"] & retry_out) | (row.dead & ~is_setup)),
            new.pend.eq(ev["kept"] |
                        (row.pend & ~(is_setup | ev["pend_out"] | ev["rnr_exc"]))),
            new.pend_kind.eq(Mux(ev["kept"], dkind, row.pend_kind)),
            wp.addr.eq(rq_qp), wp.data.eq(new), wp.en.eq(we),
        ]
        # the sweep's view: its flags with every write, the start (and an RNR wait's code: an
        # ACK timer's start writes a code that no one reads) when a timer starts
        view = Signal(_VIEW)
        start_we = Signal()
        m.d.comb += [
            [getattr(view, name).eq(getattr(new, name)) for name in _VIEW_FLAGS],
            view.start.eq(nowv), view.rnr_code.eq(rq_code),
            start_we.eq(ev["restart"] | ev["rnr_start"]),
            vp.addr.eq(rq_qp), vp.data.eq(view), vp.en.eq(Cat(we, start_we.replicate(3))),
        ]

        # ---------------------------------------------------------------- fire
        with m.If(emit):
            m.d.sync += [self.fire.valid.eq(1), self.fire.payload.qp.eq(rq_qp),
                         self.fire.payload.kind.eq(kind)]
        with m.Elif(self.fire.ready):
            m.d.sync += self.fire.valid.eq(0)

        # ---------------------------------------------------------------- counters
        taken_fire = self.fire.valid & self.fire.ready
        for k, name in _KIND_COUNTER.items():
            hit = Signal(name=f"hit_{name}")
            m.d.sync += hit.eq(taken_fire & (self.fire.payload.kind == k))
            m.d.comb += getattr(self.counters, name).eq(event_counter(m, 32, hit, name))
        for name, sig in (("rnr_repeat", rnr_repeat), ("dead_input", dead_input)):
            hit = Signal(name=f"hit_{name}")
            m.d.sync += hit.eq(sig)
            m.d.comb += getattr(self.counters, name).eq(event_counter(m, 32, hit, name))
        m.d.comb += self.counters.bad_qp.eq(event_counter(m, 32, bad_qp, "bad_qp_n"))
        return m
