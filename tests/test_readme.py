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


def _readme():
    return (ROOT / "README.md").read_text()


def test_readme_python_example_runs(tmp_path, monkeypatch):
    """The embedding example is executed as printed (in a temporary folder)."""
    blocks = re.findall(r"```python\n(.*?)```", _readme(), re.S)
    assert blocks and "from roce_hw import" in blocks[0]
    monkeypatch.chdir(tmp_path)
    scope = {}
    exec(compile(blocks[0], "README.md", "exec"), scope)
    assert (tmp_path / "build" / "roce_tx_512" / "roce_tx.v").exists()
    assert scope["top"].fifo_depth is not None


def test_readme_lists_the_whole_qp_context():
    """Every QP context field, with its width, is in the README (no "...")."""
    from amaranth import Shape

    from roce_hw.layouts import QP_CONTEXT
    text = _readme()
    for name, fld in QP_CONTEXT:
        row = re.search(rf"^\| `ctx_{name}` \| (\d+) \|", text, re.M)
        assert row, f"ctx_{name} missing from the README's QP context table"
        assert int(row.group(1)) == Shape.cast(fld.shape).width, name
    section = text[text.index("## Using the generated Verilog"):text.index("## iCRC")]
    assert "..." not in section.replace("`sim.analyze ... | head`", "")


def test_readme_port_groups_exist():
    """Every port named in the README's port table exists on the emitted top."""
    from roce_hw.config import EngineConfig
    from roce_hw.top import TxTop
    ports = set(TxTop(EngineConfig(data_width=64, n_qp=4)).signature.members) | {"clk", "rst"}
    section = _readme()[_readme().index("| ports | direction |"):]
    section = section[:section.index("\n\n")]
    for cell in re.findall(r"^\| (.*?) \| (?:in|out) \|", section, re.M):
        for name in re.findall(r"`([a-z_]+)(?:\[[^\]]*\])?`", cell):
            if name.startswith(("s_", "m_")) or name in ("local_mac", "local_ip", "frames",
                                                         "frames_aborted", "wrs_refused",
                                                         "status_dropped"):
                assert any(p == name or p.startswith(name) for p in ports), name


def test_readme_integration_facts():
    text = _readme()
    assert "CMAC" in text and "--no-underrun" in text and "frame_fifo.py" in text
    assert "low_latency" in text
    assert "BSD-2-Clause" in text and (ROOT / "LICENSE").exists()
    assert "../shared/golden" not in text      # the captures are in the repository
    assert "tests/captures/" in text
