# SPDX-License-Identifier: BSD-2-Clause
"""Does real Linux RDMA accept what the engine sends? Simulated engine -> Linux soft-RoCE (rxe).

Run from the repository root::

    python -m sim.rxe --width 64 --seed 1 --messages 20
    python -m sim.rxe --width 512 --seed 7 --messages 100 --qps 4 --pmtu 1024 --pcap build/rxe.pcap
    python -m sim.rxe --width 64 --seed 1 --messages 8 --corrupt-frame 3   # must fail: exit 1
    python -m sim.rxe --backend verilator --width 512 --messages 300
    python -m sim.rxe --backend verilator --messages 300 --qps 4 --loss 0.02 --corrupt 0.01 \
        --json build/rxe.json                                    # lossy network, both ways

Boots the guest of :mod:`sim.guest` (built on first use and cached under ``build/rxe-guest/``)
in QEMU, creates one RC QP per engine QP in rxe (an MR for the RDMA WRITEs, receive buffers for
the SENDs and WRITE_IMMs), writes the engine's QP contexts to match through its management port,
then simulates the TX engine (``roce_tx``) on seeded random WRITE / WRITE_IMM / SEND / SEND_IMM
traffic: lengths 0 to 3 PMTU + 5 with the edge cases (0, 1, PMTU +- 1, multiples of the PMTU,
odd lengths), PSNs starting just below 0xFFFFFF so that they wrap, and by default five QPs with
one PMTU each from 256 to 4096. Every frame goes to rxe stamped with the cycle it left the
engine, the next frame only once rxe has answered the previous AckReq frame
(:class:`sim.vm.RxeBridge`); rxe's ACK/NAK frames are collected (this top has no receive path).
Per QP it reports messages, frames, ACKs, NAKs and whether rxe's memory holds the WRITE bytes
and its receive completions carry the intended lengths, immediates and data. A message
*passes* when all its frames reached rxe unaltered, rxe ACKed its last PSN, and its data
(memory and/or completion) is exact.

``--backend`` picks the simulator (:func:`sim.backend.open_engine`, ``top="tx"``): ``amaranth``
(default; Amaranth's simulator, no compiler needed) or ``verilator`` (the emitted Verilog
compiled by Verilator, built on first use and cached; hundreds of times as many cycles per
second). Either runs the engine in slices of cycles (:data:`SLICE_CYCLES`), handing each
slice's frames to the bridge with their cycles; both give the same frames at the same cycles.

``--scenario FILE`` takes the QPs and WRs of a :mod:`sim.traffic` scenario file (their remote
QPN/MAC/IP and the WRITE addresses and R_Keys are replaced by the guest's; the fields may be
omitted). ``--corrupt-frame K`` flips one payload bit of frame K (0-based, in transmit order;
the next frame with payload if K has none): rxe must drop it, NAK the next frame's PSN gap, and
the tool must report the failure.

**Lossy network** (:mod:`sim.faults`: ``--loss``, ``--dup``, ``--reorder``, ``--corrupt``,
``--delay`` probabilities in both directions, ``--drop-data`` ... targeted drops,
``--net-seed``): any of these options puts a seeded :class:`sim.lossy.LossyNetwork` between the
engine and rxe and simulates the whole engine (``roce_engine``) instead of the TX top, so that
rxe's replies, through the reverse link, reach the engine's receive port and its ACK handler
(:func:`simulate`). The engine does not retransmit yet (docs/reliability.md), so a lossy run
shows the messages after a loss on their QP as not delivered: that is the expected result today.
Through a network the verdict is delivery (:attr:`RxeRun.delivery_ok`: every message executed by
rxe exactly once, in order, with exact data, every rxe QP still in RTS), not "no NAK".

The report ends with a delivery line (``delivery: PASS|FAIL, D of N messages arrived exactly
once, in order, byte-identical``) and ``N passed, M failed``; ``--json OUT`` writes the same as
JSON (:func:`run_json`). Exit status: 0 when all messages passed and rxe sent no NAK (through a
lossy network: when every message was delivered), 1 otherwise, 2 for usage or set-up errors
(a bad option, QEMU or apt missing, the guest does not boot; with ``--backend verilator``,
Verilator, g++ or make missing). ``--corrupt`` is a probability: a bare integer (the frame index
of ``--corrupt-frame``) is refused.
"""

import argparse
import collections
import hashlib
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from roce_hw import proto
from roce_hw.config import DATA_WIDTHS, EngineConfig

from sim import faults
from sim.bfm import QPSetup, parse_ip, parse_mac
from sim.traffic import CLOCK_MHZ, OP_NAMES, OPS
from sim.vm import parse_roce

__all__ = ["PMTUS", "ENGINE_MAC", "ENGINE_IP", "GUEST_MAC", "GUEST_IP", "SLICE_CYCLES",
           "Message", "QPResult", "RxeRun", "random_messages", "plan_frames", "setup_guest",
           "engine_config", "simulate", "verify", "run_rxe", "corrupt_hook", "main"]

PMTUS = (256, 512, 1024, 2048, 4096)
ENGINE_MAC = "02:00:00:00:00:01"
ENGINE_IP = "10.0.0.1"
GUEST_MAC = "02:00:00:00:00:02"
GUEST_IP = "10.0.0.2"
#: Filler of the guest MRs: bytes no WRITE targeted must still hold it afterwards.
MR_FILL = 0xA5

W = proto.WrOpcode
_RECV_OPS = (W.SEND, W.SEND_WITH_IMM, W.RDMA_WRITE_WITH_IMM)
_WRITE_OPS = (W.RDMA_WRITE, W.RDMA_WRITE_WITH_IMM)
_IMM_OPS = (W.SEND_WITH_IMM, W.RDMA_WRITE_WITH_IMM)


@dataclass
class Message:
    """One WR of the run and what the tool learnt about it."""
    index: int
    qp: int
    opcode: proto.WrOpcode
    payload: bytes
    imm: int = 0
    solicited: bool = False
    offset: int = 0            #: WRITE: where in the guest MR
    recv_seq: int = 0          #: SEND*/WRITE_IMM: which receive of its QP (1-based)
    first_psn: int = 0
    packets: int = 1
    frames: int = 0            #: frames delivered to rxe
    altered: bool = False      #: a frame was altered or dropped on the way (hooks)
    acked: bool = False
    naked: bool = False
    data_ok: bool = True       #: rxe's memory / receive completion holds exactly the message
    problems: list = field(default_factory=list)

    @property
    def delivered(self):
        """rxe executed it (ACKed its last PSN) and its data landed exactly."""
        return self.acked and self.data_ok

    @property
    def last_psn(self):
        return (self.first_psn + self.packets - 1) & proto.PSN_MASK

    @property
    def passed(self):
        return not self.problems


@dataclass
class QPResult:
    """Per-QP summary."""
    index: int
    guest_qpn: int
    pmtu: int
    start_psn: int
    messages: int = 0
    frames: int = 0
    acks: int = 0
    naks: int = 0
    nak_list: list = field(default_factory=list)   #: (syndrome, PSN)
    memory_ok: bool = True        #: every WRITE target exact
    untouched_ok: bool = True     #: the rest of the MR unchanged
    completions_ok: bool = True
    extra_completions: int = 0    #: receive completions no message of the run accounts for
    state: str = ""
    passed: int = 0
    failed: int = 0


@dataclass
class RxeRun:
    """Everything one run produced."""
    width: int
    messages: list
    qps: list
    counters: dict
    cycles: int = 0
    frames: int = 0
    refused: list = field(default_factory=list)
    unanswered: int = 0
    sim_seconds: float = 0.0
    wait_seconds: float = 0.0
    corrupted: tuple | None = None     #: (frame index, guest QPN, PSN) of --corrupt-frame
    bridge: object = None
    backend: str = "amaranth"          #: the simulation back end (:mod:`sim.backend`)
    network: object = None             #: the :class:`sim.lossy.LossyNetwork`, if any
    #: the network's keyword arguments (:func:`sim.faults.network_options`)
    network_options: dict | None = None
    #: :func:`simulate`'s ``stats``: top, engine_frames, retransmitted, counters
    stats: dict = field(default_factory=dict)

    @property
    def delivered(self):
        """Messages rxe executed with their data exact (:attr:`Message.delivered`)."""
        return sum(m.delivered for m in self.messages)

    @property
    def delivery_ok(self):
        """Every message arrived exactly once, in order, byte-identical: each executed by rxe
        with exact data, no receive completion too many, the rest of every MR untouched, every
        rxe QP still in RTS, no WR refused."""
        return self.delivered == len(self.messages) and not self.refused and all(
            q.untouched_ok and q.completions_ok and q.state == "RTS" for q in self.qps)

    @property
    def verdict(self):
        """The exit verdict: :attr:`ok` without a network; :attr:`delivery_ok` through one
        (there NAKs are part of the game, losses are not)."""
        return self.delivery_ok if self.network is not None else self.ok

    @property
    def passed(self):
        return sum(m.passed for m in self.messages)

    @property
    def failed(self):
        return len(self.messages) - self.passed

    @property
    def naks(self):
        return sum(q.naks for q in self.qps)

    @property
    def ok(self):
        return self.failed == 0 and self.naks == 0 and all(
            q.untouched_ok for q in self.qps) and not self.refused


# -- workload --------------------------------------------------------------------------------
def _length(rng, pmtu):
    top = 3 * pmtu + 5
    r = rng.random()
    if r < 0.55:
        return rng.choice([0, 1, 2, 3, pmtu - 1, pmtu, pmtu + 1, 2 * pmtu - 1, 2 * pmtu,
                           2 * pmtu + 1, 3 * pmtu - 1, 3 * pmtu, top])
    if r < 0.8:
        return rng.randrange(1, top + 1, 2)        # odd
    return rng.randint(0, top)


def random_messages(*, seed, messages, qps, pmtu=None, ops=tuple(OPS)):
    """Seeded QPs (``QPSetup`` without the remote fields yet) and messages: QP i has PMTU
    ``pmtu`` or, by default, ``PMTUS[i % 5]``; start PSNs 0xFFFFF8-0xFFFFFF (they wrap)."""
    rng = random.Random(seed)
    setups = [QPSetup(index=i, remote_qpn=0, remote_mac=0, remote_ip=0,
                      udp_sport=0xC000 | rng.randrange(1 << 14),
                      start_psn=proto.PSN_MASK - rng.randrange(8),
                      pmtu=pmtu or PMTUS[i % len(PMTUS)]) for i in range(qps)]
    msgs = []
    for n in range(messages):
        q = rng.randrange(qps) if n >= qps else n      # every QP gets traffic
        op = OPS[ops[n % len(ops)] if n < len(ops) else rng.choice(ops)]
        size = _length(rng, setups[q].pmtu)
        msgs.append(Message(index=n, qp=q, opcode=op, payload=rng.randbytes(size),
                            imm=rng.getrandbits(32), solicited=rng.random() < 0.25))
    return setups, msgs


def plan_frames(setups, msgs):
    """Fill in each message's PSNs and packet count; returns the frames in transmit order as
    ``(message, PSN, payload bytes)``."""
    by_index = {q.index: q for q in setups}
    psn = {q.index: q.start_psn for q in setups}
    plan = []
    for m in msgs:
        pmtu = by_index[m.qp].pmtu
        m.packets = max(1, -(-len(m.payload) // pmtu))
        m.first_psn = psn[m.qp]
        for k in range(m.packets):
            plan.append((m, (m.first_psn + k) & proto.PSN_MASK,
                         len(m.payload[k * pmtu:(k + 1) * pmtu])))
        psn[m.qp] = (psn[m.qp] + m.packets) & proto.PSN_MASK
    return plan


# -- guest -----------------------------------------------------------------------------------
def setup_guest(vm, setups, msgs):
    """Create and connect one guest QP per engine QP; sets ``remote_qpn/mac/ip`` of each
    ``QPSetup`` and the WRITE offsets / receive numbers of the messages. Returns
    ``{qp index: guest QP description}``."""
    guest = {}
    for q in setups:
        mine = [m for m in msgs if m.qp == q.index]
        off = 0
        for m in mine:
            if m.opcode in _WRITE_OPS:
                m.offset = off
                off += (len(m.payload) + 63) // 64 * 64 + 64
        nrecv = 0
        for m in mine:
            if m.opcode in _RECV_OPS:
                nrecv += 1
                m.recv_seq = nrecv
        recv_size = max([len(m.payload) for m in mine if m.opcode in _RECV_OPS] + [64])
        d = vm.call("create_qp", mr_size=max(off, 64), recv_count=max(nrecv, 1),
                    recv_size=recv_size, fill=MR_FILL)
        vm.call("connect", handle=d["handle"], remote_qpn=proto.LOCAL_QPN_BASE + q.index,
                remote_ip=ENGINE_IP, rq_psn=q.start_psn, pmtu=q.pmtu)
        q.remote_qpn = d["qpn"]
        q.remote_mac = parse_mac(d["mac"])
        q.remote_ip = parse_ip(d["ip"])
        guest[q.index] = d
    return guest


def corrupt_hook(target):
    """A ``to_guest_hook`` flipping bit 0 of the middle payload byte of frame ``target``."""
    from sim.vm import parse_roce

    def hook(frame, index):
        if index != target:
            return frame
        info = parse_roce(frame)
        end = len(frame) - 4 - info.pad
        pos = (info.header_len + end) // 2
        out = bytearray(frame)
        out[pos] ^= 0x01
        return bytes(out)
    return hook


# -- simulation ------------------------------------------------------------------------------
#: Cycles per slice of :func:`simulate` on each back end: Amaranth's simulator runs 10^2-10^3
#: cycles/s (70 at 512 bits), Verilator 10^4-10^5 (a slice is at most a few seconds).
SLICE_CYCLES = {"amaranth": 512, "verilator": 8192}


def engine_config(width, setups):
    """The :class:`~roce_hw.config.EngineConfig` simulated for ``setups`` at ``width`` bits."""
    return EngineConfig(data_width=width, n_qp=max(16, max(q.index for q in setups) + 1))


class RxeExpectation:
    """Which frames rxe will act on, for :class:`sim.vm.RxeBridge`'s ``expect_reply`` when a
    lossy network sits in front of the guest: a model of each guest QP's expected PSN.

    rxe (6.1, ../shared/TOOLCHAIN.md) drops a frame with a bad iCRC silently, executes the frame
    whose PSN it expects (and answers it if it asks for an ACK), sends one NAK for a PSN ahead
    (then drops the others of that gap silently) and re-ACKs a duplicate. Only frames with a
    good iCRC (checked with :func:`sim.oracle.protocol_icrc_bytes`) and the expected PSN are
    worth waiting for: every other frame's answer, if any, is collected all the same, but the
    simulation is not held for it (without this, each AckReq frame after a reordering would
    cost a ``--reply-timeout``)."""

    def __init__(self):
        self.epsn = {}               # guest QPN -> the PSN rxe expects

    def expect(self, guest_qpn, psn):
        """Guest QP ``guest_qpn`` expects ``psn`` first (its ``rq_psn``)."""
        self.epsn[guest_qpn] = psn & proto.PSN_MASK

    @staticmethod
    def icrc_ok(frame):
        from sim.oracle import protocol_icrc_bytes
        total = int.from_bytes(frame[16:18], "big")      # IPv4 total length
        end = 14 + total
        if total < 24 or end > len(frame):
            return False
        return protocol_icrc_bytes(frame[14:end - 4]) == frame[end - 4:end]

    def __call__(self, frame, info):
        want = self.epsn.get(info.dest_qp)
        if want is None:
            return True
        if info.psn != want or not self.icrc_ok(frame):
            return False
        self.epsn[info.dest_qp] = (want + 1) & proto.PSN_MASK
        return True


def simulate(width, setups, msgs, bridge, *, n_expected, progress=None, max_cycles=None,
             backend="amaranth", slice_cycles=None, network=None, stats=None):
    """Simulate the TX engine (``roce_tx``, :class:`roce_hw.top.TxTop`) on ``msgs`` on
    ``backend`` (:func:`sim.backend.open_engine`) with every frame going through ``bridge``;
    returns ``(cycles, refused WR statuses)``.

    The engine runs in slices of ``slice_cycles`` cycles (default :data:`SLICE_CYCLES`); after
    each slice its frames go to rxe through :meth:`sim.vm.RxeBridge.deliver_frames`, each
    stamped with the cycle after its last beat and paced by rxe's ACKs, as the per-cycle
    testbench did. The run ends once every WR and
    its payload went in and the ``n_expected`` frames (less those of WRs the engine refused)
    came out; ``cycles`` is the cycle count after the last frame or refusal report, whatever
    the slice length (the last slice stops there when it can: ``until_tx``). Raises
    :class:`sim.backend.BackendUnavailable` when the back end cannot run here.

    With ``network`` (a :class:`sim.lossy.LossyNetwork`), the whole engine (``roce_engine``,
    :class:`roce_hw.top.EngineTop`) is simulated instead: each RoCEv2 frame it sends is put
    into ``network.fwd`` at the cycle after its last beat and reaches rxe when it comes out
    (cycles of the engine's clock; a slice's frames come out at the end of the slice, or the
    next one), and rxe's frames go from the bridge through ``network.rev`` into the engine's
    receive port, where its ACK handler counts them. At the end the network is emptied and the
    engine runs until its inputs are consumed. ``stats`` (a dict), if given, receives
    ``top``, ``engine_frames`` (RoCEv2 frames the engine sent), ``retransmitted`` (those whose
    QP and PSN it had sent before) and ``counters`` (the engine's, ``None`` for the TX top)."""
    from sim.backend import open_engine, tx_kind
    from sim.bfm import WorkItem
    config = engine_config(width, setups)
    nbytes = width // 8
    if max_cycles is None:
        total = sum(len(m.payload) for m in msgs)
        max_cycles = 5000 + 4 * (total // nbytes + n_expected * (128 // nbytes + 4))
    step = int(slice_cycles or SLICE_CYCLES.get(backend, 512))
    refused, refused_frames = [], 0
    stats = {} if stats is None else stats
    stats.update(top="roce_engine" if network is not None else "roce_tx", engine_frames=0,
                 retransmitted=0, counters=None)
    seen = set()
    with open_engine(config, backend=backend, top="tx" if network is None else "engine") as eng:
        eng.set_addr(ENGINE_MAC, ENGINE_IP)
        for q in setups:
            eng.write_qp(q)
        for m in msgs:              # the WRs wait for the management writes (as set-up does)
            target = bridge.guest_qps[m.qp]
            write = m.opcode in _WRITE_OPS
            eng.post(WorkItem(qp=m.qp, opcode=m.opcode, payload=m.payload,
                              remote_addr=target["addr"] + m.offset if write else 0,
                              r_key=target["rkey"] if write else 0, imm=m.imm,
                              solicited=m.solicited, signaled=True), wr_id=m.index + 1)
        last_report = time.monotonic()
        done_at = 0             # the cycle count after the last frame or refusal so far
        limit = False
        while True:
            out = bridge.frames_out if network is None else stats["engine_frames"]
            left = n_expected - refused_frames - out - bridge.aborted
            if left <= 0 and not eng.count("wr_pending") and \
                    not eng.count("payload_pending"):
                break
            if eng.cycle >= max_cycles:
                refused.append({"wr_id": 0, "qp": -1, "status": -1,
                                "error": f"simulation stopped at the {max_cycles}-cycle limit "
                                         f"with {bridge.frames_out}/{n_expected} frames sent"})
                limit = True
                break
            eng.run(min(step, max_cycles - eng.cycle), until_tx=max(left, 0))
            for r in eng.pop_mgmt_rsp():
                if r["error"]:
                    refused.append({"wr_id": 0, "qp": r["qp"], "status": -1,
                                    "error": f"management write of QP {r['qp']} refused"})
            for st in eng.pop_status():
                done_at = max(done_at, int(st["cycle"]) + 1)
                refused.append({"wr_id": int(st["wr_id"]), "qp": int(st["qp"]),
                                "status": int(st["status"])})
                if 1 <= st["wr_id"] <= len(msgs):
                    refused_frames += msgs[int(st["wr_id"]) - 1].packets
            frames = eng.pop_tx()
            if frames:
                done_at = max(done_at, int(frames[-1].last) + 1)
            if network is not None:
                frames = [f for f in frames if tx_kind(f.data) == "data"]
            for f in frames:
                info = None if f.tuser else parse_roce(f.data)
                if info is not None:
                    stats["retransmitted"] += (info.dest_qp, info.psn) in seen
                    seen.add((info.dest_qp, info.psn))
            if network is None:
                bridge.deliver_frames(frames, eng.cycle)
            else:
                stats["engine_frames"] += sum(not f.tuser for f in frames)
                _through_network(eng, bridge, network, frames, eng.cycle)
            if progress is not None and time.monotonic() - last_report > 5:
                last_report = time.monotonic()
                progress(f"  cycle {eng.cycle}: {bridge.frames_out}/{n_expected} frames "
                         f"to rxe, {len(bridge.replies)} replies")
        cycles = eng.cycle if limit else done_at
        if network is not None:
            _drain_network(eng, bridge, network)
            stats["counters"] = eng.counters()
    bridge.flush(cycles)
    return cycles, refused


def _through_network(eng, bridge, network, frames, cycle):
    """One slice of the lossy path: the engine's ``frames`` into ``network.fwd``, what comes
    out of it by ``cycle`` to rxe, rxe's frames into ``network.rev``, what comes out of that
    into the engine's receive port."""
    for f in frames:
        if f.tuser:
            bridge.output_frame(f.data, int(f.last) + 1, aborted=True)
        else:
            network.fwd.put(f.data, int(f.last) + 1)
    for t, data in network.fwd.pop(cycle):
        bridge.output_frame(data, t)
    bridge.poll(cycle)
    while bridge.rx_queue:
        t, data = bridge.rx_queue.popleft()
        network.rev.put(data, max(t, cycle))
    for t, data in network.rev.pop(cycle):
        eng.push_rx(data, cycle=t)


def _drain_network(eng, bridge, network, quiet=200):
    """After the last frame: everything still in the network reaches its end, rxe answers
    (bounded by the bridge's reply timeout), and the engine runs until it has taken every
    frame and its output is quiet for ``quiet`` cycles."""
    while True:
        times = [t for t in (network.fwd.next_time(), network.rev.next_time()) if t is not None]
        if not times and not bridge.rx_queue:
            bridge.flush(eng.cycle)
            if not bridge.rx_queue:
                break
        cycle = max([eng.cycle] + times)
        if cycle > eng.cycle:
            eng.run(cycle - eng.cycle)
            eng.pop_tx()                    # the engine sends nothing new: nothing to pass on
        _through_network(eng, bridge, network, [], eng.cycle)
    eng.run(network.rev.delay + 1 + 100_000, quiet=quiet)


# -- verification ----------------------------------------------------------------------------
def _psn_in(psn, first, count):
    return ((psn - first) & proto.PSN_MASK) < count


def verify(vm, bridge, setups, msgs, guest, *, lossy=False):
    """Check every message against what rxe reports; returns the list of :class:`QPResult`.
    ``lossy``: a lossy network sat between the engine and rxe (a frame that did not reach rxe
    was lost there, not unsent)."""
    from sim.vm import parse_roce
    results = []
    # What went to rxe, per guest QP and PSN.
    sent = {}
    for c in bridge.capture:
        if c.direction != "to_guest":
            continue
        info = parse_roce(c.data)
        if info is None:
            continue
        rec = sent.setdefault((info.dest_qp, info.psn), [0, False])
        if c.note != "dropped":
            rec[0] += 1
        rec[1] |= bool(c.note)
    for q in setups:
        g = guest[q.index]
        engine_qpn = proto.LOCAL_QPN_BASE + q.index
        mine = [m for m in msgs if m.qp == q.index]
        r = QPResult(index=q.index, guest_qpn=g["qpn"], pmtu=q.pmtu, start_psn=q.start_psn,
                     messages=len(mine))
        acks = []
        for _, info, _ in bridge.replies:
            if info.dest_qp != engine_qpn or not info.is_ack:
                continue
            if info.is_nak:
                r.naks += 1
                r.nak_list.append((info.syndrome, info.psn))
            else:
                r.acks += 1
                acks.append(info.psn)
        for m in mine:
            for k in range(m.packets):
                n, altered = sent.get((g["qpn"], (m.first_psn + k) & proto.PSN_MASK), (0, False))
                m.frames += n
                m.altered |= altered
            r.frames += m.frames
            m.acked = any(((a - m.last_psn) & proto.PSN_MASK) < (1 << 23) for a in acks)
            m.naked = any(_psn_in(p, m.first_psn, m.packets) for _, p in r.nak_list)
            if m.frames < m.packets:
                m.problems.append(f"{m.packets - m.frames} of {m.packets} frames "
                                  f"{'lost in the network' if lossy else 'not sent'}")
            if m.altered:
                m.problems.append("a frame was altered on the way (--corrupt-frame)")
            if not m.acked:
                m.problems.append("rxe did not ACK its last PSN")
            if m.naked:
                m.problems.append("rxe NAKed one of its PSNs")
        # Memory: each WRITE target, then the whole MR against the expected image.
        writes = [m for m in mine if m.opcode in _WRITE_OPS]
        image = bytearray([MR_FILL]) * g["mr_size"]
        for m in writes:
            image[m.offset:m.offset + len(m.payload)] = m.payload
        if writes:
            hashes = vm.call("mem_hash", handle=g["handle"],
                             ranges=[[m.offset, len(m.payload)] for m in writes])
            for m, h in zip(writes, hashes):
                if h != hashlib.sha256(m.payload).hexdigest():
                    m.problems.append("guest memory differs from the WRITE payload")
                    m.data_ok = False
                    r.memory_ok = False
        whole = vm.call("mem_hash", handle=g["handle"], ranges=[[0, g["mr_size"]]])[0]
        r.untouched_ok = whole == hashlib.sha256(bytes(image)).hexdigest() or not r.memory_ok
        # Receive completions, in the order the receives were posted.
        recvs = [m for m in mine if m.opcode in _RECV_OPS]
        wcs = vm.call("poll", handle=g["handle"], max=len(recvs) + 16,
                      timeout_ms=1000 if recvs else 0, count=len(recvs)) if recvs else \
            vm.call("poll", handle=g["handle"], max=16)
        by_id = {wc["wr_id"]: wc for wc in wcs if wc["opcode"].startswith("RECV")}
        for m in recvs:
            wc = by_id.get(m.recv_seq)
            why = None
            want_op = "RECV_RDMA_WITH_IMM" if m.opcode == W.RDMA_WRITE_WITH_IMM else "RECV"
            if wc is None:
                why = "no receive completion"
            elif wc["status"] != 0:
                why = f"receive completion with status {wc['status']}"
            elif wc["opcode"] != want_op:
                why = f"completion opcode {wc['opcode']}, expected {want_op}"
            elif wc["byte_len"] != len(m.payload):
                why = f"completion byte_len {wc['byte_len']}, expected {len(m.payload)}"
            elif m.opcode in _IMM_OPS and wc.get("imm") != m.imm:
                got = wc.get("imm")
                why = f"completion immediate {'none' if got is None else hex(got)}, " \
                      f"expected {m.imm:#x}"
            elif m.opcode not in _IMM_OPS and "imm" in wc:
                why = "completion carries an immediate the WR did not have"
            elif want_op == "RECV" and wc.get("data_sha256") != \
                    hashlib.sha256(m.payload).hexdigest():
                why = "received data differs from the SEND payload"
            if why:
                m.problems.append(why)
                m.data_ok = False
                r.completions_ok = False
        extra = [wc for wc in wcs if wc["opcode"].startswith("RECV")
                 and wc["wr_id"] not in {m.recv_seq for m in recvs}]
        if extra:
            r.completions_ok = False
            r.extra_completions = len(extra)
        r.state = vm.call("query_qp", handle=g["handle"])["state"]
        r.passed = sum(m.passed for m in mine)
        r.failed = len(mine) - r.passed
        results.append(r)
    return results


# -- one run ---------------------------------------------------------------------------------
def run_rxe(vm, width, setups, msgs, *, corrupt=None, reply_timeout=2.0, progress=None,
            backend="amaranth", network=None):
    """Run ``msgs`` on the engine at ``width`` bits, simulated on ``backend`` (``"amaranth"`` or
    ``"verilator"``), into the booted ``vm``; returns an :class:`RxeRun`. The guest QPs are
    destroyed afterwards (the VM can be reused). Raises :class:`sim.backend.BackendUnavailable`
    when the back end cannot run here.

    ``network``: keyword arguments of :class:`sim.lossy.LossyNetwork` (from
    :func:`sim.faults.network_options`): the whole engine then runs behind that network, both
    directions (:func:`simulate`)."""
    from sim.lossy import LossyNetwork
    from sim.vm import RxeBridge
    plan = plan_frames(setups, msgs)
    corrupted = None
    hook = None
    if corrupt is not None:
        if not 0 <= corrupt < len(plan):
            raise ValueError(f"--corrupt-frame {corrupt}: the run has {len(plan)} frames "
                             f"(0 to {len(plan) - 1})")
        target = next((k for k in range(corrupt, len(plan)) if plan[k][2] > 0), None)
        if target is None:
            raise ValueError(f"--corrupt-frame {corrupt}: no frame from {corrupt} on has "
                             f"payload")
        hook = corrupt_hook(target)
        corrupted = [target, None, plan[target][1]]
    options, net = network, None
    expect = None
    if options is not None:
        net = LossyNetwork(**options)
        expect = RxeExpectation()
    stats = {}
    counters0 = vm.call("counters")
    guest = setup_guest(vm, setups, msgs)
    try:
        bridge = RxeBridge(vm, reply_timeout=reply_timeout, to_guest_hook=hook,
                           expect_reply=expect)
        bridge.guest_qps = guest
        for q in setups:
            bridge.pair(guest[q.index]["qpn"], proto.LOCAL_QPN_BASE + q.index)
            if expect is not None:
                expect.expect(guest[q.index]["qpn"], q.start_psn)
        vm.drain_frames()
        t0 = time.monotonic()
        cycles, refused = simulate(width, setups, msgs, bridge, n_expected=len(plan),
                                   progress=progress, backend=backend, network=net,
                                   stats=stats)
        sim_seconds = time.monotonic() - t0
        results = verify(vm, bridge, setups, msgs, guest, lossy=net is not None)
        counters1 = vm.call("counters")
    finally:
        for d in guest.values():
            try:
                vm.call("destroy_qp", handle=d["handle"])
            except Exception:       # the report matters more than the clean-up
                pass
    if corrupted is not None:
        corrupted[1] = guest[plan[corrupted[0]][0].qp]["qpn"]
        corrupted = tuple(corrupted)
    delta = {k: counters1[k] - counters0.get(k, 0) for k in counters1
             if isinstance(counters1[k], int) and counters1[k] != counters0.get(k, 0)}
    return RxeRun(width=width, backend=backend, messages=msgs, qps=results, counters=delta,
                  cycles=cycles, frames=bridge.frames_out, refused=refused,
                  unanswered=len(bridge.unanswered), sim_seconds=sim_seconds,
                  wait_seconds=bridge.wait_seconds, corrupted=corrupted, bridge=bridge,
                  network=net, network_options=options, stats=stats)


def report(run, out=sys.stdout):
    """Print the per-QP table, the failures and the last line ``N passed, M failed``."""
    p = lambda *a: print(*a, file=out)   # noqa: E731
    p(f"{'QP':>3} {'rxe QPN':>7} {'PMTU':>5} {'start PSN':>9} {'msgs':>5} {'frames':>6} "
      f"{'ACKs':>5} {'NAKs':>5} {'memory':>7} {'recv WCs':>8} {'state':>5} {'pass':>5} "
      f"{'fail':>5}")
    for q in run.qps:
        mem = "ok" if q.memory_ok and q.untouched_ok else "BAD"
        p(f"{q.index:>3} {q.guest_qpn:>7} {q.pmtu:>5} {q.start_psn:>#9x} {q.messages:>5} "
          f"{q.frames:>6} {q.acks:>5} {q.naks:>5} {mem:>7} "
          f"{'ok' if q.completions_ok else 'BAD':>8} {q.state:>5} {q.passed:>5} {q.failed:>5}")
        for syn, psn in q.nak_list:
            p(f"    NAK syndrome {syn:#04x} PSN {psn:#08x}")
        if not q.untouched_ok:
            p("    MR bytes outside the WRITE targets changed")
    if run.corrupted:
        k, qpn, psn = run.corrupted
        p(f"corrupted frame {k} (rxe QPN {qpn}, PSN {psn:#08x}): one payload bit flipped")
    for r in run.refused:
        p(f"engine refused WR {r['wr_id']} (QP {r['qp']}): status {r['status']} "
          f"{r.get('error', '')}".rstrip())
    for m in run.messages:
        if m.problems:
            p(f"FAIL message {m.index} QP {m.qp} {OP_NAMES[m.opcode]} {len(m.payload)} B "
              f"PSN {m.first_psn:#08x}+{m.packets}: {'; '.join(m.problems)}")
    if run.counters:
        p("rxe counters: " + ", ".join(f"{k} +{v}" for k, v in sorted(run.counters.items())))
    p(f"{run.frames} frames in {run.cycles} cycles at {run.width} bits; simulation "
      f"({run.backend}) {run.sim_seconds:.1f} s of which {run.wait_seconds:.2f} s waiting for "
      f"rxe; {run.unanswered} AckReq frames unanswered")
    if run.network is not None:
        doc = run_json(run)
        parts = []
        for k in ("fwd", "rev"):
            c = doc["network"][k]
            parts.append(f"{k} {c['dropped'] + c['targeted_dropped']} dropped, "
                         f"{c['duplicated']} duplicated, {c['reordered']} reordered, "
                         f"{c['corrupted']} corrupted")
        p("network: " + "; ".join(parts))
        rel = doc["reliability"]
        naks = rel["naks_received"]
        p(f"engine: {rel['acks_received']} ACKs and {naks['seq']}/{naks['rnr']}/"
          f"{naks['fatal']} sequence/RNR/fatal NAKs received, {rel['retransmitted']} packets "
          f"retransmitted")
    lost = len(run.messages) - run.delivered
    p(faults.delivery_line(run.delivered, len(run.messages), run.delivery_ok,
                           lost_reason=run.network is not None and lost > 0))
    p(f"{run.passed} passed, {run.failed} failed")


def run_json(run):
    """The JSON summary of a run (``--json``): the run's figures, per QP and per message, and
    the ``network``, ``reliability`` and ``delivery`` sections of :mod:`sim.faults`
    (``network`` is ``null`` without the lossy network; ``reliability.ack_counters`` and the
    NAKs received are ``null`` for the TX top, which has no receive path)."""
    naks_sent = collections.Counter()
    for _, info, _ in run.bridge.replies if run.bridge is not None else ():
        if info.is_ack and info.is_nak:
            naks_sent["rnr" if info.syndrome >> 5 == 1 else f"{info.syndrome:#04x}"] += 1
    by_status = collections.Counter(proto.WcStatus(r["status"]).name for r in run.refused
                                    if r["status"] >= 0)
    stats = run.stats or {}
    refused = sum(1 for r in run.refused if r["wr_id"])
    acked = [m for m in run.messages if m.acked]
    return {
        "width": run.width, "backend": run.backend, "top": stats.get("top", "roce_tx"),
        "cycles": run.cycles, "frames_to_rxe": run.frames,
        "engine_frames": stats.get("engine_frames", run.frames),
        "passed": run.passed, "failed": run.failed, "ok": run.verdict,
        "unanswered": run.unanswered, "corrupted_frame": run.corrupted,
        "qps": [{**{k: getattr(q, k) for k in (
            "index", "guest_qpn", "pmtu", "start_psn", "messages", "frames", "acks", "naks",
            "memory_ok", "untouched_ok", "completions_ok", "extra_completions", "state",
            "passed", "failed")},
            "nak_list": [list(n) for n in q.nak_list]} for q in run.qps],
        "messages": [{"index": m.index, "qp": m.qp, "opcode": OP_NAMES[m.opcode],
                      "length": len(m.payload), "first_psn": m.first_psn, "packets": m.packets,
                      "frames": m.frames, "acked": m.acked, "naked": m.naked,
                      "delivered": m.delivered, "problems": m.problems}
                     for m in run.messages],
        "rxe_counters": run.counters, "refused": run.refused,
        "network": None if run.network is None else
        faults.network_fields(run.network, run.network_options),
        "reliability": faults.reliability_fields(
            stats.get("counters"), retransmitted=stats.get("retransmitted", 0),
            by_status=by_status, naks_sent=naks_sent),
        "delivery": {
            "ok": run.delivery_ok, "messages": len(run.messages), "delivered": run.delivered,
            "lost": len(run.messages) - run.delivered - refused, "refused": refused,
            "arrived_ok": all(m.data_ok for m in acked) and all(
                q.untouched_ok and not q.extra_completions for q in run.qps),
            "all_arrived": run.delivered == len(run.messages),
            "rxe_qps_rts": all(q.state == "RTS" for q in run.qps),
            "problems": [f"message {m.index} (QP {m.qp}): {'; '.join(m.problems)}"
                         for m in run.messages if m.problems][:20],
        },
    }


def _scenario(path):
    """QPs and messages of a :mod:`sim.traffic` scenario (remote fields optional)."""
    from sim.traffic import load_scenario
    try:
        doc = json.loads(Path(path).read_text())
        for q in doc.get("qps", []):
            q.setdefault("remote_qpn", 1)
            q.setdefault("remote_mac", GUEST_MAC)
            q.setdefault("remote_ip", GUEST_IP)
    except (OSError, json.JSONDecodeError, AttributeError) as e:
        raise ValueError(f"cannot read scenario {path}: {e}") from None
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(doc, f)
    try:
        settings, setups, wrs = load_scenario(f.name)
    finally:
        Path(f.name).unlink()
    msgs = [Message(index=n, qp=w.qp, opcode=w.opcode, payload=w.payload, imm=w.imm,
                    solicited=w.solicited) for n, w in enumerate(wrs)]
    return settings, setups, msgs


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m sim.rxe", description=__doc__.split("\n\n")[0],
        epilog="Exit status: 0 all messages delivered exactly, 1 a failure, 2 usage or set-up "
               "error. The guest image is built on first use (apt-get download; cached in "
               "build/rxe-guest/).")
    ap.add_argument("--width", type=int, default=None,
                    help=f"engine bus width in bits, one of {', '.join(map(str, DATA_WIDTHS))} "
                         f"(default: the scenario's width, else 64)")
    ap.add_argument("--backend", choices=("amaranth", "verilator"), default="amaranth",
                    help="simulation back end (sim.backend): Amaranth's simulator, or the "
                         "Verilog compiled by Verilator, hundreds of times faster (built on "
                         "first use, 1-3 minutes, then cached; needs verilator, g++ and make) "
                         "(default: %(default)s)")
    ap.add_argument("--seed", type=int, default=1, help="random seed (default: %(default)s)")
    ap.add_argument("--messages", type=int, default=20,
                    help="number of random messages (default: %(default)s)")
    ap.add_argument("--qps", type=int, default=5,
                    help="number of QPs, 1 to 16 (default: %(default)s)")
    ap.add_argument("--pmtu", type=int, choices=PMTUS, default=None,
                    help="PMTU of every QP in bytes (default: QP i uses "
                         "256/512/1024/2048/4096[i mod 5])")
    ap.add_argument("--scenario", metavar="FILE", default=None,
                    help="take QPs and WRs from a sim.traffic scenario JSON instead of random "
                         "traffic (default: none)")
    ap.add_argument("--pcap", metavar="OUT", default=None,
                    help="write both directions (engine -> rxe, rxe -> engine) to this pcap "
                         "(default: none)")
    ap.add_argument("--corrupt-frame", metavar="K", type=int, default=None,
                    help="flip one payload bit of frame K (0-based; default: no corruption)")
    ap.add_argument("--json", metavar="OUT", default=None,
                    help="write the run's summary here: per QP, per message, the lossy "
                         "network's counts, the engine's ACK counters, the delivery verdict "
                         "(default: none)")
    ap.add_argument("--reply-timeout", type=float, default=2.0,
                    help="seconds to wait for rxe to answer an AckReq frame (default: "
                         "%(default)s)")
    ap.add_argument("--quiet", action="store_true", help="no progress messages on stderr")
    faults.add_arguments(ap, latency=100)
    args = ap.parse_args(argv)
    if args.corrupt is not None and args.corrupt.strip().lstrip("+-").isdigit():
        print(f"error: --corrupt {args.corrupt}: --corrupt is the probability that a frame is "
              f"corrupted (e.g. 0.01); to flip a bit of frame K use --corrupt-frame K",
              file=sys.stderr)
        return 2
    try:
        network = faults.network_options(args, seed=args.seed)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    settings = {}
    if args.scenario:
        try:
            settings, setups, msgs = _scenario(args.scenario)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if max(q.index for q in setups) >= 16384:
            print("error: a scenario QP index is beyond 16383", file=sys.stderr)
            return 2
    if args.width is None:
        args.width = settings.get("width") or 64
    if args.width not in DATA_WIDTHS:
        ap.error(f"--width {args.width} is not supported; choose one of "
                 f"{', '.join(map(str, DATA_WIDTHS))}")
    if not 1 <= args.qps <= 16:
        ap.error("--qps must be 1 to 16")
    if args.messages < 1:
        ap.error("--messages must be at least 1")
    if args.reply_timeout <= 0:
        ap.error("--reply-timeout must be positive")
    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr,
                                                                   flush=True))
    if not args.scenario:
        setups, msgs = random_messages(seed=args.seed, messages=args.messages, qps=args.qps,
                                       pmtu=args.pmtu)
    if args.corrupt_frame is not None:
        n = len(plan_frames(setups, msgs))
        if not 0 <= args.corrupt_frame < n:
            print(f"error: --corrupt-frame {args.corrupt_frame}: the run has {n} frames "
                  f"(0 to {n - 1})", file=sys.stderr)
            return 2

    from sim.backend import BackendUnavailable
    if args.backend == "verilator":
        # Built (or found in the cache) before the guest boots: a missing tool or a failed
        # build is a set-up error, and the simulation's time does not include the build.
        from sim.verilator import build
        try:
            build(engine_config(args.width, setups), top="tx" if network is None else "engine",
                  log=log)
        except BackendUnavailable as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except RuntimeError as e:
            print(f"error: the Verilator build failed: {e}", file=sys.stderr)
            return 2
    from sim.guest import GuestBuildError
    from sim.vm import RxeVM, VMError
    try:
        with RxeVM(log=log) as vm:
            log(f"{len(msgs)} messages on {len(setups)} QPs at {args.width} bits "
                f"({args.backend})")
            try:
                run = run_rxe(vm, args.width, setups, msgs, corrupt=args.corrupt_frame,
                              reply_timeout=args.reply_timeout, progress=log,
                              backend=args.backend, network=network)
            except ValueError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
    except (GuestBuildError, VMError, BackendUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.pcap:
        from sim.pcap import write_pcap
        Path(args.pcap).parent.mkdir(parents=True, exist_ok=True)
        write_pcap(args.pcap, run.bridge.pcap_frames(CLOCK_MHZ[args.width]), nanoseconds=True)
        log(f"wrote {len(run.bridge.capture)} frames to {args.pcap}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(run_json(run), indent=2) + "\n")
    report(run)
    return 0 if run.verdict else 1


if __name__ == "__main__":
    sys.exit(main())
