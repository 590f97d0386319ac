# SPDX-License-Identifier: BSD-2-Clause
"""The policies of tests/conftest.py, seen from outside.

Missing tools: pytest runs with a ``PATH`` that has no verilator, iverilog or tshark. On a
user's machine those tests skip with one summary line naming the ``apt-get install``; in CI
(``CI=true``) they fail.

Tiers: every row of ``conftest.SYSTEM_TESTS`` names tests that exist, and ``-m system`` selects
exactly the tests the rows name.
"""

import ast
import fnmatch
import os
import re
import subprocess
import sys

from conftest import ROOT, SYSTEM_TESTS, TOOL_PACKAGES, system_reason

__all__ = []

#: One test per way a test meets a missing tool.
SELECTION = [
    # @pytest.mark.tools("verilator")
    "tests/test_build.py::test_emits_lint_clean_roce_tx[64]",
    # @pytest.mark.tools("tshark")
    "tests/test_golden.py::test_field_decode_agrees_with_tshark[rdma_write_bw.pcap]",
    # roce_hw.generate.lint raises ToolMissing at run time
    "tests/test_flat.py::test_port_names_and_lint",
    # sim.cosim raises CosimToolMissing at run time
    "tests/test_cosim.py::test_cycle_limit_raises_clearly",
    # pytest.skip("iverilog not installed") inside the test
    "tests/test_qp_table.py::test_verilog_out_of_range_iverilog",
    # a test that needs no tool still passes
    "tests/test_golden.py::test_golden_files_present",
]


def _pytest(ci):
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PATH"] = os.path.dirname(sys.executable)        # python, pip, yowasp: no apt tools
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0",
                           "-q", *SELECTION], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)


def test_the_path_really_lacks_the_tools():
    path = os.path.dirname(sys.executable)
    assert not any(os.path.exists(os.path.join(path, t)) for t in TOOL_PACKAGES)


def test_users_machine_skips_with_one_summary_line():
    res = _pytest(ci=False)
    out = res.stdout
    assert res.returncode == 0, out[-3000:]
    assert "1 passed, 5 skipped" in out, out[-2000:]
    lines = [ln for ln in out.splitlines() if ln.startswith("SKIPPED")]
    assert len(lines) == 1, lines
    assert re.match(r"SKIPPED \[5\] .*conftest\.py:\d+: missing tools: g\+\+, iverilog, make, "
                    r"tshark, verilator, vvp; install them with: sudo apt-get install g\+\+ "
                    r"iverilog make tshark verilator$", lines[0]), lines[0]
    assert "Traceback" not in out


def test_ci_fails_instead_of_skipping():
    res = _pytest(ci=True)
    out = res.stdout
    assert res.returncode == 1, out[-3000:]
    # a tool missing at set-up (marker) is an error, one found missing in the test a failure
    m = re.search(r"(\d+) failed, 1 passed, (\d+) errors? in", out)
    assert m and int(m.group(1)) + int(m.group(2)) == 5, out[-2000:]
    assert "skipped" not in out
    summary = [ln for ln in out.splitlines() if ln.startswith(("FAILED", "ERROR"))]
    assert len(summary) == 5 and all("apt-get install" in ln for ln in summary), summary


def _test_functions(path):
    """Names of the test functions pytest collects from ``path`` (module level and ``Test*``
    classes), read from the source."""
    tree = ast.parse(path.read_text())
    funcs = (ast.FunctionDef, ast.AsyncFunctionDef)
    names = [n.name for n in tree.body if isinstance(n, funcs)]
    for cls in tree.body:
        if isinstance(cls, ast.ClassDef) and cls.name.startswith("Test"):
            names += [n.name for n in cls.body if isinstance(n, funcs)]
    return [n for n in names if n.startswith("test")]


def test_system_table_names_tests_that_exist():
    stale = []
    for file, pattern, reason in SYSTEM_TESTS:
        path = ROOT / "tests" / file
        names = _test_functions(path) if path.is_file() else []
        if not any(fnmatch.fnmatchcase(n, pattern) for n in names):
            stale.append(f"{file}::{pattern} ({reason})")
    assert not stale, "conftest.SYSTEM_TESTS rows that match no test: " + ", ".join(stale)


def test_system_marker_selects_exactly_the_table():
    files = sorted({file for file, _, _ in SYSTEM_TESTS})
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0",
                          "--collect-only", "-q", "-m", "system",
                          *(f"tests/{f}" for f in files)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    got = {re.sub(r"\[.*\]$", "", line) for line in res.stdout.splitlines()
           if line.startswith("tests/")}
    want = {f"tests/{f}::{n}" for f in files for n in _test_functions(ROOT / "tests" / f)
            if system_reason(ROOT / "tests" / f, n) is not None}
    assert got == want
    assert len(want) >= len(SYSTEM_TESTS)
