# SPDX-License-Identifier: BSD-2-Clause
"""IPv4 header helpers shared by every TX source: a pipelined header checksum and the
identification counter."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import layouts, proto
from .arith import fast_inc

__all__ = ["IPv4Checksum", "IPv4Identification"]


def _fold(m, raw, name):
    """End-around-carry fold of ``raw`` to 16 bits with both carry outcomes summed in parallel
    (one carry chain): the value in 1..0xFFFF congruent to ``raw`` modulo 0xFFFF (``raw`` > 0;
    0 for ``raw`` = 0). ``raw`` must be below 2**32 - 2**16."""
    lo = raw[:16]
    hi = raw[16:]
    s0 = Signal(17, name=f"{name}_s0")
    s1 = Signal(18, name=f"{name}_s1")      # 2 * (lo + hi + 1): the +1 as a carry in
    out = Signal(16, name=name)
    m.d.comb += [
        s0.eq(lo + hi),
        s1.eq(Cat(C(1, 1), lo) + Cat(C(1, 1), hi)),
        out.eq(Mux(s0[16], s1[1:17], s0[:16])),
    ]
    return out


class IPv4Checksum(wiring.Component):
    """Header checksum of IPv4 headers (RFC 791/1071), pipelined: one header per cycle.

    The ten 16-bit words of the header (its ``checksum`` field taken as 0) are added by a tree of
    two-input adders, one level per register stage, then folded end-around and inverted. Every
    stage is one adder of at most 20 bits (or the fold's two 17-bit adders and a 2:1 mux), so the
    block adds no long path whatever feeds it.

    Latency: a header presented on ``i`` (``i.valid``) in cycle t has its checksum on ``o`` in
    cycle t + :attr:`latency` (``o.valid`` a pulse). Throughput: one header per cycle. No
    backpressure: ``o`` cannot be stalled (the consumer buffers it; its cycle is known).

    Members
    -------
    i : ``In(stream.Signature(layouts.IPV4, always_ready=True))``
        Headers (``checksum`` ignored).
    o : ``Out(stream.Signature(16, always_ready=True))``
        Their checksums, in order.
    """

    i: In(stream.Signature(layouts.IPV4, always_ready=True))
    o: Out(stream.Signature(16, always_ready=True))

    #: Register stages from ``i`` to ``o``.
    latency = 5

    def elaborate(self, platform):
        m = Module()
        hdr = Signal(layouts.IPV4)
        m.d.comb += [hdr.eq(self.i.payload), hdr.checksum.eq(0)]
        # the header as ten big-endian words: `as_value()` is big-endian by construction
        # (roce_hw.layouts.network_struct), word 0 in its top bits
        v = hdr.as_value()
        nwords = proto.IPV4.size // 2
        level = [v.word_select(nwords - 1 - k, 16) for k in range(nwords)]
        valid = self.i.valid
        stage = 0
        while len(level) > 1:
            nxt = []
            for k in range(0, len(level), 2):
                s = Signal(len(level[k]) + 1, name=f"sum{stage}_{k // 2}")
                if k + 1 < len(level):
                    m.d.sync += s.eq(level[k] + level[k + 1])
                else:
                    m.d.sync += s.eq(level[k])
                nxt.append(s)
            v_next = Signal(name=f"valid{stage}")
            m.d.sync += v_next.eq(valid)
            level, valid, stage = nxt, v_next, stage + 1
        folded = _fold(m, level[0], "fold")
        m.d.sync += [self.o.payload.eq(~folded), self.o.valid.eq(valid)]
        assert stage + 1 == self.latency
        return m


class IPv4Identification(wiring.Component):
    """The IPv4 identification counter of a transmitter.

    ``value`` is the ID of the next frame; a cycle with ``inc`` high uses it and counts on by 1
    (mod 2**16). ``load`` (always ready) sets it; a load wins over an ``inc`` in the same cycle.

    Parameters
    ----------
    start : int
        Value after reset (0 to 65535).

    Members
    -------
    value : ``Out(16)``
    inc : ``In(1)``
    load : ``In(stream.Signature(data.StructLayout({"value": 16}), always_ready=True))``
    """

    def __init__(self, start=0):
        if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= 0xFFFF:
            raise ValueError(f"start must be an integer from 0 to 65535, not {start!r}")
        self._start = start
        super().__init__({
            "value": Out(16, init=start),
            "inc": In(1),
            "load": In(stream.Signature(data.StructLayout({"value": 16}), always_ready=True)),
        })

    def elaborate(self, platform):
        m = Module()
        with m.If(self.load.valid):
            m.d.sync += self.value.eq(self.load.payload.value)
        with m.Elif(self.inc):
            m.d.sync += self.value.eq(fast_inc(m, self.value, "value_inc"))
        return m
