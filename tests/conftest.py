# SPDX-License-Identifier: BSD-2-Clause
"""Test options and tiers, the data the tests read (all inside the repository) and the
missing-tool policy.

Tiers (docs/testing.md):

* ``python3 -m pytest -n 2 -q`` (the README's and CI's command): everything but ``slow``;
* ``python3 -m pytest -n 2 -q -m "not system"``: the quick tier, for iteration;
* ``python3 -m pytest -n 2 -q -m system``: only the tests that boot QEMU, synthesise with
  Yosys/nextpnr or build a wheel or virtualenv (:data:`SYSTEM_TESTS` marks them here, centrally);
* ``--slow`` adds the long simulations (all widths, more seeds) to any of these.

Data: the real soft-RoCE captures are in ``tests/captures/`` (see its README) and the parts of the
protocol reference the tests check against are in ``tests/reference/PROTOCOL_excerpt.md``; a
clone needs nothing outside the repository. ``../shared`` beside the clone is optional extra
material (only :func:`shared_dir` users look at it, and they skip without it).

Missing-tool policy (external programs: ``verilator``, ``iverilog``/``vvp``, ``tshark``):

* in CI (environment variable ``CI`` set to anything but ``""``, ``0`` or ``false``) nothing
  skips for a missing tool: a test that needs one **fails**, naming the package to install;
* on a user's machine such a test is skipped, and all those skips are reported as **one**
  summary line (``SKIPPED [N] ... missing tools: ...; install them with: sudo apt-get install
  ...``).

A test declares its tools with ``@pytest.mark.tools("verilator")``; a test that finds out at
run time -- :class:`roce_hw.generate.ToolMissing` (raised by the lint and the co-simulation), a
``FileNotFoundError`` for one of the tools, or a ``pytest.skip("<tool> not installed")`` -- is
handled the same way.
"""

import fnmatch
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

__all__ = ["ROOT", "GOLDEN_DIR", "PROTOCOL_EXCERPT", "SHARED_DIR", "TOOL_PACKAGES",
           "SYSTEM_TESTS", "system_reason", "in_ci", "missing_tools", "protocol_md",
           "golden_dir", "shared_dir"]

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: The real soft-RoCE captures the tests use (copied into the repository; see its README.md).
GOLDEN_DIR = ROOT / "tests" / "captures"
#: Verbatim excerpt of the protocol reference that the tests check constants and oracles against.
PROTOCOL_EXCERPT = ROOT / "tests" / "reference" / "PROTOCOL_excerpt.md"
#: Optional extra material beside the clone (development setup only).
SHARED_DIR = ROOT.parent / "shared"

#: External programs the tests use -> the Debian/Ubuntu package that provides each.
TOOL_PACKAGES = {"verilator": "verilator", "iverilog": "iverilog", "vvp": "iverilog",
                 "tshark": "tshark", "g++": "g++", "make": "make"}

#: The ``system`` tier: tests that spend their time outside Python on a heavy job -- boot the
#: QEMU soft-RoCE guest, synthesise (Yosys) or place and route (nextpnr) a design, build a wheel
#: or a virtualenv. Rows: file in tests/, fnmatch pattern of the test *function* name (every
#: parametrisation of it), why. Marked here rather than in the files, so that the tier has one
#: list; tests/test_tool_policy.py checks that every row names tests that exist and that ``-m
#: system`` selects exactly these. Verilator lint and the Icarus/Verilator co-simulations are
#: not here: they take seconds and belong to the quick tier.
SYSTEM_TESTS = [
    ("test_rxe.py", "test_rxe_*", "boots the QEMU guest with Linux rxe (vm fixture)"),
    ("test_rxe.py", "test_cli_end_to_end", "boots the QEMU guest (python -m sim.rxe)"),
    ("test_e2e.py", "test_e2e_*", "boots the QEMU guest with Linux rxe (vm fixture)"),
    ("test_e2e.py", "test_cli", "boots the QEMU guest (python -m sim.e2e)"),
    ("test_timing.py", "test_*_longest_path*", "synthesises the whole engine or the frame FIFO (Yosys)"),
    ("test_bench_synth.py", "test_register_names_ecp5", "synthesises a design (Yosys synth_ecp5)"),
    ("test_bench_synth.py", "test_ecp5_several_seeds",
     "Yosys and nextpnr-ecp5 place and route, several seeds (python -m bench.synth)"),
    ("test_bench_synth.py", "test_xcup_run_smallest",
     "synthesises a block (python -m bench.synth, Yosys synth_xilinx)"),
    ("test_ecp5_1g.py", "test_versa_bitstream",
     "Yosys, nextpnr-ecp5 and ecppack (yowasp) to the Versa ECP5 board's bitstream"),
    ("test_header.py", "test_*_logic_depth", "synthesises a header block (Yosys synth_xilinx)"),
    ("test_header.py", "test_*_size_*", "synthesises a header block (Yosys synth_xilinx)"),
    ("test_packaging.py", "test_wheel_holds_only_roce_hw", "builds the wheel (pip wheel)"),
    ("test_packaging.py", "test_editable_install_*",
     "creates a virtualenv and installs the checkout into it (pip install -e)"),
]


def system_reason(path, name):
    """Why the test function ``name`` of ``path`` (a file in tests/) is in the ``system`` tier,
    or None."""
    for file, pattern, reason in SYSTEM_TESTS:
        if Path(path).name == file and Path(path).parent == ROOT / "tests" and \
                fnmatch.fnmatchcase(name, pattern):
            return reason
    return None


_SKIP_RE = re.compile(r"\b(" + "|".join(TOOL_PACKAGES) + r")\b.*not (installed|found)")


def in_ci():
    """True when running in CI (``CI`` set, as GitHub Actions, GitLab and most others do)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing_tools():
    """Tools of :data:`TOOL_PACKAGES` that are not on ``PATH``, sorted."""
    return sorted(t for t in TOOL_PACKAGES if shutil.which(t) is None)


def _missing_reason():
    tools = missing_tools()
    pkgs = sorted({TOOL_PACKAGES[t] for t in tools})
    return (f"missing tools: {', '.join(tools)}; install them with: sudo apt-get install "
            f"{' '.join(pkgs)}")


def _ci_failure(tool):
    return (f"CI must have every tool, but {tool} is missing "
            f"(apt-get install {TOOL_PACKAGES.get(tool, tool)}); nothing skips in CI")


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run tests marked slow (every width, more seeds)")


def pytest_configure(config):
    config.addinivalue_line("markers", "tools(*names): external programs the test needs "
                                       "(verilator, iverilog, vvp, tshark)")
    config.addinivalue_line("markers", "system(reason): boots QEMU, synthesises or places and "
                                       "routes, or builds a wheel/virtualenv (set from "
                                       "conftest.SYSTEM_TESTS); deselect with -m 'not system'")


# tryfirst: the markers must be on the items before pytest's own hook deselects by -m / -k
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        reason = system_reason(item.path, getattr(item, "originalname", item.name))
        if reason is not None:
            item.add_marker(pytest.mark.system(reason))
    if config.getoption("--slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def _skip_for_tools():
    """Skip (user's machine) with the one reason shared by every missing-tool skip: raised from
    this line, so pytest's summary folds all of them into one line."""
    pytest.skip(_missing_reason())


def pytest_runtest_setup(item):
    for mark in item.iter_markers("tools"):
        for tool in mark.args:
            if shutil.which(tool) is None:
                if in_ci():
                    pytest.fail(_ci_failure(tool), pytrace=False)
                _skip_for_tools()


def _tool_of(excinfo):
    """The missing tool an exception is about, or None."""
    if excinfo is None:
        return None
    exc = excinfo.value
    tool = getattr(exc, "tool", None)
    if tool in TOOL_PACKAGES and getattr(exc, "is_missing_tool", False):
        return tool
    if isinstance(exc, FileNotFoundError) and exc.filename is not None:
        name = os.path.basename(str(exc.filename))
        if name in TOOL_PACKAGES:
            return name
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and call.excinfo is not None:
        tool = _tool_of(call.excinfo)
        if tool is not None and shutil.which(tool) is None and not in_ci():
            try:
                _skip_for_tools()
            except pytest.skip.Exception:
                excinfo = pytest.ExceptionInfo.from_current()
            rep.outcome = "skipped"
            crash = excinfo._getreprcrash()
            rep.longrepr = (str(crash.path), crash.lineno, crash.message)
    elif rep.skipped and isinstance(rep.longrepr, tuple):
        reason = rep.longrepr[2]
        m = _SKIP_RE.search(reason)
        if m is not None and shutil.which(m.group(1)) is None:
            if in_ci():
                rep.outcome = "failed"
                rep.longrepr = _ci_failure(m.group(1))
            else:
                try:
                    _skip_for_tools()
                except pytest.skip.Exception:
                    crash = pytest.ExceptionInfo.from_current()._getreprcrash()
                    rep.longrepr = (str(crash.path), crash.lineno, crash.message)


@pytest.fixture(scope="session")
def golden_dir():
    """``tests/captures``: the real soft-RoCE captures (part of the repository)."""
    if not GOLDEN_DIR.is_dir():
        pytest.fail(f"captures not found at {GOLDEN_DIR} (they are part of the repository)")
    return GOLDEN_DIR


@pytest.fixture(scope="session")
def protocol_md():
    """Text of ``tests/reference/PROTOCOL_excerpt.md``: the verbatim parts of the protocol
    reference (PROTOCOL.md sections 2 and 5.5) that tests check against."""
    return PROTOCOL_EXCERPT.read_text()


@pytest.fixture(scope="session")
def shared_dir():
    """``../shared`` beside the clone (optional extra material); skips when absent."""
    if not SHARED_DIR.is_dir():
        pytest.skip(f"optional {SHARED_DIR} is not present (not part of a clone)")
    return SHARED_DIR
