# SPDX-License-Identifier: BSD-2-Clause
"""PSN forwarding: the TX path's recent QP write-backs, for readers whose QP row predates them."""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .. import proto
from ..lib.arith import or_tree
from ..layouts import IndexSignature, qp_index_width

__all__ = ["WriteBackSignature", "PsnLookupSignature", "PsnForward"]


class WriteBackSignature(IndexSignature):
    """A TX write-back of one QP, seen from its producer (a pulse, never blocked).

    Members
    -------
    valid : ``Out(1)``
        A write-back takes place this cycle.
    qp : ``Out(idx_width)``
    psn : ``Out(PSN_BITS)``
        The QP's next PSN from now on.
    err : ``Out(1)``
        The QP is moved to ERROR (later work requests for it are refused).
    qp_next : ``Out(idx_width)``
        ``qp`` of the next cycle (whether or not that cycle has a write-back): a consumer
        compares it with its key a cycle ahead and registers the result, so "this write-back
        is of my QP" is a flip-flop AND ``valid`` (ECP5 timing).
    """

    def __init__(self, idx_width):
        self._idx_width = idx_width
        super().__init__({"valid": Out(1), "qp": Out(idx_width), "psn": Out(proto.PSN_BITS),
                          "err": Out(1), "qp_next": Out(idx_width)})


class PsnLookupSignature(IndexSignature):
    """A look-up of the newest write-back of one QP, seen from the asker (the
    :class:`PsnForward` has it flipped). Not a stream: the answer is for the key of this cycle
    (or of the previous one: :class:`PsnForward` ``registered_key``), every cycle.

    Members
    -------
    qp : ``Out(idx_width)``
        The key.
    hit : ``In(1)``
        A write-back of that QP is known.
    psn : ``In(PSN_BITS)``, err : ``In(1)``
        Its next PSN and error flag (don't-care without ``hit``).
    """

    def __init__(self, idx_width):
        self._idx_width = idx_width
        super().__init__({"qp": Out(idx_width), "hit": In(1), "psn": In(proto.PSN_BITS),
                          "err": In(1)})


class PsnForward(wiring.Component):
    """A small content-addressed memory of the newest write-backs of the TX path.

    The QP table is written through a FIFO and an arbiter, and a work request's row is read when
    the request is accepted, possibly long before it is segmented: a row read may miss the
    write-backs of the messages ahead of it. This block keeps the last ``depth`` write-backs
    (QP, next PSN, error) and answers a look-up with the newest one for a QP, the write-back of
    the current cycle included (so a look-up never sees stale data). A management write of a QP
    (``snoop_valid``/``snoop_qp``) forgets that QP's entries: the table holds the truth again.

    Latency: the look-up is combinational (a ``depth``-way compare of QP indices and an AND-OR
    select); a write-back is visible to look-ups in its own cycle. With ``registered_key`` the
    key is registered: the answer in cycle t is for the key of cycle t - 1, against the entries
    and the write-back of cycle t; each entry's hit is then a flip-flop (loaded with the hit
    of the entry it becomes), and "the write-back is of the key's QP" too (from the write-back's
    ``qp_next``), so the answer is an AND-OR of registers (ECP5 timing). A
    management write in cycle t then forgets its QP's entries at the end of cycle t + 1 (from
    registers too): no answer for a key presented after the write sees them; a write-back of
    cycle t is forgotten with them, one of cycle t + 1 is newer than the write and kept.

    Parameters
    ----------
    n_qp : int
    depth : int
        Entries kept (default 8).
    registered_key : bool
        Answer for the key of the previous cycle (default: of this cycle).

    Members
    -------
    wb : ``In(WriteBackSignature(idx_width))``
        Write-backs.
    snoop_valid : ``In(1)``, snoop_qp : ``In(idx_width)``
        A management write of QP ``snoop_qp`` takes place this cycle.
    q : ``In(PsnLookupSignature(idx_width))``
        Look-up: the newest write-back of ``q.qp``, if any.
    """

    def __init__(self, n_qp, depth=8, *, registered_key=False):
        if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= 64:
            raise ValueError(f"depth must be an integer from 1 to 64, not {depth!r}")
        self._depth = depth
        self._registered = bool(registered_key)
        qw = qp_index_width(n_qp)
        super().__init__({
            "wb": In(WriteBackSignature(qw)),
            "snoop_valid": In(1), "snoop_qp": In(qw),
            "q": In(PsnLookupSignature(qw)),
        })

    def elaborate(self, platform):
        m = Module()
        n = self._depth
        qw = len(self.q.qp)
        pw = proto.PSN_BITS
        valid = [Signal(name=f"e{k}_valid") for k in range(n)]
        qp = [Signal(qw, name=f"e{k}_qp") for k in range(n)]
        psn = [Signal(pw, name=f"e{k}_psn") for k in range(n)]
        err = [Signal(name=f"e{k}_err") for k in range(n)]

        # at most one valid entry per QP (a write-back drops the older ones of its QP), so the
        # look-up is an AND-OR select with no priority chain; the write-back of this cycle wins
        if self._registered:
            # A management write forgets its QP's entries a cycle later, from registers (the
            # look-up key is a cycle old as well, so every look-up of a key presented after the
            # write still sees it; a write-back in the write's cycle is forgotten then too, one
            # in the next cycle is newer than the write and kept).
            snoop_valid = Signal(name="snoop_valid_r")
            snoop_qp = Signal(qw, name="snoop_qp_r")
            m.d.sync += [snoop_valid.eq(self.snoop_valid), snoop_qp.eq(self.snoop_qp)]
            insert_valid = C(1, 1)
        else:
            snoop_valid, snoop_qp = self.snoop_valid, self.snoop_qp
            # an entry whose QP is being rewritten is dropped on the way
            insert_valid = ~(snoop_valid & (snoop_qp == self.wb.qp))
        snooped = [Signal(name=f"e{k}_snooped") for k in range(n)]
        kill = [Signal(name=f"e{k}_kill") for k in range(n)]
        for k in range(n):
            m.d.comb += [snooped[k].eq(snoop_valid & (qp[k] == snoop_qp)),
                         kill[k].eq(snooped[k] | (self.wb.valid & (qp[k] == self.wb.qp)))]

        hit = [Signal(name=f"e{k}_hit") for k in range(n)]
        if self._registered:
            # Each entry's hit is a flip-flop, loaded with the hit of the entry it becomes: an
            # entry that stays (not snooped) and matches the key; after a shift, the one before
            # it unless the write-back is of the key's QP (that one then replaces it, in entry
            # 0). The answer is an AND-OR of registers.
            # (`key` is read by nothing in this mode; Yosys drops it. Taking it out of the
            # text re-rolled ABC's mapping of the whole engine: docs/ecp5-timing.md, round 7)
            key = Signal(qw, name="key")
            m.d.sync += key.eq(self.q.qp)
            # "this cycle's write-back is of the key's QP" as a flip-flop, from `qp_next`
            wb_is_key = Signal(name="wb_is_key")
            m.d.sync += wb_is_key.eq(self.wb.qp_next == self.q.qp)
            wb_key = Signal(name="wb_is_next_key")     # (for the hits of the next cycle)
            m.d.comb += wb_key.eq(self.wb.qp == self.q.qp)
            keeps = [Signal(name=f"e{k}_keeps") for k in range(n)]
            for k in range(n):
                m.d.comb += keeps[k].eq(valid[k] & ~snooped[k] & (qp[k] == self.q.qp))
                shifted = wb_key & insert_valid if k == 0 else keeps[k - 1] & ~wb_key
                m.d.sync += hit[k].eq(Mux(self.wb.valid, shifted, keeps[k]))
        else:
            key = self.q.qp
            for k in range(n):
                m.d.comb += hit[k].eq(valid[k] & (qp[k] == key))
        wb_hit = Signal()
        cam_psn = Signal(pw)
        cam_err = Signal()
        m.d.comb += [
            wb_hit.eq(self.wb.valid & (wb_is_key if self._registered else self.wb.qp == key)),
            cam_psn.eq(or_tree([psn[k] & hit[k].replicate(pw) for k in range(n)])),
            cam_err.eq(or_tree([err[k] & hit[k] for k in range(n)])),
            self.q.hit.eq(wb_hit | or_tree(hit)),
            self.q.psn.eq(Mux(wb_hit, self.wb.psn, cam_psn)),
            self.q.err.eq(Mux(wb_hit, self.wb.err, cam_err)),
        ]

        for k in range(n):
            with m.If(kill[k]):
                m.d.sync += valid[k].eq(0)
        with m.If(self.wb.valid):
            # shift in at entry 0
            m.d.sync += [valid[0].eq(insert_valid),
                         qp[0].eq(self.wb.qp), psn[0].eq(self.wb.psn), err[0].eq(self.wb.err)]
            for k in range(1, n):
                m.d.sync += [valid[k].eq(valid[k - 1] & ~kill[k - 1]), qp[k].eq(qp[k - 1]),
                             psn[k].eq(psn[k - 1]), err[k].eq(err[k - 1])]
        return m
