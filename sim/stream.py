# SPDX-License-Identifier: BSD-2-Clause
"""Async stream bus-functional models for ``amaranth.sim`` testbenches.

Producers insert seeded random idle cycles *between* transfers only (a stream may not drop
``valid`` once raised); consumers apply seeded random backpressure. Use one testbench per
producer and one per consumer.
"""

__all__ = ["beats_of", "framing_error", "stream_put", "stream_get", "send_packet", "recv_packet",
           "PacketAssembler", "collect_valid"]


def beats_of(pkt, width):
    """Split ``pkt`` bytes into bus beats: list of ``dict(data, keep, first, last)``.
    An empty packet is not a valid bus packet and raises ``ValueError``."""
    n = width // 8
    if not pkt:
        raise ValueError("a bus packet has at least one byte")
    chunks = [pkt[i:i + n] for i in range(0, len(pkt), n)]
    return [{"data": int.from_bytes(c, "little"), "keep": (1 << len(c)) - 1,
             "first": int(i == 0), "last": int(i == len(chunks) - 1)}
            for i, c in enumerate(chunks)]


def framing_error(index, keep, first, last, nbytes):
    """What is wrong with beat ``index`` (0-based within its packet) under the conventions of
    :mod:`roce_hw.lib.stream`, or ``None``: ``first`` exactly on beat 0, ``keep`` contiguous from bit
    0 with at least one byte, and full (``nbytes`` lanes) unless ``last``."""
    keep = int(keep)
    count = keep.bit_length()
    if bool(first) != (index == 0):
        return f"beat {index}: first={int(first)}"
    if keep != (1 << count) - 1 or count == 0:
        return f"beat {index}: keep {keep:#x}"
    if not last and count != nbytes:
        return f"beat {index}: partial keep {keep:#x} without last"
    return None


async def _offer(ctx, s, payload, rng, p_idle):
    """Producer side of one transfer: random idle cycles (``valid`` low) *before* the payload
    is offered, then hold ``valid`` and ``payload`` until the transfer; ``valid`` stays high."""
    while rng is not None and p_idle and rng.random() < p_idle:
        ctx.set(s.valid, 0)
        await ctx.tick()
    ctx.set(s.payload, payload)
    ctx.set(s.valid, 1)
    await ctx.tick().until(s.ready)


def _ready_now(rng, p_stall):
    """Consumer side: this cycle's ``ready`` under random backpressure."""
    return not (rng is not None and p_stall and rng.random() < p_stall)


async def stream_put(ctx, s, payload, *, rng=None, p_idle=0.0):
    """Transfer one ``payload`` on stream interface ``s`` (the producer side), optionally after
    random idle cycles; leaves ``valid`` low afterwards."""
    await _offer(ctx, s, payload, rng, p_idle)
    ctx.set(s.valid, 0)


async def stream_get(ctx, s, *, rng=None, p_stall=0.0):
    """Receive one payload from stream interface ``s`` (the consumer side), with random
    backpressure; returns the payload as sampled (a ``data.Const`` for struct payloads)."""
    while True:
        ready = _ready_now(rng, p_stall)
        ctx.set(s.ready, ready)
        _, _, valid, payload = await ctx.tick().sample(s.valid, s.payload)
        if valid and ready:
            ctx.set(s.ready, 0)
            return payload


async def send_packet(ctx, s, pkt, width, *, rng=None, p_idle=0.0, garbage=True):
    """Send ``pkt`` bytes as one packet on ``s``. With ``garbage`` the lanes beyond ``keep`` on
    the last beat carry random bytes (from ``rng``), which a correct block must ignore."""
    n = width // 8
    beats = beats_of(pkt, width)
    for beat in beats:
        if garbage and rng is not None and beat["last"]:
            used = beat["keep"].bit_length()
            junk = rng.getrandbits(8 * (n - used)) if n > used else 0
            beat = dict(beat, data=beat["data"] | (junk << (8 * used)))
        await _offer(ctx, s, beat, rng, p_idle)
    ctx.set(s.valid, 0)


class PacketAssembler:
    """Packets from the beats a monitor transferred: :meth:`add` takes one beat (a payload
    with ``data``, ``keep``, ``first``, ``last``) and returns the packet's bytes (only lanes
    with ``keep`` set) at its ``last`` beat, else ``None``. With ``check_framing`` it asserts
    :func:`framing_error` of every beat. ``index`` is the next beat's index in its packet
    (0 between packets)."""

    def __init__(self, width, *, check_framing=True):
        self._n = width // 8
        self._check = check_framing
        self._out = bytearray()
        self.index = 0

    def add(self, p):
        if self._check:
            error = framing_error(self.index, p.keep, p.first, p.last, self._n)
            assert error is None, error
        self._out += int(p.data).to_bytes(self._n, "little")[:int(p.keep).bit_length()]
        self.index += 1
        if not p.last:
            return None
        pkt, self._out, self.index = bytes(self._out), bytearray(), 0
        return pkt


async def recv_packet(ctx, s, width, *, rng=None, p_stall=0.0, check_framing=True):
    """Receive one packet from ``s`` and return its bytes (only lanes with ``keep`` set).

    With ``check_framing``, asserts the conventions of :mod:`roce_hw.lib.stream`: ``first`` only on
    the first beat, keep contiguous and full except on ``last``."""
    asm = PacketAssembler(width, check_framing=check_framing)
    while True:
        ready = _ready_now(rng, p_stall)
        ctx.set(s.ready, ready)
        _, _, valid, p = await ctx.tick().sample(s.valid, s.payload)
        if not (valid and ready):
            continue
        pkt = asm.add(p)
        if pkt is not None:
            ctx.set(s.ready, 0)
            return pkt


async def collect_valid(ctx, s, count):
    """Consumer that holds ``ready`` high and returns ``[(cycle, payload)]`` for the first
    ``count`` cycles with ``valid``; ``cycle`` counts clock ticks since the call (the first
    tick is 1), the clock basis of the latency tests."""
    ctx.set(s.ready, 1)
    out, cycle = [], 0
    while len(out) < count:
        await ctx.tick()
        cycle += 1
        if ctx.get(s.valid):
            out.append((cycle, ctx.get(s.payload)))
    return out
