# SPDX-License-Identifier: BSD-2-Clause
"""The completer: per-QP lists of the work requests sent and not yet complete, retired by the
ACK handler's events into ibverbs completions, go-back-N replay requests and QP errors."""

from amaranth import *
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import proto
from ..config import check_config
from ..layouts import (ack_event_layout, posted_layout, qp_error_layout, qp_index_width,
                       qp_reset_layout, replay_layout)
from ..lib.arith import event_counter, not_before_parts
from ..verbs import completion_layout

__all__ = ["Completer"]


class Completer(wiring.Component):
    """Completions of the requester: which work requests (WRs) the peer has acknowledged, which
    failed, and when to go back.

    Every WR the TX path sends arrives on ``posted`` and is kept, until it completes, in its
    QP's list (posting order, which is PSN order). The ACK handler's events (``ev``, already
    checked: QP open, PSN outstanding, in order) retire the lists' heads (the model, the
    reference of these rules, is :class:`roce_hw.model.completer.CompleterModel`):

    * ACK ``p``: every WR whose last PSN is ``p`` or before completes ``SUCCESS``, oldest
      first (one coalesced ACK completes M WRs, in order); a signaled WR is reported on
      ``cq``, an unsignaled one completes silently.
    * NAK PSN-sequence ``p``: the WRs whose last PSN is before ``p`` complete the same way
      (implicitly acknowledged), then ``replay`` asks to go back to ``p`` (``rnr`` 0, ``code``
      0).
    * RNR NAK ``p``: nothing completes; ``replay`` asks to go back to ``p`` after the RNR wait
      of timer ``code`` (``rnr`` 1; the timers are another block).
    * fatal NAK ``p`` (code 1/2/3): the WRs before ``p`` complete ``SUCCESS``; the one holding
      ``p`` completes ``REM_INV_REQ_ERR`` / ``REM_ACCESS_ERR`` / ``REM_OP_ERR`` (another code
      ``REM_OP_ERR``), every later one ``WR_FLUSH_ERR`` (these are always reported, signaled
      or not); ``qp_error`` reports ``{qp, status}``; the QP is in error: every WR posted to it
      later completes ``WR_FLUSH_ERR`` at once, and its events are ignored, until ``reset``.
    * CNP: counted (``cnps``).
    * ``reset`` (the QP was set up again): every WR of its list completes ``WR_FLUSH_ERR``
      (reported, as ibverbs flushes a QP moved to ERROR or RESET), the error mark is cleared;
      the QP starts clean.

    A completion is ``{wr_id, qp, status, opcode, byte_len = length, with_imm 0, imm 0}``;
    ``opcode`` is the WR's ``ibv_wc_opcode`` (RDMA_WRITE[_WITH_IMM] -> RDMA_WRITE, SEND[_WITH_IMM]
    -> SEND, RDMA_READ -> RDMA_READ, other values -- never posted, the TX path refuses them --
    SEND).

    Storage (``lib.memory``, no per-QP registers: the same design at 1 or 16384 QPs): a pool of
    ``n_desc`` WR descriptors shared by all QPs (``wr_id``, ``length``, last PSN, ``signaled``,
    opcode: 123 bits; block RAM), their next pointers and a free list (``log2(n_desc)`` bits
    each; LUT RAM at 256), and one row per QP ``{head, tail, live, err}`` (LUT RAM at 16
    QPs, block RAM at 4096). ``first_psn`` of ``posted`` is not stored: with the WRs of a QP in
    PSN order the last PSNs alone order them against an event.

    Completion slots. Every WR taken holds one slot of ``cq``'s FIFO (``n_desc`` entries)
    until its completion leaves on ``cq``, or until it completes silently. ``posted.ready`` is
    low while all ``n_desc`` slots are held, so the pool (never fuller than the slots held)
    always has room for a WR taken, and every completion always has room in the FIFO: events
    are processed whether or not ``cq`` is read, and no completion is ever dropped.

    When ``cq`` is not read: its FIFO fills; the slots of the completions waiting there are
    not given back, so at most ``n_desc`` WRs (waiting completions included) exist, and
    ``posted`` stops taking WRs (the TX path waits: the engine stops taking WRs). The ACK
    handler is not held up: events keep retiring the WRs kept, their completions fill the
    FIFO slots reserved for them. ``replay`` and ``qp_error`` have FIFOs of ``aux_depth``;
    when one is full an event that must report there waits for it (the consumer, the
    retransmit scheduler, is expected to take them promptly).

    Latency and throughput (one input at a time; ``reset`` first, then ``ev`` and ``posted``
    in turn when both wait; measured in ``tests/test_completer.py::test_rates_and_turns``):

    * ``posted``: 2 cycles per WR (the transfer, then the row update).
    * ``ev`` of a QP with WRs kept: 4 cycles, plus 1 per WR it completes (3 + M when it
      completes the QP's last WR), plus 1 when it reports a replay or a QP error; an event of
      a QP with no WR kept or in error: 2 cycles (3 with a report); an RNR NAK: 3 cycles; a
      CNP (or a kind the ACK handler never sends, ignored): 2 cycles.
    * a fatal NAK or a ``reset`` walks the whole list: 3 + (WRs kept) cycles, + 1 to report.
    * the first completion of an event is on ``cq`` 6 cycles after the event's transfer
      (``cq`` ready), the others of the same event one per cycle after it.
    * the longest an event can hold up the ACK handler is one walk over the whole pool,
      ``n_desc + 4`` cycles (a fatal NAK or reset of a QP holding every WR); the handler's
      event FIFO holds the packets behind it meanwhile. In the steady state a 1-packet WR
      acknowledged on its own costs 2 + 5 = 7 cycles: the completer keeps up with one ACK
      per packet at 64 bits (a packet is 10 beats or more) and at 512 bits for frames of
      7 beats (448 bytes) or more; a stream of smaller messages each acknowledged alone is
      slowed to that rate through ``posted.ready`` (coalesced ACKs cost 1 cycle per WR).

    Ordering contract: a WR must be taken on ``posted`` before any event that concerns its
    PSNs is offered on ``ev`` (the TX path posts a WR before its first packet leaves, which is
    what a TX path waiting for ``posted.ready`` does); ``reset`` must come after the events of
    the old connection and before the WRs of the new one.

    Parameters
    ----------
    config : EngineConfig
        ``n_qp``.
    n_desc : int
        WRs kept at once over all QPs, and entries of the completion FIFO: a power of two from
        2 to 4096 (default 256).
    aux_depth : int
        Entries of the ``replay`` and ``qp_error`` FIFOs (at least 2).

    Members
    -------
    posted : ``In(stream.Signature(posted_layout(n_qp)))``
        The WRs sent, in the order sent (:func:`~roce_hw.layouts.posted_layout`).
    ev : ``In(stream.Signature(ack_event_layout(n_qp)))``
        The ACK handler's events.
    reset : ``In(stream.Signature(qp_reset_layout(n_qp)))``
        A QP set up again: flush its list, clear its error.
    cq : ``Out(stream.Signature(completion_layout(config)))``
        Completions.
    replay : ``Out(stream.Signature(replay_layout(n_qp)))``
        Go-back-N requests ``{qp, psn, rnr, code}``.
    qp_error : ``Out(stream.Signature(qp_error_layout(n_qp)))``
        QPs to move to ERROR ``{qp, status}``.
    cnps : ``Out(32)``
        CNP events counted (wrapping).
    slots_used : ``Out(range(n_desc + 1))``
        Completion slots held (WRs kept plus completions waiting on ``cq``).
    """

    def __init__(self, config, *, n_desc=256, aux_depth=4):
        self._config = cfg = check_config(config)
        if isinstance(n_desc, bool) or not isinstance(n_desc, int) or not 2 <= n_desc <= 4096 \
                or n_desc & (n_desc - 1):
            raise ValueError(f"n_desc must be a power of two from 2 to 4096, not {n_desc!r}")
        if isinstance(aux_depth, bool) or not isinstance(aux_depth, int) or aux_depth < 2:
            raise ValueError(f"aux_depth must be an integer of at least 2, not {aux_depth!r}")
        self._n_desc = n_desc
        self._aux_depth = aux_depth
        n_qp = cfg.n_qp
        super().__init__({
            "posted": In(stream.Signature(posted_layout(n_qp))),
            "ev": In(stream.Signature(ack_event_layout(n_qp))),
            "reset": In(stream.Signature(qp_reset_layout(n_qp))),
            "cq": Out(stream.Signature(completion_layout(cfg))),
            "replay": Out(stream.Signature(replay_layout(n_qp))),
            "qp_error": Out(stream.Signature(qp_error_layout(n_qp))),
            "cnps": Out(32),
            "slots_used": Out(range(n_desc + 1)),
        })

    @property
    def n_desc(self):
        """WRs kept at once (the pool and the completion FIFO)."""
        return self._n_desc

    def elaborate(self, platform):
        cfg = self._config
        m = Module()
        qw = qp_index_width(cfg.n_qp)
        n = self._n_desc
        dw = (n - 1).bit_length()
        k = proto.AckKind

        # ------------------------------------------------------------ storage
        row_layout = data.StructLayout({"head": dw, "tail": dw, "live": 1, "err": 1})
        desc_layout = data.StructLayout({"wr_id": 64, "length": 32, "last_psn": proto.PSN_BITS,
                                         "signaled": 1, "wc_op": 2})
        # (every index of qw bits is a row: a QP index the TX path never posts is harmless)
        m.submodules.rows = rows = memory.Memory(shape=row_layout, depth=max(2, 1 << qw),
                                                 init=[])
        m.submodules.descs = descs = memory.Memory(shape=desc_layout, depth=n, init=[])
        m.submodules.links = links = memory.Memory(shape=dw, depth=n, init=[])
        m.submodules.free = free = memory.Memory(shape=dw, depth=n, init=range(n))
        q_rd, q_wr = rows.read_port(), rows.write_port()
        d_rd, d_wr = descs.read_port(), descs.write_port()
        n_rd, n_wr = links.read_port(), links.write_port()
        f_rd, f_wr = free.read_port(), free.write_port()

        cq_entry = data.StructLayout({"wr_id": 64, "qp": qw, "status": 5, "wc_op": 2,
                                      "byte_len": 32})
        m.submodules.cq_fifo = cq_fifo = fifo.SyncFIFOBuffered(
            width=Shape.cast(cq_entry).width, depth=n)
        cq_out = Signal(cq_entry)
        cq_in = Signal(cq_entry)
        # (the FIFO is written from registers: its level counter's carry chain must not
        # follow the walk's decision)
        cq_w_q = Signal()
        cq_in_q = Signal(cq_entry)
        m.d.comb += [
            cq_out.eq(cq_fifo.r_data),
            self.cq.valid.eq(cq_fifo.r_rdy),
            cq_fifo.r_en.eq(self.cq.ready),
            self.cq.payload.wr_id.eq(cq_out.wr_id),
            self.cq.payload.qp.eq(cq_out.qp),
            self.cq.payload.status.eq(cq_out.status),
            self.cq.payload.opcode.eq(cq_out.wc_op),
            self.cq.payload.byte_len.eq(cq_out.byte_len),
            cq_fifo.w_data.eq(cq_in_q),
            cq_fifo.w_en.eq(cq_w_q),
        ]
        m.submodules.replay_fifo = rp_fifo = fifo.SyncFIFOBuffered(
            width=Shape.cast(replay_layout(cfg.n_qp)).width, depth=self._aux_depth)
        m.submodules.error_fifo = er_fifo = fifo.SyncFIFOBuffered(
            width=Shape.cast(qp_error_layout(cfg.n_qp)).width, depth=self._aux_depth)
        wiring.connect(m, rp_fifo.r_stream, wiring.flipped(self.replay))
        wiring.connect(m, er_fifo.r_stream, wiring.flipped(self.qp_error))
        rp_in = Signal(replay_layout(cfg.n_qp))
        er_in = Signal(qp_error_layout(cfg.n_qp))
        m.d.comb += [rp_fifo.w_data.eq(rp_in), er_fifo.w_data.eq(er_in)]

        # ------------------------------------------------------------ the operation taken
        op_qp = Signal(qw)
        op_post = Signal()
        op_reset = Signal()
        # the event's kind, one-hot (no comparator in the decisions of Load and Walk)
        op_ack, op_nak, op_rnr, op_fatal, op_other = (
            Signal(name=f"op_{n}") for n in ("ack", "nak", "rnr", "fatal", "other"))
        op_psn = Signal(proto.PSN_BITS)
        op_code = Signal(5)
        op_status = Signal(5)           # a fatal NAK's status
        post = Signal(desc_layout)      # the WR taken
        turn_ev = Signal()              # ev goes first when both wait
        rep_replay = Signal()           # reports waiting (state Report)
        rep_error = Signal()

        # completion slots (a power of two: full is the top bit)
        used = Signal(dw + 1)
        full = Signal()
        m.d.comb += [full.eq(used[dw]), self.slots_used.eq(used)]

        # ------------------------------------------------------------ walk registers
        # B: the descriptor and link read ports hold the entry at b_addr; C: the entry
        # before it, being decided
        w_tail = Signal(dw)
        w_ack = Signal()                # ACK: covered when last <= psn; else when last < psn
        w_stop = Signal()               # ACK / NAK PSN-sequence: stop at the first uncovered
        w_fatal = Signal()
        w_reset = Signal()              # reset: nothing covered, all flushed
        w_seen = Signal()               # an uncovered entry was completed (fatal, reset)
        b_valid = Signal()
        b_addr = Signal(dw)
        c_valid = Signal()
        c_addr = Signal(dw)
        c_tail = Signal()
        c_desc = Signal(desc_layout)
        c_parts = {key: [Signal(name=f"c_{key}_{j}") for j in ("borrow", "hi0", "hi1")]
                   for key in ("ack", "nak")}

        rd_ptr = Signal(dw)             # free list (a ring, initially every index)
        wr_ptr = Signal(dw)

        st = q_rd.data
        silent = Signal()
        take_ev = Signal()
        take_post = Signal()
        take_reset = Signal()
        cq_w = Signal()
        m.d.sync += [cq_w_q.eq(cq_w), cq_in_q.eq(cq_in)]
        # (the free list's read port is not transparent: a WR taking an entry is in Load 2
        # cycles or more after the last change of rd_ptr or the last free -- Idle lies
        # between -- so the entry read is current)
        m.d.comb += f_rd.addr.eq(rd_ptr)

        # ------------------------------------------------------------ slots, counters
        # The count follows a cycle late (from registers; a WR taken is counted before the
        # next can be taken, 2 cycles on; slots given back show a cycle late).
        inc_q = Signal()
        silent_q = Signal()
        out_q = Signal()
        delta = Signal(signed(dw + 1))
        m.d.sync += [inc_q.eq(take_post), silent_q.eq(silent),
                     out_q.eq(self.cq.valid & self.cq.ready), used.eq(used + delta)]
        with m.Switch(Cat(inc_q, silent_q, out_q)):
            with m.Case("001"):
                m.d.comb += delta.eq(1)
            with m.Case("010", "100", "111"):
                m.d.comb += delta.eq(-1)
            with m.Case("110"):
                m.d.comb += delta.eq(-2)
        m.d.comb += self.cnps.eq(event_counter(
            m, 32, take_ev & (self.ev.payload.kind == k.CNP), "n_cnps"))

        # stage B (every cycle): compare the entry read with the event's PSN, in pieces
        parts = {"ack": not_before_parts(m, op_psn, d_rd.data.last_psn, "cmp_ack"),
                 "nak": not_before_parts(m, d_rd.data.last_psn, op_psn, "cmp_nak")}
        b_tail = Signal()
        m.d.comb += b_tail.eq(b_addr == w_tail)
        # stage C: decide
        nb = {}
        for key, (borrow, hi0, hi1) in c_parts.items():
            nb[key] = Signal(name=f"c_nb_{key}")
            m.d.comb += nb[key].eq(~Mux(borrow, hi1, hi0))
        covered = Signal()
        stop = Signal()
        retire = Signal()
        end = Signal()
        m.d.comb += [
            # ACK: psn is last or after it; NAK: last is not psn or after it (last < psn)
            covered.eq(~w_reset & Mux(w_ack, nb["ack"], ~nb["nak"])),
            stop.eq(w_stop & ~covered),
            retire.eq(c_valid & ~stop),
            end.eq(c_valid & (stop | c_tail)),
        ]

        # the read ports follow the walk (speculatively: reads have no effect)
        start_addr = Signal(dw)
        walking = Signal()
        m.d.comb += [
            d_rd.addr.eq(Mux(walking, n_rd.data, start_addr)),
            n_rd.addr.eq(Mux(walking, n_rd.data, start_addr)),
            start_addr.eq(st.head),
            q_wr.addr.eq(op_qp),
        ]

        pay = self.posted.payload
        evp = self.ev.payload
        with m.FSM():
            with m.State("Idle"):
                posted_ok = Signal()
                m.d.comb += [
                    posted_ok.eq(self.posted.valid & ~full),
                    self.reset.ready.eq(1),
                    self.ev.ready.eq(~self.reset.valid & (turn_ev | ~posted_ok)),
                    self.posted.ready.eq(~self.reset.valid & ~full &
                                         ~(self.ev.valid & turn_ev)),
                    take_reset.eq(self.reset.valid),
                    take_ev.eq(self.ev.valid & self.ev.ready),
                    take_post.eq(self.posted.valid & self.posted.ready),
                    q_rd.addr.eq(Mux(self.reset.valid, self.reset.payload.qp,
                                     Mux(take_post, pay.qp, evp.qp))),
                ]
                wc_op = Signal(2)
                with m.If(pay.opcode == proto.WrOpcode.RDMA_READ):
                    m.d.comb += wc_op.eq(proto.WcOpcode.RDMA_READ)
                with m.Elif(pay.opcode <= proto.WrOpcode.RDMA_WRITE_WITH_IMM):
                    m.d.comb += wc_op.eq(proto.WcOpcode.RDMA_WRITE)
                with m.Else():
                    m.d.comb += wc_op.eq(proto.WcOpcode.SEND)
                status = Signal(5)
                with m.Switch(evp.code):
                    with m.Case(proto.NakCode.INVALID_REQUEST):
                        m.d.comb += status.eq(proto.WcStatus.REM_INV_REQ_ERR)
                    with m.Case(proto.NakCode.REMOTE_ACCESS_ERROR):
                        m.d.comb += status.eq(proto.WcStatus.REM_ACCESS_ERR)
                    with m.Default():
                        m.d.comb += status.eq(proto.WcStatus.REM_OP_ERR)
                m.d.sync += [
                    op_qp.eq(q_rd.addr),
                    op_post.eq(take_post),
                    op_reset.eq(self.reset.valid),
                    op_ack.eq(evp.kind == k.ACK),
                    op_nak.eq(evp.kind == k.NAK_SEQ),
                    op_rnr.eq(evp.kind == k.RNR),
                    op_fatal.eq(evp.kind == k.FATAL),
                    op_other.eq(evp.kind > k.FATAL),
                    op_psn.eq(evp.psn),
                    op_code.eq(evp.code),
                    op_status.eq(status),
                    post.wr_id.eq(pay.wr_id),
                    post.length.eq(pay.length),
                    post.last_psn.eq(pay.last_psn),
                    post.signaled.eq(pay.signaled),
                    post.wc_op.eq(wc_op),
                ]
                with m.If(take_ev):
                    m.d.sync += turn_ev.eq(0)
                with m.Elif(take_post):
                    m.d.sync += turn_ev.eq(1)
                # (every input taken goes to Load, a CNP too: the choice of the next state
                # does not wait for the event's kind)
                with m.If(self.reset.valid | self.ev.valid | posted_ok):
                    m.next = "Load"

            with m.State("Load"):
                # the QP's row (st) is on the read port now
                m.d.sync += [
                    w_tail.eq(st.tail),
                    w_ack.eq(op_ack),
                    w_stop.eq(~op_reset & ~op_fatal),
                    w_fatal.eq(~op_reset & op_fatal),
                    w_reset.eq(op_reset),
                    w_seen.eq(0),
                    b_addr.eq(start_addr),
                    c_valid.eq(0),
                ]
                walk = Signal()
                with m.If(op_post):
                    with m.If(st.err):
                        m.d.comb += [
                            cq_w.eq(1),
                            cq_in.wr_id.eq(post.wr_id),
                            cq_in.qp.eq(op_qp),
                            cq_in.status.eq(proto.WcStatus.WR_FLUSH_ERR),
                            cq_in.wc_op.eq(post.wc_op),
                            cq_in.byte_len.eq(post.length),
                        ]
                    with m.Else():
                        new = f_rd.data
                        m.d.comb += [
                            d_wr.addr.eq(new), d_wr.data.eq(post), d_wr.en.eq(1),
                            n_wr.addr.eq(st.tail), n_wr.data.eq(new), n_wr.en.eq(st.live),
                            q_wr.data.head.eq(Mux(st.live, st.head, new)),
                            q_wr.data.tail.eq(new),
                            q_wr.data.live.eq(1),
                            q_wr.en.eq(1),
                        ]
                        m.d.sync += rd_ptr.eq(rd_ptr + 1)
                    m.next = "Idle"
                with m.Elif(op_reset):
                    # (the row is written again at the end of the walk)
                    m.d.comb += [q_wr.data.eq(0), q_wr.en.eq(~st.live), walk.eq(st.live)]
                with m.Elif(op_other | st.err):
                    m.next = "Idle"             # a CNP (counted), or the QP has failed
                with m.Elif(op_rnr):
                    m.d.sync += rep_replay.eq(1)
                    m.next = "Report"
                with m.Elif(st.live):
                    m.d.comb += walk.eq(1)
                with m.Elif(op_fatal):
                    m.d.comb += [q_wr.data.err.eq(1), q_wr.en.eq(1)]
                    m.d.sync += rep_error.eq(1)
                    m.next = "Report"
                with m.Elif(op_nak):
                    m.d.sync += rep_replay.eq(1)
                    m.next = "Report"
                with m.Else():
                    m.next = "Idle"
                with m.If(~op_post):
                    with m.If(walk):
                        m.d.sync += b_valid.eq(1)
                        m.next = "Walk"
                    with m.Elif(op_reset):
                        m.next = "Idle"

            with m.State("Walk"):
                m.d.comb += walking.eq(1)
                # stage B -> C
                m.d.sync += [
                    b_addr.eq(n_rd.data),
                    b_valid.eq(b_valid & ~b_tail & ~end),
                    c_valid.eq(b_valid & ~end),
                    c_addr.eq(b_addr),
                    c_tail.eq(b_tail),
                    c_desc.eq(d_rd.data),
                ]
                for key, regs in c_parts.items():
                    m.d.sync += [r.eq(p) for r, p in zip(regs, parts[key])]
                # stage C: complete (or stop at) the entry at c_addr
                m.d.comb += [
                    silent.eq(retire & covered & ~c_desc.signaled),
                    cq_w.eq(retire & ~(covered & ~c_desc.signaled)),
                    cq_in.wr_id.eq(c_desc.wr_id),
                    cq_in.qp.eq(op_qp),
                    cq_in.wc_op.eq(c_desc.wc_op),
                    cq_in.byte_len.eq(c_desc.length),
                    f_wr.addr.eq(wr_ptr),
                    f_wr.data.eq(c_addr),
                    f_wr.en.eq(retire),
                ]
                with m.If(covered):
                    m.d.comb += cq_in.status.eq(proto.WcStatus.SUCCESS)
                with m.Elif(w_seen | w_reset):
                    m.d.comb += cq_in.status.eq(proto.WcStatus.WR_FLUSH_ERR)
                with m.Else():
                    m.d.comb += cq_in.status.eq(op_status)
                with m.If(retire):
                    m.d.sync += wr_ptr.eq(wr_ptr + 1)
                with m.If(c_valid & ~covered):
                    m.d.sync += w_seen.eq(1)
                with m.If(end):
                    # the list is empty unless the walk stopped at an uncovered WR
                    m.d.comb += [
                        q_wr.data.head.eq(c_addr),
                        q_wr.data.tail.eq(w_tail),
                        q_wr.data.live.eq(stop),
                        q_wr.data.err.eq(w_fatal),
                        q_wr.en.eq(1),
                    ]
                    m.d.sync += [
                        rep_replay.eq(~op_reset & op_nak),
                        rep_error.eq(w_fatal),
                    ]
                    with m.If(~op_reset & (op_nak | op_fatal)):
                        m.next = "Report"
                    with m.Else():
                        m.next = "Idle"

            with m.State("Report"):
                m.d.comb += [
                    rp_in.qp.eq(op_qp),
                    rp_in.psn.eq(op_psn),
                    rp_in.rnr.eq(op_rnr),
                    rp_in.code.eq(Mux(op_rnr, op_code, 0)),
                    rp_fifo.w_en.eq(rep_replay),
                    er_in.qp.eq(op_qp),
                    er_in.status.eq(op_status),
                    er_fifo.w_en.eq(rep_error),
                ]
                with m.If(rp_fifo.w_rdy):
                    m.d.sync += rep_replay.eq(0)
                with m.If(er_fifo.w_rdy):
                    m.d.sync += rep_error.eq(0)
                with m.If((~rep_replay | rp_fifo.w_rdy) & (~rep_error | er_fifo.w_rdy)):
                    m.next = "Idle"
        return m
