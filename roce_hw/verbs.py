# SPDX-License-Identifier: BSD-2-Clause
"""Verbs-level definitions shared by TX, RX and reliability: work-request opcodes, ibverbs completion
statuses, and the layouts of the work-request, status and completion streams."""

from amaranth.lib import data

from .config import check_config
from . import proto
from .proto import WcOpcode, WcStatus, WrOpcode
from .layouts import qp_index_width

__all__ = ["WrOpcode", "WcStatus", "WcOpcode", "wr_layout", "resume_layout", "status_layout",
           "completion_layout", "gen_cmd_layout", "MAX_MESSAGE_BYTES", "START_PACKET_BITS"]

#: Largest message a work request may ask for (RoCEv2: 2**31 bytes).
MAX_MESSAGE_BYTES = proto.MAX_MESSAGE_BYTES
#: Width of a packet index within a message (2**31 bytes at the smallest PMTU, 256 bytes).
START_PACKET_BITS = 23


def wr_layout(config):
    """Payload of the work-request stream (one transfer per WR), modelled on ``ibv_send_wr``.

    ==============  =====================  ====================================================
    field           width                  meaning
    ==============  =====================  ====================================================
    ``wr_id``       64                     user cookie, returned in the status report
    ``opcode``      4                      :class:`roce_hw.proto.WrOpcode` (``ibv_wr_opcode``):
                                           RDMA_WRITE 0, RDMA_WRITE_WITH_IMM 1, SEND 2,
                                           SEND_WITH_IMM 3; any other value is refused
    ``qp``          ``qp_index_width``     QP index (row of the QP table; local QPN 256 + qp)
    ``remote_addr`` 64                     RETH VA of the first packet (RDMA WRITE)
    ``r_key``       32                     RETH R_Key (RDMA WRITE)
    ``length``      32                     message length in bytes, 0 to 2**31
    ``imm``         32                     ImmDt (the ``*_WITH_IMM`` opcodes), big-endian on
                                           the wire like ``ibv_send_wr.imm_data``
    ``signaled``    1                      carried for the completion queue of a later issue
                                           (unused now)
    ``solicited``   1                      SE on the last packet (SEND* and WRITE_WITH_IMM)
    ==============  =====================  ====================================================
    """
    config = check_config(config)
    return data.StructLayout({
        "wr_id": 64,
        "opcode": 4,
        "qp": qp_index_width(config.n_qp),
        "remote_addr": 64,
        "r_key": 32,
        "length": 32,
        "imm": 32,
        "signaled": 1,
        "solicited": 1,
    })


def resume_layout(config):
    """Payload of a resume request (go-back-N restart of a message part-way, PROTOCOL.md §5.10):
    the fields of :func:`wr_layout` describing the **whole** original message (``length`` is
    the message length, ``remote_addr`` its start VA), plus

    ===============  ==  ========================================================================
    ``start_packet`` 23  index of the first packet to send again (0 restarts the message whole)
    ``start_psn``    24  its PSN
    ===============  ==  ========================================================================

    The packets from ``start_packet`` on go out as rxe sends them: MIDDLE/LAST without a RETH
    (FIRST/ONLY with the RETH when ``start_packet`` is 0), PSNs from ``start_psn``; the payload
    packet on ``i`` holds the message bytes from ``start_packet * PMTU`` to its end.
    """
    fields = {name: fld.shape for name, fld in wr_layout(config)}
    fields.update({"start_packet": START_PACKET_BITS, "start_psn": proto.PSN_BITS})
    return data.StructLayout(fields)


def status_layout(config):
    """Payload of the status stream: ``{wr_id 64, qp, status 5}``, ``status`` a
    :class:`WcStatus`."""
    config = check_config(config)
    return data.StructLayout({
        "wr_id": 64,
        "qp": qp_index_width(config.n_qp),
        "status": 5,
    })


def completion_layout(config):
    """Payload of a completion stream (one transfer per completed work request or received
    message), modelled on ``struct ibv_wc``. It is the interface the completion queue of the
    reliability issue and the receive side will produce; no block produces it yet (the TX
    engine reports only refused requests, on its ``status`` stream, whose fields are the first
    three here).

    ==============  =====================  ====================================================
    field           width                  meaning
    ==============  =====================  ====================================================
    ``wr_id``       64                     the work request's ``wr_id`` (a send completion)
    ``qp``          ``qp_index_width``     QP index
    ``status``      5                      :class:`WcStatus` (``ibv_wc_status``)
    ``opcode``      8                      :class:`WcOpcode` (``ibv_wc_opcode``; bit 7: a
                                           receive)
    ``byte_len``    32                     bytes received (a receive completion)
    ``with_imm``    1                      ``imm`` is valid (``IBV_WC_WITH_IMM``)
    ``imm``         32                     the ImmDt, as ``ibv_wc.imm_data``
    ==============  =====================  ====================================================
    """
    config = check_config(config)
    return data.StructLayout({
        "wr_id": 64,
        "qp": qp_index_width(config.n_qp),
        "status": 5,
        "opcode": 8,
        "byte_len": 32,
        "with_imm": 1,
        "imm": 32,
    })


def gen_cmd_layout(config):
    """Payload of the traffic generator's command stream (:class:`roce_hw.ctrl.generator.
    TrafficGenerator`; the connection manager's txmeta command, PROTOCOL.md §7).

    ==============  ==================  =========================================================
    field           width               meaning
    ==============  ==================  =========================================================
    ``start``       1                   1: start a run (taken only while idle); 0: stop the run
                                        (the other fields are then ignored)
    ``qp``          ``qp_index_width``  QP index the work requests name
    ``opcode``      4                   :class:`roce_hw.proto.WrOpcode` of every request
    ``length``      32                  message length in bytes (0 to 2**31)
    ``count``       32                  messages in the run (0 sends nothing)
    ``period``      32                  least cycles from a request taken to the next offered
                                        (0 and 1: back to back)
    ``remote_va``   64                  ``remote_addr`` of message 0; message ``n`` gets
                                        ``remote_va + n * length`` (mod 2**64)
    ``r_key``       32                  ``r_key`` of every request
    ==============  ==================  =========================================================
    """
    config = check_config(config)
    return data.StructLayout({
        "start": 1,
        "qp": qp_index_width(config.n_qp),
        "opcode": 4,
        "length": 32,
        "count": 32,
        "period": 32,
        "remote_va": 64,
        "r_key": 32,
    })
