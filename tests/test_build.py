# SPDX-License-Identifier: BSD-2-Clause
"""build.py: the generator CLI emits lint-clean Verilog and refuses impossible options clearly."""

import subprocess
import sys

import pytest

from conftest import ROOT
from sim.verilog import lint

__all__ = []


def _run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, str(ROOT / "build.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("args, words", [
    (["--width", "100"], ["100", "64, 128, 256, 512, 1024"]),
    (["--width", "0"], ["64, 128, 256, 512, 1024"]),
    (["--qps", "0"], ["n_qp"]),
    (["--qps", "100000"], ["16384"]),
    (["--name", "1bad"], ["identifier"]),
])
def test_bad_options_exit_2_with_a_clear_message(args, words):
    res = _run(*args)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    for w in words:
        assert w in res.stderr


@pytest.mark.parametrize("width", [64, 512])
def test_emits_lint_clean_roce_tx(tmp_path, width):
    res = _run("--width", str(width), "--qps", "16", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr + res.stdout
    text = (tmp_path / "roce_tx.v").read_text()
    assert "module roce_tx(" in text
    for port in ("s_axis_payload_tdata", "m_axis_tx_tdata", "m_axis_tx_tuser", "s_wr_length",
                 "s_qp_mgmt_req_valid", "m_status_status"):
        assert port in text, port
    assert f"[{width - 1}:0] m_axis_tx_tdata" in text
    lint(text, "roce_tx")
    ports = (tmp_path / "roce_tx_ports.txt").read_text()
    assert "m_axis_tx_tdata" in ports


@pytest.mark.slow
@pytest.mark.parametrize("width", [128, 256, 1024])
def test_emits_lint_clean_roce_tx_other_widths(tmp_path, width):
    res = _run("--width", str(width), "--out", str(tmp_path), "--lint")
    assert res.returncode == 0, res.stderr + res.stdout


def test_scales_to_1024_qps(tmp_path):
    res = _run("--width", "64", "--qps", "1024", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr + res.stdout
