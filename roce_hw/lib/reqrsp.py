# SPDX-License-Identifier: BSD-2-Clause
"""Sharing a request/response port (one response per request, in order) between masters."""
from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["RequestArbiter"]


class RequestArbiter(wiring.Component):
    """``n`` masters share one request/response slave port (such as the QP table's management
    port), round robin, one request outstanding at a time.

    When idle, the arbiter takes the request of the first valid master after the one served
    last into a register (that master's ``ready`` is high in that cycle), offers it on
    ``m_req`` from the register, and passes the response that comes back to that master; only
    then is the next request taken. A master therefore waits at most ``n - 1`` other
    transactions.

    Latency: a request taken in cycle t is on ``m_req`` in cycle t + 1; the response is passed
    through combinationally. Throughput: one transaction per (slave latency + 2) cycles.
    Backpressure: full, both directions. Combinational paths: ``s{k}_req.ready`` depends on the
    masters' ``valid`` only (never on ``m_req.ready``); ``s{k}_rsp.valid``/``payload`` and
    ``m_rsp.ready`` pass straight through.

    Parameters
    ----------
    req_layout, rsp_layout : shapes
        Payloads of the request and response streams.
    n : int
        Number of masters (at least 1).

    Members
    -------
    s{k}_req : ``In(stream.Signature(req_layout))``, s{k}_rsp : ``Out(stream.Signature(rsp_layout))``
        Master ``k``'s port.
    m_req : ``Out(stream.Signature(req_layout))``, m_rsp : ``In(stream.Signature(rsp_layout))``
        To the slave.
    """

    def __init__(self, req_layout, rsp_layout, n):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive integer, not {n!r}")
        self._n = n
        members = {"m_req": Out(stream.Signature(req_layout)),
                   "m_rsp": In(stream.Signature(rsp_layout))}
        for k in range(n):
            members[f"s{k}_req"] = In(stream.Signature(req_layout))
            members[f"s{k}_rsp"] = Out(stream.Signature(rsp_layout))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        n = self._n
        reqs = [getattr(self, f"s{k}_req") for k in range(n)]
        rsps = [getattr(self, f"s{k}_rsp") for k in range(n)]
        grant = Signal(range(n))      # the master being served / served last
        busy = Signal()               # a request taken, its response not yet back
        issued = Signal()             # ... and already passed to the slave
        valids = Signal(n)
        m.d.comb += valids.eq(Cat(r.valid for r in reqs))

        with m.If(~busy):
            # round robin: the first valid master after the one served last
            pick = Signal(range(n))
            any_valid = Signal()
            m.d.comb += any_valid.eq(valids.any())
            for g in range(n):
                with m.If(grant == g):
                    order = [(g + 1 + j) % n for j in range(n)]
                    for k in reversed(order):
                        with m.If(valids[k]):
                            m.d.comb += pick.eq(k)
            with m.If(any_valid):
                for k in range(n):
                    m.d.comb += reqs[k].ready.eq(pick == k)
                m.d.sync += [grant.eq(pick), busy.eq(1), issued.eq(0),
                             self.m_req.payload.eq(Array(r.payload for r in reqs)[pick])]

        m.d.comb += self.m_req.valid.eq(busy & ~issued)
        with m.If(self.m_req.valid & self.m_req.ready):
            m.d.sync += issued.eq(1)
        with m.If(busy & issued):
            for k in range(n):
                m.d.comb += [rsps[k].valid.eq((grant == k) & self.m_rsp.valid),
                             rsps[k].payload.eq(self.m_rsp.payload)]
            m.d.comb += self.m_rsp.ready.eq(Array(r.ready for r in rsps)[grant])
            with m.If(self.m_rsp.valid & self.m_rsp.ready):
                m.d.sync += busy.eq(0)
        return m
