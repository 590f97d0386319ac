# SPDX-License-Identifier: BSD-2-Clause
"""The payload cutter alone: one command per work-request payload packet (single-packet
messages), good packets and every kind of length or ``keep`` mismatch on the last beat, under
random idle cycles and backpressure, against a reference written from the cutter's docstring."""

import random

import pytest

from roce_hw.tx.cutter import PayloadCutter
from sim.harness import run_simulation
from sim.stream import stream_get, stream_put


def _mask(count):
    return (1 << count) - 1


def _case(rng, n):
    """(command, input beats, expected output beats, expected mism) for one message of one
    packet: the input is either right, or ends early, or goes on, or ends on the right beat with
    a wrong ``keep`` (a hole, an extra lane, a lane short, none)."""
    length = rng.randint(1, 5 * n)
    beats = -(-length // n)
    cnt = length - (beats - 1) * n
    pk = _mask(cnt)
    lik = _mask(min(n, -(-cnt // 4) * 4))
    cmd = {"beats": beats, "pk": pk, "lik": lik, "pkc": cnt, "last_msg": 1, "drain": 0}
    kind = rng.choice(["ok", "ok", "short", "long", "hole", "extra", "less", "none"])
    keeps = [_mask(n)] * (beats - 1) + [pk]
    if kind == "short" and beats > 1:
        keeps = keeps[:rng.randint(1, beats - 1)]
        keeps[-1] = _mask(rng.randint(1, n))
    elif kind == "long":
        keeps = keeps[:-1] + [_mask(n)] * rng.randint(1, 2) + [_mask(rng.randint(1, n))]
    elif kind == "hole" and cnt >= 3:
        keeps[-1] = pk & ~(1 << rng.randint(1, cnt - 2))
    elif kind == "extra" and cnt < n:
        keeps[-1] = pk | (1 << rng.randint(cnt, n - 1))
    elif kind == "less" and cnt > 1:
        keeps[-1] = _mask(cnt - 1)
    elif kind == "none":
        keeps[-1] = 0
    beats_in = [{"data": rng.getrandbits(8 * n), "keep": k, "first": int(i == 0),
                 "last": int(i == len(keeps) - 1)} for i, k in enumerate(keeps)]
    # reference: the output follows the input up to the beat where the packet must end or does
    out = []
    for i, b in enumerate(beats_in):
        end_due = i == beats - 1
        if b["last"]:
            mism = not end_due or b["keep"] != pk
        else:
            mism = end_due
        if end_due and not mism:
            out.append({"data": b["data"] & ((1 << (8 * cnt)) - 1), "keep": lik, "last": 1,
                        "abort": 0})
            return cmd, beats_in, out, False
        if mism:
            out.append({"data": b["data"] & (((1 << (8 * cnt)) - 1) if end_due else
                                             ((1 << (8 * n)) - 1)),
                        "keep": _mask(n), "last": 1, "abort": 1})
            return cmd, beats_in, out, True
        out.append({"data": b["data"], "keep": _mask(n), "last": 0, "abort": 0})
    raise AssertionError("unreachable")


@pytest.mark.parametrize("width", [64, 512, pytest.param(128, marks=pytest.mark.slow),
                                   pytest.param(256, marks=pytest.mark.slow),
                                   pytest.param(1024, marks=pytest.mark.slow)])
@pytest.mark.parametrize("early", [False, True])
def test_cutter_against_reference(width, early):
    """``early`` (the first beat in the command's own cycle) gives the same beats and checks."""
    n = width // 8
    rng = random.Random(7000 + width)
    cases = [_case(rng, n) for _ in range(120)]
    dut = PayloadCutter(width, early=early)
    got, dones = [], []

    async def commands(ctx):
        for cmd, _, _, _ in cases:
            await stream_put(ctx, dut.cmd, cmd, rng=rng, p_idle=0.3)

    async def payload(ctx):
        for _, beats_in, _, _ in cases:
            for b in beats_in:
                await stream_put(ctx, dut.i, b, rng=rng, p_idle=0.3)

    async def output(ctx):
        want = sum(len(c[2]) for c in cases)
        while len(got) < want:
            p = await stream_get(ctx, dut.o, rng=rng, p_stall=0.3)
            got.append({"data": int(p.data), "keep": int(p.keep), "last": int(p.last),
                        "abort": int(p.abort)})

    async def done(ctx):
        async for clk, rst, valid, mism in ctx.tick().sample(dut.done.valid,
                                                             dut.done.payload.mism):
            if valid:
                dones.append(bool(mism))

    run_simulation(dut, [commands, payload, output], [done], cycles=40_000)
    assert got == [b for c in cases for b in c[2]]
    assert dones == [c[3] for c in cases]
    kinds = {c[3] for c in cases}
    assert kinds == {True, False}


@pytest.mark.parametrize("early", [False, True])
def test_cutter_command_latency(early):
    """With the payload staged and the cutter idle, a command transferred in cycle t has its
    first beat on ``o`` in cycle t + 2, or t + 1 with ``early``."""
    width = 64
    dut = PayloadCutter(width, early=early)
    seen = {}

    async def bench(ctx):
        ctx.set(dut.o.ready, 1)
        ctx.set(dut.i.payload, {"data": 0x1122334455667788, "keep": 0xFF, "first": 1, "last": 0})
        ctx.set(dut.i.valid, 1)
        await ctx.tick().repeat(3)             # the beat is staged; no command yet
        ctx.set(dut.i.valid, 0)
        ctx.set(dut.cmd.payload, {"beats": 2, "pk": 0xFF, "lik": 0xFF, "pkc": 8, "last_msg": 1,
                                  "drain": 0})
        ctx.set(dut.cmd.valid, 1)
        cycle = 0
        while True:
            _, _, ready = await ctx.tick().sample(dut.cmd.ready)
            if ready and "cmd" not in seen:
                seen["cmd"] = cycle
                ctx.set(dut.cmd.valid, 0)
            cycle += 1
            if ctx.get(dut.o.valid):
                seen["o"] = cycle
                assert ctx.get(dut.o.payload.data) == 0x1122334455667788
                assert ctx.get(dut.o.payload.first) == 1
                break
            assert cycle < 10

    run_simulation(dut, [bench], cycles=100)
    assert seen["o"] - seen["cmd"] == (1 if early else 2)
