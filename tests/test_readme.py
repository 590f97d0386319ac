# SPDX-License-Identifier: BSD-2-Clause
"""The README and docs/ stay true: the two opening commands are CI's, the Python example runs,
the block diagram is its script's output, every link resolves, every port of both Verilog tops is
documented (and nothing documented is missing), and the CM tables agree with proto and the CM
model."""

import importlib.util
import re

import pytest

from conftest import ROOT

__all__ = []

README = ROOT / "README.md"
DOCS = ROOT / "docs"
INTEGRATION = DOCS / "integration.md"
#: "at most about 200 lines" (issue 33)
README_MAX_LINES = 200
#: the block diagram must be on the first screen
FIRST_SCREEN_LINES = 40


def _read(path):
    return path.read_text()


def _code_blocks(text):
    return [b.strip() for b in re.findall(r"```(?:sh|bash)?\n(.*?)```", text, re.S)]


def test_ci_runs_the_readme_test_command():
    blocks = _code_blocks(_read(README))
    assert len(blocks) >= 2, "README must open with two commands (set up + main job, tests)"
    test_cmd = blocks[1].splitlines()[0].strip()
    ci = [l.strip() for l in (ROOT / ".ci" / "run").read_text().splitlines()
          if l.strip() and not l.strip().startswith("#")]
    assert ci[-1] == test_cmd, f"CI's last command {ci[-1]!r} != README's {test_cmd!r}"


def test_readme_main_command_installs_and_builds():
    main = _code_blocks(_read(README))[0]
    assert "pip install" in main and "build.py" in main


def test_readme_python_example_runs(tmp_path, monkeypatch):
    """The embedding example is executed as printed (in a temporary folder)."""
    blocks = re.findall(r"```python\n(.*?)```", _read(README), re.S)
    assert blocks and "from roce_hw import" in blocks[0]
    monkeypatch.chdir(tmp_path)
    scope = {}
    exec(compile(blocks[0], "README.md", "exec"), scope)
    assert (tmp_path / "build" / "roce_tx_512" / "roce_tx.v").exists()
    assert scope["top"].fifo_depth is not None


def test_readme_is_short():
    n = len(_read(README).splitlines())
    assert n <= README_MAX_LINES, f"README has {n} lines (at most {README_MAX_LINES})"


# -- the block diagram ---------------------------------------------------------------------------

def _diagram_module():
    spec = importlib.util.spec_from_file_location("docs_diagram", DOCS / "diagram.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_diagram_svg_is_the_scripts_output():
    """docs/engine.svg cannot go stale: it is exactly what docs/diagram.py writes."""
    assert (DOCS / "engine.svg").read_text() == _diagram_module().svg(), \
        "docs/engine.svg is out of date: run python docs/diagram.py"


def test_diagram_on_the_first_screen():
    head = "\n".join(_read(README).splitlines()[:FIRST_SCREEN_LINES])
    assert re.search(r"!\[[^\]]*\]\(docs/engine\.svg\)", head)


def test_diagram_names_the_blocks():
    svg = _diagram_module().svg()
    for block in ("MAC", "RX front end", "reply builder", "CM responder", "QP table", "WR mux",
                  "traffic generator", "TX datapath", "frame arbiter", "user logic"):
        assert f">{block}</text>" in svg, block


# -- links ---------------------------------------------------------------------------------------

def _anchors(text):
    """GitHub's heading anchors of a Markdown text."""
    out = set()
    for line in text.splitlines():
        m = re.match(r"#+\s+(.*)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(slug)
    return out


def _doc_files():
    return [README, ROOT / "CHANGELOG.md"] + sorted(DOCS.glob("*.md"))


@pytest.mark.parametrize("doc", _doc_files(), ids=lambda p: p.name)
def test_doc_links_resolve(doc):
    """Every relative link (file, and #anchor where given) of the README and docs/ exists."""
    text = _read(doc)
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert doc != README or links
    for link in links:
        if re.match(r"[a-z]+:", link):              # http:, https:, mailto:
            continue
        path, _, anchor = link.partition("#")
        target = (doc.parent / path).resolve() if path else doc
        assert target.exists(), f"{doc.name}: link to {link!r}: no such file"
        if anchor and target.suffix == ".md":
            assert anchor in _anchors(_read(target)), f"{doc.name}: no anchor {link!r}"


def test_readme_links_every_doc():
    text = _read(README)
    for doc in sorted(DOCS.glob("*.md")):
        assert f"](docs/{doc.name}" in text, f"README does not link docs/{doc.name}"
    assert "](CHANGELOG.md)" in text


# -- ports ---------------------------------------------------------------------------------------

def _tops():
    from roce_hw.config import EngineConfig
    from roce_hw.top import EngineTop, TxTop
    cfg = EngineConfig(data_width=64, n_qp=4)
    return {"roce_tx": set(TxTop(cfg).signature.members) | {"clk", "rst"},
            "roce_engine": set(EngineTop(cfg).signature.members) | {"clk", "rst"}}


def _tokens(text):
    """Names a document gives in backticks: ``a[7:0]`` -> ``a``, ``p_{a[3:0], b}`` -> ``p_a``,
    ``p_b``; ``p_*`` -> a prefix (second set)."""
    names, prefixes = set(), set()
    for tok in re.findall(r"`([^`]+)`", text):
        tok = tok.strip()
        m = re.fullmatch(r"([a-z_]*)\{([^}]*)\}", tok)
        if m:
            for item in m.group(2).split(","):
                item = re.sub(r"\[.*?\]", "", item).strip()
                names.add(item)
                names.add(m.group(1) + item)
            continue
        m = re.fullmatch(r"([a-z_]+)\*", tok)
        if m:
            prefixes.add(m.group(1))
            continue
        m = re.fullmatch(r"([a-z_][a-z0-9_]*)(\[[^\]]*\])?", tok)
        if m:
            names.add(m.group(1))
    return names, prefixes


def _section(text, start, end=None):
    text = text[text.index(start):]
    return text[:text.index(end)] if end else text


def _covered(port, names, prefixes, all_ports):
    """A port is documented by name, as a member of a ``p_{...}`` group, as ``p_*`` plus a
    documented rest (``counters_cm_*`` + ``bad_port``, ``s_resume_*`` + ``start_psn``, the QP
    context's ``ctx_`` fields), or as the ``valid``/``ready`` of a documented stream."""
    if port in names:
        return True
    for prefix in prefixes:
        rest = port[len(prefix):]
        if port.startswith(prefix) and (rest in names or f"ctx_{rest}" in names):
            return True
    for hs in ("valid", "ready"):
        if port.endswith(hs):
            stem = port[:-len(hs)]
            siblings = [p for p in all_ports if p.startswith(stem) and p != port
                        and not p.endswith(("valid", "ready"))]
            if siblings and all(_covered(p, names, prefixes, all_ports) for p in siblings):
                return True
    return False


def test_integration_guide_documents_every_port():
    """Every port of ``roce_tx`` and ``roce_engine`` is in the guide (a counter by its name in
    the counter list or the CM's rules)."""
    text = _read(INTEGRATION)
    names, prefixes = _tokens(_section(text, "## Clock, reset, streams"))
    for top, ports in _tops().items():
        missing = sorted(p for p in ports if not _covered(p, names, prefixes, ports))
        assert not missing, f"{top}: ports not in docs/integration.md: {missing}"


def test_integration_guide_names_only_real_ports():
    """Every port name the guide's port tables give exists on one of the tops."""
    text = _read(INTEGRATION)
    ports = set().union(*_tops().values())
    names, prefixes = _tokens(_section(text, "## Ports", "## The QP context"))
    for name in names | prefixes:
        if name.startswith(("s_", "m_", "counters_", "local_")) or name in ("clk", "rst"):
            assert any(p == name or p.startswith(name) for p in ports), name


def test_readme_port_summary_names_real_ports():
    text = _read(README)
    ports = set().union(*_tops().values())
    table = _section(text, "| ports | dir | what |", "\n\n")
    names, prefixes = _tokens(table)
    assert {"s_axis_rx_", "m_axis_tx_", "s_wr_", "s_resume_", "s_qp_mgmt_req_"} <= prefixes
    for name in names | prefixes:
        if name.startswith(("s_", "m_", "counters_", "local_")):
            assert any(p == name or p.startswith(name) for p in ports), name


def test_integration_guide_lists_the_whole_qp_context():
    """Every QP context field, with its width, is in the guide (no "...")."""
    from amaranth import Shape

    from roce_hw.layouts import QP_CONTEXT
    text = _read(INTEGRATION)
    for name, fld in QP_CONTEXT:
        row = re.search(rf"^\| `ctx_{name}` \| (\d+) \|", text, re.M)
        assert row, f"ctx_{name} missing from the QP context table"
        assert int(row.group(1)) == Shape.cast(fld.shape).width, name
    assert "..." not in _section(text, "## Ports", "## Bring-up")


# -- the CM datagram -----------------------------------------------------------------------------

def _table_rows(text, header):
    rows = []
    for line in _section(text, header).splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])])
    return rows


def test_cm_datagram_table_matches_proto():
    """Byte ranges and sizes of the guide's datagram table are proto.CM_DATAGRAM's."""
    from roce_hw import proto
    rows = _table_rows(_read(INTEGRATION), "| byte | size | field |")
    assert len(rows) == 16
    for span, size, field in rows:
        first, _, last = span.partition("-")
        first, last = int(first), int(last or first)
        assert last - first + 1 == int(size), span
        for name in re.findall(r"`([a-z_]+)`", field.split(":")[0])[:1]:
            if name in proto.CM_DATAGRAM:
                assert proto.CM_DATAGRAM.byte_span(name) == range(first, last + 1), name
    flags = [r for r in rows if r[0] == "51"][0][2]
    for bit, name in ((0, "tx_valid"), (1, "tx_start"), (2, "tx_immediate"), (3, "tx_type")):
        assert f"bit {bit} `{name}`" in flags
        assert proto.CM_DATAGRAM.offset(name) == (51, 7 - bit), name


def test_cm_request_and_ack_codes_match_proto():
    from roce_hw.proto import CmAck, CmReq
    text = _read(INTEGRATION)
    for code, name, _ in _table_rows(text, "| code | request | what the engine does |"):
        if code.isdigit():
            assert CmReq[name] == int(code), name
    for name, code in re.findall(r"(ACK|NO_QP|NAK|ERROR) (\d)\b", _section(text, "ack codes")):
        assert CmAck[name] == int(code), name


def test_open_defaults_match_the_cm_model():
    """The guide's table of what an OPEN writes agrees with the CM model's row."""
    from roce_hw.model.cm import open_row
    row = open_row(3, remote_qpn=1, remote_mac=2, remote_ip=3, next_psn=4, remote_va=5,
                   r_key=6, rq_psn=7)
    checked = set()
    for fields, values in _table_rows(_read(INTEGRATION), "| field | value |"):
        names = re.findall(r"`([a-z_]+)`", fields)
        nums = values.split(", ")
        if names and len(names) == len(nums) and all(re.fullmatch(r"(0x)?[0-9A-F]+", n)
                                                      for n in nums):
            for name, num in zip(names, nums):
                assert row[name] == int(num, 0), name
                checked.add(name)
        elif names == ["state"]:
            assert f"({row['state']})" in values
            checked.add("state")
        elif names == ["pmtu"]:
            assert f": {row['pmtu']} (" in values
            checked.add("pmtu")
        elif names == ["udp_sport"]:
            assert values == "0xC000 \\| (engine QPN & 0x3FFF)"
            assert row["udp_sport"] == 0xC000 | ((256 + 3) & 0x3FFF)
            checked.add("udp_sport")
    assert checked >= {"state", "pmtu", "udp_sport", "dscp", "ecn", "p_key", "migreq",
                       "retry_cnt", "rnr_retry", "timeout", "min_rnr_timer"}


# -- facts an integrator needs -------------------------------------------------------------------

def test_integration_facts():
    text = _read(INTEGRATION)
    assert "CMAC" in text and "--no-underrun" in text and "frame_fifo.py" in text
    assert "length - start_packet *" in text and "m_qp_mgmt_rsp" in text
    readme = _read(README)
    assert "BSD-2-Clause" in readme and (ROOT / "LICENSE").exists()
    assert "../shared/golden" not in readme      # the captures are in the repository
    assert "tests/captures/" in readme


def test_status_table_one_line_per_feature():
    rows = _table_rows(_read(README), "| feature | state |")
    assert len(rows) >= 10
    states = " ".join(r[1] for r in rows)
    for issue in ("issue 35", "issue 36"):         # the open ones
        assert issue in states
    assert all(len(r) == 2 and r[1] for r in rows)


# -- the Verilator configuration -----------------------------------------------------------------

@pytest.mark.parametrize("top", ["roce_tx", "roce_engine"])
def test_vlt_makes_every_port_public(top):
    """The .vlt that build.py writes names the top module and makes exactly its ports public:
    every port of the top (the README's port tables are checked against the same set), nothing
    else."""
    from roce_hw.config import EngineConfig
    from roce_hw.generate import vlt_text
    from roce_hw.top import EngineTop, TxTop
    cfg = EngineConfig(data_width=64, n_qp=4)
    built = {"roce_tx": TxTop, "roce_engine": EngineTop}[top](cfg)
    text = vlt_text(built, top)
    assert text.startswith("`verilator_config\n")
    rules = re.findall(r'^public_flat_rw -module "([^"]+)" -var "([^"]+)"$', text, re.M)
    assert {module for module, _ in rules} == {top}
    assert sorted(var for _, var in rules) == sorted(_tops()[top])
