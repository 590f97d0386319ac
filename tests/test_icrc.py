# SPDX-License-Identifier: BSD-2-Clause
"""iCRC inserter and checker against scapy.contrib.roce, zlib, the golden model and the golden
captures."""

import random
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from amaranth.sim import Simulator
from scapy.all import Dot1Q, Ether, IP, IPv6, Raw, UDP, raw
from scapy.contrib.roce import BTH

from roce_hw import proto
from roce_hw.config import DATA_WIDTHS
from roce_hw.lib.icrc import (VARIANTS, ICRCChecker, ICRCInserter, covered_start, masked_bytes)
from roce_hw.model import icrc as model
from sim.harness import run_simulation
from sim.icrc_hw import check_frames
from sim.pcap import read_capture
from sim.oracle import protocol_icrc
from sim.stream import beats_of, collect_valid, recv_packet, send_packet
from roce_hw.generate import emit, lint

FAST_WIDTHS = (64, 512)
ROOT = Path(__file__).resolve().parent.parent


def scapy_frame(rng, vlan, ipv, paylen):
    """A RoCEv2 SEND_ONLY frame built by scapy, iCRC included, with random variant fields."""
    pad = -paylen % 4
    eth = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
    if vlan:
        eth = eth / Dot1Q(vlan=rng.randrange(4096), prio=rng.randrange(8))
    if ipv == 4:
        ip = IP(src="10.0.0.1", dst="10.0.0.2", tos=rng.getrandbits(8), ttl=rng.getrandbits(8),
                id=rng.getrandbits(16), flags="DF")
    else:
        ip = IPv6(src="fd00::1", dst="fd00::2", tc=rng.getrandbits(8), fl=rng.getrandbits(20),
                  hlim=rng.getrandbits(8))
    pkt = (eth / ip / UDP(sport=0xC000 | rng.getrandbits(14), dport=proto.ROCEV2_UDP_PORT,
                          chksum=rng.getrandbits(16))
           / BTH(opcode=4, padcount=pad, fecn=rng.getrandbits(1), becn=rng.getrandbits(1),
                 resv6=rng.getrandbits(6), dqpn=rng.getrandbits(24), psn=rng.getrandbits(24),
                 ackreq=1)
           / Raw(bytes(rng.getrandbits(8) for _ in range(paylen)) + bytes(pad)))
    frame = raw(pkt)
    start, end = model.frame_l3(frame)
    assert struct.pack("<I", protocol_icrc(frame[start:end - 4])) == frame[end - 4:end]
    return frame


def frame_set(rng, width, count, paylens=None):
    """Frames of every variant whose last beat ends at every possible lane position."""
    n = width // 8
    if paylens is None:
        paylens = list(range(0, n + 8, 4)) + [rng.randrange(0, 300) for _ in range(count)]
    frames = []
    for k, paylen in enumerate(paylens):
        frames.append(scapy_frame(rng, *VARIANTS[k % len(VARIANTS)], paylen))
    rng.shuffle(frames)
    return frames


def golden_frames(golden_dir):
    frames = []
    for path in sorted(golden_dir.glob("*.pcap")):
        for pkt in read_capture(path):
            try:
                start, end = model.frame_l3(pkt.data)
            except (ValueError, struct.error):
                continue
            ihl = 40 if pkt.data[start] >> 4 == 6 else (pkt.data[start] & 15) * 4
            if struct.unpack_from("!H", pkt.data, start + ihl + 2)[0] == proto.ROCEV2_UDP_PORT:
                frames.append(pkt.data)
    return frames


# --- elaboration-time tables ----------------------------------------------------------------

@pytest.mark.parametrize("variant", VARIANTS)
def test_masked_bytes_match_protocol(variant):
    """The masks derived from roce_hw.proto set exactly the bytes PROTOCOL.md §2 sets."""
    vlan, ipv = variant
    e = covered_start(vlan)
    l3 = bytearray(80)
    l3[0] = 0x45 if ipv == 4 else 0x60
    masked = bytearray(l3)
    for off, mk in masked_bytes(vlan, ipv).items():
        masked[off - e] |= mk
    # protocol_icrc masks with 1s: equal CRCs of the two versions <=> same masked bits
    assert model.masked_l3(bytes(l3)) == bytes(masked)
    assert protocol_icrc(bytes(l3)) == zlib.crc32(b"\xff" * 8 + bytes(masked))


def test_bad_width_raises():
    for cls in (ICRCInserter, ICRCChecker):
        with pytest.raises(ValueError, match="choose one of"):
            cls(100)


# --- inserter --------------------------------------------------------------------------------

def run_inserter(width, frames, rng, p_idle, p_stall, **kwargs):
    dut = ICRCInserter(width, **kwargs)
    got = []

    async def producer(ctx):
        for f in frames:
            await send_packet(ctx, dut.i, f[:-4], width, rng=rng, p_idle=p_idle)

    async def consumer(ctx):
        for _ in frames:
            got.append(await recv_packet(ctx, dut.o, width, rng=rng, p_stall=p_stall))

    beats = sum(-(-len(f) // (width // 8)) for f in frames)
    run_simulation(dut, [producer, consumer], cycles=4 * beats + 300,
                   vcd_name=f"icrc_ins{width}")
    return got


def check_inserter(width, seed, count, modes, **kwargs):
    rng = random.Random(seed)
    frames = frame_set(rng, width, count)
    for p_idle, p_stall in modes:
        got = run_inserter(width, frames, rng, p_idle, p_stall, **kwargs)
        for f, g in zip(frames, got):
            assert g == f, (len(f), p_idle, p_stall)


@pytest.mark.parametrize("width", FAST_WIDTHS)
def test_inserter_matches_scapy(width):
    """Every last-beat position, all four variants, back-to-back and with random stalls."""
    check_inserter(width, width, 12, [(0.0, 0.0), (0.3, 0.3)])


@pytest.mark.parametrize("width", [128, 256, 1024])
def test_inserter_light(width):
    check_inserter(width, width + 7, 4, [(0.2, 0.2)])


@pytest.mark.parametrize("width", [256, 512, 1024])
@pytest.mark.parametrize("per_cycle", [1, 2])
def test_inserter_registered_rewind_stages(width, per_cycle):
    """The rewind with 1 or 2 stages per register gives the same frames, later."""
    check_inserter(width, width + 11, 6, [(0.0, 0.0), (0.3, 0.3)],
                   rewind_per_cycle=per_cycle)
    q_bits = (width // 8 - 1).bit_length() - 2       # rewind stages: 4 << b bytes each
    assert ICRCInserter(width, rewind_per_cycle=per_cycle).latency == \
        3 + -(-q_bits // per_cycle)


def test_inserter_default_latency():
    """Up to three rewind stages sit in front of the output register, the rest two per
    register before it; with a fixed variant the zeroing has no register stage of its own."""
    widths = (64, 128, 256, 512, 1024)
    assert [ICRCInserter(w).latency for w in widths] == [3, 3, 3, 4, 4]
    assert [ICRCInserter(w, variant=(0, 4)).latency for w in widths] == [2, 2, 2, 3, 3]
    for w in widths:
        for kw in ({}, {"variant": (0, 6)}, {"rewind_per_cycle": 1},
                   {"rewind_per_cycle": 2, "variant": (1, 4)}):
            assert ICRCInserter.latency_for(w, **kw) == ICRCInserter(w, **kw).latency


@pytest.mark.parametrize("width", [64, 512])
@pytest.mark.parametrize("variant", VARIANTS)
def test_inserter_fixed_variant(width, variant):
    """``variant=`` (no ethertype compare): frames of that variant get the right iCRC at every
    last-beat position; frames of another variant would not (the option is not ignored)."""
    rng = random.Random(width + variant[0] * 10 + variant[1])
    n = width // 8
    frames = [scapy_frame(rng, *variant, paylen)
              for paylen in list(range(0, n + 8, 4)) + [rng.randrange(0, 300) for _ in range(4)]]
    got = run_inserter(width, frames, rng, 0.2, 0.2, variant=variant)
    assert got == frames
    other = next(v for v in VARIANTS if v != variant)
    wrong = [scapy_frame(rng, *other, 40)]
    assert run_inserter(width, wrong, rng, 0.0, 0.0, variant=variant) != wrong


@pytest.mark.parametrize("width", [128, 256, 1024])
def test_inserter_fixed_variant_widths(width):
    """The TX engine's variant (zeroing in front of the partial terms) at the other widths:
    every last-beat position, random idles and stalls."""
    rng = random.Random(width + 404)
    n = width // 8
    frames = [scapy_frame(rng, 0, 4, paylen)
              for paylen in list(range(0, n + 8, 4)) + [rng.randrange(0, 300) for _ in range(3)]]
    assert run_inserter(width, frames, rng, 0.2, 0.2, variant=(0, 4)) == frames


@pytest.mark.parametrize("width", FAST_WIDTHS)
def test_inserter_ready_break(width):
    """``ready_break`` (the TX engine's): the same frames under random idles and stalls, and
    ``i.ready`` a flip-flop: in every cycle of a random run it is the same with ``o.ready``
    low and high (the default inserter's is not: checked too, so the option is not ignored)."""
    rng = random.Random(width + 505)
    n = width // 8
    frames = [scapy_frame(rng, 0, 4, paylen)
              for paylen in list(range(0, n + 8, 4)) + [rng.randrange(0, 300) for _ in range(3)]]
    for p_idle, p_stall in ((0.2, 0.3), (0.0, 0.6), (0.5, 0.0)):
        assert run_inserter(width, frames, rng, p_idle, p_stall, variant=(0, 4),
                            ready_break=True) == frames
    for ready_break in (True, False):
        dut = ICRCInserter(width, variant=(0, 4), ready_break=ready_break)
        beats = [b for f in frames for b in beats_of(f[:-4], width)]
        follows = []            # cycles where i.ready changed with o.ready

        async def bench(ctx):
            k = 0
            for _ in range(3 * len(beats)):
                offer = k < len(beats) and rng.random() < 0.8
                ctx.set(dut.i.valid, offer)
                if offer:
                    ctx.set(dut.i.payload, beats[k])
                ctx.set(dut.o.ready, 0)
                r0 = ctx.get(dut.i.ready)
                ctx.set(dut.o.ready, 1)
                if ctx.get(dut.i.ready) != r0:
                    follows.append(k)
                ctx.set(dut.o.ready, rng.random() < 0.6)
                k += bool(offer and ctx.get(dut.i.ready))
                await ctx.tick()

        run_simulation(dut, [bench], cycles=3 * len(beats) + 10)
        assert bool(follows) != ready_break, (ready_break, follows[:5])


def test_inserter_rejects_bad_variant():
    with pytest.raises(ValueError, match="variant"):
        ICRCInserter(512, variant=(2, 4))


def test_inserter_rejects_bad_rewind_per_cycle():
    with pytest.raises(ValueError, match="rewind_per_cycle"):
        ICRCInserter(512, rewind_per_cycle=3)


@pytest.mark.slow
@pytest.mark.parametrize("width", DATA_WIDTHS)
@pytest.mark.parametrize("seed", [1, 2])
def test_inserter_full(width, seed):
    check_inserter(width, 1000 * seed + width, 40,
                   [(0.0, 0.0), (0.5, 0.0), (0.0, 0.5), (0.3, 0.3)])


@pytest.mark.parametrize("width", FAST_WIDTHS)
@pytest.mark.parametrize("variant", [None, (0, 4)])
def test_inserter_latency(width, variant):
    """Constant latency: each beat leaves ``latency`` cycles after it was accepted (also with
    the fixed variant's zeroing in front of the partial terms)."""
    from sim.stream import beats_of
    rng = random.Random(3)
    n = width // 8
    # 154 bytes without iCRC: 2 or 26 lanes used in the last beat, no extra beat
    frames = [scapy_frame(rng, 0, 4, 100),
              scapy_frame(rng, 0, 6, 40) if variant is None else scapy_frame(rng, 0, 4, 60)]
    beats = [b for f in frames for b in beats_of(f[:-4], width)]
    dut = ICRCInserter(width, variant=variant)
    ins, outs = [], []

    async def producer(ctx):
        cycle = 0
        for beat in beats:
            ctx.set(dut.i.payload, beat)
            ctx.set(dut.i.valid, 1)
            while True:
                _, _, ready = await ctx.tick().sample(dut.i.ready)
                cycle += 1
                if ready:
                    break
            ins.append(cycle)
        ctx.set(dut.i.valid, 0)

    async def consumer(ctx):
        total = sum(-(-len(f) // n) for f in frames)
        outs.extend(c for c, _ in await collect_valid(ctx, dut.o, total))

    run_simulation(dut, [producer, consumer], cycles=300)
    first = -(-(len(frames[0]) - 4) // n)
    assert outs[:first] == [c + dut.latency for c in ins[:first]]
    assert outs[first] == ins[first] + dut.latency


# --- checker ---------------------------------------------------------------------------------

@pytest.mark.parametrize("width", FAST_WIDTHS)
def test_checker_passes_golden(golden_dir, width):
    frames = golden_frames(golden_dir)
    assert len(frames) >= 300
    assert all(model.frame_icrc_ok(f) for f in frames)
    assert check_frames(frames, width) == [True] * len(frames)


def _covered_unmasked_bits(frame):
    start, end = model.frame_l3(frame)
    vlan = int(start == covered_start(1))
    ipv = frame[start] >> 4
    masks = masked_bytes(vlan, ipv)
    return [(off, b) for off in range(start, end) for b in range(8)
            if not (masks.get(off, 0) >> b) & 1]


@pytest.mark.parametrize("width", [512])
def test_checker_fails_every_flipped_frame(golden_dir, width):
    """One flipped bit anywhere in the covered bytes (one random position per golden frame)."""
    rng = random.Random(11)
    flipped = []
    for f in golden_frames(golden_dir):
        off, b = rng.choice(_covered_unmasked_bits(f))
        g = bytearray(f)
        g[off] ^= 1 << b
        flipped.append(bytes(g))
    assert check_frames(flipped, width) == [False] * len(flipped)


@pytest.mark.slow
@pytest.mark.parametrize("width", DATA_WIDTHS)
def test_checker_fails_flipped_all_widths(golden_dir, width):
    rng = random.Random(width)
    frames = golden_frames(golden_dir)
    flipped = []
    for f in frames:
        for _ in range(3):
            off, b = rng.choice(_covered_unmasked_bits(f))
            g = bytearray(f)
            g[off] ^= 1 << b
            flipped.append(bytes(g))
    assert check_frames(flipped, width) == [False] * len(flipped)
    assert check_frames(frames, width) == [True] * len(frames)


@pytest.mark.parametrize("width", FAST_WIDTHS)
def test_checker_ignores_masked_and_uncovered_bytes(width):
    """Flips in masked fields, in the Ethernet header/VLAN tag and in trailing FCS/padding
    bytes do not change the verdict; every variant, every end lane."""
    rng = random.Random(width + 3)
    frames = frame_set(rng, width, 4)
    variants = []
    for f in frames:
        start, end = model.frame_l3(f)
        vlan, ipv = int(start == covered_start(1)), f[start] >> 4
        g = bytearray(f)
        for off, mk in masked_bytes(vlan, ipv).items():
            g[off] ^= mk & rng.getrandbits(8) | (mk & -mk)
        g[rng.randrange(0, 12)] ^= 1 << rng.randrange(8)                # a MAC address bit
        if vlan:
            g[rng.choice([14, 15])] ^= 1 << rng.randrange(8)            # PCP/DEI/VID
        tail = bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 4, 9, 70])))
        variants.append(bytes(g) + tail)
    assert all(model.frame_icrc_ok(f) for f in variants)
    assert check_frames(variants, width) == [True] * len(variants)


@pytest.mark.parametrize("width", FAST_WIDTHS)
def test_checker_rejects_malformed(width):
    """Non-IP, truncated, too-short and IPv4-with-options frames are bad, and never hang."""
    rng = random.Random(4)
    good = scapy_frame(rng, 0, 4, 40)
    start, end = model.frame_l3(good)
    arp = bytes(12) + b"\x08\x06" + bytes(46)
    truncated = good[:end - 1]
    runt = good[:20]
    opts = bytearray(good)
    opts[start] = 0x46
    frames = [arp, truncated, good, runt, bytes(opts), good]
    assert check_frames(frames, width) == [False, False, True, False, False, True]


def test_checker_stalls_and_back_to_back():
    """Random idle and backpressure on the result stream at 512 bits."""
    width = 512
    rng = random.Random(21)
    frames = frame_set(rng, width, 8)
    frames = [f if rng.random() < 0.6 else f[:-1] + bytes([f[-1] ^ 4]) for f in frames]
    expect = [model.frame_icrc_ok(f) for f in frames]
    dut = ICRCChecker(width)
    got = []

    async def producer(ctx):
        for f in frames:
            await send_packet(ctx, dut.i, f, width, rng=rng, p_idle=0.3)

    async def consumer(ctx):
        from sim.stream import stream_get
        for _ in frames:
            got.append(bool((await stream_get(ctx, dut.o, rng=rng, p_stall=0.5)).good))

    run_simulation(dut, [producer, consumer], cycles=2000)
    assert got == expect
    assert True in expect and False in expect


@pytest.mark.parametrize("width", FAST_WIDTHS)
def test_checker_latency(width):
    """One result ``latency`` cycles after each frame's last beat, frames back to back."""
    from sim.stream import beats_of
    rng = random.Random(12)
    frames = [scapy_frame(rng, k % 2, 4 + 2 * (k // 2), 4 * k) for k in range(4)]
    dut = ICRCChecker(width)
    lasts, outs = [], []

    async def producer(ctx):
        cycle = 0
        for f in frames:
            for beat in beats_of(f, width):
                ctx.set(dut.i.payload, beat)
                ctx.set(dut.i.valid, 1)
                await ctx.tick()
                cycle += 1
            lasts.append(cycle)
        ctx.set(dut.i.valid, 0)

    async def consumer(ctx):
        outs.extend((c, p.good) for c, p in await collect_valid(ctx, dut.o, len(frames)))

    run_simulation(dut, [producer, consumer], cycles=300)
    assert [c for c, _ in outs] == [c + dut.latency for c in lasts]
    assert all(g for _, g in outs)


def test_inserter_output_passes_checker():
    rng = random.Random(8)
    frames = frame_set(rng, 64, 6)
    out = run_inserter(64, frames, rng, 0.1, 0.1)
    assert check_frames(out, 64) == [True] * len(out)


# --- Verilog, simulator build, CLI ---------------------------------------------------------

@pytest.mark.parametrize("width", FAST_WIDTHS)
@pytest.mark.parametrize("cls", [ICRCInserter, ICRCChecker])
def test_verilog_lint(cls, width):
    lint(emit(cls(width), "icrc"), "icrc")


@pytest.mark.slow
@pytest.mark.parametrize("width", [128, 256, 1024])
@pytest.mark.parametrize("cls", [ICRCInserter, ICRCChecker])
def test_verilog_lint_all(cls, width):
    lint(emit(cls(width), "icrc"), "icrc")


@pytest.mark.parametrize("cls", [ICRCInserter, ICRCChecker])
def test_simulator_build_is_fast(cls):
    # CPU time of this process, not wall time: the bound holds on a loaded machine too
    t0 = time.process_time()
    Simulator(cls(1024))
    elapsed = time.process_time() - t0
    assert elapsed < 5.0, f"simulator build took {elapsed:.2f} s at 1024 bits"


def test_analyze_hw_cli(golden_dir):
    """``python -m sim.analyze --hw`` runs the simulated checker end to end."""
    res = subprocess.run([sys.executable, "-m", "sim.analyze", "--hw", "--width", "64", "-q",
                          str(golden_dir / "rping.pcap")], capture_output=True, text=True,
                         cwd=ROOT)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert lines[-1].endswith(" passed, 0 failed")
    assert any("0 disagree with the model" in line for line in lines)
