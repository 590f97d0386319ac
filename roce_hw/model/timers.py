# SPDX-License-Identifier: BSD-2-Clause
"""Reference model of the retransmission timers (:class:`roce_hw.ctrl.timers.RetxTimers`):
their rules, and their timing in exact time (no Amaranth).

Time is in cycles of ``clock_hz``; :meth:`TimersModel.pause` freezes it (a timer counts the
cycles without ``pause`` only). A timer's length is exact: the local ACK timeout
``4.096 us * 2**timeout`` (``timeout`` 0: no ACK timer), the RNR wait
:data:`roce_hw.proto.RNR_TIMER_US` of its code. A timer started at ``s`` is **due** ``D``
unpaused cycles after ``s``; the hardware ticks in 4.096 us steps and sweeps its rows, so it
may act later, up to its **latest**: ``(K + 1)`` ticks after ``s`` (``K`` the length in whole
ticks, rounded up) plus ``slack`` cycles.

The model can run alone (:meth:`TimersModel.run_until`: every timer fires when due) or check a
run of the hardware (:meth:`TimersModel.fire` at the cycle the hardware decided, after
:meth:`TimersModel.check` of that cycle: no timer left beyond its latest). Rules, per QP:

* ``setup``: ``timeout``, ``retry_cnt``, ``rnr_retry`` stored, both retry counts full,
  nothing running;
* ``arm``: ``progress`` refills both retry counts; ``outstanding`` 0 stops the ACK timer;
  ``outstanding`` 1 starts it when ``progress`` or when it is stopped; never during an RNR
  wait (it starts when the wait is over);
* ``rnr``: ignored during an RNR wait; with no RNR retry left (``rnr_retry`` 7: infinite)
  RNR_RETRY_EXC; else one is counted and the wait starts (the ACK timer stopped);
* ACK timer due: TIMEOUT (a retry counted, the timer started again) or RETRY_EXC after
  ``retry_cnt`` retries;
* RNR wait due: RNR_DONE, the ACK timer started if ``outstanding``;
* after RETRY_EXC / RNR_RETRY_EXC nothing but ``setup`` acts on the QP.
"""

import math
from dataclasses import dataclass
from fractions import Fraction

from .. import proto

__all__ = ["ack_timeout_cycles_exact", "rnr_wait_cycles_exact", "TimerError", "TimersModel"]

_K = proto.TimerKind


def ack_timeout_cycles_exact(timeout, clock_hz):
    """The local ACK timeout ``4.096 us * 2**timeout`` in cycles (a ``Fraction``; ``clock_hz``
    an int, float or ``Fraction``)."""
    return Fraction(proto.TIMER_TICK_NS << timeout, 10**9) * Fraction(clock_hz)


def rnr_wait_cycles_exact(code, clock_hz):
    """The RNR wait of timer ``code`` in cycles (a ``Fraction``; ``clock_hz`` an int, float or
    ``Fraction``)."""
    return Fraction(proto.RNR_TIMER_US[code], 10**6) * Fraction(clock_hz)


class TimerError(AssertionError):
    """A fire the rules do not allow, too early, or too late."""


@dataclass
class _Qp:
    timeout: int = 0
    retry_cnt: int = 0
    rnr_retry: int = 0
    retry_left: int = 0
    rnr_left: int = 0
    out: bool = False
    ack_start: object = None     # unpaused time the ACK timer started, or None
    rnr_start: object = None     # unpaused time the RNR wait started, or None
    rnr_code: int = 0
    dead: bool = False


class TimersModel:
    """The timers of ``n_qp`` QPs at ``clock_hz``; ``slack``: cycles the hardware may act
    after ``(K + 1)`` ticks from a timer's start.

    Every method takes the cycle of the event (never decreasing)."""

    def __init__(self, n_qp, clock_hz, *, slack=0):
        self.n_qp = n_qp
        self.clock_hz = clock_hz
        self.tick = Fraction(proto.TIMER_TICK_NS * clock_hz, 10**9)
        self.slack = slack
        self._qp = [_Qp() for _ in range(n_qp)]
        self._cycle = 0
        self._u = 0              # unpaused cycles before self._cycle
        self._paused = False
        self.fires = []          # (cycle, qp, kind)

    # ---------------------------------------------------------------- time
    def _at(self, cycle):
        if cycle < self._cycle:
            raise ValueError(f"cycle {cycle} is before {self._cycle}")
        if not self._paused:
            self._u += cycle - self._cycle
        self._cycle = cycle
        return self._u

    def pause(self, cycle, on):
        """``pause`` is ``on`` from ``cycle`` on."""
        self._at(cycle)
        self._paused = bool(on)

    def _wall(self, u):
        """The first cycle at which ``u`` unpaused cycles have passed (no pause from now)."""
        if u <= self._u:
            return self._cycle
        if self._paused:
            return None
        return self._cycle + math.ceil(u - self._u)

    # ---------------------------------------------------------------- the timer of a QP
    def timer(self, qp):
        """``(kind, due, latest)`` of QP ``qp``'s running timer in unpaused cycles, or None:
        the fire it makes, when it is due and the last unpaused time it may be decided."""
        st = self._qp[qp]
        if st.dead:
            return None
        if st.rnr_start is not None:
            ticks = math.ceil(Fraction(proto.RNR_TIMER_US[st.rnr_code] * 1000,
                                       proto.TIMER_TICK_NS))
            d = rnr_wait_cycles_exact(st.rnr_code, self.clock_hz)
            start, kind = st.rnr_start, _K.RNR_DONE
        elif st.ack_start is not None:
            ticks = 1 << st.timeout
            d = ack_timeout_cycles_exact(st.timeout, self.clock_hz)
            start = st.ack_start
            kind = _K.TIMEOUT if st.retry_left else _K.RETRY_EXC
        else:
            return None
        return kind, start + d, start + (ticks + 1) * self.tick + self.slack

    # ---------------------------------------------------------------- inputs
    def setup(self, cycle, qp, timeout, retry_cnt, rnr_retry):
        self._at(cycle)
        self._qp[qp] = _Qp(timeout, retry_cnt, rnr_retry, retry_cnt, rnr_retry)

    def arm(self, cycle, qp, outstanding, progress):
        u = self._at(cycle)
        st = self._qp[qp]
        if st.dead:
            return
        if progress:
            st.retry_left, st.rnr_left = st.retry_cnt, st.rnr_retry
        st.out = bool(outstanding)
        if not outstanding:
            st.ack_start = None
        elif st.rnr_start is None and st.timeout and (progress or st.ack_start is None):
            st.ack_start = u

    def rnr(self, cycle, qp, code):
        """An RNR NAK; returns RNR_RETRY_EXC when it fires at once, else None."""
        u = self._at(cycle)
        st = self._qp[qp]
        if st.dead or st.rnr_start is not None:
            return None
        if st.rnr_left == 0 and st.rnr_retry != 7:
            st.dead = True
            st.ack_start = None
            self.fires.append((cycle, qp, _K.RNR_RETRY_EXC))
            return _K.RNR_RETRY_EXC
        if st.rnr_retry != 7:
            st.rnr_left -= 1
        st.rnr_start, st.rnr_code, st.ack_start = u, code, None
        return None

    # ---------------------------------------------------------------- fires
    def check(self, cycle):
        """Raise :class:`TimerError` if a timer is left beyond its latest at ``cycle``."""
        u = self._at(cycle)
        for qp in range(self.n_qp):
            t = self.timer(qp)
            if t is not None and u > t[2]:
                raise TimerError(f"cycle {cycle}: QP {qp}'s {t[0].name} is late (due at "
                                 f"unpaused {float(t[1]):.1f}, latest {float(t[2]):.1f}, "
                                 f"now {u})")

    def fire(self, cycle, qp):
        """QP ``qp``'s timer acts at ``cycle``: returns its kind; :class:`TimerError` when
        nothing is due."""
        u = self._at(cycle)
        t = self.timer(qp)
        if t is None:
            raise TimerError(f"cycle {cycle}: QP {qp} fired with no timer running")
        kind, due, latest = t
        if u < due:
            raise TimerError(f"cycle {cycle}: QP {qp}'s {kind.name} is early by "
                             f"{float(due - u):.2f} cycles")
        st = self._qp[qp]
        if kind == _K.RNR_DONE:
            st.rnr_start = None
            st.ack_start = u if st.out and st.timeout else None
        elif kind == _K.RETRY_EXC:
            st.dead, st.ack_start = True, None
        else:
            st.retry_left -= 1
            st.ack_start = u
        self.fires.append((cycle, qp, kind))
        return kind

    def run_until(self, cycle):
        """Fire every timer when it is due, up to ``cycle`` (excluded); returns the fires
        ``[(cycle, qp, kind)]``, in time order (QP order within a cycle)."""
        out = []
        while True:
            best = None
            for qp in range(self.n_qp):
                t = self.timer(qp)
                if t is not None:
                    w = self._wall(t[1])
                    if w is not None and w < cycle and (best is None or w < best[0]):
                        best = (w, qp)
            if best is None:
                break
            kind = self.fire(*best)
            out.append((best[0], best[1], kind))
        self._at(max(cycle, self._cycle))
        return out
