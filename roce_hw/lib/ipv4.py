# SPDX-License-Identifier: BSD-2-Clause
"""IPv4 header helpers shared by every TX source: a pipelined header checksum and the
identification counter."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import layouts, proto
from .arith import FastCounter

__all__ = ["header_word_sum", "IPv4Checksum", "IPv4Identification"]


def _csa_mod_ffff(a, b, c):
    """One carry-save step modulo 2**16 - 1: two 16-bit vectors whose sum is ``a + b + c`` mod
    0xFFFF (the carry out of bit 15 wraps to bit 0, as 2**16 = 1 mod 0xFFFF). One LUT level."""
    carry = (a & b) | (a & c) | (b & c)
    return a ^ b ^ c, Cat(carry[15], carry[:15])


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

    The header is registered, then its nine 16-bit words other than ``checksum`` are reduced to
    two by a tree of carry-save steps modulo 0xFFFF (the carry out of bit 15 wraps to bit 0:
    9 -> 6 -> 4 -> 3 -> 2, four LUT levels, no carry chain; with ``split`` a register after
    the second) into a register; those two are added, the carry out of bit 15 is added back in
    the next stage (it cannot carry again), and the result inverted into the output register.
    That is RFC 1071's checksum: the carry-save steps keep the sum modulo 0xFFFF, and they give
    two zero vectors only for nine zero words, so the one's-complement representation of zero
    matches too.

    Latency: a header presented on ``i`` (``i.valid``) in cycle t has its checksum on ``o`` in
    cycle t + :attr:`latency` (``o.valid`` a pulse). Throughput: one header per cycle. No
    backpressure: ``o`` cannot be stalled (the consumer buffers it; its cycle is known).

    Parameters
    ----------
    split : bool
        A register in the middle of the carry-save tree (after 9 -> 6 -> 4): two LUT levels
        per stage instead of four, one cycle more (:attr:`latency` 5 instead of 4).

    Members
    -------
    i : ``In(stream.Signature(layouts.IPV4, always_ready=True))``
        Headers (``checksum`` ignored).
    o : ``Out(stream.Signature(16, always_ready=True))``
        Their checksums, in order.
    """

    i: In(stream.Signature(layouts.IPV4, always_ready=True))
    o: Out(stream.Signature(16, always_ready=True))

    def __init__(self, *, split=False):
        self._split = bool(split)
        super().__init__()

    @property
    def latency(self):
        """Register stages from ``i`` to ``o``."""
        return self.latency_for(split=self._split)

    @staticmethod
    def latency_for(*, split=False):
        """:attr:`latency` of a checksum block with these parameters, without building one."""
        return 5 if split else 4

    def elaborate(self, platform):
        m = Module()
        hdr = Signal(layouts.IPV4, name="hdr")
        hdr_valid = Signal(name="hdr_valid")
        m.d.sync += [hdr.eq(self.i.payload), hdr_valid.eq(self.i.valid)]
        nwords = proto.IPV4.size // 2
        csum_word = proto.IPV4.offset("checksum")[0] // 2
        raw = hdr.as_value()            # big-endian: word 0 in the top bits
        level = [raw.word_select(nwords - 1 - k, 16) for k in range(nwords) if k != csum_word]
        level_valid = hdr_valid
        step = 0
        while len(level) > 2:
            nxt = []
            for k in range(0, len(level) - 2, 3):
                nxt.extend(_csa_mod_ffff(*level[k:k + 3]))
            nxt.extend(level[len(level) // 3 * 3:])     # the one or two left over
            level = nxt
            step += 1
            if self._split and step == 2:
                mid = [Signal(16, name=f"csm{k}") for k in range(len(level))]
                mid_valid = Signal(name="csm_valid")
                m.d.sync += [r.eq(v) for r, v in zip(mid, level)] + [mid_valid.eq(level_valid)]
                level, level_valid = mid, mid_valid
        pair = [Signal(16, name=f"csa{k}") for k in range(2)]
        pair_valid = Signal(name="csa_valid")
        m.d.sync += [pair[0].eq(level[0]), pair[1].eq(level[1]), pair_valid.eq(level_valid)]
        # end-around carry: the carry out of a + b goes back in at bit 0, in a stage of its own
        # (it cannot carry again); one 16-bit adder per stage
        plain = Signal(17, name="eac_plain")
        plain_valid = Signal(name="eac_valid")
        m.d.sync += [plain.eq(pair[0] + pair[1]), plain_valid.eq(pair_valid)]
        m.d.sync += [self.o.payload.eq(~(plain[:16] + plain[16])[:16]),
                     self.o.valid.eq(plain_valid)]
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
        # An `inc` is applied a cycle later, from a register (`pend`): `inc` is usually a late
        # handshake, and it is then no flip-flop's enable. `value` is the register `cur`, or
        # while an increment is pending the register `nxt` (= cur + 1): one multiplexer.
        cur = Signal(16, name="id_cur", init=self._start)
        nxt = FastCounter(m, 16, "id_next", init=(self._start + 1) & 0xFFFF)
        pend = Signal(name="id_pend")
        m.d.comb += self.value.eq(Mux(pend, nxt.value, cur))
        m.d.sync += pend.eq(self.inc & ~self.load.valid)
        v = self.load.payload.value
        with m.If(self.load.valid):
            m.d.sync += [cur.eq(v), *nxt.load_step(v)]
        with m.Elif(pend):
            m.d.sync += [cur.eq(nxt.value), *nxt.advance()]
        return m
