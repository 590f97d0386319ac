# SPDX-License-Identifier: BSD-2-Clause
"""One transaction-level simulation interface for the engine tops, two back ends.

:func:`open_engine` returns a simulated top (``top="engine"``: :class:`roce_hw.top.EngineTop`,
the ``roce_engine`` module; ``top="tx"``: :class:`roce_hw.top.TxTop`, ``roce_tx``) driven in
transactions, never per cycle by the caller:

* ``backend="amaranth"`` (:class:`AmaranthEngine`): Amaranth's Python simulator, no compiler
  needed; 100-1,000 cycles/s.
* ``backend="verilator"`` (:class:`sim.verilator.VerilatorEngine`): the emitted Verilog compiled
  by Verilator with a C++ harness that owns the cycle loop (``sim/verilator/harness.cpp``); the
  first build of a configuration takes 1-3 minutes (then cached in ``build/verilator/``);
  10^5 cycles/s.

Both have the same methods and give the same results, cycle for cycle (tests/test_backends.py)::

    eng = open_engine(EngineConfig(data_width=512, n_qp=16), backend="verilator", seed=1)
    eng.set_addr("02:00:00:00:00:01", "10.0.0.1")
    eng.write_qp(QPSetup(0, remote_qpn=17, ...))    # management write, queued
    eng.post(WorkItem(qp=0, opcode=..., payload=...))  # a WR and its payload, queued
    eng.push_rx(frame, cycle=1000)                  # a frame from the MAC, at cycle 1000 at the earliest
    eng.run(100_000, quiet=200)                     # until all is in and m_axis_tx quiet 200 cycles
    for f in eng.pop_tx(): ...                      # TxFrame: cycles, bytes, tuser, ...

The cycle loop, the same in both (``Harness::step`` in harness.cpp and
:meth:`AmaranthEngine._bench` here):

1. drive every input: a producer with something queued offers it (``valid``) unless its random
   idle draw says to wait a cycle, and keeps offering it until the transfer; a consumer's
   ``ready`` is high unless its random stall draw says otherwise. WRs, resumes and payload wait
   while a management request is pending (as set-up before posting does); received frames wait
   for their earliest cycle; management requests go one at a time;
2. sample every handshake and record the transfers, stamped with the cycle;
3. the clock edge; the cycle count goes up.

Cycle 0 is the first cycle after reset. Random idle/stall: one splitmix64 generator per stream
(:class:`Splitmix64`, the same arithmetic in C++), seeded from the run's ``seed``; a draw is
made only when the stream's probability is non-zero and (producers) it has something to offer.
"""

from collections import namedtuple

from roce_hw.generate import ToolMissing

__all__ = ["BACKENDS", "TOPS", "STREAMS", "TxFrame", "Splitmix64", "BackendUnavailable",
           "EngineApi", "AmaranthEngine", "open_engine", "framing_errors", "tx_kind",
           "FEATURES", "counter_ports"]

BACKENDS = ("amaranth", "verilator")
TOPS = ("engine", "tx")

#: Streams with random idle (producers) or stall (consumers), in the order of the generators.
STREAMS = ("wr", "payload", "rx", "resume", "tx", "status", "other")

#: Bits of a frame's ``errors`` (framing of the output stream).
FRAMING_ERRORS = {1: "a beat before the last is not full", 2: "tkeep has a hole",
                  4: "a beat with tkeep 0"}

_MASK = (1 << 64) - 1

#: One frame of an output stream: cycles of its first and last beat, its bytes, ``tuser`` of
#: the last beat (tx: aborted), its beats, the count of cycles with ``m_axis_tx_tready`` high
#: (from reset) at its first and its last beat, and its framing errors (bits of
#: :data:`FRAMING_ERRORS`; 0 for a good frame).
TxFrame = namedtuple("TxFrame", "first last data tuser beats ready_first ready_last errors")


#: The optional streams a top may have, as (flag, port that shows it): ``HAS_<flag>`` in the
#: Verilator harness's ``ports_gen.h``, ``features`` of both back ends.
FEATURES = (("RX", "s_axis_rx_tdata"), ("RX_OTHER", "m_axis_rx_other_tdata"),
            ("RESUME", "s_resume_valid"), ("IP_ID_LOAD", "s_ip_id_load_valid"))


def counter_ports(ports):
    """The counter outputs of a top (``ports``: ``[(direction, width, name)]``): every output
    that is not part of a stream (``s_*``, ``m_*``), as ``[(port name, short name)]``
    (``counters_rx_icrc`` -> ``rx_icrc``)."""
    return [(n, n[len("counters_"):] if n.startswith("counters_") else n)
            for d, _, n in ports if d == "output" and not n.startswith(("s_", "m_"))]


def framing_errors(bits):
    """The texts of a frame's framing ``errors`` bits."""
    return [text for bit, text in FRAMING_ERRORS.items() if bits & bit]


def tx_kind(frame):
    """``"arp"``, ``"cm"`` (IPv4/UDP from the CM port) or ``"data"`` for a frame of
    ``m_axis_tx``."""
    from roce_hw import proto
    ethertype = int.from_bytes(frame[12:14], "big")
    if ethertype == proto.ETHERTYPE_ARP:
        return "arp"
    if ethertype == proto.ETHERTYPE_IPV4 and len(frame) >= 36 and \
            frame[23] == proto.IP_PROTO_UDP and \
            int.from_bytes(frame[34:36], "big") == proto.CM_UDP_PORT:
        return "cm"
    return "data"


def _mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


class Splitmix64:
    """The idle/stall generator of one stream (harness.cpp ``Rng``): ``draw()`` is True with
    probability ``threshold / 2**32``."""

    __slots__ = ("state", "threshold")

    def __init__(self, seed, index):
        self.state = _mix64((seed + _mix64(index + 1)) & _MASK)
        self.threshold = 0

    def next(self):
        """The next 64-bit output of splitmix64."""
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK
        return _mix64(self.state)

    def draw(self):
        if not self.threshold:
            return False
        return (self.next() >> 32) < self.threshold


def threshold(p):
    """A probability in [0, 1) as a 32-bit draw threshold."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"a probability must be in [0, 1), not {p!r}")
    return int(p * (1 << 32))


class BackendUnavailable(ToolMissing):
    """The back end cannot run here (Verilator or a C++ compiler missing)."""


class EngineApi:
    """What both back ends share: the conveniences built on the queue primitives."""

    def post(self, w, *, wr_id=None):
        """Queue a :class:`sim.bfm.WorkItem`: its WR and its payload."""
        from sim.bfm import wr_fields
        self.push_wr(wr_fields(w, wr_id=wr_id))
        if w.payload:
            self.push_payload(w.payload)

    def write_qp(self, q):
        """Queue the management write of a :class:`sim.bfm.QPSetup`."""
        from sim.bfm import qp_context
        self.push_mgmt(q.index, 1, qp_context(q))

    def read_qp(self, qp):
        """Queue a management read of QP ``qp`` (its response: :meth:`pop_mgmt_rsp`)."""
        self.push_mgmt(qp, 0, None)

    def qp_table(self, qps=None, *, max_cycles=100_000):
        """Read QPs ``qps`` (default: all) through the management port, running the engine
        until the responses are in; ``[{"qp", "error", "ctx": {field: value}}]``. Responses
        already queued are returned first."""
        qps = range(self.config.n_qp) if qps is None else list(qps)
        out = self.pop_mgmt_rsp()
        for q in qps:
            self.read_qp(q)
        end = self.cycle + max_cycles
        while len(out) < len(qps) and self.cycle < end:
            self.run(64)
            out += self.pop_mgmt_rsp()
        if len(out) < len(qps):
            raise TimeoutError(f"{len(out)}/{len(qps)} QP table reads answered in "
                               f"{max_cycles} cycles")
        return out

    def set_random(self, **probs):
        """Probabilities of an idle cycle before each transfer of a producer (``wr``,
        ``payload``, ``rx``, ``resume``) and of ``ready`` low on each cycle of a consumer
        (``tx``, ``status``, ``other``), each in [0, 1)."""
        unknown = set(probs) - set(STREAMS)
        if unknown:
            raise ValueError(f"unknown stream(s) {', '.join(sorted(unknown))}; streams: "
                             f"{', '.join(STREAMS)}")
        self._set_thresholds([threshold(float(probs.get(s, 0.0))) for s in STREAMS])

    def pop_tx_by_kind(self):
        """:meth:`pop_tx`, sorted into ``{"data": [...], "cm": [...], "arp": [...]}``: RoCEv2
        frames, CM replies (UDP from port 0x4321) and ARP replies, each in order (they share
        ``m_axis_tx``)."""
        out = {"data": [], "cm": [], "arp": []}
        for f in self.pop_tx():
            out[tx_kind(f.data)].append(f)
        return out

    def pop_counters(self):
        """Counter snapshots taken every :meth:`snapshot_every` cycles:
        ``[{"cycle": c, name: value}]``."""
        out = []
        while True:
            s = self._pop_snapshot()
            if s is None:
                return out
            out.append(s)


class AmaranthEngine(EngineApi):
    """A top simulated by Amaranth's simulator, driven in transactions (see the module
    docstring). :meth:`run` can be called any number of times; the simulation stays where it
    stopped between calls."""

    backend = "amaranth"

    def __init__(self, config, *, top="engine", seed=0, reset_cycles=2, log=None):
        from amaranth.lib.wiring import Out
        from amaranth.sim import Simulator

        from roce_hw.top import EngineTop, TxTop
        if top not in TOPS:
            raise ValueError(f"top must be one of {', '.join(TOPS)}, not {top!r}")
        self.config, self.top_name = config, top
        self.dut = t = EngineTop(config) if top == "engine" else TxTop(config)
        members = t.signature.members
        self.lanes = config.data_width // 8
        self._wr_fields = [n[5:] for n in members if n.startswith("s_wr_")
                           and n not in ("s_wr_valid", "s_wr_ready")]
        self._resume_fields = [n[9:] for n in members if n.startswith("s_resume_")
                               and n not in ("s_resume_valid", "s_resume_ready")]
        self.ctx_fields = [n[18:] for n in members if n.startswith("s_qp_mgmt_req_ctx_")]
        counters = counter_ports([("output" if m.flow == Out else "input", None, n)
                                  for n, m in members.items()])
        self._counter_ports = [port for port, _ in counters]
        self.counter_names = [name for _, name in counters]
        self.features = {f for f, port in FEATURES if port in members}
        self._rng = [Splitmix64(seed, i) for i in range(len(STREAMS))]
        self.wr_waits_mgmt = True
        self._addr = (0, 0)
        self._addr_dirty = True
        self._snapshot_period = 0
        # input queues
        self._wrs, self._resumes, self._payloads, self._rx = [], [], [], []
        self._mgmt, self._ip_ids = [], []
        # output queues
        self._tx, self._other, self._statuses, self._rsps = [], [], [], []
        self._accepts, self._snapshots = [], []
        self._n = {"wrs_accepted": 0, "resumes_accepted": 0, "tx_frames_total": 0,
                   "tx_beats_total": 0, "tx_ready_cycles": 0}
        self._mgmt_outstanding = False
        self._tx_in = False
        self.cycle = 0
        self._stop = (0, 0, 0)
        self._paused = False
        self._counters_now = {}
        self._sim = Simulator(t)
        self._sim.add_clock(1e-8)
        self._sim.add_testbench(self._bench)
        del reset_cycles     # the design starts in its reset state: cycle 0 is the same
        self.run(0)          # start the testbench (it holds before cycle 0)

    def close(self):
        self._sim = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- inputs --------------------------------------------------------------------------------
    def set_addr(self, local_mac, local_ip):
        from sim.bfm import parse_ip, parse_mac
        self._addr = (parse_mac(local_mac), parse_ip(local_ip))
        self._addr_dirty = True

    def _set_thresholds(self, values):
        for r, v in zip(self._rng, values):
            r.threshold = v

    def set_wr_waits_mgmt(self, on):
        self.wr_waits_mgmt = bool(on)

    def snapshot_every(self, period):
        """Sample every counter in each cycle that is a multiple of ``period`` (0: never)."""
        self._snapshot_period = int(period)

    def push_wr(self, fields):
        self._wrs.append([int(fields.get(n, 0)) for n in self._wr_fields])

    def push_resume(self, fields):
        if "RESUME" not in self.features:
            raise ValueError("this top has no resume port")
        self._resumes.append([int(fields.get(n, 0)) for n in self._resume_fields])

    def push_payload(self, data):
        if data:
            self._payloads.append(bytes(data))

    def push_ip_id(self, value):
        if "IP_ID_LOAD" not in self.features:
            raise ValueError("this top has no ip_id_load port")
        self._ip_ids.append(int(value))

    def push_rx(self, frame, *, cycle=0, tuser=0):
        if "RX" not in self.features:
            raise ValueError("this top has no receive port (use top='engine')")
        if frame:
            self._rx.append((bytes(frame), int(cycle), int(tuser)))

    def push_mgmt(self, qp, write, ctx=None):
        self._mgmt.append((int(qp), int(write),
                           [int((ctx or {}).get(n, 0)) for n in self.ctx_fields]))

    # -- running -------------------------------------------------------------------------------
    def run(self, max_cycles, *, until_tx=0, quiet=0):
        """Run at most ``max_cycles`` cycles; stop before a cycle once ``until_tx`` frames are
        queued on the tx output, or (``quiet``) once every input queue has been empty and
        ``m_axis_tx`` silent for ``quiet`` cycles (counted across calls: slicing a run changes
        nothing). Returns the cycles run."""
        start = self.cycle
        self._stop = (start + int(max_cycles), int(until_tx), int(quiet))
        self._paused = False
        while not self._paused:
            self._sim.advance()
        return self.cycle - start

    def _inputs_pending(self):
        return bool(self._wrs or self._resumes or self._payloads or self._rx or self._mgmt
                    or self._mgmt_outstanding or self._ip_ids)

    async def _bench(self, ctx):
        t, n = self.dut, self.lanes
        rng = self._rng
        has_rx, has_other = "RX" in self.features, "RX_OTHER" in self.features
        has_resume, has_ip = "RESUME" in self.features, "IP_ID_LOAD" in self.features
        wr_ports = [getattr(t, f"s_wr_{f}") for f in self._wr_fields]
        rs_ports = [getattr(t, f"s_resume_{f}") for f in self._resume_fields]
        mg_ports = [getattr(t, f"s_qp_mgmt_req_ctx_{f}") for f in self.ctx_fields]
        rsp_ports = [getattr(t, f"m_qp_mgmt_rsp_ctx_{f}") for f in self.ctx_fields]
        cnt_ports = [getattr(t, p) for p in self._counter_ports]
        wr_on = rs_on = pl_on = rx_on = mgmt_on = ip_on = False
        pl_pos = rx_pos = 0
        tx_cur = other_cur = None
        ctx.set(t.m_qp_mgmt_rsp_ready, 1)
        quiet_since = 0
        level = {}

        def put(signal, value):             # handshake levels: only changes cost a ctx.set
            value = bool(value)
            if level.get(id(signal)) is not value:
                level[id(signal)] = value
                ctx.set(signal, value)
        while True:
            end, until_tx, quiet = self._stop
            if self.cycle == end or (until_tx and len(self._tx) >= until_tx) or \
                    (quiet and self.cycle - quiet_since >= quiet):
                self._counters_now = {name: ctx.get(p) for name, p in
                                      zip(self.counter_names, cnt_ports)}
                self._paused = True
                await ctx.delay(1e-15)      # hold here, without a clock edge, until run()
                continue
            if self._addr_dirty:
                ctx.set(t.local_mac, self._addr[0])
                ctx.set(t.local_ip, self._addr[1])
                self._addr_dirty = False
            cycle = self.cycle
            # 1. drive
            gate = self.wr_waits_mgmt and (bool(self._mgmt) or self._mgmt_outstanding)
            if not wr_on and self._wrs and not gate and not rng[0].draw():
                for port, v in zip(wr_ports, self._wrs[0]):
                    ctx.set(port, v)
                wr_on = True
            put(t.s_wr_valid, wr_on)
            if has_resume:
                if not rs_on and self._resumes and not gate and not rng[3].draw():
                    for port, v in zip(rs_ports, self._resumes[0]):
                        ctx.set(port, v)
                    rs_on = True
                put(t.s_resume_valid, rs_on)
            if not pl_on and self._payloads and not gate and not rng[1].draw():
                p = self._payloads[0]
                k = min(n, len(p) - pl_pos)
                ctx.set(t.s_axis_payload_tdata, int.from_bytes(p[pl_pos:pl_pos + k], "little"))
                ctx.set(t.s_axis_payload_tkeep, (1 << k) - 1)
                ctx.set(t.s_axis_payload_tlast, pl_pos + k >= len(p))
                pl_on = True
            put(t.s_axis_payload_tvalid, pl_on)
            if has_ip:
                if not ip_on and self._ip_ids:
                    ctx.set(t.s_ip_id_load_value, self._ip_ids[0])
                    ip_on = True
                put(t.s_ip_id_load_valid, ip_on)
            if has_rx:
                if not rx_on and self._rx and self._rx[0][1] <= cycle and not rng[2].draw():
                    f, _, tuser = self._rx[0]
                    k = min(n, len(f) - rx_pos)
                    last = rx_pos + k >= len(f)
                    ctx.set(t.s_axis_rx_tdata, int.from_bytes(f[rx_pos:rx_pos + k], "little"))
                    ctx.set(t.s_axis_rx_tkeep, (1 << k) - 1)
                    ctx.set(t.s_axis_rx_tlast, last)
                    ctx.set(t.s_axis_rx_tuser, bool(tuser) and last)
                    rx_on = True
                put(t.s_axis_rx_tvalid, rx_on)
            if not mgmt_on and not self._mgmt_outstanding and self._mgmt:
                qp, write, row = self._mgmt[0]
                ctx.set(t.s_qp_mgmt_req_qp, qp)
                ctx.set(t.s_qp_mgmt_req_write, write)
                for port, v in zip(mg_ports, row):
                    ctx.set(port, v)
                mgmt_on = True
            put(t.s_qp_mgmt_req_valid, mgmt_on)
            tx_ready = not rng[4].draw()
            put(t.m_axis_tx_tready, tx_ready)
            st_ready = not rng[5].draw()
            put(t.m_status_ready, st_ready)
            if has_other:
                other_ready = not rng[6].draw()
                put(t.m_axis_rx_other_tready, other_ready)
            # 2. sample (settled values before the edge)
            if self._snapshot_period and cycle % self._snapshot_period == 0:
                self._snapshots.append({"cycle": cycle, **{
                    name: ctx.get(p) for name, p in zip(self.counter_names, cnt_ports)}})
            if wr_on and ctx.get(t.s_wr_ready):
                self._wrs.pop(0)
                wr_on = False
                self._n["wrs_accepted"] += 1
                self._accepts.append(cycle)
            if rs_on and ctx.get(t.s_resume_ready):
                self._resumes.pop(0)
                rs_on = False
                self._n["resumes_accepted"] += 1
            if pl_on and ctx.get(t.s_axis_payload_tready):
                pl_on = False
                pl_pos += n
                if pl_pos >= len(self._payloads[0]):
                    self._payloads.pop(0)
                    pl_pos = 0
            if ip_on and ctx.get(t.s_ip_id_load_ready):
                self._ip_ids.pop(0)
                ip_on = False
            if rx_on and ctx.get(t.s_axis_rx_tready):
                rx_on = False
                rx_pos += n
                if rx_pos >= len(self._rx[0][0]):
                    self._rx.pop(0)
                    rx_pos = 0
            if mgmt_on and ctx.get(t.s_qp_mgmt_req_ready):
                self._mgmt.pop(0)
                mgmt_on, self._mgmt_outstanding = False, True
            if ctx.get(t.m_qp_mgmt_rsp_valid):
                self._rsps.append({"cycle": cycle, "qp": ctx.get(t.m_qp_mgmt_rsp_qp),
                                   "write": ctx.get(t.m_qp_mgmt_rsp_write),
                                   "error": ctx.get(t.m_qp_mgmt_rsp_error),
                                   "ctx": {f: ctx.get(p) for f, p in
                                           zip(self.ctx_fields, rsp_ports)}})
                self._mgmt_outstanding = False
            if st_ready and ctx.get(t.m_status_valid):
                self._statuses.append({"cycle": cycle, "wr_id": ctx.get(t.m_status_wr_id),
                                       "qp": ctx.get(t.m_status_qp),
                                       "status": ctx.get(t.m_status_status)})
            self._n["tx_ready_cycles"] += tx_ready
            beat = False
            if tx_ready and ctx.get(t.m_axis_tx_tvalid):
                beat = True
                tx_cur = self._take_beat(ctx, "m_axis_tx", tx_cur, self._tx, cycle)
                self._n["tx_beats_total"] += 1
                self._tx_in = tx_cur is not None
                if tx_cur is None:
                    self._n["tx_frames_total"] += 1
            if has_other and other_ready and ctx.get(t.m_axis_rx_other_tvalid):
                other_cur = self._take_beat(ctx, "m_axis_rx_other", other_cur, self._other,
                                            cycle)
            # 3. the edge
            await ctx.tick()
            self.cycle = cycle + 1
            if beat or self._inputs_pending() or self._tx_in:
                quiet_since = self.cycle

    def _take_beat(self, ctx, name, cur, queue, cycle):
        t, n = self.dut, self.lanes
        ready = self._n["tx_ready_cycles"]
        if cur is None:
            cur = {"first": cycle, "data": bytearray(), "beats": 0, "ready_first": ready,
                   "errors": 0}
        keep = ctx.get(getattr(t, f"{name}_tkeep"))
        last = ctx.get(getattr(t, f"{name}_tlast"))
        low = (~keep & (keep + 1)).bit_length() - 1        # ones from bit 0
        if keep == 0:
            cur["errors"] |= 4
        elif keep != (1 << low) - 1:
            cur["errors"] |= 2
        elif not last and low != n:
            cur["errors"] |= 1
        cur["data"] += ctx.get(getattr(t, f"{name}_tdata")).to_bytes(n, "little")[:low]
        cur["beats"] += 1
        if last:
            queue.append(TxFrame(cur["first"], cycle, bytes(cur["data"]),
                                 ctx.get(getattr(t, f"{name}_tuser")), cur["beats"],
                                 cur["ready_first"], ready, cur["errors"]))
            return None
        return cur

    # -- outputs -------------------------------------------------------------------------------
    def count(self, what):
        q = {"tx": self._tx, "status": self._statuses, "mgmt_rsp": self._rsps,
             "rx_other": self._other, "wr_pending": self._wrs, "payload_pending": self._payloads,
             "rx_pending": self._rx, "mgmt_pending": self._mgmt, "resume_pending": self._resumes,
             "snapshots": self._snapshots, "wr_accepts": self._accepts,
             "ip_id_pending": self._ip_ids}
        if what in q:
            return len(q[what])
        if what == "mgmt_outstanding":
            return int(self._mgmt_outstanding)
        return self._n[what]

    def pop_tx(self):
        """Frames sent on ``m_axis_tx``: ``[TxFrame]``."""
        out, self._tx = self._tx, []
        return out

    def pop_rx_other(self):
        """Frames sent on ``m_axis_rx_other``: ``[TxFrame]``."""
        out, self._other = self._other, []
        return out

    def pop_status(self):
        """``[{"cycle", "wr_id", "qp", "status"}]``."""
        out, self._statuses = self._statuses, []
        return out

    def pop_mgmt_rsp(self):
        """``[{"cycle", "qp", "write", "error", "ctx": {field: value}}]``."""
        out, self._rsps = self._rsps, []
        return out

    def pop_wr_accepts(self):
        """Cycles in which WRs were accepted, oldest first."""
        out, self._accepts = self._accepts, []
        return out

    def _pop_snapshot(self):
        return self._snapshots.pop(0) if self._snapshots else None

    def counters(self):
        """Every counter's value after the last cycle run, and ``"cycle"``."""
        if not self._counters_now:
            self.run(0)
        return {"cycle": self.cycle, **self._counters_now}


def open_engine(config, *, backend="amaranth", top="engine", seed=0, log=None):
    """A simulated engine top on ``backend`` (:data:`BACKENDS`); see the module docstring.

    Raises :class:`BackendUnavailable` (a :class:`~roce_hw.generate.ToolMissing`) when the
    Verilator back end cannot be built here."""
    if backend == "amaranth":
        return AmaranthEngine(config, top=top, seed=seed, log=log)
    if backend == "verilator":
        from sim.verilator import VerilatorEngine
        return VerilatorEngine(config, top=top, seed=seed, log=log)
    raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
