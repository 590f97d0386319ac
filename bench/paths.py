# SPDX-License-Identifier: BSD-2-Clause
"""Logic depth of every register-to-register path of a synthesised netlist (Yosys JSON).

Yosys' ``ltp`` names one longest path only. :func:`path_report` counts, for every endpoint (a
flip-flop, shift-register or RAM input, or an output port), the most combinational cells on a
path into it from a start point (a flip-flop, shift-register or RAM output, or an input port),
the way ``ltp -noff`` counts them after the FF, SRL, RAM and I/O-buffer cells are deleted
(TOOLCHAIN.md trap 3): every other cell (LUT, CARRY, MUXF, INV...) is one level. So a regression
points at the registers where it starts and ends.

With ``weights`` it sums a weight per cell type instead (:data:`ECP5_LUT4_WEIGHTS`: *LUT4
levels*, where the wide-function multiplexers and the carry chain count for little, since they
sit in the LUT's slice or on dedicated wires and add no routing hop). Over eleven netlists of
the TX engine, their median ECP5 Fmax fell with it on average, with a scatter of up to 5 MHz
(docs/ecp5-timing.md, fourteenth round).
"""

import bisect
import re
import sys

sys.setrecursionlimit(100000)

__all__ = ["SEQUENTIAL", "ECP5_LUT4_WEIGHTS", "register_names", "innermost_block",
           "path_report", "base_name", "format_paths"]

#: Cell types whose outputs start paths and whose inputs end them (Xilinx and ECP5 mapping).
SEQUENTIAL = re.compile(r"^(FD\w*|SRL\w*|RAM\w*|URAM\w*|TRELLIS_FF|TRELLIS_DPR16X4|DP16KD|"
                        r"PDPW16KD|IBUF|OBUF|BUFG\w*|\$scopeinfo)$")

#: :func:`path_report` weights for ECP5 netlists (LUT4 levels): a LUT4 is a level with a routing
#: hop in front of it; a PFUMX or L6MUX21 combines LUTs of its own slice (about a quarter of a
#: LUT and its hop); a CCU2C (2 bits of carry chain) an eighth. Other cells weigh nothing.
ECP5_LUT4_WEIGHTS = {"LUT4": 1.0, "PFUMX": 0.25, "L6MUX21": 0.25, "CCU2C": 0.125}


def _names(module):
    """bit -> the most readable net name carrying it."""
    best = {}
    for name, net in module["netnames"].items():
        hidden = net.get("hide_name", 0) or name.startswith("$")
        for i, bit in enumerate(net["bits"]):
            if isinstance(bit, str):
                continue
            label = f"{name}[{i}]" if len(net["bits"]) > 1 else name
            key = (hidden, len(name))
            if bit not in best or key < best[bit][0]:
                best[bit] = (key, label)
    return {bit: label for bit, (_, label) in best.items()}


def _top_module(netlist, top=None):
    """The module of a Yosys netlist to analyse: ``top``, else the one marked top, else the
    one with the most cells."""
    mods = netlist["modules"]
    if top is None:
        marked = [k for k, v in mods.items() if str(v.get("attributes", {}).get("top", "0"))
                  .strip("0") != ""]
        tops = marked or [k for k, v in mods.items() if v.get("cells")]
        top = max(tops, key=lambda k: len(mods[k]["cells"]))
    return mods[top]


#: The register a Verilog statement assigns: ``name <=`` or ``name[index] <=`` (plain or
#: escaped identifier).
_ASSIGNED = re.compile(r"(\\\S+|[A-Za-z_][\w$]*)\s*(?:\[[^\]]*\]\s*)*<=")


def register_names(netlist, verilog, verilog_file, design, top=None):
    """``{cell: "block.register"}``: where each sequential cell of a flattened Yosys netlist
    was written in the design, for naming path ends.

    Yosys names a flip-flop after one of the nets on its output, and after flattening that is
    often a name the register has in *another* block (a port it drives, or a top-level wire):
    the segmenter's descriptor register was reported as ``cmd__payload.last_msg``. The cell's
    ``src`` attribute points at the statement of the emitted Verilog (``verilog``, read from
    ``verilog_file``) that made it; the module around that statement is its block (Amaranth
    names a submodule's module ``design.path``), the statement's target its register. Cells
    whose ``src`` does not point there (registers Yosys rebuilt from memory read ports, RAM
    slices) get their output net's name with the deepest block prefix (see
    :func:`_deepest_alias`), else their cell name."""
    mod = _top_module(netlist, top)
    lines = verilog.splitlines()
    starts, blocks = [], []
    for k, text in enumerate(lines, 1):
        mm = re.match(r"module \\?([^\s(]+)", text)
        if mm:
            starts.append(k)
            name = mm.group(1)
            blocks.append(name[len(design) + 1:] if name.startswith(design + ".") else "")
    aliases = {}
    for name, net in mod["netnames"].items():
        if net.get("hide_name", 0) or name.startswith("$"):
            continue
        for bit in net["bits"]:
            if not isinstance(bit, str):
                aliases.setdefault(bit, []).append(name)
    module_blocks = set(blocks)
    src_re = re.compile(re.escape(verilog_file) + r":(\d+)\.\d+-(\d+)\.")
    out = {}
    for cname, cell in mod["cells"].items():
        if not SEQUENTIAL.match(cell["type"]) or cell["type"] == "$scopeinfo":
            continue
        found = None
        for loc in str(cell.get("attributes", {}).get("src", "")).split("|"):
            mm = src_re.match(loc)
            if not mm:
                continue
            first, last = int(mm.group(1)), int(mm.group(2))
            for text in lines[first - 1:last]:
                target = _ASSIGNED.search(text)
                if target:
                    k = bisect.bisect_right(starts, first) - 1
                    block = blocks[k] if k >= 0 else ""
                    reg = target.group(1).lstrip("\\")
                    found = f"{block}.{reg}" if block else reg
                    break
            if found:
                break
        if found is None:
            outs = [b for pin, bits in cell["connections"].items()
                    if cell["port_directions"].get(pin) == "output" for b in bits
                    if not isinstance(b, str)]
            found = _deepest_alias(aliases.get(outs[0], []) if outs else [], module_blocks)
        out[cname] = found or cname
    return out


def innermost_block(name, blocks):
    """The innermost of ``blocks`` (dotted submodule paths) that a dotted register ``name``
    lies in, or None."""
    parts = name.split(".")
    for k in range(len(parts) - 1, 0, -1):
        if ".".join(parts[:k]) in blocks:
            return ".".join(parts[:k])
    return None


def _deepest_alias(names, blocks):
    """Of a net's ``names``, the one in the deepest block of ``blocks``
    (:func:`innermost_block`; ties: the shortest name); None if there are none."""
    def depth(name):
        block = innermost_block(name, blocks)
        return block.count(".") + 1 if block else 0
    return min(names, key=lambda n: (-depth(n), len(n), n)) if names else None


def path_report(netlist, top=None, names_of=None, weights=None, output_ports=True):
    """``[(depth, start, end, cells)]`` for every endpoint, deepest first (``cells``: the cell
    types of the path, last first).

    ``netlist`` is Yosys' ``write_json`` output (a dict); ``top`` the module (the only one
    with cells, by default). ``start``/``end`` are net names: the register (or port) a deepest
    path into the endpoint starts at, and the endpoint's register (its output net) or port;
    with ``names_of`` (:func:`register_names`), a register is named by its cell's entry there
    instead. With ``weights`` (``{cell type: weight}``, e.g. :data:`ECP5_LUT4_WEIGHTS`), a
    path's depth is the sum of its cells' weights (0 for a type not listed), a float. With
    ``output_ports=False`` only registers end paths (nextpnr's out-of-context Fmax times no
    path into an output port).
    """
    mod = _top_module(netlist, top)
    names = _names(mod)
    if names_of:
        # a register's output bits are named by where the register was written
        for cname, cell in mod["cells"].items():
            if cname in names_of:
                for pin, bits in cell["connections"].items():
                    if cell["port_directions"].get(pin) == "output":
                        for b in bits:
                            if not isinstance(b, str):
                                names[b] = names_of[cname]
    driver = {}            # bit -> (cell name or None for a port/constant, comb?)
    for pname, port in mod["ports"].items():
        if port["direction"] == "input":
            for b in port["bits"]:
                driver[b] = None
    comb_inputs = {}       # comb cell -> list of input bits
    for cname, cell in mod["cells"].items():
        seq = bool(SEQUENTIAL.match(cell["type"]))
        ins = []
        for pin, bits in cell["connections"].items():
            direction = cell["port_directions"].get(pin, "input")
            for b in bits:
                if isinstance(b, str):
                    continue
                if direction == "output":
                    driver[b] = None if seq else cname
                else:
                    ins.append(b)
        if not seq:
            comb_inputs[cname] = ins
    depth_of_cell = {}
    start_of_cell = {}

    visiting = set()
    prev_of_cell = {}

    def cell_depth(c):
        if c in depth_of_cell:
            return depth_of_cell[c], start_of_cell[c]
        if c in visiting:
            raise RuntimeError(f"combinational loop through {c}")
        visiting.add(c)
        best, start, via = 0, None, None
        for x in comb_inputs[c]:
            d, s = bit_depth(x)
            if start is None or d > best:
                best, start, via = d, s, driver.get(x)
        visiting.discard(c)
        weight = 1 if weights is None else weights.get(mod["cells"][c]["type"], 0.0)
        depth_of_cell[c], start_of_cell[c] = best + weight, start or "constant"
        prev_of_cell[c] = via
        return depth_of_cell[c], start_of_cell[c]

    def bit_depth(b):
        cname = driver.get(b)
        if cname is None:
            return 0, names.get(b, str(b))
        return cell_depth(cname)

    report = {}
    for cname, cell in mod["cells"].items():
        if not SEQUENTIAL.match(cell["type"]) or cell["type"] == "$scopeinfo":
            continue
        outs = [b for pin, bits in cell["connections"].items()
                if cell["port_directions"].get(pin) == "output" for b in bits
                if not isinstance(b, str)]
        end = names.get(outs[0], cname) if outs else cname
        for pin, bits in cell["connections"].items():
            if cell["port_directions"].get(pin) == "output":
                continue
            for b in bits:
                if isinstance(b, str):
                    continue
                d, s = bit_depth(b)
                if d and (end not in report or d > report[end][0]):
                    report[end] = (d, s, driver.get(b))
    for pname, port in mod["ports"].items():
        if output_ports and port["direction"] == "output":
            for i, b in enumerate(port["bits"]):
                if isinstance(b, str):
                    continue
                d, s = bit_depth(b)
                end = f"{pname}[{i}]"
                if d and (end not in report or d > report[end][0]):
                    report[end] = (d, s, driver.get(b))

    def trace(c):
        cells = []
        while c is not None:
            cells.append(mod["cells"][c]["type"])
            c = prev_of_cell.get(c)
        return " <- ".join(cells)

    rows = [(d, s, e, trace(c)) for e, (d, s, c) in report.items()]
    rows.sort(key=lambda r: (-r[0], r[2]))
    return rows


def base_name(name):
    """``name`` without a trailing bit index (``"d[12]"`` -> ``"d"``)."""
    return re.sub(r"\[\d+\]$", "", name)


def format_paths(rows, limit=None, min_depth=0, verbose=False):
    """Text table of :func:`path_report` rows, one line per (start, end) register pair."""
    seen = {}
    for d, s, e, cells in rows:
        if d < min_depth:
            continue
        key = (base_name(s), base_name(e))
        if key not in seen:
            seen[key] = (d, cells)
    lines = [(f"{d:3d}" if isinstance(d, int) else f"{d:5.2f}") + f"  {s} -> {e}"
             + (f"   [{cells}]" if verbose else "")
             for (s, e), (d, cells) in sorted(seen.items(), key=lambda kv: -kv[1][0])]
    return "\n".join(lines[:limit] if limit else lines)


if __name__ == "__main__":
    import json
    rows = path_report(json.load(open(sys.argv[1])))
    print(format_paths(rows, limit=int(sys.argv[2]) if len(sys.argv) > 2 else 40, verbose=True))
