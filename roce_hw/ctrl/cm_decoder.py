# SPDX-License-Identifier: BSD-2-Clause
"""The connection manager's second stage: the rules that judge a datagram by itself (rules 1 to
8 of :mod:`roce_hw.model.cm`) and what is to be done with it."""
from amaranth import *
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import proto
from ..layouts import qp_index_width
from ..rx.frontend import cm_rx_layout
from .cm_checksum import cm_checked_layout

__all__ = ["CmOp", "REASON_BITS", "reason_code", "cm_command_layout", "cm_job_layout",
           "CmDecoder"]

_REQ = proto.CmReq
_ACK = proto.CmAck
#: Width of a counter index (:data:`roce_hw.proto.CM_COUNTERS`).
REASON_BITS = (len(proto.CM_COUNTERS) - 1).bit_length()


def reason_code(name):
    """The index of counter ``name`` in :data:`roce_hw.proto.CM_COUNTERS`."""
    return proto.CM_COUNTERS.index(name)


class CmOp(enum.Enum, shape=3):
    """What the executor does with a request."""
    NONE = 0        #: nothing: the decoder refused or dropped it (``ack``/``reason``/``reply``)
    OPEN = 1        #: OPEN_QP of the QP ``idx``
    OPEN_SCAN = 2   #: OPEN_QP without a QP number: scan the table
    MODIFY = 3      #: MODIFY_QP_RTS of ``idx``
    CLOSE = 4       #: CLOSE_QP of ``idx``
    FETCH = 5       #: FETCH_QP_INFO of ``idx``
    TX = 6          #: txmeta on ``idx`` (start or stop: the datagram's ``tx_start``)


def cm_command_layout(n_qp):
    """A decoded request: ``op`` (:class:`CmOp`), ``idx`` (the QP it names), and for
    :attr:`CmOp.NONE` the answer: ``ack`` (:class:`~roce_hw.proto.CmAck`), ``reason`` (a
    :func:`reason_code`), ``reply`` (0: no reply). ``to_src_port``: the reply goes to the UDP
    source port (``reply_port`` is 0)."""
    return data.StructLayout({"op": CmOp, "idx": qp_index_width(n_qp), "ack": 3,
                              "reason": REASON_BITS, "reply": 1, "to_src_port": 1})


def cm_job_layout(n_qp):
    """Payload of :class:`CmDecoder`'s output: the datagram (``req``) and its ``cmd``
    (:func:`cm_command_layout`)."""
    return data.StructLayout({"req": cm_rx_layout(), "cmd": cm_command_layout(n_qp)})


class CmDecoder(wiring.Component):
    """Applies the rules that need only the datagram, in the order of the model
    (:class:`roce_hw.model.cm.CmModel`): a bad UDP checksum or no port to reply to drops it, a
    malformed one is answered ERROR, SEND_QP_INFO is ignored, an OPEN from another IP than its
    ``loc_ip`` is an ERROR, a QP number out of range a NAK; the others become a command for
    :class:`~roce_hw.ctrl.cm_executor.CmExecutor` (the OPEN without a QP number a table scan).

    The flags of the rules are registered from the datagram, then the QP number's range and
    index, then the command: latency 3 cycles from ``i.valid`` to ``o.valid``. Throughput and
    backpressure: one datagram at a time; ``o``'s payload is ``i``'s datagram and this stage's
    command register, and ``i`` is taken in the cycle ``o`` is (the datagram stays where the
    first stage holds it until the last stage is done with it).

    Members
    -------
    i : ``In(stream.Signature(cm_checked_layout()))``
    o : ``Out(stream.Signature(cm_job_layout(n_qp)))``
    """

    def __init__(self, n_qp):
        self._n_qp = n_qp
        super().__init__({
            "i": In(stream.Signature(cm_checked_layout())),
            "o": Out(stream.Signature(cm_job_layout(n_qp))),
        })

    def elaborate(self, platform):
        m = Module()
        n_qp = self._n_qp
        iw = qp_index_width(n_qp)
        rq = self.i.payload.req
        d = rq.dgram
        cmd = Signal(cm_command_layout(n_qp))
        m.d.comb += [self.o.payload.req.eq(rq), self.o.payload.cmd.eq(cmd)]

        # the rules' flags, registered in "Idle" from the datagram offered
        bad_sum = Signal()
        no_port = Signal()
        to_src = Signal()
        bad_ack = Signal()
        bad_resv = Signal()
        not_one = Signal()       # not exactly one of valid / tx_valid
        info = Signal()          # SEND_QP_INFO
        bad_field = Signal()     # a 24-bit field with its top byte set
        bad_req = Signal()
        is_open = Signal()
        bad_ip = Signal()        # OPEN: loc_ip is not the frame's source IP
        scan = Signal()          # OPEN without a QP number
        op = Signal(CmOp)        # the command if the QP number is in range
        in_range = Signal()
        idx = Signal(iw)
        base = proto.LOCAL_QPN_BASE
        base_bits = base.bit_length() - 1
        assert base == 1 << base_bits      # the range check below relies on it
        # rem_qpn[8:24] - 1; its top bit: the QPN is below 256
        qhi = Signal(proto.QPN_BITS - base_bits + 1)

        def top(v, bits):
            return v[bits:].any()

        def answer(ack, reason, reply=1):
            m.d.sync += [cmd.op.eq(CmOp.NONE), cmd.ack.eq(ack),
                         cmd.reason.eq(reason_code(reason)), cmd.reply.eq(reply)]

        with m.FSM():
            with m.State("Idle"):
                # the flags of whatever is offered; a datagram stays while it is offered
                kind = Mux(d.valid, d.req_type, 0)
                m.d.sync += [
                    bad_sum.eq(~self.i.payload.checksum_ok),
                    to_src.eq(d.reply_port == 0),
                    no_port.eq((d.reply_port == 0) & (rq.src_port == 0)),
                    bad_ack.eq(d.ack_valid | d.ack_type.any()),
                    bad_resv.eq(d.tx_resv.any()),
                    not_one.eq(~(d.valid ^ d.tx_valid)),
                    info.eq(d.valid & (d.req_type == _REQ.SEND_QP_INFO)),
                    bad_field.eq(top(d.loc_qpn, proto.QPN_BITS) |
                                 top(d.loc_psn, proto.PSN_BITS) |
                                 top(d.rem_qpn, proto.QPN_BITS) |
                                 top(d.rem_psn, proto.PSN_BITS)),
                    bad_req.eq(d.valid & ~d.req_type.matches(_REQ.OPEN_QP, _REQ.MODIFY_QP_RTS,
                                                             _REQ.CLOSE_QP, _REQ.FETCH_QP_INFO)),
                    is_open.eq(kind == _REQ.OPEN_QP),
                    bad_ip.eq(d.loc_ip != rq.src_ip),
                    scan.eq(d.rem_qpn[:proto.QPN_BITS] == 0),
                    qhi.eq(d.rem_qpn[base_bits:proto.QPN_BITS] - 1),
                    op.eq(Mux(~d.valid, CmOp.TX,
                          Mux(kind == _REQ.OPEN_QP, CmOp.OPEN,
                          Mux(kind == _REQ.MODIFY_QP_RTS, CmOp.MODIFY,
                          Mux(kind == _REQ.CLOSE_QP, CmOp.CLOSE, CmOp.FETCH))))),
                ]
                with m.If(self.i.valid):
                    m.next = "Range"
            with m.State("Range"):
                # QPN 256 + i for i < n_qp: rem_qpn[8:24] - 1 did not borrow and, with the low
                # byte, is below n_qp
                low = d.rem_qpn[:base_bits]
                m.d.sync += [in_range.eq(~qhi[-1] & (Cat(low, qhi[:-1]) < n_qp)),
                             idx.eq(Cat(low, qhi)[:iw])]
                m.next = "Decide"
            with m.State("Decide"):
                m.d.sync += [cmd.idx.eq(idx), cmd.to_src_port.eq(to_src),
                             cmd.ack.eq(_ACK.ACK), cmd.reason.eq(reason_code("ok")),
                             cmd.reply.eq(1)]
                with m.If(bad_sum):
                    answer(_ACK.NULL, "bad_checksum", reply=0)
                with m.Elif(no_port):
                    answer(_ACK.NULL, "bad_port", reply=0)
                with m.Elif(bad_ack):
                    answer(_ACK.ERROR, "bad_flags")
                with m.Elif(bad_resv):
                    answer(_ACK.ERROR, "bad_txmeta")
                with m.Elif(not_one):
                    answer(_ACK.ERROR, "bad_flags")
                with m.Elif(info):
                    answer(_ACK.NULL, "ignored", reply=0)
                with m.Elif(bad_field):
                    answer(_ACK.ERROR, "bad_field")
                with m.Elif(bad_req):
                    answer(_ACK.ERROR, "bad_req")
                with m.Elif(is_open & bad_ip):
                    answer(_ACK.ERROR, "bad_field")
                with m.Elif(is_open & scan):
                    m.d.sync += cmd.op.eq(CmOp.OPEN_SCAN)
                with m.Elif(~in_range):
                    answer(_ACK.NAK, "bad_qpn")
                with m.Else():
                    m.d.sync += cmd.op.eq(op)
                m.next = "Out"
            with m.State("Out"):
                m.d.comb += [self.o.valid.eq(1), self.i.ready.eq(self.o.ready)]
                with m.If(self.o.ready):
                    m.next = "Idle"
        return m
