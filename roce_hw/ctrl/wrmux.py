# SPDX-License-Identifier: BSD-2-Clause
"""Work-request multiplexer: two sources of requests and payload packets (the user's, with
resumes, and the traffic generator's) -> one TX engine input set."""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..config import check_config
from ..lib.stream import PacketSignature
from ..verbs import resume_layout, wr_layout

__all__ = ["WrMux"]


class WrMux(wiring.Component):
    """Merges two request sources, each a request stream and its ``i`` payload packets, into
    the inputs of one :class:`roce_hw.engine.TxEngine` (``wr``, ``resume``, ``i``). Source 0
    offers work requests (``s0_wr``) and resume requests (``s0_resume``), source 1 work
    requests only (``s1_wr``).

    Requests. One request is granted per slot, round robin between the sources with a request
    valid (a source offering back to back gets every other slot while the other one offers
    too, every slot while it is alone); within source 0 a resume goes before a work request
    offered in the same cycle, as in the TX engine. The granted request is offered on ``wr``
    (a work request) or on ``resume`` (a resume), never on both at once: the next one is
    granted only in the cycle the TX engine takes it. So the TX engine takes the requests in
    the order they were granted, although it takes ``resume`` before ``wr``: each source's
    requests keep the order of their transfers, and the payload order below is the TX
    engine's.

    Payloads. The TX engine reads one payload packet per request it takes with ``length`` > 0
    (a refused one too: it is drained), in the order it takes them; a resume's packet holds
    the message's bytes from ``start_packet * PMTU`` on. The mux passes the payload packet of
    every granted request with ``length`` > 0 in grant order, whole (``first`` to ``last``),
    never mixing two sources' beats; a source's packets must follow its own request order. A
    small FIFO (``depth`` entries) keeps the source of each granted request until its payload
    has fully passed (a request without payload leaves it in the cycle it reaches its head);
    while it is full no request is granted. A source's payload beats may
    be offered before or after its request: they wait until the request has been granted and
    the payloads granted before have passed.

    A resume whose ``start_packet`` is not a packet of its message (``start_packet * PMTU`` >=
    ``length`` > 0 by the QP's PMTU) is refused by the TX engine, which then reads no payload
    packet for it, whereas the mux (which does not know the QP's PMTU) counts one for any
    ``length`` > 0. Such a resume must not be posted here: the payload order of the sources
    would be wrong from then on. Every other request, refused or not, reads exactly one packet
    iff ``length`` > 0, as the mux counts.

    Status reports. The TX engine's ``status`` reports carry ``wr_id`` and ``qp`` only, not the
    source; the user tells their own reports from the traffic generator's
    (:class:`roce_hw.ctrl.generator.TrafficGenerator`) by QP: do not post user requests on the
    QP the generator runs on (its ``qp`` output while ``busy``).

    Latency: a request transferred on ``s0_wr``, ``s0_resume`` or ``s1_wr`` in cycle ``t`` is
    offered on ``wr`` or ``resume`` in cycle ``t + 1``; a payload beat transferred on ``s*_i``
    in cycle ``t`` is offered on ``i`` in cycle ``t + 1`` (the earliest a request's first
    payload beat can pass is the cycle after its request was granted). Throughput: one request
    and one payload beat per cycle, also across sources, kinds and packets (no idle cycle is
    added for a single busy source at full rate; the TX engine itself takes at most a request
    every other cycle). Backpressure: ``wr``, ``resume`` and ``i`` are registered outputs; the
    requests' ``ready`` are a function of ``wr.ready``, ``resume.ready``, the output and FIFO
    registers and the sources' request ``valid``; ``s*_i.ready`` of ``i.ready`` and registers.
    A stalled ``i`` stalls requests only once the FIFO is full.

    Parameters
    ----------
    config : EngineConfig
        ``data_width`` and ``n_qp``.
    depth : int
        Entries of the source FIFO (1 to 64, default 8): granted requests whose payloads may be
        outstanding.

    Members
    -------
    s0_wr : ``In(stream.Signature(wr_layout(config)))``
    s0_resume : ``In(stream.Signature(resume_layout(config)))``
        Work and resume requests of source 0 (the user).
    s1_wr : ``In(stream.Signature(wr_layout(config)))``
        Work requests of source 1 (the traffic generator).
    s0_i, s1_i : ``In(PacketSignature(data_width))``
        The sources' payload packets.
    wr : ``Out(stream.Signature(wr_layout(config)))``
    resume : ``Out(stream.Signature(resume_layout(config)))``
    i : ``Out(PacketSignature(data_width))``
        To the TX engine's ``wr``, ``resume`` and ``i``.

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
            "s0_resume": In(stream.Signature(resume_layout(config))),
            "s0_i": In(PacketSignature(w)),
            "s1_wr": In(stream.Signature(wr_layout(config))),
            "s1_i": In(PacketSignature(w)),
            "wr": Out(stream.Signature(wr_layout(config))),
            "resume": Out(stream.Signature(resume_layout(config))),
            "i": Out(PacketSignature(w)),
        })

    @property
    def depth(self):
        """Entries of the source FIFO."""
        return self._depth

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        depth = self._depth
        s_i = (self.s0_i, self.s1_i)

        # Source FIFO: `ids[k]` is the source of entry k (0 = oldest), `pay0[k]`/`pay1[k]`
        # whether source 0's/1's request of that grant had a payload packet (the entry's own is
        # the one of `ids[k]`), `occ` a thermometer code of the occupied entries, so the head,
        # "not empty" (occ[0]) and "full" (occ[depth - 1]) are registers. Every granted
        # request gets an entry (one without payload leaves as soon as it is the head): the
        # 32-bit `length != 0` tests are then data written, not conditions of the write, nor
        # behind the grant's source multiplexer, which keeps the paths from a source's
        # `length` within 6 cells.
        ids = Signal(depth)
        pay0 = Signal(depth)
        pay1 = Signal(depth)
        occ = Signal(depth)
        head = Signal()
        head_pay = Signal()
        push = Signal()
        push_id = Signal()
        pop = Signal()
        m.d.comb += [head.eq(ids[0]), head_pay.eq(Mux(head, pay1[0], pay0[0]))]

        # ---------------------------------------------------------------- requests
        # One output register for both kinds (`kind` = a resume): only one request is ever
        # offered, so the TX engine's priority of `resume` over `wr` cannot reorder them.
        req = Signal(resume_layout(cfg))
        kind = Signal()
        valid = Signal()
        taken = Signal()
        m.d.comb += [
            self.wr.valid.eq(valid & ~kind),
            self.resume.valid.eq(valid & kind),
            self.resume.payload.eq(req),
            taken.eq(Mux(kind, self.resume.ready, self.wr.ready)),
        ]
        for name, _ in wr_layout(cfg):
            m.d.comb += self.wr.payload[name].eq(req[name])

        rr = Signal()              # the source with priority on a tie
        sel = Signal()             # source 1 is granted
        res0 = Signal()            # source 0's request is its resume
        s0_valid = Signal()
        go = Signal()
        free = Signal()
        nz = Signal(3)             # each request has a payload: s0 resume, s0 WR, s1 WR
        m.d.comb += [
            free.eq((~valid | taken) & ~occ[depth - 1]),
            res0.eq(self.s0_resume.valid),
            s0_valid.eq(self.s0_resume.valid | self.s0_wr.valid),
            sel.eq(self.s1_wr.valid & (rr | ~s0_valid)),
            go.eq(free & (s0_valid | self.s1_wr.valid)),
            self.s0_resume.ready.eq(free & ~sel),
            self.s0_wr.ready.eq(free & ~sel & ~res0),
            self.s1_wr.ready.eq(free & sel),
            nz[0].eq(self.s0_resume.payload.length != 0),
            nz[1].eq(self.s0_wr.payload.length != 0),
            nz[2].eq(self.s1_wr.payload.length != 0),
            push.eq(go),
            push_id.eq(sel),
        ]
        with m.If(~valid | taken):
            m.d.sync += valid.eq(go)
        with m.If(go):
            m.d.sync += [kind.eq(~sel & res0), rr.eq(~sel)]
            for name, _ in wr_layout(cfg):
                m.d.sync += req[name].eq(Mux(sel, self.s1_wr.payload[name],
                                             Mux(res0, self.s0_resume.payload[name],
                                                 self.s0_wr.payload[name])))
            # (a work request's are don't-care: the resume port's, without a multiplexer)
            m.d.sync += [req.start_packet.eq(self.s0_resume.payload.start_packet),
                         req.start_psn.eq(self.s0_resume.payload.start_psn)]

        # ---------------------------------------------------------------- payloads
        i_free = Signal()
        take = Signal()
        beat = Signal(self.i.payload.shape())
        m.d.comb += [
            i_free.eq(~self.i.valid | self.i.ready),
            s_i[0].ready.eq(i_free & occ[0] & head_pay & ~head),
            s_i[1].ready.eq(i_free & occ[0] & head_pay & head),
            take.eq(i_free & occ[0] & head_pay & Mux(head, s_i[1].valid, s_i[0].valid)),
            beat.eq(Mux(head, s_i[1].payload.as_value(), s_i[0].payload.as_value())),
            pop.eq(occ[0] & ~head_pay | take & beat.last),
        ]
        with m.If(i_free):
            m.d.sync += self.i.valid.eq(take)
        with m.If(take):
            m.d.sync += self.i.payload.eq(beat)

        # ---------------------------------------------------------------- FIFO update
        # Entry k after a pop holds entry k + 1; the pushed id goes to the first free entry
        # after the pop.
        for k in range(depth):
            nxt = Cat(ids[k + 1], pay0[k + 1], pay1[k + 1]) if k + 1 < depth else C(0, 3)
            occ_next = occ[k + 1] if k + 1 < depth else C(0, 1)
            occ_prev = occ[k - 1] if k else C(1, 1)
            here = Signal(name=f"push_here{k}")
            m.d.comb += here.eq(push & Mux(pop, occ[k] & ~occ_next, ~occ[k] & occ_prev))
            with m.If(here):
                m.d.sync += Cat(ids[k], pay0[k], pay1[k]).eq(
                    Cat(push_id, Mux(res0, nz[0], nz[1]), nz[2]))
            with m.Elif(pop):
                m.d.sync += Cat(ids[k], pay0[k], pay1[k]).eq(nxt)
        with m.If(push & ~pop):
            m.d.sync += occ.eq(Cat(C(1, 1), occ[:depth - 1]))
        with m.Elif(pop & ~push):
            m.d.sync += occ.eq(occ[1:])
        return m
