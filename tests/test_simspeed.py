# SPDX-License-Identifier: BSD-2-Clause
"""bench.simspeed runs and prints its figures (a smoke test; the figures are not checked)."""

import re
import subprocess
import sys

from conftest import ROOT

__all__ = []


def test_simspeed_prints_cycles_per_second(tmp_path):
    out = tmp_path / "speed.json"
    res = subprocess.run([sys.executable, "-m", "bench.simspeed", "--width", "64", "--cycles",
                          "60", "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    row = res.stdout.splitlines()[1].split()
    assert row[0] == "64" and row[2] == "60" and re.fullmatch(r"[\d,]+", row[4])
    assert '"cycles_per_s"' in out.read_text()


def test_simspeed_refuses_bad_width():
    res = subprocess.run([sys.executable, "-m", "bench.simspeed", "--width", "100"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "64, 128, 256, 512, 1024" in res.stderr
