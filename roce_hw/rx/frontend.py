# SPDX-License-Identifier: BSD-2-Clause
"""RX front end: Ethernet frames from the MAC, checked whole, then sorted into ARP requests, CM
datagrams, RoCEv2 packets and the frames that are not for the engine."""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .. import layouts
from ..config import check_config
from ..lib.deferred_fifo import DeferredFrameFifo
from ..lib.drop_queue import DropQueue
from ..lib.stream import FrameSignature, frame_layout
from .dispatch import ITEM_KINDS, RxCounters, RxDispatch
from .items import arp_req_layout, cm_rx_layout, roce_rx_layout, rx_counters_layout
from .parse import ARP_VARIANTS, IP_VARIANTS, RxParser
from .rules import RxRules

__all__ = ["ARP_VARIANTS", "IP_VARIANTS", "arp_req_layout", "cm_rx_layout", "roce_rx_layout",
           "rx_counters_layout", "RxFrontEnd"]


class RxFrontEnd(wiring.Component):
    """Receive front end: checks every frame from the MAC whole, then hands ARP requests, CM
    datagrams and RoCEv2 packets to the engine and the rest to the user.

    Decisions (the golden model is :func:`roce_hw.model.rx.classify`, whose docstring lists the
    rules in order; the first that applies decides). In short: a frame flagged bad by the MAC
    (``abort`` on its last beat) is dropped; ARP requests for ``local_ip`` (to our MAC or
    broadcast, well formed) go to ``arp`` and every other ARP frame is "other"; frames to another
    MAC or of another EtherType (IPv6, VLAN-tagged, ...) are "other". A frame to our MAC with
    EtherType IPv4 is **the engine's to judge**: a malformed one -- truncated IPv4 header, IP
    options or a version other than 4, a fragment, a bad header checksum, a total length that
    disagrees with the frame (Ethernet padding of a 60-byte frame allowed) -- is dropped and
    counted by reason, never passed on, since its addresses cannot be trusted. A well-formed one
    to another IP address or of another protocol is "other"; UDP to our IP must have a UDP length
    of total length - 20 (else dropped); then port 4791 is RoCEv2 (BTH and iCRC room needed, iCRC
    checked, bad ones dropped) for ``roce``, port 0x4321 a CM datagram (UDP length exactly 8 +
    64, else dropped) for ``cm``, any other port "other". Consequence for a user stack sharing
    the engine's MAC: it sees no IPv4 fragments, no IP options and no malformed IPv4 (they are
    counted).

    "Other" frames leave on ``other`` byte for byte as received (same beats, ``data`` lanes
    beyond ``keep`` included, ``keep``, ``first``, ``last``; ``abort`` as received, hence 0: a
    frame the MAC flagged bad is dropped), in order, from a store-and-forward
    FIFO (:class:`~roce_hw.lib.deferred_fifo.DeferredFrameFifo`, ``other_bytes`` of storage) so
    the user may stall ``other``; a frame that does not fit is dropped whole and counted
    (``other_dropped``). A frame starts on ``other`` only after it was checked whole. With
    ``rx_other=False`` there is no ``other`` stream and those frames are dropped and counted.

    ``arp``, ``cm`` and ``roce`` are streams with backpressure, each behind a queue in RAM
    (:class:`~roce_hw.lib.drop_queue.DropQueue`) of ``config.rx_arp_depth``,
    ``config.rx_cm_depth``, ``config.rx_roce_depth`` items (32 by default: sixteen hosts
    connecting at once, their ARP requests, OPEN_QP and MODIFY_QP_RTS datagrams back to back at
    line rate, are all kept while the CM serves them one at a time); an item whose queue is full
    is dropped and counted (``arp_full``, ``cm_full``, ``roce_full``). RoCEv2 items can come one
    per cycle (an ACK is one beat at 512 bits): their consumer must take one per cycle, and
    ``rx_roce_depth`` is the longest stall it may make during such a burst. Nothing is emitted for a
    frame before its last beat has been checked: the MAC's bad flag, the lengths, the IPv4
    checksum and the iCRC all come from the whole frame.

    Cost of a queue (Yosys ``synth_xilinx -family xcup``, the queue alone; items of 80 / 624 /
    193 bits for ARP / CM / RoCE): ``depth - 1`` rows of RAM, an output register of one item
    and 17 (4 items) to 78 (4096 items) LUTs of control, whose paths stay within 5 cells at
    those depths. 2 to 33 items take 32-deep LUT RAM, 6 / 45 / 14 RAM32M16 (8 LUTs each; 32
    items: 32 LUTs of control); 34 to 65 items RAM64M8, 12 / 90 / 28 (37 LUTs); Yosys puts 512
    items in block RAM, 3 RAMB18E2 / 9 RAMB36E2 / 3 RAMB36E2 (57 LUTs).

    Counters: every frame is counted in ``rx_frames`` and in exactly one of the others (see
    :data:`roce_hw.proto.RX_COUNTERS`), 32 bits each, wrapping; with the last beat of a frame
    on ``i`` in cycle t, the counters show it from cycle t + :attr:`latency`.

    Structure: blocks joined by streams with ``StructLayout`` payloads, a fixed-latency
    pipeline that never stalls (one frame per stage)::

        i -> register -+-> RxParser --record--> RxRules --verdict--> RxDispatch -+-> arp, cm, roce
                       |         \\--iCRC verdict--^                  |        +-> RxCounters
                       +-> DeferredFrameFifo <------ keep / discard ---+
                                 \\--> other

    With the last beat of a frame on ``i`` in cycle t: its record in cycle t + 5, its iCRC
    verdict and its verdict in cycle t + 11, its item out of the queue in cycle t + 13.

    :class:`~roce_hw.rx.parse.RxParser` reads the beats (header extractors, frame length, iCRC
    checker) and gives one record per frame; :class:`~roce_hw.rx.rules.RxRules` applies the
    rules (field compares, IPv4 header checksum, iCRC) and gives one verdict per frame with its
    item; :class:`~roce_hw.rx.dispatch.RxDispatch` puts the item in its queue or decides the
    "other" frame's fate and reports what became of the frame to
    :class:`~roce_hw.rx.dispatch.RxCounters`. No header byte is sliced by hand: every field
    comes from an extractor's ``proto``-built layout.

    Latency: with the last beat of a frame on ``i`` in cycle t, its item is valid on
    ``arp``/``cm``/``roce`` in cycle t + :attr:`latency` (13) if the queue was empty, and an
    "other" frame starts on ``other`` in cycle t + :attr:`latency` if the FIFO was empty
    (input register 1, parser 4, rules 6, queue 2).

    Throughput: one beat per cycle on ``i``, back to back frames of any length, including
    frames of one beat; the outputs take one item per cycle.

    Backpressure: none on ``i``: ``i.ready`` is constant 1 (a MAC cannot wait); what cannot be
    stored is dropped and counted, as above.

    Parameters
    ----------
    config : EngineConfig
        ``data_width`` (64 to 1024); ``rx_arp_depth``, ``rx_cm_depth``, ``rx_roce_depth``.
    rx_other : bool
        Build the ``other`` stream and its FIFO.
    other_bytes : int
        Storage of the ``other`` FIFO in bytes (at least two beats; rounded up to a power of
        two of beats): the longest frame that can pass on ``other``.

    Members
    -------
    i : ``In(FrameSignature(data_width))``
        Frames from the MAC without FCS; ``abort`` on the last beat = bad frame. ``ready`` is 1.
    local_mac : ``In(48)``, local_ip : ``In(32)``
        The engine's addresses (``0x020000000001`` is 02:00:00:00:00:01); static (registered).
    arp : ``Out(stream.Signature(arp_req_layout()))``
    cm : ``Out(stream.Signature(cm_rx_layout()))``
    roce : ``Out(stream.Signature(roce_rx_layout()))``
    other : ``Out(FrameSignature(data_width))``
        Only with ``rx_other``.
    counters : ``Out(rx_counters_layout())``
    """

    #: Cycles from the last beat of a frame on ``i`` to its item on ``arp``/``cm``/``roce``
    #: (or its first beat on ``other``), empty queues.
    latency = 13

    def __init__(self, config, *, rx_other=True, other_bytes=8192):
        self._config = check_config(config)
        if not isinstance(rx_other, bool):
            raise TypeError(f"rx_other must be a bool, not {rx_other!r}")
        nbytes = config.data_bytes
        if isinstance(other_bytes, bool) or not isinstance(other_bytes, int) or \
                other_bytes < 2 * nbytes:
            raise ValueError(f"other_bytes must be an integer of at least two beats "
                             f"({2 * nbytes} bytes), not {other_bytes!r}")
        self._rx_other = rx_other
        rows = -(-other_bytes // nbytes)
        self._other_rows = 1 << (rows - 1).bit_length()
        width = config.data_width
        members = {
            "i": In(FrameSignature(width)),
            "local_mac": In(layouts.ETH["dst"].shape),
            "local_ip": In(layouts.IPV4["dst"].shape),
            "arp": Out(stream.Signature(arp_req_layout())),
            "cm": Out(stream.Signature(cm_rx_layout())),
            "roce": Out(stream.Signature(roce_rx_layout())),
            "counters": Out(rx_counters_layout()),
        }
        if rx_other:
            members["other"] = Out(FrameSignature(width))
        super().__init__(members)

    @property
    def config(self):
        return self._config

    @property
    def rx_other(self):
        return self._rx_other

    @property
    def queue_depths(self):
        """Items each of the ``arp``, ``cm`` and ``roce`` queues holds, by kind."""
        cfg = self._config
        return {"arp": cfg.rx_arp_depth, "cm": cfg.rx_cm_depth, "roce": cfg.rx_roce_depth}

    @property
    def other_bytes(self):
        """Storage of the ``other`` FIFO in bytes (after rounding up to a power of two of
        beats): the longest frame that can pass."""
        return self._other_rows * self._config.data_bytes

    def elaborate(self, platform):
        m = Module()
        width = self._config.data_width

        # The input beat, registered once: every reader takes it from this register.
        beat = stream.Signature(frame_layout(width), always_ready=True).create()
        beat.payload = Signal(frame_layout(width), name="beat", reset_less=True)
        m.d.comb += self.i.ready.eq(1)
        m.d.sync += [beat.valid.eq(self.i.valid), beat.payload.eq(self.i.payload)]

        m.submodules.parser = parser = RxParser(width)
        m.submodules.rules = rules = RxRules(icrc_offset=parser.icrc_latency - parser.latency)
        stored_lead = parser.latency + rules.latency - DeferredFrameFifo.stored_latency
        m.submodules.dispatch = dispatch = RxDispatch(self.queue_depths,
                                                      rx_other=self._rx_other,
                                                      stored_lead=stored_lead)
        m.submodules.counters = counters = RxCounters()
        assert 1 + parser.latency + rules.latency + DropQueue.latency == self.latency

        # An always-ready stream fans out by one connect per reader (a single connect would
        # see each reader's constant `ready` as one more driver).
        wiring.connect(m, beat, parser.i)
        if self._rx_other:
            m.submodules.ofifo = ofifo = DeferredFrameFifo(width, self._other_rows)
            wiring.connect(m, beat, ofifo.i)
            wiring.connect(m, ofifo.stored, dispatch.stored)
            wiring.connect(m, dispatch.decide, ofifo.decide)
            wiring.connect(m, ofifo.o, wiring.flipped(self.other))
        wiring.connect(m, parser.o, rules.i)
        wiring.connect(m, parser.icrc, rules.icrc)
        m.d.comb += [rules.local_mac.eq(self.local_mac), rules.local_ip.eq(self.local_ip)]
        wiring.connect(m, rules.o, dispatch.i)
        for kind in ITEM_KINDS:
            wiring.connect(m, getattr(dispatch, kind), wiring.flipped(getattr(self, kind)))
        wiring.connect(m, dispatch.outcome, counters.i)
        m.d.comb += self.counters.eq(counters.counters)
        return m
