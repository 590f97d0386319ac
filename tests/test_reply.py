# SPDX-License-Identifier: BSD-2-Clause
"""ReplyBuilder (ARP and CM reply frames) against scapy and the CM model; RequestArbiter."""

import random

import pytest
from amaranth.lib import data

from roce_hw import proto
from roce_hw.config import EngineConfig
from roce_hw.host import datagram
from roce_hw.lib.reqrsp import RequestArbiter
from roce_hw.model.cm import reply_frame
from roce_hw.ctrl.reply import ReplyBuilder
from sim.harness import run_simulation
from sim.stream import recv_packet, stream_get, stream_put

WIDTHS = [64, 512, pytest.param(128, marks=pytest.mark.slow),
          pytest.param(256, marks=pytest.mark.slow), pytest.param(1024, marks=pytest.mark.slow)]
LOCAL_MAC = 0x02_00_00_00_00_01
LOCAL_IP = 0x0A_00_00_01


def _mac(v):
    return ":".join(f"{b:02x}" for b in v.to_bytes(6, "big"))


def _ip(v):
    return ".".join(str(b) for b in v.to_bytes(4, "big"))


@pytest.mark.parametrize("width", WIDTHS)
def test_reply_frames(width):
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import ARP, Ether

    rng = random.Random(10 + width)
    cfg = EngineConfig(data_width=width, ttl=61)
    dut = ReplyBuilder(cfg)
    jobs = []
    for k in range(12):
        if rng.random() < 0.5:
            jobs.append(("arp", {"sha": rng.getrandbits(48), "spa": rng.getrandbits(32)}))
        else:
            fields = {name: rng.getrandbits(bits) for name, bits in proto.CM_DATAGRAM.fields}
            jobs.append(("cm", {"dst_mac": rng.getrandbits(48), "dst_ip": rng.getrandbits(32),
                                "dst_port": rng.getrandbits(16) | 1, "dgram": fields}))
    got = []

    async def producer(ctx):
        ctx.set(dut.local_mac, LOCAL_MAC)
        ctx.set(dut.local_ip, LOCAL_IP)
        for kind, job in jobs:
            await stream_put(ctx, getattr(dut, kind), job, rng=rng, p_idle=0.3)

    async def consumer(ctx):
        for _ in jobs:
            got.append(await recv_packet(ctx, dut.o, width, rng=rng, p_stall=0.3))

    run_simulation(dut, [producer, consumer], cycles=20000)
    for (kind, job), frame in zip(jobs, got):
        if kind == "arp":
            assert len(frame) == 60
            pkt = Ether(frame)
            assert pkt.dst == _mac(job["sha"]) and pkt.src == _mac(LOCAL_MAC)
            a = pkt[ARP]
            assert (a.hwtype, a.ptype, a.hwlen, a.plen, a.op) == (1, 0x0800, 6, 4, 2)
            assert a.hwsrc == _mac(LOCAL_MAC) and a.psrc == _ip(LOCAL_IP)
            assert a.hwdst == _mac(job["sha"]) and a.pdst == _ip(job["spa"])
            assert bytes(frame[42:]) == bytes(18)
        else:
            dgram = datagram.pack(job["dgram"])
            want = reply_frame((job["dst_mac"], job["dst_ip"], job["dst_port"], dgram),
                               local_mac=LOCAL_MAC, local_ip=LOCAL_IP, ttl=61)
            assert frame == want
            pkt = Ether(frame)
            ip = pkt[IP]
            chk = ip.chksum
            del ip.chksum
            assert IP(bytes(ip)).chksum == chk          # scapy recomputes the same checksum
            assert (pkt[UDP].sport, pkt[UDP].dport) == (0x4321, job["dst_port"])
            assert bytes(pkt[UDP].payload) == dgram


@pytest.mark.parametrize("p_idle", [0.0, 0.2])
def test_request_arbiter(p_idle):
    rng = random.Random(5)
    req = data.StructLayout({"tag": 8})
    rsp = data.StructLayout({"tag": 8, "double": 9})
    dut = RequestArbiter(req, rsp, 3)
    n_each = 30
    seen = {k: [] for k in range(3)}
    order = []

    async def slave(ctx):
        for _ in range(3 * n_each):
            r = await stream_get(ctx, dut.m_req, rng=rng, p_stall=0.4)
            order.append(int(r.tag) >> 6)
            await stream_put(ctx, dut.m_rsp, {"tag": r.tag, "double": 2 * int(r.tag)},
                             rng=rng, p_idle=0.4)

    def master(k):
        async def put(ctx):
            for j in range(n_each):
                await stream_put(ctx, getattr(dut, f"s{k}_req"), {"tag": k << 6 | j}, rng=rng,
                                 p_idle=p_idle)
        async def get(ctx):
            for _ in range(n_each):
                r = await stream_get(ctx, getattr(dut, f"s{k}_rsp"), rng=rng, p_stall=0.3)
                seen[k].append((int(r.tag), int(r.double)))
        return put, get

    tbs = [slave] + [f for k in range(3) for f in master(k)]
    run_simulation(dut, tbs, cycles=20000)
    for k in range(3):
        assert seen[k] == [(k << 6 | j, 2 * (k << 6 | j)) for j in range(n_each)]
    if not p_idle:
        # every master always has a request: strict rotation
        assert all(order[i] == order[i % 3] for i in range(len(order))), order
