# SPDX-License-Identifier: BSD-2-Clause
"""CRC-32 matrices and the pipelined CRC32 component against zlib and amaranth.lib.crc."""

import random
import struct
import time
import zlib

import pytest
from amaranth.lib.crc import catalog
from amaranth.sim import Simulator

from roce_hw.config import DATA_WIDTHS
from roce_hw.lib.crc import (CRC32, CRC_INIT, advance, advance_rows, apply_rows, crc_bits,
                         residue_register, step_matrices)
from sim.harness import run_simulation
from sim.stream import collect_valid, send_packet, stream_get
from roce_hw.generate import emit, lint

FAST_WIDTHS = (64, 512)


def _matrix_crc(data, width):
    """zlib.crc32 computed with the derived matrices, ``width`` bits at a time (zero-padded
    tail handled by the bit-serial reference so that only whole words use the matrices)."""
    a_rows, b_rows = step_matrices(width)
    nb = width // 8
    state = CRC_INIT
    whole = len(data) - len(data) % nb
    for i in range(0, whole, nb):
        word = int.from_bytes(data[i:i + nb], "little")
        state = apply_rows(a_rows, state) ^ apply_rows(b_rows, word)
    for byte in data[whole:]:
        state = crc_bits(state, byte, 8)
    return ~state & 0xFFFFFFFF


@pytest.mark.parametrize("nbits", [1, 3, 8, 32, 64, 512, 1024])
def test_matrices_equal_bit_serial(nbits):
    rng = random.Random(nbits)
    a_rows, b_rows = step_matrices(nbits)
    for _ in range(20):
        s, d = rng.getrandbits(32), rng.getrandbits(nbits)
        assert apply_rows(a_rows, s) ^ apply_rows(b_rows, d) == crc_bits(s, d, nbits)


@pytest.mark.parametrize("width", DATA_WIDTHS)
def test_matrices_against_zlib(width):
    rng = random.Random(width)
    for n in (0, 1, width // 8, 3 * width // 8 + 5):
        data = bytes(rng.getrandbits(8) for _ in range(n))
        assert _matrix_crc(data, width) == zlib.crc32(data)


@pytest.mark.parametrize("word_bits", [8, 16, 32])
def test_matrices_against_amaranth_catalog(word_bits):
    """amaranth.lib.crc is an independent reference at small widths (TOOLCHAIN.md trap 1)."""
    rng = random.Random(word_bits)
    params = catalog.CRC32_ETHERNET(word_bits)
    nb = word_bits // 8
    for nwords in (1, 2, 7):
        data = bytes(rng.getrandbits(8) for _ in range(nwords * nb))
        words = [int.from_bytes(data[i:i + nb], "little") for i in range(0, len(data), nb)]
        assert _matrix_crc(data, word_bits) == params.compute(words)


def test_advance_and_rewind():
    rng = random.Random(5)
    for k in (1, 8, 16, 100):
        s = rng.getrandbits(32)
        assert advance(advance(s, k), -k) == s
        assert advance(s, k) == crc_bits(s, 0, k)
        assert apply_rows(advance_rows(-k), advance(s, k)) == s


def test_residue_constant_against_zlib():
    msg = b"roce-hw"
    crc = zlib.crc32(msg)
    # register after msg + its CRC (little-endian) is the residue whatever the message
    assert ~zlib.crc32(msg + struct.pack("<I", crc)) & 0xFFFFFFFF == residue_register()


def test_bad_width_raises():
    with pytest.raises(ValueError, match="64, 128, 256, 512, 1024"):
        CRC32(96)


def _lengths(n, rng, extra):
    base = {1, 2, 3, n - 1, n, n + 1, 2 * n - 1, 2 * n, 2 * n + 1, 3 * n + 5}
    return sorted(x for x in base if x > 0) + [rng.randrange(1, 4 * n) for _ in range(extra)]


def _run_crc(width, packets, rng, p_idle, p_stall):
    dut = CRC32(width)
    got = []

    async def producer(ctx):
        for p in packets:
            await send_packet(ctx, dut.i, p, width, rng=rng, p_idle=p_idle)

    async def consumer(ctx):
        for _ in packets:
            got.append(await stream_get(ctx, dut.o, rng=rng, p_stall=p_stall))

    beats = sum(-(-len(p) // (width // 8)) for p in packets)
    run_simulation(dut, [producer, consumer], cycles=4 * beats + 200, vcd_name=f"crc{width}")
    return got


def _check_width(width, seed, extra, modes):
    rng = random.Random(seed)
    n = width // 8
    packets = [bytes(rng.getrandbits(8) for _ in range(length))
               for length in _lengths(n, rng, extra)]
    for p_idle, p_stall in modes:
        got = _run_crc(width, packets, rng, p_idle, p_stall)
        assert got == [zlib.crc32(p) for p in packets], (p_idle, p_stall)


@pytest.mark.parametrize("width", FAST_WIDTHS)
def test_crc32_hardware(width):
    """Every beat boundary +-1, random keep garbage, back-to-back and with random stalls."""
    _check_width(width, width, 10, [(0.0, 0.0), (0.3, 0.3)])


@pytest.mark.parametrize("width", [128, 256, 1024])
def test_crc32_hardware_light(width):
    _check_width(width, width + 1, 2, [(0.2, 0.2)])


@pytest.mark.slow
@pytest.mark.parametrize("width", DATA_WIDTHS)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_crc32_hardware_full(width, seed):
    _check_width(width, 100 * seed + width, 40, [(0.0, 0.0), (0.5, 0.0), (0.0, 0.5), (0.3, 0.3)])


@pytest.mark.parametrize("width", FAST_WIDTHS)
def test_crc32_latency_and_throughput(width):
    """One-beat packets every cycle give one CRC per cycle, each ``latency`` cycles after its
    beat was accepted."""
    dut = CRC32(width)
    rng = random.Random(9)
    packets = [bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, width // 8 + 1)))
               for _ in range(12)]
    accepted, produced = [], []

    async def producer(ctx):
        cycle = 0
        for p in packets:
            ctx.set(dut.i.payload, {"data": int.from_bytes(p, "little"),
                                    "keep": (1 << len(p)) - 1, "first": 1, "last": 1})
            ctx.set(dut.i.valid, 1)
            await ctx.tick()
            cycle += 1
            accepted.append(cycle)
        ctx.set(dut.i.valid, 0)

    async def consumer(ctx):
        produced.extend(await collect_valid(ctx, dut.o, len(packets)))

    run_simulation(dut, [producer, consumer], cycles=200)
    assert [v for _, v in produced] == [zlib.crc32(p) for p in packets]
    assert [c for c, _ in produced] == [a + dut.latency for a in accepted]


@pytest.mark.parametrize("width", FAST_WIDTHS)
def test_crc32_verilog_lint(width):
    lint(emit(CRC32(width), "crc32"), "crc32")


@pytest.mark.slow
@pytest.mark.parametrize("width", [128, 256, 1024])
def test_crc32_verilog_lint_all(width):
    lint(emit(CRC32(width), "crc32"), "crc32")


def test_crc32_simulator_build_is_fast():
    # CPU time of this process, not wall time: the bound holds on a loaded machine too
    t0 = time.process_time()
    Simulator(CRC32(1024))
    elapsed = time.process_time() - t0
    assert elapsed < 5.0, f"simulator build took {elapsed:.2f} s at 1024 bits"
