# SPDX-License-Identifier: BSD-2-Clause
"""End to end: the host tool in the soft-RoCE guest against the simulated engine, every frame.

Run from the repository root::

    python -m sim.e2e --width 64
    python -m sim.e2e --width 64 --ops write,send_imm --length 3000 --count 4 --pcap build/e2e.pcap
    python -m sim.e2e --model                       # the frame-level Python model instead
    python -m sim.e2e --backend verilator           # the engine compiled by Verilator

Boots the guest of :mod:`sim.guest` (:class:`sim.vm.RxeVM`) with the repository's pure-Python
code appended (``python -m roce_hw.host`` runs there) and **without** a neighbour entry for the
engine, and connects the guest's NIC to the simulated engine (:class:`roce_hw.top.EngineTop`,
:class:`roce_hw.engine.RoceEngine` with flat ports, on the ``--backend`` of :mod:`sim.backend`:
``amaranth`` by default, or ``verilator``, built before the guest boots) at frame level in both
directions, in slices of cycles (:class:`sim.replay.EngineDriver`, :data:`SLICE_CYCLES`): every
frame from the guest (ARP requests, the host tool's CM datagrams, rxe's ACKs, anything else)
goes into ``s_axis_rx`` (one beat per cycle, ``tready`` constant 1) at the cycle the
simulation has reached when it arrives (at most :data:`SLICE_CYCLES` later while the engine is
busy); the engine runs until a frame leaves ``m_axis_tx`` (ARP replies, CM replies, the
generator's data frames) or for a slice, and the frame goes to the guest stamped with the cycle
after its last beat (:class:`sim.vm.RxeBridge`: after a frame with AckReq the simulation is
held, wall clock, until rxe has answered, so it never runs ahead of rxe). When the engine has
been quiet for :data:`IDLE_CYCLES` the simulation waits (wall clock) for the guest's next frame
instead of spinning: the engine has no timer, so simulated time standing still while the guest
computes changes nothing.

In the guest it runs the host tool's verbs mode (:data:`HOST_TOOL`, :func:`host_argv`) once
per ``--ops`` entry, one after the other, against the same engine: ARP for the engine (first
time), OPEN, its QP to RTS, MODIFY_QP_RTS, the engine's generator started (``--count`` messages
of ``--length`` bytes), the WRITE data checked in its memory region and the SEND/SEND_IMM data
and immediates in its receive completions byte for byte; then CLOSE, a re-open with new PSNs,
the same traffic again, CLOSE. This tool checks the other side: every data frame the engine sent
decoded (PSNs consecutive from the PSN the CM reply announced, the generator's payload pattern,
addresses and immediates, the expected operation and count per connection), rxe's ACKs cover
every connection's last PSN and rxe sent no NAK, the CM replies were ACKs, the engine's CM and
RX counters show no refusal or drop, every QP is free at the end, and the host tool reported
ok for every round. The last line is ``PASS`` or ``FAIL: reasons``; exit status 0 on PASS, 1 on
FAIL, 2 for usage or set-up errors (no QEMU, the guest does not boot, ``--backend verilator``
without Verilator, g++ or make: an ``error:`` line naming what to install).
"""

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from roce_hw import proto

__all__ = ["ENGINE_MAC", "ENGINE_IP", "GUEST_MAC", "GUEST_IP", "OPS", "HOST_TOOL", "E2eRun",
           "host_argv", "rounds_of", "run_e2e", "check_frames", "report", "main"]

ENGINE_MAC = "02:00:00:00:00:01"
ENGINE_IP = "10.0.0.1"
GUEST_MAC = "02:00:00:00:00:02"
GUEST_IP = "10.0.0.2"
#: ``--ops`` names -> WR opcodes the generator sends.
OPS = {"write": proto.WrOpcode.RDMA_WRITE, "write_imm": proto.WrOpcode.RDMA_WRITE_WITH_IMM,
       "send": proto.WrOpcode.SEND, "send_imm": proto.WrOpcode.SEND_WITH_IMM}
_WRITES = (proto.WrOpcode.RDMA_WRITE, proto.WrOpcode.RDMA_WRITE_WITH_IMM)
_IMMS = (proto.WrOpcode.SEND_WITH_IMM, proto.WrOpcode.RDMA_WRITE_WITH_IMM)
#: The host tool's module, run in the guest as ``python3 -m``.
HOST_TOOL = "roce_hw.host"
#: Engine cycles without any movement after which the simulation waits for the guest.
IDLE_CYCLES = 300
#: Wall-clock seconds per wait for a guest frame while the engine is idle.
IDLE_WAIT = 0.05
#: Most cycles the engine runs between two exchanges with the guest while it is busy (a slice
#: also ends right after each frame the engine sends, so that frame goes to the guest at once):
#: a frame from the guest waits at most this long, simulated, to enter the engine. 256 cycles
#: (the old per-cycle harness polled the guest every 256 cycles too) are 1.6 us at 64 bits
#: (156.25 MHz), 0.8 us at 512 bits: about one 2-kB frame at 64 bits, so a CM request or an
#: ACK never waits behind more than a frame's time. The cost per slice is one run() call and
#: the pops (about 10 us on the Verilator back end; on Amaranth's simulator less than one
#: cycle's time); a real run spends its time in the guest anyway, not in the slices.
SLICE_CYCLES = 256


def host_argv(op, *, length, count, period=0, reopen=True, seed=None, timeout=10.0):
    """The host tool command line run in the guest for one ``--ops`` entry: the verbs mode on
    ``rxe0`` with ``--close`` (and ``--reopen``: close, re-open with new PSNs, traffic again),
    the summary as JSON. ``timeout`` is its CM reply timeout per attempt (the simulation holds
    wall-clock time while rxe answers, so it is generous)."""
    w = OPS[op]
    argv = ["python3", "-m", HOST_TOOL, "--verbs", "rxe0", "--engine-ip", ENGINE_IP,
            "--length", str(length), "--count", str(count), "--period", str(period),
            "--write" if w in _WRITES else "--send", "--close", "--json",
            "--timeout", f"{timeout:g}", "--data-timeout", "600"]
    if w in _IMMS:
        argv.append("--imm")
    if reopen:
        argv.append("--reopen")
    if seed is not None:
        argv += ["--seed", str(seed)]
    return argv


def rounds_of(ops, *, length, count, reopen=True):
    """The connections a run makes, in order: ``(WrOpcode, length, count)`` each (two per
    op with ``reopen``)."""
    return [(OPS[op], length, count) for op in ops for _ in range(2 if reopen else 1)]


@dataclass
class E2eRun:
    """Everything one run produced."""
    width: int
    model: bool
    argvs: list                                     #: host tool command lines, in order
    tools: list = field(default_factory=list)       #: rc, stdout, stderr, seconds, summary
    counters: dict = field(default_factory=dict)
    qp_table: list = field(default_factory=list)
    checks: dict = field(default_factory=dict)      #: what check_frames found
    problems: list = field(default_factory=list)
    rxe_counters: dict = field(default_factory=dict)
    boot_seconds: float = 0.0
    run_seconds: float = 0.0
    wait_seconds: float = 0.0
    sim_seconds: float = 0.0                        #: of run_seconds, spent simulating
    cycles: int = 0
    bridge: object = None
    backend: str = "amaranth"                       #: "amaranth", "verilator" or "model"

    @property
    def ok(self):
        return not self.problems


# -- the engine side -------------------------------------------------------------------------
def _run_model(bridge, *, n_qp, finished, progress):
    """The frame-level model (:class:`roce_hw.model.engine.EngineModel`) answering the guest."""
    from roce_hw.model.engine import EngineModel
    from sim.replay import parse_ip, parse_mac
    m = EngineModel(n_qp, local_mac=parse_mac(ENGINE_MAC), local_ip=parse_ip(ENGINE_IP))
    step = 0
    while not finished():
        bridge.poll(step, timeout=IDLE_WAIT)
        while bridge.rx_queue:
            _, frame = bridge.rx_queue.popleft()
            step += 1
            tx, _ = m.receive(frame)
            for f in tx:
                step += 1
                bridge.deliver(f, step)
    rows = [{"qp": q, "qpn": proto.LOCAL_QPN_BASE + q,
             **{k: int(m.rows[q][k]) for k, _ in proto.QP_CONTEXT_FIELDS}} for q in range(n_qp)]
    return step, m.counters, rows


def _open_sim(*, width, n_qp, backend, progress):
    """The simulated engine for a run (:class:`sim.replay.EngineDriver`); opened before the
    guest programs start, so that building or elaborating it does not eat their time-outs."""
    from roce_hw.config import EngineConfig
    from sim.replay import EngineDriver
    return EngineDriver(EngineConfig(data_width=width, n_qp=n_qp), backend=backend,
                        local_mac=ENGINE_MAC, local_ip=ENGINE_IP, log=progress)


def _run_sim(drv, bridge, *, finished, idle_cycles, progress, slice_cycles=SLICE_CYCLES):
    """The simulated engine (``drv``, :class:`sim.replay.EngineDriver`) on the bridge, in
    slices: the guest's frames queued so far go in (at the current cycle), the engine runs
    until a frame leaves ``m_axis_tx`` or for ``slice_cycles`` cycles at most, the frame goes
    to the guest (:meth:`sim.vm.RxeBridge.deliver` holds until rxe has answered an AckReq);
    again. Once the engine has been idle ``idle_cycles`` cycles, simulated time stands still
    while it waits (wall clock) for the guest's next frame; it ends when idle, nothing from the
    guest is queued and ``finished()``."""
    t0 = last = time.monotonic()
    while True:
        bridge.poll(drv.cycle)
        while bridge.rx_queue:
            c, frame = bridge.rx_queue.popleft()
            drv.send(frame, earliest=c)
        idle = drv.idle()
        if idle >= idle_cycles:
            if finished() and not bridge.rx_queue:
                break
            bridge.poll(drv.cycle, timeout=IDLE_WAIT)    # the engine is quiet: wait for the guest
            continue
        tx, _ = drv.run(min(slice_cycles, idle_cycles - idle), until_tx=1)
        for f in tx:
            if f.tuser:
                bridge.aborted += 1
            else:
                bridge.deliver(f.data, f.last + 1)
        if time.monotonic() - last > 10:
            last = time.monotonic()
            progress(f"  cycle {drv.cycle}: {drv.rx_frames} frames from the guest, "
                     f"{drv.tx_frames} to it ({time.monotonic() - t0:.0f} s)")
    drv.finish()
    return drv.cycle, drv.counters, drv.qp_table


class _Programs:
    """Runs the guest programs one after the other while the simulation goes on: the callable
    says whether all have ended (the agent is asked at most every ``every`` seconds)."""

    def __init__(self, vm, argvs, timeout, progress, every=0.5):
        self.vm, self.argvs, self.timeout, self.every = vm, list(argvs), timeout, every
        self.progress = progress
        self.results = []
        self.task = None
        self._last = 0.0
        self._next()

    def _next(self):
        argv = self.argvs[len(self.results)]
        self.progress(f"guest: {' '.join(argv)}")
        self.task = self.vm.spawn_program(argv, timeout=self.timeout)
        self.deadline = time.monotonic() + self.timeout + 30

    def __call__(self):
        if len(self.results) == len(self.argvs):
            return True
        now = time.monotonic()
        if now - self._last < self.every:
            return False
        self._last = now
        res = self.vm.program_result(self.task)
        if res is None and now > self.deadline:
            res = {"rc": None, "stdout": "", "stderr": "did not finish in time", "seconds": None}
        if res is None:
            return False
        res["summary"] = _summary(res.get("stdout") or "")
        self.results.append(res)
        self.progress(f"guest: exit {res['rc']} after {res.get('seconds') or 0:.1f} s")
        if len(self.results) < len(self.argvs):
            self._next()
            return False
        return True


def _summary(stdout):
    """The host tool's ``--json`` summary (its last line), or ``None``."""
    import json
    for line in reversed(stdout.strip().splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        return doc if isinstance(doc, dict) else None
    return None


# -- checks ----------------------------------------------------------------------------------
def check_frames(capture, rounds):
    """Frame-level checks of one run's capture (:attr:`sim.vm.RxeBridge.capture`): returns
    ``(facts, problems)``.

    * every CM reply to the guest is an ACK; the OPEN and MODIFY ACKs give each connection's
      engine start PSN (``loc_psn``) and the guest QPN (``rem_qpn``);
    * the engine's data frames of a connection have consecutive PSNs from that start; they form
      messages (FIRST/MIDDLE/LAST or ONLY): connection ``i`` carries ``rounds[i]`` =
      ``(WrOpcode, length, count)``, ``count`` messages, message ``n`` with payload byte ``k`` =
      ``(k + n) & 0xFF``, immediate ``n`` (``*_WITH_IMM``), RETH address base + ``n * length``
      (WRITE);
    * rxe answered: no NAK, and an ACK at or after the last PSN of every connection.
    """
    from roce_hw.host import datagram as dg
    from roce_hw.model.cm import generator_payload
    from roce_hw.model.packet import parse_frame
    from sim.vm import parse_roce
    problems, facts = [], {"arp_replies": 0, "cm_replies": [], "data_frames": 0, "messages": 0,
                           "connections": [], "acks": 0, "naks": []}
    conns = []            # dicts: guest qpn, start psn, next psn, messages, ops seen
    cur = {}              # guest QPN -> current connection
    msg = None
    for c in capture:
        if c.note == "dropped":
            continue
        f = c.data
        if c.direction == "to_guest":
            if f[12:14] == proto.ETHERTYPE_ARP.to_bytes(2, "big"):
                facts["arp_replies"] += 1
                continue
            info = parse_roce(f)
            if info is None:
                if len(f) >= 14 + 20 + 8 + 64 and f[23] == proto.IP_PROTO_UDP and \
                        int.from_bytes(f[34:36], "big") == proto.CM_UDP_PORT:
                    d = dg.unpack(f[42:106])
                    name = dg.req_name(d["req_type"]) if d["valid"] else (
                        "START" if d["tx_start"] else "STOP")
                    facts["cm_replies"].append((name, dg.ack_name(d["ack_type"])))
                    if d["ack_type"] != proto.CmAck.ACK:
                        problems.append(f"CM reply {name}: {dg.ack_name(d['ack_type'])}")
                    elif d["valid"] and d["req_type"] in (proto.CmReq.OPEN_QP,
                                                          proto.CmReq.MODIFY_QP_RTS):
                        q = d["rem_qpn"]
                        if d["req_type"] == proto.CmReq.OPEN_QP or q not in cur:
                            k = len(conns)
                            op, length, count = rounds[k] if k < len(rounds) else (None, 0, 0)
                            cur[q] = {"guest_qpn": q, "engine_qpn": d["loc_qpn"],
                                      "start_psn": d["loc_psn"], "next_psn": d["loc_psn"],
                                      "msgs": [], "frames": 0, "last_ack": None, "op": op,
                                      "length": length, "count": count}
                            conns.append(cur[q])
                        else:
                            cur[q]["start_psn"] = cur[q]["next_psn"] = d["loc_psn"]
                        cur[q]["va"] = d["rem_base_addr"]
                else:
                    problems.append(f"unexpected frame to the guest ({len(f)} bytes)")
                continue
            facts["data_frames"] += 1
            conn = cur.get(info.dest_qp)
            if conn is None:
                problems.append(f"data frame for guest QP {info.dest_qp} before its OPEN ACK")
                continue
            if info.psn != conn["next_psn"]:
                problems.append(f"QP {info.dest_qp}: PSN {info.psn:#08x}, expected "
                                f"{conn['next_psn']:#08x}")
            conn["next_psn"] = (info.psn + 1) & proto.PSN_MASK
            conn["frames"] += 1
            p = parse_frame(f)
            op5 = p.bth["opcode"] & 0x1F
            first = op5 in (0x00, 0x04, 0x05, 0x06, 0x0A, 0x0B)
            last = op5 in (0x02, 0x03, 0x04, 0x05, 0x08, 0x09, 0x0A, 0x0B)
            if first:
                msg = {"ops": op5, "payload": bytearray(), "reth": p.reth, "imm": None}
            elif msg is None:
                problems.append(f"PSN {info.psn:#08x}: a MIDDLE/LAST without a FIRST")
                continue
            msg["payload"] += p.payload
            if last:
                msg["imm"] = p.imm
                msg["last_op"] = op5
                op = next((w for w, seq in proto.WR_OPCODE_SEQUENCE.items()
                           if op5 in (seq[2], seq[3]) and (msg["ops"] in (seq[0], seq[3]))),
                          None)
                n = len(conn["msgs"])
                conn["msgs"].append(op)
                facts["messages"] += 1
                length = conn["length"]
                want = generator_payload(n, length)
                if bytes(msg["payload"]) != want:
                    problems.append(f"QP {info.dest_qp} {getattr(op, 'name', op)} message {n}: "
                                    f"payload differs ({len(msg['payload'])} bytes)")
                if op in (proto.WrOpcode.SEND_WITH_IMM, proto.WrOpcode.RDMA_WRITE_WITH_IMM):
                    if msg["imm"] != n:
                        problems.append(f"QP {info.dest_qp} message {n}: immediate "
                                        f"{msg['imm']}, expected {n}")
                if op in (proto.WrOpcode.RDMA_WRITE, proto.WrOpcode.RDMA_WRITE_WITH_IMM):
                    va = msg["reth"]["va"] if msg["reth"] else None
                    if va != (conn.get("va", 0) + n * length) & ((1 << 64) - 1):
                        problems.append(f"QP {info.dest_qp} message {n}: RETH address {va}")
                msg = None
        else:
            info = parse_roce(f)
            if info is None or not info.is_ack:
                continue
            if info.is_nak:
                facts["naks"].append((info.syndrome, info.psn))
                problems.append(f"rxe NAK syndrome {info.syndrome:#04x} PSN {info.psn:#08x}")
                continue
            facts["acks"] += 1
            for conn in reversed(conns):          # the newest connection of that engine QP
                if conn["engine_qpn"] == info.dest_qp:
                    conn["last_ack"] = info.psn
                    break
    for conn in conns:
        got = sorted(set(conn["msgs"]), key=lambda o: -1 if o is None else int(o))
        names = [getattr(o, "name", str(o)) for o in got]
        facts["connections"].append({
            "guest_qpn": conn["guest_qpn"], "engine_qpn": conn["engine_qpn"],
            "start_psn": conn["start_psn"], "frames": conn["frames"],
            "messages": len(conn["msgs"]), "ops": names, "last_ack": conn["last_ack"]})
        want = getattr(conn["op"], "name", None)
        if conn["op"] is None:
            problems.append(f"guest QP {conn['guest_qpn']}: a connection more than the "
                            f"{len(rounds)} expected")
        elif names != [want] or len(conn["msgs"]) != conn["count"]:
            problems.append(f"guest QP {conn['guest_qpn']}: {len(conn['msgs'])} messages "
                            f"{'/'.join(names) or ''}, expected {conn['count']} {want}")
        last = (conn["next_psn"] - 1) & proto.PSN_MASK
        if conn["frames"] and (conn["last_ack"] is None or
                               ((conn["last_ack"] - last) & proto.PSN_MASK) >= 1 << 23):
            problems.append(f"guest QP {conn['guest_qpn']}: rxe did not ACK PSN {last:#08x}")
    if len(conns) < len(rounds):
        problems.append(f"{len(conns)} connections opened, {len(rounds)} expected")
    if facts["arp_replies"] == 0:
        problems.append("the engine sent no ARP reply (the guest has no static entry)")
    return facts, problems


# -- one run ---------------------------------------------------------------------------------
def run_e2e(vm, *, width=64, ops=("write", "send_imm"), length=1500, count=3, period=0,
            n_qp=4, model=False, reopen=True, timeout=600.0, reply_timeout=5.0, seed=1,
            progress=None, argvs=None, rounds=None, backend="amaranth"):
    """One end-to-end run on the booted ``vm`` (booted with ``peer_mac=None`` and the
    repository layer): the guest's neighbour table is flushed (it must ARP for the engine
    again), then the host tool runs once per op of ``ops`` (:func:`host_argv`), one after the
    other, against one simulated engine on ``backend`` (:data:`sim.backend.BACKENDS`; or the
    model); returns an :class:`E2eRun`. ``argvs``/``rounds`` replace the command lines and the
    expected connections. Raises :class:`sim.backend.BackendUnavailable` when the back end
    cannot run here (before anything runs in the guest)."""
    from sim.vm import RxeBridge
    progress = progress or (lambda msg: None)
    if argvs is None:
        argvs = [host_argv(op, length=length, count=count, period=period, reopen=reopen,
                           seed=None if seed is None else seed + k)
                 for k, op in enumerate(ops)]
    if rounds is None:
        rounds = rounds_of(ops, length=length, count=count, reopen=reopen)
    run = E2eRun(width=width, model=model, argvs=argvs, boot_seconds=vm.boot_seconds or 0.0,
                 backend="model" if model else backend)
    # Every run starts with the guest not knowing the engine's MAC: it must ARP (a guest
    # reused from an earlier run has learnt it; a static entry would bypass the responder).
    vm.call("sh", argv=["/bin/ip", "neigh", "flush", "dev", "eth0"])
    left = vm.call("sh", argv=["/bin/ip", "neigh", "show", ENGINE_IP, "dev", "eth0"])
    if left["stdout"].strip():
        raise ValueError(f"the guest has a neighbour entry for the engine it cannot forget "
                         f"({left['stdout'].strip()}): boot the VM with peer_mac=None")
    drv = None if model else _open_sim(width=width, n_qp=n_qp, backend=backend,
                                       progress=progress)
    try:
        counters0 = vm.call("counters")
        bridge = RxeBridge(vm, reply_timeout=reply_timeout)
        run.bridge = bridge
        vm.drain_frames()
        t0 = time.monotonic()
        programs = _Programs(vm, argvs, timeout, progress)
        if model:
            run.cycles, run.counters, run.qp_table = _run_model(
                bridge, n_qp=n_qp, finished=programs, progress=progress)
        else:
            run.cycles, run.counters, run.qp_table = _run_sim(
                drv, bridge, finished=programs, idle_cycles=IDLE_CYCLES + 2 * period,
                progress=progress)
    finally:
        if drv is not None:
            run.sim_seconds = drv.sim_seconds
            drv.close()
    bridge.flush(run.cycles)
    run.run_seconds = time.monotonic() - t0
    run.wait_seconds = bridge.wait_seconds
    run.tools = programs.results
    counters1 = vm.call("counters")
    run.rxe_counters = {k: v - counters0.get(k, 0) for k, v in counters1.items()
                        if isinstance(v, int) and v != counters0.get(k, 0)}
    run.checks, run.problems = check_frames(bridge.capture, rounds)
    for k, t in enumerate(run.tools):
        if t.get("rc") != 0:
            run.problems.insert(k, f"host tool run {k + 1} exited with status {t.get('rc')}")
        elif not (t.get("summary") or {}).get("ok"):
            run.problems.insert(k, f"host tool run {k + 1} did not report ok")
    conns = run.checks["connections"]
    if reopen:
        for a, b in zip(conns[0::2], conns[1::2]):
            if a["start_psn"] == b["start_psn"]:
                run.problems.append(f"the re-open of guest QP {b['guest_qpn']} did not use a "
                                    f"new PSN")
    for name in ("duplicate_request", "out_of_seq_request", "rcvd_seq_err", "seq_naks"):
        if run.rxe_counters.get(name):
            run.problems.append(f"rxe counter {name} +{run.rxe_counters[name]}")
    cm = run.counters.get("cm", {})
    bad = {k: v for k, v in cm.items() if k != "ok" and v}
    if bad:
        run.problems.append(f"CM counters: {bad}")
    rx = run.counters.get("rx", {})
    bad = {k: v for k, v in rx.items() if v and k not in ("rx_frames", "arp", "cm", "roce",
                                                            "other")}
    if bad:
        run.problems.append(f"RX front end dropped frames from the guest: {bad}")
    if any(r["state"] != proto.QPState.RESET for r in run.qp_table):
        run.problems.append("a QP is still open after the host tool closed it")
    return run


def report(run, out=sys.stdout):
    """Print what happened; the last line is ``PASS`` or ``FAIL: reasons``."""
    p = lambda *a: print(*a, file=out)   # noqa: E731
    engine = "frame-level model" if run.model else \
        f"RoceEngine at {run.width} bits ({run.backend} back end)"
    p(f"engine: {engine}; guest boot {run.boot_seconds:.1f} s")
    for argv, t in zip(run.argvs, run.tools):
        p(f"guest ran: {' '.join(argv)}  (exit {t.get('rc')}, {t.get('seconds') or 0:.1f} s)")
        summary = t.get("summary")
        if summary:
            for r in summary.get("rounds", []):
                mism = "not checked" if r.get("mismatches") is None else \
                    f"{r['mismatches']} bytes differ"
                p(f"  round {r['round']}: our QPN {r['qpn']} PSN {r['psn']:#08x} <-> engine QPN "
                  f"{r['engine_qpn']} PSN {r['engine_psn']:#08x}: {r['opcode']} {r['count']} x "
                  f"{r['length']} B, {r['completions']}/{r['expected_completions']} completions, "
                  f"{r['bytes']} bytes, {r['immediates']} immediates, {mism}, {r['missing']} "
                  f"missing -> {'OK' if r['ok'] else 'FAILED'}")
                for e in r.get("errors", []):
                    p(f"    {e}")
            p(f"  steps: {' '.join(summary.get('steps', []))}")
        else:
            for line in (t.get("stdout") or "").rstrip().splitlines()[-30:]:
                p(f"  | {line}")
        for line in (t.get("stderr") or "").rstrip().splitlines()[-30:]:
            p(f"  ! {line}")
    c = run.checks
    p(f"frames to the guest: {c.get('arp_replies', 0)} ARP replies, "
      f"{len(c.get('cm_replies', []))} CM replies "
      f"({', '.join(f'{a} {b}' for a, b in c.get('cm_replies', []))}), "
      f"{c.get('data_frames', 0)} data frames, {c.get('messages', 0)} messages; "
      f"from rxe: {c.get('acks', 0)} ACKs, {len(c.get('naks', []))} NAKs")
    for conn in c.get("connections", []):
        ack = "none" if conn["last_ack"] is None else f"{conn['last_ack']:#08x}"
        p(f"  connection: guest QP {conn['guest_qpn']} <-> engine QP {conn['engine_qpn']}, "
          f"start PSN {conn['start_psn']:#08x}, {conn['frames']} frames, {conn['messages']} "
          f"messages {'/'.join(conn['ops']) or ''}, last ACK {ack}")
    if run.counters:
        flat = []

        def walk(prefix, d):
            for k, v in d.items():
                if isinstance(v, dict):
                    walk(f"{prefix}{k}.", v)
                elif v:
                    flat.append(f"{prefix}{k}={v}")
        walk("", run.counters)
        p("engine counters: " + (", ".join(flat) or "all zero"))
    if run.rxe_counters:
        p("rxe counters: " + ", ".join(f"{k} +{v}" for k, v in sorted(run.rxe_counters.items())))
    sim = "" if run.model else f", {run.sim_seconds:.1f} s simulating"
    p(f"{run.cycles} cycles; run {run.run_seconds:.1f} s, of which {run.wait_seconds:.1f} s "
      f"held for rxe's ACKs{sim}")
    p("PASS" if run.ok else "FAIL: " + "; ".join(run.problems))


def main(argv=None):
    from roce_hw.config import DATA_WIDTHS
    from sim.backend import BACKENDS, BackendUnavailable
    ap = argparse.ArgumentParser(
        prog="python -m sim.e2e", description=__doc__.split("\n\n")[0],
        epilog="Exit status: 0 PASS, 1 FAIL, 2 usage or set-up error. The guest image is built "
               "on first use (apt-get download; cached in build/rxe-guest/).")
    ap.add_argument("--width", type=int, default=64,
                    help=f"engine bus width ({', '.join(map(str, DATA_WIDTHS))}; "
                         f"default %(default)s)")
    ap.add_argument("--ops", default="write,send_imm",
                    help=f"generator runs per connection, comma-separated from "
                         f"{', '.join(OPS)} (default %(default)s)")
    ap.add_argument("--length", type=int, default=1500,
                    help="bytes per message (default %(default)s)")
    ap.add_argument("--count", type=int, default=3,
                    help="messages per generator run (default %(default)s)")
    ap.add_argument("--period", type=int, default=0,
                    help="generator cycles between messages (default %(default)s)")
    ap.add_argument("--qps", type=int, default=4, help="QPs of the engine (default %(default)s)")
    ap.add_argument("--no-reopen", action="store_true",
                    help="one connection only (default: close, re-open with a new PSN, again)")
    ap.add_argument("--model", action="store_true",
                    help="the frame-level Python model instead of the simulated hardware")
    ap.add_argument("--backend", choices=BACKENDS, default="amaranth",
                    help="simulator of the hardware: amaranth (default; Python, no compiler) "
                         "or verilator (the emitted Verilog compiled by Verilator: needs "
                         "verilator, g++ and make; built before the guest boots, 1-3 minutes "
                         "the first time for a width, then cached)")
    ap.add_argument("--pcap", metavar="OUT", default=None,
                    help="write every frame, both directions, with simulated-time stamps")
    ap.add_argument("--timeout", type=float, default=900.0,
                    help="seconds each host tool run may take (default %(default)s)")
    ap.add_argument("--seed", type=int, default=1,
                    help="seed of the host tool's random PSNs (default %(default)s)")
    ap.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = ap.parse_args(argv)
    if args.width not in DATA_WIDTHS:
        ap.error(f"--width {args.width} is not supported; choose one of "
                 f"{', '.join(map(str, DATA_WIDTHS))}")
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    if not ops or any(o not in OPS for o in ops):
        ap.error(f"--ops {args.ops!r}: choose from {', '.join(OPS)}")
    if not 1 <= args.length <= 1 << 20:
        ap.error("--length must be 1 to 1048576")
    if not 1 <= args.count <= 1000:
        ap.error("--count must be 1 to 1000")
    if args.period < 0:
        ap.error("--period must not be negative")
    if not 1 <= args.qps <= 16384:
        ap.error("--qps must be 1 to 16384")
    log = (lambda msg: None) if args.quiet else (
        lambda msg: print(msg, file=sys.stderr, flush=True))
    if args.backend == "verilator" and not args.model:
        # build (or find cached) the Verilator library before the guest boots: a missing
        # tool fails at once, and the build's minutes are not spent with QEMU running
        from roce_hw.config import EngineConfig
        from sim.verilator import build
        try:
            build(EngineConfig(data_width=args.width, n_qp=args.qps), top="engine", log=log)
        except BackendUnavailable as e:
            print(f"error: --backend verilator: {e}", file=sys.stderr)
            return 2
    from sim.guest import GUEST_PYTHON, GuestBuildError
    from sim.vm import RxeVM, VMError
    try:
        with RxeVM(peer_mac=None, pylib=GUEST_PYTHON, log=log) as vm:
            run = run_e2e(vm, width=args.width, ops=ops, length=args.length, count=args.count,
                          period=args.period, n_qp=args.qps, model=args.model,
                          reopen=not args.no_reopen, timeout=args.timeout, seed=args.seed,
                          progress=log, backend=args.backend)
    except BackendUnavailable as e:
        print(f"error: --backend {args.backend}: {e}", file=sys.stderr)
        return 2
    except (GuestBuildError, VMError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.pcap:
        from sim.pcap import write_pcap
        from sim.traffic import CLOCK_MHZ
        Path(args.pcap).parent.mkdir(parents=True, exist_ok=True)
        write_pcap(args.pcap, run.bridge.pcap_frames(CLOCK_MHZ[args.width]), nanoseconds=True)
        log(f"wrote {len(run.bridge.capture)} frames to {args.pcap}")
    report(run)
    return 0 if run.ok else 1


if __name__ == "__main__":
    sys.exit(main())
