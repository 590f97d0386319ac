#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-2-Clause
"""Generate the RoCEv2 engine as Verilog, or a board build: ``python build.py --width 512
[--qps 16] [--top engine|tx] [--out DIR]``, ``python build.py --board NAME [--out DIR]``,
``python build.py --list-boards``.

A thin command line around :func:`roce_hw.generate.generate` and the board registry
(:mod:`platforms`). Without ``--board`` it writes ``DIR/roce_engine.v`` (module
``roce_engine``: the whole engine, :class:`roce_hw.top.EngineTop`; ``--top tx`` gives the TX
engine alone, ``roce_tx.v``), its port list, a port and parameter summary
(``<name>_summary.md`` and ``.json``) and a Verilator ``.vlt``. With ``--board`` it validates
the options against the board and writes the board's build plan (and with ``--bitstream``,
where the tools are open, the bitstream). Exit status 2, with an ``error:`` line naming what is
wrong and the valid choices, for an unknown board, a width the board cannot carry, an
impossible value or an unusable ``--out``; 1 for lint findings.
"""

import argparse
import ipaddress
import re
import sys

__all__ = ["main", "parse_mac", "parse_ip", "list_boards"]

#: A locally administered unicast address and a private IPv4 address, as the host tool's
#: examples use (``roce-host open --engine-ip 10.0.0.1``).
DEFAULT_MAC = "02:00:00:00:00:01"
DEFAULT_IP = "10.0.0.1"


def parse_mac(text):
    """``"02:00:00:00:00:01"`` (``:`` or ``-`` separated) -> int; ``ValueError`` unless it is
    six hex octets of a unicast address."""
    if not re.fullmatch(r"[0-9A-Fa-f]{2}([:-][0-9A-Fa-f]{2}){5}", text or ""):
        raise ValueError(f"--mac {text!r} is not a MAC address (six hex octets, e.g. "
                         f"{DEFAULT_MAC})")
    value = int(re.sub(r"[:-]", "", text), 16)
    if value >> 40 & 1:
        raise ValueError(f"--mac {text} is a multicast address (bit 0 of the first octet "
                         f"set); use a unicast one, e.g. {DEFAULT_MAC}")
    return value


def parse_ip(text):
    """``"10.0.0.1"`` -> int; ``ValueError`` unless it is a usable unicast IPv4 address."""
    try:
        addr = ipaddress.IPv4Address(text)
    except ValueError:
        raise ValueError(f"--ip {text!r} is not an IPv4 address (e.g. {DEFAULT_IP})") from None
    if addr.is_multicast or addr.is_unspecified or addr == ipaddress.IPv4Address("255.255.255.255"):
        raise ValueError(f"--ip {text} cannot be a host's address (multicast, 0.0.0.0 or "
                         f"broadcast)")
    return int(addr)


def list_boards(registry):
    """The ``--list-boards`` text: one block per board."""
    if not registry:
        return "no boards are registered\n"
    lines = []
    for b in registry.values():
        widths = ", ".join(str(w) for w in b.widths)
        tools = "open tools (yowasp), --bitstream runs here" if b.open_tools else \
            "vendor tools (not run here)"
        lines += [f"{b.name}",
                  f"    {b.title}",
                  f"    FPGA:   {b.fpga}",
                  f"    port:   {b.port}",
                  f"    widths: {widths} (default {b.default_width})",
                  f"    builds: {b.builds}",
                  f"    tools:  {tools}"]
        if b.max_qps is not None:
            lines.append(f"    fits:   up to {b.max_qps} QPs")
    return "\n".join(lines) + "\n"


def _parser():
    from roce_hw.config import DATA_WIDTHS, MAX_N_QP
    from roce_hw.generate import LINT_OFF, TOPS

    ap = argparse.ArgumentParser(prog="python build.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--width", type=int, default=None,
                    help=f"datapath width in bits: {', '.join(map(str, DATA_WIDTHS))} (default "
                         f"512, or the board's default width with --board)")
    ap.add_argument("--qps", type=int, default=16, help=f"number of queue pairs (1-{MAX_N_QP})")
    ap.add_argument("--board", default=None,
                    help="build for this board (see --list-boards): its build plan, and with "
                         "--bitstream the bitstream where the tools are open")
    ap.add_argument("--list-boards", action="store_true",
                    help="print every board with its FPGA, Ethernet port, widths and what it "
                         "builds, and exit")
    ap.add_argument("--out", default=None,
                    help="output folder (created if missing; default build/<name>_<width>, "
                         "or build/<board>)")
    ap.add_argument("--top", choices=TOPS, default=None,
                    help="without --board: engine (default) is the whole engine with the RX "
                         "front end, connection manager and ARP (module roce_engine); tx is "
                         "the TX engine alone (module roce_tx)")
    ap.add_argument("--name", default=None,
                    help="Verilog module name (a plain identifier, not a keyword; default "
                         "roce_engine or roce_tx)")
    ap.add_argument("--lint", action="store_true",
                    help="also lint with plain `verilator --lint-only -Wall`; the file switches "
                         "off " + ", ".join(LINT_OFF) + " (artefacts of generation)")
    ap.add_argument("--bitstream", action="store_true",
                    help="with --board: run the tools to a bitstream (boards with open tools)")
    ap.add_argument("--mac", default=None,
                    help=f"with --board: the board's MAC address (default {DEFAULT_MAC})")
    ap.add_argument("--ip", default=None,
                    help=f"with --board: the board's IPv4 address (default {DEFAULT_IP})")
    ap.add_argument("--clock-mhz", type=float, default=None,
                    help="the engine's clock in MHz, from which the retransmission timers count "
                         "time (default: 156.25 at 64 bits, 322.265625 wider; a board sets its "
                         "own)")
    ap.add_argument("--seed", type=int, default=None,
                    help="with --board --bitstream: place-and-route seed (default 1)")
    ap.add_argument("--no-rx-other", action="store_true",
                    help="with --top engine: drop received frames that are not for the engine "
                         "instead of passing them out on m_axis_rx_other")
    ap.add_argument("--no-underrun", action="store_true",
                    help="with --top tx: put a store-and-forward frame FIFO after the engine, "
                         "so that m_axis_tx never pauses inside a frame (Xilinx CMAC)")
    ap.add_argument("--fifo-depth", type=int, default=None,
                    help="FIFO depth in beats with --no-underrun (default: twice the longest "
                         "frame); must hold the longest frame")
    ap.add_argument("--fifo-abort", choices=("drop", "pass"), default=None,
                    help="with --no-underrun: drop aborted frames in the FIFO, or pass them "
                         "with tuser (default drop)")
    return ap


def _error(message):
    print(f"error: {message}", file=sys.stderr)
    return 2


def main(argv=None):
    from roce_hw.config import EngineConfig
    from roce_hw.generate import LintError, ToolMissing, check_module_name, generate

    args = _parser().parse_args(argv)
    if args.list_boards or args.board is not None:
        import platforms
        try:
            registry = platforms.boards()
        except Exception as e:          # a board module that does not import
            return _error(f"the board registry did not load: {e}")
        if args.list_boards:
            print(list_boards(registry), end="")
            return 0
        return _board_main(args, registry)

    top = args.top or "engine"
    try:
        for opt in ("bitstream", "mac", "ip", "seed"):
            if getattr(args, opt) not in (None, False):
                raise ValueError(f"--{opt} applies with --board (see --list-boards)")
        width = 512 if args.width is None else args.width
        config = EngineConfig(data_width=width, n_qp=args.qps,
                              rx_other=not args.no_rx_other, clock_hz=_clock_hz(args))
        name = args.name or {"tx": "roce_tx", "engine": "roce_engine"}[top]
        check_module_name(name)
        if not args.no_underrun and (args.fifo_depth is not None or args.fifo_abort):
            raise ValueError("--fifo-depth and --fifo-abort need --no-underrun")
        if top == "engine" and args.no_underrun:
            raise ValueError("--no-underrun is not available with --top engine yet (it is "
                             "with --top tx)")
        if top == "tx" and args.no_rx_other:
            raise ValueError("--no-rx-other needs --top engine")
    except (ValueError, TypeError) as e:
        return _error(e)
    out = args.out or f"build/{name}_{width}"
    try:
        generate(config, out, name=name, top=top, lint=args.lint,
                 no_underrun=args.no_underrun,
                 fifo_depth=args.fifo_depth, fifo_abort=args.fifo_abort or "drop", log=print)
    except ValueError as e:            # e.g. a FIFO too small for the longest frame
        return _error(e)
    except ToolMissing as e:
        return _error(f"--lint: {e}")
    except OSError as e:               # --out unusable: read-only, a file, ...
        return _error(f"--out {out}: {e.strerror or e}")
    except LintError as e:
        print(f"error: lint findings:\n{e}", file=sys.stderr)
        return 1
    return 0


def _clock_hz(args):
    """``--clock-mhz`` in whole Hz (None: the width's default); ``ValueError`` out of range."""
    if args.clock_mhz is None:
        return None
    from roce_hw.config import MAX_CLOCK_HZ, MIN_CLOCK_HZ
    hz = args.clock_mhz * 1e6
    if not MIN_CLOCK_HZ <= hz <= MAX_CLOCK_HZ:     # also catches nan
        raise ValueError(f"--clock-mhz must be from {MIN_CLOCK_HZ / 1e6:g} to "
                         f"{MAX_CLOCK_HZ / 1e6:g}, not {args.clock_mhz:g}")
    return round(hz)


def _board_main(args, registry):
    """``--board``: validate everything against the board, then call its ``build``."""
    from roce_hw.config import EngineConfig
    from roce_hw.generate import _prepare_out_dir

    from platforms import BoardOptions

    if args.board not in registry:
        return _error(f"unknown board {args.board!r}; choose one of: {', '.join(registry)} "
                      f"(python build.py --list-boards)")
    board = registry[args.board]
    try:
        for opt, flag in (("top", "--top"), ("name", "--name"), ("no_underrun", "--no-underrun"),
                          ("fifo_depth", "--fifo-depth"), ("fifo_abort", "--fifo-abort"),
                          ("no_rx_other", "--no-rx-other"), ("lint", "--lint"),
                          ("clock_mhz", "--clock-mhz")):
            if getattr(args, opt) not in (None, False):
                raise ValueError(f"{flag} does not apply with --board: the board top fixes it")
        width = board.default_width if args.width is None else args.width
        if width not in board.widths:
            choices = ", ".join(str(w) for w in board.widths)
            raise ValueError(f"board {board.name} carries --width {choices} only, not {width} "
                             f"(choose one of: {choices})")
        config = EngineConfig(data_width=width, n_qp=args.qps, clock_hz=board.engine_clock_hz)
        if args.bitstream and not board.open_tools:
            opens = [b.name for b in registry.values() if b.open_tools]
            raise ValueError(f"--bitstream needs vendor tools for {board.name}, which are not "
                             f"run here; boards with open tools: "
                             f"{', '.join(opens) or 'none registered'}")
        if args.seed is not None and args.seed < 0:
            raise ValueError(f"--seed must be 0 or more, not {args.seed}")
        mac = parse_mac(args.mac or DEFAULT_MAC)
        ip = parse_ip(args.ip or DEFAULT_IP)
    except (ValueError, TypeError) as e:
        return _error(e)
    if board.max_qps is not None and args.qps > board.max_qps:
        print(f"warning: {board.name} is known to fit up to {board.max_qps} QPs, not "
              f"{args.qps}", file=sys.stderr)
    out = args.out or f"build/{board.name}"
    try:
        _prepare_out_dir(out)
    except OSError as e:
        return _error(f"--out {out}: {e.strerror or e}")
    options = BoardOptions(config=config, out=out, mac=mac, ip=ip, bitstream=args.bitstream,
                           seed=1 if args.seed is None else args.seed, log=print)
    print(f"board {board.name}: {board.title}, {board.fpga}, {board.port}, {width} bits, "
          f"{args.qps} QPs")
    try:
        result = board.build(options)
    except ValueError as e:
        return _error(f"{board.name}: {e}")
    except OSError as e:
        return _error(f"--out {out}: {e.strerror or e}")
    _print_summary(result)
    return 0


def _print_summary(result):
    for key, value in (result or {}).items():
        if key == "unverified":
            for item in value:
                print(f"warning: not confirmed from a source: {item}", file=sys.stderr)
        elif isinstance(value, (list, tuple)):
            print(f"{key}:")
            for item in value:
                print(f"    {item}")
        elif isinstance(value, dict):
            print(f"{key}:")
            for k, v in value.items():
                print(f"    {k}: {v}")
        else:
            print(f"{key}: {value}")


if __name__ == "__main__":
    sys.exit(main())
