# SPDX-License-Identifier: BSD-2-Clause
"""The whole engine (RoceEngine) in simulation: ARP, the CM over the RX path, the generator's
traffic, re-open with a new PSN, other traffic passed through -- every frame against the CM
model, the requester model and scapy."""

import random
import struct

import pytest

from roce_hw import proto
from roce_hw.config import EngineConfig
from roce_hw.engine import RoceEngine
from roce_hw.model.cm import CmModel, generator_messages, reply_frame, request_frame
from roce_hw.model.packet import build_request_frame
from roce_hw.model.requester import RequesterModel
from sim.bfm import mgmt_write
from sim.harness import run_simulation
from sim.stream import recv_packet, send_packet, stream_put

LOCAL_MAC = 0x02_00_00_00_00_01
LOCAL_IP = 0x0A_00_00_01
HOST_MAC = 0x02_00_00_00_00_02
HOST_IP = 0x0A_00_00_02
BROADCAST = (1 << 48) - 1
WO = proto.WrOpcode


def arp_request(target_ip, *, sender_mac=HOST_MAC, sender_ip=HOST_IP, dst=BROADCAST):
    eth = proto.ETH.pack({"dst": dst, "src": sender_mac, "ethertype": proto.ETHERTYPE_ARP})
    arp = proto.ARP.pack({"oper": proto.ArpOper.REQUEST, "sha": sender_mac, "spa": sender_ip,
                          "tha": 0, "tpa": target_ip})
    return eth + arp + bytes(18)


def ref_dgram(req, *, loc_qpn=0x11, loc_psn=0, rem_qpn=0, rem_psn=0, r_key=0x234,
              base=0x1000_0000, tx=None):
    """A datagram packed exactly as the reference host script packs it."""
    flags = (0x1 | (req << 1)) if tx is None else 0
    tx_flags, length, count, period = tx or (0, 0, 0, 0)
    return struct.pack('>BLLLQLLLLQLHBLLL', flags, loc_qpn, loc_psn, r_key, base, HOST_IP,
                       rem_qpn, rem_psn, 0, 0, 0, proto.CM_REPLY_UDP_PORT, tx_flags, length,
                       count, period)


def cm_frame(dgram):
    return request_frame(dgram, src_mac=HOST_MAC, dst_mac=LOCAL_MAC, src_ip=HOST_IP,
                         dst_ip=LOCAL_IP)


def other_frames(rng):
    """Frames that are not for the engine: IPv6, another EtherType, UDP to another port, an ARP
    request for another IP, a frame for another MAC."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import Ether

    mac = lambda v: ":".join(f"{b:02x}" for b in v.to_bytes(6, "big"))
    ip = lambda v: ".".join(str(b) for b in v.to_bytes(4, "big"))
    pay = bytes(rng.getrandbits(8) for _ in range(rng.randrange(20, 300)))
    return [
        bytes(Ether(dst=mac(LOCAL_MAC), src=mac(HOST_MAC)) / IPv6() / UDP(dport=4791) / pay),
        bytes(Ether(dst=mac(LOCAL_MAC), src=mac(HOST_MAC), type=0x88B5) / pay),
        bytes(Ether(dst=mac(LOCAL_MAC), src=mac(HOST_MAC)) / IP(src=ip(HOST_IP), dst=ip(LOCAL_IP))
              / UDP(sport=1234, dport=5000) / pay),
        arp_request(0x0A_00_00_63),
        bytes(Ether(dst="02:00:00:00:00:77", src=mac(HOST_MAC)) / IP(src=ip(HOST_IP),
              dst=ip(LOCAL_IP)) / UDP(sport=1234, dport=4791) / pay),
    ]


def is_reply(frame):
    eth = proto.ETH.unpack(frame)
    if eth["ethertype"] == proto.ETHERTYPE_ARP:
        return True
    udp = proto.UDP.unpack(frame, proto.ETH.size + proto.IPV4.size)
    return udp["src_port"] == proto.CM_UDP_PORT


#: The only configurations the default suite builds with Verilator (each other one costs a 1-3
#: minute build in CI): the whole engine at 64 and 512 bits, 16 QPs, everything else default.
VERILATOR_CONFIGS = {w: EngineConfig(data_width=w, n_qp=16) for w in (64, 512)}


def _verilator(width, seed=0):
    """The whole engine (``roce_engine``) of :data:`VERILATOR_CONFIGS` on the Verilator back end
    (:mod:`sim.backend`), its addresses set. Use it in a ``with`` block: the engine must be
    closed when its test is done, also when the test fails (Verilator's thread context is left
    dangling when the newest of several live engines of one library is destroyed, and
    destroying another one afterwards hangs or crashes the process -- as an engine kept alive
    by the traceback of a failed test, which pytest keeps, would be later)."""
    from sim.backend import open_engine
    eng = open_engine(VERILATOR_CONFIGS[width], backend="verilator", seed=seed)
    eng.set_addr(LOCAL_MAC, LOCAL_IP)
    return eng


def _send(eng, frame, *, step=8):
    """Offer ``frame`` on ``s_axis_rx`` now and run until its last beat is in."""
    eng.push_rx(frame, cycle=eng.cycle)
    while eng.count("rx_pending"):
        eng.run(step)


def _bring_up_plan(cfg, rng):
    """The bring-up script (ARP, CM OPEN/MODIFY/start of a generator run, other traffic, stop,
    re-open with a new PSN, another run) and what the models say comes out: ``(script,
    want_replies, want_data, want_other)``."""
    cm = CmModel(cfg.n_qp, local_mac=LOCAL_MAC, local_ip=LOCAL_IP, cm_pmtu=cfg.cm_pmtu,
                 ttl=cfg.ttl)
    req = RequesterModel(n_qp=cfg.n_qp, ack_req_every=cfg.ack_req_every, ttl=cfg.ttl,
                         ip_id_start=cfg.ip_id_start, local_mac=LOCAL_MAC, local_ip=LOCAL_IP)
    want_replies, want_data = [], []

    def cm_request(dgram):
        reply = cm.handle(dgram, HOST_MAC, HOST_IP, proto.CM_REPLY_UDP_PORT)
        want_replies.append(reply_frame(reply, local_mac=LOCAL_MAC, local_ip=LOCAL_IP,
                                        ttl=cfg.ttl))
        if cm.gen_log and cm.gen_log[-1].get("start"):
            gen = cm.generator
            row = cm.rows[gen.qp]
            req.write_qp(gen.qp, row)
            for msg in generator_messages(gen):
                for s in req.post(qp=gen.qp, opcode=msg["opcode"], payload=msg["payload"],
                                  wr_id=msg["wr_id"], remote_addr=msg["remote_addr"],
                                  r_key=msg["r_key"], imm=msg["imm"] or 0):
                    want_data.append(s.frame)
            # the engine's next PSN moves on; the model follows the hardware
            row["next_psn"] = req.qps.rows[gen.qp]["next_psn"]
            cm.generator_done()
        cm.gen_log.clear()
        return cm_frame(dgram)

    others = other_frames(rng)
    psn1, psn2 = rng.getrandbits(24), rng.getrandbits(24)
    width = cfg.data_width
    script = [
        ("rx", arp_request(LOCAL_IP)),
        ("rx", cm_request(ref_dgram(1, loc_qpn=0x11, loc_psn=5))),
        ("rx", cm_request(ref_dgram(3, loc_qpn=0x11, loc_psn=5, rem_qpn=256, rem_psn=psn1))),
        # WRITE_WITH_IMM, 3 messages of 2500 bytes, back to back
        ("rx", cm_request(ref_dgram(0, loc_qpn=0x11, rem_qpn=256,
                                    tx=(0b1111, 2500, 3, 0)))),
        ("wait", 8000 // (width // 64)),
        *[("rx", f) for f in others],
        ("rx", cm_request(ref_dgram(4, loc_qpn=0x11, rem_qpn=256))),
        # re-open with a new PSN, SEND_WITH_IMM this time
        ("rx", cm_request(ref_dgram(1, loc_qpn=0x11, loc_psn=9, rem_psn=psn2))),
        ("rx", cm_request(ref_dgram(3, loc_qpn=0x11, loc_psn=9, rem_qpn=256, rem_psn=psn2))),
        ("rx", cm_request(ref_dgram(0, loc_qpn=0x11, rem_qpn=256, tx=(0b0111, 700, 2, 50)))),
    ]
    assert len(want_replies) == 7 and len(want_data) == 3 * 3 + 2 * 1, (want_replies, want_data)
    return script, want_replies, want_data, list(others)


def _check_bring_up(tx_frames, other_out, want_replies, want_data, want_other):
    replies = [f for f in tx_frames if is_reply(f)]
    data = [f for f in tx_frames if not is_reply(f)]
    arp = replies.pop(0)
    assert proto.ARP.unpack(arp, proto.ETH.size)["oper"] == proto.ArpOper.REPLY
    assert replies == want_replies
    assert data == want_data
    assert other_out == want_other


@pytest.mark.parametrize("width", [pytest.param(64, marks=pytest.mark.slow),
                                   pytest.param(512, marks=pytest.mark.slow),
                                   pytest.param(128, marks=pytest.mark.slow),
                                   pytest.param(256, marks=pytest.mark.slow),
                                   pytest.param(1024, marks=pytest.mark.slow)])
def test_engine_bring_up(width):
    """RoceEngine in Amaranth's simulator, 4 QPs (the default suite runs
    :func:`test_engine_bring_up_verilator`)."""
    rng = random.Random(width)
    cfg = EngineConfig(data_width=width, n_qp=4)
    dut = RoceEngine(cfg)
    script, want_replies, want_data, want_other = _bring_up_plan(cfg, rng)
    tx_frames, other_out = [], []
    n_tx = 1 + len(want_replies) + len(want_data)

    async def driver(ctx):
        ctx.set(dut.local_mac, LOCAL_MAC)
        ctx.set(dut.local_ip, LOCAL_IP)
        for kind, frame in script:
            if kind == "wait":
                for _ in range(frame):
                    await ctx.tick()
                continue
            await send_packet(ctx, dut.rx, frame, width, rng=rng, p_idle=0.1)
            for _ in range(rng.randrange(0, 40)):
                await ctx.tick()
            # let the CM answer before the next request (a host waits for the reply)
            for _ in range(400):
                await ctx.tick()

    async def tx_sink(ctx):
        while len(tx_frames) < n_tx:
            tx_frames.append(await recv_packet(ctx, dut.tx, width, rng=rng, p_stall=0.1))

    async def other_sink(ctx):
        while len(other_out) < len(want_other):
            other_out.append(await recv_packet(ctx, dut.rx_other, width, rng=rng, p_stall=0.3))

    run_simulation(dut, [driver, tx_sink, other_sink], cycles=60000)
    _check_bring_up(tx_frames, other_out, want_replies, want_data, want_other)


@pytest.mark.tools("verilator")
@pytest.mark.parametrize("width", [64, 512])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_engine_bring_up_verilator(width, seed):
    """The bring-up on the whole engine compiled by Verilator (16 QPs): random idle on ``rx``
    (0.1), stalls on ``tx`` (0.1) and ``rx_other`` (0.3); every frame on ``tx`` and
    ``rx_other`` the models', and nothing more (the run ends when ``tx`` is quiet)."""
    from sim.backend import framing_errors
    rng = random.Random(width + 1000 * seed)
    script, want_replies, want_data, want_other = _bring_up_plan(VERILATOR_CONFIGS[width], rng)
    with _verilator(width, seed=width + seed) as eng:
        eng.set_random(rx=0.1, tx=0.1, other=0.3)
        for kind, frame in script:
            if kind == "wait":
                eng.run(frame)
                continue
            _send(eng, frame)
            # let the CM answer before the next request (a host waits for the reply)
            eng.run(rng.randrange(0, 40) + 400)
        assert eng.run(60000, quiet=2000) < 60000, "tx not quiet"
        tx, other, c = eng.pop_tx(), eng.pop_rx_other(), eng.counters()
    for f in tx + other:
        assert not f.errors and not f.tuser, (f, framing_errors(f.errors))
    assert len(tx) == 1 + len(want_replies) + len(want_data)
    _check_bring_up([f.data for f in tx], [f.data for f in other], want_replies, want_data,
                    want_other)
    assert (c["rx_rx_frames"], c["rx_arp"], c["rx_cm"], c["cm_ok"]) == \
        (len(script) - 1, 1, len(want_replies), len(want_replies))
    assert c["rx_other"] == len(want_other) and c["tx_gen_sent"] == 3 + 2


def _full_rate_dgrams(count, length):
    """The CM set-up (OPEN, MODIFY) and the start of a run of ``count`` WRITEs of ``length``
    bytes, back to back: three datagrams."""
    return [ref_dgram(1, loc_qpn=0x11), ref_dgram(3, loc_qpn=0x11, rem_qpn=256, rem_psn=100),
            ref_dgram(0, loc_qpn=0x11, rem_qpn=256, tx=(0b1011, length, count, 0))]


@pytest.mark.slow
@pytest.mark.parametrize("width", [64, 512])
def test_other_traffic_at_full_tx_rate(width):
    """Other protocols arrive back to back while the generator sends at full rate: they leave
    on rx_other byte for byte, and the data frames on tx have no idle cycle between their beats
    nor between frames (the same utilisation as without RX traffic). RoceEngine in Amaranth's
    simulator, 2 QPs (the default suite runs
    :func:`test_other_traffic_at_full_tx_rate_verilator`)."""
    rng = random.Random(3 * width)
    cfg = EngineConfig(data_width=width, n_qp=2)
    dut = RoceEngine(cfg)
    nbytes = width // 8
    count, length = 6, 3000
    others = [f for _ in range(6) for f in other_frames(rng)]
    *setup, start = [cm_frame(d) for d in _full_rate_dgrams(count, length)]
    beats = []                          # (cycle, is a data beat, last)
    other_out = []
    now = [0]                           # the tx sink's cycle count
    window = []                         # cycles the other frames started / finished going in
    n_data_frames = count * -(-length // 1024)

    async def driver(ctx):
        ctx.set(dut.local_mac, LOCAL_MAC)
        ctx.set(dut.local_ip, LOCAL_IP)
        for f in setup:
            await send_packet(ctx, dut.rx, f, width)
            for _ in range(300):
                await ctx.tick()
        await send_packet(ctx, dut.rx, start, width)
        # until the run has begun (a first data frame is out), whatever the CM's latency
        while not any(data for _, data, _ in beats):
            await ctx.tick()
        window.append(now[0])
        for f in others:                # back to back, while the data goes out
            await send_packet(ctx, dut.rx, f, width)
        window.append(now[0])

    async def tx_sink(ctx):
        ctx.set(dut.tx.ready, 1)
        cycle, frame, data_frames = 0, bytearray(), 0
        while data_frames < n_data_frames:
            _, _, valid, p = await ctx.tick().sample(dut.tx.valid, dut.tx.payload)
            cycle += 1
            now[0] = cycle
            if not valid:
                continue
            frame += int(p.data).to_bytes(nbytes, "little")
            beats.append([cycle, None, bool(p.last)])
            if p.last:
                data = not is_reply(bytes(frame))
                for b in beats[::-1]:
                    if b[1] is not None:
                        break
                    b[1] = data
                data_frames += data
                frame = bytearray()

    async def other_sink(ctx):
        while len(other_out) < len(others):
            other_out.append(await recv_packet(ctx, dut.rx_other, width))

    run_simulation(dut, [driver, tx_sink, other_sink], cycles=40000)
    assert other_out == others
    data_cycles = [c for c, data, _ in beats if data]
    # the other frames really went in while the data went out
    assert data_cycles[0] < window[0] and window[1] < data_cycles[-1], (window, data_cycles[0])
    assert len(data_cycles) == data_cycles[-1] - data_cycles[0] + 1, \
        "idle cycles inside the data traffic"


@pytest.mark.tools("verilator")
@pytest.mark.parametrize("width", [64, 512])
@pytest.mark.parametrize("count, length", [(6, 3000), (12, 1500)])
def test_other_traffic_at_full_tx_rate_verilator(width, count, length):
    """The same on the whole engine compiled by Verilator (16 QPs): the other frames go in back
    to back from the cycle the first data frame is out; they leave on ``rx_other`` byte for
    byte, all of them before the last data beat; the data frames (the models' frames, byte for
    byte) follow each other with no idle cycle from the first beat of the first to the last beat
    of the last."""
    rng = random.Random(3 * width + count)
    others = [f for _ in range(6) for f in other_frames(rng)]
    *setup, start = [cm_frame(d) for d in _full_rate_dgrams(count, length)]
    cfg = VERILATOR_CONFIGS[width]
    cm = CmModel(cfg.n_qp, local_mac=LOCAL_MAC, local_ip=LOCAL_IP, cm_pmtu=cfg.cm_pmtu,
                 ttl=cfg.ttl)
    req = RequesterModel(n_qp=cfg.n_qp, ack_req_every=cfg.ack_req_every, ttl=cfg.ttl,
                         ip_id_start=cfg.ip_id_start, local_mac=LOCAL_MAC, local_ip=LOCAL_IP)
    want_replies = [reply_frame(cm.handle(d, HOST_MAC, HOST_IP, proto.CM_REPLY_UDP_PORT),
                                local_mac=LOCAL_MAC, local_ip=LOCAL_IP, ttl=cfg.ttl)
                    for d in _full_rate_dgrams(count, length)]
    gen = cm.generator
    assert gen is not None
    req.write_qp(gen.qp, cm.rows[gen.qp])
    want_data = [s.frame for msg in generator_messages(gen)
                 for s in req.post(qp=gen.qp, opcode=msg["opcode"], payload=msg["payload"],
                                   wr_id=msg["wr_id"], remote_addr=msg["remote_addr"],
                                   r_key=msg["r_key"], imm=msg["imm"] or 0)]
    assert len(want_data) == count * -(-length // 1024)

    with _verilator(width, seed=width) as eng:
        for f in setup:
            _send(eng, f)
            eng.run(300)
        _send(eng, start)
        # until the run has begun (a first data frame is out), whatever the CM's latency
        tx = []
        while not any(not is_reply(f.data) for f in tx):
            eng.run(5000, until_tx=1)
            assert eng.count("tx"), "no frame on tx in 5000 cycles"
            tx += eng.pop_tx()
        window = eng.cycle
        for f in others:                # back to back, while the data goes out
            eng.push_rx(f, cycle=window)
        assert eng.run(40000, quiet=500) < 40000, "tx not quiet"
        tx += eng.pop_tx()
        other = eng.pop_rx_other()
    assert [f.data for f in other] == others
    assert [f.data for f in tx if is_reply(f.data)] == want_replies
    data = [f for f in tx if not is_reply(f.data)]
    assert [f.data for f in data] == want_data
    assert not any(f.errors or f.tuser for f in tx + other)
    # the other frames really went in while the data went out (they even came out meanwhile)
    assert data[0].first < window and other[-1].last < data[-1].last, \
        (data[0].first, window, other[-1].last, data[-1].last)
    # no idle cycle inside the data traffic
    assert sum(f.beats for f in data) == data[-1].last - data[0].first + 1, \
        "idle cycles inside the data traffic"


# ------------------------------------------------------------------------------ resumes, WRs
# and the generator through the whole engine (issue 33, item 1.1: RoceEngine's resume port)

def _bth_dest_qp(frame):
    return proto.BTH.unpack(frame, proto.ETH.size + proto.IPV4.size + proto.UDP.size)["dest_qp"]


def run_requests(width, qps, items, *, txmeta=None, seed=0, p=0.0, cycles=None):
    """Run RoceEngine with the user's QPs ``qps`` (QPSetup, written on ``qp_mgmt_req``) and
    requests ``items`` (``("wr" | "resume", fields, whole message, bytes given on i)``, posted
    in order on ``wr``/``resume``, their payloads on ``i``), and, with ``txmeta`` = ``(tx_flags,
    length, count, period)``, a generator run started by a CM datagram (after a CM OPEN and
    MODIFY of QP 0, while the user's requests go in). Random idle on every input and
    backpressure on ``tx`` with probability ``p``.

    Every data frame is checked against the requester model (:class:`RequesterModel`: the
    user's requests in their order per QP, the generator's messages from the CM model): its
    QP's next expected packet, built with the IPv4 identification of its position on ``tx``.
    The frames of different QPs may interleave in any order (arbitration). Returns a dict with
    the data frames, the statuses, the counters and the model."""
    from sim.bfm import qp_context

    cfg = EngineConfig(data_width=width, n_qp=4)
    dut = RoceEngine(cfg)
    rng = random.Random(seed)
    rngs = [random.Random(rng.getrandbits(32)) for _ in range(4)]
    cm = CmModel(cfg.n_qp, local_mac=LOCAL_MAC, local_ip=LOCAL_IP, cm_pmtu=cfg.cm_pmtu,
                 ttl=cfg.ttl)
    model = RequesterModel(n_qp=cfg.n_qp, ack_req_every=cfg.ack_req_every, ttl=cfg.ttl,
                           ip_id_start=cfg.ip_id_start, local_mac=LOCAL_MAC,
                           local_ip=LOCAL_IP)
    want = {}                   # remote QPN -> [(QPPath, PacketSpec)], in order

    def post(qp, **kw):
        row = model.qps.rows[qp]
        for s in model.post(qp=qp, **kw):
            assert s.frame is not None
            want.setdefault(row["remote_qpn"], []).append((model.path(row), s.packet))

    for q in qps:
        assert q.index != 0, "QP 0 is the CM's"
        model.write_qp(q.index, qp_context(q))
    for kind, f, body, _ in items:
        extra = {"start_packet": f["start_packet"], "start_psn": f["start_psn"]} \
            if kind == "resume" else {}
        post(f["qp"], opcode=f["opcode"], payload=body, length=f["length"], wr_id=f["wr_id"],
             remote_addr=f["remote_addr"], r_key=f["r_key"], imm=f["imm"],
             solicited=bool(f["solicited"]), **extra)

    dgrams, want_replies = [], []
    if txmeta is not None:
        psn = rng.getrandbits(24)
        for d in (ref_dgram(1, loc_qpn=0x11, loc_psn=5),
                  ref_dgram(3, loc_qpn=0x11, loc_psn=5, rem_qpn=256, rem_psn=psn),
                  ref_dgram(0, loc_qpn=0x11, rem_qpn=256, tx=txmeta)):
            reply = cm.handle(d, HOST_MAC, HOST_IP, proto.CM_REPLY_UDP_PORT)
            want_replies.append(reply_frame(reply, local_mac=LOCAL_MAC, local_ip=LOCAL_IP,
                                            ttl=cfg.ttl))
            dgrams.append(cm_frame(d))
        gen = cm.generator
        assert gen is not None and gen.qp == 0
        model.write_qp(gen.qp, cm.rows[gen.qp])
        for msg in generator_messages(gen):
            post(gen.qp, opcode=msg["opcode"], payload=msg["payload"], wr_id=msg["wr_id"],
                 remote_addr=msg["remote_addr"], r_key=msg["r_key"], imm=msg["imm"] or 0)
    n_data = sum(len(v) for v in want.values())
    n_gen = sum(1 for _ in generator_messages(cm.generator)) if txmeta is not None else 0
    st = {"setup": False, "cm_up": txmeta is None}
    res = {"tx": [], "statuses": []}
    if cycles is None:
        total = sum(len(body) for _, _, body, _ in items) + (txmeta[1] * txmeta[2]
                                                            if txmeta else 0)
        cycles = 3000 + 3000 * bool(txmeta) + (8 if p else 2) * (total // (width // 8)
                                                                 + 60 * (len(items) + n_gen))

    async def cm_host(ctx):
        ctx.set(dut.local_mac, LOCAL_MAC)
        ctx.set(dut.local_ip, LOCAL_IP)
        for k, frame in enumerate(dgrams):
            if k == 2:
                st["cm_up"] = True        # the user's requests start; the run starts soon
                await ctx.tick().repeat(rngs[0].randrange(1, 60))
            await send_packet(ctx, dut.rx, frame, width, rng=rngs[0], p_idle=p)
            if k < 2:
                await ctx.tick().repeat(400)      # a host waits for the reply

    async def user(ctx):
        for q in qps:
            await mgmt_write(ctx, dut, q.index, qp_context(q))
        st["setup"] = True
        while not st["cm_up"]:
            await ctx.tick()
        for kind, f, _, _ in items:
            await stream_put(ctx, dut.resume if kind == "resume" else dut.wr, f,
                             rng=rngs[1], p_idle=p)

    async def payload(ctx):
        while not (st["setup"] and st["cm_up"]):
            await ctx.tick()
        for _, _, _, given in items:
            if given:
                await send_packet(ctx, dut.i, given, width, rng=rngs[2], p_idle=p)

    async def tx_sink(ctx):
        while len(res["tx"]) < n_data + len(want_replies):
            res["tx"].append(await recv_packet(ctx, dut.tx, width, rng=rngs[3], p_stall=p))

    async def status(ctx):
        ctx.set(dut.status.ready, 1)
        async for _, _, valid, pl, cnt in ctx.tick().sample(dut.status.valid, dut.status.payload,
                                                            dut.counters):
            if valid:
                res["statuses"].append({"wr_id": int(pl.wr_id), "qp": int(pl.qp),
                                        "status": int(pl.status)})
            res["counters"] = cnt

    try:
        run_simulation(dut, [cm_host, user, payload, tx_sink], [status], cycles=cycles,
                       vcd_name=f"engine_requests_{width}")
    except TimeoutError as exc:
        got = sum(1 for f in res["tx"] if not is_reply(f))
        raise TimeoutError(f"{exc}: {got} of {n_data} data frames on tx") from None
    replies = [f for f in res["tx"] if is_reply(f)]
    data = [f for f in res["tx"] if not is_reply(f)]
    assert replies == want_replies
    left = {qpn: list(v) for qpn, v in want.items()}
    for k, frame in enumerate(data):
        qpn = _bth_dest_qp(frame)
        assert left.get(qpn), f"frame {k}: unexpected frame for QPN {qpn:#x}"
        path, pkt = left[qpn].pop(0)
        exp = build_request_frame(path, pkt, ip_id=(cfg.ip_id_start + k) & 0xFFFF)
        assert frame == exp, (f"frame {k} (QPN {qpn:#x}, PSN {pkt.psn}, {pkt.opcode!r})\n"
                              f" got {frame.hex()}\nwant {exp.hex()}")
    assert not any(left.values())
    res.update(data=data, model=model, want=want, n_gen=n_gen)
    return res


def _fields(rng, qp, opcode, length, **kw):
    f = {"wr_id": rng.getrandbits(64), "opcode": int(opcode), "qp": qp,
         "remote_addr": rng.getrandbits(64), "r_key": rng.getrandbits(32), "length": length,
         "imm": rng.getrandbits(32), "signaled": 1, "solicited": rng.randrange(2)}
    f.update(kw)
    return f


def _scapy_resume(frames, body, start_packet, start_psn, pmtu):
    """scapy's reading of a resumed message's frames: PSNs from ``start_psn``, MIDDLE/LAST (no
    RETH) past packet 0, the message's bytes from ``start_packet * pmtu`` on."""
    from scapy.contrib.roce import BTH
    from scapy.layers.l2 import Ether
    got = b""
    for k, frame in enumerate(frames):
        bth = Ether(frame)[BTH]
        name = bth.sprintf("%BTH.opcode%")
        assert bth.psn == (start_psn + k) & proto.PSN_MASK
        last = k == len(frames) - 1
        kind = ("ONLY" if last else "FIRST") if start_packet + k == 0 else \
            ("LAST" if last else "MIDDLE")
        assert name.startswith("RC_") and kind in name, (k, name)
        rest = bytes(bth.payload)
        if "WRITE" in name and ("FIRST" in name or "ONLY" in name):
            rest = rest[proto.RETH.size:]
        if "IMMEDIATE" in name:
            rest = rest[proto.IMMDT.size:]
        got += rest[:len(rest) - bth.padcount]
    assert got == body[start_packet * pmtu:]


@pytest.mark.parametrize("width", [64, 512])
def test_resume_through_the_engine(width):
    """Issue 33, item 1.1 (regression): a resume on RoceEngine's ``resume`` port (QP in RTS,
    PMTU 256; RDMA_WRITE_WITH_IMM of 773 bytes, imm 0xAB, resumed at packet 2 with its 261
    payload bytes) goes out at once, and so does the WR after it (before the fix the resume's
    payload never passed the WR mux: nothing was sent, and the payload path stayed one
    request behind). Frames against the requester model and scapy."""
    from sim.bfm import QPSetup
    rng = random.Random(33)
    q = QPSetup(index=1, remote_qpn=0x0ABCDE, remote_mac=0x02_00_00_00_00_42,
                remote_ip=0x0A_00_00_42, udp_sport=0xC123, start_psn=1000, pmtu=256)
    body = rng.randbytes(773)
    psn = 0x123456
    resume = _fields(rng, 1, WO.RDMA_WRITE_WITH_IMM, 773, imm=0xAB, solicited=0,
                     start_packet=2, start_psn=psn)
    wr_body = rng.randbytes(300)
    wr = _fields(rng, 1, WO.SEND, 300)
    items = [("resume", resume, body, body[2 * 256:]), ("wr", wr, wr_body, wr_body)]
    assert len(items[0][3]) == 261
    res = run_requests(width, [q], items, cycles=6000)
    data = res["data"]
    assert len(data) == 2 + 2
    _scapy_resume(data[:2], body, 2, psn, 256)
    assert res["statuses"] == []



def _mix(width, seed, *, count=14, p=0.2):
    """A seeded random mix on RoceEngine: the user's WRs and resumes (start packets inside
    their messages, at packet 0 too; lengths 0, 1, PMTU +- 1, several packets) on three QPs of
    random PMTUs, and a generator run started by a CM datagram meanwhile; random idle and
    backpressure. Everything on ``tx`` equals the models, nothing is refused."""
    from sim.bfm import QPSetup
    rng = random.Random(seed)
    pmtus = [256, 512, 1024, 2048]
    qps = [QPSetup(index=k, remote_qpn=0x100 * k + rng.randrange(0x100),
                   remote_mac=0x02_00_00_00_01_00 + k, remote_ip=0x0A_00_01_00 + k,
                   udp_sport=0xC000 + k, start_psn=rng.choice([rng.getrandbits(24), 0xFFFFFE]),
                   pmtu=rng.choice(pmtus)) for k in (1, 2, 3)]
    items = []
    for _ in range(count):
        q = rng.choice(qps)
        op = rng.choice(list(WO)[:4])
        if rng.random() < 0.45:
            n = rng.choice([rng.randrange(q.pmtu + 1, 3 * q.pmtu + 7), rng.randrange(1, q.pmtu),
                            0, q.pmtu])
            npk = max(1, -(-n // q.pmtu))
            j = rng.randrange(npk)
            body = rng.randbytes(n)
            f = _fields(rng, q.index, op, n, start_packet=j,
                        start_psn=rng.choice([rng.getrandbits(24), 0xFFFFFF]))
            items.append(("resume", f, body, body[j * q.pmtu:]))
        else:
            n = rng.choice([0, 1, q.pmtu - 1, q.pmtu, q.pmtu + 1, rng.randrange(3 * q.pmtu)])
            body = rng.randbytes(n)
            items.append(("wr", _fields(rng, q.index, op, n), body, body))
    assert {k for k, *_ in items} == {"wr", "resume"}
    txmeta = (0b011 | rng.randrange(2) << 2 | rng.randrange(2) << 3,
              rng.choice([1, 700, 1500, 2500]), rng.randrange(3, 7), rng.choice([0, 0, 30]))
    res = run_requests(width, qps, items, txmeta=txmeta, seed=seed, p=p)
    assert res["statuses"] == []
    c = res["counters"]
    assert (c.tx.frames, c.tx.frames_aborted, c.tx.wrs_refused) == (len(res["data"]), 0, 0)
    assert c.tx.gen_sent == res["n_gen"] == txmeta[2]
    # the generator's frames and the user's really interleaved on tx
    gen = [k for k, f in enumerate(res["data"]) if _bth_dest_qp(f) == 0x11]
    assert gen and gen[0] < len(res["data"]) - len(gen), "no interleaving"
    return res


@pytest.mark.parametrize("width", [64, 512])
def test_resumes_wrs_and_generator_mix(width):
    _mix(width, seed=3300 + width)


@pytest.mark.slow
@pytest.mark.parametrize("width", [64, 128, 256, 512, 1024])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_resumes_wrs_and_generator_mix_more(width, seed):
    _mix(width, seed=1000 * seed + width, count=24)


@pytest.mark.parametrize("width", [64, 512])
def test_wr_latency_is_documented(width):
    """A WR transferred with the engine idle and its payload waiting: first beat on ``tx``
    exactly ``TxEngine.latency + 2`` cycles later (RoceEngine's docstring), a resume (packet 0
    of the same message) later than that."""
    from roce_hw.engine import TxEngine
    from sim.bfm import QPSetup, qp_context
    cfg = EngineConfig(data_width=width, n_qp=4)
    q = QPSetup(index=1, remote_qpn=0x22, remote_mac=0x02_00_00_00_00_22,
                remote_ip=0x0A_00_00_22, pmtu=1024)
    lat = {}
    for kind in ("wr", "resume"):
        dut = RoceEngine(cfg)
        f = _fields(random.Random(1), 1, WO.SEND, 64)
        if kind == "resume":
            f.update(start_packet=0, start_psn=5)

        async def tb(ctx, dut=dut, f=f, kind=kind):
            ctx.set(dut.local_mac, LOCAL_MAC)
            ctx.set(dut.local_ip, LOCAL_IP)
            await mgmt_write(ctx, dut, 1, qp_context(q))
            await ctx.tick().repeat(20)               # the payload waits on i meanwhile
            port = getattr(dut, kind)
            await stream_put(ctx, port, f)
            ctx.set(dut.tx.ready, 1)
            n = 0
            while True:
                n += 1
                _, _, valid = await ctx.tick().sample(dut.tx.valid)
                if valid:
                    break
            lat[kind] = n

        async def payload(ctx, dut=dut):
            await send_packet(ctx, dut.i, bytes(range(64)), width)

        run_simulation(dut, [tb, payload], cycles=2000)
    assert lat["wr"] == TxEngine(cfg).latency + 2
    assert lat["resume"] > lat["wr"]
