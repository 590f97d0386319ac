# SPDX-License-Identifier: BSD-2-Clause
"""IPv4 header helpers shared by every TX source: a pipelined header checksum and the
identification counter."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import layouts, proto
from .arith import FastCounter

__all__ = ["header_word_sum", "IPv4Checksum", "IPv4Identification"]


def header_word_sum(m, value, valid):
    """The sum of the ten big-endian 16-bit words of an IPv4 header ``value`` (a
    :data:`roce_hw.layouts.IPV4` value: ``as_value()`` is big-endian by construction, word 0 in
    its top bits), by a tree of two-input adders with one register stage per level: every stage
    is one adder of at most 20 bits. Returns ``(sum, valid, stages)``: the 20-bit sum and
    ``valid`` delayed by the ``stages`` register stages."""
    nwords = proto.IPV4.size // 2
    level = [value.word_select(nwords - 1 - k, 16) for k in range(nwords)]
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
    return level[0], valid, stage


class IPv4Checksum(wiring.Component):
    """Header checksum of IPv4 headers (RFC 791/1071), pipelined: one header per cycle.

    The ten 16-bit words of the header (its ``checksum`` field taken as 0) are added by a tree of
    two-input adders, one level per register stage, then folded end-around and inverted. Every
    stage is one adder of at most 20 bits; the end-around fold takes two stages (high part onto
    the low 16 bits, then the carry of that), so the block adds no long path whatever feeds it.

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
    latency = 6

    def elaborate(self, platform):
        m = Module()
        hdr = Signal(layouts.IPV4)
        m.d.comb += [hdr.eq(self.i.payload), hdr.checksum.eq(0)]
        total, valid, stages = header_word_sum(m, hdr.as_value(), self.i.valid)
        # end-around carry: sum < 2**20, so high part + low 16 bits < 2**17, and one more
        # carry of that fits in 16 bits (RFC 1071)
        f1 = Signal(17, name="fold1")
        f1_valid = Signal(name="fold1_valid")
        m.d.sync += [f1.eq(total[:16] + total[16:]), f1_valid.eq(valid)]
        m.d.sync += [self.o.payload.eq(~(f1[:16] + f1[16])[:16]), self.o.valid.eq(f1_valid)]
        assert stages + 2 == self.latency
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
            "value": Out(16),
            "inc": In(1),
            "load": In(stream.Signature(data.StructLayout({"value": 16}), always_ready=True)),
        })

    def elaborate(self, platform):
        m = Module()
        count = FastCounter(m, 16, "id", init=self._start)
        m.d.comb += self.value.eq(count.value)
        with m.If(self.load.valid):
            m.d.sync += count.load(self.load.payload.value)
        with m.Elif(self.inc):
            m.d.sync += count.advance()
        return m
