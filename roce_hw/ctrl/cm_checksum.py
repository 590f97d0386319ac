# SPDX-License-Identifier: BSD-2-Clause
"""The connection manager's first stage: it holds the datagram being served and checks its UDP
checksum (RFC 768), serially."""
from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import proto
from ..rx.frontend import cm_rx_layout

__all__ = ["cm_checked_layout", "CmChecksum"]

#: The UDP length of a CM datagram (header + 64 bytes), in the pseudo-header and the header.
_UDP_LENGTH = proto.UDP.size + proto.CM_DATAGRAM.size
#: The 16-bit words of the sum that are the same for every datagram: the pseudo-header's
#: protocol and UDP length, the UDP header's destination port and length (below 0xFFFF).
_CONSTANT = proto.IP_PROTO_UDP + _UDP_LENGTH + proto.CM_UDP_PORT + _UDP_LENGTH
#: Bits of the checksum's words.
_WORD = 16


def cm_checked_layout():
    """Payload of :class:`CmChecksum`'s output: the datagram (``req``, a
    :func:`~roce_hw.rx.frontend.cm_rx_layout`) and ``checksum_ok`` (its UDP checksum is 0 or
    right)."""
    return data.StructLayout({"req": cm_rx_layout(), "checksum_ok": 1})


class CmChecksum(wiring.Component):
    """Holds one CM datagram and verifies its UDP checksum.

    The checksum (RFC 768) is the one's-complement sum of the IPv4 pseudo-header (the frame's
    source IP, ``local_ip`` as the destination, protocol 17, UDP length 72), the UDP header
    (source port, 0x4321, 72, the checksum as received) and the 64 bytes: right when it is
    0xFFFF (or 0, which no datagram can sum to). A checksum field of 0 means "not computed" and
    is accepted.

    The sum is serial, a word a cycle: one of the 38 variable 16-bit words (the datagram's 32,
    the source IP's and ``local_ip``'s two, the source port, the checksum) is selected into a
    register, then added to a 16-bit sum with the carry out of the last addition as carry in
    (the end-around carry of one's-complement addition, a cycle late); the constant words start
    the sum. The sum ``s`` with the carry ``c`` still to add is right when ``s + c`` is 0xFFFF
    or 0x10000 (or 0).

    Latency: from a transfer on ``i`` to ``o.valid`` 41 cycles. Throughput: one datagram at a
    time: ``i.ready`` is high only while idle, and the datagram is held on ``o`` (whose payload
    is this stage's register) until ``o`` is taken -- the later stages of the connection
    manager read it there, and take it when they are done with it. Backpressure: ``o`` may wait
    any time.

    Members
    -------
    i : ``In(stream.Signature(cm_rx_layout()))``
        Datagrams that passed the RX front end's frame checks.
    o : ``Out(stream.Signature(cm_checked_layout()))``
    local_ip : ``In(32)``
        The engine's IPv4 address (the pseudo-header's destination).
    """

    #: Cycles from a transfer on ``i`` to ``o.valid``.
    latency = 41

    def __init__(self):
        super().__init__({
            "i": In(stream.Signature(cm_rx_layout())),
            "o": Out(stream.Signature(cm_checked_layout())),
            "local_ip": In(32),
        })

    def elaborate(self, platform):
        m = Module()
        req = Signal(cm_rx_layout())
        words = Cat(req.dgram, req.src_ip, self.local_ip, req.src_port, req.udp_checksum)
        n = len(words) // _WORD
        count = Signal(range(n))
        word = Signal(_WORD)                     # the word selected last cycle
        adding = Signal()                        # `word` holds a word to add
        total = Signal(_WORD)
        carry = Signal()                         # the carry out of the last addition
        ok = Signal()
        m.d.comb += [self.o.payload.req.eq(req), self.o.payload.checksum_ok.eq(ok)]

        m.d.sync += adding.eq(0)
        with m.If(adding):
            m.d.sync += Cat(total, carry).eq(total + word + carry)
        with m.FSM():
            with m.State("Idle"):
                m.d.comb += self.i.ready.eq(1)
                # a set/reset of the sum's flip-flops, not a multiplexer in front of the adder
                m.d.sync += [total.eq(_CONSTANT), carry.eq(0), count.eq(0)]
                with m.If(self.i.valid):
                    m.d.sync += req.eq(self.i.payload)
                    m.next = "Sum"
            with m.State("Sum"):
                m.d.sync += [word.eq(words.word_select(count, _WORD)), adding.eq(1),
                             count.eq(count + 1)]
                with m.If(count == n - 1):
                    m.next = "Last"
            with m.State("Last"):                 # the last word goes into the sum
                m.next = "Compare"
            with m.State("Compare"):
                m.d.sync += ok.eq((total == 0xFFFF) | ((total == 0xFFFE) & carry) |
                                  ((total == 0) & ~carry) | (req.udp_checksum == 0))
                m.next = "Hold"
            with m.State("Hold"):
                m.d.comb += self.o.valid.eq(1)
                with m.If(self.o.ready):
                    m.next = "Idle"
        return m
