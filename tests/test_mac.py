# SPDX-License-Identifier: BSD-2-Clause
"""The 1G MAC (roce_hw.mac) in simulation through a model of the RGMII wires (sim/rgmii.py):
frames through the transmitter, the wires and the receiver come back byte for byte; the FCS on
the wire is ``zlib.crc32``'s; bad frames are dropped and counted by reason; the inter-frame gap
and the line rate are measured on the wire."""

import random

import pytest
from amaranth import ClockDomain, Elaboratable, Module
from amaranth.lib import wiring

from roce_hw import proto
from roce_hw.lib.crc import apply_rows, crc_bits, update_rows
from roce_hw.mac.cdc import RxFrameCdc
from roce_hw.mac.mac import Mac1G
from roce_hw.mac.rgmii import RgmiiPhy, delay_taps
from roce_hw.mac.tx import TxMac
from sim.harness import CLOCK_PERIOD, run_simulation
from sim.rgmii import PREAMBLE, RgmiiLink, WireFrame, decode, fcs_of, wire_frame
from sim.stream import PacketAssembler, send_packet

#: The PHY's receive clock: the same 125 MHz as ``sync`` here, another phase (a real PHY's is
#: within 100 ppm); ``cycles`` of the harness count ``sync`` periods.
RX_CLOCK = {"eth_rx": (CLOCK_PERIOD, CLOCK_PERIOD * 0.37)}


class MacBench(Elaboratable):
    """Mac1G behind an RgmiiPhy without pads (the DDR wires are the model's); with ``tx_domain``
    the transmitter and the wires run in ``eth_tx`` (and ``sync``, the engine's side, at
    another clock)."""

    def __init__(self, width=64, tx_domain="sync", **kw):
        self.mac = Mac1G(width, tx_domain=tx_domain, **kw)
        self.phy = RgmiiPhy(tx_domain=tx_domain)
        self._tx_domain = tx_domain

    def elaborate(self, platform):
        m = Module()
        m.domains.eth_rx = ClockDomain("eth_rx")
        if self._tx_domain != "sync":
            m.domains.eth_tx = ClockDomain(self._tx_domain)
        m.submodules.mac, m.submodules.phy = self.mac, self.phy
        m.d.comb += [self.phy.gmii_tx.eq(self.mac.gmii_tx), self.mac.gmii_rx.eq(self.phy.gmii_rx)]
        return m


def padded(frame):
    return frame + bytes(max(0, proto.ETH_MIN_FRAME - len(frame)))


def random_frames(rng, lengths):
    return [bytes(rng.getrandbits(8) for _ in range(n)) for n in lengths]


async def collect(ctx, s, width, out, count, *, ready=lambda: True):
    """Take frames from ``s`` into ``out`` as ``(bytes, abort)`` until there are ``count``."""
    asm = PacketAssembler(width)
    while len(out) < count:
        r = ready()
        ctx.set(s.ready, r)
        _, _, valid, p = await ctx.tick().sample(s.valid, s.payload)
        if valid and r:
            pkt = asm.add(p)
            if pkt is not None:
                out.append((pkt, bool(p.abort)))


def run_bench(bench, frames, *, width, expect, link_kw=None, cycles=None, rx_ready=None,
              tx_gap=0, clocks=RX_CLOCK):
    """Send ``frames`` (bytes, or ``(bytes, abort)``) on the MAC's ``tx``; collect ``expect``
    frames from ``rx``; return ``(received, link, counters)``."""
    mac = bench.mac
    link = RgmiiLink(bench.phy.ddr_tx, bench.phy.ddr_rx, **(link_kw or {"loopback": True}))
    received, counters = [], {}
    total = sum(len(f if isinstance(f, bytes) else f[0]) + 40 for f in frames)

    async def source(ctx):
        rng = random.Random(7)
        for f in frames:
            data, abort = (f, False) if isinstance(f, bytes) else f
            beats = -(-len(data) // (width // 8))
            for k in range(beats):
                chunk = data[k * (width // 8):(k + 1) * (width // 8)]
                ctx.set(mac.tx.payload, {"data": int.from_bytes(chunk, "little"),
                                         "keep": (1 << len(chunk)) - 1, "first": k == 0,
                                         "last": k == beats - 1,
                                         "abort": abort and k == beats - 1})
                ctx.set(mac.tx.valid, 1)
                await ctx.tick().until(mac.tx.ready)
            ctx.set(mac.tx.valid, 0)
            for _ in range(tx_gap):
                await ctx.tick()
        del rng

    async def sink(ctx):
        await collect(ctx, mac.rx, width, received, expect,
                      ready=rx_ready or (lambda: True))
        # let the counters settle (the receive ones are a few cycles behind)
        for _ in range(40):
            await ctx.tick()
        for group in ("tx", "rx"):
            for name in getattr(mac.counters, group).shape().members:
                counters[f"{group}_{name}"] = ctx.get(getattr(getattr(mac.counters, group),
                                                              name))

    run_simulation(bench, [source, sink], [link.monitor_tx, link.drive_rx],
                   cycles=cycles or 2 * total + 2000, clocks=clocks)
    return received, link, counters


#: The board tops' clocks: the engine's side (``sync``) at half the line's 125 MHz, the
#: transmitter in ``eth_tx``, the PHY's receive clock at another phase.
BOARD_CLOCKS = {"eth_tx": (CLOCK_PERIOD / 2, CLOCK_PERIOD * 0.13),
                "eth_rx": (CLOCK_PERIOD / 2, CLOCK_PERIOD * 0.37)}


@pytest.mark.parametrize("width,seed,tx_domain", [(64, 0, "sync"), (64, 1, "sync"),
                                                  (256, 2, "sync"), (64, 3, "eth_tx")])
def test_loopback_byte_identical(width, seed, tx_domain):
    """Random frames of 14 to 2000 bytes (every length class: below the 60-byte minimum, at
    it, the 1514/1518-byte maxima, beyond) through TX MAC -> RGMII wires -> RX MAC, back to
    back: each comes back byte for byte (padded to 60 bytes), its wire image has the preamble,
    the SFD and ``zlib.crc32``'s FCS, and consecutive frames start exactly ``L + 8 + 4 + 12``
    byte times apart (1 Gb/s at 125 MHz, 12 idle cycles between frames) whenever the next frame
    is in the store-and-forward FIFO in time (it is no longer than the one before), and never
    closer. With ``eth_tx``: the engine's side at half the line's clock, through the transmit
    crossing, the same."""
    rng = random.Random(seed)
    lengths = [14, 59, 60, 61, 64, 1514, 1518, 2000] + [rng.randrange(14, 1519) for _ in range(4)]
    rng.shuffle(lengths)
    frames = random_frames(rng, lengths)
    bench = MacBench(width, tx_domain, tx_fifo_depth=Mac1G.fifo_depth_for(2048, width))
    link_kw = {"loopback": True, "tx_domain": tx_domain}
    received, link, c = run_bench(bench, frames, width=width, expect=len(frames),
                                  link_kw=link_kw,
                                  clocks=RX_CLOCK if tx_domain == "sync" else BOARD_CLOCKS)

    assert [f for f, _ in received] == [padded(f) for f in frames]
    assert not any(abort for _, abort in received)
    assert len(link.sent) == len(frames)
    for wf, f in zip(link.sent, frames):
        assert wf.raw[:8] == PREAMBLE
        assert wf.raw[8:-4] == padded(f)
        assert wf.raw[-4:] == fcs_of(padded(f))
        assert decode(wf) == (padded(f), True)
    exact = 0
    for prev, nxt, f, g in zip(link.sent, link.sent[1:], frames, frames[1:]):
        assert nxt.start - prev.start >= len(padded(f)) + 8 + 4 + 12
        assert nxt.start - prev.end - 1 >= proto.ETH_IFG_BYTES
        # store and forward: the next frame is whole in the FIFO in time when it is no longer
        if len(g) <= len(f):
            assert nxt.start - prev.start == len(padded(f)) + 8 + 4 + 12
            assert nxt.start - prev.end - 1 == proto.ETH_IFG_BYTES
            exact += 1
    assert exact >= 3
    n = len(frames)
    assert (c["tx_frames"], c["tx_aborted"], c["tx_underruns"], c["tx_fifo_dropped"]) == \
        (n, 0, 0, 0)
    assert (c["rx_frames"], c["rx_bad_fcs"], c["rx_runt"], c["rx_bad_preamble"],
            c["rx_phy_error"], c["rx_overflow"]) == (n, 0, 0, 0, 0, 0)


def test_bad_frames_dropped_and_counted():
    """Frames driven on the receive wires: good ones pass (also with a shortened preamble);
    a bad FCS, runts (a 63-byte frame with its FCS, a 3-byte one), a wrong SFD, a wrong
    preamble byte, a frame that ends inside its preamble and one with RX_ER are dropped (those
    already under way end with ``abort``, the others never show) and each is counted by its
    reason."""
    rng = random.Random(11)
    good = random_frames(rng, [60, 100, 64, 1514, 77])
    bad_fcs = bytearray(fcs_of(good[1]))
    bad_fcs[2] ^= 0x10
    runt = bytes(rng.getrandbits(8) for _ in range(59))        # 63 bytes with its FCS
    wires = [
        wire_frame(good[0]),
        wire_frame(good[1], fcs=bad_fcs),                        # bad FCS
        wire_frame(runt),                                        # runt
        WireFrame(PREAMBLE + b"\x01\x02\x03"),                   # runt, nothing passed on
        wire_frame(good[2], preamble=PREAMBLE[:-1] + b"\xd4"),   # wrong SFD
        wire_frame(good[2], preamble=b"\x55\x55\x54" + PREAMBLE[3:]),   # wrong preamble byte
        WireFrame(PREAMBLE[:5]),                                 # ends inside the preamble
        wire_frame(good[1], errors={30}),                        # RX_ER
        wire_frame(good[2], preamble=b"\x55\x55\xd5"),           # short preamble: good
        wire_frame(good[3]),
        wire_frame(good[4]),
    ]
    expect_good = [good[0], good[2], good[3], good[4]]
    shown = 4 + 3       # good ones + bad FCS, runt, RX_ER (the others never start)
    bench = MacBench(64)
    link_kw = {"loopback": False}
    mac = bench.mac
    link = RgmiiLink(bench.phy.ddr_tx, bench.phy.ddr_rx, **link_kw)
    for wf in wires:
        link.send(wf)
    received, counters = [], {}

    async def sink(ctx):
        ctx.set(mac.tx.valid, 0)
        await collect(ctx, mac.rx, 64, received, shown)
        for _ in range(60):
            await ctx.tick()
        for name in proto.MAC_RX_COUNTERS:
            counters[name] = ctx.get(getattr(mac.counters.rx, name))

    run_simulation(bench, [sink], [link.monitor_tx, link.drive_rx], cycles=6000, clocks=RX_CLOCK)
    assert [f for f, abort in received if not abort] == expect_good
    aborted = [f for f, abort in received if abort]
    assert len(aborted) == 3
    assert aborted[0] == good[1] and aborted[1] == runt and aborted[2] == good[1]
    assert counters == {"frames": 4, "bad_fcs": 1, "runt": 2, "bad_preamble": 3,
                        "phy_error": 1, "overflow": 0}
    assert link.sent == []


class TxBench(Elaboratable):
    def __init__(self):
        self.tx = TxMac()

    def elaborate(self, platform):
        m = Module()
        m.submodules.tx = self.tx
        return m


def test_tx_abort_and_underrun():
    """The transmitter alone: a frame with ``abort`` goes out with the inverted FCS; a frame
    whose bytes pause is ended at the pause with the inverted FCS of what was sent (underrun)
    and the rest of it is discarded; the frames after each are sent right; the counters say
    so."""
    rng = random.Random(5)
    frames = random_frames(rng, [80, 70, 90, 65])
    dut = TxBench()
    tx = dut.tx
    wire, counters = [], {}

    async def source(ctx):
        for idx, f in enumerate(frames):
            for k, byte in enumerate(f):
                if idx == 2 and k == 40:            # underrun: a pause inside the frame
                    ctx.set(tx.i.valid, 0)
                    for _ in range(3):
                        await ctx.tick()
                ctx.set(tx.i.payload, {"data": byte, "first": k == 0, "last": k == len(f) - 1,
                                       "abort": idx == 1 and k == len(f) - 1})
                ctx.set(tx.i.valid, 1)
                await ctx.tick().until(tx.i.ready)
            ctx.set(tx.i.valid, 0)
        for _ in range(200):
            await ctx.tick()
        for name in proto.MAC_TX_COUNTERS:
            counters[name] = ctx.get(getattr(tx.counters, name))

    async def monitor(ctx):
        cur = None
        async for _, _, en, er, data in ctx.tick().sample(tx.gmii.en, tx.gmii.er, tx.gmii.data):
            assert not er
            if en:
                cur = (cur or bytearray()) + bytes([data])
            elif cur is not None:
                wire.append(bytes(cur))
                cur = None

    run_simulation(dut, [source], [monitor], cycles=3000)
    assert len(wire) == 4
    got = [decode(WireFrame(w)) for w in wire]
    assert got[0] == (frames[0], True) and got[3] == (frames[3], True)
    # abort: the whole frame, FCS inverted
    assert wire[1][8:-4] == frames[1]
    assert wire[1][-4:] == bytes(b ^ 0xFF for b in fcs_of(frames[1]))
    # underrun: the first 40 bytes, then the inverted FCS of those
    assert wire[2][8:-4] == frames[2][:40]
    assert wire[2][-4:] == bytes(b ^ 0xFF for b in fcs_of(frames[2][:40]))
    assert counters == {"frames": 2, "aborted": 1, "underruns": 1}


def test_tx_fifo_drops_aborted_frames():
    """Through the whole MAC an aborted frame is dropped in the transmit FIFO: never on the
    wire, counted in ``tx.fifo_dropped``; the frames around it pass."""
    rng = random.Random(3)
    frames = random_frames(rng, [100, 200, 70])
    bench = MacBench(64)
    received, link, c = run_bench(bench, [frames[0], (frames[1], True), frames[2]], width=64,
                                  expect=2)
    assert [f for f, _ in received] == [frames[0], frames[2]]
    assert [decode(wf) for wf in link.sent] == [(frames[0], True), (frames[2], True)]
    assert (c["tx_frames"], c["tx_aborted"], c["tx_fifo_dropped"]) == (2, 0, 1)


def test_rx_overflow_cuts_and_counts():
    """The engine side stops taking frames (``rx.ready`` low from cycle 150 to 699) while frames
    arrive: the crossing's 4-beat FIFO overflows. Every frame delivered is whole and right or
    ends in ``abort``; none runs into the next; every frame is good at the receiver
    (``frames``), the ones the crossing lost are counted in ``overflow``."""
    rng = random.Random(9)
    frames = random_frames(rng, [300, 120, 90, 200, 64, 150])
    bench = MacBench(64, rx_fifo_depth=4)
    mac = bench.mac
    link = RgmiiLink(bench.phy.ddr_tx, bench.phy.ddr_rx, loopback=False)
    for f in frames:
        link.send(f)
    received, counters = [], {}

    async def sink(ctx):
        asm = PacketAssembler(64)
        for cycle in range(2500):
            ready = not 150 <= cycle < 700
            ctx.set(mac.rx.ready, ready)
            _, _, valid, p = await ctx.tick().sample(mac.rx.valid, mac.rx.payload)
            if valid and ready:
                pkt = asm.add(p)
                if pkt is not None:
                    received.append((pkt, bool(p.abort)))
        for name in proto.MAC_RX_COUNTERS:
            counters[name] = ctx.get(getattr(mac.counters.rx, name))

    run_simulation(bench, [sink], [link.monitor_tx, link.drive_rx], cycles=3000, clocks=RX_CLOCK)
    good = [f for f, abort in received if not abort]
    cut = [f for f, abort in received if abort]
    assert good and all(f in frames for f in good)
    # a frame cut short: its beats up to the overflow, then the terminating beat's one byte
    assert cut and all(any(g.startswith(f[:-1]) for g in frames) for f in cut)
    assert counters["overflow"] >= 1
    assert counters["frames"] == len(frames)
    assert len(good) == len(frames) - counters["overflow"]


def test_delay_taps():
    """LiteEth's 2 ns RGMII skew is 80 taps of 25 ps; out of range is refused."""
    assert delay_taps(2.0) == 80 and delay_taps(0) == 0
    with pytest.raises(ValueError):
        delay_taps(3.3)


def test_crc_rows_match_zlib():
    """The byte-serial update matrix the MAC uses ends at ``zlib.crc32`` (an independent
    oracle), and the bit-serial reference agrees with it."""
    import zlib
    rng = random.Random(1)
    msg = bytes(rng.getrandbits(8) for _ in range(100))
    rows = update_rows(8)
    r = s = 0xFFFFFFFF
    for b in msg:
        r = apply_rows(rows, r | b << 32)
        s = crc_bits(s, b, 8)
    assert r == s and r ^ 0xFFFFFFFF == zlib.crc32(msg)


def test_cdc_rejects_bad_depth():
    with pytest.raises(ValueError, match="power of 2"):
        RxFrameCdc(64, 6)


def test_tx_latency_is_documented():
    """Mac1G's transmit latency as its docstring states it: the first preamble byte on
    ``gmii_tx`` in cycle ``t + 4``, ``t`` the cycle the frame's last beat is transferred on
    ``tx`` (FIFO empty, line idle); the first frame byte 8 cycles after that."""
    frame = bytes(range(100))
    bench = MacBench(64)
    mac = bench.mac
    seen = {}

    async def bench_tb(ctx):
        beats = -(-len(frame) // 8)
        for _ in range(20):                  # the line idle, the gap over
            await ctx.tick()
        cycle = 0
        for k in range(beats):
            chunk = frame[8 * k:8 * k + 8]
            ctx.set(mac.tx.payload, {"data": int.from_bytes(chunk, "little"),
                                     "keep": (1 << len(chunk)) - 1, "first": k == 0,
                                     "last": k == beats - 1})
            ctx.set(mac.tx.valid, 1)
            await ctx.tick().until(mac.tx.ready)
            cycle += 1
        ctx.set(mac.tx.valid, 0)
        last_in = cycle
        while "pre" not in seen or "data" not in seen:
            await ctx.tick()
            cycle += 1
            en, data = ctx.get(mac.gmii_tx.en), ctx.get(mac.gmii_tx.data)
            if en and "pre" not in seen:
                seen["pre"] = cycle - last_in
            if en and data == frame[0] and "data" not in seen and "pre" in seen and \
                    cycle - last_in - seen["pre"] == 8:
                seen["data"] = cycle - last_in

    run_simulation(bench, [bench_tb], cycles=400, clocks=RX_CLOCK)
    assert seen == {"pre": 4, "data": 12}
