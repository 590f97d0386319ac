# SPDX-License-Identifier: BSD-2-Clause
"""bench.simspeed runs and prints its figures (a smoke test; the figures are not checked: they
depend on the machine's load)."""

import json
import re
import subprocess
import sys

import pytest

from conftest import ROOT

__all__ = []


def _run(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "bench.simspeed", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_simspeed_prints_cycles_per_second(tmp_path):
    out = tmp_path / "speed.json"
    res = _run("--backend", "amaranth", "--width", "64", "--amaranth-cycles", "60",
               "--closed-messages", "1", "1", "--json", str(out))
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    row = res.stdout.splitlines()[1].split()
    assert row[:2] == ["64", "amaranth"] and re.fullmatch(r"[\d,]+", row[2])
    rows = json.loads(out.read_text())
    assert {r["load"] for r in rows} == {"open", "closed"}
    assert all(r["cycles_per_s"] > 0 for r in rows)
    assert [r["delivered"] for r in rows if r["load"] == "closed"] == [True]


@pytest.mark.tools("verilator")
def test_simspeed_both_back_ends_side_by_side(tmp_path):
    out = tmp_path / "speed.json"
    res = _run("--width", "64", "--cycles", "20000", "--amaranth-cycles", "60",
               "--closed-messages", "1", "20", "--json", str(out))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    verilator = next(line for line in lines if line.split()[:2] == ["64", "verilator"])
    # open c/s, busy, closed c/s, bare c/s, overhead, open ratio, closed ratio
    assert re.search(r"\d\.\d\dx +\d+x +\d+x$", verilator), verilator
    rows = json.loads(out.read_text())
    assert {(r["backend"], r["load"]) for r in rows} == {
        ("amaranth", "open"), ("amaranth", "closed"), ("verilator", "open"),
        ("verilator", "closed"), ("verilator", "bare")}


def test_simspeed_refuses_bad_width():
    res = _run("--width", "100", timeout=120)
    assert res.returncode == 2 and "64, 128, 256, 512, 1024" in res.stderr
