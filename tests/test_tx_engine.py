# SPDX-License-Identifier: BSD-2-Clause
"""TxEngine: random work requests -> frames equal to the golden model, refusals, line rate."""

import random
import struct
import zlib
from dataclasses import dataclass, replace

import pytest

from roce_hw import proto
from roce_hw.config import EngineConfig
from roce_hw.model.icrc import frame_icrc_ok
from roce_hw.model.packet import QPPath, build_request_frame, parse_frame
from roce_hw.model.requester import RequesterModel
from roce_hw.model.segment import segment_message
from roce_hw.engine import TxEngine
from roce_hw.generate import emit, lint
from roce_hw.verbs import WcStatus
from sim.bfm import QPSetup, mgmt_write, qp_context
from sim.harness import run_simulation
from sim.stream import send_packet

__all__ = []

LOCAL_MAC = 0x02_00_00_00_00_01
LOCAL_IP = 0x0A_00_00_01
WO = proto.WrOpcode
OPS = (WO.RDMA_WRITE, WO.RDMA_WRITE_WITH_IMM, WO.SEND, WO.SEND_WITH_IMM)


@dataclass
class QP(QPSetup):
    def ctx(self):
        return qp_context(self)

    def path(self, ttl=64):
        return QPPath(src_mac=LOCAL_MAC, dst_mac=self.remote_mac, src_ip=LOCAL_IP,
                      dst_ip=self.remote_ip, dest_qp=self.remote_qpn, udp_sport=self.udp_sport,
                      dscp=self.dscp, ecn=self.ecn, ttl=ttl, p_key=self.p_key,
                      migreq=self.migreq)


@dataclass
class WR:
    wr_id: int
    opcode: int
    qp: int
    payload: bytes
    length: int          # declared length (differs from len(payload) for a mismatch)
    remote_addr: int = 0
    r_key: int = 0
    imm: int = 0
    solicited: bool = False


@dataclass
class Resume(WR):
    """A resume request: ``payload`` is the whole message, ``sent`` what goes on ``i``."""
    start_packet: int = 0
    start_psn: int = 0
    sent: bytes = b""


def expected(config, qps, wrs, reconfig=None):
    """Reference behaviour from the requester model (:mod:`roce_hw.model.requester`): list of
    ``(qp, PacketSpec)`` sent (not aborted), list of status dicts, number of aborted frames.
    ``reconfig`` maps a WR position to a QP rewritten through the management port after that
    WR."""
    model = RequesterModel(n_qp=config.n_qp, ack_req_every=config.ack_req_every,
                           ttl=config.ttl, ip_id_start=config.ip_id_start,
                           local_mac=LOCAL_MAC, local_ip=LOCAL_IP)
    by_index = {}
    for q in qps:
        model.write_qp(q.index, q.ctx())
        by_index[q.index] = q
    sent = []
    for pos, w in enumerate(wrs):
        if reconfig and pos - 1 in reconfig:
            q = reconfig[pos - 1]
            model.write_qp(q.index, q.ctx())
            by_index[q.index] = q
        extra = {"start_packet": w.start_packet, "start_psn": w.start_psn} \
            if isinstance(w, Resume) else {}
        for s in model.post(qp=w.qp, opcode=w.opcode, payload=w.payload, length=w.length,
                            wr_id=w.wr_id, remote_addr=w.remote_addr, r_key=w.r_key,
                            imm=w.imm, solicited=w.solicited, **extra):
            if s.frame is not None:
                sent.append((by_index[s.qp], s.packet))
    return sent, model.statuses, model.aborted


def simulate(config, qps, wrs, *, seed=0, p_wr_idle=0.0, p_in_idle=0.0, p_stall=0.0,
             p_status_stall=0.0, max_cycles=None, local_mac=LOCAL_MAC,
             local_ip=LOCAL_IP, ip_id_load=None, reconfig=None, mgmt_noise=None):
    """Run the engine; returns dict with frames ``[(bytes, aborted, first_cycle, beats)]``,
    statuses, counters and per-WR accept cycles."""
    dut = TxEngine(config)
    w = config.data_width
    n = w // 8
    rng = random.Random(seed)
    rng_wr, rng_in, rng_o, rng_st = (random.Random(rng.getrandbits(32)) for _ in range(4))
    res = {"frames": [], "statuses": [], "wr_cycles": [], "beat_cycles": [], "ready_cycles": 0}
    st = {"cycle": 0, "posted": False, "sent": False, "setup": False}
    if max_cycles is None:
        total = sum(len(x.payload) for x in wrs)
        max_cycles = 4000 + 8 * (total // n + 40 * len(wrs))
        if p_wr_idle or p_in_idle or p_stall:
            max_cycles *= 4

    async def write_qp(ctx, q):
        await mgmt_write(ctx, dut, q.index, q.ctx())

    async def setup_and_post(ctx):
        ctx.set(dut.local_mac, local_mac)
        ctx.set(dut.local_ip, local_ip)
        for q in qps:
            await write_qp(ctx, q)
        if ip_id_load is not None:
            ctx.set(dut.ip_id_load.payload, {"value": ip_id_load})
            ctx.set(dut.ip_id_load.valid, 1)
            await ctx.tick().until(dut.ip_id_load.ready)
            ctx.set(dut.ip_id_load.valid, 0)
        st["setup"] = True
        for pos, x in enumerate(wrs):
            while p_wr_idle and rng_wr.random() < p_wr_idle:
                await ctx.tick()
            fields = {
                "wr_id": x.wr_id, "opcode": int(x.opcode), "qp": x.qp,
                "remote_addr": x.remote_addr, "r_key": x.r_key, "length": x.length,
                "imm": x.imm, "signaled": 1, "solicited": int(x.solicited)}
            port = dut.wr
            if isinstance(x, Resume):
                port = dut.resume
                fields.update(start_packet=x.start_packet, start_psn=x.start_psn)
            ctx.set(port.payload, fields)
            ctx.set(port.valid, 1)
            await ctx.tick().until(port.ready)
            ctx.set(port.valid, 0)
            if reconfig and pos in reconfig:
                # let the engine drain (the WR's payload is sent by the other testbench)
                await ctx.tick().repeat(400)
                await write_qp(ctx, reconfig[pos])
        st["posted"] = True

    async def noise(ctx):
        # management writes to an unused row while traffic runs: they win the table's write
        # port now and then, so the engine's write-backs (tx_upd) wait
        while not st["setup"]:
            await ctx.tick()
        ctx.set(dut.qp_mgmt_rsp.ready, 1)
        while not (st["posted"] and st["sent"]):
            ctx.set(dut.qp_mgmt_req.payload, {"qp": mgmt_noise, "write": 1,
                                              "ctx": {"state": proto.QPState.RESET}})
            ctx.set(dut.qp_mgmt_req.valid, 1)
            await ctx.tick().until(dut.qp_mgmt_req.ready)
        ctx.set(dut.qp_mgmt_req.valid, 0)

    async def payload(ctx):
        while not st["setup"]:
            await ctx.tick()
        for x in wrs:
            data = x.sent if isinstance(x, Resume) else x.payload
            if data:
                await send_packet(ctx, dut.i, data, w, rng=rng_in, p_idle=p_in_idle)
        st["sent"] = True

    async def consume(ctx):
        cur, first, beats, quiet = bytearray(), None, 0, 0
        while True:
            ready = not (p_stall and rng_o.random() < p_stall)
            ctx.set(dut.o.ready, ready)
            _, _, valid, p = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            if valid and ready:
                quiet = 0
                keep = int(p.keep)
                cnt = keep.bit_length()
                assert keep == (1 << cnt) - 1 and cnt > 0, f"keep {keep:#x}"
                assert bool(p.first) == (beats == 0)
                assert p.last or cnt == n, "partial keep without last"
                if beats == 0:
                    first = st["cycle"]
                cur += int(p.data).to_bytes(n, "little")[:cnt]
                beats += 1
                if p.last:
                    res["frames"].append((bytes(cur), bool(p.abort), first, beats))
                    cur, beats = bytearray(), 0
            elif st["posted"] and st["sent"]:
                quiet += 1
            if quiet > 300:
                break
        ctx.set(dut.o.ready, 0)

    async def status(ctx):
        async for _, _, valid, ready, p in ctx.tick().sample(dut.status.valid,
                                                               dut.status.ready,
                                                               dut.status.payload):
            if valid and ready:
                res["statuses"].append({"wr_id": int(p.wr_id), "qp": int(p.qp),
                                        "status": int(p.status)})
            ctx.set(dut.status.ready, not (p_status_stall and rng_st.random() < p_status_stall)
                    and p_status_stall < 1)

    async def monitor(ctx):
        async for _, _, wv, wrd, ov, ordy, *cnt in ctx.tick().sample(
                dut.wr.valid, dut.wr.ready, dut.o.valid, dut.o.ready, dut.status_dropped,
                dut.frames, dut.frames_aborted, dut.wrs_refused):
            res["dropped"], res["n_frames"], res["n_aborted"], res["n_refused"] = cnt
            if wv and wrd:
                res["wr_cycles"].append(st["cycle"])
            if ov and ordy:
                res["beat_cycles"].append(st["cycle"])
            if ordy and st["setup"]:
                res["ready_cycles"] += 1
            st["cycle"] += 1

    try:
        tbs = [setup_and_post, payload, consume] + ([noise] if mgmt_noise is not None else [])
        run_simulation(dut, tbs, [status, monitor],
                       cycles=max_cycles, vcd_name=f"tx_engine_{w}")
    except TimeoutError as exc:
        got = [(f.hex(), ab) for f, ab, _, _ in res["frames"]]
        raise TimeoutError(f"{exc}; {len(res['wr_cycles'])}/{len(wrs)} WRs accepted, "
                           f"frames so far {got}, statuses {res['statuses']}") from None
    return res


#: The only configurations the default suite builds with Verilator (each other one costs a 1-3
#: minute build in CI): the whole engine (top "engine") at 64 and 512 bits, 16 QPs, everything
#: else default.
VERILATOR_CONFIGS = {w: EngineConfig(data_width=w, n_qp=16) for w in (64, 512)}
# VERILATOR_CLOSE: every Verilator engine is closed as soon as its test is done with it (a
# ``with`` block), also when the test fails. Verilator's thread context is left dangling when
# the newest of several live engines of one library is destroyed, and destroying another one
# afterwards hangs or crashes the process -- as an engine kept alive by the traceback of a
# failed test (pytest keeps ``sys.last_traceback``) would be, later.


def simulate_verilator(config, qps, wrs, *, seed=0, p_wr_idle=0.0, p_in_idle=0.0, p_stall=0.0,
                       p_status_stall=0.0, max_cycles=None, ip_id_load=None, mgmt_noise=None):
    """:func:`simulate` on the Verilator back end (:mod:`sim.backend`): the whole engine
    (``RoceEngine`` in its ``roce_engine`` top, its RX idle) instead of ``TxEngine``; the same
    result dict (``frames`` ``[(bytes, aborted, first_cycle, beats)]``, ``statuses``, the
    counters, ``wr_cycles``) plus ``tx``, the back end's :class:`sim.backend.TxFrame` list.
    Random idle on ``wr`` and ``payload``, stalls on ``tx`` and ``status`` from the back end's
    per-stream generators (seeded by ``seed``). WRs only (the back end's ``wr`` and ``resume``
    queues are not ordered with each other). ``mgmt_noise``: management writes (state RESET)
    to that row, one after the other, from the first WR until every WR and payload is in."""
    from sim.backend import framing_errors, open_engine
    assert config in VERILATOR_CONFIGS.values(), \
        f"{config} is not one of the default suite's Verilator builds"
    assert not any(isinstance(x, Resume) for x in wrs)
    n = config.data_bytes
    if max_cycles is None:
        total = sum(len(x.payload) for x in wrs)
        max_cycles = 4000 + 8 * (total // n + 40 * len(wrs))
        if p_wr_idle or p_in_idle or p_stall:
            max_cycles *= 4
    # closed when done, also on a failure: see VERILATOR_CLOSE
    with open_engine(config, backend="verilator", seed=seed) as eng:
        eng.set_addr(LOCAL_MAC, LOCAL_IP)
        eng.set_random(wr=p_wr_idle, payload=p_in_idle, tx=p_stall, status=p_status_stall)
        for q in qps:
            eng.write_qp(q)
        if ip_id_load is not None:
            eng.push_ip_id(ip_id_load)
        for x in wrs:
            eng.push_wr({"wr_id": x.wr_id, "opcode": int(x.opcode), "qp": x.qp,
                         "remote_addr": x.remote_addr, "r_key": x.r_key, "length": x.length,
                         "imm": x.imm, "signaled": 1, "solicited": int(x.solicited)})
            eng.push_payload(x.payload)
        if mgmt_noise is not None:
            # the set-up writes first (WRs and payload wait for them), then the noise, which the
            # WRs and their payload must not wait for
            while eng.count("mgmt_pending") or eng.count("mgmt_outstanding"):
                eng.run(1)
            eng.set_wr_waits_mgmt(False)
            noise = {"state": proto.QPState.RESET}
            while eng.count("wr_pending") or eng.count("payload_pending"):
                if eng.cycle > max_cycles:
                    break
                while eng.count("mgmt_pending") < 64:
                    eng.push_mgmt(mgmt_noise, 1, noise)
                eng.run(32)
        budget = max(1, max_cycles - eng.cycle)
        ran = eng.run(budget, quiet=300)
        tx = eng.pop_tx()
        if ran == budget or eng.count("wr_pending") or eng.count("payload_pending"):
            got = [(f.data.hex(), f.tuser) for f in tx]
            raise TimeoutError(f"not done in {max_cycles} cycles: {eng.count('wrs_accepted')}/"
                               f"{len(wrs)} WRs accepted, frames so far {got}, statuses "
                               f"{eng.pop_status()}")
        for k, f in enumerate(tx):
            assert not f.errors, f"frame {k}: {', '.join(framing_errors(f.errors))}"
        c = eng.counters()
        mgmt = eng.pop_mgmt_rsp()
        assert not any(r["error"] for r in mgmt), [r for r in mgmt if r["error"]][:3]
        statuses = [{k: s[k] for k in ("wr_id", "qp", "status")} for s in eng.pop_status()]
        return {"frames": [(f.data, bool(f.tuser), f.first, f.beats) for f in tx], "tx": tx,
                "statuses": statuses,
                "wr_cycles": eng.pop_wr_accepts(), "dropped": c["tx_status_dropped"],
                "n_frames": c["tx_frames"], "n_aborted": c["tx_frames_aborted"],
                "n_refused": c["tx_wrs_refused"], "mgmt": mgmt, "cycles": eng.cycle}


def check(config, qps, wrs, res, *, scapy_frames=1000, ip_id_start=None,
          reconfig=None):
    """Compare a simulation with :func:`expected`, byte for byte; returns the frames."""
    sent, statuses, aborted = expected(config, qps, wrs, reconfig)
    frames = res["frames"]
    good = [(k, f) for k, (f, ab, _, _) in enumerate(frames) if not ab]
    assert sum(1 for f in frames if f[1]) == aborted
    assert res["n_aborted"] == aborted
    assert len(good) == len(sent), f"{len(good)} frames, expected {len(sent)}"
    assert res["n_frames"] == len(frames)
    id0 = config.ip_id_start if ip_id_start is None else ip_id_start
    for (k, frame), (q, pkt) in zip(good, sent):
        exp = build_request_frame(q.path(config.ttl), pkt, ip_id=(id0 + k) & 0xFFFF)
        assert frame == exp, (f"frame {k}: psn {pkt.psn} opcode {pkt.opcode!r} "
                              f"len {len(pkt.payload)}\n got {frame.hex()}\nwant {exp.hex()}")
        n = config.data_bytes
        assert frames[k][3] == -(-len(frame) // n), "frame longer than ceil(bytes / width)"
    for _, frame in good:
        assert frame_icrc_ok(frame)
        assert zlib_icrc_ok(frame)
    assert res["n_refused"] == len(statuses)
    if res["dropped"] == 0:
        assert res["statuses"] == [dict(s, status=int(s["status"])) for s in statuses]
    else:   # reports still in the 4-entry FIFO are neither received nor dropped
        want = [dict(s, status=int(s["status"])) for s in statuses]
        assert len(want) - 4 <= len(res["statuses"]) + res["dropped"] <= len(want)
        it = iter(want)
        assert all(any(r == x for x in it) for r in res["statuses"])
    for (_, frame), (q, pkt) in list(zip(good, sent))[:scapy_frames]:
        scapy_check(frame, pkt, q)
    return [f for _, f in good]


def zlib_icrc_ok(frame):
    """PROTOCOL.md §2 check, written out with zlib (independent of roce_hw.model.icrc)."""
    l3 = bytearray(frame[14:])
    end = 20 + struct.unpack_from("!H", l3, 24)[0]
    crc_wire = bytes(l3[end - 4:end])
    l3 = l3[:end - 4]
    l3[1] = 0xFF
    l3[8] = 0xFF
    l3[10:12] = b"\xff\xff"
    l3[26:28] = b"\xff\xff"
    l3[32] = 0xFF
    return struct.pack("<I", zlib.crc32(b"\xff" * 8 + bytes(l3)) & 0xFFFFFFFF) == crc_wire


def scapy_check(frame, pkt_spec, q):
    """Parse ``frame`` with scapy (Ether/IP/UDP/BTH) and check the fields against the spec."""
    from scapy.contrib.roce import BTH
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    p = Ether(frame)
    ip_raw = bytes(p[IP])[:20]
    assert sum(struct.unpack("!10H", ip_raw)) % 0xFFFF == 0, "IPv4 header checksum"
    assert p[IP].flags == "DF" and p[IP].proto == 17
    assert p[UDP].dport == 4791 and p[UDP].sport == q.udp_sport and p[UDP].chksum == 0
    bth = p[BTH]
    assert bth.opcode == int(pkt_spec.opcode) and bth.psn == pkt_spec.psn
    assert bth.dqpn == q.remote_qpn and bth.ackreq == int(pkt_spec.ack_req)
    assert bth.solicited == int(pkt_spec.se) and bth.padcount == pkt_spec.pad
    rest = bytes(bth.payload)
    if pkt_spec.reth is not None:
        va, rkey, dlen = struct.unpack_from("!QII", rest)
        assert (va, rkey, dlen) == (pkt_spec.reth["va"], pkt_spec.reth["r_key"],
                                    pkt_spec.reth["dma_length"])


def make_qps(rng, n, pmtus=(256, 512, 1024, 2048, 4096)):
    qps = []
    for k in range(n):
        qps.append(QP(index=k, remote_qpn=rng.randrange(1 << 24),
                      remote_mac=rng.randrange(1 << 48) & ~(1 << 40),
                      remote_ip=rng.randrange(1 << 32), udp_sport=rng.randrange(0xC000, 1 << 16),
                      start_psn=rng.choice([0, rng.randrange(1 << 24), (1 << 24) - 2]),
                      pmtu=pmtus[k % len(pmtus)], dscp=rng.randrange(64), ecn=rng.randrange(4),
                      p_key=rng.choice([0xFFFF, rng.randrange(1 << 16)]),
                      migreq=rng.randrange(2)))
    return qps


def make_wrs(rng, qps, count, *, max_len=None, errors=False):
    wrs = []
    for k in range(count):
        q = rng.choice(qps)
        top = 3 * q.pmtu + 17 if max_len is None else max_len
        length = rng.choice([0, rng.randrange(1, 5), rng.randrange(top + 1),
                             rng.randrange(top + 1), q.pmtu, 2 * q.pmtu])
        payload = rng.randbytes(length)
        declared = length
        if errors and length > 0 and rng.random() < 0.15:
            declared = max(1, length + rng.choice([-length + 1, -1, 1, 5, q.pmtu]))
            if declared == length:
                declared += 1
        wrs.append(WR(wr_id=rng.randrange(1 << 64), opcode=rng.choice(OPS), qp=q.index,
                      payload=payload, length=declared, remote_addr=rng.randrange(1 << 64),
                      r_key=rng.randrange(1 << 32), imm=rng.randrange(1 << 32),
                      solicited=bool(rng.randrange(2))))
    return wrs


def _random_run(width, seed, *, count=40, errors=True, idle=True, backend="amaranth"):
    """Random WRs on 5 QPs of every PMTU (lengths 0 to 3 PMTU + 17; with ``errors``, length
    mismatches and WRs for a QP not in RTS and for an unused row), random idle and stalls on
    every stream with ``idle``: the frames equal the requester model's, byte for byte.

    On ``backend="verilator"`` the whole engine runs in its default configuration
    (``ack_req_every`` 64, the seed's ``ip_id_start`` loaded at run time through ``ip_id_load``);
    on Amaranth ``TxEngine`` with the seed's ``ack_req_every`` (1, 3 or 64) and ``ip_id_start``.
    The WRs are the same for a seed either way."""
    rng = random.Random(seed)
    ack_req_every, ip_id = rng.choice([1, 3, 64]), rng.randrange(1 << 16)
    if backend == "verilator":
        config = VERILATOR_CONFIGS[width]
    else:
        config = EngineConfig(data_width=width, n_qp=16, ack_req_every=ack_req_every,
                              ip_id_start=ip_id)
    qps = make_qps(rng, 5)
    wrs = make_wrs(rng, qps, count, errors=errors)
    if errors:
        # a WR for a QP that is set up but not in RTS, and one for an unused row
        qps.append(QP(index=7, remote_qpn=1, remote_mac=2, remote_ip=3, udp_sport=4,
                      start_psn=5, pmtu=1024, state=proto.QPState.RTR))
        for qp in (7, 9):
            wrs.insert(rng.randrange(len(wrs)), WR(wr_id=rng.randrange(1 << 64), opcode=WO.SEND,
                                                   qp=qp, payload=b"xyz" * qp, length=3 * qp))
    p = 0.3 if idle else 0.0
    if backend == "verilator":
        res = simulate_verilator(config, qps, wrs, seed=seed, p_wr_idle=p, p_in_idle=p,
                                 p_stall=p, p_status_stall=p, ip_id_load=ip_id)
        return check(config, qps, wrs, res, ip_id_start=ip_id)
    res = simulate(config, qps, wrs, seed=seed, p_wr_idle=p, p_in_idle=p, p_stall=p,
                   p_status_stall=p)
    return check(config, qps, wrs, res)


@pytest.mark.slow
@pytest.mark.parametrize("width", [64, 512])
def test_random_wrs_match_golden_model(width):
    """TxEngine alone, ``ack_req_every`` 1 (both seeds); the default suite runs
    :func:`test_random_wrs_verilator` instead."""
    _random_run(width, seed=100 + width)


@pytest.mark.tools("verilator")
@pytest.mark.parametrize("width", [64, 512])
@pytest.mark.parametrize("seed, count, idle, errors", [(100, 40, True, True),
                                                       (1, 120, True, False),
                                                       (2, 60, False, True)])
def test_random_wrs_verilator(width, seed, count, idle, errors):
    """The random WR runs on the whole engine compiled by Verilator: the seeds of
    :func:`test_random_wrs_match_golden_model`, a longer run without refusals and one without
    random idle/stalls."""
    _random_run(width, seed=seed + width, count=count, idle=idle, errors=errors,
                backend="verilator")


@pytest.mark.slow
@pytest.mark.parametrize("width", [128, 256, 1024])
def test_random_wrs_match_golden_model_other_widths(width):
    _random_run(width, seed=200 + width)


@pytest.mark.slow
@pytest.mark.parametrize("width", [64, 128, 256, 512, 1024])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_wrs_more_seeds(width, seed):
    _random_run(width, seed=1000 * seed + width, count=60)


@pytest.mark.slow
@pytest.mark.parametrize("width", [64, 1024])
def test_random_wrs_without_idle(width):
    _random_run(width, seed=7 + width, count=60, idle=False)


def _directed(width, *, p=0.0, status_stall=0.0):
    config = EngineConfig(data_width=width, n_qp=12, ip_id_start=0xFFFE)
    qps = [QP(0, 0x11, 0x0200000000AA, 0x0A000002, 0xC001, (1 << 24) - 2, 256),
           QP(1, 0x12, 0x0200000000BB, 0x0A000003, 0xC002, 100, 1024,
              state=proto.QPState.RTR),
           QP(2, 0x13, 0x0200000000CC, 0x0A000004, 0xC003, 500, 256)]
    rng = random.Random(width)
    pl = rng.randbytes
    wrs = [
        WR(1, WO.SEND, 1, pl(10), 10),                        # QP not in RTS
        WR(2, WO.RDMA_WRITE, 13, pl(5), 5),                   # QP index >= n_qp
        WR(3, WO.RDMA_READ, 0, pl(8), 8),                     # unsupported opcode
        WR(4, WO.RDMA_WRITE, 0, pl(100), 600),                # short, in the first packet
        WR(5, WO.RDMA_WRITE, 0, pl(300), 300, 0x1000, 0x55),  # PSN 2**24-2, 2**24-1
        WR(6, WO.SEND, 0, pl(120), 100),                      # long, in the first packet
        WR(7, WO.SEND_WITH_IMM, 0, pl(10), 10, imm=0xDEADBEEF, solicited=True),  # PSN 0
        WR(8, WO.RDMA_WRITE, 2, pl(600), 700),                # short, in packet 2 -> ERROR
        WR(9, WO.SEND, 2, pl(4), 4),                          # QP 2 now in ERROR
        WR(10, WO.RDMA_WRITE, 0, pl(10), (1 << 31) + 1),      # length > 2**31
        WR(11, WO.RDMA_WRITE_WITH_IMM, 0, b"", 0, 0x2000, 0x66, 0x1234),  # PSN 1
        WR(12, WO.SEND, 0, pl(256 + 128), 256),               # long by whole beats
        WR(13, WO.SEND, 0, pl(230), 200),                     # long (in the last beat at 512)
        WR(14, WO.SEND, 0, pl(5), 5),                         # PSN 2
    ]
    res = simulate(config, qps, wrs, seed=width, p_wr_idle=p, p_in_idle=p, p_stall=p,
                   p_status_stall=status_stall)
    frames = check(config, qps, wrs, res)
    return config, res, frames


@pytest.mark.parametrize("width", [64, 512])
def test_refused_wrs_send_nothing_and_next_wr_unaffected(width):
    config, res, frames = _directed(width)
    # explicit expectations, independent of the reference function
    assert [s["wr_id"] for s in res["statuses"]] == [1, 2, 3, 4, 6, 8, 9, 10, 12, 13]
    assert [s["status"] for s in res["statuses"]] == [2, 2, 2, 1, 1, 1, 2, 1, 1, 1]
    assert sum(1 for f in res["frames"] if f[1]) == 5       # WRs 4, 6, 8, 12, 13
    got = [(parse_frame(f).bth["dest_qp"], parse_frame(f).psn, parse_frame(f).opcode)
           for f in frames]
    assert got == [(0x11, (1 << 24) - 2, proto.Opcode.RC_RDMA_WRITE_FIRST),
                   (0x11, (1 << 24) - 1, proto.Opcode.RC_RDMA_WRITE_LAST),
                   (0x11, 0, proto.Opcode.RC_SEND_ONLY_WITH_IMMEDIATE),
                   (0x13, 500, proto.Opcode.RC_RDMA_WRITE_FIRST),
                   (0x13, 501, proto.Opcode.RC_RDMA_WRITE_MIDDLE),
                   (0x11, 1, proto.Opcode.RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE),
                   (0x11, 2, proto.Opcode.RC_SEND_ONLY)]
    # IP IDs count every frame put on the bus, aborted ones included, from 0xFFFE
    ids = [int.from_bytes(f[18:20], "big") for f, _, _, _ in res["frames"]]
    assert ids == [(0xFFFE + k) & 0xFFFF for k in range(len(ids))]


def test_refusals_under_random_stalls():
    _directed(64, p=0.4, status_stall=0.5)


def test_unread_status_never_hangs_the_engine():
    config, res, frames = _directed(512, status_stall=1.0)
    assert res["statuses"] == []
    assert res["dropped"] == 10 - 4          # a 4-entry FIFO, the rest dropped and counted
    assert len(frames) == 7


def _stream(width, length, count, pmtu, opcode=WO.RDMA_WRITE, backend="amaranth"):
    rng = random.Random(length)
    config = EngineConfig(data_width=width)
    qps = make_qps(rng, 1, pmtus=(pmtu,))
    wrs = [WR(k, opcode, 0, rng.randbytes(length), length, 0x10000 * k, 9)
           for k in range(count)]
    if backend == "verilator":
        res = simulate_verilator(config, qps, wrs, seed=1)
    else:
        res = simulate(config, qps, wrs, seed=1)
    check(config, qps, wrs, res, scapy_frames=3)
    return res


def _no_idle_cycle(res):
    """Frames (:class:`sim.backend.TxFrame`, ``tx`` ready every cycle) with a beat in every
    cycle from the first beat of the first to the last beat of the last."""
    tx = res["tx"]
    assert tx and all(f.last - f.first + 1 == f.beats for f in tx), \
        [(f.first, f.last, f.beats) for f in tx if f.last - f.first + 1 != f.beats][:3]
    gaps = [(k, a.last, b.first) for k, (a, b) in enumerate(zip(tx, tx[1:]))
            if b.first != a.last + 1]
    assert not gaps, f"idle cycles between frames (frame, last beat, next first beat): {gaps[:5]}"
    assert sum(f.beats for f in tx) == tx[-1].last - tx[0].first + 1


@pytest.mark.parametrize("width, length, count, pmtu", [
    (64, 64, 40, 1024), pytest.param(512, 64, 120, 1024, marks=pytest.mark.slow),
    pytest.param(64, 8192, 2, 4096, marks=pytest.mark.slow),
    pytest.param(512, 65536, 2, 4096, marks=pytest.mark.slow)])
def test_back_to_back_frames_at_line_rate(width, length, count, pmtu):
    """o always ready, inputs always valid: a beat in every cycle from the first to the last
    (no idle cycle between frames or between header and payload). TxEngine alone in Amaranth's
    simulator; the default suite runs the long cases on the whole engine compiled by Verilator
    (:func:`test_back_to_back_verilator`), these with --slow."""
    res = _stream(width, length, count, pmtu)
    bc = res["beat_cycles"]
    assert bc[-1] - bc[0] + 1 == len(bc)


@pytest.mark.tools("verilator")
@pytest.mark.parametrize("width, length, count, pmtu", [
    (64, 64, 40, 1024), (512, 64, 120, 1024), (64, 8192, 2, 4096), (512, 65536, 2, 4096),
    (64, 65536, 3, 256), (512, 65536, 8, 1024)])
def test_back_to_back_verilator(width, length, count, pmtu):
    """The same on the whole engine compiled by Verilator (WRs through its WR mux): ``tx``
    always ready, ``wr`` and ``payload`` always valid, a beat in every cycle from the first
    frame's first beat to the last frame's last; every frame the requester model's."""
    _no_idle_cycle(_stream(width, length, count, pmtu, backend="verilator"))


@pytest.mark.slow
@pytest.mark.parametrize("width", [64, 128, 256, 512, 1024])
@pytest.mark.parametrize("length, count", [(64, 100), (65536, 2)])
def test_back_to_back_all_widths(width, length, count):
    res = _stream(width, length, count, 4096)
    bc = res["beat_cycles"]
    assert bc[-1] - bc[0] + 1 == len(bc)


@pytest.mark.parametrize("width", [64, 512, 1024])
def test_latency_wr_to_first_byte_is_documented(width):
    """WR accepted (engine idle, payload valid) -> first beat out in exactly the documented
    ``TxEngine.latency`` cycles for a SEND (the shortest header: at 512 and 1024 bits its first
    beat holds payload, which the cutter passes in its command's cycle), at most that for a
    WRITE."""
    dut = TxEngine(EngineConfig(data_width=width))
    res = _stream(width, 64, 1, 1024, opcode=WO.SEND)
    assert res["beat_cycles"][0] - res["wr_cycles"][0] == dut.latency
    res = _stream(width, 64, 1, 1024)
    assert res["beat_cycles"][0] - res["wr_cycles"][0] <= dut.latency


@pytest.mark.parametrize("capture, opcode, wr_opcode", [
    ("rdma_write_bw.pcap", proto.Opcode.RC_RDMA_WRITE_FIRST, WO.RDMA_WRITE),
    ("rdma_send_bw.pcap", proto.Opcode.RC_SEND_FIRST, WO.SEND)])
@pytest.mark.parametrize("width", [64, 512])
def test_reproduces_captured_message(golden_dir, capture, opcode, wr_opcode, width):
    """A 3000-byte message set up with the fields of a real rxe capture comes out as the three
    captured frames, byte for byte (iCRC included)."""
    from sim.pcap import read_capture
    frames = [p.data for p in read_capture(golden_dir / capture)
              if len(p.data) > 54 and p.data[12:14] == b"\x08\x00" and p.data[23] == 17]
    start = next(k for k, f in enumerate(frames) if f[42] == opcode)
    want = frames[start:start + 3]
    f0 = want[0]
    udp_sport = struct.unpack_from("!H", f0, 34)[0]
    psn = int.from_bytes(f0[51:54], "big")
    qp = QP(0, int.from_bytes(f0[47:50], "big"), int.from_bytes(f0[0:6], "big"),
            int.from_bytes(f0[30:34], "big"), udp_sport, psn, 1024,
            dscp=f0[15] >> 2, ecn=f0[15] & 3)
    # payload = the bytes between the headers and the pad/iCRC of each frame
    hdr = [70 if wr_opcode == WO.RDMA_WRITE else 54, 54, 54]
    payload = b"".join(f[h:14 + struct.unpack_from("!H", f, 16)[0] - 4 - (f[43] >> 4 & 3)]
                       for f, h in zip(want, hdr))
    assert len(payload) == 3000
    va, rkey = struct.unpack_from("!QI", f0, 54) if wr_opcode == WO.RDMA_WRITE else (0, 0)
    config = EngineConfig(data_width=width, ttl=f0[22],
                          ip_id_start=int.from_bytes(f0[18:20], "big"))
    wrs = [WR(1, wr_opcode, 0, payload, 3000, va, rkey)]
    res = simulate(config, [qp], wrs, local_mac=int.from_bytes(f0[6:12], "big"),
                   local_ip=int.from_bytes(f0[26:30], "big"))
    assert [f for f, _, _, _ in res["frames"]] == want


@pytest.mark.parametrize("width", [64, 1024])
def test_qp_set_up_again_after_error(width):
    """A mid-message length mismatch moves the QP to ERROR (later WRs refused); rewriting the
    QP through the management port makes it usable again with its new PSN (the engine's
    forwarded write-backs for that QP are dropped)."""
    config = EngineConfig(data_width=width)
    q = QP(3, 0x77, 0x02000000000F, 0x0A000009, 0xC009, 1000, 256)
    again = QP(3, 0x78, 0x020000000010, 0x0A00000A, 0xC00A, 5000, 512)
    rng = random.Random(width)
    wrs = [WR(1, WO.SEND, 3, rng.randbytes(300), 600),        # aborted in packet 1 -> ERROR
           WR(2, WO.SEND, 3, rng.randbytes(8), 8),            # refused
           WR(3, WO.RDMA_WRITE, 3, rng.randbytes(700), 700),  # after the rewrite: PSN 5000..
           WR(4, WO.SEND, 3, rng.randbytes(9), 9)]
    res = simulate(config, [q], wrs, reconfig={1: again})
    frames = check(config, [q], wrs, res, reconfig={1: again})
    assert [parse_frame(f).psn for f in frames] == [1000, 5000, 5001, 5002]
    assert [s["wr_id"] for s in res["statuses"]] == [1, 2]


@pytest.mark.parametrize("width", [64, 512])
def test_huge_messages_are_given_up_at_once(width):
    """A 2**31-byte WR whose payload is short, and a 2**31-byte WR for a QP in ERROR: the rest
    of such a message (8 million packet descriptors at PMTU 256) is dropped at once, not
    walked through; the next WRs go out right after.

    The hardware is given the 2**31-byte lengths. The requester model is given WR 1 with a
    declared length of 3 PMTUs instead: with 2**31 it builds and walks all 8 million packets
    only to drop them (over 100 s and 6 GB a width). Both are long mismatches whose payload
    ends in packet 0, for which the model's answer (packet 0 aborted, nothing sent, LOC_LEN_ERR,
    the QP left in RTS at the same next PSN) does not depend on how long the declared length
    is: checked here up to 2**20 bytes (4096 packets)."""
    config = EngineConfig(data_width=width)
    q0 = QP(0, 0x21, 0x020000000021, 0x0A000021, 0xC021, 7, 256)
    q1 = QP(1, 0x22, 0x020000000022, 0x0A000022, 0xC022, 9, 256)
    rng = random.Random(width)
    wrs = [WR(1, WO.RDMA_WRITE, 0, rng.randbytes(100), 1 << 31),     # short in packet 0
           WR(2, WO.SEND, 0, rng.randbytes(20), 20),                 # PSN 7
           WR(3, WO.SEND, 1, rng.randbytes(300), 400),               # short in packet 1: ERROR
           WR(4, WO.RDMA_WRITE_WITH_IMM, 1, rng.randbytes(1), 1 << 31),  # refused (ERROR)
           WR(5, WO.SEND, 0, rng.randbytes(30), 30)]                 # PSN 8
    res = simulate(config, [q0, q1], wrs, max_cycles=3000)

    def stand_in(length):
        return [replace(wrs[0], length=length), *wrs[1:]]
    model_wrs = stand_in(3 * q0.pmtu)
    assert expected(config, [q0, q1], model_wrs) == \
        expected(config, [q0, q1], stand_in(1 << 20))
    frames = check(config, [q0, q1], model_wrs, res)
    assert [(parse_frame(f).dest_qp, parse_frame(f).psn) for f in frames] == \
        [(0x21, 7), (0x22, 9), (0x21, 8)]
    assert [(s["wr_id"], s["status"]) for s in res["statuses"]] == [(1, 1), (3, 1), (4, 2)]


@pytest.mark.parametrize("width", [pytest.param(64, marks=pytest.mark.slow), 1024])
def test_write_backs_wait_for_management_writes(width):
    """Back-to-back small messages on few QPs while management writes to another row keep
    taking the table's write port: PSNs stay right (write-backs queue, forwarding covers).
    TxEngine alone; 64 bits runs on Verilator by default (:func:`test_write_backs_verilator`)."""
    rng = random.Random(width + 5)
    config = EngineConfig(data_width=width)
    qps = make_qps(rng, 2)
    wrs = make_wrs(rng, qps, 60, max_len=300, errors=True)
    res = simulate(config, qps, wrs, seed=width, mgmt_noise=15)
    check(config, qps, wrs, res)


@pytest.mark.tools("verilator")
@pytest.mark.parametrize("width, count", [(64, 60), (512, 60), (64, 400)])
def test_write_backs_verilator(width, count):
    """The same on the whole engine compiled by Verilator: management writes to row 15, one
    after the other (every other cycle), while the WRs go in; the frames equal the requester
    model's, and the writes really were made while the frames went out."""
    rng = random.Random(width + 5 + (count != 60))
    config = VERILATOR_CONFIGS[width]
    qps = make_qps(rng, 2)
    wrs = make_wrs(rng, qps, count, max_len=300, errors=True)
    res = simulate_verilator(config, qps, wrs, seed=width, mgmt_noise=15)
    check(config, qps, wrs, res)
    tx = res["tx"]
    during = [r for r in res["mgmt"] if r["qp"] == 15 and tx[0].first <= r["cycle"] <= tx[-1].last]
    span = tx[-1].last - tx[0].first
    assert len(during) > span // 4, (len(during), span)


def test_1024_qps():
    """The same datapath with a 1024-QP table (indices spread over the table)."""
    rng = random.Random(11)
    config = EngineConfig(data_width=128, n_qp=1024)
    qps = make_qps(rng, 4)
    for q, index in zip(qps, (0, 517, 1000, 1023)):
        q.index = index
    wrs = make_wrs(rng, qps, 16, max_len=700, errors=True)
    res = simulate(config, qps, wrs, seed=11, p_wr_idle=0.2, p_in_idle=0.2, p_stall=0.2)
    check(config, qps, wrs, res)


def test_ip_id_load():
    rng = random.Random(5)
    config = EngineConfig(data_width=128, ip_id_start=77)
    qps = make_qps(rng, 2)
    wrs = make_wrs(rng, qps, 6)
    res = simulate(config, qps, wrs, ip_id_load=0xFFFF)
    frames = check(config, qps, wrs, res, ip_id_start=0xFFFF)
    assert [int.from_bytes(f[18:20], "big") for f in frames[:2]] == [0xFFFF, 0]


@pytest.mark.parametrize("width", [64, 512])
def test_verilog_lint_clean(width):
    config = EngineConfig(data_width=width, n_qp=12)
    lint(emit(TxEngine(config), "tx_engine"), "tx_engine")


def test_bad_config_raises():
    with pytest.raises(TypeError):
        TxEngine(512)
    with pytest.raises(ValueError, match="ttl"):
        EngineConfig(ttl=0)
    with pytest.raises(ValueError, match="ip_id_start"):
        EngineConfig(ip_id_start=1 << 16)
    for bad in (0, 999_999, 1_000_000_001, 156.25e6, True, "156250000"):
        with pytest.raises(ValueError, match="clock_hz"):
            EngineConfig(clock_hz=bad)


def test_timer_clock_defaults_to_the_widths_mac():
    """The timers' clock: the declared one, else the width's usual MAC clock."""
    assert EngineConfig(data_width=64).timer_clock_hz == 156_250_000
    assert EngineConfig(data_width=512).timer_clock_hz == 322_265_625
    assert EngineConfig(data_width=64, clock_hz=62_500_000).timer_clock_hz == 62_500_000


def _resume_run(width, seed, count=12):
    """Random messages resumed at random packets (go-back-N restarts, PROTOCOL.md §5.10), mixed
    with ordinary WRs on the same QPs: the engine's frames equal the model's
    ``segment_message(..., start_packet=j)`` (MIDDLE/LAST, no RETH, the given PSNs, the payload
    from byte j * PMTU); a resume neither uses nor moves the QP's next PSN."""
    rng = random.Random(seed)
    config = EngineConfig(data_width=width, ack_req_every=rng.choice([1, 2, 64]))
    # two QPs of two different random PMTUs (not the smallest two every time)
    qps = make_qps(rng, 2, pmtus=tuple(rng.sample([256, 512, 1024, 2048, 4096], 2)))
    for q in qps:
        q.start_psn = rng.choice([0xFFFFFE, rng.randrange(1 << 24)])
    items, want = [], []
    psn = {q.index: q.start_psn for q in qps}
    seen = set()           # what the resumes covered: ("middle", "last", "first")
    resumed = []           # (first frame, frames, start packet, PMTU, start PSN, message)
    for k in range(count):
        q = rng.choice(qps)
        op = rng.choice(OPS)
        resume = rng.randrange(3) != 0
        if resume:
            # mostly messages of several packets, resumed past the first one (MIDDLE and LAST
            # packets, no RETH); sometimes from packet 0 or in a one-packet message
            n = rng.choice([rng.randrange(2 * q.pmtu + 1, 4 * q.pmtu + 6),
                            rng.randrange(q.pmtu + 1, 2 * q.pmtu + 1),
                            rng.choice([0, 1, q.pmtu - 1, q.pmtu])])
        else:
            n = rng.choice([0, 1, q.pmtu - 1, q.pmtu, q.pmtu + 1, rng.randrange(3 * q.pmtu + 6)])
        body = rng.randbytes(n)
        common = dict(wr_id=rng.randrange(1 << 64), opcode=op, qp=q.index, payload=body,
                      length=n, remote_addr=rng.randrange(1 << 64), r_key=rng.randrange(1 << 32),
                      imm=rng.randrange(1 << 32), solicited=bool(rng.randrange(2)))
        kw = dict(pmtu=q.pmtu, remote_addr=common["remote_addr"], r_key=common["r_key"],
                  imm=common["imm"], solicited=common["solicited"],
                  ack_req_every=config.ack_req_every)
        if resume:
            npk = max(1, -(-n // q.pmtu))
            j = rng.randrange(1, npk) if npk > 1 and rng.randrange(4) else rng.randrange(npk)
            seen |= {"first" if j == 0 else "middle" if j < npk - 1 else "last"}
            # (start PSNs ending in 0xFFF too: the PSN counter's carry into its upper chunk
            # then comes from the look-ahead flag loaded with the start PSN)
            start = rng.choice([rng.randrange(1 << 24), 0xABCFFF, 0xFFFFFF])
            items.append(Resume(**common, start_packet=j, start_psn=start,
                                sent=body[j * q.pmtu:]))
            pkts = segment_message(op, body, start_psn=start, start_packet=j, **kw)
            resumed.append((len(want), len(pkts), j, q.pmtu, start, body))
        else:
            items.append(WR(**common))
            pkts = segment_message(op, body, start_psn=psn[q.index], **kw)
            psn[q.index] = (pkts[-1].psn + 1) & proto.PSN_MASK
        want += [(q, p) for p in pkts]
    # (the stimulus covers what the test claims, whatever the seed: a resume that starts at a
    # MIDDLE packet, one at the LAST, one at packet 0)
    assert seen == {"first", "middle", "last"}, seen
    res = simulate(config, qps, items, seed=seed, p_wr_idle=0.2, p_in_idle=0.2, p_stall=0.2)
    frames = [f for f, ab, _, _ in res["frames"]]
    assert not any(ab for _, ab, _, _ in res["frames"])
    assert res["statuses"] == []
    assert len(frames) == len(want)
    for k, (frame, (q, pkt)) in enumerate(zip(frames, want)):
        exp = build_request_frame(q.path(config.ttl), pkt, ip_id=(config.ip_id_start + k) & 0xFFFF)
        assert frame == exp, (f"frame {k}: psn {pkt.psn} opcode {pkt.opcode!r}\n"
                              f" got {frame.hex()}\nwant {exp.hex()}")
    # the requester model (the one the other engine tests use) agrees, frame for frame
    check(config, qps, items, res)
    # and, independently of both models, scapy's parse of every resumed message: PSNs from the
    # start PSN, opcodes MIDDLE/LAST past packet 0 (RC_*_FIRST/ONLY only at packet 0), the
    # message's bytes from j * PMTU on
    from scapy.contrib.roce import BTH
    from scapy.layers.l2 import Ether
    for first, count_, j, pmtu, start, body in resumed:
        got = b""
        for i, frame in enumerate(frames[first:first + count_]):
            bth = Ether(frame)[BTH]
            name = bth.sprintf("%BTH.opcode%")
            assert bth.psn == (start + i) & proto.PSN_MASK
            last = i == count_ - 1
            want_kind = ("ONLY" if last else "FIRST") if j + i == 0 else \
                ("LAST" if last else "MIDDLE")
            assert name.startswith("RC_") and want_kind in name, (j, i, name)
            rest = bytes(bth.payload)              # (scapy keeps the iCRC as a field)
            if "WRITE" in name and ("FIRST" in name or "ONLY" in name):
                rest = rest[16:]                                      # RETH
            if "IMMEDIATE" in name:
                rest = rest[4:]
            got += rest[:len(rest) - bth.padcount]
        assert got == body[j * pmtu:]


@pytest.mark.parametrize("width", [64, 512])
def test_resume_matches_model(width):
    _resume_run(width, seed=700 + width)


@pytest.mark.slow
@pytest.mark.parametrize("width", [128, 256, 1024])
@pytest.mark.parametrize("seed", [1, 2])
def test_resume_matches_model_other_widths(width, seed):
    _resume_run(width, seed=seed * 1000 + width, count=20)


def test_resume_outside_the_message_is_refused():
    """A resume whose start packet is past the message's end is refused (LOC_QP_OP_ERR),
    sends nothing, and the next request is unaffected."""
    rng = random.Random(5)
    config = EngineConfig(data_width=64)
    qps = make_qps(rng, 1, pmtus=(256,))
    q = qps[0]
    body = rng.randbytes(600)                       # 3 packets at PMTU 256
    bad = Resume(wr_id=77, opcode=WO.SEND, qp=q.index, payload=body, length=600,
                 start_packet=3, start_psn=5, sent=b"")
    good = WR(wr_id=78, opcode=WO.SEND, qp=q.index, payload=body, length=600)
    res = simulate(config, qps, [bad, good], seed=1)
    assert res["statuses"] == [{"wr_id": 77, "qp": q.index, "status": WcStatus.LOC_QP_OP_ERR}]
    pkts = segment_message(WO.SEND, body, pmtu=256, start_psn=q.start_psn)
    assert [f for f, _, _, _ in res["frames"]] == [
        build_request_frame(q.path(), p, ip_id=k) for k, p in enumerate(pkts)]
