#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-2-Clause
"""Generate the RoCEv2 engine as Verilog: ``python build.py --width 512 [--qps 16] [--top tx|engine]
[--out DIR]``.

A thin command line around :func:`roce_hw.generate.generate`: writes ``DIR/roce_tx.v`` (module
``roce_tx``, :class:`roce_hw.top.TxTop`) and ``DIR/roce_tx_ports.txt``, or with ``--top engine``
the whole engine (RX front end, connection manager, ARP; :class:`roce_hw.top.EngineTop`) as
``roce_engine.v``. Exit status 2, with a
message naming what is wrong, for impossible options or an unusable ``--out``; 1 for lint
findings.
"""

import argparse
import sys

__all__ = ["main"]


def main(argv=None):
    from roce_hw.config import DATA_WIDTHS, EngineConfig
    from roce_hw.generate import (LINT_OFF, TOPS, LintError, ToolMissing, check_module_name,
                                  generate)

    ap = argparse.ArgumentParser(prog="python build.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--width", type=int, default=512,
                    help=f"datapath width in bits: {', '.join(map(str, DATA_WIDTHS))}")
    ap.add_argument("--qps", type=int, default=16, help="number of queue pairs (1-16384)")
    ap.add_argument("--top", choices=TOPS, default="tx",
                    help="tx: the TX engine (module roce_tx); engine: the whole engine with "
                         "the RX front end, connection manager and ARP (module roce_engine)")
    ap.add_argument("--no-rx-other", action="store_true",
                    help="with --top engine: drop received frames that are not for the engine "
                         "instead of passing them out on m_axis_rx_other")
    ap.add_argument("--out", default=None,
                    help="output folder (created if missing; default build/<name>_<width>)")
    ap.add_argument("--name", default=None,
                    help="Verilog module name (a plain identifier, not a keyword; default "
                         "roce_tx or roce_engine)")
    ap.add_argument("--lint", action="store_true",
                    help="also lint with plain `verilator --lint-only -Wall`; the file switches "
                         "off " + ", ".join(LINT_OFF) + " (artefacts of generation)")
    ap.add_argument("--no-underrun", action="store_true",
                    help="put a store-and-forward frame FIFO after the engine, so that "
                         "m_axis_tx never pauses inside a frame (Xilinx CMAC)")
    ap.add_argument("--fifo-depth", type=int, default=None,
                    help="FIFO depth in beats with --no-underrun (default: twice the longest "
                         "frame); must hold the longest frame")
    ap.add_argument("--fifo-abort", choices=("drop", "pass"), default=None,
                    help="with --no-underrun: drop aborted frames in the FIFO, or pass them "
                         "with tuser (default drop)")
    args = ap.parse_args(argv)
    try:
        config = EngineConfig(data_width=args.width, n_qp=args.qps,
                              rx_other=not args.no_rx_other)
        name = args.name or {"tx": "roce_tx", "engine": "roce_engine"}[args.top]
        check_module_name(name)
        if not args.no_underrun and (args.fifo_depth is not None or args.fifo_abort):
            raise ValueError("--fifo-depth and --fifo-abort need --no-underrun")
        if args.top == "engine" and args.no_underrun:
            raise ValueError("--no-underrun is not available with --top engine yet")
        if args.top == "tx" and args.no_rx_other:
            raise ValueError("--no-rx-other needs --top engine")
    except (ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = args.out or f"build/{name}_{args.width}"
    try:
        generate(config, out, name=name, top=args.top, lint=args.lint,
                 no_underrun=args.no_underrun,
                 fifo_depth=args.fifo_depth, fifo_abort=args.fifo_abort or "drop", log=print)
    except ValueError as e:            # e.g. a FIFO too small for the longest frame
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ToolMissing as e:
        print(f"error: --lint: {e}", file=sys.stderr)
        return 2
    except OSError as e:               # --out unusable: read-only, a file, ...
        print(f"error: --out {out}: {e.strerror or e}", file=sys.stderr)
        return 2
    except LintError as e:
        print(f"error: lint findings:\n{e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
