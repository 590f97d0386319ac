# SPDX-License-Identifier: BSD-2-Clause
"""The README's two opening commands stay true: CI runs exactly its test command."""

import re

from conftest import ROOT

__all__ = []


def _code_blocks(text):
    return [b.strip() for b in re.findall(r"```(?:sh|bash)?\n(.*?)```", text, re.S)]


def test_ci_runs_the_readme_test_command():
    blocks = _code_blocks((ROOT / "README.md").read_text())
    assert len(blocks) >= 2, "README must open with two commands (set up + main job, tests)"
    test_cmd = blocks[1].splitlines()[0].strip()
    ci = [l.strip() for l in (ROOT / ".ci" / "run").read_text().splitlines()
          if l.strip() and not l.strip().startswith("#")]
    assert ci[-1] == test_cmd, f"CI's last command {ci[-1]!r} != README's {test_cmd!r}"


def test_readme_main_command_installs_and_builds():
    blocks = _code_blocks((ROOT / "README.md").read_text())
    main = blocks[0]
    assert "pip install" in main and "build.py" in main
