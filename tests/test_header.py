# SPDX-License-Identifier: BSD-2-Clause
"""HeaderInserter / HeaderExtractor against the pure-Python references of roce_hw.model.header,
proto and struct."""

import random
import re
import shutil
import struct
import subprocess
import time

import pytest

from roce_hw import proto
from roce_hw.lib.header import (HeaderExtractor, HeaderInserter, check_variants,
                                header_fields_layout)
from roce_hw.model import header as model
from sim.harness import run_simulation
from sim.stream import beats_of, framing_error, stream_put
from sim.verilog import emit

ETH, IPV4, UDP, BTH = proto.ETH, proto.IPV4, proto.UDP, proto.BTH
ROCE = (ETH, IPV4, UDP, BTH)
VARIANTS = [ROCE, ROCE + (proto.RETH,), ROCE + (proto.IMMDT,), ROCE + (proto.RETH, proto.IMMDT),
            ROCE + (proto.AETH,), (ETH, IPV4, UDP, proto.CM_DATAGRAM)]
FAST = [64, 512]
SLOW = [pytest.param(w, marks=pytest.mark.slow) for w in (128, 256, 1024)]
WIDTHS = FAST + SLOW


def random_fields(rng, variant):
    return {h.name.lower(): {f: rng.getrandbits(bits) for f, bits in h.fields} for h in variant}


def payload_lengths(rng, width, variants):
    """0 (no payload) and 1 .. 3 beats + 1 bytes, plus every length that ends a frame near a
    beat boundary for each header length."""
    n = width // 8
    lens = {0, 1, 2, n - 1, n, n + 1, 3 * n + 1}
    lens |= {rng.randrange(1, 3 * n + 2) for _ in range(6)}
    for size in {model.header_bytes(v) for v in variants}:
        for k in range(1, 4):
            for d in (-2, -1, 0, 1, 2):
                length = k * n - size % n + d
                if length >= 1:
                    lens.add(length)
    return sorted(lens)


def make_frames(rng, width, variants, count=None):
    frames = []
    for length in payload_lengths(rng, width, variants):
        v = rng.randrange(len(variants))
        payload = bytes(rng.getrandbits(8) for _ in range(length)) if length else None
        frames.append((v, random_fields(rng, variants[v]), payload, rng.random() < 0.3))
    rng.shuffle(frames)
    return frames[:count] if count else frames


async def put_packet(ctx, s, pkt, width, rng, p_idle, abort=None):
    """Send one packet (random bytes beyond keep on the last beat, optional abort bit)."""
    n = width // 8
    for beat in beats_of(pkt, width):
        if beat["last"]:
            used = beat["keep"].bit_length()
            beat = dict(beat, data=beat["data"] | (rng.getrandbits(8 * (n - used)) << 8 * used
                                                   if n > used else beat["data"]))
            if abort is not None:
                beat["abort"] = int(abort)
        elif abort is not None:
            beat["abort"] = rng.getrandbits(1)       # don't-care before the last beat
        while rng.random() < p_idle:
            ctx.set(s.valid, 0)
            await ctx.tick()
        ctx.set(s.payload, beat)
        ctx.set(s.valid, 1)
        await ctx.tick().until(s.ready)
    ctx.set(s.valid, 0)


async def get_packet(ctx, s, width, rng, p_stall, *, abort=False, zero=False):
    """Receive one packet; checks framing (and with ``zero`` that lanes beyond keep are 0);
    returns (bytes, abort)."""
    n = width // 8
    out, index = bytearray(), 0
    while True:
        ready = not (p_stall and rng.random() < p_stall)
        ctx.set(s.ready, ready)
        _, _, valid, p = await ctx.tick().sample(s.valid, s.payload)
        if not (valid and ready):
            continue
        error = framing_error(index, p.keep, p.first, p.last, n)
        assert error is None, error
        count = int(p.keep).bit_length()
        raw = int(p.data).to_bytes(n, "little")
        if zero:
            assert raw[count:] == bytes(n - count), "lanes beyond keep are not zero"
        out += raw[:count]
        index += 1
        if p.last:
            ctx.set(s.ready, 0)
            return bytes(out), (int(p.abort) if abort else 0)


def run_inserter(width, variants, frames, seed, *, p_idle=0.3, p_stall=0.3, abort=False):
    dut = HeaderInserter(width, variants, abort=abort)
    rng_h, rng_i, rng_o = (random.Random(seed * 3 + k) for k in range(3))
    got = []

    async def hdr_tb(ctx):
        for v, fields, payload, _ in frames:
            await stream_put(ctx, dut.hdr, {"variant": v, "payload": payload is not None,
                                            "fields": fields}, rng=rng_h, p_idle=p_idle)

    async def i_tb(ctx):
        for _, _, payload, ab in frames:
            if payload is not None:
                await put_packet(ctx, dut.i, payload, width, rng_i, p_idle,
                                 abort=ab if abort else None)

    async def o_tb(ctx):
        for _ in frames:
            got.append(await get_packet(ctx, dut.o, width, rng_o, p_stall, abort=abort))

    beats = sum(-(-len(model.insert(variants[v], f, p or b"")) // (width // 8))
                for v, f, p, _ in frames)
    run_simulation(dut, [hdr_tb, i_tb, o_tb], cycles=20 * beats + 200,
                   vcd_name=f"header_inserter_{width}")
    for k, ((v, fields, payload, ab), (data, ab_out)) in enumerate(zip(frames, got)):
        assert data == model.insert(variants[v], fields, payload or b""), f"frame {k}"
        if abort:
            assert ab_out == (ab if payload is not None else 0), f"frame {k} abort"
    return got


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("seed", [1, 2])
def test_inserter_random(width, seed):
    rng = random.Random(seed)
    run_inserter(width, VARIANTS, make_frames(rng, width, VARIANTS), seed)


@pytest.mark.parametrize("width", WIDTHS)
def test_inserter_abort(width):
    rng = random.Random(7)
    run_inserter(width, VARIANTS, make_frames(rng, width, VARIANTS, 24), 7, abort=True)


@pytest.mark.parametrize("width", WIDTHS)
def test_inserter_single_variant(width):
    rng = random.Random(3)
    variants = [(ETH, IPV4, UDP)]
    run_inserter(width, variants, make_frames(rng, width, variants), 3)
