# SPDX-License-Identifier: BSD-2-Clause
"""Work-request multiplexer: two sources of (work requests, payload packets) -> one TX engine
input pair."""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..config import check_config
from ..lib.stream import PacketSignature
from ..verbs import wr_layout

__all__ = ["WrMux"]


class WrMux(wiring.Component):
    """Merges two work-request sources (each a ``wr`` stream and its ``i`` payload packets, as
    the inputs of :class:`roce_hw.engine.TxEngine`) into one pair.

    Requests: round robin per request between the sources with a request valid (a source
    offering requests back to back gets every other slot while the other one offers too, every
    slot while it is alone). Payloads: the payload packet of every granted request with
    ``length`` > 0 is passed in the order the requests were granted, whole (``first`` to
    ``last``), never mixing two sources' beats; the sources' payload packets must follow their
    own request order, as the TX engine requires. A small FIFO (``depth`` entries) keeps the
    source of each granted request whose payload has not yet fully passed; while it is full no
    request is granted. A source's payload beats may be offered before or after its request:
    they wait until the request has been granted and the payloads granted before have passed.

    Status reports. The TX engine's ``status`` reports carry ``wr_id`` and ``qp`` only, not the
    source; the user tells their own reports from the traffic generator's
    (:class:`roce_hw.ctrl.generator.TrafficGenerator`) by QP: do not post user requests on the
    QP the generator runs on (its ``qp`` output while ``busy``).

    Latency: a request transferred on ``s*_wr`` in cycle ``t`` is offered on ``wr`` in cycle
    ``t + 1``; a payload beat transferred on ``s*_i`` in cycle ``t`` is offered on ``i`` in cycle
    ``t + 1`` (the earliest a request's first payload beat can pass is the cycle after its
    request was granted). Throughput: one request and one payload beat per cycle, also across
    sources and packets (no idle cycle is added for a single busy source at full rate).
    Backpressure: ``wr`` and ``i`` are registered outputs; ``s*_wr.ready`` is a function of
    ``wr.ready``, the output and FIFO registers and both sources' ``valid``; ``s*_i.ready`` of
    ``i.ready`` and registers. A stalled ``i`` stalls requests only once the FIFO is full.

    Parameters
    ----------
    config : EngineConfig
        ``data_width`` and ``n_qp``.
    depth : int
        Entries of the source FIFO (1 to 64, default 8): granted requests whose payloads may be
        outstanding.

    Members
    -------
    s0_wr, s1_wr : ``In(stream.Signature(wr_layout(config)))``
        Requests of source 0 and 1.
    s0_i, s1_i : ``In(PacketSignature(data_width))``
        Their payload packets.
    wr : ``Out(stream.Signature(wr_layout(config)))``
    i : ``Out(PacketSignature(data_width))``
        To the TX engine's ``wr`` and ``i``.

    Raises
    ------
    TypeError
        If ``config`` is not an :class:`~roce_hw.config.EngineConfig`.
    ValueError
        If ``depth`` is not an integer from 1 to 64.
    """

    def __init__(self, config, *, depth=8):
        self._config = check_config(config)
        if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= 64:
            raise ValueError(f"depth must be an integer from 1 to 64, not {depth!r}")
        self._depth = depth
        w = config.data_width
        super().__init__({
            "s0_wr": In(stream.Signature(wr_layout(config))),
            "s0_i": In(PacketSignature(w)),
            "s1_wr": In(stream.Signature(wr_layout(config))),
            "s1_i": In(PacketSignature(w)),
            "wr": Out(stream.Signature(wr_layout(config))),
            "i": Out(PacketSignature(w)),
        })

    @property
    def depth(self):
        """Entries of the source FIFO."""
        return self._depth

    def elaborate(self, platform):
        m = Module()
        depth = self._depth
        s_wr = (self.s0_wr, self.s1_wr)
        s_i = (self.s0_i, self.s1_i)

        # Source FIFO: `ids[k]` is the source of entry k (0 = oldest), `occ` a thermometer
        # code of the occupied entries, so the head, "not empty" (occ[0]) and "full"
        # (occ[depth - 1]) are registers.
        ids = Signal(depth)
        occ = Signal(depth)
        head = Signal()
        push = Signal()
        push_id = Signal()
        pop = Signal()
        m.d.comb += head.eq(ids[0])

        # ---------------------------------------------------------------- requests
        rr = Signal()              # the source with priority on a tie
        sel = Signal()
        go = Signal()
        wr_free = Signal()
        nz = Signal(2)             # each source's request has a payload
        m.d.comb += [
            wr_free.eq(~self.wr.valid | self.wr.ready),
            sel.eq(s_wr[1].valid & (rr | ~s_wr[0].valid)),
            go.eq(wr_free & ~occ[depth - 1] & (s_wr[0].valid | s_wr[1].valid)),
            s_wr[0].ready.eq(wr_free & ~occ[depth - 1] & ~sel),
            s_wr[1].ready.eq(wr_free & ~occ[depth - 1] & sel),
            nz[0].eq(s_wr[0].payload.length != 0),
            nz[1].eq(s_wr[1].payload.length != 0),
            push.eq(go & Mux(sel, nz[1], nz[0])),
            push_id.eq(sel),
        ]
        with m.If(wr_free):
            m.d.sync += self.wr.valid.eq(go)
        with m.If(go):
            m.d.sync += [self.wr.payload.eq(Mux(sel, s_wr[1].payload.as_value(),
                                                s_wr[0].payload.as_value())),
                         rr.eq(~sel)]

        # ---------------------------------------------------------------- payloads
        i_free = Signal()
        take = Signal()
        beat = Signal(self.i.payload.shape())
        m.d.comb += [
            i_free.eq(~self.i.valid | self.i.ready),
            s_i[0].ready.eq(i_free & occ[0] & ~head),
            s_i[1].ready.eq(i_free & occ[0] & head),
            take.eq(i_free & occ[0] & Mux(head, s_i[1].valid, s_i[0].valid)),
            beat.eq(Mux(head, s_i[1].payload.as_value(), s_i[0].payload.as_value())),
            pop.eq(take & beat.last),
        ]
        with m.If(i_free):
            m.d.sync += self.i.valid.eq(take)
        with m.If(take):
            m.d.sync += self.i.payload.eq(beat)

        # ---------------------------------------------------------------- FIFO update
        # Entry k after a pop holds entry k + 1; the pushed id goes to the first free entry
        # after the pop.
        for k in range(depth):
            nxt = ids[k + 1] if k + 1 < depth else C(0, 1)
            occ_next = occ[k + 1] if k + 1 < depth else C(0, 1)
            occ_prev = occ[k - 1] if k else C(1, 1)
            here = Signal(name=f"push_here{k}")
            m.d.comb += here.eq(push & Mux(pop, occ[k] & ~occ_next, ~occ[k] & occ_prev))
            with m.If(here):
                m.d.sync += ids[k].eq(push_id)
            with m.Elif(pop):
                m.d.sync += ids[k].eq(nxt)
        with m.If(push & ~pop):
            m.d.sync += occ.eq(Cat(C(1, 1), occ[:depth - 1]))
        with m.Elif(pop & ~push):
            m.d.sync += occ.eq(occ[1:])
        return m
