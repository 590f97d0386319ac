# SPDX-License-Identifier: BSD-2-Clause
"""Verilog helpers for tests and tools: emit an Amaranth component, lint it with Verilator."""

import shutil
import subprocess
import tempfile
from pathlib import Path

from amaranth.back import verilog

__all__ = ["LINT_WAIVERS", "emit", "lint", "LintError"]

#: Warnings that Amaranth's output always triggers (TOOLCHAIN.md trap 4); anything else is real.
LINT_WAIVERS = ("-Wno-DECLFILENAME", "-Wno-WIDTH", "-Wno-UNUSEDSIGNAL")


class LintError(Exception):
    """Verilator reported a warning or error that is not waived."""


def emit(component, name):
    """Verilog text of ``component`` as module ``name`` (no source locations)."""
    return verilog.convert(component, name=name, emit_src=False)


def lint(text, top, *, timeout=600):
    """Run ``verilator --lint-only -Wall`` (with :data:`LINT_WAIVERS`) on Verilog ``text``;
    raise :class:`LintError` with Verilator's messages on any finding, or if Verilator takes
    longer than ``timeout`` seconds."""
    exe = shutil.which("verilator")
    if exe is None:
        raise FileNotFoundError("verilator is not installed (apt-get install verilator)")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{top}.v"
        path.write_text(text)
        try:
            res = subprocess.run([exe, "--lint-only", "-Wall", *LINT_WAIVERS, "--top-module",
                                  top, str(path)], capture_output=True, text=True, cwd=tmp,
                                 timeout=timeout)
        except subprocess.TimeoutExpired:
            raise LintError(f"verilator did not finish within {timeout} s") from None
    if res.returncode != 0 or "%Warning" in res.stderr or "%Error" in res.stderr:
        raise LintError(res.stderr.strip() or f"verilator exited {res.returncode}")
