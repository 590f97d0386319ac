# SPDX-License-Identifier: BSD-2-Clause
"""100G boards: Alveo U250, Alveo U280, VCU118 and RFSoC 4x2, each with the engine at 512 bits
behind the Xilinx CMAC on one QSFP28 cage.

The platform classes below are our own (amaranth-boards has no Alveo and no VCU118); the RFSoC
4x2 is amaranth-boards' :class:`~amaranth_boards.rfsoc4x2.RFSoC4x2Platform`. Pin locations,
reference clocks and CMAC sites come from the sources named at each class; what no source
confirmed is listed in :attr:`QsfpBoard.unverified` and printed with every build.

``python build.py --board alveo_u250`` writes the Vivado build plan (Verilog, XDC, the CMAC
Tcl, ``build_<name>.sh``); a machine with Vivado runs ``sh build_<name>.sh`` in that folder.
Nothing here runs Vivado.
"""

from dataclasses import dataclass, field, replace
from pathlib import Path

from amaranth import *
from amaranth.build import Attrs, Clock, DiffPairs, Pins, PinsN, Resource, Subsignal
from amaranth.lib import wiring
from amaranth.lib.cdc import ResetSynchronizer
from amaranth.vendor import XilinxPlatform
from amaranth_boards.resources import LEDResources
from amaranth_boards.rfsoc4x2 import RFSoC4x2Platform

from roce_hw.engine import RoceEngine
from roce_hw.top import max_frame_beats

from .board import Board
from .cmac import CMAC_USER_CLOCK_HZ, CmacAdapter, CmacSite, cmac_instance, cmac_tcl

__all__ = ["AlveoU250Platform", "AlveoU280Platform", "VCU118Platform", "QsfpBoard",
           "CmacBoardTop", "QSFP_BOARDS", "BOARDS", "build_plan"]

QSFP_161 = 161_132_812.5      # 161.1328125 MHz: 25.78125 Gb/s / 160
QSFP_156 = 156_250_000


def _qsfp(n, *, tx_p, tx_n, rx_p, rx_n, modsel=None, rst=None, modprs=None, int_=None,
          lpmode=None, iostd):
    """A QSFP28 cage: the four GTY lanes (no I/O standard: dedicated transceiver pins) and the
    low-speed sideband where the FPGA reaches it (``modsel``, ``rst``, ``modprs``, ``int``
    active low on the connector; ``lpmode`` active high)."""
    subs = [Subsignal("tx", DiffPairs(p=tx_p, n=tx_n, dir="o")),
            Subsignal("rx", DiffPairs(p=rx_p, n=rx_n, dir="i"))]
    attrs = Attrs(IOSTANDARD=iostd)
    for name, pins, cls, d in (("modsel", modsel, PinsN, "o"), ("rst", rst, PinsN, "o"),
                               ("modprs", modprs, PinsN, "i"), ("int", int_, PinsN, "i"),
                               ("lpmode", lpmode, Pins, "o")):
        if pins:
            subs.append(Subsignal(name, cls(pins, dir=d), attrs))
    return Resource("qsfp", n, *subs)


def _lanes(x, y):
    """The four GTY channel sites of a quad, lane 0 first: ``_lanes(1, 44)`` is X1Y44-X1Y47."""
    return tuple(f"X{x}Y{y + lane}" for lane in range(4))


def _refclk(n, p, n_, hz):
    """The QSFP cage's GTY reference clock (MGTREFCLK pins: no I/O standard)."""
    return Resource("qsfp_refclk", n, DiffPairs(p, n_, dir="i"), Clock(hz))


class AlveoU250Platform(XilinxPlatform):
    """AMD Alveo U250 (XCU250-FIGD2104-2L-E).

    Sources: Corundum ``fpga/mqnic/Alveo/fpga_100g/fpga_au200.xdc`` (shared by AU200, AU250
    and VCU1525: same package pins; its GT site comments are the VU9P's) for the pins, the
    300 MHz clocks, the LEDs and the QSFP reference clock (SI5335 output, 161.1328125 MHz with
    ``FS`` = 0b10; "1X" is also the chip's default with the pins floating); Corundum
    ``placement_au250.xdc`` and Xilinx open-nic-shell ``cmac_usplus_0_au250.tcl`` for the CMAC
    sites (QSFP0: ``CMACE4_X0Y8``, GTs ``X1Y44``-``X1Y47`` on the XCU250). Part as in the
    U250's board file (Corundum builds for ``xcu250-figd2104-2-e``).
    """
    device = "xcu250"
    package = "figd2104"
    speed = "2L-e"
    default_clk = "clk300"
    resources = [
        Resource("clk300", 0, DiffPairs("AY37", "AY38", dir="i"), Clock(300e6),
                 Attrs(IOSTANDARD="LVDS")),
        *LEDResources(pins="BC21 BB21 BA20", attrs=Attrs(IOSTANDARD="LVCMOS12")),
        _qsfp(0, tx_p="N9 M7 L9 K7", tx_n="N8 M6 L8 K6", rx_p="N4 M2 L4 K2",
              rx_n="N3 M1 L3 K1", modsel="BE16", rst="BE17", modprs="BE20", int_="BE21",
              lpmode="BD18", iostd="LVCMOS12"),
        _refclk(0, "K11", "K10", QSFP_161),     # MGTREFCLK1P/N_231 from the SI5335 (U9)
        Resource("qsfp_refclk_ctl", 0,
                 Subsignal("rst", Pins("AT22", dir="o")), Subsignal("fs", Pins("AT20 AU22", dir="o")),
                 Attrs(IOSTANDARD="LVCMOS12")),
        _qsfp(1, tx_p="U9 T7 R9 P7", tx_n="U8 T6 R8 P6", rx_p="U4 T2 R4 P2",
              rx_n="U3 T1 R3 P1", modsel="AY20", rst="BC18", modprs="BC19", int_="AV21",
              lpmode="AV22", iostd="LVCMOS12"),
        _refclk(1, "P11", "P10", QSFP_161),     # MGTREFCLK1P/N_230 from the SI5335 (U12)
        Resource("qsfp_refclk_ctl", 1,
                 Subsignal("rst", Pins("AR21", dir="o")), Subsignal("fs", Pins("AR22 AU20", dir="o")),
                 Attrs(IOSTANDARD="LVCMOS12")),
    ]
    connectors = []


class AlveoU280Platform(XilinxPlatform):
    """AMD Alveo U280 (XCU280-FSVH2892-2L-E).

    Sources: Corundum ``fpga/mqnic/Alveo/fpga_100g/fpga_au280.xdc`` for the pins, the 100 MHz
    clock and the QSFP reference clock (SI546, 161.1328125 MHz with ``refclk_fs`` = 1,
    enabled by ``refclk_oe_b`` = 0); Corundum ``placement_au280.xdc`` and open-nic-shell
    ``cmac_usplus_0_au280.tcl`` for the CMAC sites (QSFP0: ``CMACE4_X0Y6``, GTs
    ``X0Y40``-``X0Y43``). The QSFP sideband (select, reset, low power) is behind the card's
    management controller: the FPGA does not reach it, and the U280 has no user LEDs here.
    """
    device = "xcu280"
    package = "fsvh2892"
    speed = "2L-e"
    default_clk = "clk100"
    resources = [
        Resource("clk100", 0, DiffPairs("BJ43", "BJ44", dir="i"), Clock(100e6),
                 Attrs(IOSTANDARD="LVDS")),
        _qsfp(0, tx_p="L48 L44 K46 J48", tx_n="L49 L45 K47 J49", rx_p="L53 K51 J53 H51",
              rx_n="L54 K52 J54 H52", iostd="LVCMOS18"),
        _refclk(0, "R40", "R41", QSFP_161),     # MGTREFCLK1P/N_134 from the SI546
        Resource("qsfp_refclk_ctl", 0,
                 Subsignal("oe", PinsN("H32", dir="o")), Subsignal("fs", Pins("G32", dir="o")),
                 Attrs(IOSTANDARD="LVCMOS18")),
        _qsfp(1, tx_p="G48 E48 C48 A49", tx_n="G49 E49 C49 A50", rx_p="G53 F51 E53 D51",
              rx_n="G54 F52 E54 D52", iostd="LVCMOS18"),
        _refclk(1, "M42", "M43", QSFP_161),     # MGTREFCLK1P/N_135 from the SI546
        Resource("qsfp_refclk_ctl", 1,
                 Subsignal("oe", PinsN("H30", dir="o")), Subsignal("fs", Pins("G33", dir="o")),
                 Attrs(IOSTANDARD="LVCMOS18")),
    ]
    connectors = []


class VCU118Platform(XilinxPlatform):
    """AMD VCU118 evaluation board (XCVU9P-L2FLGA2104E).

    Source: Corundum ``fpga/mqnic/VCU118/fpga_100g/fpga.xdc`` (pins, the 125 MHz clock, the
    LEDs, QSFP1's 156.25 MHz reference clock from the fixed oscillator U38: 161.1328125 MHz
    would take reprogramming the SI5328 over I2C) and its ``placement.xdc`` (QSFP1:
    ``CMACE4_X0Y7``, GTs ``X1Y48``-``X1Y51``). QSFP2's pins are here too; its reference clock
    is not (the source leaves it commented out).
    """
    device = "xcvu9p"
    package = "flga2104"
    speed = "2L-e"
    default_clk = "clk125"
    resources = [
        Resource("clk125", 0, DiffPairs("AY24", "AY23", dir="i"), Clock(125e6),
                 Attrs(IOSTANDARD="LVDS")),
        *LEDResources(pins="AT32 AV34 AY30 BB32 BF32 AU37 AV36 BA37",
                      attrs=Attrs(IOSTANDARD="LVCMOS12")),
        _qsfp(1, tx_p="V7 T7 P7 M7", tx_n="V6 T6 P6 M6", rx_p="Y2 W4 V2 U4",
              rx_n="Y1 W3 V1 U3", modsel="AM21", rst="BA22", modprs="AL21", int_="AP21",
              lpmode="AN21", iostd="LVCMOS18"),
        _refclk(1, "W9", "W8", QSFP_156),       # MGTREFCLK0P/N_231 from U38
        _qsfp(2, tx_p="L5 K7 J5 H7", tx_n="L4 K6 J4 H6", rx_p="T2 R4 P2 M2",
              rx_n="T1 R3 P1 M1", modsel="AN23", rst="AY22", modprs="AN24", int_="AT21",
              lpmode="AT24", iostd="LVCMOS18"),
    ]
    connectors = []


@dataclass(frozen=True)
class QsfpBoard:
    """What the 100G board top needs to know about one board: its platform, the QSFP28 cage
    it uses with its CMAC site, the free-running clock, and what is unconfirmed.

    ``init_clk``: (resource name, number, divider) of the board clock that becomes the CMAC's
    ``init_clk``/DRP clock (divided by a ``BUFGCE_DIV`` when the divider is above 1, so it
    stays a frequency the GT DRP takes). ``refclk_ctl``: how the cage's reference clock chip
    is set, ``"si5335"`` (U250: ``fs`` = 0b10, a reset pulse at power-up), ``"si546"``
    (U280: ``oe`` on, ``fs`` = 1) or None (fixed).
    """
    name: str
    title: str
    platform: type
    fpga: str
    qsfp: int
    site: CmacSite
    init_clk: tuple
    refclk_ctl: str | None
    sources: tuple
    unverified: tuple = ()
    port: str = "QSFP28 0, 100GBASE-SR4/CR4 (CAUI-4, RS-FEC)"
    extra_refclk: object = field(default=None, repr=False)


class CmacBoardTop(Elaboratable):
    """Board top: :class:`~roce_hw.engine.RoceEngine` at 512 bits in the CMAC's user clock
    domain (322.266 MHz), joined to the CMAC by :class:`~platforms.cmac.CmacAdapter`.

    Clock domains: ``init`` (the board clock, divided for the GT DRP; power-on sequencing of
    the reference clock chip, the QSFP module and the CMAC's ``sys_reset``) and ``sync``
    (``gt_txusrclk2`` of the CMAC: the engine, the adapter; reset by the CMAC's user resets).

    The engine's user ports are tied off: on a board, connections are opened by the CM
    (``roce-host open``/``rts``) and data comes from the on-chip traffic generator
    (``roce-host start``). ``local_mac``/``local_ip`` are constants.
    """

    def __init__(self, config, board, *, mac, ip):
        if config.data_width != 512:
            raise ValueError(f"the CMAC board top runs the engine at 512 bits, not "
                             f"{config.data_width}")
        self._config = config
        self._board = board
        self._mac = mac
        self._ip = ip
        self.fifo_depth = 2 * max_frame_beats(config)

    def elaborate(self, platform):
        m = Module()
        b = self._board
        site = b.site

        # -- init domain: free-running board clock ------------------------------------------
        clk_name, clk_num, div = b.init_clk
        clk_in = platform.request(clk_name, clk_num)
        m.domains.init = ClockDomain("init", reset_less=True)
        if div > 1:
            m.submodules.init_buf = Instance("BUFGCE_DIV", p_BUFGCE_DIVIDE=div,
                                             i_I=clk_in.i, i_CE=1, i_CLR=0,
                                             o_O=ClockSignal("init"))
        else:
            m.submodules.init_buf = Instance("BUFG", i_I=clk_in.i, o_O=ClockSignal("init"))

        # power-on: reference clock chip reset for 2**16 cycles, QSFP module reset and the
        # CMAC's sys_reset until the counter's top bit (about 10 ms at 100 MHz)
        por = Signal(21)
        with m.If(~por[-1]):
            m.d.init += por.eq(por + 1)
        early = Signal()
        m.d.init += early.eq(por[16:] == 0)
        sys_reset = Signal(init=1)
        m.d.init += sys_reset.eq(~por[-1])

        # -- the QSFP cage ---------------------------------------------------------------------
        sideband = {"modsel": "o", "rst": "o", "lpmode": "o", "modprs": "i", "int": "i"}
        res = platform.lookup("qsfp", b.qsfp)
        have = {sub.name for sub in res.ios}
        qsfp = platform.request("qsfp", b.qsfp,
                                dir={"tx": "-", "rx": "-",
                                     **{k: v for k, v in sideband.items() if k in have}})
        if "modsel" in have:
            m.d.comb += qsfp.modsel.o.eq(1)                 # select the module (ModSelL low)
        if "rst" in have:
            m.d.comb += qsfp.rst.o.eq(early)                # ResetL low at power-up only
        if "lpmode" in have:
            m.d.comb += qsfp.lpmode.o.eq(0)                 # high power mode
        refclk = platform.request("qsfp_refclk", b.qsfp, dir="-")
        if b.refclk_ctl == "si5335":
            ctl = platform.request("qsfp_refclk_ctl", b.qsfp)
            m.d.comb += [ctl.fs.o.eq(0b10), ctl.rst.o.eq(early)]    # FS=1X: 161.1328125 MHz
        elif b.refclk_ctl == "si546":
            ctl = platform.request("qsfp_refclk_ctl", b.qsfp)
            m.d.comb += [ctl.oe.o.eq(1), ctl.fs.o.eq(1)]            # FS=1: 161.1328125 MHz

        # -- the CMAC and the engine in its user clock domain ----------------------------------
        m.domains.sync = ClockDomain("sync")
        user_clk = Signal()
        usr_tx_reset = Signal()
        usr_rx_reset = Signal()
        m.d.comb += ClockSignal("sync").eq(user_clk)
        m.submodules.user_reset = ResetSynchronizer(usr_tx_reset | usr_rx_reset,
                                                    domain="sync")
        # (no create_clock on user_clk: Vivado derives it from the reference clock through
        # the GT, and a primary clock there would replace the derived one)

        m.submodules.adapter = adapter = CmacAdapter(self.fifo_depth)
        m.submodules.cmac = cmac_instance(
            site, gt_tx=qsfp.tx, gt_rx=qsfp.rx, refclk=refclk, init_clk=ClockSignal("init"),
            sys_reset=sys_reset, adapter=adapter, user_clk=user_clk,
            usr_tx_reset=usr_tx_reset, usr_rx_reset=usr_rx_reset)

        m.submodules.engine = engine = RoceEngine(self._config)
        wiring.connect(m, engine.tx, adapter.tx)
        wiring.connect(m, adapter.rx, engine.rx)
        if self._config.rx_other:
            m.d.comb += engine.rx_other.ready.eq(1)
        m.d.comb += [
            engine.local_mac.eq(self._mac), engine.local_ip.eq(self._ip),
            engine.status.ready.eq(1), engine.qp_mgmt_rsp.ready.eq(1),
            # (wr, resume, i, qp_mgmt_req, ip_id_load: never valid)
        ]

        # -- LEDs where the board has them: link up, RX aligned, alive -------------------------
        leds = []
        try:
            for n in range(3):
                leds.append(platform.request("led", n))
        except Exception:          # fewer (or no) LEDs: use what there is
            pass
        for led, sig in zip(leds, (adapter.link_up, adapter.stat_rx_aligned, por[-1])):
            m.d.comb += led.o.eq(sig)
        return m


def _board_constraints(board):
    """XDC lines the plan adds: configuration bank voltage and false paths on the slow
    sideband pins (they change at power-up only)."""
    lines = ["# roce-hw: configuration and slow pins",
             "set_property CFGBVS GND [current_design]",
             "set_property CONFIG_VOLTAGE 1.8 [current_design]",
             "set_property BITSTREAM.GENERAL.COMPRESS true [current_design]",
             "set_false_path -quiet -to [get_ports -quiet {led_* qsfp_*__modsel* qsfp_*__rst* "
             "qsfp_*__lpmode* qsfp_refclk_ctl_*}]",
             "set_false_path -quiet -from [get_ports -quiet {qsfp_*__modprs* qsfp_*__int*}]"]
    return "\n".join(lines) + "\n"


def _script_after_read(board):
    """The Tcl the plan runs after ``read_xdc``: create and generate the CMAC (so that
    ``synth_design`` finds it), after warning about anything unconfirmed."""
    lines = ["# roce-hw: create and generate the CMAC before synth_design"]
    for item in board.unverified:
        lines.append(f'puts "roce-hw WARNING: not confirmed from a source: {item}"')
    lines.append("source cmac_usplus_0.tcl")
    return "\n".join(lines)


def build_plan(board, options):
    """Write the Vivado build plan of ``board`` (a :class:`QsfpBoard`) under
    ``options.out``; return the summary ``build.py`` prints."""
    import time

    if options.bitstream:
        raise ValueError(f"--bitstream needs Vivado for {board.name}: this writes the plan; "
                         f"run `sh build_{_name(board)}.sh` in it on a machine with Vivado")
    cfg = options.config
    if cfg.data_width != 512:
        raise ValueError(f"{board.name} carries 512 bits only, not {cfg.data_width}")
    cfg = replace(cfg, rx_other=False)      # no consumer of other traffic on the board
    log = options.log
    t0 = time.monotonic()
    platform = board.platform()
    if board.extra_refclk is not None:
        platform.add_resources([board.extra_refclk])
    platform.add_file("cmac_usplus_0.tcl", cmac_tcl(board.site, board.title))
    top = CmacBoardTop(cfg, board, mac=options.mac, ip=options.ip)
    name = _name(board)
    log(f"elaborating the {board.title} top: engine at 512 bits, {cfg.n_qp} QPs, "
        f"CMAC {board.site.cmac} ...")
    plan = platform.build(top, name=name, do_build=False, emit_src=False,
                          script_after_read=_script_after_read(board),
                          add_constraints=_board_constraints(board))
    out = Path(options.out)
    plan.extract(str(out))
    files = sorted(str(out / f) for f in plan.files)
    size = sum((out / f).stat().st_size for f in plan.files)
    log(f"wrote the Vivado plan: {len(files)} files, {size / 1e6:.1f} MB "
        f"({time.monotonic() - t0:.1f} s)")
    return {"board": board.name, "fpga": board.fpga, "part": platform._part,
            "cmac_site": board.site.cmac, "gt_lanes": list(board.site.gt_lanes),
            "refclk_mhz": board.site.refclk_hz / 1e6, "user_clock_mhz": CMAC_USER_CLOCK_HZ / 1e6,
            "frame_fifo_beats": top.fifo_depth, "files": files, "bytes": size,
            "run": f"cd {out} && sh build_{name}.sh   (needs Vivado with a CMAC licence)",
            "unverified": list(board.unverified)}


def _name(board):
    return f"roce_{board.name}"


#: The 100G boards, as build.py knows them.
QSFP_BOARDS = (
    QsfpBoard(
        name="alveo_u250", title="AMD Alveo U250", platform=AlveoU250Platform,
        fpga="xcu250-figd2104-2L-e", qsfp=0,
        site=CmacSite(cmac="CMACE4_X0Y8", gt_lanes=_lanes(1, 44),
                      refclk_hz=QSFP_161, init_clk_hz=100e6),
        init_clk=("clk300", 0, 3), refclk_ctl="si5335",
        sources=("corundum fpga/mqnic/Alveo/fpga_100g/fpga_au200.xdc, placement_au250.xdc",
                 "open-nic-shell src/cmac_subsystem/vivado_ip/cmac_usplus_0_au250.tcl")),
    QsfpBoard(
        name="alveo_u280", title="AMD Alveo U280", platform=AlveoU280Platform,
        fpga="xcu280-fsvh2892-2L-e", qsfp=0,
        site=CmacSite(cmac="CMACE4_X0Y6", gt_lanes=_lanes(0, 40),
                      refclk_hz=QSFP_161, init_clk_hz=100e6),
        init_clk=("clk100", 0, 1), refclk_ctl="si546",
        sources=("corundum fpga/mqnic/Alveo/fpga_100g/fpga_au280.xdc, placement_au280.xdc",
                 "open-nic-shell src/cmac_subsystem/vivado_ip/cmac_usplus_0_au280.tcl")),
    QsfpBoard(
        name="vcu118", title="AMD VCU118", platform=VCU118Platform,
        fpga="xcvu9p-flga2104-2L-e", qsfp=1, port="QSFP28 1, 100GBASE-SR4/CR4 (CAUI-4, RS-FEC)",
        site=CmacSite(cmac="CMACE4_X0Y7", gt_lanes=_lanes(1, 48),
                      refclk_hz=QSFP_156, init_clk_hz=125e6),
        init_clk=("clk125", 0, 1), refclk_ctl=None,
        sources=("corundum fpga/mqnic/VCU118/fpga_100g/fpga.xdc, placement.xdc",)),
    QsfpBoard(
        name="rfsoc4x2", title="RealDigital RFSoC 4x2", platform=RFSoC4x2Platform,
        fpga="xczu48dr-ffvg1517-2-e", qsfp=0,
        site=CmacSite(cmac="CMACE4_X0Y0", gt_lanes=_lanes(0, 0),
                      refclk_hz=QSFP_156, init_clk_hz=100e6, per_lane_ports=True),
        init_clk=("clk", 0, 1), refclk_ctl=None,
        sources=("amaranth-boards amaranth_boards/rfsoc4x2.py (QSFP lanes, sideband, clocks)",),
        unverified=(
            "RFSoC 4x2 QSFP GTY reference clock: amaranth-boards' clk_qsfp (AL17/AM17, "
            "156.25 MHz) is used, which may not be a GTY reference clock input",
            "RFSoC 4x2 CMAC site CMACE4_X0Y0 and GTY channels X0Y0-X0Y3 (no source found)"),
        extra_refclk=Resource("qsfp_refclk", 0, DiffPairs("AL17", "AM17", dir="i"),
                              Clock(QSFP_156))),
)


def _board(qb):
    return Board(
        name=qb.name, title=f"{qb.title} ({qb.fpga.split('-')[0].upper()})", fpga=qb.fpga,
        port=qb.port, widths=(512,), open_tools=False,
        builds=("Vivado build plan (Verilog, XDC, CMAC Tcl, build script); checked here, "
                "not built" + ("; UNCONFIRMED pins, see docs/boards.md" if qb.unverified
                               else "")),
        build=lambda options, qb=qb: build_plan(qb, options), engine_clock_hz=CMAC_USER_CLOCK_HZ)


BOARDS = tuple(_board(qb) for qb in QSFP_BOARDS)
