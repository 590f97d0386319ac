# SPDX-License-Identifier: BSD-2-Clause
"""On-chip traffic generator: work requests and their payloads for the connection manager's
txmeta command (bring-up with no user logic, as in the reference design)."""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..config import check_config
from ..lib.arith import FastCounter
from ..lib.stream import PacketSignature
from ..layouts import qp_index_width
from ..verbs import gen_cmd_layout, wr_layout

__all__ = ["gen_cmd_layout", "TrafficGenerator"]   # gen_cmd_layout: from roce_hw.verbs


class TrafficGenerator(wiring.Component):
    """Posts ``count`` work requests with generated payloads on one QP, on command.

    Traffic (the "generator traffic" of the connection manager, modelled by
    :mod:`roce_hw.model.generator`): message ``n`` (0 .. ``count`` - 1) is a work request with
    ``wr_id`` = ``n``, ``imm`` = ``n`` (set for every opcode; the TX engine reads it only for
    the ``*_WITH_IMM`` ones), ``remote_addr`` = ``remote_va + n * length`` (mod 2**64), the
    command's ``opcode``, ``qp``, ``length`` and ``r_key``, ``signaled`` = ``solicited`` = 0;
    and, if ``length`` > 0, one payload packet on ``i`` of exactly ``length`` bytes, byte ``k``
    = ``(k + n) & 0xFF``, ``keep`` exact on its last beat (lanes beyond it are don't-care).

    Commands. ``cmd.ready`` is high except for a start while :attr:`busy`: a start is taken
    only while the generator is idle (the connection manager checks ``busy`` first and answers
    NAK ``busy``; a start offered while busy waits). A stop (``start`` = 0) is always taken:
    no work request is offered after it that was not already offered in the cycle it was
    taken; that one (if any) is still posted and every posted request's payload completes,
    then ``busy`` falls. A stop while idle does nothing. A ``length`` above 2**31 is not
    refused here: the requests go out and the TX engine refuses them (LOC_LEN_ERR, payload
    drained); the connection manager never starts such a run.

    The work requests and the payload are independent streams: request ``n`` is offered
    whether or not payload ``n - 1`` has been taken, and payload ``n`` is offered from the
    cycle after request ``n`` is (the TX engine takes a request first, then its payload). At
    most 7 requests may be posted ahead of their payloads' last beats; more wait.

    Latency: a start taken in cycle ``t`` offers request 0 in cycle ``t +``
    :attr:`latency` (7: the command register, 5 cycles to fill the address pipeline, the request
    register), its first payload beat in the cycle after. Throughput: one request per cycle with
    ``period`` <= 1 (request ``n + 1`` is offered in the cycle after request ``n`` was taken),
    else request ``n + 1`` is offered exactly ``period`` cycles after request ``n`` was taken;
    one payload beat per cycle, the first beat of a packet straight after the last beat of the
    one before. Backpressure: ``wr`` and ``i`` stall independently (a stalled ``i`` stalls
    ``wr`` only once 7 requests are ahead of their payloads). ``wr`` and ``i`` are registered
    outputs, ``busy`` an OR of registers, ``cmd.ready`` a function of registers and
    ``cmd.payload.start``.

    Structure: ``remote_addr`` = ``remote_va + n * length`` is produced by a skewed
    accumulator (:class:`_AddressSequence`, 12-bit carry chains, no 64-bit adder); the counts
    are :class:`~roce_hw.lib.arith.FastCounter` s; lane ``j`` of a payload beat is ``(base + j) &
    0xFF``, ``base`` stepping by ``W/8`` per beat. Longest path 5 LUT/carry cells (Yosys xcup,
    64 and 512 bits).

    Parameters
    ----------
    config : EngineConfig
        ``data_width`` and ``n_qp``.

    Members
    -------
    cmd : ``In(stream.Signature(gen_cmd_layout(config)))``
        Start and stop commands.
    wr : ``Out(stream.Signature(wr_layout(config)))``
        Work requests, for the TX engine (through :class:`roce_hw.ctrl.wrmux.WrMux`).
    i : ``Out(PacketSignature(data_width))``
        Payload packets, one per request with ``length`` > 0, in request order.
    busy : ``Out(1)``
        A run is in progress: requests left to post, or posted requests whose payloads are not
        yet all taken (from registers).
    qp : ``Out(qp_index_width)``
        QP index of the current (or last) run.
    sent : ``Out(32)``
        Requests posted (taken on ``wr``) since reset, over every run, wrapping modulo 2**32;
        a start or stop does not clear it.

    Raises
    ------
    TypeError
        If ``config`` is not an :class:`~roce_hw.config.EngineConfig`.
    """

    #: Requests that may be posted ahead of the last beat of their payloads.
    MAX_AHEAD = 7

    def __init__(self, config):
        self._config = check_config(config)
        super().__init__({
            "cmd": In(stream.Signature(gen_cmd_layout(config))),
            "wr": Out(stream.Signature(wr_layout(config))),
            "i": Out(PacketSignature(config.data_width)),
            "busy": Out(1),
            "qp": Out(qp_index_width(config.n_qp)),
            "sent": Out(32),
        })

    @property
    def config(self):
        """The :class:`~roce_hw.config.EngineConfig` of this generator."""
        return self._config

    @property
    def latency(self):
        """Cycles from a start taken on ``cmd`` to request 0 offered on ``wr``: the command
        register, the address pipeline's fill (:class:`_AddressSequence`) and the request
        register."""
        return 2 + _AddressSequence.fill(64)

    def elaborate(self, platform):
        m = Module()
        n = self._config.data_bytes
        s = (n - 1).bit_length()          # log2 of the bytes per beat
        c = self.cmd.payload

        # ---------------------------------------------------------------- commands
        # The run's parameters, held from a start until the next one (a start is only taken
        # while idle, so they are stable while anything of the run is in flight).
        opcode = Signal(4)
        length = Signal(32)
        r_key = Signal(32)
        count = Signal(32)
        period = Signal(32)
        setup = Signal()           # the cycle after a start: derive the run's constants
        run = Signal()             # requests left to offer
        # requests offered whose payload is not all out, as a thermometer code (owed[0]: at
        # least one, owed[-1]: MAX_AHEAD)
        owed = Signal(self.MAX_AHEAD)
        busy = Signal()
        m.d.comb += [
            busy.eq(setup | run | self.wr.valid | owed[0] | self.i.valid),
            self.busy.eq(busy),
            self.cmd.ready.eq(~busy | ~c.start),
        ]
        start = Signal()
        stop = Signal()
        m.d.comb += [
            start.eq(self.cmd.valid & self.cmd.ready & c.start),
            stop.eq(self.cmd.valid & ~c.start),
        ]
        m.d.sync += setup.eq(start)
        with m.If(start):
            m.d.sync += [self.qp.eq(c.qp), opcode.eq(c.opcode), length.eq(c.length),
                         r_key.eq(c.r_key), count.eq(c.count), period.eq(c.period)]

        # Constants of the run, derived from the registered command in the setup cycle.
        p_le1 = Signal()           # period <= 1: the next request may follow in the same cycle
        p_le2 = Signal()           # period <= 2: ... in the next cycle
        has_pay = Signal()         # length > 0
        lz = Signal()              # length is a whole number of beats
        full_beats = Signal(32 - s)    # length // (W/8)
        single = Signal()          # a payload packet is one beat
        lkeep = Signal(n)          # keep of a packet's last beat
        single_c = Signal()
        lkeep_c = Signal(n)
        m.d.comb += [
            full_beats.eq(length[s:]),
            single_c.eq(Mux(length[:s] == 0, full_beats == 1, full_beats == 0)),
        ]
        with m.Switch(length[:s]):
            for r in range(n):
                with m.Case(r):
                    m.d.comb += lkeep_c.eq((1 << (r or n)) - 1)
        with m.If(setup):
            m.d.sync += [
                # zero tests, not comparisons (a comparison is a 32-bit carry chain)
                p_le1.eq(period[1:] == 0), p_le2.eq((period[2:] == 0) & ~period[:2].all()),
                has_pay.eq(length != 0),
                lz.eq(length[:s] == 0), single.eq(single_c), lkeep.eq(lkeep_c),
            ]

        # ---------------------------------------------------------------- work requests
        left = FastCounter(m, 32, "left", down=True)     # requests still to offer
        msg = FastCounter(m, 32, "msg")                  # n of the next request
        sent = FastCounter(m, 32, "sent_count")
        wait = FastCounter(m, 32, "wait", down=True)     # the period timer
        expired = Signal(init=1)                         # the timer allows the next offer
        m.d.comb += self.sent.eq(sent.value)
        addr_adv = Signal()
        addr = _AddressSequence(m, c.remote_va, length, load=start, advance=addr_adv)

        wr_free = Signal()
        taken = Signal()
        commit = Signal()          # load the next request into the output register
        left_one = Signal()
        m.d.comb += [
            wr_free.eq(~self.wr.valid | self.wr.ready),
            taken.eq(self.wr.valid & self.wr.ready),
            left_one.eq(left.value == 1),
            commit.eq(run & addr.ready & wr_free & Mux(self.wr.valid, p_le1, expired) &
                      ~owed[-1] & ~stop),
            addr_adv.eq(commit | ~addr.ready),
        ]
        wr_n = Signal(32)
        wr_addr = Signal(64)
        p = self.wr.payload
        m.d.comb += [
            p.wr_id.eq(wr_n), p.imm.eq(wr_n), p.remote_addr.eq(wr_addr),
            p.opcode.eq(opcode), p.qp.eq(self.qp), p.r_key.eq(r_key), p.length.eq(length),
            p.signaled.eq(0), p.solicited.eq(0),
        ]
        with m.If(wr_free):
            m.d.sync += self.wr.valid.eq(commit)
        with m.If(commit):
            m.d.sync += [wr_n.eq(msg.value), wr_addr.eq(addr.value), run.eq(~left_one)]
            m.d.sync += msg.advance() + left.advance()
        with m.If(stop):
            m.d.sync += run.eq(0)
        with m.If(setup):
            m.d.sync += [run.eq((count != 0) & ~stop), expired.eq(1)]
            m.d.sync += left.load(count) + msg.load(0)
        # period: request n + 1 is offered no earlier than `period` cycles after request n was
        # taken; `expired` is registered one step ahead of the count reaching 2
        with m.If(taken):
            m.d.sync += wait.load(period) + [expired.eq(p_le2)]
        with m.Elif(~expired):
            m.d.sync += wait.advance() + [expired.eq(wait.value == 3)]
        # (a count of every request posted since reset, as the counters report it: a start
        # does not clear it)
        with m.If(taken):
            m.d.sync += sent.advance()

        # ---------------------------------------------------------------- payload
        # Byte k of message n is (k + n) & 0xFF: lane j of a beat is (base + j) & 0xFF, base
        # steps by W/8 per beat and starts at n & 0xFF (mbase) per packet.
        base = Signal(8)
        mbase = Signal(8)
        pfirst = Signal()
        is_last = Signal()         # the next beat is its packet's last
        beats = FastCounter(m, 32 - s, "beats", down=True)   # full beats left, this one included
        lanes = Signal(8 * n)
        m.d.comb += lanes.eq(Cat(*[(base + j)[:8] for j in range(n)]))
        i_free = Signal()
        emit = Signal()
        end = Signal()
        m.d.comb += [
            i_free.eq(~self.i.valid | self.i.ready),
            emit.eq(i_free & owed[0]),
            end.eq(emit & is_last),
        ]
        with m.If(i_free):
            m.d.sync += self.i.valid.eq(owed[0])
        with m.If(emit):
            m.d.sync += [
                self.i.payload.data.eq(lanes),
                self.i.payload.keep.eq(Mux(is_last, lkeep, (1 << n) - 1)),
                self.i.payload.first.eq(pfirst),
                self.i.payload.last.eq(is_last),
                pfirst.eq(is_last),
            ]
            with m.If(is_last):
                m.d.sync += [base.eq(mbase + 1), mbase.eq(mbase + 1), is_last.eq(single)]
                m.d.sync += beats.load(full_beats)
            with m.Else():
                m.d.sync += [base.eq(base + n),
                             is_last.eq(Mux(lz, beats.value == 2, beats.value == 1))]
                m.d.sync += beats.advance()
        inc = Signal()
        m.d.comb += inc.eq(commit & has_pay)
        with m.If(inc & ~end):
            m.d.sync += owed.eq(Cat(C(1, 1), owed[:-1]))
        with m.Elif(~inc & end):
            m.d.sync += owed.eq(owed[1:])
        with m.If(setup):
            m.d.sync += [base.eq(0), mbase.eq(0), pfirst.eq(1), is_last.eq(single_c),
                         owed.eq(0)]
            m.d.sync += beats.load(full_beats)
        return m


class _AddressSequence:
    """``x_n = base + n * step`` (mod ``2**len(base)``), the next one after every ``advance``,
    with no carry chain longer than ``chunk`` bits.

    A skewed accumulator: ``base`` is cut into ``chunk``-bit pieces; piece ``k`` adds its piece
    of ``step`` and the carry its lower neighbour produced one step earlier, so it runs one
    step behind piece ``k - 1``. A delay line of ``K - 1 - k`` registers per piece (``K``
    pieces) lines the pieces of one ``x_n`` up again on :attr:`value`.

    ``load`` (a 1-cycle pulse) restarts the sequence at ``x_0 = base``; the first ``K - 1``
    advances after it fill the pipeline (:attr:`ready` is low, :attr:`value` stays ``x_0``),
    and from then on each advance moves :attr:`value` from ``x_n`` to ``x_{n+1}``. ``base``
    is read in the ``load`` cycle only; ``step`` must be valid from the cycle after it on.
    """

    CHUNK = 12

    @classmethod
    def fill(cls, width, chunk=CHUNK):
        """Advances after a load before :attr:`ready` (``K - 1``)."""
        return -(-width // chunk) - 1

    def __init__(self, m, base, step, *, load, advance, chunk=CHUNK):
        width = len(base)
        pieces = [(lo, min(width, lo + chunk)) for lo in range(0, width, chunk)]
        k_n = len(pieces)
        self.value = Signal(width, name="addr_value")
        self.ready = Signal(name="addr_ready")
        started = Signal(k_n, name="addr_started")     # thermometer: piece k runs
        m.d.comb += self.ready.eq(started[-1])
        carry = C(0, 1)
        for k, (lo, hi) in enumerate(pieces):
            acc = Signal(hi - lo, name=f"addr_acc{k}")
            total = Signal(hi - lo + 1, name=f"addr_sum{k}")
            step_k = step[lo:hi] if lo < len(step) else C(0, hi - lo)
            m.d.comb += total.eq(acc + step_k + carry)
            delay = [Signal(hi - lo, name=f"addr_d{k}_{j}") for j in range(k_n - 1 - k)]
            out = delay[-1] if delay else acc
            m.d.comb += self.value[lo:hi].eq(out)
            cy = Signal(name=f"addr_cy{k}") if k + 1 < k_n else None
            with m.If(load):
                m.d.sync += [acc.eq(base[lo:hi])] + [d.eq(base[lo:hi]) for d in delay]
                if cy is not None:
                    m.d.sync += cy.eq(0)
            with m.Elif(advance):
                with m.If(started[k]):
                    m.d.sync += acc.eq(total[:-1])
                    if cy is not None:
                        m.d.sync += cy.eq(total[-1])
                for j, d in enumerate(delay):
                    m.d.sync += d.eq(delay[j - 1] if j else acc)
            carry = cy
        with m.If(load):
            m.d.sync += started.eq(1)
        with m.Elif(advance):
            m.d.sync += started.eq(Cat(C(1, 1), started[:-1]))
