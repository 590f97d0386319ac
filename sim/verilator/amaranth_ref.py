# SPDX-License-Identifier: BSD-2-Clause
"""The same transaction harness as ``harness.cpp``, in Amaranth's simulator, on the same flat
top (:class:`roce_hw.top.EngineTop`, whose ports are the Verilog's): the first probe of issue
34's equivalence (identical frames *in the same cycles* from both back ends).

Only what the probe needs: no random idle/stall, and inputs are queued before one :meth:`run`.
The cycle loop follows ``Harness::step`` exactly: drive the inputs, read the handshakes
(settled values before the edge), tick. Cycle 0 is the first cycle after reset in both (the
C++ harness holds ``rst`` for its reset cycles first; here the design starts in its reset
state)."""

from amaranth.sim import Simulator

__all__ = ["AmaranthEngine"]


class AmaranthEngine:
    def __init__(self, config):
        from roce_hw.top import EngineTop
        self.config = config
        self.top = EngineTop(config)
        self.lanes = config.data_width // 8
        self.mac = self.ip = 0
        self.wrs, self.payloads, self.rx, self.mgmt = [], [], [], []
        self.tx, self.other, self.statuses, self.mgmt_rsps = [], [], [], []
        self.cycle = 0

    def set_addr(self, mac, ip):
        from sim.bfm import parse_ip, parse_mac
        self.mac, self.ip = parse_mac(mac), parse_ip(ip)

    def write_qp(self, q):
        from sim.bfm import qp_context
        self.mgmt.append((q.index, 1, qp_context(q)))

    def post(self, w, *, wr_id=None):
        from sim.bfm import wr_fields
        self.wrs.append(wr_fields(w, wr_id=wr_id))
        if w.payload:
            self.payloads.append(bytes(w.payload))

    def push_rx(self, frame, *, cycle=0, tuser=0):
        self.rx.append((bytes(frame), cycle, tuser))

    def pop_tx(self):
        out, self.tx = self.tx, []
        return out

    def pop_rx_other(self):
        out, self.other = self.other, []
        return out

    def run(self, max_cycles, *, quiet=0):
        """Run once, from reset, until ``max_cycles`` or (``quiet``) every input queue empty
        and ``m_axis_tx`` silent for ``quiet`` cycles."""
        t, n = self.top, self.lanes
        sim = Simulator(t)
        sim.add_clock(1e-8)
        wrs, pls, rxs, mgmt = list(self.wrs), list(self.payloads), list(self.rx), list(self.mgmt)

        def put_frame(data, pos):
            k = min(n, len(data) - pos)
            return (int.from_bytes(data[pos:pos + k], "little"), (1 << k) - 1,
                    int(pos + k >= len(data)), k)

        async def tb(ctx):
            cycle = quiet_since = 0
            wr_on = pl_on = rx_on = mgmt_on = outstanding = False
            pl_pos = rx_pos = 0
            tx_cur = other_cur = None
            ctx.set(t.local_mac, self.mac)
            ctx.set(t.local_ip, self.ip)
            for s in (t.m_axis_tx_tready, t.m_status_ready, t.m_axis_rx_other_tready,
                      t.m_qp_mgmt_rsp_ready):
                ctx.set(s, 1)
            while cycle < max_cycles:
                gate = bool(mgmt) or outstanding
                if not wr_on and wrs and not gate:
                    for k, v in wrs[0].items():
                        ctx.set(getattr(t, f"s_wr_{k}"), v)
                    wr_on = True
                ctx.set(t.s_wr_valid, wr_on)
                if not pl_on and pls and not gate:
                    d, keep, last, _ = put_frame(pls[0], pl_pos)
                    ctx.set(t.s_axis_payload_tdata, d)
                    ctx.set(t.s_axis_payload_tkeep, keep)
                    ctx.set(t.s_axis_payload_tlast, last)
                    pl_on = True
                ctx.set(t.s_axis_payload_tvalid, pl_on)
                if not rx_on and rxs and rxs[0][1] <= cycle:
                    d, keep, last, _ = put_frame(rxs[0][0], rx_pos)
                    ctx.set(t.s_axis_rx_tdata, d)
                    ctx.set(t.s_axis_rx_tkeep, keep)
                    ctx.set(t.s_axis_rx_tlast, last)
                    ctx.set(t.s_axis_rx_tuser, int(bool(rxs[0][2]) and last))
                    rx_on = True
                ctx.set(t.s_axis_rx_tvalid, rx_on)
                if not mgmt_on and not outstanding and mgmt:
                    qp, write, row = mgmt[0]
                    ctx.set(t.s_qp_mgmt_req_qp, qp)
                    ctx.set(t.s_qp_mgmt_req_write, write)
                    for k, v in row.items():
                        ctx.set(getattr(t, f"s_qp_mgmt_req_ctx_{k}"), v)
                    mgmt_on = True
                ctx.set(t.s_qp_mgmt_req_valid, mgmt_on)
                # handshakes, settled, before the edge
                if wr_on and ctx.get(t.s_wr_ready):
                    wrs.pop(0)
                    wr_on = False
                if pl_on and ctx.get(t.s_axis_payload_tready):
                    pl_on = False
                    pl_pos += n
                    if pl_pos >= len(pls[0]):
                        pls.pop(0)
                        pl_pos = 0
                if rx_on and ctx.get(t.s_axis_rx_tready):
                    rx_on = False
                    rx_pos += n
                    if rx_pos >= len(rxs[0][0]):
                        rxs.pop(0)
                        rx_pos = 0
                if mgmt_on and ctx.get(t.s_qp_mgmt_req_ready):
                    mgmt.pop(0)
                    mgmt_on, outstanding = False, True
                if ctx.get(t.m_qp_mgmt_rsp_valid):
                    self.mgmt_rsps.append({"cycle": cycle, "qp": ctx.get(t.m_qp_mgmt_rsp_qp),
                                           "error": ctx.get(t.m_qp_mgmt_rsp_error)})
                    outstanding = False
                if ctx.get(t.m_status_valid):
                    self.statuses.append({"cycle": cycle, "wr_id": ctx.get(t.m_status_wr_id),
                                          "qp": ctx.get(t.m_status_qp),
                                          "status": ctx.get(t.m_status_status)})
                beat = False
                for name, queue in (("m_axis_tx", self.tx), ("m_axis_rx_other", self.other)):
                    if not ctx.get(getattr(t, f"{name}_tvalid")):
                        continue
                    cur = tx_cur if name == "m_axis_tx" else other_cur
                    if cur is None:
                        cur = [cycle, bytearray()]
                    k = ctx.get(getattr(t, f"{name}_tkeep")).bit_length()
                    cur[1] += ctx.get(getattr(t, f"{name}_tdata")).to_bytes(n, "little")[:k]
                    if ctx.get(getattr(t, f"{name}_tlast")):
                        queue.append((cur[0], cycle, bytes(cur[1]),
                                      ctx.get(getattr(t, f"{name}_tuser"))))
                        cur = None
                    if name == "m_axis_tx":
                        tx_cur, beat = cur, True
                    else:
                        other_cur = cur
                await ctx.tick()
                cycle += 1
                if quiet:
                    if beat or wrs or pls or rxs or mgmt or outstanding or tx_cur is not None:
                        quiet_since = cycle
                    elif cycle - quiet_since >= quiet:
                        break
            self.cycle = cycle

        sim.add_testbench(tb)
        sim.run()
        return self.cycle
