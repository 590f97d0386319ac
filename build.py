#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-2-Clause
"""Generate the RoCEv2 TX engine as Verilog: ``python build.py --width 512 [--qps 16] [--out DIR]``.

Writes ``DIR/roce_tx.v`` (one module ``roce_tx`` with flat AXI-Stream-style ports, see
:mod:`roce_hw.lib.flat`) and ``DIR/roce_tx_ports.txt`` (the port list with directions and widths).
Exit status 2, with a message naming the valid choices, for impossible options.
"""

import argparse
import sys
import time
from pathlib import Path

__all__ = ["generate", "main", "PORT_NAMES"]

#: Names of the engine's streams in the flat Verilog ports (s_axis_payload_*, m_axis_tx_*).
PORT_NAMES = {"i": "payload", "o": "tx"}


def generate(config, out_dir, *, name="roce_tx", lint=False, log=print):
    """Emit the engine built from ``config`` into ``out_dir``; returns the Verilog path."""
    from amaranth import Shape
    from amaranth.back import verilog
    from amaranth.lib.wiring import In

    from roce_hw.lib.flat import FlatTop
    from roce_hw.tx.engine import TxEngine

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    log(f"elaborating {name}: {config.data_width}-bit datapath, {config.n_qp} QPs ...")
    top = FlatTop(TxEngine(config), rename=PORT_NAMES)
    text = verilog.convert(top, name=name, emit_src=False)
    vpath = out / f"{name}.v"
    vpath.write_text(text)
    log(f"wrote {vpath} ({len(text.splitlines())} lines, {time.monotonic() - t0:.1f} s)")
    ports = out / f"{name}_ports.txt"
    lines = [f"# ports of module {name} ({config.data_width}-bit, {config.n_qp} QPs)"]
    for pname, member in top.signature.members.items():
        width = Shape.cast(member.shape).width
        direction = "input " if member.flow == In else "output"
        lines.append(f"{direction} [{width - 1}:0] {pname}" if width > 1 else f"{direction} {pname}")
    lines += ["input  clk", "input  rst"]
    ports.write_text("\n".join(lines) + "\n")
    log(f"wrote {ports}")
    if lint:
        from sim.verilog import lint as run_lint
        log("linting with verilator -Wall ...")
        run_lint(text, name)
        log("lint clean")
    return vpath


def main(argv=None):
    from roce_hw.config import DATA_WIDTHS, EngineConfig

    ap = argparse.ArgumentParser(prog="python build.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=512,
                    help=f"datapath width in bits: {', '.join(map(str, DATA_WIDTHS))} (default 512)")
    ap.add_argument("--qps", type=int, default=16, help="number of queue pairs (default 16)")
    ap.add_argument("--out", default=None, help="output folder (default build/roce_tx_<width>)")
    ap.add_argument("--name", default="roce_tx", help="Verilog module name (default roce_tx)")
    ap.add_argument("--lint", action="store_true", help="also lint the output with Verilator")
    args = ap.parse_args(argv)
    try:
        config = EngineConfig(data_width=args.width, n_qp=args.qps)
    except (ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not args.name.isidentifier():
        print(f"error: --name {args.name!r} is not a valid Verilog identifier", file=sys.stderr)
        return 2
    out = args.out or f"build/roce_tx_{args.width}"
    try:
        generate(config, out, name=args.name, lint=args.lint)
    except Exception as e:   # lint findings and file-system errors: say what failed
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
