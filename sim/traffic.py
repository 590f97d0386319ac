# SPDX-License-Identifier: BSD-2-Clause
"""Simulate the RoCEv2 TX engine on random or scripted traffic; write a pcap and a JSON summary.

Run from the repository root::

    python -m sim.traffic --width 512 --qps 4 --messages 50 --ops write,write_imm,send,send_imm \\
        --min-size 0 --max-size 5000 --pmtu 1024 --seed 1 --pcap build/tx.pcap --json build/tx.json
    python -m sim.traffic --scenario scenario.json --pcap build/tx.pcap

A scenario file gives the engine's addresses, the QP contexts and an explicit WR list::

    {
      "width": 512,                                  (optional; --width wins if given)
      "local_mac": "02:00:00:00:00:01", "local_ip": "10.0.0.1", "ip_id_start": 1234,
      "qps": [{"index": 0, "remote_qpn": 17, "remote_mac": "02:00:00:00:00:02",
               "remote_ip": "10.0.0.2", "start_psn": 0, "udp_sport": 49152, "pmtu": 1024,
               "dscp": 0, "ecn": 0}],
      "wrs": [{"qp": 0, "opcode": "write", "remote_addr": 4096, "r_key": 5, "imm": 0,
               "solicited": false, "payload_hex": "00010203"}]
    }

The TX engine top (``roce_tx``) is simulated by Amaranth (``--backend amaranth``, the default) or,
compiled by Verilator, by ``--backend verilator`` (:mod:`sim.backend`): both give the same frames
in the same cycles, so the same pcap. A random run's WRs, payloads and idle/stall patterns are a
pure function of ``--seed``. Every frame the engine transmits is checked against the golden model
(:mod:`roce_hw.model`); the JSON has one record per message and the totals: frames, payload bytes,
cycles, cycles with a beat on the bus, bus utilisation and goodput in bytes per cycle.

**Closed loop and lossy network** (issue 35): ``--closed-loop``, or any option of
:mod:`sim.faults` (``--loss``, ``--dup``, ``--reorder``, ``--corrupt``, ``--delay``
probabilities in both directions, ``--drop-data``/``--drop-retx``/``--drop-ack``/``--drop-nak``
targeted drops, ``--latency``, ``--net-seed``), simulates the whole engine (``roce_engine``)
against the responder model (:func:`run_closed_loop`) through a seeded
:class:`sim.lossy.LossyNetwork`, and checks delivery as :mod:`sim.reliable_loop` does. The JSON
then adds ``network`` (options; per direction ``fwd``/``rev`` the frames in and out, dropped,
targeted_dropped, duplicated, reordered, corrupted, delayed), ``reliability`` (retransmitted
packets on the wire, ACKs and NAKs received by kind from the engine's ``ack_*`` counters, the
iCRC drops, the NAKs the responder sent, ``timeouts`` and ``rnr_waits`` -- 0: the engine has no
timers yet --, completions by status -- only refused WRs: no completion queue yet --, and
``not_built`` saying so) and ``delivery`` (``ok``: every message arrived exactly once, in
order, byte-identical; ``delivered``, ``lost``, ``refused``, ``arrived_ok``: what arrived did
so exactly once, in order, byte-identical; ``all_arrived``; the problems; the responder's
counters). The engine does not retransmit yet, so a lossy run loses the messages after a loss
on their QP: the last line says ``delivery: FAIL ...`` and the run exits 1.

Exit status: 0 when the engine's frames match the golden model, with no framing error and (closed
loop) every message delivered; 1 when one of those fails or the engine stops moving; 2 for a bad
option or scenario, or a back end that cannot run here.
"""

import argparse
import hashlib
import ipaddress
import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

from roce_hw import proto
from roce_hw.config import DATA_WIDTHS, MAX_N_QP, EngineConfig
from sim import faults
from sim.backend import BACKENDS
from sim.bfm import QPSetup, WorkItem, parse_ip, parse_mac, qp_context

__all__ = ["CLOCK_MHZ", "QPSetup", "qp_context", "WorkItem", "TrafficResult", "run_traffic",
           "LoopResult", "run_closed_loop", "peer_for",
           "random_workload", "load_scenario", "expected_frames", "count_mismatches", "summary", "main"]

OPS = {
    "write": proto.WrOpcode.RDMA_WRITE,
    "write_imm": proto.WrOpcode.RDMA_WRITE_WITH_IMM,
    "send": proto.WrOpcode.SEND,
    "send_imm": proto.WrOpcode.SEND_WITH_IMM,
}
OP_NAMES = {v: k for k, v in OPS.items()}

#: Clock assumed per bus width, in MHz, to turn cycles into time (pcap time stamps) and bytes
#: per cycle into Gb/s (:mod:`bench.throughput`): 10G-class MACs at 64 bits, 25G/40G at
#: 128/256 bits, 100G/200G-class at 512/1024 bits.
CLOCK_MHZ = {64: 156.25, 128: 250.0, 256: 250.0, 512: 322.0, 1024: 322.0}

#: Cycles of silence on the output after all input is consumed that end a simulation.
QUIET_CYCLES = 200

#: Simulated cycles between two calls of ``run_traffic``'s ``progress`` callback.
PROGRESS_CYCLES = 512

DEFAULT_LOCAL_MAC = 0x02_00_00_00_00_01
DEFAULT_LOCAL_IP = int(ipaddress.IPv4Address("10.0.0.1"))


@dataclass
class TrafficResult:
    frames: list = field(default_factory=list)     #: (first cycle, last cycle, bytes, aborted, beats)
    statuses: list = field(default_factory=list)   #: dicts: wr_id, qp, status
    wr_cycles: list = field(default_factory=list)  #: cycle each WR was accepted
    cycles: int = 0                                #: cycles from the first WR accepted to the last beat
    busy_cycles: int = 0                           #: cycles with a beat transferred on `o`
    ready_cycles: int = 0                          #: cycles `o.ready` was high, first..last beat
    span_cycles: int = 0                           #: cycles from the first to the last beat
    framing_errors: list = field(default_factory=list)  #: beats breaking the AXI-Stream rules
    sim_cycles: int = 0                            #: cycles simulated in all (set-up included)
    sim_seconds: float = 0.0                       #: wall time of the simulation proper
    backend: str = "amaranth"

    @property
    def good_frames(self):
        return [f[2] for f in self.frames if not f[3]]

    @property
    def utilisation(self):
        return self.busy_cycles / self.ready_cycles if self.ready_cycles else 0.0

    @property
    def latency(self):
        """Cycles from the first WR accepted to the first beat out, or None."""
        return self.frames[0][0] - self.wr_cycles[0] if self.frames and self.wr_cycles else None


#: Cycles per :meth:`run` slice of each back end (how often progress is reported and outputs
#: collected; the results do not depend on it).
SLICE_CYCLES = {"amaranth": PROGRESS_CYCLES, "verilator": 1 << 16}


def run_traffic(config, qps, wrs, *, local_mac=DEFAULT_LOCAL_MAC, local_ip=DEFAULT_LOCAL_IP,
                seed=0, p_wr_idle=0.0, p_payload_idle=0.0, p_stall=0.0,
                max_cycles=None, progress=None, backend="amaranth", log=None):
    """Simulate the TX engine top (:class:`~roce_hw.top.TxTop`, module ``roce_tx``) built from
    ``config`` on ``backend`` (:data:`sim.backend.BACKENDS`).

    The QPs are written through the management port first; then the WRs are posted while the
    payload producer and the frame consumer run with the given idle/stall probabilities (one
    seeded generator per stream, :mod:`sim.backend`). Both back ends give the same result,
    cycle for cycle. Returns a :class:`TrafficResult`; raises ``TimeoutError`` if the engine
    stops moving before everything is out.

    ``progress``, if given, is called every slice of simulated cycles (:data:`SLICE_CYCLES`) as
    ``progress(cycles, wrs_accepted, frames_sent)`` (e.g. :meth:`sim.harness.Progress.update`).
    """
    import time

    from sim.backend import open_engine

    width = config.data_width
    nbytes = width // 8
    if max_cycles is None:
        # Generous: four times the beats the frames need, plus set-up and the quiet tail.
        n_frames = sum(max(1, -(-len(w.payload) // _pmtu_of(qps, w.qp))) for w in wrs)
        total_bytes = sum(len(w.payload) for w in wrs)
        max_cycles = 2000 + 4 * (total_bytes // nbytes + n_frames * (80 // nbytes + 4))
        if p_wr_idle or p_payload_idle or p_stall:
            max_cycles *= 4
    eng = open_engine(config, backend=backend, top="tx", seed=seed, log=log)
    eng.set_addr(local_mac, local_ip)
    eng.set_random(wr=p_wr_idle, payload=p_payload_idle, tx=p_stall)
    for q in qps:
        eng.write_qp(q)
    for n, w in enumerate(wrs):
        eng.post(w, wr_id=w.wr_id or n)
    res = TrafficResult(backend=backend)
    frames = []
    chunk = SLICE_CYCLES[backend]
    t0 = time.monotonic()
    while True:
        ran = eng.run(min(chunk, max_cycles - eng.cycle), quiet=QUIET_CYCLES)
        frames += eng.pop_tx()
        res.statuses += [{k: int(s[k]) for k in ("wr_id", "qp", "status")}
                         for s in eng.pop_status()]
        res.wr_cycles += eng.pop_wr_accepts()
        if progress is not None:
            progress(eng.cycle, len(res.wr_cycles), len(frames))
        if ran < chunk and eng.cycle < max_cycles:
            break                                       # quiet: everything is out
        if eng.cycle >= max_cycles:
            eng.close()
            raise TimeoutError(f"the engine did not finish within {max_cycles} cycles: "
                               f"{len(res.wr_cycles)}/{len(wrs)} WRs accepted, "
                               f"{len(frames)} frames out")
    res.sim_seconds = time.monotonic() - t0
    res.sim_cycles = eng.cycle
    eng.close()
    _add_frames(res, frames)
    return res


def _add_frames(res, frames):
    """Fill ``res`` (:class:`TrafficResult`, ``wr_cycles`` set) from the :class:`TxFrame` s
    the engine sent: frames, framing errors and the cycle counts."""
    from sim.backend import framing_errors
    for k, f in enumerate(frames):
        res.frames.append((f.first, f.last, f.data, bool(f.tuser), f.beats))
        res.framing_errors += [f"frame {k}, {text}" for text in framing_errors(f.errors)]
    if frames:
        first, last = frames[0], frames[-1]
        res.cycles = last.last - res.wr_cycles[0] + 1 if res.wr_cycles else last.last + 1
        res.busy_cycles = sum(f.beats for f in frames)
        res.span_cycles = last.last - first.first + 1
        res.ready_cycles = last.ready_last - first.ready_first + 1


@dataclass
class LoopResult:
    """What :func:`run_closed_loop` produced."""
    frames: list = field(default_factory=list)     #: TxFrame of every frame the engine sent
    replies: int = 0                               #: frames the responder sent back
    completions: list = field(default_factory=list)  #: the responder's completed messages
    violations: list = field(default_factory=list)   #: the responder's complaints
    statuses: list = field(default_factory=list)
    counters: dict = field(default_factory=dict)   #: the engine's counters at the end
    cycles: int = 0                                #: cycles simulated in all
    sim_seconds: float = 0.0
    backend: str = "amaranth"
    finished: bool = False                         #: done before ``max_cycles``
    #: the loop's checks and counts (:class:`sim.reliable_loop.LoopReport`)
    report: object = None
    network: object = None                         #: the :class:`sim.lossy.LossyNetwork`
    #: the frames as :func:`run_traffic` reports them (for :func:`summary`)
    traffic: TrafficResult = None


def peer_for(qps, wrs, *, local_mac=DEFAULT_LOCAL_MAC, local_ip=DEFAULT_LOCAL_IP):
    """A :class:`sim.peer.ResponderModel` ready for ``wrs``: a responder QP per QPSetup (its
    expected PSN the QP's start PSN), a memory region per RDMA WRITE, receive buffers for the
    SENDs."""
    from sim.peer import ResponderModel
    peer = ResponderModel()
    for q in qps:
        peer.add_qp(q.remote_qpn, epsn=q.start_psn, pmtu=q.pmtu,
                    remote_qpn=proto.LOCAL_QPN_BASE + q.index)
    sends = {}
    for w in wrs:
        if w.opcode in (proto.WrOpcode.RDMA_WRITE, proto.WrOpcode.RDMA_WRITE_WITH_IMM):
            if w.payload:
                peer.register_mr(w.remote_addr, len(w.payload), w.r_key)
        if w.opcode != proto.WrOpcode.RDMA_WRITE:
            sends.setdefault(w.qp, []).append(len(w.payload))
    for q in qps:
        if q.index in sends:
            peer.post_recv(q.remote_qpn, max(max(sends[q.index]), 1), len(sends[q.index]))
    return peer


def run_closed_loop(config, qps, wrs, *, local_mac=DEFAULT_LOCAL_MAC, local_ip=DEFAULT_LOCAL_IP,
                    seed=0, delay=100, network=None, slice_cycles=None, backend="amaranth",
                    max_cycles=None, p_stall=0.0, progress=None, log=None):
    """The whole engine (:class:`~roce_hw.top.EngineTop`) with the responder model answering
    through a network: every frame the engine sends goes through ``network``'s forward link
    to :func:`peer_for`'s :class:`sim.peer.ResponderModel`, and its replies (ACKs, NAKs) come
    back through the reverse link into the engine's RX port.

    The loop is :func:`sim.reliable_loop.run_reliable_loop` with the engine behind
    :class:`sim.reliable_loop.HardwareRequester`: frames and replies keep their cycles exactly
    when ``slice_cycles`` (default: the smaller of 128 and the network's delay) is at most the
    delay. ``network``: ``None`` (lossless, ``delay`` cycles each way), a dict of
    :class:`sim.lossy.LossyNetwork` keyword arguments (``seed`` and ``delay`` default to these
    arguments) or a network. ``p_stall``: probability of idle/backpressure cycles on the WR,
    payload and tx streams. Returns a :class:`LoopResult` (``finished`` False if the loop had
    not ended within ``max_cycles``; by default generous for the workload)."""
    import time

    from sim.backend import open_engine
    from sim.lossy import LossyNetwork
    from sim.reliable_loop import HardwareRequester, run_reliable_loop

    if network is None or isinstance(network, dict):
        network = LossyNetwork(**{"seed": seed, "delay": delay, **(network or {})})
    nbytes = config.data_width // 8
    if max_cycles is None:
        n_frames = sum(max(1, -(-len(w.payload) // _pmtu_of(qps, w.qp))) for w in wrs)
        total = sum(len(w.payload) for w in wrs)
        slow = max(network.fwd.delay + network.fwd.max_hold + network.fwd.delay_max,
                   network.rev.delay + network.rev.max_hold + network.rev.delay_max)
        max_cycles = 4000 + 4 * (total // nbytes + n_frames * (80 // nbytes + 4)) + 8 * slow
        if p_stall:
            max_cycles *= 4
    peer = peer_for(qps, wrs, local_mac=local_mac, local_ip=local_ip)
    eng = open_engine(config, backend=backend, top="engine", seed=seed, log=log)
    if p_stall:
        eng.set_random(wr=p_stall, payload=p_stall, tx=p_stall)
    step = slice_cycles or max(1, min(128, network.fwd.delay, network.rev.delay))
    hw = HardwareRequester(eng, local_mac=local_mac, local_ip=local_ip, slice_cycles=step,
                           keep_tx=True, progress=progress)
    res = LoopResult(backend=backend, network=network)
    t0 = time.monotonic()
    rep = run_reliable_loop(qps, wrs, requester=hw, responder=peer, network=network,
                            max_cycles=max_cycles)
    res.sim_seconds = time.monotonic() - t0
    res.report, res.finished = rep, rep.finished
    res.cycles = eng.cycle
    res.frames = hw.sent
    res.replies = len(peer.sent)
    res.statuses = [{k: int(c[k]) for k in ("wr_id", "qp", "status")} for c in rep.completions]
    res.counters = eng.counters()
    res.completions = list(peer.completions)
    res.violations = list(peer.violations)
    res.traffic = TrafficResult(backend=backend, statuses=res.statuses,
                                wr_cycles=eng.pop_wr_accepts(), sim_cycles=eng.cycle,
                                sim_seconds=res.sim_seconds)
    _add_frames(res.traffic, [f for f in hw.sent])
    eng.close()
    return res


def _pmtu_of(qps, index):
    """PMTU of QP ``index`` (256 if the WR names a QP that was not set up)."""
    for q in qps:
        if q.index == index:
            return q.pmtu
    return 256


def requester_model(config, qps, wrs, *, local_mac=DEFAULT_LOCAL_MAC, local_ip=DEFAULT_LOCAL_IP,
                    ip_id_start=None):
    """The requester model (:class:`roce_hw.model.requester.RequesterModel`) after the QPs of
    ``qps`` are written and ``wrs`` posted: its ``frames`` (aborted ones left out),
    ``statuses`` and ``aborted``. The first IP ID is ``ip_id_start``, by default
    ``config.ip_id_start``."""
    from roce_hw.model.requester import RequesterModel
    model = RequesterModel(n_qp=config.n_qp, ack_req_every=config.ack_req_every, ttl=config.ttl,
                           ip_id_start=config.ip_id_start if ip_id_start is None
                           else ip_id_start, local_mac=local_mac, local_ip=local_ip)
    for q in qps:
        model.write_qp(q.index, qp_context(q))
    for w in wrs:
        model.post(qp=w.qp, opcode=w.opcode, payload=w.payload, length=w.wr_length,
                   wr_id=w.wr_id, remote_addr=w.remote_addr, r_key=w.r_key, imm=w.imm,
                   solicited=w.solicited)
    return model


def expected_frames(config, qps, wrs, *, local_mac=DEFAULT_LOCAL_MAC, local_ip=DEFAULT_LOCAL_IP,
                    ip_id_start=None):
    """The frames the requester model says the engine sends for ``wrs`` (aborted ones left
    out); the first IP ID is ``ip_id_start``, by default ``config.ip_id_start``."""
    return requester_model(config, qps, wrs, local_mac=local_mac, local_ip=local_ip,
                           ip_id_start=ip_id_start).frames


def count_mismatches(got, expect):
    """Frames of ``got`` that differ from ``expect`` position by position, plus the difference
    in count (a missing or extra frame counts once)."""
    return sum(a != b for a, b in zip(got, expect)) + abs(len(got) - len(expect))


def random_workload(*, n_qps, messages, ops, min_size, max_size, pmtu, seed):
    """Seeded random QPs and WRs: the result is a pure function of the arguments."""
    rng = random.Random(seed)
    qps = [QPSetup(index=i, remote_qpn=rng.randrange(1, 1 << 24),
                   remote_mac=0x02_00_00_00_10_00 | i, remote_ip=int(ipaddress.IPv4Address("10.0.1.0")) + i + 1,
                   udp_sport=0xC000 | rng.randrange(1 << 14), start_psn=rng.randrange(1 << 24),
                   pmtu=pmtu) for i in range(n_qps)]
    wrs = []
    for n in range(messages):
        size = rng.randint(min_size, max_size)
        wrs.append(WorkItem(qp=rng.randrange(n_qps), opcode=OPS[rng.choice(ops)],
                            payload=rng.randbytes(size), remote_addr=rng.getrandbits(64),
                            r_key=rng.getrandbits(32), imm=rng.getrandbits(32), wr_id=n + 1))
    return qps, wrs


#: Field widths in bits that a scenario's QPs and WRs must respect (the QP context row and the
#: WR descriptor of the engine; a wider value would be silently truncated by the hardware).
_CTX_BITS = dict(proto.QP_CONTEXT_FIELDS)
_QP_BITS = {"index": (MAX_N_QP - 1).bit_length(), "start_psn": _CTX_BITS["next_psn"],
            **{k: _CTX_BITS[k] for k in ("remote_qpn", "remote_mac", "remote_ip", "udp_sport",
                                         "dscp", "ecn", "p_key", "migreq")}}


def _wr_bits():
    """The WR fields' widths, from :func:`roce_hw.verbs.wr_layout` (imported here: reading a
    scenario needs no Amaranth otherwise)."""
    from amaranth import Shape

    from roce_hw.verbs import wr_layout
    return {name: Shape.cast(f.shape).width for name, f in wr_layout(EngineConfig(data_width=64))
            if name in ("remote_addr", "r_key", "imm")}


def _check_bits(what, obj, widths):
    for name, bits in widths.items():
        value = getattr(obj, name)
        if not 0 <= value < 1 << bits:
            raise ValueError(f"{what}: {name} = {value} does not fit in {bits} bits")


#: The keys a scenario file may use, per level (anything else is refused by name).
SCENARIO_KEYS = {
    "top level": ("width", "local_mac", "local_ip", "ip_id_start", "qps", "wrs"),
    "qps": ("index", "remote_qpn", "remote_mac", "remote_ip", "udp_sport", "start_psn", "pmtu",
            "dscp", "ecn", "p_key", "migreq"),
    "wrs": ("qp", "opcode", "remote_addr", "r_key", "imm", "solicited", "payload_hex"),
}


def _check_keys(path, where, obj, level):
    """Refuse unknown keys of ``obj`` (a JSON object at ``where``), naming them and the nearest
    allowed key, as strictly as a datagram parser must."""
    import difflib
    if not isinstance(obj, dict):
        raise ValueError(f"scenario {path}: {where} must be a JSON object, not {obj!r}")
    allowed = SCENARIO_KEYS[level]
    for key in obj:
        if key not in allowed:
            near = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ValueError(f"scenario {path}: {where}: unknown key {key!r}{hint}; allowed: "
                             f"{', '.join(allowed)}")


def load_scenario(path):
    """Read a scenario JSON file: returns ``(settings, qps, wrs)``.

    Raises
    ------
    ValueError
        With a message naming the file and the problem: unreadable file or bad JSON, an
        unknown key at any level (:data:`SCENARIO_KEYS`: a typo such as ``"pmut"`` is named,
        never ignored), a missing or malformed field, a value out of range, an unknown opcode
        or PMTU, or a WR on a QP that the scenario does not set up.
    """
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read scenario {path}: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"scenario {path}: the top level must be a JSON object")
    _check_keys(path, "top level", doc, "top level")
    for level in ("qps", "wrs"):
        if level in doc and not isinstance(doc[level], list):
            raise ValueError(f"scenario {path}: {level!r} must be a JSON list")
        for n, entry in enumerate(doc.get(level, [])):
            _check_keys(path, f"{level}[{n}]", entry, level)
    try:
        settings = {
            "width": doc.get("width"),
            "local_mac": parse_mac(doc.get("local_mac", DEFAULT_LOCAL_MAC)),
            "local_ip": parse_ip(doc.get("local_ip", DEFAULT_LOCAL_IP)),
            "ip_id_start": int(doc.get("ip_id_start", 0)),
        }
        qps = [QPSetup(index=int(q["index"]), remote_qpn=int(q["remote_qpn"]),
                       remote_mac=parse_mac(q["remote_mac"]), remote_ip=parse_ip(q["remote_ip"]),
                       udp_sport=int(q.get("udp_sport", 0xC000)),
                       start_psn=int(q.get("start_psn", 0)), pmtu=int(q.get("pmtu", 1024)),
                       dscp=int(q.get("dscp", 0)), ecn=int(q.get("ecn", 0)),
                       p_key=int(q.get("p_key", 0xFFFF)), migreq=int(q.get("migreq", 0)))
               for q in doc["qps"]]
        wrs = []
        for n, w in enumerate(doc["wrs"]):
            op = w["opcode"]
            if op not in OPS:
                raise ValueError(f"WR {n}: opcode {op!r} is not one of {', '.join(OPS)}")
            wrs.append(WorkItem(qp=int(w["qp"]), opcode=OPS[op],
                                payload=bytes.fromhex(w.get("payload_hex", "")),
                                remote_addr=int(w.get("remote_addr", 0)),
                                r_key=int(w.get("r_key", 0)), imm=int(w.get("imm", 0)),
                                solicited=bool(w.get("solicited", False)), wr_id=n + 1))
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"scenario {path}: missing or bad field {e}") from None
    if not 0 <= settings["ip_id_start"] <= 0xFFFF:
        raise ValueError(f"scenario {path}: ip_id_start = {settings['ip_id_start']} is not a "
                         f"16-bit value")
    for q in qps:
        proto.pmtu_code(q.pmtu)
        _check_bits(f"scenario {path}: QP {q.index}", q, _QP_BITS)
    known = {q.index for q in qps}
    wr_bits = _wr_bits()
    for n, w in enumerate(wrs):
        if w.qp not in known:
            raise ValueError(f"scenario {path}: WR {n} names QP {w.qp}, which is not among the "
                             f"scenario's QPs {sorted(known)}")
        _check_bits(f"scenario {path}: WR {n}", w, wr_bits)
    return settings, qps, wrs


def summary(config, qps, wrs, res):
    """JSON-ready summary: one record per message and the totals."""
    payload_bytes = sum(len(w.payload) for w in wrs)
    messages = [{
        "wr_id": w.wr_id, "qp": w.qp, "opcode": OP_NAMES[w.opcode],
        "remote_addr": w.remote_addr, "r_key": w.r_key, "length": w.wr_length,
        "immediate": w.imm if w.opcode in (proto.WrOpcode.SEND_WITH_IMM,
                                           proto.WrOpcode.RDMA_WRITE_WITH_IMM) else None,
        "sha256": hashlib.sha256(w.payload).hexdigest(),
    } for w in wrs]
    totals = {
        "width": config.data_width, "frames": len(res.good_frames),
        "aborted_frames": sum(1 for f in res.frames if f[3]),
        "refused_wrs": len(res.statuses), "payload_bytes": payload_bytes,
        "framing_errors": len(res.framing_errors),
        "cycles": res.cycles, "busy_cycles": res.busy_cycles,
        "bus_utilisation": round(res.utilisation, 6),
        "goodput_bytes_per_cycle": round(payload_bytes / res.cycles, 4) if res.cycles else 0.0,
    }
    return {"messages": messages, "totals": totals, "statuses": res.statuses}


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, unless the text already states it."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text:
            return text
        if action.default is None:
            return text + " (default: not written)" if action.option_strings[0] in (
                "--pcap", "--json") else text + " (default: none)"
        return super()._get_help_string(action)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m sim.traffic", description=__doc__.split("\n\n")[0],
                                 formatter_class=_HelpFormatter,
                                 epilog="Exit status: 0 the frames match the golden model (and, "
                                        "closed loop, every message was delivered), 1 they do "
                                        "not (or messages were lost), 2 a bad option.")
    ap.add_argument("--width", type=int, default=None,
                    help=f"bus width in bits ({', '.join(map(str, DATA_WIDTHS))}); default: the "
                         f"scenario's \"width\", else 512")
    ap.add_argument("--qps", type=int, default=2, help="number of QPs (random mode)")
    ap.add_argument("--messages", type=int, default=20, help="number of WRs (random mode)")
    ap.add_argument("--ops", default="write,write_imm,send,send_imm",
                    help="comma-separated opcodes to draw from (random mode): " + ",".join(OPS))
    ap.add_argument("--min-size", type=int, default=0,
                    help="smallest payload in bytes (random mode)")
    ap.add_argument("--max-size", type=int, default=4096,
                    help="largest payload in bytes (random mode)")
    ap.add_argument("--pmtu", type=int, default=1024,
                    help="path MTU of every QP in bytes: 256, 512, 1024, 2048 or 4096 "
                         "(random mode)")
    ap.add_argument("--seed", type=int, default=1,
                    help="seed of the random workload and of the idle/stall patterns")
    ap.add_argument("--scenario", default=None,
                    help="JSON file with QP contexts and an explicit WR list (see the module "
                         "docstring); replaces the random workload")
    ap.add_argument("--stall", type=float, default=0.0,
                    help="probability of idle/backpressure cycles on every stream, in [0, 1)")
    ap.add_argument("--backend", choices=BACKENDS, default="amaranth",
                    help="simulator: Amaranth's (no compiler needed) or the Verilog compiled by "
                         "Verilator (100x faster; the first build of a width takes 1-3 minutes, "
                         "then it is cached in build/verilator/)")
    ap.add_argument("--pcap", default=None,
                    help="write the transmitted frames here (nanosecond time stamps at the "
                         "assumed clock of the width)")
    ap.add_argument("--json", default=None,
                    help="write the per-message records and totals here")
    ap.add_argument("--quiet", action="store_true",
                    help="no progress lines on stderr (by default they appear on runs longer "
                         "than --progress-interval seconds)")
    ap.add_argument("--progress-interval", type=float, default=5.0, metavar="SECONDS",
                    help="seconds between progress lines (messages posted, frames, cycles, "
                         "rate) on stderr")
    ap.add_argument("--closed-loop", action="store_true",
                    help="simulate the whole engine (roce_engine) with the responder model "
                         "answering through the network, and check delivery (any lossy-network "
                         "option implies it)")
    faults.add_arguments(ap, latency=100)
    args = ap.parse_args(argv)

    try:
        if not 0 <= args.stall < 1:
            raise ValueError(f"--stall {args.stall} must be a probability in [0, 1)")
        if args.progress_interval < 0:
            raise ValueError("--progress-interval must be >= 0 seconds")
        if args.scenario:
            settings, qps, wrs = load_scenario(args.scenario)
            width = args.width or settings["width"] or 512
        else:
            ops = [o.strip() for o in args.ops.split(",") if o.strip()]
            bad = [o for o in ops if o not in OPS]
            if bad or not ops:
                raise ValueError(f"--ops: {', '.join(bad) or 'empty'} not among {', '.join(OPS)}")
            proto.pmtu_code(args.pmtu)
            if not 0 <= args.min_size <= args.max_size <= 1 << 31:
                raise ValueError("--min-size/--max-size must satisfy 0 <= min <= max <= 2**31")
            if args.qps < 1 or args.messages < 0:
                raise ValueError("--qps must be >= 1 and --messages >= 0")
            settings = {"local_mac": DEFAULT_LOCAL_MAC, "local_ip": DEFAULT_LOCAL_IP,
                        "ip_id_start": 0}
            qps, wrs = random_workload(n_qps=args.qps, messages=args.messages, ops=ops,
                                       min_size=args.min_size, max_size=args.max_size,
                                       pmtu=args.pmtu, seed=args.seed)
            width = args.width or 512
        n_qp = max([16] + [q.index + 1 for q in qps])
        config = EngineConfig(data_width=width, n_qp=n_qp, ip_id_start=settings["ip_id_start"])
        net = faults.network_options(args, seed=args.seed)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    closed = args.closed_loop or net is not None
    if closed and net is None:
        net = {"seed": args.seed, "delay": args._net_latency}

    from sim.backend import BackendUnavailable
    from sim.harness import Progress
    if not args.quiet:
        print(f"simulating {len(wrs)} WRs on {len(qps)} QPs at {width} bits "
              f"({args.backend}{', closed loop' if closed else ''}) ...", file=sys.stderr)
    log = None if args.quiet else (lambda text: print(text, file=sys.stderr, flush=True))
    if args.backend == "verilator":      # build first, so the progress rate is the simulation's
        from sim.verilator import build
        try:
            build(config, top="engine" if closed else "tx", log=log)
        except BackendUnavailable as e:
            print(f"error: --backend {args.backend}: {e}", file=sys.stderr)
            return 2
    progress = Progress("sim.traffic", len(wrs), unit="messages posted",
                        interval=args.progress_interval, enabled=not args.quiet)
    loop = None
    try:
        if closed:
            loop = run_closed_loop(config, qps, wrs, local_mac=settings["local_mac"],
                                   local_ip=settings["local_ip"], seed=args.seed, network=net,
                                   backend=args.backend, p_stall=args.stall,
                                   progress=progress.update, log=log)
            res = loop.traffic
        else:
            res = run_traffic(config, qps, wrs, local_mac=settings["local_mac"],
                              local_ip=settings["local_ip"], seed=args.seed,
                              p_wr_idle=args.stall, p_payload_idle=args.stall,
                              p_stall=args.stall, progress=progress.update,
                              backend=args.backend, log=log)
    except BackendUnavailable as e:
        print(f"error: --backend {args.backend}: {e}", file=sys.stderr)
        return 2
    except TimeoutError as e:    # the engine stopped moving: say so, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 1
    progress.finish(res.sim_cycles, len(res.wr_cycles), len(res.frames))
    expect = expected_frames(config, qps, wrs, local_mac=settings["local_mac"],
                             local_ip=settings["local_ip"])
    got = res.good_frames
    if closed:      # the engine top also answers ARP and CM: only its RoCEv2 frames count
        from sim.backend import tx_kind
        got = [f for f in got if tx_kind(f) == "data"]
    mismatches = count_mismatches(got, expect)
    doc = summary(config, qps, wrs, res)
    doc["totals"]["model_mismatches"] = mismatches
    verdict = True
    if closed:
        verdict = _add_loop_fields(doc, loop, net)
    if args.pcap:
        from sim.pcap import write_pcap
        Path(args.pcap).parent.mkdir(parents=True, exist_ok=True)
        period = 1 / (CLOCK_MHZ[width] * 1e6)
        write_pcap(args.pcap, [(f[0] * period, f[2]) for f in res.frames if not f[3]],
                   nanoseconds=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    t = doc["totals"]
    print(f"{t['frames']} frames, {t['payload_bytes']} payload bytes, {t['cycles']} cycles, "
          f"utilisation {t['bus_utilisation']:.4f}, goodput {t['goodput_bytes_per_cycle']} B/cycle, "
          f"{len(res.statuses)} refused WRs, {mismatches} frames differ from the golden model")
    for error in res.framing_errors[:10]:
        print(f"framing error: {error}", file=sys.stderr)
    if closed:
        _print_loop(doc)
    return 1 if mismatches or res.framing_errors or not verdict else 0


def _add_loop_fields(doc, loop, net):
    """Add the closed loop's ``network``, ``reliability`` and ``delivery`` sections to the
    JSON ``doc``; returns the delivery verdict (True: every message arrived exactly once, in
    order, byte-identical, and the loop finished)."""
    rep = loop.report
    doc["totals"]["closed_loop"] = True
    doc["network"] = faults.network_fields(loop.network, net)
    naks_sent = {k[len("rsp_nak_"):]: v for k, v in rep.wire.items()
                 if k.startswith("rsp_nak_")}
    doc["reliability"] = faults.reliability_fields(
        loop.counters, retransmitted=rep.wire.get("tx_retransmitted", 0),
        by_status=rep.by_status, naks_sent=naks_sent)
    ok = rep.finished and rep.delivery_ok and rep.all_delivered
    doc["delivery"] = {
        "ok": ok, "finished": rep.finished, "messages": rep.messages,
        "delivered": rep.delivered, "lost": rep.messages - rep.delivered - len(loop.statuses),
        "refused": len(loop.statuses),
        "arrived_ok": rep.delivery_ok, "all_arrived": rep.all_delivered,
        "completions_checked": rep.completions_ok is not None,
        "problems": rep.problems[:20], "responder": dict(rep.responder),
    }
    return ok


def _print_loop(doc):
    net, rel, d = doc["network"], doc["reliability"], doc["delivery"]
    parts = []
    for k in ("fwd", "rev"):
        c = net[k]
        parts.append(f"{k} {c['dropped'] + c['targeted_dropped']} dropped, {c['duplicated']} "
                     f"duplicated, {c['reordered']} reordered, {c['corrupted']} corrupted")
    print("network: " + "; ".join(parts))
    naks = rel["naks_received"]
    print(f"engine: {rel['acks_received']} ACKs and {naks['seq']}/{naks['rnr']}/{naks['fatal']} "
          f"sequence/RNR/fatal NAKs received, {rel['retransmitted']} packets retransmitted")
    for problem in d["problems"][:10]:
        print(f"  {problem}")
    print(faults.delivery_line(d["delivered"], d["messages"] - d["refused"], d["ok"],
                               lost_reason=d["finished"] and d["arrived_ok"]
                               and not d["ok"] and d["lost"] > 0))


if __name__ == "__main__":
    sys.exit(main())
