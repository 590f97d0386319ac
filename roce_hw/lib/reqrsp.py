# SPDX-License-Identifier: BSD-2-Clause
"""Sharing a request/response port (one response per request, in order) between masters."""
from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["RequestArbiter"]


class RequestArbiter(wiring.Component):
    """``n`` masters share one request/response slave port (such as the QP table's management
    port), round robin, one request outstanding at a time.

    A master's request is forwarded when it holds the grant; the response that comes back goes
    to that master, and only then is the next request granted (the master that went last has
    the lowest priority). A master therefore waits at most ``n - 1`` other transactions.

    Latency: a request on ``s{k}_req`` with the arbiter idle is on ``m_req`` in the next cycle
    (registered grant); the response is passed through combinationally. Throughput: one
    transaction per (slave latency + 2) cycles. Backpressure: full, both directions.

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
        busy = Signal()               # a request granted, its response not yet back
        issued = Signal()             # ... and already passed to the slave

        with m.If(~busy):
            # round robin: first valid master after the last one served
            order = [(grant + 1 + j) % n if n > 1 else 0 for j in range(n)]
            for j in reversed(range(n)):
                pick = Signal(range(n), name=f"pick{j}")
                m.d.comb += pick.eq(order[j])
                with m.If(Array(r.valid for r in reqs)[pick]):
                    m.d.sync += [grant.eq(pick), busy.eq(1), issued.eq(0)]

        cur_req = Array(reqs)[grant]
        with m.If(busy & ~issued):
            m.d.comb += [self.m_req.valid.eq(cur_req.valid),
                         self.m_req.payload.eq(cur_req.payload)]
            for k in range(n):
                m.d.comb += reqs[k].ready.eq((grant == k) & self.m_req.ready)
            with m.If(self.m_req.ready & cur_req.valid):
                m.d.sync += issued.eq(1)
        with m.If(busy & issued):
            for k in range(n):
                m.d.comb += [rsps[k].valid.eq((grant == k) & self.m_rsp.valid),
                             rsps[k].payload.eq(self.m_rsp.payload)]
            m.d.comb += self.m_rsp.ready.eq(Array(r.ready for r in rsps)[grant])
            with m.If(self.m_rsp.valid & self.m_rsp.ready):
                m.d.sync += busy.eq(0)
        return m
