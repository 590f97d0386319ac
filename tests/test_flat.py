# SPDX-License-Identifier: BSD-2-Clause
"""FlatTop: flat AXI-Stream-style ports around a component, with `first` derived from tlast."""

import random

import pytest
from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from roce_hw.lib.flat import FlatTop
from roce_hw.lib.stream import PacketSignature
from sim.harness import run_simulation
from roce_hw.generate import emit, lint

__all__ = []


class _Loop(wiring.Component):
    """Copies input beats to the output; `abort` := `first` so the test can see `first`."""

    def __init__(self):
        super().__init__({
            "i": In(PacketSignature(64)),
            "o": Out(stream.Signature(data.StructLayout(
                {"data": 64, "keep": 8, "first": 1, "last": 1, "abort": 1}))),
            "cmd": In(stream.Signature(data.StructLayout(
                {"a": 8, "ctx": data.StructLayout({"x": 3, "y": 4})}))),
            "rsp": Out(stream.Signature(8)),
            "mac": In(48),
            "count": Out(16),
        })

    def elaborate(self, platform):
        m = Module()
        m.d.comb += [
            self.o.payload.data.eq(self.i.payload.data), self.o.payload.keep.eq(self.i.payload.keep),
            self.o.payload.last.eq(self.i.payload.last), self.o.payload.abort.eq(self.i.payload.first),
            self.o.valid.eq(self.i.valid), self.i.ready.eq(self.o.ready),
            self.rsp.payload.eq(self.cmd.payload.a ^ self.cmd.payload.ctx.y),
            self.rsp.valid.eq(self.cmd.valid), self.cmd.ready.eq(self.rsp.ready),
            self.count.eq(self.mac[:16]),
        ]
        return m


def test_port_names_and_lint():
    top = FlatTop(_Loop(), rename={"i": "payload", "o": "tx"})
    names = list(top.signature.members)
    assert names == [
        "s_axis_payload_tdata", "s_axis_payload_tkeep", "s_axis_payload_tlast",
        "s_axis_payload_tvalid", "s_axis_payload_tready",
        "m_axis_tx_tdata", "m_axis_tx_tkeep", "m_axis_tx_tlast", "m_axis_tx_tuser",
        "m_axis_tx_tvalid", "m_axis_tx_tready",
        "s_cmd_a", "s_cmd_ctx_x", "s_cmd_ctx_y", "s_cmd_valid", "s_cmd_ready",
        "m_rsp_data", "m_rsp_valid", "m_rsp_ready", "mac", "count"]
    lint(emit(top, "flat"), "flat")


def test_first_is_derived_from_tlast():
    top = FlatTop(_Loop(), rename={"i": "payload", "o": "tx"})
    rng = random.Random(5)
    beats = []   # (data, last)
    for _ in range(20):
        n = rng.randint(1, 4)
        beats += [(rng.getrandbits(64), int(k == n - 1)) for k in range(n)]
    seen = []

    async def producer(ctx):
        ctx.set(top.m_axis_tx_tready, 1)
        for d, last in beats:
            while rng.random() < 0.3:
                ctx.set(top.s_axis_payload_tvalid, 0)
                await ctx.tick()
            ctx.set(top.s_axis_payload_tdata, d)
            ctx.set(top.s_axis_payload_tkeep, 0xFF)
            ctx.set(top.s_axis_payload_tlast, last)
            ctx.set(top.s_axis_payload_tvalid, 1)
            _, _, first, data_ = await ctx.tick().sample(top.m_axis_tx_tuser, top.m_axis_tx_tdata)
            seen.append((data_, first))
        ctx.set(top.s_axis_payload_tvalid, 0)

    run_simulation(top, [producer], cycles=1000)
    expect_first = [1] + [beats[k - 1][1] for k in range(1, len(beats))]
    assert [s[0] for s in seen] == [b[0] for b in beats]
    assert [s[1] for s in seen] == expect_first


def test_rejects_non_stream_interfaces():
    class Bad(wiring.Component):
        bus: In(wiring.Signature({"x": Out(1)}))

        def elaborate(self, platform):
            return Module()

    with pytest.raises(TypeError, match="only streams"):
        FlatTop(Bad())


def test_side_streams_and_plain_ports_pass_through():
    """Nested fields of a non-packet stream land in the right inner field (``rsp`` is
    ``a ^ ctx.y``, so swapping ``ctx.x``/``ctx.y`` or the bit order would show), valid/ready
    go straight through in both directions, plain ports in and out."""
    top = FlatTop(_Loop())
    rng = random.Random(11)
    cases = [(rng.getrandbits(8), rng.getrandbits(3), rng.getrandbits(4), rng.getrandbits(48),
              rng.getrandbits(1), rng.getrandbits(1)) for _ in range(50)]
    checked = []

    async def tb(ctx):
        for a, x, y, mac, valid, ready in cases:
            ctx.set(top.s_cmd_a, a)
            ctx.set(top.s_cmd_ctx_x, x)
            ctx.set(top.s_cmd_ctx_y, y)
            ctx.set(top.s_cmd_valid, valid)
            ctx.set(top.m_rsp_ready, ready)
            ctx.set(top.mac, mac)
            assert ctx.get(top.m_rsp_data) == a ^ y
            assert ctx.get(top.m_rsp_valid) == valid
            assert ctx.get(top.s_cmd_ready) == ready
            assert ctx.get(top.count) == mac & 0xFFFF
            checked.append(a)
            await ctx.tick()

    run_simulation(top, [tb], cycles=200)
    assert len(checked) == len(cases)


def test_port_name_collisions_and_bad_rename_are_refused():
    class Clash(wiring.Component):
        def __init__(self):
            super().__init__({"a_b": In(stream.Signature(data.StructLayout({"c": 1}))),
                              "a": In(stream.Signature(data.StructLayout({"b_c": 1})))})

        def elaborate(self, platform):
            return Module()

    with pytest.raises(ValueError, match="s_a_b_c"):
        FlatTop(Clash())
    FlatTop(Clash(), rename={"a": "z"})          # renaming one side resolves it
    with pytest.raises(ValueError, match="not members"):
        FlatTop(_Loop(), rename={"nope": "x"})
