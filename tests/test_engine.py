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
from roce_hw.model.requester import RequesterModel
from sim.harness import run_simulation
from sim.stream import recv_packet, send_packet

LOCAL_MAC = 0x02_00_00_00_00_01
LOCAL_IP = 0x0A_00_00_01
HOST_MAC = 0x02_00_00_00_00_02
HOST_IP = 0x0A_00_00_02
BROADCAST = (1 << 48) - 1


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


@pytest.mark.parametrize("width", [64, 512, pytest.param(128, marks=pytest.mark.slow),
                                   pytest.param(256, marks=pytest.mark.slow),
                                   pytest.param(1024, marks=pytest.mark.slow)])
def test_engine_bring_up(width):
    rng = random.Random(width)
    cfg = EngineConfig(data_width=width, n_qp=4)
    dut = RoceEngine(cfg)
    cm = CmModel(cfg.n_qp, local_mac=LOCAL_MAC, local_ip=LOCAL_IP, cm_pmtu=cfg.cm_pmtu,
                 ttl=cfg.ttl)
    req = RequesterModel(n_qp=cfg.n_qp, ack_req_every=cfg.ack_req_every, ttl=cfg.ttl,
                         ip_id_start=cfg.ip_id_start, local_mac=LOCAL_MAC, local_ip=LOCAL_IP)
    tx_frames, other_out = [], []
    want_replies, want_data, want_other = [], [], []

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
    want_other = list(others)
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
    replies = [f for f in tx_frames if is_reply(f)]
    data = [f for f in tx_frames if not is_reply(f)]
    arp = replies.pop(0)
    assert proto.ARP.unpack(arp, proto.ETH.size)["oper"] == proto.ArpOper.REPLY
    assert replies == want_replies
    assert data == want_data
    assert other_out == want_other


@pytest.mark.parametrize("width", [64, 512])
def test_other_traffic_at_full_tx_rate(width):
    """Other protocols arrive back to back while the generator sends at full rate: they leave
    on rx_other byte for byte, and the data frames on tx have no idle cycle between their beats
    nor between frames (the same utilisation as without RX traffic)."""
    rng = random.Random(3 * width)
    cfg = EngineConfig(data_width=width, n_qp=2)
    dut = RoceEngine(cfg)
    nbytes = width // 8
    count, length = 6, 3000
    others = [f for _ in range(6) for f in other_frames(rng)]
    setup = [cm_frame(ref_dgram(1, loc_qpn=0x11)),
             cm_frame(ref_dgram(3, loc_qpn=0x11, rem_qpn=256, rem_psn=100))]
    start = cm_frame(ref_dgram(0, loc_qpn=0x11, rem_qpn=256, tx=(0b1011, length, count, 0)))
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
