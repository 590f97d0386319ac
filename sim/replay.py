# SPDX-License-Identifier: BSD-2-Clause
"""Replay a capture into the simulated engine: frames in from a pcap, frames out to a pcap.

Run from the repository root::

    python -m sim.replay --width 64 --qps 16 --mac 02:00:00:00:00:01 --ip 10.0.0.1 \\
        --rx in.pcap --tx out.pcap --json state.json [--backend verilator]

The engine is :class:`roce_hw.top.EngineTop` (:class:`roce_hw.engine.RoceEngine` with flat
ports, module ``roce_engine``) on a back end of :mod:`sim.backend`: ``--backend amaranth``
(default: Amaranth's simulator, no compiler needed) or ``--backend verilator`` (the emitted
Verilog compiled by Verilator, 100 times faster or more; the first build of a width takes 1-3
minutes, then it is cached). Both give the same output, cycle for cycle. The driver
(:class:`EngineDriver`) runs the engine in slices of cycles, no Python per cycle.

Every frame of ``--rx`` (pcap or pcapng; Ethernet or Linux cooked captures, see
:mod:`sim.pcap`) goes into the engine's ``s_axis_rx`` stream in capture order, one beat per
cycle with ``tvalid`` held for the whole frame (``s_axis_rx_tready`` is constant 1):

* by default **back to back**, the next frame's first beat in the cycle after the previous
  frame's last beat (line rate: the worst case for the receive path);
* ``--gap N``: ``N`` idle cycles after every frame;
* ``--timing capture``: frame ``k`` starts no earlier than its capture time stamp minus the
  first one's, converted to cycles at the width's clock (:data:`sim.traffic.CLOCK_MHZ`), and
  no earlier than the cycle after the previous frame.

Every frame the engine puts on ``m_axis_tx`` (data frames, CM replies, ARP replies) is written
to ``--tx`` with its simulated time, the cycle after its last beat (nanosecond pcap; aborted
frames are counted, not written); ``--other`` also writes the frames that left on
``m_axis_rx_other``. The simulation ends when all input
frames are in and the outputs have been quiet for ``--drain`` cycles (default: 2000, or twice
the longest generator period asked for by a txmeta datagram in the input, plus 2000), or at
``--max-cycles`` (a frame being fed in is finished first). Then the final QP table is read
through the management port (every row, every field of :data:`roce_hw.proto.QP_CONTEXT_FIELDS`
by name, integers) and written with all counters (:func:`roce_hw.engine.engine_counters_layout`,
nested by block: ``tx``, ``rx``, ``cm``) and the refused-WR reports to ``--json``.

``--model`` runs :class:`roce_hw.model.engine.EngineModel` (the whole engine's frame-level Python
model: the RX front end of :mod:`roce_hw.model.rx`, ARP, the CM of :mod:`roce_hw.model.cm`, the
generator on :class:`roce_hw.model.requester.RequesterModel`) instead of the hardware: the oracle the
hardware's output is compared with, and quick to run (its frames are stamped 1 us apart).

Exit status: 0 done; 1 stopped at ``--max-cycles`` before the outputs were quiet; 2 bad
arguments, an unreadable capture or ``--backend verilator`` without Verilator, g++ or make (one
line on stderr, naming what to install).
"""

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from roce_hw import proto
from roce_hw.model.engine import EngineModel, arp_reply_frame
from sim.bfm import ip_str, mac_str, parse_ip, parse_mac

__all__ = ["EngineModel", "EngineDriver", "ReplayResult", "replay", "read_input", "parse_mac",
           "parse_ip", "mac_str", "struct_to_dict", "nest_counters", "generator_periods",
           "arp_reply_frame", "main", "DEFAULT_DRAIN", "REPLAY_SLICE"]

#: Quiet cycles on the outputs that end a replay (plus twice the longest generator period).
DEFAULT_DRAIN = 2000
#: Default ``--max-cycles``.
DEFAULT_MAX_CYCLES = 2_000_000
#: Most cycles one slice of a replay runs (:func:`replay`; progress is shown between slices).
REPLAY_SLICE = 4096


# -- the hardware simulation -----------------------------------------------------------------
def struct_to_dict(layout, value):
    """A ``data.StructLayout`` value (a ``data.Const`` or an int) as nested ``dict``\\ s of
    integers, by field name."""
    from amaranth.lib import data
    raw = value.as_value().value if hasattr(value, "as_value") else int(value)
    out = {}
    for name, fld in layout:
        bits = (raw >> fld.offset) & ((1 << fld.width) - 1)
        shape = fld.shape
        if isinstance(shape, data.StructLayout):
            out[name] = struct_to_dict(shape, bits)
        elif isinstance(shape, data.ArrayLayout):
            ew = shape.size // shape.length
            out[name] = [(bits >> (i * ew)) & ((1 << ew) - 1) for i in range(shape.length)]
        else:
            out[name] = bits
    return out


def nest_counters(flat):
    """The flat counter names of :meth:`sim.backend.EngineApi.counters` (``rx_icrc``,
    ``cm_ok``, ...) nested by block as :func:`roce_hw.engine.engine_counters_layout` declares
    them: ``{"tx": {...}, "rx": {...}, "cm": {...}, "ack": {...}}`` (integers, every counter of
    the layout)."""
    from roce_hw.engine import engine_counters_layout
    return {block: {name: int(flat[f"{block}_{name}"]) for name, _ in fld.shape}
            for block, fld in engine_counters_layout()}


class EngineDriver:
    """The whole engine (:class:`roce_hw.top.EngineTop`) on a :mod:`sim.backend` back end,
    driven frame by frame in slices of cycles: the harness of this tool and of :mod:`sim.e2e`.
    No Python runs per cycle (with ``backend="verilator"`` the cycle loop is C++); the caller
    alternates :meth:`send` (frames into ``s_axis_rx``) and :meth:`run` (a slice of cycles,
    returning the frames that came out).

    ``s_axis_rx_tready`` is constant 1, so a frame queued by :meth:`send` enters one beat per
    cycle from its start cycle, known when it is queued: its earliest cycle, or the cycle after
    the previous frame's last beat plus that frame's ``gap``, whichever is later (the driver
    checks that the harness took every frame by then). ``m_axis_tx``, ``m_axis_rx_other`` and
    ``m_status`` are consumed with ``ready`` held at 1 (no random idle or stall).

    Movement: the cycle after the last beat of any input or output frame is
    :attr:`last_move`; :meth:`idle` counts the cycles since then (0 while an input frame is
    still to come in or a ``m_axis_tx`` frame is part-way out). At the end, :meth:`finish`
    reads the QP table through the management port (:attr:`qp_table`) and the counters
    (:attr:`counters`, nested by block).
    """

    def __init__(self, config, *, backend="amaranth", local_mac, local_ip, seed=0, log=None):
        from sim.backend import open_engine
        self.config = config
        self.backend = backend
        self.lanes = config.data_width // 8
        self.eng = open_engine(config, backend=backend, top="engine", seed=seed, log=log)
        self.eng.set_addr(parse_mac(local_mac), parse_ip(local_ip))
        self.rx_free = 0          #: earliest start cycle of the next input frame
        self.rx_end = 0           #: cycle after the last input beat queued so far
        self.last_move = 0        #: cycle after the last beat of any frame, in or out
        self.rx_frames = 0
        self.tx_frames = 0
        self.tx_aborted = 0
        self.other_frames = 0
        self.statuses = []        #: refused-WR reports ``{wr_id, qp, status}``
        self.qp_table = []        #: rows read by :meth:`finish`, ``dict`` per QP
        self.counters = {}        #: nested counters read by :meth:`finish`
        self.sim_seconds = 0.0    #: wall-clock seconds spent in :meth:`run`
        self._tx_beats = 0        # beats of the m_axis_tx frames popped so far

    @property
    def cycle(self):
        """Cycles run since reset."""
        return self.eng.cycle

    def close(self):
        self.eng.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def start_of(self, earliest=0):
        """The cycle a frame queued now with ``earliest`` would start in."""
        return max(int(earliest), self.rx_free, self.cycle)

    def send(self, frame, *, earliest=0, gap=0, tuser=0):
        """Queue ``frame`` for ``s_axis_rx``, at cycle ``earliest`` at the earliest, ``gap``
        idle cycles after it; returns its start cycle."""
        frame = bytes(frame)
        if not frame:
            raise ValueError("an empty frame cannot be sent on a stream")
        start = self.start_of(earliest)
        end = start + -(-len(frame) // self.lanes)
        self.eng.push_rx(frame, cycle=start, tuser=tuser)
        self.rx_free = end + gap
        self.rx_end = end
        self.last_move = max(self.last_move, end)
        self.rx_frames += 1
        return start

    def tx_in_progress(self):
        """True while a ``m_axis_tx`` frame is part-way out."""
        return self.eng.count("tx_beats_total") > self._tx_beats

    def idle(self):
        """Cycles since the last beat of any frame; 0 while an input frame is still to come
        in or a ``m_axis_tx`` frame is part-way out."""
        c = self.cycle
        if c < self.rx_end or self.tx_in_progress():
            return 0
        return max(0, c - self.last_move)

    def run(self, cycles, *, until_tx=0):
        """Run at most ``cycles`` cycles (stopping early once ``until_tx`` frames have left
        on ``m_axis_tx``, if given); returns ``(tx, other)``: the
        :class:`sim.backend.TxFrame` s that left on ``m_axis_tx`` (``tuser`` = aborted) and
        on ``m_axis_rx_other`` meanwhile. Status reports are kept in :attr:`statuses`."""
        t0 = time.monotonic()
        self.eng.run(cycles, until_tx=until_tx)
        self.sim_seconds += time.monotonic() - t0
        tx, other = self.eng.pop_tx(), self.eng.pop_rx_other()
        for f in tx:
            self._tx_beats += f.beats
            self.last_move = max(self.last_move, f.last + 1)
            if f.tuser:
                self.tx_aborted += 1
            else:
                self.tx_frames += 1
        for f in other:
            self.last_move = max(self.last_move, f.last + 1)
        self.other_frames += len(other)
        self.statuses += [{"wr_id": s["wr_id"], "qp": s["qp"], "status": s["status"]}
                          for s in self.eng.pop_status()]
        if self.cycle >= self.rx_end and self.eng.count("rx_pending"):
            raise AssertionError(f"cycle {self.cycle}: the engine has not taken every input "
                                 f"frame by the cycle it should have (s_axis_rx_tready must "
                                 f"be constant 1)")
        return tx, other

    def finish(self, *, read_table=True):
        """Read the QP table (unless ``read_table`` is False) through the management port and
        the counters; returns ``(qp_table, counters)``. The engine runs on meanwhile (the
        frames it sends then are not collected)."""
        t0 = time.monotonic()
        if read_table:
            rows = self.eng.qp_table()
            self.qp_table = [{"qp": r["qp"], "qpn": proto.LOCAL_QPN_BASE + r["qp"],
                              **{name: int(r["ctx"][name]) for name, _ in
                                 proto.QP_CONTEXT_FIELDS}} for r in rows]
        self.counters = nest_counters(self.eng.counters())
        self.sim_seconds += time.monotonic() - t0
        return self.qp_table, self.counters


# -- replay ----------------------------------------------------------------------------------
@dataclass
class ReplayResult:
    """What one replay produced."""
    width: int
    n_qp: int
    inputs: int
    tx: list = field(default_factory=list)          #: (cycle, bytes) of good frames
    aborted: int = 0
    other: list = field(default_factory=list)       #: (cycle, bytes) from rx_other
    qp_table: list = field(default_factory=list)
    counters: dict = field(default_factory=dict)
    statuses: list = field(default_factory=list)
    cycles: int = 0
    stopped: str = "quiet"                          #: "quiet" or "limit"
    sim_seconds: float = 0.0
    drain: int = DEFAULT_DRAIN
    model: bool = False
    backend: str = "amaranth"                       #: "amaranth", "verilator" or "model"

    def to_json(self, *, mac, ip, rx_path=None, tx_path=None):
        return {
            "tool": "sim.replay", "engine": "model" if self.model else "RoceEngine",
            "backend": self.backend,
            "width": self.width, "n_qp": self.n_qp, "mac": mac_str(mac),
            "ip": ip_str(ip),
            "input": {"path": str(rx_path) if rx_path else None, "frames": self.inputs},
            "output": {"path": str(tx_path) if tx_path else None, "frames": len(self.tx),
                       "aborted": self.aborted, "rx_other": len(self.other)},
            "cycles": self.cycles, "stopped": self.stopped, "drain": self.drain,
            "sim_seconds": round(self.sim_seconds, 3),
            "qp_table": self.qp_table, "counters": self.counters,
            "status": self.statuses,
        }


def read_input(path):
    """The Ethernet frames and time stamps of a capture: ``[(time, bytes)]``. Raises
    ``ValueError`` for an unreadable capture, an empty or a truncated (snapped) packet."""
    from sim.pcap import CaptureError, read_capture
    try:
        packets = read_capture(path)
    except CaptureError as e:
        raise ValueError(str(e)) from None
    out = []
    for k, p in enumerate(packets):
        if not p.data:
            raise ValueError(f"{path}: packet {k} is empty")
        if len(p.data) < p.wire_len:
            raise ValueError(f"{path}: packet {k} was captured truncated ({len(p.data)} of "
                             f"{p.wire_len} bytes): the replay needs whole frames")
        out.append((p.time, bytes(p.data)))
    return out


def generator_periods(frames, *, local_mac, local_ip):
    """The ``tx_period`` of every txmeta start datagram for us among ``frames``."""
    from roce_hw.host import datagram as dg
    from roce_hw.model.cm import parse_cm_frame
    out = []
    for f in frames:
        parsed = parse_cm_frame(f, local_mac=local_mac, local_ip=local_ip)
        if parsed is None:
            continue
        d = dg.unpack(parsed[0])
        if d["tx_valid"] and d["tx_start"]:
            out.append(d["tx_period"])
    return out


def _schedule(times, width, gap, timing):
    """Earliest start cycle of each input frame (``None``: right after the previous one)."""
    if timing != "capture" or not times:
        return [None] * len(times)
    from sim.traffic import CLOCK_MHZ
    t0 = times[0]
    return [int(round((t - t0) * CLOCK_MHZ[width] * 1e6)) for t in times]


def replay(frames, *, width, n_qp, local_mac, local_ip, gap=0, timing="back-to-back",
           times=None, drain=None, max_cycles=DEFAULT_MAX_CYCLES, model=False, progress=None,
           config=None, backend="amaranth", slice_cycles=REPLAY_SLICE):
    """Replay ``frames`` (bytes) into the engine on ``backend`` (:data:`sim.backend.BACKENDS`);
    returns a :class:`ReplayResult`. ``times`` (seconds) are used with ``timing="capture"``.
    Raises :class:`sim.backend.BackendUnavailable` when the back end cannot run here.

    The run goes in slices of at most ``slice_cycles`` cycles (progress and the end are checked
    between slices; the results do not depend on the slice size): every input frame that
    starts before ``max_cycles`` is queued at its start cycle up front (``s_axis_rx_tready`` is
    constant 1, so start cycles are known beforehand); a slice never runs past the cycle at
    which the outputs would have been quiet for ``drain`` cycles, nor past the cycle limit (the
    end of a frame being fed at ``max_cycles``)."""
    from roce_hw.config import EngineConfig
    frames = [bytes(f) for f in frames]
    if drain is None:
        periods = generator_periods(frames, local_mac=local_mac, local_ip=local_ip)
        drain = DEFAULT_DRAIN + 2 * max(periods, default=0)
    res = ReplayResult(width=width, n_qp=n_qp, inputs=len(frames), drain=drain, model=model,
                       backend="model" if model else backend)
    if model:
        return _replay_model(res, frames, local_mac, local_ip)
    config = config or EngineConfig(data_width=width, n_qp=n_qp)
    earliest = _schedule(times or [0.0] * len(frames), width, gap, timing)
    drv = EngineDriver(config, backend=backend, local_mac=local_mac, local_ip=local_ip,
                       log=progress)
    try:
        fed = 0
        for frame, e in zip(frames, earliest):
            if drv.start_of(e or 0) >= max_cycles:
                break                   # never fed: the run stops at the limit before it
            drv.send(frame, earliest=e or 0, gap=gap)
            fed += 1
        # the limit: max_cycles, or the end of the frame being fed then
        limit = max(max_cycles, drv.rx_end)
        t0 = last = time.monotonic()
        while True:
            c = drv.cycle
            idle = drv.idle()
            if fed == len(frames) and c >= drv.rx_free and idle >= drain:
                break
            if c >= limit:
                res.stopped = "limit"
                break
            n = min(slice_cycles, limit - c)
            if fed == len(frames) and not drv.tx_in_progress():
                quiet_at = max(drv.rx_free, drv.last_move + drain)
                if quiet_at > c:
                    n = min(n, quiet_at - c)
            tx, other = drv.run(n, until_tx=1 if drv.tx_in_progress() else 0)
            res.tx += [(f.last + 1, f.data) for f in tx if not f.tuser]
            res.other += [(f.last + 1, f.data) for f in other]
            if progress is not None and time.monotonic() - last > 5:
                last = time.monotonic()
                progress(f"  cycle {drv.cycle}: {drv.rx_frames} frames in, "
                         f"{drv.tx_frames} out")
        res.cycles = drv.cycle
        wall = time.monotonic() - t0
        if progress is not None and wall > 0:
            progress(f"  {res.cycles} cycles in {wall:.1f} s on the {backend} back end "
                     f"({res.cycles / wall:,.0f} cycles/s)")
        drv.finish()
    finally:
        drv.close()
    res.aborted = drv.tx_aborted
    res.qp_table, res.counters, res.statuses = drv.qp_table, drv.counters, drv.statuses
    res.sim_seconds = drv.sim_seconds
    return res


def _replay_model(res, frames, local_mac, local_ip):
    t0 = time.monotonic()
    m = EngineModel(res.n_qp, local_mac=local_mac, local_ip=local_ip)
    for k, f in enumerate(frames):
        tx, other = m.receive(f)
        res.tx += [(k, t) for t in tx]
        res.other += [(k, o) for o in other]
    res.qp_table = [{"qp": q, "qpn": proto.LOCAL_QPN_BASE + q,
                     **{name: int(m.rows[q][name]) for name, _ in proto.QP_CONTEXT_FIELDS}}
                    for q in range(res.n_qp)]
    res.counters = m.counters
    res.statuses = list(m.req.statuses)
    res.sim_seconds = time.monotonic() - t0
    return res


# -- command line ----------------------------------------------------------------------------
def _positive_int(text):
    try:
        v = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return v


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def main(argv=None):
    from roce_hw.config import DATA_WIDTHS
    from sim.backend import BACKENDS, BackendUnavailable
    ap = _Parser(prog="python -m sim.replay", description=__doc__.split("\n\n")[0],
                 epilog="Exit status: 0 done, 1 stopped at --max-cycles, 2 bad arguments or "
                        "unreadable capture.")
    ap.add_argument("--width", type=int, required=True,
                    help=f"bus width in bits ({', '.join(map(str, DATA_WIDTHS))})")
    ap.add_argument("--qps", type=int, required=True, help="QPs of the build (1 to 16384)")
    ap.add_argument("--mac", required=True, help="the engine's MAC, aa:bb:cc:dd:ee:ff")
    ap.add_argument("--ip", required=True, help="the engine's IPv4 address")
    ap.add_argument("--rx", required=True, metavar="IN.pcap",
                    help="frames into the engine (pcap or pcapng)")
    ap.add_argument("--tx", required=True, metavar="OUT.pcap",
                    help="frames the engine sends (written as a nanosecond pcap)")
    ap.add_argument("--json", required=True, metavar="S.json",
                    help="final QP table and counters")
    ap.add_argument("--other", metavar="OTHER.pcap", default=None,
                    help="also write the frames that left on rx_other (default: none)")
    ap.add_argument("--gap", type=_positive_int, default=0,
                    help="idle cycles after every input frame (default: 0, back to back)")
    ap.add_argument("--timing", choices=("back-to-back", "capture"), default="back-to-back",
                    help="back-to-back (default) or the capture's time stamps at the width's "
                         "clock")
    ap.add_argument("--drain", type=_positive_int, default=None,
                    help=f"quiet cycles that end the run (default: {DEFAULT_DRAIN} + twice "
                         f"the longest generator period in the input)")
    ap.add_argument("--max-cycles", type=_positive_int, default=DEFAULT_MAX_CYCLES,
                    help="stop after this many cycles (default: %(default)s)")
    ap.add_argument("--model", action="store_true",
                    help="run the frame-level Python model instead of the hardware")
    ap.add_argument("--backend", choices=BACKENDS, default="amaranth",
                    help="simulator of the hardware: amaranth (default; Python, no compiler) "
                         "or verilator (the emitted Verilog compiled by Verilator: needs "
                         "verilator, g++ and make; the first build of a width takes 1-3 "
                         "minutes, then it is cached)")
    ap.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = ap.parse_args(argv)

    def fail(msg):
        print(f"error: {msg}", file=sys.stderr)
        return 2

    if args.width not in DATA_WIDTHS:
        return fail(f"--width {args.width} is not supported; choose one of "
                    f"{', '.join(map(str, DATA_WIDTHS))}")
    if not 1 <= args.qps <= 16384:
        return fail(f"--qps {args.qps} is out of range (1 to 16384)")
    try:
        mac, ip = parse_mac(args.mac), parse_ip(args.ip)
    except ValueError as e:
        return fail(str(e))
    for opt in ("tx", "json", "other"):
        p = getattr(args, opt)
        if p is not None and Path(p).is_dir():
            return fail(f"--{opt} {p} is a directory")
    try:
        inputs = read_input(args.rx)
    except ValueError as e:
        return fail(str(e))
    log = (lambda msg: None) if args.quiet else (
        lambda msg: print(msg, file=sys.stderr, flush=True))
    what = "model" if args.model else f"engine ({args.backend} back end)"
    log(f"{len(inputs)} frames from {args.rx} into the {what} at {args.width} bits, "
        f"{args.qps} QPs")
    try:
        res = replay([f for _, f in inputs], times=[t for t, _ in inputs], width=args.width,
                     n_qp=args.qps, local_mac=mac, local_ip=ip, gap=args.gap,
                     timing=args.timing, drain=args.drain, max_cycles=args.max_cycles,
                     model=args.model, progress=log, backend=args.backend)
    except BackendUnavailable as e:
        return fail(f"--backend {args.backend}: {e}")
    from sim.pcap import write_pcap
    from sim.traffic import CLOCK_MHZ
    period = 1e-6 / CLOCK_MHZ[args.width]
    try:
        for path, frames in ((args.tx, res.tx), (args.other, res.other)):
            if path is None:
                continue
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            write_pcap(path, [(c * period if not res.model else c * 1e-6, f)
                              for c, f in frames], nanoseconds=True)
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res.to_json(mac=mac, ip=ip, rx_path=args.rx,
                                                          tx_path=args.tx), indent=1) + "\n")
    except OSError as e:
        return fail(f"cannot write {e.filename}: {e.strerror}")
    opened = sum(1 for r in res.qp_table if r["state"] != proto.QPState.RESET)
    print(f"{res.inputs} frames in, {len(res.tx)} out ({res.aborted} aborted, "
          f"{len(res.other)} on rx_other) in {res.cycles} cycles; {opened} QPs open; "
          f"stopped: {res.stopped}")
    return 1 if res.stopped == "limit" else 0


if __name__ == "__main__":
    sys.exit(main())
