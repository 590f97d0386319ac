# SPDX-License-Identifier: BSD-2-Clause
"""The connection manager's last stage: the reply datagram and the counters."""
from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import layouts, proto
from ..lib.arith import event_counter
from .cm_executor import cm_result_layout

__all__ = ["cm_reply_layout", "cm_counters_layout", "CmReplier"]


def cm_reply_layout():
    """A reply datagram and where it goes (UDP source port 0x4321)."""
    return data.StructLayout({"dst_mac": 48, "dst_ip": 32, "dst_port": 16,
                              "dgram": layouts.CM_DATAGRAM})


def cm_counters_layout():
    """:data:`roce_hw.proto.CM_COUNTERS`, 32-bit wrapping counts."""
    return data.StructLayout({name: 32 for name in proto.CM_COUNTERS})


class CmReplier(wiring.Component):
    """Sends the reply a request's outcome calls for and counts the request.

    The reply (:mod:`roce_hw.model.cm`, "Every reply") goes to the frame's source MAC and IP, at
    ``reply_port`` or, when it is 0, the UDP source port. Its datagram is the request with loc_*
    and rem_* swapped, ``loc_ip`` the engine's, ``ack_valid`` 1 and ``ack_type`` the outcome's
    code; an ACK also carries the engine QPN in ``loc_qpn``, 0 in ``loc_r_key`` and
    ``loc_base_addr``, in ``loc_psn`` the request's ``rem_psn`` or the row's ``next_psn``, and
    for FETCH_QP_INFO the row (its state in ``loc_r_key``; ``remote_qpn``, ``rq_psn``,
    ``r_key``, ``remote_va``, ``remote_ip`` in rem_*).

    The reply is combinational from the registers of the earlier stages (which hold the request
    until ``i`` is taken): ``reply.valid`` is ``i.valid`` of a request to answer; ``i`` is taken
    with the reply, or at once when there is none. The counter of the outcome's reason is
    counted one cycle later. Latency: 0 cycles; throughput: a request per cycle; backpressure:
    ``reply`` may wait any time.

    Members
    -------
    i : ``In(stream.Signature(cm_result_layout()))``
    reply : ``Out(stream.Signature(cm_reply_layout()))``
    local_ip : ``In(32)``
    counters : ``Out(cm_counters_layout())``
    """

    def __init__(self):
        super().__init__({
            "i": In(stream.Signature(cm_result_layout())),
            "reply": Out(stream.Signature(cm_reply_layout())),
            "local_ip": In(32),
            "counters": Out(cm_counters_layout()),
        })

    def elaborate(self, platform):
        m = Module()
        rq, row, out = self.i.payload.req, self.i.payload.row, self.i.payload.outcome
        d = rq.dgram
        rp = self.reply.payload
        r = rp.dgram
        acked = Signal()
        m.d.comb += acked.eq(out.ack == proto.CmAck.ACK)

        m.d.comb += [
            self.reply.valid.eq(self.i.valid & out.reply),
            self.i.ready.eq(self.reply.ready | ~out.reply),
            rp.dst_mac.eq(rq.src_mac), rp.dst_ip.eq(rq.src_ip),
            rp.dst_port.eq(Mux(out.to_src_port, rq.src_port, d.reply_port)),
            # the request, swapped, the engine's IP in loc_ip; the ACK fields over it
            r.eq(d), r.ack_valid.eq(1), r.ack_type.eq(out.ack),
            r.loc_qpn.eq(Mux(acked, out.qpn, d.rem_qpn)),
            r.loc_psn.eq(Mux(out.row_psn, row.next_psn, d.rem_psn)),
            r.loc_r_key.eq(Mux(acked, Mux(out.fetch, row.state, 0), d.rem_r_key)),
            r.loc_base_addr.eq(Mux(acked, 0, d.rem_base_addr)),
            r.loc_ip.eq(self.local_ip),
            r.rem_qpn.eq(Mux(out.fetch, row.remote_qpn, d.loc_qpn)),
            r.rem_psn.eq(Mux(out.fetch, row.rq_psn, d.loc_psn)),
            r.rem_r_key.eq(Mux(out.fetch, row.r_key, d.loc_r_key)),
            r.rem_base_addr.eq(Mux(out.fetch, row.remote_va, d.loc_base_addr)),
            r.rem_ip.eq(Mux(out.fetch, row.remote_ip, d.loc_ip)),
        ]

        # one strobe per counter, registered
        count = Signal(len(proto.CM_COUNTERS))
        m.d.sync += count.eq(0)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += count.eq(1 << out.reason)
        for k, name in enumerate(proto.CM_COUNTERS):
            m.d.comb += self.counters[name].eq(event_counter(m, 32, count[k], f"cm_{name}"))
        return m
