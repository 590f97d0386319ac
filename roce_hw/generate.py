# SPDX-License-Identifier: BSD-2-Clause
"""Verilog generation and lint: ``generate(config, out_dir)`` writes ``roce_tx.v`` and its port list.

The emitted Verilog is meant to be dropped into other people's projects, so it is held to what
they will run on it:

* **Same behaviour as Verilog-2005 and as SystemVerilog.** Amaranth's own back end runs Yosys
  ``proc -nomux`` and prints every combinational process as an ``always @*`` block made to run at
  time 0 by a ``reg ... = 0`` trigger; that works only with Verilog-2001/2005 semantics of a
  declaration initialiser, and compiled as SystemVerilog (``iverilog -g2012``, a ``.sv`` flow)
  a block whose inputs never change stays ``x``. :func:`verilog_text` runs ``proc`` to the end
  instead (decision trees become ``$mux``/``$pmux`` cells), so every combinational signal is a
  continuous ``assign`` (a ``$pmux`` through a function) and the only ``always`` blocks are
  clocked: no time-0 event is needed under either standard.
* **Lint clean as users run it**: ``verilator --lint-only -Wall`` with no flags. The warning
  classes that generation itself causes (:data:`LINT_OFF`) are switched off by ``lint_off``
  pragmas in the file, stated in its header comment and switched back on at its end.
"""

import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["LINT_OFF", "VERILOG_KEYWORDS", "ToolMissing", "LintError", "check_module_name",
           "verilog_text", "emit", "lint", "port_table", "port_lines", "summary",
           "summary_markdown", "vlt_text", "generate"]

#: Verilator warning classes switched off inside every generated file, and why each is an
#: artefact of generation rather than a finding in the design.
LINT_OFF = {
    "WIDTH": "Yosys writes each operand at its own width (RTLIL cells extend implicitly)",
    "UNUSEDSIGNAL": "Amaranth keeps named intermediate signals whose bits are not all read",
    "DECLFILENAME": "one file holds the top module and all of its submodules",
    "CASEOVERLAP": "Yosys writes a one-hot $pmux as a casez function with overlapping patterns",
    "VARHIDDEN": "those $pmux functions name their inputs a, b and s",
}

#: Reserved words of Verilog-2005 (IEEE 1364) and SystemVerilog-2017 (IEEE 1800): a module
#: name must be none of them, since the file is compiled under both.
VERILOG_KEYWORDS = frozenset("""
always and assign automatic begin buf bufif0 bufif1 case casex casez cell cmos config deassign
default defparam design disable edge else end endcase endconfig endfunction endgenerate endmodule
endprimitive endspecify endtable endtask event for force forever fork function generate genvar
highz0 highz1 if ifnone incdir include initial inout input instance integer join large liblist
library localparam macromodule medium module nand negedge nmos nor noshowcancelled not notif0
notif1 or output parameter pmos posedge primitive pull0 pull1 pulldown pullup
pulsestyle_ondetect pulsestyle_onevent rcmos real realtime reg release repeat rnmos rpmos rtran
rtranif0 rtranif1 scalared showcancelled signed small specify specparam strong0 strong1 supply0
supply1 table task time tran tranif0 tranif1 tri tri0 tri1 triand trior trireg unsigned use
uwire vectored wait wand weak0 weak1 while wire wor xnor xor
accept_on alias always_comb always_ff always_latch assert assume before bind bins binsof bit
break byte chandle checker class clocking const constraint context continue cover covergroup
coverpoint cross dist do endchecker endclass endclocking endgroup endinterface endpackage
endprogram endproperty endsequence enum eventually expect export extends extern final
first_match foreach forkjoin global iff ignore_bins illegal_bins implements implies import
inside int interconnect interface intersect join_any join_none let local logic longint matches
modport nettype new nexttime null package packed priority program property protected pure rand
randc randcase randsequence ref reject_on restrict return s_always s_eventually s_nexttime
s_until s_until_with sequence shortint shortreal soft solve static string strong struct super
sync_accept_on sync_reject_on tagged this throughout timeprecision timeunit type typedef union
unique unique0 until until_with untyped var virtual void wait_order weak wildcard with within
""".split())

_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*\Z")


class ToolMissing(FileNotFoundError):
    """An external program is not installed. ``tool`` is its name, ``package`` the Debian
    package that provides it (the test suite's missing-tool policy keys on these)."""

    is_missing_tool = True

    def __init__(self, tool, package=None, what=""):
        self.tool = tool
        self.package = package or tool
        super().__init__(f"{tool} is not installed{what} (apt-get install {self.package})")


class LintError(Exception):
    """Verilator reported a warning or an error."""


def check_module_name(name):
    """Return ``name`` if it is a legal plain Verilog identifier (ASCII letters, digits, ``_``,
    ``$``; not starting with a digit or ``$``) that is no Verilog or SystemVerilog keyword; else
    raise ``ValueError`` saying why."""
    if not isinstance(name, str) or not _IDENT_RE.match(name):
        raise ValueError(f"module name {name!r} is not a legal Verilog identifier (letters "
                         f"a-z A-Z, digits, _ and $; not starting with a digit or $)")
    if name in VERILOG_KEYWORDS:
        raise ValueError(f"module name {name!r} is a Verilog/SystemVerilog keyword")
    return name


def _header(name):
    from amaranth import __version__ as amaranth_version

    from . import __version__
    width = max(len(k) for k in LINT_OFF)
    lines = [
        f"// {name}: generated by roce-hw {__version__} (Amaranth {amaranth_version}, Yosys). "
        f"Do not edit; regenerate.",
        "// Plain Verilog-2005 that behaves the same when compiled as SystemVerilog: every",
        "// combinational signal is a continuous assignment; the only always blocks are clocked.",
        "// Lint: `verilator --lint-only -Wall` is clean on this file with no flags. These warning",
        "// classes are switched off below (and on again at the end of the file) because they are",
        "// artefacts of generation, not findings in the design:",
    ]
    lines += [f"//   {k:<{width}}  {v}" for k, v in LINT_OFF.items()]
    lines += [f"/* verilator lint_off {k} */" for k in LINT_OFF]
    return "\n".join(lines) + "\n"


def _footer():
    return "".join(f"/* verilator lint_on {k} */\n" for k in LINT_OFF)


def verilog_text(component, name):
    """Verilog of ``component`` (a ``wiring.Component``) as module ``name``, without source
    locations, with the header and lint pragmas described in the module docstring."""
    from amaranth._toolchain.yosys import find_yosys   # what amaranth.back.verilog uses
    from amaranth.back import rtlil

    check_module_name(name)
    rtlil_text = rtlil.convert(component, name=name, emit_src=False)
    yosys = find_yosys(lambda ver: ver >= (0, 40))
    script = "\n".join([
        f"read_rtlil <<rtlil\n{rtlil_text}\nrtlil",
        "proc -norom",          # to completion: no process is left for an `always @*`
        "memory_collect",
        "write_verilog",
    ])
    text = yosys.run(["-q", "-"], script, ignore_warnings=True)
    if "always @*" in text:    # pragma: no cover - would mean Yosys changed behaviour
        raise RuntimeError("Yosys left a combinational always block in the output")
    return _header(name) + text + _footer()


#: Short name used by the tests and tools: ``emit(component, name)`` is :func:`verilog_text`.
emit = verilog_text


def lint(text, top, *, timeout=600):
    """Run plain ``verilator --lint-only -Wall --top-module top`` (no waiver flag) on Verilog
    ``text``. Raises :class:`LintError` with Verilator's messages on any warning or error (or if
    it runs longer than ``timeout`` seconds) and :class:`ToolMissing` without Verilator."""
    exe = shutil.which("verilator")
    if exe is None:
        raise ToolMissing("verilator")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{top}.v"
        path.write_text(text)
        try:
            res = subprocess.run([exe, "--lint-only", "-Wall", "--top-module", top, str(path)],
                                 capture_output=True, text=True, cwd=tmp, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise LintError(f"verilator did not finish within {timeout} s") from None
    if res.returncode != 0 or "%Warning" in res.stderr or "%Error" in res.stderr:
        raise LintError(res.stderr.strip() or f"verilator exited {res.returncode}")


_lint = lint      # generate() has a parameter of the same name


def port_table(top):
    """The ports of a flat top as ``[{"name", "dir", "width"}]`` (``dir`` ``"input"`` or
    ``"output"``), in signature order, clock and reset last."""
    from amaranth import Shape
    from amaranth.lib.wiring import In

    rows = [{"name": pname, "dir": "input" if member.flow == In else "output",
             "width": Shape.cast(member.shape).width}
            for pname, member in top.signature.members.items()]
    return rows + [{"name": "clk", "dir": "input", "width": 1},
                   {"name": "rst", "dir": "input", "width": 1}]


def port_lines(top, name):
    """The port list of a flat top as text lines (``input [W-1:0] name``), clock and reset
    last."""
    lines = []
    for row in port_table(top):
        direction = f"{row['dir']:<6}"
        lines.append(f"{direction} [{row['width'] - 1}:0] {row['name']}" if row["width"] > 1
                     else f"{direction} {row['name']}")
    return lines


#: What each port group is, for the summary (prefix -> meaning); see docs/integration.md.
_PORT_GROUPS = (
    ("s_axis_rx_", "frames from the MAC (no FCS; tuser = bad frame)"),
    ("m_axis_tx_", "frames to the MAC (iCRC added, no FCS; tuser on the last beat = drop)"),
    ("m_axis_rx_other_", "received frames not for the engine"),
    ("s_axis_payload_", "WR payload packets"),
    ("s_wr_", "work requests"),
    ("s_resume_", "resume a message at a packet (go-back-N)"),
    ("m_status_", "reports of refused WRs"),
    ("s_qp_mgmt_req_", "QP context read/write requests"),
    ("m_qp_mgmt_rsp_", "QP context responses"),
    ("s_ip_id_load_", "reload the IPv4 identification counter"),
    ("counters_", "counters (32-bit, wrapping)"),
    ("local_", "the engine's own addresses (static)"),
    ("clk", "the one clock"),
    ("rst", "synchronous reset, active high"),
)


def _group(port):
    for prefix, what in _PORT_GROUPS:
        if port.startswith(prefix):
            return prefix, what
    return port, ""


def summary(top, name, config, *, kind, fifo_depth=None):
    """The build's summary as a dict: module, parameters (every :class:`EngineConfig` field,
    the derived sizes, the clock the figures assume) and ports (``port_table``)."""
    from dataclasses import asdict

    from .top import max_frame_beats, max_frame_bytes

    params = asdict(config)
    params.update({"data_bytes": config.data_bytes,
                   "max_frame_bytes": max_frame_bytes(config),
                   "max_frame_beats": max_frame_beats(config),
                   "frame_fifo_beats": fifo_depth,
                   # the clock the timers count (and the throughput figures assume)
                   "clock_mhz": config.timer_clock_hz / 1e6})
    return {"module": name, "top": kind, "generator": "roce-hw", "parameters": params,
            "ports": port_table(top)}


def summary_markdown(info):
    """:func:`summary` as a Markdown page: the parameters, then one table row per port group
    and every port with its direction and width."""
    p = info["parameters"]
    lines = [f"# `{info['module']}`: {p['data_width']}-bit datapath, {p['n_qp']} QPs",
             "", f"Top: `{info['top']}` (generated by roce-hw; see docs/integration.md).", "",
             "## Parameters", "", "| parameter | value |", "|---|---|"]
    lines += [f"| `{k}` | {v} |" for k, v in p.items() if v is not None]
    lines += ["", "## Ports", "", "| port | dir | width | group |", "|---|---|---|---|"]
    for row in info["ports"]:
        prefix, what = _group(row["name"])
        lines.append(f"| `{row['name']}` | {row['dir']} | {row['width']} | {what} |")
    return "\n".join(lines) + "\n"


def vlt_text(top, name):
    """A Verilator configuration file for module ``name``: ``public_flat_rw`` for each of its
    ports and nothing else, so that a VPI bench (cocotb) sees the ports while Verilator keeps
    optimising every internal signal (``--public-flat-rw`` makes every signal public and builds
    several times slower: docs/verilator.md)."""
    ports = [line.split()[-1] for line in port_lines(top, name)]
    return "\n".join(["`verilator_config",
                      f"// {name}: only the ports are public (generated by roce_hw.generate)"]
                     + [f'public_flat_rw -module "{name}" -var "{p}"' for p in ports]) + "\n"


def _prepare_out_dir(out_dir):
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"output path {out} exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(e.errno, f"cannot create output folder {out}: {e.strerror}") from None
    probe = out / ".roce_hw_write_test"
    try:
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise OSError(e.errno, f"cannot write into output folder {out}: {e.strerror}") from None
    return out


#: What :func:`generate` can emit: ``"tx"`` the TX engine (:class:`~roce_hw.top.TxTop`),
#: ``"engine"`` the whole engine with RX, CM and ARP (:class:`~roce_hw.top.EngineTop`).
TOPS = ("tx", "engine")


def generate(config, out_dir, *, name=None, top="tx", lint=False, no_underrun=False,
             fifo_depth=None, fifo_abort="drop", log=None):
    """Emit the engine built from ``config`` as Verilog module ``name`` into ``out_dir``.

    ``top`` is ``"tx"`` (:class:`~roce_hw.top.TxTop`, default name ``roce_tx``) or ``"engine"``
    (:class:`~roce_hw.top.EngineTop`, default name ``roce_engine``; no frame FIFO option yet).
    Writes ``out_dir/<name>.v`` (see :func:`verilog_text`),
    ``out_dir/<name>_ports.txt`` (one port per line), ``out_dir/<name>_summary.md`` and
    ``.json`` (parameters and ports, :func:`summary`) and ``out_dir/<name>.vlt`` (a Verilator
    configuration making only the ports public, :func:`vlt_text`). ``no_underrun``, ``fifo_depth`` and
    ``fifo_abort`` are passed to :class:`~roce_hw.top.TxTop`. With ``lint=True`` the file is
    also checked with :func:`lint`. ``log`` (default: silent) receives progress lines.
    Returns the path of the ``.v`` file.

    Raises
    ------
    ValueError
        An illegal module name or FIFO option (see :class:`~roce_hw.top.TxTop`).
    OSError
        ``out_dir`` cannot be created or written (the message names the folder).
    LintError, ToolMissing
        With ``lint=True``.
    """
    from .top import EngineTop, TxTop

    log = log or (lambda *a: None)
    if top not in TOPS:
        raise ValueError(f"top must be one of {', '.join(TOPS)}, not {top!r}")
    name = name or {"tx": "roce_tx", "engine": "roce_engine"}[top]
    check_module_name(name)
    kind = top
    if top == "engine":
        if no_underrun or fifo_depth is not None:
            raise ValueError("the frame FIFO (no_underrun) is not available for the whole "
                             "engine yet; put a frame FIFO after m_axis_tx")
        top = EngineTop(config)
        fifo = ""
    else:
        top = TxTop(config, no_underrun=no_underrun, fifo_depth=fifo_depth,
                    fifo_abort=fifo_abort)
        fifo = f", frame FIFO of {top.fifo_depth} beats" if no_underrun else ""
    out = _prepare_out_dir(out_dir)
    t0 = time.monotonic()
    log(f"elaborating {name}: {config.data_width}-bit datapath, {config.n_qp} QPs{fifo} ...")
    text = verilog_text(top, name)
    vpath = out / f"{name}.v"
    vpath.write_text(text)
    log(f"wrote {vpath} ({len(text.splitlines())} lines, {time.monotonic() - t0:.1f} s)")
    ports = out / f"{name}_ports.txt"
    head = f"# ports of module {name} ({config.data_width}-bit, {config.n_qp} QPs{fifo})"
    ports.write_text("\n".join([head] + port_lines(top, name)) + "\n")
    log(f"wrote {ports}")
    info = summary(top, name, top.config, kind=kind, fifo_depth=getattr(top, "fifo_depth", None))
    (out / f"{name}_summary.json").write_text(json.dumps(info, indent=1) + "\n")
    (out / f"{name}_summary.md").write_text(summary_markdown(info))
    log(f"wrote {out / (name + '_summary.md')} and .json (parameters and ports)")
    vlt = out / f"{name}.vlt"
    vlt.write_text(vlt_text(top, name))
    log(f"wrote {vlt}")
    if lint:
        log("linting with verilator --lint-only -Wall (no flags) ...")
        _lint(text, name)
        log("lint clean; switched off inside the file as artefacts of generation: "
            + ", ".join(LINT_OFF))
    return vpath
