# SPDX-License-Identifier: BSD-2-Clause
"""Co-simulation of the emitted ``roce_tx.v`` in Icarus Verilog, cycle for cycle against Amaranth.

:func:`cosimulate` (and :func:`run_verilog`, which returns only the frames) takes the same
description of a run as :func:`sim.traffic.run_traffic` -- an :class:`~roce_hw.config.EngineConfig`,
:class:`~sim.traffic.QPSetup` contexts, a list of :class:`~sim.traffic.WorkItem` -- and

1. emits ``roce_tx.v`` with :func:`roce_hw.generate.generate` (exactly what ``build.py`` writes
   and users drop into their projects) into a temporary folder, unless an already emitted file
   is given;
2. builds a :class:`Stimulus`, a pure function of the arguments and ``seed``: the QP contexts for
   ``s_qp_mgmt_req_*``, the WR fields for ``s_wr_*``, the payload beats for ``s_axis_payload_*``
   (random bytes beyond ``tkeep``), each transfer preceded by a seeded number of idle cycles,
   and a cyclic seeded ``m_axis_tx_tready`` pattern; it writes them as ``$readmemh`` files with
   a generated Verilog testbench;
3. compiles with ``iverilog -g2005`` (or ``-g2012``, ``std=``) and runs ``vvp``;
4. parses the recorded transfers into frames (wire byte 0 = ``tdata[7:0]``).

The testbench holds ``rst`` for :data:`RESET_CYCLES` cycles, drives garbage on the data ports of
an idle stream, writes every QP context (one request in flight, each response awaited), then
posts the WRs and the payload, records every transfer on ``m_axis_tx``, ``m_status`` and
``m_qp_mgmt_rsp`` with its cycle, checks the AXI-Stream rule that ``m_axis_tx`` holds ``tvalid``
and its payload while stalled, reads the counter outputs at the end and finishes by itself once
every input was consumed and the outputs have been quiet for :data:`QUIET_CYCLES` cycles, or at
a hard cycle limit (:class:`CosimTimeout`).

:func:`simulate_amaranth` replays the very same :class:`Stimulus` with the same per-cycle rules on
the Amaranth design the Verilog was emitted from (:class:`roce_hw.top.TxTop`, the same flat
ports) in Amaranth's simulator and returns the same kind of record; ``cosimulate(...,
amaranth=True)`` does both, so that a test can require the two event lists -- every output
transfer with its cycle and every bit of ``tdata`` -- to be identical.

Port names and widths are read from the emitted module header, so the testbench follows the
Verilog itself rather than the Python description of it.

Language mode. The generated file must behave the same whether it is compiled as Verilog-2005 or
as SystemVerilog (``iverilog -g2012``, a ``.sv`` flow). Amaranth's own back end prints
combinational logic as ``always @*`` blocks started by a ``reg ... = 0`` trigger, which works only
under Verilog-2005 semantics (under ``-g2012`` constant-driven blocks stay ``x`` and frames broke:
``x`` in the BTH, wrong PSNs, spurious refusals); :mod:`roce_hw.generate` emits continuous
assignments instead. ``std=`` picks the mode (:data:`IVERILOG_STDS`); the tests run both.
"""

import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from roce_hw import proto
from sim.bfm import qp_context

__all__ = ["QUIET_CYCLES", "READY_PATTERN", "RESET_CYCLES", "IVERILOG_STDS", "CosimError",
           "CosimToolMissing",
           "CosimTimeout", "CosimResult", "Stimulus", "emit_verilog", "verilog_ports",
           "amaranth_ports", "make_stimulus", "cosimulate", "simulate_amaranth",
           "run_verilog", "first_difference", "main"]


#: Cycles without ``tvalid``/``m_status_valid`` after all input was consumed that end a run.
QUIET_CYCLES = 128
#: Length of the cyclic ``m_axis_tx_tready`` pattern (a prime, so it does not line up with frames).
READY_PATTERN = 4093
#: Width of the idle-cycle count stored in front of every stimulus word.
GAP_BITS = 16
#: Cycles ``rst`` is held high at the start.
RESET_CYCLES = 4
#: Plain counter outputs recorded at the end of a run (when the module has them).
COUNTERS = ("frames", "frames_aborted", "wrs_refused", "status_dropped")
#: ``iverilog -g`` language generations a run can use (see "Language mode" above); the first is
#: the default.
IVERILOG_STDS = ("2005", "2012")


class CosimError(RuntimeError):
    """The co-simulation could not be run (missing tool, compile error, bad stimulus)."""


class CosimToolMissing(CosimError):
    """Icarus Verilog (``iverilog``/``vvp``) is not installed; ``tool`` names the program (the
    test suite's missing-tool policy keys on ``is_missing_tool``)."""

    is_missing_tool = True

    def __init__(self, tool, message):
        self.tool = tool
        super().__init__(message)


class CosimTimeout(TimeoutError):
    """The simulation hit its cycle limit (or the wall-clock limit) before finishing."""


@dataclass
class CosimResult:
    """What a testbench saw.

    ``events``: every record in order, as tuples ``("B", cycle, tdata, tkeep, tlast, tuser)``
    (``m_axis_tx`` beat), ``("S", cycle, wr_id, qp, status)``, ``("M", cycle, qp, write,
    error)``, ``("V", cycle, text)`` (rule breach), ``("C", cycle, name, value)`` (counter at the
    end), ``("END", cycle, "ok")``; a value with unknown (x/z) bits is kept as its lower-case
    ``%h``/``%b`` text. Derived from them: ``frames`` -- ``(bytes, aborted)`` per frame;
    ``statuses`` -- dicts ``{cycle, wr_id, qp, status}``; ``mgmt`` -- dicts ``{cycle, qp, write,
    error}``; ``beat_cycles``; ``violations`` -- AXI-Stream breaches, non-contiguous ``tkeep``
    and unknown bits in valid bytes, as text; ``counters``; ``cycles`` simulated. ``tied_off``:
    inputs held at 0 (``s_ip_id_load_*``); ``work_dir``: folder of the run (``None`` once
    removed); ``amaranth``: the :class:`CosimResult` of the Amaranth replay, when asked for.
    """
    events: list = field(default_factory=list)
    frames: list = field(default_factory=list)
    statuses: list = field(default_factory=list)
    mgmt: list = field(default_factory=list)
    beat_cycles: list = field(default_factory=list)
    violations: list = field(default_factory=list)
    counters: dict = field(default_factory=dict)
    cycles: int = 0
    tied_off: list = field(default_factory=list)
    work_dir: Path | None = None
    amaranth: "CosimResult | None" = None


def emit_verilog(config, out_dir, *, name="roce_tx", **top_options):
    """Emit the engine for ``config`` into ``out_dir`` with :func:`roce_hw.generate.generate`
    (``top_options``: ``no_underrun``, ``fifo_depth``, ``fifo_abort`` of
    :class:`roce_hw.top.TxTop`); returns the path of the ``.v`` file."""
    from roce_hw.generate import generate
    return Path(generate(config, out_dir, name=name, **top_options))


_PORT_RE = re.compile(r"^\s*(input|output)\s+(?:\[(\d+):0\]\s*)?([A-Za-z_][A-Za-z0-9_$]*)\s*;")


def verilog_ports(text, name="roce_tx"):
    """``{port: (direction, width)}`` of module ``name`` in Verilog ``text`` (as Amaranth emits
    it: one ``input [N:0] x;`` declaration per line). Raises :class:`CosimError` if the module
    is missing."""
    m = re.search(rf"^module {re.escape(name)}\(", text, re.M)
    if m is None:
        raise CosimError(f"module {name} not found in the Verilog")
    end = text.index("endmodule", m.end())
    ports = {}
    for line in text[m.end():end].splitlines():
        pm = _PORT_RE.match(line)
        if pm:
            ports[pm.group(3)] = (pm.group(1), int(pm.group(2)) + 1 if pm.group(2) else 1)
    return ports


def _flat_top(config, top_options=None):
    from roce_hw.top import TxTop
    return TxTop(config, **(top_options or {}))


def amaranth_ports(top):
    """``{port: (direction, width)}`` of an Amaranth ``FlatTop`` plus ``clk``/``rst`` (the same
    form as :func:`verilog_ports`)."""
    from amaranth.hdl import Shape
    ports = {}
    for name, member in top.signature.members.items():
        ports[name] = ("input" if member.flow.name == "In" else "output",
                       Shape.cast(member.shape).width)
    ports["clk"] = ports["rst"] = ("input", 1)
    return ports


class _Stream:
    """One source stream: its field ports (sorted by name, the first one most significant in a
    word) and its transfers, each a word ``gap << data_bits | fields``."""

    def __init__(self, tag, valid, ready, fields, ports):
        self.tag, self.valid, self.ready = tag, valid, ready
        for f in (valid, ready, *fields):
            if f not in ports:
                raise CosimError(f"port {f} missing from the module")
        self.fields = [(f, ports[f][1]) for f in sorted(fields)]
        self.data_bits = sum(w for _, w in self.fields)
        self.bits = GAP_BITS + self.data_bits
        self.words = []

    def add(self, gap, values):
        """Append one transfer: ``gap`` idle cycles before it, ``values`` {port: int}."""
        unknown = set(values) - {f for f, _ in self.fields}
        if unknown:
            raise CosimError(f"{self.tag}: no port(s) {', '.join(sorted(unknown))}")
        if not 0 <= gap < 1 << GAP_BITS:
            raise CosimError(f"{self.tag}: gap {gap} out of range")
        word = gap
        for f, w in self.fields:
            v = int(values.get(f, 0))
            if not 0 <= v < 1 << w:
                raise CosimError(f"{self.tag}: value {v:#x} does not fit port {f} ({w} bits)")
            word = (word << w) | v
        self.words.append(word)

    def write(self, path):
        digits = -(-self.bits // 4)
        path.write_text("".join(f"{w:0{digits}x}\n" for w in self.words) or "0\n")

    def verilog(self, enable):
        """Declarations and the per-cycle driver statements (inside the clocked block). Must
        stay in step with :class:`_Driver`."""
        t, n = self.tag, max(1, len(self.words))
        lhs = "{" + ", ".join(f for f, _ in self.fields) + "}"
        decl = (f"  reg [{self.bits - 1}:0] {t}_mem [0:{n - 1}];\n"
                f"  reg [{self.bits - 1}:0] {t}_cur = 0;\n"
                f"  integer {t}_i = 0, {t}_wait = 0;\n"
                f"  reg {t}_loaded = 0;\n"
                f"  initial $readmemh(\"{t}.hex\", {t}_mem);\n")
        body = f"""
      // {t}: present item {t}_i after its idle cycles; hold it until {self.ready}
      if ({self.valid} && {self.ready}) begin
        {t}_i = {t}_i + 1;
        {t}_loaded = 0;
      end
      if ({enable} && !{t}_loaded && {t}_i < {len(self.words)}) begin
        {t}_cur = {t}_mem[{t}_i];
        {t}_wait = {t}_cur[{self.bits - 1}:{self.data_bits}];
        {t}_loaded = 1;
      end
      if ({t}_loaded && {t}_wait == 0) begin
        {self.valid} <= 1'b1;
        {lhs} <= {t}_cur[{self.data_bits - 1}:0];
      end else begin
        {self.valid} <= 1'b0;
        {lhs} <= ~{t}_cur[{self.data_bits - 1}:0] ^ cycle;
        if ({t}_loaded) {t}_wait = {t}_wait - 1;
      end
"""
        return decl, body


class _Driver:
    """The Python twin of :meth:`_Stream.verilog`: same state, same per-cycle rule."""

    def __init__(self, stream):
        self.s = stream
        self.i = self.wait = self.cur = 0
        self.loaded = False
        self.mask = (1 << stream.data_bits) - 1

    def step(self, cycle, enable, valid, ready):
        """One clock edge; ``valid``/``ready`` as sampled. Returns (new valid, new field word)."""
        s = self.s
        if valid and ready:
            self.i += 1
            self.loaded = False
        if enable and not self.loaded and self.i < len(s.words):
            self.cur = s.words[self.i]
            self.wait = self.cur >> s.data_bits
            self.loaded = True
        if self.loaded and self.wait == 0:
            return 1, self.cur & self.mask
        if self.loaded:
            self.wait -= 1
        return 0, ((~self.cur & self.mask) ^ cycle) & self.mask


@dataclass
class Stimulus:
    """Everything both testbenches replay: the three source streams (``mg``, ``wr``, ``pl``), the
    cyclic ``tready`` pattern (list of 0/1), the static addresses and the cycle limit."""
    mg: _Stream
    wr: _Stream
    pl: _Stream
    ready: list
    local_mac: int
    local_ip: int
    max_cycles: int

    @property
    def streams(self):
        return (self.mg, self.wr, self.pl)


def _gap(rng, p):
    n = 0
    while p and rng.random() < p and n < (1 << GAP_BITS) - 1:
        n += 1
    return n


def make_stimulus(config, qps, wrs, ports, *, local_mac, local_ip, seed=0, p_idle=0.0,
                  p_stall=0.0, max_cycles=None):
    """The :class:`Stimulus` of a run for a module with ``ports`` (see :func:`cosimulate`)."""
    for pname, p in (("p_idle", p_idle), ("p_stall", p_stall)):
        if not 0 <= p < 1:
            raise ValueError(f"{pname} must be in [0, 1), not {p!r}")
    width = config.data_width
    nbytes = width // 8
    if ports.get("m_axis_tx_tdata", (None, 0))[1] != width:
        raise CosimError(f"the module is not a {width}-bit roce_tx")
    rng = random.Random(seed)
    rng_mg, rng_wr, rng_pl, rng_rdy = (random.Random(rng.getrandbits(64)) for _ in range(4))

    def inputs(prefix):
        return [p for p, (d, _) in ports.items()
                if d == "input" and p.startswith(prefix) and p != prefix + "valid"]
    mg = _Stream("mg", "s_qp_mgmt_req_valid", "s_qp_mgmt_req_ready",
                 inputs("s_qp_mgmt_req_"), ports)
    wr = _Stream("wr", "s_wr_valid", "s_wr_ready", inputs("s_wr_"), ports)
    pl = _Stream("pl", "s_axis_payload_tvalid", "s_axis_payload_tready",
                 ["s_axis_payload_tdata", "s_axis_payload_tkeep", "s_axis_payload_tlast"], ports)
    for q in qps:
        vals = {"s_qp_mgmt_req_qp": q.index, "s_qp_mgmt_req_write": 1}
        vals.update({f"s_qp_mgmt_req_ctx_{k}": v for k, v in qp_context(q).items()})
        mg.add(_gap(rng_mg, p_idle), vals)
    n_out_beats = 0
    for n, w in enumerate(wrs):
        wr.add(_gap(rng_wr, p_idle), {
            "s_wr_wr_id": w.wr_id or n + 1, "s_wr_opcode": int(w.opcode), "s_wr_qp": w.qp,
            "s_wr_remote_addr": w.remote_addr, "s_wr_r_key": w.r_key,
            "s_wr_length": w.wr_length, "s_wr_imm": w.imm, "s_wr_signaled": int(w.signaled),
            "s_wr_solicited": int(w.solicited)})
        body = w.payload
        for off in range(0, len(body), nbytes):
            chunk = body[off:off + nbytes]
            lanes = chunk + rng_pl.randbytes(nbytes - len(chunk))   # garbage beyond tkeep
            pl.add(_gap(rng_pl, p_idle), {
                "s_axis_payload_tdata": int.from_bytes(lanes, "little"),
                "s_axis_payload_tkeep": (1 << len(chunk)) - 1,
                "s_axis_payload_tlast": int(off + nbytes >= len(body))})
        n_out_beats += -(-(len(body) + 90 * (len(body) // 256 + 1)) // nbytes)
    ready = [0 if p_stall and rng_rdy.random() < p_stall else 1 for _ in range(READY_PATTERN)]
    if max_cycles is None:
        gaps = sum(w >> s.data_bits for s in (mg, wr, pl) for w in s.words)
        base = 2000 + 64 * len(qps) + 16 * len(wrs) + len(pl.words) + n_out_beats + gaps
        max_cycles = int(4 * base / (1 - p_stall))
    return Stimulus(mg, wr, pl, ready, local_mac, local_ip, max_cycles)


def _testbench(name, ports, stim, *, vcd=False):
    """Text of module ``tb`` and the list of inputs it ties to 0."""
    mg, wr, pl = stim.streams
    driven = {"clk", "rst", "m_axis_tx_tready", "m_status_ready", "m_qp_mgmt_rsp_ready",
              "local_mac", "local_ip"}
    for s in stim.streams:
        driven |= {s.valid} | {f for f, _ in s.fields}
    lines = ["`timescale 1ns/1ps", "module tb;", "  integer cycle = 0;", "  reg clk = 1'b0;",
             "  reg rst = 1'b1;", "  always #5 clk = ~clk;"]
    tied = []
    for p, (d, w) in ports.items():
        if p in ("clk", "rst"):
            continue
        vec = f"[{w - 1}:0] " if w > 1 else ""
        if d == "input":
            lines.append(f"  reg {vec}{p} = 0;")
            if p not in driven:
                tied.append(p)          # e.g. s_ip_id_load_*: held at 0
        else:
            lines.append(f"  wire {vec}{p};")
    lines.append(f"  {name} dut (" + ", ".join(f".{p}({p})" for p in ports) + ");")
    decls, bodies = [], []
    for s, en in ((mg, "mg_go"), (wr, "setup_done"), (pl, "setup_done")):
        d, b = s.verilog(en)
        decls.append(d)
        bodies.append(b)
    counters = "\n".join(f'      $fdisplay(fd, "C %0d {p} %0d", cycle, {p});'
                         for p in COUNTERS if p in ports)
    tdata_w = ports["m_axis_tx_tdata"][1]
    keep_w = ports["m_axis_tx_tkeep"][1]
    n_mg, n_wr, n_pl = len(mg.words), len(wr.words), len(pl.words)
    dump = '\n    $dumpfile("tb.vcd");\n    $dumpvars(0, tb);' if vcd else ""
    lines += decls
    lines.append(f"""
  reg rdy_mem [0:{READY_PATTERN - 1}];
  initial $readmemb("ready.bin", rdy_mem);
  integer fd, quiet = 0, n_rsp = 0, n_beat = 0;
  reg mg_go = 1'b1, setup_done = 1'b0;
  reg prev_stall = 1'b0;
  reg [{tdata_w - 1}:0] prev_tdata;
  reg [{keep_w - 1}:0] prev_tkeep;
  reg prev_tlast, prev_tuser;
  initial begin
    fd = $fopen("out.txt", "w");
    if (fd == 0) begin $display("cannot open out.txt"); $finish; end
    local_mac = 48'h{stim.local_mac:012x};
    local_ip = 32'h{stim.local_ip:08x};{dump}
  end
  always @(posedge clk) begin
    cycle = cycle + 1;
    if (cycle == {RESET_CYCLES}) rst <= 1'b0;
    // ---- monitors: the values as they were at this edge
    if (!rst) begin
      if (prev_stall && !(m_axis_tx_tvalid && m_axis_tx_tdata === prev_tdata &&
          m_axis_tx_tkeep === prev_tkeep && m_axis_tx_tlast === prev_tlast &&
          m_axis_tx_tuser === prev_tuser))
        $fdisplay(fd, "V %0d m_axis_tx dropped tvalid or changed its payload while stalled", cycle);
      if (m_axis_tx_tvalid && m_axis_tx_tready) begin
        $fdisplay(fd, "B %0d %h %h %b %b", cycle, m_axis_tx_tdata, m_axis_tx_tkeep,
                  m_axis_tx_tlast, m_axis_tx_tuser);
        n_beat = n_beat + 1;
      end
      prev_stall = m_axis_tx_tvalid && !m_axis_tx_tready;
      prev_tdata = m_axis_tx_tdata; prev_tkeep = m_axis_tx_tkeep;
      prev_tlast = m_axis_tx_tlast; prev_tuser = m_axis_tx_tuser;
      if (m_status_valid && m_status_ready)
        $fdisplay(fd, "S %0d %h %h %h", cycle, m_status_wr_id, m_status_qp, m_status_status);
      if (m_qp_mgmt_rsp_valid && m_qp_mgmt_rsp_ready) begin
        $fdisplay(fd, "M %0d %h %b %b", cycle, m_qp_mgmt_rsp_qp, m_qp_mgmt_rsp_write,
                  m_qp_mgmt_rsp_error);
        n_rsp = n_rsp + 1;
      end
      // one management request in flight at a time: the next one after the response
      if (s_qp_mgmt_req_valid && s_qp_mgmt_req_ready) mg_go = 1'b0;
      if (m_qp_mgmt_rsp_valid && m_qp_mgmt_rsp_ready) mg_go = 1'b1;
      if (n_rsp == {n_mg}) setup_done = 1'b1;
      quiet = (m_axis_tx_tvalid || m_status_valid) ? 0 : quiet + 1;
    end
    // ---- drivers
    if (rst) begin
      m_axis_tx_tready <= 1'b0;
      m_status_ready <= 1'b0;
      m_qp_mgmt_rsp_ready <= 1'b0;
    end else begin
      m_axis_tx_tready <= rdy_mem[cycle % {READY_PATTERN}];
      m_status_ready <= 1'b1;
      m_qp_mgmt_rsp_ready <= 1'b1;
{"".join(bodies)}
    end
    // ---- end of the run
    if (setup_done && mg_i == {n_mg} && wr_i == {n_wr} && pl_i == {n_pl} &&
        quiet >= {QUIET_CYCLES}) begin
{counters}
      $fdisplay(fd, "END %0d ok", cycle);
      $fclose(fd);
      $finish;
    end
    if (cycle >= {stim.max_cycles}) begin
      $fwrite(fd, "END %0d timeout mgmt_responses=%0d/{n_mg} wrs=%0d/{n_wr} ", cycle, n_rsp,
              wr_i);
      $fdisplay(fd, "payload_beats=%0d/{n_pl} tx_beats=%0d", pl_i, n_beat);
      $fclose(fd);
      $finish;
    end
  end
endmodule
""")
    return "\n".join(lines) + "\n", tied


def _num(text, base):
    """Integer of a ``%h``/``%b`` field, or its lower-case text if it has x/z bits."""
    t = text.lower()
    return t if any(c in "xz" for c in t) else int(t, base)


def _events_from_text(out_text):
    events = []
    for line in out_text.splitlines():
        p = line.split()
        if not p:
            continue
        kind, cycle = p[0], int(p[1])
        if kind == "B":
            events.append(("B", cycle, _num(p[2], 16), _num(p[3], 16), _num(p[4], 2),
                           _num(p[5], 2)))
        elif kind == "S":
            events.append(("S", cycle, _num(p[2], 16), _num(p[3], 16), _num(p[4], 16)))
        elif kind == "M":
            events.append(("M", cycle, _num(p[2], 16), _num(p[3], 2), _num(p[4], 2)))
        elif kind == "C":
            events.append(("C", cycle, p[2], int(p[3])))
        elif kind == "V":
            events.append(("V", cycle, " ".join(p[2:])))
        elif kind == "END":
            events.append(("END", cycle, " ".join(p[2:])))
    return events


def _result(events, nbytes):
    """A :class:`CosimResult` from the event list (frames, statuses, ... derived)."""
    res = CosimResult(events=events)
    cur = bytearray()
    for ev in events:
        kind, cycle = ev[0], ev[1]
        if kind == "B":
            tdata, tkeep, tlast, tuser = ev[2:]
            if not all(isinstance(v, int) for v in (tkeep, tlast, tuser)):
                res.violations.append(f"cycle {cycle}: unknown bits in tkeep/tlast/tuser")
                tkeep, tlast, tuser = (v if isinstance(v, int) else int(re.sub("[xz]", "0", v), 16)
                                       for v in (tkeep, tlast, tuser))
            count = tkeep.bit_length()
            if tkeep != (1 << count) - 1 or (not tlast and count != nbytes) or count == 0:
                res.violations.append(f"cycle {cycle}: tkeep {tkeep:#x} not contiguous from "
                                      f"lane 0, partial before tlast, or empty")
            if isinstance(tdata, str):
                text = tdata.rjust(2 * nbytes, "0")
                if count and any(c in "xz" for c in text[-2 * count:]):
                    res.violations.append(f"cycle {cycle}: unknown bits in valid tdata lanes")
                tdata = int(re.sub("[xz]", "0", text), 16)
            cur += tdata.to_bytes(nbytes, "little")[:count]
            res.beat_cycles.append(cycle)
            if tlast:
                res.frames.append((bytes(cur), bool(tuser)))
                cur = bytearray()
        elif kind == "S":
            res.statuses.append({"cycle": cycle, "wr_id": ev[2], "qp": ev[3], "status": ev[4]})
        elif kind == "M":
            res.mgmt.append({"cycle": cycle, "qp": ev[2], "write": ev[3], "error": ev[4]})
        elif kind == "C":
            res.counters[ev[2]] = ev[3]
        elif kind == "V":
            res.violations.append(f"cycle {cycle}: {ev[2]}")
        elif kind == "END":
            res.cycles = cycle
    if cur:
        res.violations.append(f"{len(cur)} bytes on m_axis_tx without a final tlast")
    return res


def _finish(res, what, max_cycles, t0):
    end = res.events[-1] if res.events and res.events[-1][0] == "END" else None
    if end is None:
        raise CosimError(f"{what} ended without an END record")
    if end[2] != "ok":
        raise CosimTimeout(f"{what} hit its limit of {max_cycles} cycles after "
                           f"{time.monotonic() - t0:.1f} s: {end[2].removeprefix('timeout ')}; "
                           f"{len(res.frames)} frames seen")
    bad = [r for r in res.mgmt if r["error"]]
    if bad:
        raise CosimError(f"{what}: management write refused for QP(s) {[r['qp'] for r in bad]}")
    return res


def cosimulate(config, qps, wrs, *, local_mac=None, local_ip=None, seed=0, p_idle=0.0,
               p_stall=0.0, verilog=None, work_dir=None, max_cycles=None, wall_timeout=600,
               amaranth=False, vcd=None, std=IVERILOG_STDS[0], top_options=None):
    """Run ``wrs`` through the emitted Verilog in Icarus; returns a :class:`CosimResult`.

    Parameters
    ----------
    config : EngineConfig
    qps : list of sim.traffic.QPSetup
        Written through ``s_qp_mgmt_req`` (one at a time, each response awaited) before any WR.
    wrs : list of sim.traffic.WorkItem
        Posted on ``s_wr`` in order; each payload (``length`` > 0) is one packet on
        ``s_axis_payload`` (bytes beyond ``tkeep`` on the last beat are random).
    local_mac, local_ip : int
        Static ports; default those of :mod:`sim.traffic`.
    seed : int
        Seeds the idle gaps, the ``tready`` pattern and the garbage bytes.
    p_idle : float
        Probability of each extra idle cycle before a transfer on the three input streams.
    p_stall : float
        Probability of ``m_axis_tx_tready`` low in each cycle of the cyclic pattern.
    verilog : path, optional
        An already emitted ``roce_tx.v`` for ``config`` (saves re-emitting); default: emit with
        :func:`roce_hw.generate.generate`.
    work_dir : path, optional
        Keep every file of the run there (default: a temporary folder, removed afterwards).
    max_cycles : int, optional
        Hard cycle limit (default: generous, from the amount of traffic).
    wall_timeout : float
        Seconds allowed for ``vvp``.
    amaranth : bool
        Also replay the same stimulus on the Amaranth design (:func:`simulate_amaranth`); the
        result goes to ``.amaranth``.
    vcd : bool, optional
        Dump every signal to ``tb.vcd`` in ``work_dir`` (or, without ``work_dir``, to
        ``build/vcd/cosim_<width>.vcd``). Default: on with ``RHW_VCD=1``, like
        :func:`sim.harness.run_simulation`.
    std : str
        ``iverilog -g`` generation: ``"2005"`` (Verilog-2005) or ``"2012"`` (SystemVerilog).
    top_options : dict, optional
        Options of :class:`roce_hw.top.TxTop` (``no_underrun``, ``fifo_depth``,
        ``fifo_abort``) for the emitted file and the Amaranth replay alike.

    Raises
    ------
    CosimError
        ``iverilog``/``vvp`` missing, compile error, a management write refused, or bad stimulus.
    CosimTimeout
        The cycle limit or the wall-clock limit was reached before the run finished.
    ValueError
        ``p_idle``/``p_stall`` outside [0, 1).
    """
    from sim.traffic import DEFAULT_LOCAL_IP, DEFAULT_LOCAL_MAC
    local_mac = DEFAULT_LOCAL_MAC if local_mac is None else local_mac
    local_ip = DEFAULT_LOCAL_IP if local_ip is None else local_ip
    for pname, p in (("p_idle", p_idle), ("p_stall", p_stall)):
        if not 0 <= p < 1:
            raise ValueError(f"{pname} must be in [0, 1), not {p!r}")
    if std not in IVERILOG_STDS:
        raise ValueError(f"std must be one of {', '.join(IVERILOG_STDS)}, not {std!r}")
    tools = {t: shutil.which(t) for t in ("iverilog", "vvp")}
    missing = [t for t, exe in tools.items() if exe is None]
    if missing:
        raise CosimToolMissing(missing[0], f"{' and '.join(missing)} not found: install Icarus "
                               f"Verilog (apt-get install iverilog)")
    keep = work_dir is not None
    tmp = None
    if keep:
        wdir = Path(work_dir)
        wdir.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="roce_cosim_")
        wdir = Path(tmp.name)
    try:
        vpath = emit_verilog(config, wdir / "rtl", **(top_options or {})) if verilog is None \
            else Path(verilog)
        ports = verilog_ports(vpath.read_text())
        stim = make_stimulus(config, qps, wrs, ports, local_mac=local_mac, local_ip=local_ip,
                             seed=seed, p_idle=p_idle, p_stall=p_stall, max_cycles=max_cycles)
        if vcd is None:
            from sim.harness import vcd_requested
            vcd = vcd_requested()
        try:
            res = _run_iverilog(config, stim, ports, vpath, wdir, tools, wall_timeout, vcd, std)
        finally:
            if vcd and not keep and (wdir / "tb.vcd").exists():
                dest = Path("build") / "vcd" / f"cosim_{config.data_width}.vcd"
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(wdir / "tb.vcd", dest)
        res.work_dir = wdir if keep else None
    finally:
        if tmp is not None:
            tmp.cleanup()
    if amaranth:
        res.amaranth = _replay_amaranth(config, stim, _flat_top(config, top_options))
    return res


def _run_iverilog(config, stim, ports, vpath, wdir, tools, wall_timeout, vcd, std):
    for s in stim.streams:
        s.write(wdir / f"{s.tag}.hex")
    (wdir / "ready.bin").write_text("\n".join(map(str, stim.ready)) + "\n")
    tb, tied = _testbench("roce_tx", ports, stim, vcd=vcd)
    (wdir / "tb.v").write_text(tb)
    try:
        comp = subprocess.run([tools["iverilog"], f"-g{std}", "-o", "tb.vvp", "-s", "tb",
                               "tb.v", str(vpath.resolve())], cwd=wdir, capture_output=True,
                              text=True, timeout=wall_timeout)
    except subprocess.TimeoutExpired:
        raise CosimTimeout(f"iverilog did not finish within {wall_timeout} s") from None
    if comp.returncode != 0:
        raise CosimError(f"iverilog failed ({comp.returncode}):\n{comp.stderr.strip()[-4000:]}")
    t0 = time.monotonic()
    try:
        run = subprocess.run([tools["vvp"], "-n", "tb.vvp"], cwd=wdir, capture_output=True,
                             text=True, timeout=wall_timeout)
    except subprocess.TimeoutExpired:
        raise CosimTimeout(f"vvp did not finish within {wall_timeout} s "
                           f"(work_dir= keeps the files)") from None
    out = wdir / "out.txt"
    if run.returncode != 0 or not out.exists():
        raise CosimError(f"vvp failed ({run.returncode}):\n{(run.stdout + run.stderr)[-4000:]}")
    res = _result(_events_from_text(out.read_text()), config.data_width // 8)
    res.tied_off = tied
    return _finish(res, "Verilog simulation", stim.max_cycles, t0)


def simulate_amaranth(config, qps, wrs, *, local_mac=None, local_ip=None, seed=0, p_idle=0.0,
                      p_stall=0.0, max_cycles=None, top_options=None):
    """Replay in Amaranth's simulator exactly what :func:`cosimulate` does in Icarus (same
    arguments, same :class:`Stimulus`, same per-cycle rules, same records), on
    ``TxTop(config, **top_options)``. Returns a :class:`CosimResult`."""
    from sim.traffic import DEFAULT_LOCAL_IP, DEFAULT_LOCAL_MAC
    local_mac = DEFAULT_LOCAL_MAC if local_mac is None else local_mac
    local_ip = DEFAULT_LOCAL_IP if local_ip is None else local_ip
    top = _flat_top(config, top_options)
    stim = make_stimulus(config, qps, wrs, amaranth_ports(top), local_mac=local_mac,
                         local_ip=local_ip, seed=seed, p_idle=p_idle, p_stall=p_stall,
                         max_cycles=max_cycles)
    return _replay_amaranth(config, stim, top)


def _replay_amaranth(config, stim, top=None):
    """The Python twin of :func:`_testbench` on the Amaranth design ``top`` (default: a new
    ``TxTop(config)``)."""
    from amaranth.hdl import Cat, ClockDomain, Module, Value
    from amaranth.sim import Simulator

    top = _flat_top(config) if top is None else top
    ports = amaranth_ports(top)
    m = Module()
    m.domains.sync = cd = ClockDomain("sync")
    m.submodules.top = top
    sim = Simulator(m)
    sim.add_clock(1e-8, domain="sync")
    sig = {p: Value.cast(getattr(top, p)) for p in ports if p not in ("clk", "rst")}
    for s in stim.streams:
        for f in (s.valid, s.ready, *(f for f, _ in s.fields)):
            if f not in sig:
                raise CosimError(f"port {f} missing from the Amaranth design")
    watch = ["m_axis_tx_tvalid", "m_axis_tx_tdata", "m_axis_tx_tkeep", "m_axis_tx_tlast",
             "m_axis_tx_tuser", "m_status_valid", "m_status_wr_id", "m_status_qp",
             "m_status_status", "m_qp_mgmt_rsp_valid", "m_qp_mgmt_rsp_qp", "m_qp_mgmt_rsp_write",
             "m_qp_mgmt_rsp_error", "s_qp_mgmt_req_ready", "s_wr_ready", "s_axis_payload_tready",
             *(c for c in COUNTERS if c in sig)]
    mg, wr, pl = stim.streams
    drivers = [(_Driver(s), Cat(*(sig[f] for f, _ in reversed(s.fields)))) for s in stim.streams]
    n_mg, n_wr, n_pl = len(mg.words), len(wr.words), len(pl.words)
    events = []
    t0 = time.monotonic()

    async def testbench(ctx):
        ctx.set(cd.rst, 1)
        ctx.set(sig["local_mac"], stim.local_mac)
        ctx.set(sig["local_ip"], stim.local_ip)
        reg = {"m_axis_tx_tready": 0, "m_status_ready": 0, "m_qp_mgmt_rsp_ready": 0,
               mg.valid: 0, wr.valid: 0, pl.valid: 0}
        words = [0, 0, 0]
        cycle = quiet = n_rsp = 0
        rst, mg_go, setup_done = 1, 1, 0
        prev_stall, prev = False, None
        while True:
            _, _, *vals = await ctx.tick().sample(*(sig[p] for p in watch))
            o = dict(zip(watch, (int(v) for v in vals)))
            cycle += 1
            new = {}
            new_rst = 0 if cycle == RESET_CYCLES else rst
            if not rst:
                beat = (o["m_axis_tx_tdata"], o["m_axis_tx_tkeep"], o["m_axis_tx_tlast"],
                        o["m_axis_tx_tuser"])
                if prev_stall and not (o["m_axis_tx_tvalid"] and beat == prev):
                    events.append(("V", cycle, "m_axis_tx dropped tvalid or changed its payload "
                                               "while stalled"))
                if o["m_axis_tx_tvalid"] and reg["m_axis_tx_tready"]:
                    events.append(("B", cycle, *beat))
                prev_stall = bool(o["m_axis_tx_tvalid"] and not reg["m_axis_tx_tready"])
                prev = beat
                if o["m_status_valid"] and reg["m_status_ready"]:
                    events.append(("S", cycle, o["m_status_wr_id"], o["m_status_qp"],
                                   o["m_status_status"]))
                rsp = o["m_qp_mgmt_rsp_valid"] and reg["m_qp_mgmt_rsp_ready"]
                if rsp:
                    events.append(("M", cycle, o["m_qp_mgmt_rsp_qp"], o["m_qp_mgmt_rsp_write"],
                                   o["m_qp_mgmt_rsp_error"]))
                    n_rsp += 1
                if reg[mg.valid] and o[mg.ready]:
                    mg_go = 0
                if rsp:
                    mg_go = 1
                if n_rsp == n_mg:
                    setup_done = 1
                quiet = 0 if (o["m_axis_tx_tvalid"] or o["m_status_valid"]) else quiet + 1
            if rst:
                new.update({"m_axis_tx_tready": 0, "m_status_ready": 0, "m_qp_mgmt_rsp_ready": 0})
            else:
                new.update({"m_axis_tx_tready": stim.ready[cycle % READY_PATTERN],
                            "m_status_ready": 1, "m_qp_mgmt_rsp_ready": 1})
                for k, ((drv, cat), en) in enumerate(zip(drivers, (mg_go, setup_done,
                                                                    setup_done))):
                    s = drv.s
                    v, words[k] = drv.step(cycle, en, reg[s.valid], o[s.ready])
                    new[s.valid] = v
                    ctx.set(cat, words[k])
            if (setup_done and drivers[0][0].i == n_mg and drivers[1][0].i == n_wr and
                    drivers[2][0].i == n_pl and quiet >= QUIET_CYCLES):
                events.extend(("C", cycle, c, o[c]) for c in COUNTERS if c in o)
                events.append(("END", cycle, "ok"))
                return
            if cycle >= stim.max_cycles:
                events.append(("END", cycle, f"timeout mgmt_responses={n_rsp}/{n_mg} "
                                             f"wrs={drivers[1][0].i}/{n_wr} payload_beats="
                                             f"{drivers[2][0].i}/{n_pl}"))
                return
            for p, v in new.items():
                if reg.get(p) != v:
                    ctx.set(sig[p], v)
            reg.update(new)
            if new_rst != rst:
                ctx.set(cd.rst, new_rst)
                rst = new_rst

    sim.add_testbench(testbench)
    sim.run()
    res = _result(events, config.data_width // 8)
    return _finish(res, "Amaranth simulation", stim.max_cycles, t0)


def first_difference(a, b):
    """``(index, event of a, event of b)`` of the first differing event of two event lists, or
    ``None`` if they are equal."""
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return k, x, y
    if len(a) != len(b):
        k = min(len(a), len(b))
        return k, a[k] if k < len(a) else None, b[k] if k < len(b) else None
    return None


def run_verilog(config, qps, wrs, *, local_mac=None, local_ip=None, seed=0, p_idle=0.0,
                p_stall=0.0, **kwargs):
    """Frames ``[(bytes, aborted), ...]`` the emitted Verilog sends for ``wrs``; see
    :func:`cosimulate` for the arguments, ``**kwargs`` included."""
    return cosimulate(config, qps, wrs, local_mac=local_mac, local_ip=local_ip, seed=seed,
                      p_idle=p_idle, p_stall=p_stall, **kwargs).frames


def main(argv=None):
    """``python -m sim.cosim --width 64 --seed 1``: a random workload through the Verilog,
    compared with the golden model (and with ``--amaranth`` cycle by cycle with the Amaranth
    simulation); exit status 1 on any difference."""
    import argparse

    from roce_hw.config import DATA_WIDTHS, EngineConfig
    from roce_hw.model.icrc import frame_icrc_ok
    from sim.traffic import OPS, count_mismatches, expected_frames, random_workload

    ap = argparse.ArgumentParser(prog="python -m sim.cosim",
                                 description=main.__doc__.split("\n")[0].strip("`"),
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--width", type=int, default=64,
                    help=f"bus width in bits ({', '.join(map(str, DATA_WIDTHS))})")
    ap.add_argument("--qps", type=int, default=2, help="number of QPs")
    ap.add_argument("--messages", type=int, default=20, help="number of random WRs")
    ap.add_argument("--max-size", type=int, default=3000, help="largest payload in bytes")
    ap.add_argument("--pmtu", type=int, default=1024, help="256, 512, 1024, 2048 or 4096")
    ap.add_argument("--seed", type=int, default=1, help="seed of the workload and the stalls")
    ap.add_argument("--stall", type=float, default=0.2,
                    help="probability of idle input / stalled output cycles")
    ap.add_argument("--std", choices=(*IVERILOG_STDS, "both"), default="both",
                    help="compile as Verilog-2005, as SystemVerilog (2012) or both")
    ap.add_argument("--no-underrun", action="store_true",
                    help="build the top with the store-and-forward frame FIFO")
    ap.add_argument("--amaranth", action="store_true",
                    help="also replay in Amaranth and compare every output transfer")
    ap.add_argument("--keep", help="keep the run's files (stimulus, testbench, out.txt) here")
    args = ap.parse_args(argv)
    stds = IVERILOG_STDS if args.std == "both" else (args.std,)
    top_options = {"no_underrun": True} if args.no_underrun else None
    results = []
    try:
        config = EngineConfig(data_width=args.width, n_qp=max(4, args.qps))
        proto.pmtu_code(args.pmtu)
        qps, wrs = random_workload(n_qps=args.qps, messages=args.messages, ops=list(OPS),
                                   min_size=0, max_size=args.max_size, pmtu=args.pmtu,
                                   seed=args.seed)
        with tempfile.TemporaryDirectory(prefix="roce_cosim_rtl_") as rtl:
            vpath = emit_verilog(config, rtl, **(top_options or {}))
            for k, std in enumerate(stds):
                t0 = time.monotonic()
                keep = None if args.keep is None else Path(args.keep) / f"g{std}"
                res = cosimulate(config, qps, wrs, seed=args.seed, p_idle=args.stall,
                                 p_stall=args.stall, work_dir=keep, verilog=vpath, std=std,
                                 amaranth=args.amaranth and k == 0, top_options=top_options)
                results.append((std, res, time.monotonic() - t0))
    except (ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (CosimError, CosimTimeout) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    expect = expected_frames(config, qps, wrs, ip_id_start=config.ip_id_start)
    failed = False
    for std, res, dt in results:
        got = [f for f, _ in res.frames]
        diff = count_mismatches(got, expect)
        bad_icrc = sum(not frame_icrc_ok(f) for f in got)
        print(f"-g{std}: {len(got)} frames in {res.cycles} cycles ({dt:.1f} s): "
              f"{diff} differ from the golden model, {bad_icrc} bad iCRC, "
              f"{len(res.violations)} stream violations")
        failed |= bool(diff or bad_icrc or res.violations)
        if res.amaranth is not None:
            d = first_difference(res.events, res.amaranth.events)
            print("Amaranth replay: " + ("identical event list" if d is None else
                                         f"first difference at event {d[0]}: {d[1]} != {d[2]}"))
            failed |= d is not None
    if len(results) == 2:
        d = first_difference(results[0][1].events, results[1][1].events)
        print("-g2005 and -g2012: " + ("identical event list" if d is None else
                                       f"first difference at event {d[0]}: {d[1]} != {d[2]}"))
        failed |= d is not None
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
