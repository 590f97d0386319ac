# SPDX-License-Identifier: BSD-2-Clause
"""Replay a capture into the simulated engine: frames in from a pcap, frames out to a pcap.

Run from the repository root::

    python -m sim.replay --width 64 --qps 16 --mac 02:00:00:00:00:01 --ip 10.0.0.1 \\
        --rx in.pcap --tx out.pcap --json state.json

Every frame of ``--rx`` (pcap or pcapng; Ethernet or Linux cooked captures, see
:mod:`sim.pcap`) goes into :class:`roce_hw.engine.RoceEngine`'s ``rx`` stream in capture order,
one beat per cycle with ``valid`` held for the whole frame (``rx.ready`` is constant 1):

* by default **back to back**, the next frame's first beat in the cycle after the previous
  frame's last beat (line rate: the worst case for the receive path);
* ``--gap N``: ``N`` idle cycles after every frame;
* ``--timing capture``: frame ``k`` starts no earlier than its capture time stamp minus the
  first one's, converted to cycles at the width's clock (:data:`sim.traffic.CLOCK_MHZ`), and
  no earlier than the cycle after the previous frame.

Every frame the engine puts on ``tx`` (data frames, CM replies, ARP replies) is written to
``--tx`` with its simulated time (nanosecond pcap; aborted frames are counted, not written);
``--other`` also writes the frames that left on ``rx_other``. The simulation ends when all input
frames are in and the outputs have been quiet for ``--drain`` cycles (default: 2000, or twice
the longest generator period asked for by a txmeta datagram in the input, plus 2000), or at
``--max-cycles`` (a frame being fed in is finished first). Then the final QP table is read
through the management port (every row, every field of :data:`roce_hw.proto.QP_CONTEXT_FIELDS`
by name, integers) and written with all counters (:func:`roce_hw.engine.engine_counters_layout`,
nested by block: ``tx``, ``rx``, ``cm``) and the refused-WR reports to ``--json``.

``--model`` runs :class:`EngineModel` (this module's frame-level Python model: the RX front end
of :mod:`roce_hw.model.rx`, ARP, the CM of :mod:`roce_hw.model.cm`, the generator on
:class:`roce_hw.model.requester.RequesterModel`) instead of the hardware: the oracle the
hardware's output is compared with, and quick to run (its frames are stamped 1 us apart).

Exit status: 0 done; 1 stopped at ``--max-cycles`` before the outputs were quiet; 2 bad
arguments or an unreadable capture (one line on stderr).
"""

import argparse
import ipaddress
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from roce_hw import proto

__all__ = ["EngineModel", "EngineSim", "ReplayResult", "replay", "read_input", "parse_mac",
           "parse_ip", "mac_str", "struct_to_dict", "generator_periods", "arp_reply_frame",
           "main", "DEFAULT_DRAIN"]

#: Quiet cycles on the outputs that end a replay (plus twice the longest generator period).
DEFAULT_DRAIN = 2000
#: Default ``--max-cycles``.
DEFAULT_MAX_CYCLES = 2_000_000


# -- addresses -------------------------------------------------------------------------------
def parse_mac(text):
    """48-bit integer of ``aa:bb:cc:dd:ee:ff`` (``-`` also accepted); ``ValueError`` else."""
    t = str(text).strip()
    if not re.fullmatch(r"[0-9A-Fa-f]{2}([:-][0-9A-Fa-f]{2}){5}", t):
        raise ValueError(f"bad MAC address {text!r} (expected aa:bb:cc:dd:ee:ff)")
    return int(re.sub(r"[:-]", "", t), 16)


def parse_ip(text):
    """32-bit integer of a dotted IPv4 address; ``ValueError`` else."""
    try:
        return int(ipaddress.IPv4Address(str(text).strip()))
    except ipaddress.AddressValueError:
        raise ValueError(f"bad IPv4 address {text!r}") from None


def mac_str(value):
    return ":".join(f"{b:02x}" for b in int(value).to_bytes(6, "big"))


# -- the frame-level model -------------------------------------------------------------------
def arp_reply_frame(*, local_mac, local_ip, sha, spa):
    """The engine's ARP reply to ``sha``/``spa`` (RFC 826; padded to 60 bytes)."""
    from roce_hw.model.header import insert
    return insert((proto.ETH, proto.ARP, proto.ARP_PAD), {
        "eth": {"dst": sha, "src": local_mac, "ethertype": proto.ETHERTYPE_ARP},
        "arp": {"oper": int(proto.ArpOper.REPLY), "sha": local_mac, "spa": local_ip,
                "tha": sha, "tpa": spa},
    })


class EngineModel:
    """The whole engine at frame level, in Python: what :class:`roce_hw.engine.RoceEngine`
    must do with each received frame (timing aside), composed of the project's models.

    * :func:`roce_hw.model.rx.classify` (the RX front end's rules and counter names) decides;
    * an ARP request for ``local_ip`` -> :func:`arp_reply_frame`;
    * a CM datagram -> :class:`roce_hw.model.cm.CmModel` and its reply frame; a generator start
      then sends all its messages at once (:func:`roce_hw.model.cm.generator_messages` posted
      to a :class:`~roce_hw.model.requester.RequesterModel` sharing the CM's QP rows, so PSNs
      continue and ``next_psn`` is written back);
    * a RoCEv2 frame with a good iCRC -> counted, nothing sent (the ACK path is a later issue's);
    * ``other`` -> ``rx_other`` unchanged (dropped and counted with ``rx_other=False``).

    No queue ever overflows here (the hardware's ``*_full`` counters stay 0 in the model).
    :meth:`receive` returns ``(tx frames, rx_other frames)`` for one frame; the counters are
    :attr:`counters` ``{"rx": ..., "cm": ...}`` as the hardware's ``counters.rx``/``.cm``.
    """

    def __init__(self, n_qp, *, local_mac, local_ip, cm_pmtu=int(proto.Pmtu.MTU_1024), ttl=64,
                 ack_req_every=64, ip_id_start=0, rx_other=True):
        from roce_hw.model.cm import CmModel
        from roce_hw.model.requester import RequesterModel
        from roce_hw.model.rx import RxCounterModel
        self.local_mac, self.local_ip = int(local_mac), int(local_ip)
        self.rx_other = rx_other
        self.cm = CmModel(n_qp, local_mac=local_mac, local_ip=local_ip, cm_pmtu=cm_pmtu,
                          ttl=ttl)
        self.req = RequesterModel(n_qp=n_qp, ack_req_every=ack_req_every, ttl=ttl,
                                  ip_id_start=ip_id_start, local_mac=self.local_mac,
                                  local_ip=self.local_ip)
        self.req.qps.rows = self.cm.rows          # one QP table
        self.rx = RxCounterModel()

    @property
    def rows(self):
        return self.cm.rows

    @property
    def counters(self):
        return {"rx": dict(self.rx.counts), "cm": dict(self.cm.counters)}

    def receive(self, frame, bad=False):
        from roce_hw.host import datagram as dg
        from roce_hw.model.cm import generator_messages
        from roce_hw.model.rx import classify
        frame = bytes(frame)
        res = classify(frame, bad=bad, local_mac=self.local_mac, local_ip=self.local_ip)
        self.rx.add(res, taken=res.kind != "other" or self.rx_other)
        if res.kind == "arp":
            return [arp_reply_frame(local_mac=self.local_mac, local_ip=self.local_ip,
                                    sha=res.fields["sha"], spa=res.fields["spa"])], []
        if res.kind == "cm":
            f = res.fields
            reply = self.cm.handle(dg.pack(f["dgram"]), f["src_mac"], f["src_ip"],
                                   f["src_port"], f["udp_checksum"])
            out = [] if reply is None else [self.cm.frame(reply)]
            gen = self.cm.generator
            if gen is not None:
                for wr in generator_messages(gen):
                    sent = self.req.post(qp=gen.qp, opcode=wr["opcode"], payload=wr["payload"],
                                         wr_id=wr["wr_id"], remote_addr=wr["remote_addr"],
                                         r_key=wr["r_key"], imm=wr["imm"] or 0)
                    out += [s.frame for s in sent if s.frame is not None]
                self.cm.generator_done()
            return out, []
        if res.kind == "other" and self.rx_other:
            return [], [frame]
        return [], []


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


class EngineSim:
    """Drives a simulated engine frame by frame (the harness of this tool and of
    :mod:`sim.e2e`).

    ``dut`` has the :class:`roce_hw.engine.RoceEngine` ports (any it lacks are skipped): ``rx``
    is driven one beat per cycle (``ready`` must be 1: the harness checks it), ``tx`` and
    ``rx_other`` are consumed with ``ready`` held at 1, ``status`` too (reports collected),
    ``wr``/``i``/``resume``/``ip_id_load`` stay idle.

    The caller supplies:

    * ``source(cycle, idle) -> bytes | None``: called when ``rx`` is free; the next frame to
      send now, or ``None`` (``idle`` = cycles since anything moved on any port);
    * ``on_tx(frame, cycle, aborted)`` and ``on_other(frame, cycle)``: called the cycle a
      frame's last beat is transferred;
    * ``done(cycle, idle) -> bool``: checked every cycle while ``rx`` is free.

    :meth:`run` returns when ``done`` says so or at ``max_cycles``; then the QP table is read
    through ``qp_mgmt_req``/``qp_mgmt_rsp`` (:attr:`qp_table`) and the counters sampled
    (:attr:`counters`).
    """

    def __init__(self, dut, *, local_mac, local_ip, source, on_tx, on_other=None, done,
                 max_cycles=DEFAULT_MAX_CYCLES, read_table=True):
        self.dut = dut
        self.config = getattr(dut, "config", None)
        self.nbytes = len(dut.rx.payload.data) // 8
        self.local_mac, self.local_ip = int(local_mac), int(local_ip)
        self.source, self.on_tx, self.on_other, self.done = source, on_tx, on_other, done
        self.max_cycles = max_cycles
        self.read_table = read_table
        self.cycle = 0
        self.finished = False
        self.hit_limit = False
        self.statuses = []            #: refused-WR reports ``{wr_id, qp, status}``
        self.qp_table = []            #: rows read at the end, ``dict`` per QP
        self.counters = {}
        self.rx_frames = 0
        self.tx_frames = 0
        self.tx_aborted = 0
        self.other_frames = 0
        self.sim_seconds = 0.0

    def _has(self, name):
        return name in getattr(self.dut, "signature").members

    async def _bench(self, ctx):
        dut = self.dut
        n = self.nbytes
        if self._has("local_mac"):
            ctx.set(dut.local_mac, self.local_mac)
        if self._has("local_ip"):
            ctx.set(dut.local_ip, self.local_ip)
        ctx.set(dut.tx.ready, 1)
        outs = [dut.tx.valid, dut.tx.payload]
        other = self._has("rx_other")
        if other:
            ctx.set(dut.rx_other.ready, 1)
            outs += [dut.rx_other.valid, dut.rx_other.payload]
        status = self._has("status")
        if status:
            ctx.set(dut.status.ready, 1)
            outs += [dut.status.valid, dut.status.payload]
        tx_cur, other_cur = bytearray(), bytearray()
        beats, idle = [], 0
        while True:
            if not beats:
                if self.done(self.cycle, idle):
                    break
                if self.cycle >= self.max_cycles:
                    self.hit_limit = True
                    break
                frame = self.source(self.cycle, idle)
                if frame is not None:
                    frame = bytes(frame)
                    if not frame:
                        raise ValueError("an empty frame cannot be sent on a stream")
                    beats = [frame[i:i + n] for i in range(0, len(frame), n)]
                    beats = [(k == 0, k == len(beats) - 1, b) for k, b in enumerate(beats)]
                    self.rx_frames += 1
            if beats:
                first, last, chunk = beats.pop(0)
                ctx.set(dut.rx.payload, {"data": int.from_bytes(chunk, "little"),
                                         "keep": (1 << len(chunk)) - 1, "first": int(first),
                                         "last": int(last), "abort": 0})
                ctx.set(dut.rx.valid, 1)
                if not ctx.get(dut.rx.ready):
                    raise AssertionError(f"cycle {self.cycle}: rx.ready is 0 (it must be "
                                         f"constant 1)")
                idle = 0
            else:
                ctx.set(dut.rx.valid, 0)
            got = await ctx.tick().sample(*outs)
            self.cycle += 1
            moved = False
            valid, p = got[2], got[3]
            if valid:
                moved = True
                tx_cur += int(p.data).to_bytes(n, "little")[:int(p.keep).bit_length()]
                if p.last:
                    aborted = bool(p.abort)
                    self.tx_frames += not aborted
                    self.tx_aborted += aborted
                    self.on_tx(bytes(tx_cur), self.cycle, aborted)
                    tx_cur = bytearray()
            k = 4
            if other:
                valid, p = got[k], got[k + 1]
                k += 2
                if valid:
                    moved = True
                    other_cur += int(p.data).to_bytes(n, "little")[:int(p.keep).bit_length()]
                    if p.last:
                        self.other_frames += 1
                        if self.on_other is not None:
                            self.on_other(bytes(other_cur), self.cycle)
                        other_cur = bytearray()
            if status and got[k]:
                p = got[k + 1]
                self.statuses.append({"wr_id": int(p.wr_id), "qp": int(p.qp),
                                      "status": int(p.status)})
            idle = 0 if moved else idle + 1
        ctx.set(dut.rx.valid, 0)
        if self.read_table and self._has("qp_mgmt_req"):
            self.qp_table = await self._read_table(ctx)
        if self._has("counters"):
            self.counters = struct_to_dict(dut.counters.shape(), ctx.get(dut.counters))
        self.finished = True

    async def _read_table(self, ctx):
        dut = self.dut
        n_qp = self.config.n_qp if self.config is not None else 1
        rows = []
        from roce_hw.layouts import QP_CONTEXT
        for q in range(n_qp):
            ctx.set(dut.qp_mgmt_req.payload, {"qp": q, "write": 0})
            ctx.set(dut.qp_mgmt_req.valid, 1)
            await ctx.tick().until(dut.qp_mgmt_req.ready)
            ctx.set(dut.qp_mgmt_req.valid, 0)
            ctx.set(dut.qp_mgmt_rsp.ready, 1)
            (rsp,) = await ctx.tick().sample(dut.qp_mgmt_rsp.payload).until(
                dut.qp_mgmt_rsp.valid)
            ctx.set(dut.qp_mgmt_rsp.ready, 0)
            if rsp.error or int(rsp.qp) != q:
                raise RuntimeError(f"management read of QP {q} failed (error {int(rsp.error)}, "
                                   f"qp {int(rsp.qp)})")
            row = struct_to_dict(QP_CONTEXT, rsp.ctx)
            rows.append({"qp": q, "qpn": proto.LOCAL_QPN_BASE + q,
                         **{name: row[name] for name, _ in proto.QP_CONTEXT_FIELDS}})
        return rows

    def run(self, progress=None, chunk=2048):
        """Simulate until done; ``progress(text)`` every few seconds."""
        from amaranth.sim import Simulator
        sim = Simulator(self.dut)
        period = 1e-8
        sim.add_clock(period)
        sim.add_testbench(self._bench)
        t0 = last = time.monotonic()
        now = 0
        while not self.finished:
            now += chunk
            sim.run_until(period * (now + 0.5))
            if progress is not None and time.monotonic() - last > 5:
                last = time.monotonic()
                progress(f"  cycle {self.cycle}: {self.rx_frames} frames in, "
                         f"{self.tx_frames} out")
        self.sim_seconds = time.monotonic() - t0
        return self


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

    def to_json(self, *, mac, ip, rx_path=None, tx_path=None):
        return {
            "tool": "sim.replay", "engine": "model" if self.model else "RoceEngine",
            "width": self.width, "n_qp": self.n_qp, "mac": mac_str(mac),
            "ip": str(ipaddress.IPv4Address(ip)),
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
           config=None):
    """Replay ``frames`` (bytes) into the engine; returns a :class:`ReplayResult`.
    ``times`` (seconds) are used with ``timing="capture"``."""
    from roce_hw.config import EngineConfig
    frames = [bytes(f) for f in frames]
    if drain is None:
        periods = generator_periods(frames, local_mac=local_mac, local_ip=local_ip)
        drain = DEFAULT_DRAIN + 2 * max(periods, default=0)
    res = ReplayResult(width=width, n_qp=n_qp, inputs=len(frames), drain=drain, model=model)
    if model:
        return _replay_model(res, frames, local_mac, local_ip)
    from roce_hw.engine import RoceEngine
    config = config or EngineConfig(data_width=width, n_qp=n_qp)
    starts = _schedule(times or [0.0] * len(frames), width, gap, timing)
    state = {"next": 0, "free_at": 0}

    def source(cycle, idle):
        k = state["next"]
        if k >= len(frames) or cycle < state["free_at"]:
            return None
        if starts[k] is not None and cycle < starts[k]:
            return None
        state["next"] = k + 1
        beats = -(-len(frames[k]) // (width // 8))
        state["free_at"] = cycle + beats + gap
        return frames[k]

    def on_tx(frame, cycle, aborted):
        if not aborted:
            res.tx.append((cycle, frame))

    def on_other(frame, cycle):
        res.other.append((cycle, frame))

    def done(cycle, idle):
        return state["next"] >= len(frames) and cycle >= state["free_at"] and idle >= drain

    dut = RoceEngine(config)
    sim = EngineSim(dut, local_mac=local_mac, local_ip=local_ip, source=source, on_tx=on_tx,
                    on_other=on_other, done=done, max_cycles=max_cycles)
    sim.run(progress=progress)
    res.aborted = sim.tx_aborted
    res.qp_table, res.counters, res.statuses = sim.qp_table, sim.counters, sim.statuses
    res.cycles, res.sim_seconds = sim.cycle, sim.sim_seconds
    res.stopped = "limit" if sim.hit_limit else "quiet"
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
    log(f"{len(inputs)} frames from {args.rx} into the {'model' if args.model else 'engine'} "
        f"at {args.width} bits, {args.qps} QPs")
    res = replay([f for _, f in inputs], times=[t for t, _ in inputs], width=args.width,
                 n_qp=args.qps, local_mac=mac, local_ip=ip, gap=args.gap, timing=args.timing,
                 drain=args.drain, max_cycles=args.max_cycles, model=args.model, progress=log)
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
