# SPDX-License-Identifier: BSD-2-Clause
"""The TX path's PacketBuilder alone (header fields + padded payload -> frame with IPv4 checksum
and iCRC), against frames that scapy builds and checksums (IPv4 header checksum, and the iCRC
of scapy.contrib.roce) from the same field values: every header variant of the TX path, payloads
of 0 to 3 beats + 1 bytes, random header fields, random valid/ready, abort on the last beat."""

import random
import struct

import pytest

from roce_hw.tx.builder import PacketBuilder
from roce_hw.tx.commit import TX_VARIANTS
from sim.harness import run_simulation
from sim.stream import beats_of, framing_error, stream_put

FAST = [64, 512]
SLOW = [pytest.param(w, marks=pytest.mark.slow) for w in (128, 256, 1024)]
WIDTHS = FAST + SLOW

BTH_BYTES, ICRC_BYTES = 12, 4          # IBTA vol. 1, 9.2 (RETH, ImmDt: struct below)


def random_frame(rng, v, length, abort):
    """One frame of TX variant ``v`` (``(reth << 1) | imm``) with ``length`` payload bytes:
    ``(hdr payload, padded payload or None, abort, the frame scapy builds)``."""
    from scapy.compat import raw
    from scapy.contrib.roce import BTH
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw

    reth, imm = v >> 1, v & 1
    pad = -length % 4
    payload = bytes(rng.getrandbits(8) for _ in range(length)) + bytes(pad)
    ext = b""
    f = {"reth": {"va": rng.getrandbits(64), "r_key": rng.getrandbits(32),
                  "dma_length": rng.getrandbits(32)},
         "immdt": {"imm": rng.getrandbits(32)}}
    if reth:
        ext += struct.pack(">QII", f["reth"]["va"], f["reth"]["r_key"],
                           f["reth"]["dma_length"])
    if imm:
        ext += struct.pack(">I", f["immdt"]["imm"])
    udp_len = 8 + BTH_BYTES + len(ext) + len(payload) + ICRC_BYTES
    f["eth"] = {"dst": rng.getrandbits(48), "src": rng.getrandbits(48), "ethertype": 0x0800}
    f["ipv4"] = {"version": 4, "ihl": 5, "dscp": rng.getrandbits(6), "ecn": rng.getrandbits(2),
                 "total_length": 20 + udp_len, "identification": rng.getrandbits(16),
                 "flag_rsv": 0, "flag_df": rng.getrandbits(1), "flag_mf": 0, "frag_offset": 0,
                 "ttl": rng.getrandbits(8), "protocol": 17,
                 "checksum": rng.getrandbits(16),        # ignored: the builder computes it
                 "src": rng.getrandbits(32), "dst": rng.getrandbits(32)}
    f["udp"] = {"src_port": rng.getrandbits(16), "dst_port": 4791, "length": udp_len,
                "checksum": rng.getrandbits(16)}
    f["bth"] = {"opcode": rng.getrandbits(8), "se": rng.getrandbits(1),
                "migreq": rng.getrandbits(1), "pad_cnt": pad, "tver": rng.getrandbits(4),
                "p_key": rng.getrandbits(16), "fecn": rng.getrandbits(1),
                "becn": rng.getrandbits(1), "resv6": rng.getrandbits(6),
                "dest_qp": rng.getrandbits(24), "ack_req": rng.getrandbits(1),
                "resv7": rng.getrandbits(7), "psn": rng.getrandbits(24)}

    def mac(x):
        return ":".join(f"{b:02x}" for b in x.to_bytes(6, "big"))

    def ip(x):
        return ".".join(str(b) for b in x.to_bytes(4, "big"))

    e, i4, u, b = f["eth"], f["ipv4"], f["udp"], f["bth"]
    pkt = (Ether(dst=mac(e["dst"]), src=mac(e["src"]), type=0x0800)
           / IP(version=4, ihl=5, tos=(i4["dscp"] << 2) | i4["ecn"], len=i4["total_length"],
                id=i4["identification"], flags=i4["flag_df"] << 1, frag=0, ttl=i4["ttl"],
                proto=17, src=ip(i4["src"]), dst=ip(i4["dst"]))
           / UDP(sport=u["src_port"], dport=4791, len=udp_len, chksum=u["checksum"])
           / BTH(opcode=b["opcode"], solicited=b["se"], migreq=b["migreq"], padcount=pad,
                 version=b["tver"], pkey=b["p_key"], fecn=b["fecn"], becn=b["becn"],
                 resv6=b["resv6"], dqpn=b["dest_qp"], ackreq=b["ack_req"], resv7=b["resv7"],
                 psn=b["psn"])
           / Raw(ext + payload))
    hdr = {"variant": v, "payload": int(bool(payload)), "fields": f}
    return hdr, payload or None, int(bool(payload) and abort), raw(pkt)


def frame_set(rng, width, count):
    """``count`` frames (``count`` >= 7) of random variants: payloads of 0, 1, 4, a beat - 1, a
    beat, a beat + 1 and 3 beats + 1 bytes, the others of random lengths up to 3 beats + 1; a
    quarter of the payload frames aborted."""
    n = width // 8
    lengths = [0, 1, 4, n - 1, n, n + 1, 3 * n + 1] + [rng.randrange(0, 3 * n + 2)
                                                       for _ in range(count)]
    frames = [random_frame(rng, rng.randrange(len(TX_VARIANTS)), length, rng.random() < 0.25)
              for length in lengths[:count]]
    rng.shuffle(frames)
    return frames


def run_builder(width, frames, seed, *, p_idle, p_stall):
    """Frames through a PacketBuilder: ``[(bytes, abort)]`` in order."""
    dut = PacketBuilder(width, TX_VARIANTS)
    rng_h, rng_i, rng_o = (random.Random(seed * 3 + k) for k in range(3))
    n = width // 8
    got = []

    async def hdr_tb(ctx):
        for hdr, _, _, _ in frames:
            await stream_put(ctx, dut.hdr, hdr, rng=rng_h, p_idle=p_idle)

    async def i_tb(ctx):
        for _, payload, abort, _ in frames:
            if payload is None:
                continue
            for beat in beats_of(payload, width):
                if beat["last"]:        # junk beyond keep, and the abort bit
                    used = beat["keep"].bit_length()
                    junk = rng_i.getrandbits(8 * (n - used)) if n > used else 0
                    beat = dict(beat, data=beat["data"] | junk << 8 * used, abort=abort)
                await stream_put(ctx, dut.i, beat, rng=rng_i, p_idle=p_idle)

    async def o_tb(ctx):
        data, index = bytearray(), 0
        while len(got) < len(frames):
            ready = not (p_stall and rng_o.random() < p_stall)
            ctx.set(dut.o.ready, ready)
            _, _, valid, p = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            if not (valid and ready):
                continue
            error = framing_error(index, p.keep, p.first, p.last, n)
            assert error is None, f"frame {len(got)}: {error}"
            assert not p.abort or p.last, f"frame {len(got)}: abort before the last beat"
            data += int(p.data).to_bytes(n, "little")[:int(p.keep).bit_length()]
            index += 1
            if p.last:
                got.append((bytes(data), int(p.abort)))
                data, index = bytearray(), 0

    beats = sum(-(-len(f[3]) // n) for f in frames)
    run_simulation(dut, [hdr_tb, i_tb, o_tb], cycles=12 * beats + 400,
                   vcd_name=f"packet_builder_{width}")
    return got


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("seed,p_idle,p_stall", [(1, 0.3, 0.3), (2, 0.0, 0.0), (3, 0.6, 0.1)])
def test_builder_against_scapy(width, seed, p_idle, p_stall):
    """Every frame is the one scapy builds from the same fields (its IPv4 checksum and iCRC
    too), and an aborted payload aborts its frame on the last beat and only that one."""
    rng = random.Random(seed)
    frames = frame_set(rng, width, 32)
    assert {f[0]["variant"] for f in frames} == set(range(len(TX_VARIANTS)))
    got = run_builder(width, frames, seed, p_idle=p_idle, p_stall=p_stall)
    assert len(got) == len(frames)
    for k, ((hdr, payload, abort, expect), (data, ab)) in enumerate(zip(frames, got)):
        assert data == expect, f"frame {k} (variant {hdr['variant']}, {len(payload or b'')} B)"
        assert ab == abort, f"frame {k}: abort {ab}, expected {abort}"


@pytest.mark.parametrize("width", WIDTHS)
def test_builder_latency_and_back_to_back(width):
    """The first beat leaves ``latency`` cycles after the first header's transfer, and frames
    offered back to back leave back to back: one beat per cycle, no idle cycle."""
    rng = random.Random(5)
    n = width // 8
    frames = [random_frame(rng, k % len(TX_VARIANTS), length, False)
              for k, length in enumerate([0, 1, n, 2 * n + 3, 4, 3 * n + 1, 0, n - 1])]
    dut = PacketBuilder(width, TX_VARIANTS)
    beats = sum(-(-len(f[3]) // n) for f in frames)
    hdr_edges, out = [], []

    async def hdr_tb(ctx):
        for hdr, _, _, _ in frames:
            await stream_put(ctx, dut.hdr, hdr)

    async def i_tb(ctx):
        for _, payload, _, _ in frames:
            if payload is not None:
                for beat in beats_of(payload, width):
                    ctx.set(dut.i.payload, dict(beat, abort=0))
                    ctx.set(dut.i.valid, 1)
                    await ctx.tick().until(dut.i.ready)
        ctx.set(dut.i.valid, 0)

    async def o_tb(ctx):
        # every clock edge: the header and output transfers it makes (one clock basis)
        ctx.set(dut.o.ready, 1)
        edge = 0
        while len(out) < beats:
            _, _, h_valid, h_ready, valid, p = await ctx.tick().sample(
                dut.hdr.valid, dut.hdr.ready, dut.o.valid, dut.o.payload)
            edge += 1
            if h_valid and h_ready:
                hdr_edges.append(edge)
            if valid:
                out.append((edge, p))

    run_simulation(dut, [hdr_tb, i_tb, o_tb], cycles=4 * beats + 200)
    edges = [e for e, _ in out]
    assert edges[0] - hdr_edges[0] == dut.latency
    assert edges == list(range(edges[0], edges[0] + beats)), "an idle cycle between beats"
    data = b"".join(int(p.data).to_bytes(n, "little")[:int(p.keep).bit_length()]
                    for _, p in out)
    assert data == b"".join(f[3] for f in frames)
