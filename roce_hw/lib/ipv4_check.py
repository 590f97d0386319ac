# SPDX-License-Identifier: BSD-2-Clause
"""Receive-side IPv4 header checksum verification, pipelined (one header per cycle)."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import layouts
from .ipv4 import header_word_sum

__all__ = ["IPv4HeaderCheck"]


class IPv4HeaderCheck(wiring.Component):
    """Verifies the header checksum of IPv4 headers without options (RFC 1071).

    A header is good when the one's-complement sum of its ten 16-bit words, checksum field
    included, is 0xFFFF (the receiver's check of RFC 1071 §2; a header whose checksum field is
    0xFFFF or 0x0000 for the same sum is accepted either way, as Linux and scapy do).

    Structure: the words are added by a tree of two-input adders, one level per register stage
    (10 -> 5 -> 3 -> 2 -> 1, at most 20 bits), then folded once (low 16 bits + the 4 high bits).
    The sum is good exactly when that fold is 0xFFFF: it is at most 0xFFFF + 0xF, and a value of
    2**16 or more folds to at most 0x10, never to 0xFFFF. The compare is the last stage.

    Latency: a header presented on ``i`` (``i.valid``) in cycle t has its result on ``o`` in
    cycle t + :attr:`latency` (``o.valid`` a pulse). Throughput: one header per cycle. No
    backpressure (the consumer knows the cycle of each result).

    Members
    -------
    i : ``In(stream.Signature(layouts.IPV4, always_ready=True))``
        Headers, checksum field included.
    o : ``Out(stream.Signature(StructLayout({"ok": 1}), always_ready=True))``
        Their verdicts, in order.
    """

    i: In(stream.Signature(layouts.IPV4, always_ready=True))
    o: Out(stream.Signature(data.StructLayout({"ok": 1}), always_ready=True))

    #: Register stages from ``i`` to ``o``.
    latency = 6

    def elaborate(self, platform):
        m = Module()
        total, valid, stages = header_word_sum(m, Value.cast(self.i.payload), self.i.valid)
        fold = Signal(17)
        fold_valid = Signal()
        m.d.sync += [fold.eq(total[:16] + total[16:]), fold_valid.eq(valid)]
        m.d.sync += [self.o.payload.ok.eq(fold == 0xFFFF), self.o.valid.eq(fold_valid)]
        assert stages + 2 == self.latency
        return m
