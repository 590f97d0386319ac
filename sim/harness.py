# SPDX-License-Identifier: BSD-2-Clause
"""Simulator set-up shared by tests and tools: clock, testbenches, a hard deadline, optional VCD."""

import contextlib
import os
from pathlib import Path

from amaranth.sim import Simulator

__all__ = ["CLOCK_PERIOD", "run_simulation", "vcd_requested"]

#: Simulated clock period in seconds (the value only scales VCD time stamps).
CLOCK_PERIOD = 1e-8
_CHUNK = 256


def vcd_requested():
    """True when ``RHW_VCD=1`` is set in the environment."""
    return os.environ.get("RHW_VCD", "") not in ("", "0")


def run_simulation(dut, testbenches=(), processes=(), *, cycles, vcd_name=None, done=None):
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
    """
    sim = Simulator(dut)
    sim.add_clock(CLOCK_PERIOD)
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
