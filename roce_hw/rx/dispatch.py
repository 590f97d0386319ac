# SPDX-License-Identifier: BSD-2-Clause
"""The end of the RX front end: verdicts into the item queues and the "other" FIFO's decisions,
and what became of each frame into the counters."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import proto
from ..lib.arith import event_counter
from ..lib.drop_queue import DropQueue
from .items import (arp_req_layout, cm_rx_layout, roce_rx_layout, rx_counters_layout,
                    rx_outcome_layout)
from .pipe import delay
from .rules import verdict_layout

__all__ = ["ITEM_KINDS", "RxDispatch", "RxCounters"]

#: The kinds of frame handed on as items, each on its stream behind its queue.
ITEM_KINDS = ("arp", "cm", "roce")
_ITEM_LAYOUTS = {"arp": arp_req_layout, "cm": cm_rx_layout, "roce": roce_rx_layout}
#: Verdicts that drop the frame, counted as they are.
_DROPS = tuple(name for name in proto.RX_VERDICTS if name not in ITEM_KINDS + ("other",))


class RxDispatch(wiring.Component):
    """Acts on each verdict: an item goes into its kind's queue (a
    :class:`~roce_hw.lib.drop_queue.DropQueue` in RAM), a frame for the user is kept in the
    "other" FIFO or discarded, and what became of the frame -- the verdict, or ``*_full`` /
    ``other_dropped`` when there was no room -- leaves on ``outcome``.

    Latency: a verdict on ``i`` in cycle t gives its item on ``arp``/``cm``/``roce`` in cycle
    t + 2 if the queue was empty, its decision on ``decide`` in cycle t and its outcome in cycle
    t + 1. Throughput: one verdict per cycle; the outputs take one item per cycle.
    Backpressure: ``arp``/``cm``/``roce`` (an item that finds its queue full is dropped and
    counted); none on ``i``.

    Parameters
    ----------
    depths : dict
        Entries of the queue of each of :data:`ITEM_KINDS`.
    rx_other : bool
        There is an "other" FIFO (``stored``, ``decide``); without it "other" frames are
        dropped and counted (``other_dropped``).
    stored_lead : int
        Cycles from a frame's report on ``stored`` to its verdict on ``i``.

    Members
    -------
    i : ``In(stream.Signature(verdict_layout(), always_ready=True))``
        One verdict per frame (:class:`~roce_hw.rx.rules.RxRules`).
    stored : ``In(stream.Signature(StructLayout({"ok": 1}), always_ready=True))``
        The "other" FIFO's report of each frame (``ok``: it is stored, waiting for its
        decision), ``stored_lead`` cycles before the frame's verdict. Only with ``rx_other``.
    decide : ``Out(stream.Signature(StructLayout({"keep": 1}), always_ready=True))``
        One decision per frame the FIFO stored: ``keep`` it (verdict "other") or discard it.
        Only with ``rx_other``.
    arp : ``Out(stream.Signature(arp_req_layout()))``
    cm : ``Out(stream.Signature(cm_rx_layout()))``
    roce : ``Out(stream.Signature(roce_rx_layout()))``
    outcome : ``Out(stream.Signature(rx_outcome_layout(), always_ready=True))``
        What became of each frame (a register); the payload is 0 while ``valid`` is 0.
    """

    def __init__(self, depths, *, rx_other, stored_lead):
        if set(depths) != set(ITEM_KINDS):
            raise ValueError(f"depths must give the depth of each of {ITEM_KINDS}, not "
                             f"{depths!r}")
        self._depths = dict(depths)
        self._rx_other = rx_other
        self._stored_lead = stored_lead
        members = {"i": In(stream.Signature(verdict_layout(), always_ready=True))}
        if rx_other:
            members["stored"] = In(stream.Signature(data.StructLayout({"ok": 1}),
                                                    always_ready=True))
            members["decide"] = Out(stream.Signature(data.StructLayout({"keep": 1}),
                                                     always_ready=True))
        for kind in ITEM_KINDS:
            members[kind] = Out(stream.Signature(_ITEM_LAYOUTS[kind]()))
        members["outcome"] = Out(stream.Signature(rx_outcome_layout(), always_ready=True))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        ev = self.i.valid
        v = self.i.payload.verdict
        out = Signal(rx_outcome_layout())
        for kind in ITEM_KINDS:
            q = DropQueue(_ITEM_LAYOUTS[kind](), self._depths[kind])
            m.submodules[f"{kind}_q"] = q
            go = Signal(name=f"{kind}_go")
            m.d.comb += [
                go.eq(ev & v[kind]),
                q.i.valid.eq(go),
                q.i.payload.eq(self.i.payload[kind]),
                out[kind].eq(go & q.room),
                out[f"{kind}_full"].eq(go & ~q.room),
            ]
            wiring.connect(m, q.o, wiring.flipped(getattr(self, kind)))
        other_go = Signal()
        m.d.comb += other_go.eq(ev & v.other)
        if self._rx_other:
            stored_ok = delay(m, self.stored.payload.ok, self._stored_lead, "stored_ok")
            m.d.comb += [
                self.decide.valid.eq(ev & stored_ok),
                self.decide.payload.keep.eq(v.other),
                out.other.eq(other_go & stored_ok),
                out.other_dropped.eq(other_go & ~stored_ok),
            ]
        else:
            m.d.comb += out.other_dropped.eq(other_go)
        for name in _DROPS:
            m.d.comb += out[name].eq(ev & v[name])
        m.d.sync += [self.outcome.valid.eq(ev), self.outcome.payload.eq(out)]
        return m


class RxCounters(wiring.Component):
    """One wrapping counter per name of :data:`roce_hw.proto.RX_COUNTERS`: ``rx_frames``
    counts the outcomes, each other one the outcomes of its name
    (:func:`~roce_hw.lib.arith.event_counter`: short carry chains).

    Latency: an outcome on ``i`` in cycle t is counted from cycle t + 1. Throughput: one
    outcome per cycle.

    Members
    -------
    i : ``In(stream.Signature(rx_outcome_layout(), always_ready=True))``
        Its payload must be 0 while ``valid`` is 0 (:class:`RxDispatch`'s ``outcome`` is): a
        bit counts as it is, with no gate behind the register.
    counters : ``Out(rx_counters_layout())``
    """

    i: In(stream.Signature(rx_outcome_layout(), always_ready=True))
    counters: Out(rx_counters_layout())

    def elaborate(self, platform):
        m = Module()
        c = self.counters
        m.d.comb += c.rx_frames.eq(event_counter(m, len(c.rx_frames), self.i.valid,
                                                 "cnt_rx_frames"))
        for name in proto.RX_COUNTERS[1:]:
            m.d.comb += c[name].eq(event_counter(m, len(c[name]), self.i.payload[name],
                                                 f"cnt_{name}"))
        return m
