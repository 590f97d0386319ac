# SPDX-License-Identifier: BSD-2-Clause
"""The completer: per-QP lists of the work requests sent and not yet complete, retired by the
ACK handler's events into ibverbs completions; the go-back-N walk that sends them again; the
retransmission timers' news; QP errors."""

from amaranth import *
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import proto
from ..config import check_config
from ..layouts import (ack_event_layout, posted_layout, qp_error_layout, qp_index_width,
                       qp_reset_layout, timer_arm_layout, timer_fire_layout, timer_rnr_layout)
from ..lib.arith import event_counter, not_before_parts, or_tree
from ..lib.drop_queue import DropQueue
from ..verbs import completion_layout, resume_layout

__all__ = ["Completer"]


class Completer(wiring.Component):
    """Completions of the requester: which work requests (WRs) the peer has acknowledged, which
    failed, and what to send again (go-back-N).

    Every WR the TX path sends arrives on ``posted`` (the whole WR: its header fields and its
    first and last PSN) and is kept, until it completes, in its QP's list (posting order, which
    is PSN order). Per QP the completer keeps ``una``, the oldest PSN not acknowledged: ACK
    ``p`` sets it to ``p + 1``, every NAK ``p`` to ``p``, a WR posted to a QP with none kept to
    its first PSN. The ACK handler's events (``ev``, already checked: QP open, PSN
    outstanding, in order) and the timers' decisions (``fire``) act on the lists (the model,
    the reference of these rules, is :class:`roce_hw.model.completer.CompleterModel`):

    * ACK ``p``: every WR whose last PSN is ``p`` or before completes ``SUCCESS``, oldest
      first (one coalesced ACK completes M WRs, in order); a signaled WR is reported on
      ``cq``, an unsignaled one completes silently.
    * every NAK ``p`` first completes the WRs whose last PSN is before ``p`` the same way (an
      implicit ACK, as rxe and rdmavt). Then a NAK PSN-sequence goes back (the walk below),
      unless an RNR wait runs or a sequence NAK went back with no progress since (a repeat).
      An RNR NAK (unless an RNR wait runs: a repeat) tells the timers ``rnr {qp, code}``, stops
      the QP's walk, and the QP waits for ``fire`` RNR_DONE. A fatal NAK (code 1/2/3): the WR
      holding ``p`` completes ``REM_INV_REQ_ERR`` / ``REM_ACCESS_ERR`` / ``REM_OP_ERR``
      (another code ``REM_OP_ERR``), every later one ``WR_FLUSH_ERR`` (these are always
      reported, signaled or not); ``qp_error`` reports ``{qp, status}``; the QP is in error:
      every WR posted to it later completes ``WR_FLUSH_ERR`` at once, and its events are
      ignored, until ``reset``. Progress (``una`` moved) ends an RNR wait (an ACK that ends one
      goes back) and re-arms the sequence NAK.
    * ``fire`` TIMEOUT goes back (and re-arms the sequence NAK); RNR_DONE ends the RNR wait and
      goes back; RETRY_EXC / RNR_RETRY_EXC: the QP's first WR kept completes
      ``RETRY_EXC_ERR`` / ``RNR_RETRY_EXC_ERR``, the rest ``WR_FLUSH_ERR``, ``qp_error``, the
      QP is in error. A fire for a QP with nothing kept or in error, a TIMEOUT during an RNR
      wait, an RNR_DONE with no RNR wait, are ignored and counted (``fires_ignored``).
    * CNP: counted (``cnps``).
    * ``reset`` (the QP was set up again): every WR of its list completes ``WR_FLUSH_ERR``
      (reported, as ibverbs flushes a QP moved to ERROR or RESET); the QP starts clean.
    * the timers hear ``arm {qp, outstanding, progress}`` after every WR posted
      (``outstanding``: the QP is not in error), every ACK or NAK of a QP not in error
      (``outstanding``: WRs kept after it; ``progress``: ``una`` moved), every exhausted
      retry and every reset (``{qp, 0, 0}``). An RNR NAK's ``rnr`` follows its ``arm`` once
      ``arm`` is empty, so the timers reload the retry counts before the RNR wait.

    The walk (go-back-N). A QP that goes back is walked: its first WR kept is sent again from
    packet ``(una - first_psn) mod 2**24`` (``start_packet``; ``start_psn`` = ``una``), every
    later WR of the QP whole (``start_packet`` 0, ``start_psn`` its first PSN), in posting
    order, one ``resume_layout`` request on ``retx`` per WR (the TX path sends the packets
    from ``start_packet`` on, MIDDLE/LAST without RETH); WRs posted during the walk are walked
    too. One QP is walked at a time: a QP that goes back while it is walked starts again from
    its first WR and ``una``; with no walk running or queued the walk starts at once; else the
    QP waits in the walk queue (each QP at most once, ``n_qp`` entries, a RAM), taken in
    order. An ACK that completes the WR the walk is about
    to send makes the walk start again from the first WR kept. An RNR NAK, a failure or a
    reset stops the QP's walk (a request already prepared still leaves). ``rewinding`` is
    high from a walk request to the last ``retx`` transfer of the queue's last walk (the WR
    mux holds new WRs meanwhile).

    A completion is ``{wr_id, qp, status, opcode, byte_len = length, with_imm 0, imm 0}``;
    ``opcode`` is the WR's ``ibv_wc_opcode`` (RDMA_WRITE[_WITH_IMM] -> RDMA_WRITE, SEND[_WITH_IMM]
    -> SEND, RDMA_READ -> RDMA_READ, other values -- never posted, the TX path refuses them --
    SEND).

    Storage (``lib.memory``, no per-QP registers: the same design at 1 or 16384 QPs): a pool of
    ``n_desc`` WR descriptors shared by all QPs (the whole WR and its wc opcode: 280 bits;
    block RAM), their next pointers and a free list (``log2(n_desc)`` bits each; LUT RAM at
    256), one row per QP ``{head, tail, live, err, una, nak_hold, rnr_wait, pending}`` (LUT
    RAM at 16 QPs, block RAM at 4096) and the walk queue (one entry per QP index; never full:
    a QP is queued only while its ``pending`` is clear). The completion queue and the walk
    queue are :class:`~roce_hw.lib.drop_queue.DropQueue` s (flags in registers: no level
    counter behind a decision).

    Completion slots. Every WR taken holds one slot of ``cq``'s FIFO (``n_desc`` entries)
    until its completion leaves on ``cq``, or until it completes silently. ``posted.ready`` is
    low while all ``n_desc`` slots are held, so the pool (never fuller than the slots held)
    always has room for a WR taken, and every completion always has room in the FIFO: events
    are processed whether or not ``cq`` is read, and no completion is ever dropped. When
    ``cq`` is not read its FIFO fills, and ``posted`` stops taking WRs once every slot is
    held; the ACK handler is not held up.

    No deadlock with the TX path (which takes ``retx`` through the WR mux and may wait on
    ``posted``): a walk step is started only when the ``retx`` register and the stage before
    it are empty, so the walk never waits inside the completer; while ``retx`` is not read the
    walk just pauses, and WRs, events, fires and resets are taken as ever (the walk resumes
    where it was, with the WRs posted meanwhile).

    Backpressure of the small outputs: an operation starts only while ``arm``'s FIFO (4 or
    ``aux_depth`` entries) has room for two more; ``rnr`` and ``qp_error`` have FIFOs of
    ``aux_depth``, and an event that must report there waits for room. The timers take one
    ``arm``/``rnr`` per cycle, so these waits are short; a consumer that never reads them
    stops the completer.

    Latency and throughput (one operation at a time; ``reset`` first, then a walk step, an
    event or fire, a WR in turn: a walk step at least every other operation, a WR at least
    every fourth; measured in ``tests/test_completer.py::test_rates_and_turns``):

    * ``posted``: 2 cycles per WR (the transfer, then the row update).
    * ``ev``: an event of a QP with WRs kept: 5 cycles, plus 1 per WR it completes (4 + M
      when it completes the QP's last WR); an event of a QP with no WR kept: 3 cycles; plus
      1 to report a QP error, plus 4 to report an RNR NAK (its ``rnr`` waits until the
      ``arm`` before it has left, ``arm`` read at once); a CNP, an event of a QP in error (or
      a kind the ACK handler never sends, ignored): 2 cycles.
    * ``fire``: TIMEOUT / RNR_DONE 3 cycles; RETRY_EXC / RNR_RETRY_EXC a walk over the list:
      4 + (WRs kept) cycles, + 1 to report; ``reset`` the same, without report.
    * a walk step: 3 cycles; one ``retx`` request per 5 cycles at best (the step, then 2
      cycles to the ``retx`` register, which must be empty when the next step starts); the
      first request on ``retx`` 7 cycles after a TIMEOUT's transfer, 10 after a sequence NAK
      that completes nothing (no walk running or queued: the walk starts at once; nothing else
      waiting, ``retx`` read at once).
    * the first completion of an event is on ``cq`` 6 cycles after the event's transfer
      (``cq`` ready), the others of the same event one per cycle after it.
    * the longest an operation can hold up the ACK handler is one walk over the whole pool,
      ``n_desc + 5`` cycles (a fatal NAK of a QP holding every WR).

    Ordering contract: a WR must be taken on ``posted`` before any event that concerns its
    PSNs is offered on ``ev`` (the TX path posts a WR before its first packet leaves, which is
    what a TX path waiting for ``posted.ready`` does); ``reset`` must come after the events of
    the old connection and before the WRs of the new one. A walk queued for a QP that is
    reset before it starts walks the new connection's WRs, if any (harmless duplicates).

    Parameters
    ----------
    config : EngineConfig
        ``n_qp``.
    n_desc : int
        WRs kept at once over all QPs, and entries of the completion FIFO: a power of two from
        2 to 4096 (default 256).
    aux_depth : int
        Entries of the ``rnr`` and ``qp_error`` FIFOs (at least 2), and of ``arm``'s (at
        least 4).

    Members
    -------
    posted : ``In(stream.Signature(posted_layout(n_qp)))``
        The WRs sent, in the order sent (:func:`~roce_hw.layouts.posted_layout`).
    ev : ``In(stream.Signature(ack_event_layout(n_qp)))``
        The ACK handler's events.
    fire : ``In(stream.Signature(timer_fire_layout(n_qp)))``
        The timers' decisions ``{qp, kind}`` (:class:`~roce_hw.proto.TimerKind`).
    reset : ``In(stream.Signature(qp_reset_layout(n_qp)))``
        A QP set up again: flush its list, clear its error.
    cq : ``Out(stream.Signature(completion_layout(config)))``
        Completions.
    retx : ``Out(stream.Signature(resume_layout(config)))``
        The walk's resume requests.
    rewinding : ``Out(1)``
        A walk is requested or runs (see above).
    qp_error : ``Out(stream.Signature(qp_error_layout(n_qp)))``
        QPs to move to ERROR ``{qp, status}``.
    arm : ``Out(stream.Signature(timer_arm_layout(n_qp)))``
        News for the ACK timers.
    rnr : ``Out(stream.Signature(timer_rnr_layout(n_qp)))``
        RNR NAKs, for the RNR waits.
    cnps : ``Out(32)``
        CNP events counted (wrapping).
    fires_ignored : ``Out(32)``
        Fires ignored (wrapping).
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
            "fire": In(stream.Signature(timer_fire_layout(n_qp))),
            "reset": In(stream.Signature(qp_reset_layout(n_qp))),
            "cq": Out(stream.Signature(completion_layout(cfg))),
            "retx": Out(stream.Signature(resume_layout(cfg))),
            "rewinding": Out(1),
            "qp_error": Out(stream.Signature(qp_error_layout(n_qp))),
            "arm": Out(stream.Signature(timer_arm_layout(n_qp))),
            "rnr": Out(stream.Signature(timer_rnr_layout(n_qp))),
            "cnps": Out(32),
            "fires_ignored": Out(32),
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
        tk = proto.TimerKind
        PB = proto.PSN_BITS

        # ------------------------------------------------------------ storage
        row_layout = data.StructLayout({"head": dw, "tail": dw, "live": 1, "err": 1,
                                        "una": PB, "nak_hold": 1, "rnr_wait": 1,
                                        "pending": 1})
        desc_layout = data.StructLayout({
            "wr_id": 64, "length": 32, "first_psn": PB, "last_psn": PB, "signaled": 1,
            "wc_op": 2, "opcode": 4, "remote_addr": 64, "r_key": 32, "imm": 32,
            "solicited": 1})
        # (every index of qw bits is a row: a QP index the TX path never posts is harmless)
        nq = max(2, 1 << qw)
        m.submodules.rows = rows = memory.Memory(shape=row_layout, depth=nq, init=[])
        m.submodules.descs = descs = memory.Memory(shape=desc_layout, depth=n, init=[])
        m.submodules.links = links = memory.Memory(shape=dw, depth=n, init=[])
        m.submodules.free = free = memory.Memory(shape=dw, depth=n, init=range(n))
        q_rd, q_wr = rows.read_port(), rows.write_port()
        d_rd, d_wr = descs.read_port(), descs.write_port()
        n_rd, n_wr = links.read_port(), links.write_port()
        f_rd, f_wr = free.read_port(), free.write_port()

        cq_entry = data.StructLayout({"wr_id": 64, "qp": qw, "status": 5, "wc_op": 2,
                                      "byte_len": 32})
        # (a queue whose flags are registers, written from registers: the slots guarantee
        # it room, and no level counter's carry chain follows a decision)
        m.submodules.cq_fifo = cq_fifo = DropQueue(cq_entry, n)
        cq_out = Signal(cq_entry)
        cq_in = Signal(cq_entry)
        cq_w_q = Signal()
        cq_in_q = Signal(cq_entry)
        m.d.comb += [
            cq_out.eq(cq_fifo.o.payload),
            self.cq.valid.eq(cq_fifo.o.valid),
            cq_fifo.o.ready.eq(self.cq.ready),
            self.cq.payload.wr_id.eq(cq_out.wr_id),
            self.cq.payload.qp.eq(cq_out.qp),
            self.cq.payload.status.eq(cq_out.status),
            self.cq.payload.opcode.eq(cq_out.wc_op),
            self.cq.payload.byte_len.eq(cq_out.byte_len),
            cq_fifo.i.payload.eq(cq_in_q),
            cq_fifo.i.valid.eq(cq_w_q),
        ]
        aux = self._aux_depth
        arm_depth = max(4, aux)
        m.submodules.error_fifo = er_fifo = fifo.SyncFIFOBuffered(
            width=Shape.cast(qp_error_layout(cfg.n_qp)).width, depth=aux)
        m.submodules.rnr_fifo = rnr_fifo = fifo.SyncFIFOBuffered(
            width=Shape.cast(timer_rnr_layout(cfg.n_qp)).width, depth=aux)
        m.submodules.arm_fifo = arm_fifo = fifo.SyncFIFOBuffered(
            width=Shape.cast(timer_arm_layout(cfg.n_qp)).width, depth=arm_depth)
        # the walk queue: QPs to walk, each at most once (the row's `pending`), so it is
        # never full
        m.submodules.walk_queue = wq = DropQueue(qw, nq + 1)
        wiring.connect(m, er_fifo.r_stream, wiring.flipped(self.qp_error))
        wiring.connect(m, rnr_fifo.r_stream, wiring.flipped(self.rnr))
        wiring.connect(m, arm_fifo.r_stream, wiring.flipped(self.arm))
        er_in = Signal(qp_error_layout(cfg.n_qp))
        rnr_in = Signal(timer_rnr_layout(cfg.n_qp))
        arm_in_q = Signal(timer_arm_layout(cfg.n_qp))
        arm_w_q = Signal()
        wq_w_q = Signal()
        wq_in_q = Signal(qw)
        m.d.comb += [er_fifo.w_data.eq(er_in), rnr_fifo.w_data.eq(rnr_in),
                     arm_fifo.w_data.eq(arm_in_q), arm_fifo.w_en.eq(arm_w_q),
                     wq.i.payload.eq(wq_in_q), wq.i.valid.eq(wq_w_q)]
        arm_w = Signal()
        arm_in = Signal(timer_arm_layout(cfg.n_qp))
        wq_w = Signal()
        m.d.sync += [arm_w_q.eq(arm_w), arm_in_q.eq(arm_in), wq_w_q.eq(wq_w)]
        # an operation is started only with room for the `arm` it may write and the one a
        # previous operation may still be writing (see the class docstring)
        arm_ok = Signal()
        m.d.sync += arm_ok.eq(arm_fifo.w_level <= arm_depth - 3)

        # ------------------------------------------------------------ the operation taken
        op_qp = Signal(qw)
        op_post = Signal()
        op_reset = Signal()
        op_walk = Signal()
        op_pop = Signal()               # the walk operation starts the queue's next QP
        # the event's or fire's kind, one-hot (no comparator in the decisions of Load),
        # registered from the input whether taken or not (the grant is deep), and qualified
        # by op_ev / op_fire (the operation was an event / a fire)
        op_ev = Signal()
        op_fire = Signal()
        kinds = ("ack", "nak", "rnr", "fatal", "other", "to", "done", "exc")
        raw = {n: Signal(name=f"raw_{n}") for n in kinds}
        op_ack, op_nak, op_rnr, op_fatal, op_other, op_to, op_done, op_exc = (
            Signal(name=f"op_{n}") for n in kinds)
        for n_, sig in zip(kinds, (op_ack, op_nak, op_rnr, op_fatal, op_other, op_to, op_done,
                                   op_exc)):
            m.d.comb += sig.eq(raw[n_] & (op_fire if n_ in ("to", "done", "exc") else op_ev))
        op_psn = Signal(PB)
        op_psn1 = Signal(PB)            # op_psn + 1
        op_code = Signal(5)
        op_status = Signal(5)           # a fatal NAK's or an exhausted retry's status
        post = Signal(desc_layout)      # the WR taken
        turn_ev = Signal()              # ev/fire go first when they and posted wait
        turn_walk = Signal()            # a walk step goes first
        rep_rnr = Signal()              # reports waiting (state Report)
        rep_error = Signal()

        # completion slots (a power of two: full is the top bit)
        used = Signal(dw + 1)
        full = Signal()
        m.d.comb += [full.eq(used[dw]), self.slots_used.eq(used)]

        # ------------------------------------------------------------ retire registers
        # B: the descriptor and link read ports hold the entry at b_addr; C: the entry
        # before it, being decided
        w_tail = Signal(dw)
        w_ack = Signal()                # ACK: covered when last <= psn; else when last < psn
        w_stop = Signal()               # ACK / NAKs: stop at the first uncovered
        w_none = Signal()               # reset, exhausted retries: nothing covered
        w_reset = Signal()              # reset: all flushed
        w_seen = Signal()               # an uncovered entry was completed (fatal, reset)
        b_valid = Signal()
        b_addr = Signal(dw)
        c_valid = Signal()
        c_addr = Signal(dw)
        c_tail = Signal()
        c_desc = Signal(desc_layout)
        c_parts = {key: [Signal(name=f"c_{key}_{j}") for j in ("borrow", "hi0", "hi1")]
                   for key in ("ack", "nak")}
        # what End writes: the list after the retire walk, the new una, the decisions
        e_head = Signal(dw)
        e_live = Signal()
        e_una = Signal(PB)
        e_ign = Signal()                # a fire ignored
        e_prog = Signal()               # an ACK or NAK moves una
        e_walking = Signal()            # the op's QP is being walked
        e_direct = Signal()             # no walk and an empty queue: a walk starts at once
        e_hit = Signal()                # the retire walk completed the WR the walk is at

        # ------------------------------------------------------------ walk registers
        walk_on = Signal()
        walk_qp = Signal(qw)
        walk_ptr = Signal(dw)           # the WR the walk sends next (unless walk_new)
        walk_new = Signal()             # send the first WR kept, from una
        e_first = Signal()              # Emit: the WR goes from una
        e_addr = Signal(dw)             # Emit: its entry
        rt_layout = data.StructLayout({"first_psn": PB, "una": PB, "first": 1, "lo": 13,
                                       "hi0": 12, "hi1": 12})
        rt = Signal(rt_layout)          # a request's start packet, half computed
        rt_valid = Signal()
        rx = Signal(resume_layout(cfg))
        rx_valid = Signal()
        # a walk step is under way: from its grant until its request leaves on retx (or the
        # step ends without one); a step starts only when none is
        walk_busy = Signal()
        m.d.comb += [self.retx.payload.eq(rx), self.retx.valid.eq(rx_valid)]

        rd_ptr = Signal(dw)             # free list (a ring, initially every index)
        wr_ptr = Signal(dw)

        st = q_rd.data
        silent = Signal()
        take_ev = Signal()
        take_fire = Signal()
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
        # (the counters count registered strobes: no counter logic behind a decision)
        cnp_q = Signal()
        fire_ign = Signal()
        fire_ign_q = Signal()
        m.d.sync += [cnp_q.eq(take_ev & (self.ev.payload.kind == k.CNP)),
                     fire_ign_q.eq(fire_ign)]
        m.d.comb += [self.cnps.eq(event_counter(m, 32, cnp_q, "n_cnps")),
                     self.fires_ignored.eq(event_counter(m, 32, fire_ign_q,
                                                         "n_fires_ignored"))]

        # ------------------------------------------------------------ the walk's output
        # Emit fills the retx register's WR fields and rt; the next cycle finishes the start
        # packet's subtraction as a carry select (no 24-bit carry chain) and offers the
        # request (the walk starts a step only with rt and the register empty)
        with m.If(rx_valid & self.retx.ready):
            m.d.sync += [rx_valid.eq(0), walk_busy.eq(0)]
        with m.If(rt_valid):
            m.d.sync += [
                rt_valid.eq(0),
                rx_valid.eq(1),
                rx.start_packet.eq(Mux(rt.first,
                                       Cat(rt.lo[:12], Mux(rt.lo[12], rt.hi1, rt.hi0)), 0)),
                rx.start_psn.eq(Mux(rt.first, rt.una, rt.first_psn)),
            ]
        # (a QP written into the queue is on its output 2 cycles later)
        wq_w_q2 = Signal()
        m.d.sync += wq_w_q2.eq(wq_w_q)
        m.d.comb += self.rewinding.eq(walk_on | wq.o.valid | wq_w_q | wq_w_q2 | rt_valid |
                                      rx_valid)

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
            covered.eq(~w_none & Mux(w_ack, nb["ack"], ~nb["nak"])),
            stop.eq(w_stop & ~covered),
            retire.eq(c_valid & ~stop),
            end.eq(c_valid & (stop | c_tail)),
        ]

        # the read ports follow the retire walk (speculatively: reads have no effect)
        start_addr = Signal(dw)
        following = Signal()
        idle = Signal()
        sel_qp = Signal(qw)
        m.d.comb += [
            d_rd.addr.eq(Mux(following, n_rd.data, start_addr)),
            n_rd.addr.eq(Mux(following, n_rd.data, start_addr)),
            # (a walk step goes on at walk_ptr; everything else starts at the head)
            start_addr.eq(Mux(op_walk & ~op_pop & ~walk_new, walk_ptr, st.head)),
            # (the row is read in Idle and held while the operation runs)
            q_rd.addr.eq(sel_qp),
            q_rd.en.eq(idle),
            q_wr.addr.eq(op_qp),
        ]

        pay = self.posted.payload
        evp = self.ev.payload
        frp = self.fire.payload
        with m.FSM():
            with m.State("Idle"):
                m.d.comb += idle.eq(1)
                posted_ok = Signal()
                ev_ok = Signal()
                walk_ok = Signal()
                g_walk = Signal()
                g_ev = Signal()
                g_post = Signal()
                m.d.comb += [
                    posted_ok.eq(self.posted.valid & ~full),
                    ev_ok.eq(self.ev.valid | self.fire.valid),
                    walk_ok.eq((walk_on | wq.o.valid) & ~walk_busy),
                    take_reset.eq(self.reset.valid & arm_ok),
                    g_walk.eq(~self.reset.valid & arm_ok & walk_ok &
                              (turn_walk | ~(posted_ok | ev_ok))),
                    g_ev.eq(~self.reset.valid & arm_ok & ev_ok &
                            ~(walk_ok & turn_walk) & (turn_ev | ~posted_ok)),
                    g_post.eq(~self.reset.valid & arm_ok & posted_ok &
                              ~(walk_ok & turn_walk) & ~(ev_ok & turn_ev)),
                    self.reset.ready.eq(arm_ok),
                    self.fire.ready.eq(g_ev),
                    self.ev.ready.eq(g_ev & ~self.fire.valid),
                    self.posted.ready.eq(g_post),
                    take_ev.eq(self.ev.valid & self.ev.ready),
                    take_fire.eq(self.fire.valid & g_ev),
                    take_post.eq(g_post),
                ]
                # the QP of the input taken (an AND-OR of one-hot grants: no priority chain)
                walk_src = Signal(qw)
                m.d.comb += [
                    walk_src.eq(Mux(walk_on, walk_qp, wq.o.payload)),
                    sel_qp.eq(or_tree([
                        self.reset.payload.qp & take_reset.replicate(qw),
                        walk_src & g_walk.replicate(qw),
                        pay.qp & g_post.replicate(qw),
                        frp.qp & take_fire.replicate(qw),
                        evp.qp & (g_ev & ~self.fire.valid).replicate(qw)])),
                ]
                wc_op = Signal(2)
                with m.If(pay.opcode == proto.WrOpcode.RDMA_READ):
                    m.d.comb += wc_op.eq(proto.WcOpcode.RDMA_READ)
                with m.Elif(pay.opcode <= proto.WrOpcode.RDMA_WRITE_WITH_IMM):
                    m.d.comb += wc_op.eq(proto.WcOpcode.RDMA_WRITE)
                with m.Else():
                    m.d.comb += wc_op.eq(proto.WcOpcode.SEND)
                status = Signal(5)
                with m.If(self.fire.valid):
                    m.d.comb += status.eq(Mux(frp.kind == tk.RETRY_EXC,
                                              proto.WcStatus.RETRY_EXC_ERR,
                                              proto.WcStatus.RNR_RETRY_EXC_ERR))
                with m.Else():
                    with m.Switch(evp.code):
                        with m.Case(proto.NakCode.INVALID_REQUEST):
                            m.d.comb += status.eq(proto.WcStatus.REM_INV_REQ_ERR)
                        with m.Case(proto.NakCode.REMOTE_ACCESS_ERROR):
                            m.d.comb += status.eq(proto.WcStatus.REM_ACCESS_ERR)
                        with m.Default():
                            m.d.comb += status.eq(proto.WcStatus.REM_OP_ERR)
                # psn + 1 as a carry-select of two 12-bit halves (no 24-bit chain)
                lo1 = Signal(13)
                hi1 = Signal(PB - 12)
                m.d.comb += [lo1.eq(evp.psn[:12] + 1), hi1.eq(evp.psn[12:] + 1)]
                m.d.sync += [
                    op_qp.eq(sel_qp),
                    op_post.eq(take_post),
                    op_reset.eq(take_reset),
                    op_walk.eq(g_walk),
                    op_pop.eq(~walk_on),
                    op_ev.eq(take_ev),
                    op_fire.eq(take_fire),
                    raw["ack"].eq(evp.kind == k.ACK),
                    raw["nak"].eq(evp.kind == k.NAK_SEQ),
                    raw["rnr"].eq(evp.kind == k.RNR),
                    raw["fatal"].eq(evp.kind == k.FATAL),
                    raw["other"].eq(evp.kind > k.FATAL),
                    raw["to"].eq(frp.kind == tk.TIMEOUT),
                    raw["done"].eq(frp.kind == tk.RNR_DONE),
                    raw["exc"].eq(frp.kind[1]),
                    op_psn.eq(evp.psn),
                    op_psn1.eq(Cat(lo1[:12], Mux(lo1[12], hi1, evp.psn[12:]))),
                    op_code.eq(evp.code),
                    op_status.eq(status),
                    post.wr_id.eq(pay.wr_id),
                    post.length.eq(pay.length),
                    post.first_psn.eq(pay.first_psn),
                    post.last_psn.eq(pay.last_psn),
                    post.signaled.eq(pay.signaled),
                    post.wc_op.eq(wc_op),
                    post.opcode.eq(pay.opcode),
                    post.remote_addr.eq(pay.remote_addr),
                    post.r_key.eq(pay.r_key),
                    post.imm.eq(pay.imm),
                    post.solicited.eq(pay.solicited),
                ]
                with m.If(take_ev | take_fire):
                    m.d.sync += turn_ev.eq(0)
                with m.Elif(take_post):
                    m.d.sync += turn_ev.eq(1)
                with m.If(g_walk):
                    # (a QP taken from the queue is walked from now: `rewinding` stays high)
                    m.d.sync += [turn_walk.eq(0), walk_on.eq(1), walk_busy.eq(1)]
                with m.Elif(take_reset | g_ev | g_post):
                    m.d.sync += turn_walk.eq(1)
                # (every input taken goes to Load, a CNP too: the choice of the next state
                # does not wait for the event's kind)
                with m.If(take_reset | g_walk | g_ev | g_post):
                    m.next = "Load"

            with m.State("Load"):
                # the QP's row (st) is on the read port now
                m.d.sync += [
                    w_tail.eq(st.tail),
                    w_ack.eq(op_ack),
                    w_stop.eq(op_ack | op_nak | op_rnr),
                    w_none.eq(op_reset | op_exc),
                    w_reset.eq(op_reset),
                    w_seen.eq(0),
                    b_addr.eq(start_addr),
                    c_valid.eq(0),
                    e_head.eq(st.head),
                    e_live.eq(st.live),
                    e_una.eq(Mux(op_ack, op_psn1,
                                 Mux(op_nak | op_rnr | op_fatal, op_psn, st.una))),
                    e_prog.eq(Mux(op_ack, op_psn1 != st.una,
                                  (op_nak | op_rnr | op_fatal) & (op_psn != st.una))),
                    e_walking.eq(walk_on & (walk_qp == op_qp)),
                    # (a QP written into the queue 2 cycles ago is not on its output yet)
                    e_direct.eq(~walk_on & ~wq.o.valid & ~wq_w_q & ~wq_w_q2),
                    e_hit.eq(0),
                    e_ign.eq((op_to | op_done | op_exc) &
                             (~st.live | st.err | (op_to & st.rnr_wait) |
                              (op_done & ~st.rnr_wait))),
                ]
                with m.If(op_post):
                    m.d.comb += [
                        arm_w.eq(1),
                        arm_in.qp.eq(op_qp),
                        arm_in.outstanding.eq(~st.err),
                    ]
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
                            q_wr.data.eq(st),
                            q_wr.data.head.eq(Mux(st.live, st.head, new)),
                            q_wr.data.tail.eq(new),
                            q_wr.data.live.eq(1),
                            q_wr.data.una.eq(Mux(st.live, st.una, post.first_psn)),
                            q_wr.en.eq(1),
                        ]
                        m.d.sync += rd_ptr.eq(rd_ptr + 1)
                    m.next = "Idle"
                with m.Elif(op_walk):
                    # (a QP started from the queue leaves it)
                    # (the queue's output stays until taken: it is taken here, from
                    # registers, not in Idle)
                    m.d.comb += [q_wr.data.eq(st), q_wr.data.pending.eq(0), q_wr.en.eq(op_pop),
                                 wq.o.ready.eq(op_pop)]
                    m.d.sync += [walk_qp.eq(op_qp), e_addr.eq(start_addr),
                                 e_first.eq(op_pop | walk_new)]
                    with m.If(st.live & ~st.err & ~st.rnr_wait):
                        m.d.sync += walk_on.eq(1)
                        m.next = "Emit"
                    with m.Else():
                        m.d.sync += [walk_on.eq(0), walk_busy.eq(0)]
                        m.next = "Idle"
                with m.Elif(op_other | (~op_reset & st.err & ~(op_to | op_done | op_exc))):
                    m.next = "Idle"             # a CNP (counted), or the QP has failed
                with m.Elif(st.live & ~st.err & ~op_to & ~op_done):
                    m.d.sync += b_valid.eq(1)
                    m.next = "Retire"
                with m.Else():
                    m.next = "End"

            with m.State("Retire"):
                m.d.comb += following.eq(1)
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
                    # (the WR the walk was to send next is complete: it starts again)
                    with m.If(c_addr == walk_ptr):
                        m.d.sync += e_hit.eq(1)
                with m.If(c_valid & ~covered):
                    m.d.sync += w_seen.eq(1)
                with m.If(end):
                    # the list is empty unless the walk stopped at an uncovered WR
                    m.d.sync += [e_head.eq(c_addr), e_live.eq(stop)]
                    m.next = "End"

            with m.State("End"):
                # the row after the event (st still holds the row as it was)
                ev_any = Signal()
                progress = Signal()
                waiting = Signal()
                hold = Signal()
                ended = Signal()
                go = Signal()
                new_rnr = Signal()
                fail = Signal()
                m.d.comb += [
                    ev_any.eq(op_ack | op_nak | op_rnr | op_fatal),
                    progress.eq(e_prog),
                    waiting.eq(st.rnr_wait & ~progress),
                    hold.eq(st.nak_hold & ~progress),
                    ended.eq(st.rnr_wait & progress),
                    # (a QP with nothing kept is not walked: nothing to send)
                    go.eq(e_live & ((op_nak & ~waiting & ~hold) | (op_ack & ended) |
                                    ((op_to | op_done) & ~e_ign))),
                    new_rnr.eq(op_rnr & ~waiting),
                    fail.eq(op_fatal | (op_exc & ~e_ign)),
                    fire_ign.eq(e_ign),
                ]
                with m.If(op_reset):
                    m.d.comb += [q_wr.data.pending.eq(st.pending), q_wr.en.eq(1)]
                with m.Else():
                    m.d.comb += [
                        q_wr.data.head.eq(e_head),
                        q_wr.data.tail.eq(st.tail),
                        q_wr.data.live.eq(e_live),
                        q_wr.data.err.eq(st.err | fail),
                        q_wr.data.una.eq(e_una),
                        q_wr.data.nak_hold.eq((hold | (op_nak & ~waiting) | new_rnr) &
                                              ~(op_to & ~e_ign)),
                        q_wr.data.rnr_wait.eq((waiting | new_rnr) & ~op_done),
                        q_wr.data.pending.eq(st.pending | (go & ~e_walking & ~e_direct)),
                        q_wr.en.eq(1),
                    ]
                # the walk
                with m.If(e_walking & (go | e_hit)):
                    m.d.sync += walk_new.eq(1)
                with m.If(go & e_direct):
                    # (nothing walked or queued: the walk starts here, not through the queue)
                    m.d.sync += [walk_on.eq(1), walk_new.eq(1), walk_qp.eq(op_qp)]
                m.d.comb += [wq_w.eq(go & ~e_walking & ~e_direct & ~st.pending)]
                m.d.sync += wq_in_q.eq(op_qp)
                with m.If(e_walking & (new_rnr | fail | op_reset)):
                    m.d.sync += walk_on.eq(0)
                # news for the timers
                m.d.comb += [
                    arm_w.eq(ev_any | op_reset | (op_exc & ~e_ign)),
                    arm_in.qp.eq(op_qp),
                    arm_in.outstanding.eq(ev_any & e_live & ~fail),
                    arm_in.progress.eq(progress),
                ]
                m.d.sync += [rep_rnr.eq(new_rnr), rep_error.eq(fail)]
                with m.If(new_rnr | fail):
                    m.next = "Report"
                with m.Else():
                    m.next = "Idle"

            with m.State("Emit"):
                # the descriptor of the WR at e_addr is on the read port: a resume request
                d = d_rd.data
                m.d.sync += [
                    rx.qp.eq(op_qp), rx.wr_id.eq(d.wr_id), rx.opcode.eq(d.opcode),
                    rx.remote_addr.eq(d.remote_addr), rx.r_key.eq(d.r_key),
                    rx.length.eq(d.length), rx.imm.eq(d.imm), rx.signaled.eq(d.signaled),
                    rx.solicited.eq(d.solicited), rt.first_psn.eq(d.first_psn),
                    rt.una.eq(st.una), rt.first.eq(e_first),
                    # (the two high differences registered apart: Yosys would otherwise
                    # share them as one chain with the borrow as carry-in)
                    rt.lo.eq(st.una[:12] - d.first_psn[:12]),
                    rt.hi0.eq(st.una[12:] - d.first_psn[12:]),
                    rt.hi1.eq(st.una[12:] + ~d.first_psn[12:]),
                    rt_valid.eq(1),
                    walk_ptr.eq(n_rd.data),
                    walk_new.eq(0),
                ]
                with m.If(e_addr == st.tail):
                    m.d.sync += walk_on.eq(0)
                m.next = "Idle"

            with m.State("Report"):
                # rnr only once the arm written before it has left: the timers see the
                # progress (retry counts reloaded) before the RNR wait
                rnr_now = Signal()
                m.d.comb += [
                    rnr_now.eq(rep_rnr & ~arm_w_q & (arm_fifo.w_level == 0)),
                    rnr_in.qp.eq(op_qp),
                    rnr_in.code.eq(op_code),
                    rnr_fifo.w_en.eq(rnr_now),
                    er_in.qp.eq(op_qp),
                    er_in.status.eq(op_status),
                    er_fifo.w_en.eq(rep_error),
                ]
                with m.If(rnr_now & rnr_fifo.w_rdy):
                    m.d.sync += rep_rnr.eq(0)
                with m.If(er_fifo.w_rdy):
                    m.d.sync += rep_error.eq(0)
                with m.If((~rep_rnr | (rnr_now & rnr_fifo.w_rdy)) &
                          (~rep_error | er_fifo.w_rdy)):
                    m.next = "Idle"
        return m
