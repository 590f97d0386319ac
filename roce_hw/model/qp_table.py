# SPDX-License-Identifier: BSD-2-Clause
"""Golden model of the QP/PSN state table: a dict of per-QP context rows (no Amaranth)."""

from .. import proto
from ..config import check_n_qp

__all__ = ["CONTEXT_FIELDS", "QPStateModel"]

#: Field name -> width in bits of a QP context row (:data:`roce_hw.proto.QP_CONTEXT_FIELDS`).
CONTEXT_FIELDS = dict(proto.QP_CONTEXT_FIELDS)


class QPStateModel:
    """Transaction-level model of ``QPStateTable``: every row starts all-zero (state RESET).

    Within one clock cycle the hardware's management port reads after that cycle's writes
    (transparent) and its ``tx_rd`` port before them; a management write reaches ``tx_rd`` a
    cycle later than an update (the hardware's write stage).

    Parameters
    ----------
    n_qp : int
        Number of rows; indices ``n_qp`` and above are out of range.
    """

    def __init__(self, n_qp):
        check_n_qp(n_qp)
        self.n_qp = n_qp
        self.rows = [self.zero_row() for _ in range(n_qp)]
        self.dropped = 0

    @staticmethod
    def zero_row():
        """An all-zero context row."""
        return dict.fromkeys(CONTEXT_FIELDS, 0)

    @staticmethod
    def local_qpn(index):
        """Local QPN of row ``index`` (256 + index)."""
        return proto.LOCAL_QPN_BASE + index

    def _check_row(self, ctx):
        row = self.zero_row()
        for name, value in ctx.items():
            if name not in CONTEXT_FIELDS:
                raise KeyError(f"unknown QP context field {name!r}")
            if not 0 <= value < 1 << CONTEXT_FIELDS[name]:
                raise ValueError(f"{name}={value} does not fit {CONTEXT_FIELDS[name]} bits")
            row[name] = value
        return row

    def mgmt(self, qp, write, ctx=None):
        """A management request; returns the response ``{qp, write, error, ctx}``."""
        if not 0 <= qp < self.n_qp:
            return {"qp": qp, "write": int(write), "error": 1, "ctx": self.zero_row()}
        if write:
            self.rows[qp] = self._check_row(ctx or {})
        return {"qp": qp, "write": int(write), "error": 0, "ctx": dict(self.rows[qp])}

    def read(self, qp):
        """The datapath read port: the row, or an all-zero row when out of range."""
        if not 0 <= qp < self.n_qp:
            return self.zero_row()
        return dict(self.rows[qp])

    def tx_upd(self, qp, psn_we, next_psn, state_we, state):
        """The TX write-back of ``next_psn`` and/or ``state``."""
        if not 0 <= qp < self.n_qp:
            self.dropped += 1
            return
        if psn_we:
            self.rows[qp]["next_psn"] = next_psn & proto.PSN_MASK
        if state_we:
            self.rows[qp]["state"] = state & 0x7

    def una_upd(self, qp, una_psn):
        """The ACK handler's write-back of ``una_psn``."""
        if not 0 <= qp < self.n_qp:
            self.dropped += 1
            return
        self.rows[qp]["una_psn"] = una_psn & proto.PSN_MASK
