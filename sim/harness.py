# SPDX-License-Identifier: BSD-2-Clause
"""Simulator set-up shared by tests and tools: clock, testbenches, a hard deadline, optional VCD,
and progress lines for long runs."""

import contextlib
import os
import sys
import time
from pathlib import Path

from amaranth.sim import Simulator

__all__ = ["CLOCK_PERIOD", "Progress", "run_simulation", "vcd_requested"]

#: Simulated clock period in seconds (the value only scales VCD time stamps).
CLOCK_PERIOD = 1e-8
_CHUNK = 256


def vcd_requested():
    """True when ``RHW_VCD=1`` is set in the environment."""
    return os.environ.get("RHW_VCD", "") not in ("", "0")


def run_simulation(dut, testbenches=(), processes=(), *, cycles, vcd_name=None, done=None,
                   clocks=None):
    """Simulate ``dut`` with one clock for at most ``cycles`` clock cycles.

    Parameters
    ----------
    dut : Elaboratable
    testbenches : iterable of async functions ``f(ctx)``
        Added with ``Simulator.add_testbench``.
    processes : iterable of async functions ``f(ctx)``
        Added with ``Simulator.add_process`` (for free-running monitors).
    cycles : int
        Hard deadline. The simulation stops (within 256 cycles) once all testbenches have
        returned, or at the deadline, which raises ``TimeoutError``.
    vcd_name : str, optional
        With ``RHW_VCD=1`` a VCD is written to ``build/vcd/<vcd_name>.vcd`` (never the repo root).
    done : callable, optional
        Extra completion predicate checked after the run (``TimeoutError`` if it returns False).
    clocks : dict, optional
        More clock domains: ``{domain: (period, phase)}`` in seconds (``cycles`` still counts
        periods of ``sync``'s :data:`CLOCK_PERIOD`).
    """
    sim = Simulator(dut)
    sim.add_clock(CLOCK_PERIOD)
    for domain, (period, phase) in (clocks or {}).items():
        sim.add_clock(period, phase=phase, domain=domain)
    finished = []
    tbs = list(testbenches)
    for tb in tbs:
        async def wrapper(ctx, tb=tb):
            await tb(ctx)
            finished.append(tb)
        sim.add_testbench(wrapper)
    for proc in processes:
        sim.add_process(proc)
    if vcd_requested() and vcd_name:
        path = Path("build") / "vcd" / f"{vcd_name}.vcd"
        path.parent.mkdir(parents=True, exist_ok=True)
        cm = sim.write_vcd(str(path))
    else:
        cm = contextlib.nullcontext()
    with cm:
        # Advance in chunks so that the run ends soon after the last testbench returns
        # (Simulator.run_until alone always runs to the deadline).
        now = 0
        while now < cycles and (not tbs or len(finished) < len(tbs)):
            now = min(cycles, now + _CHUNK)
            sim.run_until(CLOCK_PERIOD * (now + 0.5))
    if len(finished) != len(tbs) or (done is not None and not done()):
        raise TimeoutError(f"simulation did not finish within {cycles} cycles "
                           f"({len(finished)}/{len(tbs)} testbenches done)")


class Progress:
    """Progress lines for long simulations, on stderr, at most one every ``interval`` seconds and
    none before the first ``interval`` has passed (a short run prints nothing).

    ``update(cycles, done, frames=None)`` is cheap enough to call every few hundred cycles;
    ``finish(cycles, done, frames=None)`` prints a last line if any was printed before.
    ``enabled=False`` (``--quiet``) silences it.
    """

    def __init__(self, what, total=None, *, unit="messages", interval=5.0, stream=None,
                 enabled=True, clock=time.monotonic):
        self.what, self.total, self.unit = what, total, unit
        self.interval, self.enabled, self.clock = interval, enabled, clock
        self.stream = stream
        self.start = self.last = clock()
        self.lines = 0

    def _line(self, cycles, done, frames):
        elapsed = self.clock() - self.start
        rate = cycles / elapsed if elapsed > 0 else 0.0
        total = f"/{self.total}" if self.total is not None else ""
        fr = f", {frames} frames" if frames is not None else ""
        stream = self.stream or sys.stderr
        stream.write(f"{self.what}: {done}{total} {self.unit}{fr}, {cycles} cycles, "
                     f"{rate:,.0f} cycles/s, {elapsed:.0f} s\n")
        stream.flush()
        self.lines += 1

    def update(self, cycles, done, frames=None):
        if not self.enabled:
            return
        now = self.clock()
        if now - self.last >= self.interval:
            self.last = now
            self._line(cycles, done, frames)

    def finish(self, cycles, done, frames=None):
        if self.enabled and self.lines:
            self._line(cycles, done, frames)
