# SPDX-License-Identifier: BSD-2-Clause
"""Amaranth views of the protocol headers of :mod:`roce_hw.proto`, and lane helpers.

``network_struct(header)`` turns a wire-order :class:`roce_hw.proto.Header` into a
``data.StructLayout`` whose bit image, read as a big-endian integer, is the wire image::

    layout.const(fields).as_bits().to_bytes(header.size, "big") == header.pack(fields)

On a packet bus the first wire byte travels in ``data[7:0]`` (see :mod:`roce_hw.lib.stream`);
:func:`to_lanes` converts a header value into that lane order and :func:`from_lanes` back.
"""

from amaranth import *
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from . import proto
from .config import check_n_qp

__all__ = [
    "network_struct", "to_lanes", "from_lanes",
    "ETH", "VLAN_TAG", "IPV4", "IPV6", "UDP", "BTH", "RETH", "AETH", "IMMDT", "IETH", "DETH",
    "CNP_PAD", "CM_DATAGRAM", "ARP",
    "QP_CONTEXT", "qp_index_width", "local_qpn", "qp_index", "mgmt_req_layout",
    "mgmt_rsp_layout", "tx_upd_layout", "una_upd_layout", "sending_layout",
    "ack_event_layout", "posted_layout", "qp_error_layout",
    "qp_reset_layout", "timer_setup_layout", "timer_arm_layout", "timer_rnr_layout",
    "timer_fire_layout", "IndexSignature", "QPReadSignature",
]


def network_struct(header):
    """``data.StructLayout`` for a :class:`~roce_hw.proto.Header` (wire order, MSB first)."""
    if not isinstance(header, proto.Header):
        raise TypeError(f"expected a proto.Header, not {header!r}")
    return data.StructLayout(dict(reversed(header.fields)))


def _byte_reverse(value, nbytes):
    # Reversing the byte order is its own inverse, so one function serves both directions.
    v = Value.cast(value)
    if len(v) != nbytes * 8:
        raise ValueError(f"value is {len(v)} bits, expected {nbytes * 8}")
    return Cat(*[v.word_select(nbytes - 1 - i, 8) for i in range(nbytes)])


def to_lanes(value, nbytes):
    """Reorder a big-endian (wire-order) bit vector of ``nbytes`` bytes into bus lane order,
    wire byte 0 in bits [7:0]. ``value`` may be a ``data.View`` or any ``Value``.

    Raises ``ValueError`` if ``value`` is not ``8 * nbytes`` bits wide."""
    return _byte_reverse(value, nbytes)


def from_lanes(value, nbytes):
    """Inverse of :func:`to_lanes`: lane-ordered bytes to a big-endian bit vector.

    Raises ``ValueError`` if ``value`` is not ``8 * nbytes`` bits wide."""
    return _byte_reverse(value, nbytes)


ETH = network_struct(proto.ETH)
VLAN_TAG = network_struct(proto.VLAN_TAG)
IPV4 = network_struct(proto.IPV4)
IPV6 = network_struct(proto.IPV6)
UDP = network_struct(proto.UDP)
BTH = network_struct(proto.BTH)
RETH = network_struct(proto.RETH)
AETH = network_struct(proto.AETH)
IMMDT = network_struct(proto.IMMDT)
IETH = network_struct(proto.IETH)
DETH = network_struct(proto.DETH)
CNP_PAD = network_struct(proto.CNP_PAD)
CM_DATAGRAM = network_struct(proto.CM_DATAGRAM)
ARP = network_struct(proto.ARP)


# ---------------------------------------------------------------- the QP table's interfaces
# (the table is :class:`roce_hw.ctrl.qp_table.QPStateTable`; its readers and writers in the
# datapaths and the control plane import these, never the table)

#: One QP context row: :data:`roce_hw.proto.QP_CONTEXT_FIELDS` as a ``data.StructLayout`` (the
#: field meanings are documented there). The local QPN is not stored: it is :func:`local_qpn`
#: of the row index.
QP_CONTEXT = data.StructLayout(dict(proto.QP_CONTEXT_FIELDS))

def qp_index_width(n_qp):
    """Width in bits of a QP index for a table of ``n_qp`` queue pairs (at least 1)."""
    check_n_qp(n_qp)
    return max(1, (n_qp - 1).bit_length())


def local_qpn(index):
    """Local QPN of QP row ``index``: ``proto.LOCAL_QPN_BASE + index`` (256 + index).

    Works on Python integers (returns an ``int``) and on Amaranth values (returns a 24-bit
    expression; name it as a Signal where it is reused)."""
    if isinstance(index, int):
        if index < 0 or proto.LOCAL_QPN_BASE + index > proto.QPN_MASK:
            raise ValueError(f"QP index {index} out of range")
        return proto.LOCAL_QPN_BASE + index
    return (Value.cast(index) + proto.LOCAL_QPN_BASE)[:proto.QPN_BITS]


def qp_index(qpn, n_qp=None):
    """QP row index of local QPN ``qpn`` (Python integers only).

    Raises ``ValueError`` if ``qpn`` is below ``proto.LOCAL_QPN_BASE`` or, when ``n_qp`` is
    given, not below ``LOCAL_QPN_BASE + n_qp``."""
    index = qpn - proto.LOCAL_QPN_BASE
    if index < 0 or (n_qp is not None and index >= n_qp):
        raise ValueError(f"QPN {qpn:#x} is not a local QP of this table")
    return index


def mgmt_req_layout(n_qp):
    """Payload of the management request stream: ``{qp, write, ctx}``."""
    return data.StructLayout({"qp": qp_index_width(n_qp), "write": 1, "ctx": QP_CONTEXT})


def mgmt_rsp_layout(n_qp):
    """Payload of the management response stream: ``{qp, write, error, ctx}``."""
    return data.StructLayout({"qp": qp_index_width(n_qp), "write": 1, "error": 1,
                              "ctx": QP_CONTEXT})


def tx_upd_layout(n_qp):
    """Payload of the TX write-back stream: ``{qp, psn_we, next_psn, state_we, state}``."""
    return data.StructLayout({"qp": qp_index_width(n_qp), "psn_we": 1, "next_psn": proto.PSN_BITS,
                              "state_we": 1, "state": 3})


def una_upd_layout(n_qp):
    """Payload of the ACK handler's write-back stream: ``{qp, una_psn}``."""
    return data.StructLayout({"qp": qp_index_width(n_qp), "una_psn": proto.PSN_BITS})


def sending_layout(n_qp):
    """What the TX path is sending, for the ACK handler's window check: ``{open, qp,
    psn_next}``. ``open`` is 1 while a new (not resumed) message of QP ``qp`` has packets
    committed and more to come; ``psn_next`` is then the PSN after its last committed packet.
    (When a message ends, the QP table's ``next_psn`` takes over.)"""
    return data.StructLayout({"open": 1, "qp": qp_index_width(n_qp), "psn_next": proto.PSN_BITS})


def ack_event_layout(n_qp):
    """One event of the ACK handler (:class:`roce_hw.ctrl.ack.AckHandler`), for a QP in RTS
    whose peer sent it, inside the QP's outstanding window: ``{qp, kind, psn, code, msn}``.
    ``kind`` is a :class:`roce_hw.proto.AckKind`; ``psn`` the BTH PSN; ``code`` the AETH
    syndrome's low 5 bits (RNR timer code, NAK code, ACK credits); ``msn`` the AETH MSN."""
    return data.StructLayout({"qp": qp_index_width(n_qp), "kind": 3, "psn": proto.PSN_BITS,
                              "code": 5, "msn": 24})


def posted_layout(n_qp):
    """One work request the TX path has sent, for the completer
    (:class:`roce_hw.ctrl.completer.Completer`): ``{qp, wr_id 64, opcode 4, length 32,
    signaled 1, first_psn 24, last_psn 24, remote_addr 64, r_key 32, imm 32, solicited 1}``.
    ``opcode`` is a :class:`roce_hw.proto.WrOpcode`, ``first_psn`` and ``last_psn`` the PSNs of
    its first and last packet; the last four are the WR's, kept so that the WR can be sent
    again (go-back-N) with the same headers."""
    return data.StructLayout({"qp": qp_index_width(n_qp), "wr_id": 64, "opcode": 4,
                              "length": 32, "signaled": 1, "first_psn": proto.PSN_BITS,
                              "last_psn": proto.PSN_BITS, "remote_addr": 64, "r_key": 32,
                              "imm": 32, "solicited": 1})


def qp_error_layout(n_qp):
    """The completer's report that QP ``qp`` must go to ERROR: ``{qp, status 5}``, ``status``
    the :class:`roce_hw.proto.WcStatus` of the WR that failed."""
    return data.StructLayout({"qp": qp_index_width(n_qp), "status": 5})


def timer_setup_layout(n_qp):
    """A QP set up (management write) for the retransmission timers
    (:class:`roce_hw.ctrl.timers.RetxTimers`): ``{qp, timeout 5, retry_cnt 3, rnr_retry 3}``,
    the QP context's fields of the same names (``ibv_qp_attr``)."""
    return data.StructLayout({"qp": qp_index_width(n_qp), "timeout": 5, "retry_cnt": 3,
                              "rnr_retry": 3})


def timer_arm_layout(n_qp):
    """The completer's news for a QP's ACK timer after it took a WR or an event:
    ``{qp, outstanding 1, progress 1}``: ``outstanding``, the QP has WRs not yet acknowledged
    (else the timer stops); ``progress``, the peer acknowledged something new (the timer starts
    again and the retry counts are reset)."""
    return data.StructLayout({"qp": qp_index_width(n_qp), "outstanding": 1, "progress": 1})


def timer_rnr_layout(n_qp):
    """An RNR NAK for a QP, for its RNR wait: ``{qp, code 5}``, ``code`` the RNR timer code
    (:data:`roce_hw.proto.RNR_TIMER_US`)."""
    return data.StructLayout({"qp": qp_index_width(n_qp), "code": 5})


def timer_fire_layout(n_qp):
    """What a QP's timer decided: ``{qp, kind 2}``, ``kind`` a
    :class:`roce_hw.proto.TimerKind` (go back after a timeout or an RNR wait, or retries
    exhausted)."""
    return data.StructLayout({"qp": qp_index_width(n_qp), "kind": 2})


def qp_reset_layout(n_qp):
    """QP ``qp`` was set up again (closed, opened): ``{qp}``."""
    return data.StructLayout({"qp": qp_index_width(n_qp)})


class IndexSignature(wiring.Signature):
    """Base of the signatures parameterised by a QP index width: ``idx_width``, equality and
    ``repr`` by it."""

    @property
    def idx_width(self):
        """Width of the QP index."""
        return self._idx_width

    def __eq__(self, other):
        return type(other) is type(self) and other.idx_width == self.idx_width

    def __repr__(self):
        return f"{type(self).__name__}({self._idx_width})"


class QPReadSignature(IndexSignature):
    """Read port of a :class:`QPStateTable` row, seen from the reader (like
    ``memory.ReadPort.Signature``): a component that reads uses ``Out(QPReadSignature(w))``, the
    table has ``In(QPReadSignature(w))``.

    Not a stream: the reader drives ``addr`` and ``en``; ``data`` holds the row of ``addr``
    the cycle after a cycle with ``en`` asserted (fixed 1-cycle latency, never blocked) and keeps
    it while ``en`` is low.

    Members
    -------
    addr : ``Out(idx_width)``
        QP index.
    en : ``Out(1)``
        Read enable.
    data : ``In(QP_CONTEXT)``
        The row.

    Raises
    ------
    ValueError
        If ``idx_width`` is not an integer from 1 to 14.
    """

    def __init__(self, idx_width):
        if isinstance(idx_width, bool) or not isinstance(idx_width, int) or \
                not 1 <= idx_width <= 14:
            raise ValueError(f"index width must be an integer from 1 to 14, not {idx_width!r}")
        self._idx_width = idx_width
        super().__init__({"addr": Out(idx_width), "en": Out(1), "data": In(QP_CONTEXT)})
