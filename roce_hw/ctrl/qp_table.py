# SPDX-License-Identifier: BSD-2-Clause
"""QP/PSN state RAM: per-QP context rows in ``lib.memory``, a management port, datapath ports."""

from amaranth import *
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import proto
from ..config import check_n_qp
from ..layouts import (QP_CONTEXT, QPReadSignature, mgmt_req_layout, mgmt_rsp_layout,
                       qp_index_width, tx_upd_layout, una_upd_layout)
from ..lib.stream import ReadyBreak

__all__ = ["QPStateTable"]

# The row is split across memories by writer, so that every internal writer touches only its own
# field(s) and can never clobber (or be clobbered by) a concurrent management write of another.
_SPLIT_FIELDS = ("state", "next_psn", "una_psn")
_CFG = data.StructLayout({name: field.shape for name, field in QP_CONTEXT
                          if name not in _SPLIT_FIELDS})


class QPStateTable(wiring.Component):
    """QP/PSN state RAM for ``n_qp`` queue pairs, one :data:`QP_CONTEXT` row per QP.

    The row is stored in four ``lib.memory.Memory`` instances, split by writer: the configuration
    fields (written by management only), ``next_psn`` (management and ``tx_upd``), ``state``
    (management and ``tx_upd``) and ``una_psn`` (management and ``una_upd``). Each memory has
    one write port and three synchronous read ports (``tx_rd``, ``ack_rd`` and management).
    ``ack_rd`` behaves as ``tx_rd`` (not transparent, never blocked); the ACK handler forwards
    its own ``una_upd`` writes. There are no
    per-QP registers, so the design is the same at 1 or 16384 QPs; the memories map to
    block/distributed RAM.

    ``tx_upd`` and ``una_upd`` writes take effect in the cycle of the stream transfer that
    carries them; a management write is written the cycle after its transfer (the *write
    stage*, the first cycle of its response). A management read sees every write made before
    and in its cycle (transparent); a ``tx_rd`` read returns the row from before the writes of
    its cycle: it sees an update transferred a cycle or more before it, and a management write
    transferred two cycles or more before it (the TX path forwards its own write-backs; a WR
    transferred after a management write's response finds the row written; keeping ``tx_rd``
    non-transparent keeps the writes off its data path). The management read ports are not
    transparent either: the rows they return are patched after their registers, from
    registered copies of what was written in the read's cycle (the request's own row for a
    write; ``tx_upd``'s and ``una_upd``'s fields), so no write port is on the response's data
    path (ECP5 timing).

    Arbitration. Only a management *write* to a valid row competes with the internal writers
    (management reads use their own read ports; out-of-range requests write nothing; ``tx_upd``
    and ``una_upd`` use different memories and never compete with each other). The write stage
    has the write ports to itself in its cycle: ``tx_upd.ready``, ``una_upd.ready`` and
    ``mgmt_req.ready`` are low then. Bounds (tested): an internal update waits at most 1 cycle;
    a management request waits at most 1 cycle once its response slot is free; with every port
    valid every cycle, management writes go every other cycle and both internal writers in the
    cycles between. No port can starve another. Every write port input is a flip-flop, or one
    LUT of flip-flops and the internal writers' ports (the ECP5 placer had put the former
    round-robin arbitration up to 3.8 ns of routing away from the write addresses).

    Latency and throughput:

    * ``mgmt_req`` -> ``mgmt_rsp``: response valid the cycle after the request transfer (1 cycle);
      1 request per cycle while ``mgmt_rsp`` is ready (a 1-deep output register, full backpressure:
      ``mgmt_req.ready`` is low while a response is held, and in the cycle after a write).
      Exactly one response per request, in order.
    * ``tx_rd``, ``ack_rd``: 1 cycle, 1 read per cycle, never blocked.
    * ``tx_upd`` / ``una_upd``: 0 cycles (written at the transfer), 1 per cycle; ``ready`` is low
      only in the write stage's cycle (at most 1 cycle in a row).

    Combinational paths: none through the block. Every ``ready`` and ``mgmt_rsp.valid`` is a
    function of registers; ``tx_rd.data`` comes from the RAM outputs.

    Out-of-range indices (``qp >= n_qp``, possible when ``n_qp`` is 1 or not a power of two):
    a management request gets ``error=1`` and an all-zero ``ctx`` and writes nothing; a ``tx_rd``
    returns an all-zero row (``state`` RESET); ``tx_upd``/``una_upd`` transfers are accepted,
    dropped and counted in ``upd_dropped``.

    Parameters
    ----------
    n_qp : int
        Number of queue pairs, 1 to 16384 (local QPNs ``256 .. 256 + n_qp - 1``).
    init : sequence of dict, optional
        Initial rows (``QP_CONTEXT`` field dicts, missing fields 0), at most ``n_qp``; the other
        rows start all-zero (state RESET).

    Members
    -------
    mgmt_req : ``In(stream.Signature(mgmt_req_layout(n_qp)))``
        Management requests ``{qp, write, ctx}``: ``write=1`` writes the whole row ``ctx``,
        ``write=0`` reads it (``ctx`` ignored).
    mgmt_rsp : ``Out(stream.Signature(mgmt_rsp_layout(n_qp)))``
        One response ``{qp, write, error, ctx}`` per request: ``ctx`` is the row read, or the row
        as written (for a write), or all-zero with ``error=1`` when ``qp >= n_qp``.
    tx_rd : ``In(QPReadSignature(idx_width))``
        The TX datapath's read port (members on the table: ``addr`` In, ``en`` In, ``data`` Out).
    ack_rd : ``In(QPReadSignature(idx_width))``
        The ACK handler's read port (as ``tx_rd``).
    tx_upd : ``In(stream.Signature(tx_upd_layout(n_qp)))``
        The TX datapath's write-back: ``next_psn`` if ``psn_we``, ``state`` if ``state_we``.
    una_upd : ``In(stream.Signature(una_upd_layout(n_qp)))``
        The ACK handler's write-back of ``una_psn``.
    upd_dropped : ``Out(16)``
        Saturating count of ``tx_upd``/``una_upd`` transfers dropped for an out-of-range ``qp``.

    Raises
    ------
    ValueError
        If ``n_qp`` is not an integer from 1 to 16384, or ``init`` has more than ``n_qp`` rows.
    """

    def __init__(self, n_qp=16, *, init=None):
        check_n_qp(n_qp)
        self._n_qp = n_qp
        self._idx_width = qp_index_width(n_qp)
        init = [] if init is None else [dict(row) for row in init]
        if len(init) > n_qp:
            raise ValueError(f"init has {len(init)} rows but the table has only {n_qp} QPs")
        for row in init:
            QP_CONTEXT.const(row)  # raises on unknown fields / bad values
        self._init = init
        super().__init__({
            "mgmt_req": In(stream.Signature(mgmt_req_layout(n_qp))),
            "mgmt_rsp": Out(stream.Signature(mgmt_rsp_layout(n_qp))),
            "tx_rd": In(QPReadSignature(self._idx_width)),
            "ack_rd": In(QPReadSignature(self._idx_width)),
            "tx_upd": In(stream.Signature(tx_upd_layout(n_qp))),
            "una_upd": In(stream.Signature(una_upd_layout(n_qp))),
            "upd_dropped": Out(16),
        })

    @property
    def n_qp(self):
        """Number of queue pairs."""
        return self._n_qp

    @property
    def idx_width(self):
        """Width of the QP index fields."""
        return self._idx_width

    @property
    def _all_valid(self):
        # True when every encodable index is a valid row (no range checks needed).
        return self._n_qp == 1 << self._idx_width

    def _in_range(self, m, name, qp):
        ok = Signal(name=name)
        if self._all_valid:
            m.d.comb += ok.eq(1)
        else:
            m.d.comb += ok.eq(qp < self._n_qp)
        return ok

    def elaborate(self, platform):
        m = Module()
        # A 1-row memory would have a 0-bit address, which Verilator rejects (LITENDIAN);
        # row 1 of the 2-row memory is never written (qp 1 is out of range) nor returned.
        n = max(2, self._n_qp)

        def init_of(field):
            return [row.get(field, 0) for row in self._init]

        mem_cfg = memory.Memory(shape=_CFG, depth=n, init=[
            {k: v for k, v in row.items() if k not in _SPLIT_FIELDS} for row in self._init])
        mem_psn = memory.Memory(shape=proto.PSN_BITS, depth=n, init=init_of("next_psn"))
        mem_state = memory.Memory(shape=3, depth=n, init=init_of("state"))
        mem_una = memory.Memory(shape=proto.PSN_BITS, depth=n, init=init_of("una_psn"))
        m.submodules.mem_cfg = mem_cfg
        m.submodules.mem_psn = mem_psn
        m.submodules.mem_state = mem_state
        m.submodules.mem_una = mem_una

        mems = {"cfg": mem_cfg, "psn": mem_psn, "state": mem_state, "una": mem_una}
        wr = {k: mem.write_port() for k, mem in mems.items()}
        # tx_rd is not transparent: the TX path forwards its own write-backs (PsnForward), and
        # a management write is seen by reads after its response; this keeps the write ports'
        # arbitration off the read data path
        trd = {k: mem.read_port() for k, mem in mems.items()}
        ard = {k: mem.read_port() for k, mem in mems.items()}
        mrd = {k: mem.read_port() for k, mem in mems.items()}

        req = self.mgmt_req
        # the response register drives `mgmt_rsp` through a ReadyBreak, so the external
        # `ready` never reaches the write ports and, through their transparency, the read data
        m.submodules.rsp_break = rsp_break = ReadyBreak(mgmt_rsp_layout(self._n_qp))
        wiring.connect(m, rsp_break.o, wiring.flipped(self.mgmt_rsp))
        rsp = rsp_break.i
        tx = self.tx_upd
        una = self.una_upd

        # --- arbitration --------------------------------------------------------------------
        req_ok = self._in_range(m, "req_in_range", req.payload.qp)
        tx_ok = self._in_range(m, "tx_upd_in_range", tx.payload.qp)
        una_ok = self._in_range(m, "una_upd_in_range", una.payload.qp)

        rsp_free = Signal()
        m.d.comb += rsp_free.eq(~rsp.valid | rsp.ready)
        # Nearly the same, as a flip-flop of its own computed a cycle ahead, for the
        # request's ready. It takes a request offered (`req.valid`) for one taken, so the
        # handshake is not in its own input: it is `rsp_free` except for a cycle after a
        # write request waited behind the write stage while the ready-break held a response
        # (it is never high when `rsp_free` is low). The response registers and the read
        # ports' enables see `rsp_free`, a LUT of flip-flops (ECP5: the loop through
        # `req.ready` had 2 ns hops).
        req_go = Signal()
        rsp_free_arb = Signal(init=1)
        valid_n = Signal()      # the response register's next `valid`, or more
        m.d.comb += valid_n.eq((req.valid & rsp_free_arb) | (rsp.valid & ~rsp.ready))
        m.d.sync += rsp_free_arb.eq(~valid_n | rsp_break.ready_next)

        # The write stage: a management write is written the cycle after its transfer, from
        # the registers that hold the request for its response (its QP and row), and has the
        # write ports to itself then: `tx_upd` and `una_upd` are not ready, and no management
        # request is taken (so a management read needs no patch for it, and the internal
        # writers wait at most that one cycle). Every write port input is then a flip-flop or
        # one LUT of flip-flops and the writers' ports (ECP5: the arbitration had reached every
        # distributed-RAM slice's write address through up to 3.8 ns of routing).
        wq = Signal(name="mgmt_wq")                     # the stage holds a write this cycle
        wq_qp = rsp.payload.qp
        wq_ctx = Signal(QP_CONTEXT, name="mgmt_req_ctx")
        m.d.comb += [
            req.ready.eq(rsp_free_arb & ~wq),
            req_go.eq(req.valid & req.ready),
            tx.ready.eq(~wq),
            una.ready.eq(~wq),
        ]
        # (out-of-range writes write nothing)
        m.d.sync += wq.eq(req_go & req.payload.write & req_ok)
        tx_go = Signal()
        una_go = Signal()
        m.d.comb += [
            tx_go.eq(tx.valid & tx.ready),
            una_go.eq(una.valid & una.ready),
        ]

        dropped = Signal(16)
        n_drop = Signal(2)
        m.d.comb += n_drop.eq((tx_go & ~tx_ok) + (una_go & ~una_ok))
        with m.If(n_drop != 0):
            with m.If(dropped > 0xFFFF - n_drop):
                m.d.sync += dropped.eq(0xFFFF)
            with m.Else():
                m.d.sync += dropped.eq(dropped + n_drop)
        m.d.comb += self.upd_dropped.eq(dropped)

        # --- write ports --------------------------------------------------------------------
        # (an internal writer's address and data are selected by its own transfer, the write
        # stage's otherwise: where an internal writer is tied off they are the stage's wires)
        m.d.comb += [
            wr["cfg"].addr.eq(wq_qp),
            wr["cfg"].en.eq(wq),
        ]
        for name, _ in _CFG:
            m.d.comb += wr["cfg"].data[name].eq(wq_ctx[name])
        m.d.comb += [
            wr["psn"].addr.eq(Mux(tx_go, tx.payload.qp, wq_qp)),
            wr["psn"].data.eq(Mux(tx_go, tx.payload.next_psn, wq_ctx.next_psn)),
            wr["psn"].en.eq(wq | (tx_go & tx_ok & tx.payload.psn_we)),
            wr["state"].addr.eq(Mux(tx_go, tx.payload.qp, wq_qp)),
            wr["state"].data.eq(Mux(tx_go, tx.payload.state, wq_ctx.state)),
            wr["state"].en.eq(wq | (tx_go & tx_ok & tx.payload.state_we)),
            wr["una"].addr.eq(Mux(una_go, una.payload.qp, wq_qp)),
            wr["una"].data.eq(Mux(una_go, una.payload.una_psn, wq_ctx.una_psn)),
            wr["una"].en.eq(wq | (una_go & una_ok)),
        ]

        # --- tx_rd, ack_rd -------------------------------------------------------------------
        for name, rd, ports in (("tx_rd", self.tx_rd, trd), ("ack_rd", self.ack_rd, ard)):
            rd_ok = self._in_range(m, f"{name}_in_range", rd.addr)
            rd_ok_q = Signal(name=f"{name}_ok_q")
            with m.If(rd.en):
                m.d.sync += rd_ok_q.eq(rd_ok)
            for port in ports.values():
                m.d.comb += [port.addr.eq(rd.addr), port.en.eq(rd.en)]
            self._gather(m, rd.data, {k: port.data for k, port in ports.items()},
                         None if self._all_valid else rd_ok_q)

        # --- management response ------------------------------------------------------------
        # (the read ports follow the request port while the response register is free -- a
        # request is taken only then -- and hold the row of the response waiting: their
        # enable is a function of registers, not of the arbitration behind req_go)
        for port in mrd.values():
            m.d.comb += [port.addr.eq(req.payload.qp), port.en.eq(rsp_free)]
        # (the response register follows the request port while free, like the read ports:
        # only its `valid` sees `req_go`)
        rsp_ok_q = Signal()
        with m.If(rsp_free):
            m.d.sync += [
                rsp.valid.eq(req_go),
                rsp.payload.qp.eq(req.payload.qp),
                rsp.payload.write.eq(req.payload.write),
                rsp.payload.error.eq(~req_ok),
                rsp_ok_q.eq(req_ok),
                wq_ctx.eq(req.payload.ctx),
            ]
        patched = self._patch(m, mrd, rsp_free, req, wq_ctx, (tx, tx_go & tx_ok),
                              (una, una_go & una_ok))
        self._gather(m, rsp.payload.ctx, patched, None if self._all_valid else rsp_ok_q)
        return m

    @staticmethod
    def _patch(m, mrd, en, req, req_ctx, tx_w, una_w):
        """The management read data with the writes of its own cycle applied (the transparency
        of the read), from registers loaded with the read ports (enable ``en``). A write
        request's response is its own row (``req_ctx``: the request's row, registered with
        enable ``en``); otherwise the writes of the read's cycle are ``tx_upd``'s and
        ``una_upd``'s (``tx_w``/``una_w``: the stream, and "it writes this cycle"). Returns
        ``{memory: data}``."""
        tx, tx_we = tx_w
        una, una_we = una_w
        echo = Signal(name="mrd_echo")                 # the request is a write: its own row
        tx_hit = Signal(name="mrd_tx_hit")             # tx_upd wrote the row read
        una_hit = Signal(name="mrd_una_hit")
        same_tx = Signal()
        same_una = Signal()
        m.d.comb += [same_tx.eq(tx_we & (tx.payload.qp == req.payload.qp)),
                     same_una.eq(una_we & (una.payload.qp == req.payload.qp))]
        tx_psn_we = Signal(name="mrd_tx_psn_we")
        tx_state_we = Signal(name="mrd_tx_state_we")
        tx_psn = Signal(proto.PSN_BITS, name="mrd_tx_psn")
        tx_state = Signal.like(tx.payload.state, name="mrd_tx_state")
        una_psn = Signal(proto.PSN_BITS, name="mrd_una_psn")
        with m.If(en):
            m.d.sync += [
                echo.eq(req.payload.write),
                tx_hit.eq(same_tx), tx_psn_we.eq(tx.payload.psn_we),
                tx_state_we.eq(tx.payload.state_we),
                tx_psn.eq(tx.payload.next_psn), tx_state.eq(tx.payload.state),
                una_hit.eq(same_una), una_psn.eq(una.payload.una_psn),
            ]
        out = {"cfg": Signal.like(mrd["cfg"].data, name="mrd_cfg"),
               "psn": Signal(proto.PSN_BITS, name="mrd_psn"),
               "state": Signal.like(mrd["state"].data, name="mrd_state"),
               "una": Signal(proto.PSN_BITS, name="mrd_una")}
        for name, _ in _CFG:
            m.d.comb += out["cfg"][name].eq(Mux(echo, req_ctx[name], mrd["cfg"].data[name]))
        m.d.comb += [
            out["psn"].eq(Mux(echo, req_ctx.next_psn,
                              Mux(tx_hit & tx_psn_we, tx_psn, mrd["psn"].data))),
            out["state"].eq(Mux(echo, req_ctx.state,
                                Mux(tx_hit & tx_state_we, tx_state, mrd["state"].data))),
            out["una"].eq(Mux(echo, req_ctx.una_psn, Mux(una_hit, una_psn, mrd["una"].data))),
        ]
        return out

    @staticmethod
    def _gather(m, out, data, ok):
        """Assemble a row from ``{memory: read data}``; all-zero when ``ok`` is low (no gating
        when ``ok`` is None)."""
        stmts = [out[name].eq(data["cfg"][name]) for name, _ in _CFG]
        stmts += [
            out.next_psn.eq(data["psn"]),
            out.state.eq(data["state"]),
            out.una_psn.eq(data["una"]),
        ]
        if ok is None:
            m.d.comb += stmts
        else:
            with m.If(ok):
                m.d.comb += stmts
