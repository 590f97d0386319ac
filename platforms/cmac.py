# SPDX-License-Identifier: BSD-2-Clause
"""The Xilinx 100G CMAC (``cmac_usplus``, PG203) and what sits between it and the engine.

* :class:`CmacAdapter` (plain Amaranth, simulated and synthesised here): the engine's frames
  padded to 60 bytes (:class:`~roce_hw.lib.pad.FramePad`) and stored whole
  (:class:`~roce_hw.lib.frame_fifo.FrameFifo`) before the CMAC's ``tx_axis``, so a frame never
  pauses once started (the CMAC underflows on a pause); the CMAC's ``rx_axis`` registered onto
  the engine's ``rx``; and the bring-up sequence without AXI4-Lite.
* :func:`cmac_instance`: the IP core as an ``Instance`` by its documented ports (AXI-Stream user
  interface, GT inside the core, no AXI4-Lite, RS-FEC ports, no flow control).
* :func:`cmac_tcl`: the Tcl that creates and generates the IP in Vivado; the build plan sources
  it after ``read_xdc`` and before ``synth_design`` (Vivado cannot read an ``.xci`` from a plan).
"""

from dataclasses import dataclass

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from roce_hw.lib.frame_fifo import FrameFifo
from roce_hw.lib.pad import MIN_FRAME_BYTES, FramePad
from roce_hw.lib.stream import FrameSignature

__all__ = ["CMAC_WIDTH", "CMAC_USER_CLOCK_HZ", "CMAC_MODULE", "CmacSite", "cmac_axis_layout",
           "CmacAdapter", "cmac_instance", "cmac_tcl"]

#: Width of the CMAC's AXI-Stream user interface (PG203: 512-bit "segmented" off, AXIS mode).
CMAC_WIDTH = 512
#: The CMAC's user clock (``gt_txusrclk2``) at 100GBASE-R: 25.78125 Gb/s x 4 lanes over 320 bits.
CMAC_USER_CLOCK_HZ = 322_265_625
#: Module name of the IP core the Tcl creates and the top instantiates.
CMAC_MODULE = "cmac_usplus_0"


@dataclass(frozen=True)
class CmacSite:
    """Where the CMAC of one QSFP28 cage sits: the ``CMACE4`` site, the four GTY channels of
    the cage (lane 0 first) and the reference clock the IP is told about.

    ``per_lane_ports``: the IP names its serial ports per lane (``gt0_rxp_in`` ...) instead of
    as 4-bit vectors (``gt_rxp_in``), as it does for Zynq UltraScale+ parts.
    """
    cmac: str                   # e.g. "CMACE4_X0Y8"
    gt_lanes: tuple             # e.g. ("X1Y44", "X1Y45", "X1Y46", "X1Y47")
    refclk_hz: float            # 161_132_812.5 or 156_250_000
    init_clk_hz: float          # the free-running clock on init_clk/drp_clk (GT_DRP_CLK)
    per_lane_ports: bool = False
    rsfec: bool = True


def cmac_axis_layout():
    """One beat of the CMAC's ``tx_axis``/``rx_axis``: ``data`` (wire byte 0 in ``[7:0]``),
    ``keep``, ``last``, ``user`` (TX: send the frame with a bad FCS; RX: bad frame)."""
    return data.StructLayout({"data": CMAC_WIDTH, "keep": CMAC_WIDTH // 8, "last": 1,
                              "user": 1})


class CmacAdapter(wiring.Component):
    """The engine's side of the CMAC: TX padding and store-and-forward, RX registering,
    bring-up.

    TX: ``tx`` -> :class:`~roce_hw.lib.pad.FramePad` (frames under 60 bytes padded with
    zeros; one register) -> :class:`~roce_hw.lib.frame_fifo.FrameFifo` (a frame leaves only
    when whole, then one beat per cycle; aborted frames dropped and counted) -> ``cmac_tx``.
    While the link is down, frames wait in the FIFO (and back-press the engine); the gate
    opens and closes only between frames, so a started frame is never cut by it.

    RX: ``cmac_rx`` (the CMAC's ``rx_axis``: no ``tready``) is registered once onto ``rx``;
    ``first`` is rebuilt (the beat after a ``last``), ``abort`` is ``tuser`` on the last
    beat. The engine's ``rx`` is always ready, which this relies on.

    Bring-up (PG203, "without AXI4-Lite"): after reset ``ctl_rx_enable`` is 1 and
    ``ctl_tx_send_rfi`` 1 (remote fault: tell the peer we do not receive yet) with
    ``ctl_tx_enable`` 0; once ``stat_rx_aligned`` is seen, ``ctl_tx_send_rfi`` drops and
    ``ctl_tx_enable`` rises (``link_up``); if alignment is lost, back to sending RFI.

    Every output comes from a flip-flop except the TX handshake (``cmac_tx.valid`` is the
    FIFO's registered valid AND the registered gate; ``tx.ready`` the pad register's). Latency:
    TX as :class:`~roce_hw.lib.frame_fifo.FrameFifo` plus one cycle; RX one cycle.

    Parameters
    ----------
    fifo_depth : int
        Rows of the frame FIFO (beats of 512 bits); it must hold the longest frame.

    Members
    -------
    tx : ``In(FrameSignature(512))``
        Frames from the engine (no FCS).
    rx : ``Out(FrameSignature(512))``
        Frames to the engine (no FCS, ``abort`` = bad frame); never waits for ``rx.ready``.
    cmac_tx : ``Out(stream.Signature(cmac_axis_layout()))``
        To the CMAC's ``tx_axis_*``.
    cmac_rx : ``In(stream.Signature(cmac_axis_layout(), always_ready=True))``
        From the CMAC's ``rx_axis_*``.
    stat_rx_aligned : ``In(1)``
    ctl_rx_enable, ctl_tx_enable, ctl_tx_send_rfi : ``Out(1)``
    link_up : ``Out(1)``
        RX aligned and TX enabled.
    tx_dropped : ``Out(16)``
        Aborted frames dropped by the FIFO (wraps).
    """

    def __init__(self, fifo_depth):
        self._fifo_depth = fifo_depth
        super().__init__({
            "tx": In(FrameSignature(CMAC_WIDTH)),
            "rx": Out(FrameSignature(CMAC_WIDTH)),
            "cmac_tx": Out(stream.Signature(cmac_axis_layout())),
            "cmac_rx": In(stream.Signature(cmac_axis_layout(), always_ready=True)),
            "stat_rx_aligned": In(1),
            "ctl_rx_enable": Out(1),
            "ctl_tx_enable": Out(1),
            "ctl_tx_send_rfi": Out(1),
            "link_up": Out(1),
            "tx_dropped": Out(16),
        })

    @property
    def fifo_depth(self):
        return self._fifo_depth

    def elaborate(self, platform):
        m = Module()
        m.submodules.pad = pad = FramePad(CMAC_WIDTH, MIN_FRAME_BYTES)
        m.submodules.fifo = fifo = FrameFifo(CMAC_WIDTH, self._fifo_depth, abort="drop")
        wiring.connect(m, wiring.flipped(self.tx), pad.i)
        wiring.connect(m, pad.o, fifo.i)
        m.d.comb += self.tx_dropped.eq(fifo.frames_dropped)

        # -- bring-up ----------------------------------------------------------------------
        aligned = Signal()              # registered once: the CMAC's output, our flip-flop
        m.d.sync += aligned.eq(self.stat_rx_aligned)
        m.d.sync += self.ctl_rx_enable.eq(1)
        with m.FSM():
            with m.State("SendRfi"):
                m.d.sync += [self.ctl_tx_send_rfi.eq(1), self.ctl_tx_enable.eq(0),
                             self.link_up.eq(0)]
                with m.If(aligned):
                    m.d.sync += [self.ctl_tx_send_rfi.eq(0), self.ctl_tx_enable.eq(1),
                                 self.link_up.eq(1)]
                    m.next = "Up"
            with m.State("Up"):
                with m.If(~aligned):
                    m.d.sync += [self.ctl_tx_send_rfi.eq(1), self.ctl_tx_enable.eq(0),
                                 self.link_up.eq(0)]
                    m.next = "SendRfi"

        # -- TX: the gate follows link_up between frames only --------------------------------
        gate = Signal()
        in_frame = Signal()             # a beat of the current frame has been sent
        with m.If(self.cmac_tx.valid & self.cmac_tx.ready):
            m.d.sync += in_frame.eq(~fifo.o.payload.last)
        with m.If(~in_frame):
            m.d.sync += gate.eq(self.link_up)
        m.d.comb += [
            self.cmac_tx.valid.eq(fifo.o.valid & gate),
            fifo.o.ready.eq(self.cmac_tx.ready & gate),
            self.cmac_tx.payload.data.eq(fifo.o.payload.data),
            self.cmac_tx.payload.keep.eq(fifo.o.payload.keep),
            self.cmac_tx.payload.last.eq(fifo.o.payload.last),
            self.cmac_tx.payload.user.eq(fifo.o.payload.abort),
        ]

        # -- RX: one register, first rebuilt -------------------------------------------------
        rx_in_frame = Signal()
        with m.If(self.cmac_rx.valid):
            m.d.sync += rx_in_frame.eq(~self.cmac_rx.payload.last)
        m.d.sync += [
            self.rx.valid.eq(self.cmac_rx.valid),
            self.rx.payload.data.eq(self.cmac_rx.payload.data),
            self.rx.payload.keep.eq(self.cmac_rx.payload.keep),
            self.rx.payload.first.eq(~rx_in_frame),
            self.rx.payload.last.eq(self.cmac_rx.payload.last),
            self.rx.payload.abort.eq(self.cmac_rx.payload.user & self.cmac_rx.payload.last),
        ]
        return m


def cmac_instance(site, *, gt_tx, gt_rx, refclk, init_clk, sys_reset, adapter, user_clk,
                  usr_tx_reset, usr_rx_reset, stat=None):
    """The ``cmac_usplus`` IP (module :data:`CMAC_MODULE`) as an ``Instance``, by the ports
    PG203 documents for this configuration (GT in the core, AXI-Stream, no AXI4-Lite, RS-FEC
    included, no pause frames, no PTP).

    ``gt_tx``/``gt_rx``/``refclk``: the differential I/O ports (``platform.request(...,
    dir="-")``); ``init_clk``: the free-running clock (also the DRP clock); ``sys_reset``:
    active-high reset in ``init_clk``'s domain; ``adapter``: the :class:`CmacAdapter` whose
    ``cmac_tx``/``cmac_rx``/``ctl_*``/``stat_rx_aligned`` it connects; ``user_clk``,
    ``usr_tx_reset``, ``usr_rx_reset``: signals it drives (``gt_txusrclk2`` and the user
    resets). ``stat``: optional dict name -> signal of further ``stat_*`` outputs to connect.
    """
    ports = {}
    if site.per_lane_ports:
        for lane in range(4):
            ports[f"i_gt{lane}_rxp_in"] = gt_rx.p[lane]
            ports[f"i_gt{lane}_rxn_in"] = gt_rx.n[lane]
            ports[f"o_gt{lane}_txp_out"] = gt_tx.p[lane]
            ports[f"o_gt{lane}_txn_out"] = gt_tx.n[lane]
    else:
        ports.update(i_gt_rxp_in=gt_rx.p, i_gt_rxn_in=gt_rx.n,
                     o_gt_txp_out=gt_tx.p, o_gt_txn_out=gt_tx.n)
    tx, rx = adapter.cmac_tx, adapter.cmac_rx
    rsfec = int(site.rsfec)
    ports.update(
        i_gt_ref_clk_p=refclk.p, i_gt_ref_clk_n=refclk.n,
        i_init_clk=init_clk, i_sys_reset=sys_reset,
        i_gt_loopback_in=C(0, 12),              # 3 bits per lane: normal operation
        i_gtwiz_reset_tx_datapath=0, i_gtwiz_reset_rx_datapath=0,
        i_core_tx_reset=0, i_core_rx_reset=0, i_core_drp_reset=0,
        i_drp_clk=init_clk, i_drp_addr=C(0, 10), i_drp_di=C(0, 16), i_drp_en=0, i_drp_we=0,
        o_gt_txusrclk2=user_clk,
        i_rx_clk=user_clk,                      # RX AXIS on the TX user clock (RX GT buffer on)
        o_usr_tx_reset=usr_tx_reset, o_usr_rx_reset=usr_rx_reset,
        # user data
        o_tx_axis_tready=tx.ready, i_tx_axis_tvalid=tx.valid,
        i_tx_axis_tdata=tx.payload.data, i_tx_axis_tkeep=tx.payload.keep,
        i_tx_axis_tlast=tx.payload.last, i_tx_axis_tuser=tx.payload.user,
        i_tx_preamblein=C(0, 56),
        o_rx_axis_tvalid=rx.valid, o_rx_axis_tdata=rx.payload.data,
        o_rx_axis_tkeep=rx.payload.keep, o_rx_axis_tlast=rx.payload.last,
        o_rx_axis_tuser=rx.payload.user,
        # bring-up without AXI4-Lite
        i_ctl_rx_enable=adapter.ctl_rx_enable, i_ctl_rx_force_resync=0,
        i_ctl_rx_test_pattern=0,
        i_ctl_tx_enable=adapter.ctl_tx_enable, i_ctl_tx_send_rfi=adapter.ctl_tx_send_rfi,
        i_ctl_tx_send_lfi=0, i_ctl_tx_send_idle=0, i_ctl_tx_test_pattern=0,
        i_ctl_tx_rsfec_enable=rsfec, i_ctl_rx_rsfec_enable=rsfec,
        i_ctl_rx_rsfec_enable_correction=rsfec, i_ctl_rx_rsfec_enable_indication=rsfec,
        i_ctl_rsfec_ieee_error_indication_mode=0,
        o_stat_rx_aligned=adapter.stat_rx_aligned,
    )
    for name, sig in (stat or {}).items():
        ports[f"o_{name}"] = sig
    return Instance(CMAC_MODULE, **ports)


def _mhz(hz):
    """A frequency as the IP's configuration wants it: MHz, no trailing zeros."""
    return f"{hz / 1e6:.7f}".rstrip("0").rstrip(".")


def cmac_tcl(site, board_title):
    """Tcl that creates :data:`CMAC_MODULE` for ``site`` and generates its synthesis sources
    (sourced by the plan's ``script_after_read``, i.e. after ``read_xdc`` and before
    ``synth_design``). The IP is synthesised with the design (no out-of-context checkpoint),
    so the one ``synth_design`` of the plan covers it."""
    lanes = site.gt_lanes
    props = [
        ("CMAC_CAUI4_MODE", "1"),
        ("NUM_LANES", "4x25"),
        ("GT_REF_CLK_FREQ", _mhz(site.refclk_hz)),
        ("USER_INTERFACE", "AXIS"),
        ("GT_DRP_CLK", f"{site.init_clk_hz / 1e6:.2f}"),
        ("ENABLE_AXI_INTERFACE", "0"),          # ctl_* ports instead of AXI4-Lite registers
        ("INCLUDE_STATISTICS_COUNTERS", "0"),
        ("TX_FLOW_CONTROL", "0"),
        ("RX_FLOW_CONTROL", "0"),
        ("INCLUDE_RS_FEC", "1" if site.rsfec else "0"),
        ("CMAC_CORE_SELECT", site.cmac),
        ("GT_GROUP_SELECT", f"{lanes[0]}~{lanes[-1]}"),
    ]
    props += [(f"LANE{n + 1}_GT_LOC", loc) for n, loc in enumerate(lanes)]
    body = " \\\n".join(f"    CONFIG.{k} {{{v}}}" for k, v in props)
    return "\n".join([
        f"# roce-hw: the 100G CMAC (cmac_usplus, PG203) for the {board_title}.",
        "# Sourced by the build script after read_xdc and before synth_design.",
        f"create_ip -name cmac_usplus -vendor xilinx.com -library ip -module_name {CMAC_MODULE}",
        f"set_property -dict [list \\\n{body} \\\n] [get_ips {CMAC_MODULE}]",
        "# synthesised with the design, not out of context",
        f"set_property generate_synth_checkpoint false [get_files [get_property IP_FILE "
        f"[get_ips {CMAC_MODULE}]]]",
        f"generate_target synthesis [get_ips {CMAC_MODULE}]",
        "",
    ])
