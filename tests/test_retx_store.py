# SPDX-License-Identifier: BSD-2-Clause
"""Retransmit store against its model and against the bytes the test wrote: random reserve /
write / read / free runs over many QPs with backpressure on ``rdata``, a pool that fills up,
a QP holding the whole pool, the per-QP cap, refusals, zero-length messages, reads from every
packet of multi-page messages at every PMTU, page reuse after many frees, latencies and the
parameter checks."""

import random

import pytest

from roce_hw.config import EngineConfig
from roce_hw.ctrl.retx_store import RetxStore, default_page_bytes
from roce_hw.model.retx_store import RetxStoreModel
from sim.harness import run_simulation
from sim.stream import PacketAssembler

__all__ = []

PMTUS = (256, 512, 1024, 2048, 4096)


# ---------------------------------------------------------------- the driver

class Bench:
    """Drivers of one store; ``cycle`` counts clock ticks (a process keeps it). Every
    transfer taken by the store's pool (a reserve, a free) and every payload packet started
    and read asked is logged with its cycle in ``log`` for the model's replay."""

    def __init__(self, dut, seed):
        self.dut = dut
        self.cycle = 0
        self.log = []
        self.rng = random.Random(seed)
        self.width = dut.rdata.payload.data.shape().width

    async def count(self, ctx):
        async for _ in ctx.tick():
            self.cycle += 1

    async def _put(self, ctx, s, payload, p_idle=0.0):
        while p_idle and self.rng.random() < p_idle:
            await ctx.tick()
        ctx.set(s.payload, payload)
        ctx.set(s.valid, 1)
        await ctx.tick().until(s.ready)
        ctx.set(s.valid, 0)

    async def reserve(self, ctx, qp, length, p_idle=0.0):
        await self._put(ctx, self.dut.reserve, {"qp": qp, "length": length}, p_idle)
        self.log.append((self.cycle, "reserve", (qp, length)))

    async def _take(self, ctx, s, p_stall):
        """One transfer from ``s`` (``ready`` low with probability ``p_stall`` per cycle);
        ``ready`` stays as it was in the transfer's cycle."""
        while True:
            ready = not (p_stall and self.rng.random() < p_stall)
            ctx.set(s.ready, ready)
            _, _, valid, payload = await ctx.tick().sample(s.valid, s.payload)
            if valid and ready:
                return payload

    async def grant(self, ctx, p_stall=0.0):
        g = await self._take(ctx, self.dut.grant, p_stall)
        ctx.set(self.dut.grant.ready, 0)
        return {"first": g.first, "last": g.last, "refused": g.refused, "empty": g.empty}

    async def free(self, ctx, first, last, p_idle=0.0):
        await self._put(ctx, self.dut.free, {"first": first, "last": last}, p_idle)
        self.log.append((self.cycle, "free", (first, last)))

    async def write(self, ctx, payload, p_idle=0.0):
        """One payload packet on ``wdata`` (``ready`` is 1: a beat per cycle unless idle);
        the lanes beyond ``keep`` carry junk."""
        n = self.width // 8
        s = self.dut.wdata
        assert ctx.get(s.ready) == 1
        chunks = [payload[i:i + n] for i in range(0, len(payload), n)]
        for k, c in enumerate(chunks):
            while p_idle and self.rng.random() < p_idle:
                ctx.set(s.valid, 0)
                await ctx.tick()
            word = int.from_bytes(c + self.rng.randbytes(n - len(c)), "little")
            ctx.set(s.payload, {"data": word, "keep": (1 << len(c)) - 1, "first": k == 0,
                                "last": k == len(chunks) - 1})
            ctx.set(s.valid, 1)
            if k == 0:
                self.log.append((self.cycle + 1, "write", bytes(payload)))
            await ctx.tick()
        ctx.set(s.valid, 0)

    async def read(self, ctx, first, start, length, p_stall=0.0, p_idle=0.0):
        """Ask for a read and return the packet's bytes (framing checked)."""
        await self._put(ctx, self.dut.read, {"first": first, "start": start,
                                             "length": length}, p_idle)
        self.log.append((self.cycle, "read", (first, start, length)))
        asm = PacketAssembler(self.width)
        while True:
            pkt = asm.add(await self._take(ctx, self.dut.rdata, p_stall))
            if pkt is not None:
                ctx.set(self.dut.rdata.ready, 0)
                return pkt

    def replay(self, model):
        """Feed the log to ``model`` in the store's order; returns the model's reads."""
        reads = []
        for _, what, arg in sorted(self.log, key=lambda e: e[0]):
            if what == "reserve":
                model.reserve(*arg)
            elif what == "free":
                model.free(*arg)
            elif what == "write":
                model.write(arg)
            else:
                reads.append(model.read(*arg))
        return reads


def make(width=64, n_qp=16, size=8192, page=256, cap=None, **kw):
    return RetxStore(EngineConfig(data_width=width, n_qp=n_qp), size_bytes=size,
                     page_bytes=page, qp_cap_bytes=cap, **kw)


def model_of(dut):
    return RetxStoreModel(dut.size_bytes, dut.page_bytes, dut.qp_cap_bytes,
                          max_read_bytes=dut.max_read_bytes)


def run(dut, bench, testbenches, cycles):
    run_simulation(dut, testbenches, [bench.count], cycles=cycles, vcd_name="retx_store")


# ---------------------------------------------------------------- random runs

def random_run(width, *, seed, n_msgs, n_qp=64, size=8192, page=256, cap=None, max_len=3000,
               p_stall=0.3, p_idle=0.2, p_read=0.4, hot=None, cycles=400_000):
    """Requests of random QPs and lengths (zero and too long among them); payloads written
    in grant order; a third process frees written messages in random order, reading each
    one (from a random PMTU-aligned start) before it frees it and reading others at random,
    with backpressure on ``rdata``. Every read is compared with the bytes written (the
    oracle) and with the model; the grants with the model's."""
    dut = make(width, n_qp, size, page, cap)
    b = Bench(dut, seed)
    rng = random.Random(seed)
    hot = hot or list(range(n_qp))
    reqs = []
    for _ in range(n_msgs):
        r = rng.random()
        length = 0 if r < 0.05 else size + rng.randrange(1, 3000) if r < 0.08 \
            else rng.randrange(1, max_len + 1)
        qp = rng.choice(hot) if rng.random() < 0.8 else rng.randrange(n_qp)
        reqs.append((qp, length))
    payloads = [rng.randbytes(length) if length <= size else b"" for _, length in reqs]
    st = {"grants": [], "to_write": [], "written": [], "reqs_done": False, "ops_done": False,
          "reads": 0, "frees": 0, "max_used": 0, "full_waits": 0}
    checks = []

    async def requester(ctx):
        for qp, length in reqs:
            await b.reserve(ctx, qp, length, p_idle)
        st["reqs_done"] = True

    async def granter(ctx):
        for k in range(len(reqs)):
            g = await b.grant(ctx, p_stall)
            st["grants"].append(g)
            if not (g["refused"] or g["empty"]):
                st["to_write"].append((k, g))
            st["max_used"] = max(st["max_used"], dut.n_pages - ctx.get(dut.free_pages))

    async def writer(ctx):
        done = 0
        while done < len(reqs):
            if not st["to_write"]:
                await ctx.tick()
                done = len(st["grants"]) if len(st["grants"]) == len(reqs) and \
                    not st["to_write"] else done
                continue
            k, g = st["to_write"].pop(0)
            await b.write(ctx, payloads[k], p_idle)
            st["written"].append((k, g))
        st["writes_done"] = True

    async def ops(ctx):
        orng = random.Random(seed + 7)
        while not (st.get("writes_done") and not st["written"]):
            if not st["written"]:
                await ctx.tick()
                continue
            j = orng.randrange(len(st["written"]))
            k, g = st["written"][j]
            length = len(payloads[k])
            start = orng.choice([s for s in range(0, length, orng.choice(PMTUS))][:64])
            got = await b.read(ctx, g["first"], start, length, p_stall, p_idle)
            checks.append((got, payloads[k][start:]))
            st["reads"] += 1
            if orng.random() > p_read:
                st["written"].pop(j)
                await b.free(ctx, g["first"], g["last"], p_idle)
                st["frees"] += 1
        st["ops_done"] = True

    run(dut, b, [requester, granter, writer, ops], cycles)
    for got, want in checks:
        assert got == want
    model = model_of(dut)
    model_reads = b.replay(model)
    assert st["grants"] == model.grants()
    assert model_reads == [got for got, _ in checks]
    assert model.free_pages == dut.n_pages and model.dropped_bytes == 0
    return st, reqs


@pytest.mark.parametrize("width", [64, 512])
def test_random_many_qps(width):
    st, reqs = random_run(width, seed=width, n_msgs=120)
    refused = sum(g["refused"] for g in st["grants"])
    assert refused == sum(1 for _, n in reqs if n > 8192) > 0
    assert sum(g["empty"] for g in st["grants"]) == sum(1 for _, n in reqs if n == 0) > 0
    # the pool was full at times (requests waited), every page was used, all came back
    assert st["max_used"] >= 28


def test_random_cap_and_hot_qps():
    """Three busy QPs with a cap of a quarter of the pool, other QPs now and then."""
    st, reqs = random_run(128, seed=5, n_msgs=100, cap=2048, hot=[1, 2, 3])
    assert sum(g["refused"] for g in st["grants"]) == \
        sum(1 for _, n in reqs if n > 2048)


@pytest.mark.slow
@pytest.mark.parametrize("width", [64, 256, 1024])
@pytest.mark.parametrize("seed", [11, 12])
def test_random_long(width, seed):
    random_run(width, seed=seed, n_msgs=400, size=16384, page=512, max_len=6000,
               cycles=2_000_000)


# ---------------------------------------------------------------- directed cases

def test_pool_full_waits_nothing_overwritten():
    """32 one-page messages fill the pool; the 33rd (and a request behind it) waits until one
    is freed, then takes exactly the page freed; nothing written before is changed."""
    dut = make(64, size=8192, page=256)
    b = Bench(dut, 1)
    rng = random.Random(1)
    data = [rng.randbytes(rng.randrange(1, 257)) for _ in range(34)]
    grants = []

    async def tb(ctx):
        for k in range(32):
            await b.reserve(ctx, k % 3, len(data[k]))
            grants.append(await b.grant(ctx))
            await b.write(ctx, data[k])
        assert sorted(g["first"] for g in grants) == list(range(32))
        assert ctx.get(dut.free_pages) == 0
        await b.reserve(ctx, 5, len(data[32]))
        ctx.set(dut.grant.ready, 1)
        for _ in range(300):
            await ctx.tick()
            assert not ctx.get(dut.grant.valid)
        assert not ctx.get(dut.reserve.ready)        # the next request waits behind it
        ctx.set(dut.grant.ready, 0)
        victim = grants[17]
        await b.free(ctx, victim["first"], victim["last"])
        g = await b.grant(ctx)
        assert (g["first"], g["last"]) == (victim["first"], victim["first"])
        await b.write(ctx, data[32])
        for k, gk in enumerate(grants):
            if k != 17:
                assert await b.read(ctx, gk["first"], 0, len(data[k]), p_stall=0.3) == data[k]
        assert await b.read(ctx, g["first"], 0, len(data[32])) == data[32]

    run(dut, b, [tb], 60_000)


@pytest.mark.parametrize("width", [64, 512])
def test_one_qp_uses_the_whole_pool(width):
    """One QP reserves the whole pool (one message of every page, then many small ones) and
    is granted; a message of the pool's size plus one byte is refused at once, a message of
    size_bytes is not."""
    dut = make(width, size=4096, page=256)
    b = Bench(dut, 2)
    rng = random.Random(2)

    async def tb(ctx):
        big = rng.randbytes(4096)
        await b.reserve(ctx, 3, 4097)
        t0 = b.cycle
        assert (await b.grant(ctx))["refused"] == 1
        assert b.cycle - t0 <= 6
        await b.reserve(ctx, 3, 4096)
        g = await b.grant(ctx)
        assert not g["refused"] and ctx.get(dut.free_pages) == 0
        await b.write(ctx, big)
        for start in range(0, 4096, 256):
            assert await b.read(ctx, g["first"], start, 4096, p_stall=0.5) == big[start:]
        await b.free(ctx, g["first"], g["last"])
        await ctx.tick()
        await ctx.tick()                              # (a free takes 3 cycles)
        assert ctx.get(dut.free_pages) == 16
        gs = []
        for k in range(16):
            await b.reserve(ctx, 3, 200)
            gs.append(await b.grant(ctx))
        assert len({g["first"] for g in gs}) == 16 and ctx.get(dut.free_pages) == 0

    run(dut, b, [tb], 40_000)


def test_qp_cap():
    """Cap of 1 KiB (4 pages): QP 0 holds 3 pages, its 2-page request waits, and so does
    QP 1's request behind it (strict order), until QP 0 frees; a request above the cap is
    refused at once while the pool has room; another QP is not limited by QP 0's pages."""
    dut = make(64, size=8192, page=256, cap=1024)
    b = Bench(dut, 3)

    async def tb(ctx):
        await b.reserve(ctx, 0, 1025)
        assert (await b.grant(ctx))["refused"] == 1
        await b.reserve(ctx, 0, 700)                 # 3 pages
        g0 = await b.grant(ctx)
        await b.write(ctx, bytes(700))
        await b.reserve(ctx, 1, 1024)                # QP 1: its own 4 pages
        g1 = await b.grant(ctx)
        await b.write(ctx, bytes(1024))
        assert ctx.get(dut.free_pages) == 32 - 7
        await b.reserve(ctx, 0, 300)                 # 2 pages: 5 > 4, waits
        ctx.set(dut.grant.ready, 1)
        for _ in range(200):
            await ctx.tick()
            assert not ctx.get(dut.grant.valid)
        ctx.set(dut.grant.ready, 0)
        await b.free(ctx, g1["first"], g1["last"])   # another QP's free: still waits
        ctx.set(dut.grant.ready, 1)
        for _ in range(50):
            await ctx.tick()
            assert not ctx.get(dut.grant.valid)
        ctx.set(dut.grant.ready, 0)
        await b.free(ctx, g0["first"], g0["last"])
        g = await b.grant(ctx)
        assert not g["refused"] and not g["empty"]
        await b.write(ctx, bytes(300))
        await b.reserve(ctx, 0, 512)                 # 2 + 2 = 4 pages: fits the cap
        assert not (await b.grant(ctx))["refused"]

    run(dut, b, [tb], 20_000)


def test_zero_length_takes_no_page():
    dut = make(64, size=1024, page=256)
    b = Bench(dut, 4)

    async def tb(ctx):
        for _ in range(6):
            await b.reserve(ctx, 0, 0)
            assert await b.grant(ctx) == {"first": 0, "last": 0, "refused": 0, "empty": 1}
        assert ctx.get(dut.free_pages) == 4
        await b.reserve(ctx, 0, 1024)
        g = await b.grant(ctx)
        assert (g["first"], g["last"], g["refused"], g["empty"]) == (0, 3, 0, 0)
        # no payload packet for the empty ones: this one is the 1024-byte message's
        await b.write(ctx, bytes(range(256)) * 4)
        assert await b.read(ctx, 0, 768, 1024) == bytes(range(256))

    run(dut, b, [tb], 10_000)


@pytest.mark.parametrize("width,page", [(64, 256), (512, 1024), (1024, 4096)])
def test_read_every_packet_every_pmtu(width, page):
    """Messages of several pages (sizes around page and PMTU multiples): a read from every
    packet of each at every PMTU gives the message's bytes from there; junk in ``wdata``'s
    unused lanes never shows."""
    dut = make(width, size=8 * page, page=page)
    b = Bench(dut, width)
    rng = random.Random(width)
    lengths = [3 * page + 1, 2 * page, page - 1, 5 * page + width // 8 + 3]

    async def tb(ctx):
        for length in lengths:
            data = rng.randbytes(length)
            await b.reserve(ctx, 1, length)
            g = await b.grant(ctx)
            await b.write(ctx, data, p_idle=0.2)
            for pmtu in PMTUS:
                for start in range(0, length, pmtu):
                    got = await b.read(ctx, g["first"], start, length, p_stall=0.2)
                    assert got == data[start:], (length, pmtu, start)
            await b.free(ctx, g["first"], g["last"])

    run(dut, b, [tb], 200_000)


def test_reuse_after_many_frees():
    """Pages cycle through the free list hundreds of times (messages of 1-3 pages, freed in a
    shuffled order, two live at a time, in a pool of 10 pages: not a power of two); the
    grants follow the model's free list and every message reads back whole before its free."""
    dut = make(64, size=2560, page=256)
    b = Bench(dut, 6)
    rng = random.Random(6)
    grants = []

    async def tb(ctx):
        live = []
        for k in range(300):
            data = rng.randbytes(rng.randrange(1, 769))
            await b.reserve(ctx, k % 7, len(data))
            g = await b.grant(ctx)
            grants.append(g)
            await b.write(ctx, data)
            live.append((g, data))
            if len(live) > 2:
                g, data = live.pop(rng.randrange(len(live)))
                assert await b.read(ctx, g["first"], 0, len(data)) == data
                await b.free(ctx, g["first"], g["last"])

    run(dut, b, [tb], 300_000)
    model = model_of(dut)
    b.replay(model)
    assert grants == model.grants()
    assert len({g["first"] for g in grants}) == 10


def test_bad_inputs_dropped_and_counted():
    """A payload with no grant and the beats beyond a reservation are dropped (counted) and
    nothing outside the reservation is written; reads that are not PMTU-aligned, start at or
    past the end, or are longer than the store are refused (counted) and give no packet."""
    dut = make(64, size=1024, page=256)
    b = Bench(dut, 7)

    async def tb(ctx):
        await b.write(ctx, bytes(24))                 # no grant: 3 beats dropped
        await b.reserve(ctx, 0, 256)
        ga = await b.grant(ctx)
        await b.reserve(ctx, 0, 512)
        gb = await b.grant(ctx)
        await b.write(ctx, b"\x11" * 264)             # one beat beyond its page
        await b.write(ctx, b"\x22" * 512)
        await ctx.tick()
        assert ctx.get(dut.wdata_dropped) == 4
        assert await b.read(ctx, ga["first"], 0, 256) == b"\x11" * 256
        assert await b.read(ctx, gb["first"], 0, 512) == b"\x22" * 512
        for start, length in [(128, 512), (512, 512), (768, 512), (0, 2048)]:
            await b._put(ctx, dut.read, {"first": gb["first"], "start": start,
                                         "length": length})
            for _ in range(20):
                await ctx.tick()
                assert not ctx.get(dut.rdata.valid)
        assert ctx.get(dut.reads_refused) == 4

    run(dut, b, [tb], 5_000)


def test_latencies():
    """The figures of the docstring: a grant k + 4 cycles after a request that fits
    (refused/empty: 4), a free every 3 cycles, a read's first beat s + 4 cycles after its
    request (s = start // page_bytes), then one beat per cycle; the payload may start in the
    cycle its grant is taken."""
    dut = make(64, size=8192, page=256)
    b = Bench(dut, 8)
    data = bytes(range(256)) * 12

    async def tb(ctx):
        ctx.set(dut.grant.ready, 1)
        for k, length in [(1, 1), (3, 700), (12, 3072), (0, 0), (0, 9000)]:
            await b.reserve(ctx, 2, length)
            t0 = b.cycle
            await ctx.tick().until(dut.grant.valid)
            assert b.cycle - t0 == k + 4, (length, b.cycle - t0)
            await ctx.tick()
        g12 = {"first": 4, "last": 15}
        ctx.set(dut.grant.ready, 0)
        await b.write(ctx, bytes(1))
        await b.write(ctx, bytes(700))
        await b.write(ctx, data)
        ctx.set(dut.rdata.ready, 1)
        for s in range(0, 12, 5):
            await b._put(ctx, dut.read, {"first": g12["first"], "start": 256 * s,
                                         "length": 3072})
            t0 = b.cycle
            await ctx.tick().until(dut.rdata.valid)
            assert b.cycle - t0 == max(5, s + 3), (s, b.cycle - t0)
            # (the first beat left at that edge; the ones after follow one per cycle)
            beats = 1
            while True:
                assert ctx.get(dut.rdata.valid)
                beats += 1
                last = ctx.get(dut.rdata.payload.last)
                await ctx.tick()
                if last:
                    break
            assert beats == (3072 - 256 * s) // 8
        # frees back to back
        t0 = b.cycle
        await b.free(ctx, 0, 0)
        await b.free(ctx, 1, 3)
        await b.free(ctx, 4, 15)
        assert b.cycle - t0 == 7
        await ctx.tick()
        await ctx.tick()
        assert ctx.get(dut.free_pages) == 32

    run(dut, b, [tb], 5_000)


def test_payload_right_after_grant():
    """Grant taken and payload's first beat in the next cycle, back-to-back one-beat
    packets: every one lands in its own page."""
    dut = make(512, size=2048, page=256)
    b = Bench(dut, 9)

    async def tb(ctx):
        grants = []
        for k in range(8):
            await b.reserve(ctx, k, 64)
            grants.append(await b.grant(ctx))
            # (the grant's transfer was at the edge just passed: the beat goes now)
            await b.write(ctx, bytes([k]) * 64)
        for k, g in enumerate(grants):
            assert await b.read(ctx, g["first"], 0, 64) == bytes([k]) * 64

    run(dut, b, [tb], 5_000)


# ---------------------------------------------------------------- parameters

def test_parameters():
    cfg = EngineConfig(data_width=64)
    assert default_page_bytes(131072) == 512
    assert default_page_bytes(8192) == 256
    assert default_page_bytes(16 << 20) == 4096
    assert RetxStore(cfg, size_bytes=131072).n_pages == 256
    for kw, msg in [({"size_bytes": 1000, "page_bytes": 256}, "whole number of pages"),
                    ({"size_bytes": 4096, "page_bytes": 384}, "power of two"),
                    ({"size_bytes": 4096, "page_bytes": 128}, "power of two from 256"),
                    ({"size_bytes": 16384, "page_bytes": 8192}, "to 4096"),
                    ({"size_bytes": 0}, "size_bytes must be"),
                    ({"size_bytes": 4096, "qp_cap_bytes": 100}, "qp_cap_bytes"),
                    ({"size_bytes": 4096, "qp_cap_bytes": 8192}, "qp_cap_bytes"),
                    ({"size_bytes": 4096, "write_queue": 1}, "write_queue")]:
        with pytest.raises(ValueError, match=msg):
            RetxStore(cfg, **kw)
    with pytest.raises(TypeError):
        RetxStore(None, size_bytes=4096)


def test_model_rules():
    """The model alone on a hand-made case: order of the free list, waiting, the cap."""
    m = RetxStoreModel(1024, 256, 512)
    m.reserve(0, 600)                                 # 3 pages > cap 2: refused
    m.reserve(0, 512)                                 # pages 0, 1
    m.reserve(1, 300)                                 # pages 2, 3
    m.reserve(0, 1)                                   # cap: waits
    m.reserve(1, 0)                                   # behind it: waits
    assert m.grants() == [{"first": 0, "last": 0, "refused": 1, "empty": 0},
                          {"first": 0, "last": 1, "refused": 0, "empty": 0},
                          {"first": 2, "last": 3, "refused": 0, "empty": 0}]
    m.write(b"a" * 512)
    m.write(b"b" * 300)
    m.free(2, 3)
    assert len(m.grants()) == 3                       # QP 0 still at its cap
    m.free(0, 1)
    assert m.grants()[3:] == [{"first": 2, "last": 2, "refused": 0, "empty": 0},
                              {"first": 0, "last": 0, "refused": 0, "empty": 1}]
    assert list(m.free_list) == [3, 0, 1]
