# SPDX-License-Identifier: BSD-2-Clause
"""RGMII (Reduced Gigabit Media Independent Interface, 1 Gb/s) between the MAC's GMII bytes and
the PHY's double-data-rate pins: ECP5 I/O cells on an ECP5 platform, a model of the wires in
simulation."""

from amaranth import *
from amaranth.lib import data, io, wiring
from amaranth.lib.wiring import In, Out

from .common import gmii_layout

__all__ = ["rgmii_ddr_layout", "delay_taps", "ECP5_DELAY_TAP_NS", "RgmiiPhy"]

#: Delay of one tap of an ECP5 ``DELAYG`` cell (Lattice TN1265: 25 ps per step).
ECP5_DELAY_TAP_NS = 0.025


def rgmii_ddr_layout():
    """The RGMII wires of one direction over one clock cycle, as the DDR I/O cells see them.

    ``data``: bits 3:0 are the 4 wires' values in the half cycle after the rising edge of the
    RGMII clock, bits 7:4 in the half after the falling edge -- which is GMII's byte as it is
    (RGMII sends bits 3:0 of a byte on the rising edge, 7:4 on the falling). ``ctl``: bit 0 is
    the control wire after the rising edge (TX_EN / RX_DV), bit 1 after the falling edge
    (TX_EN xor TX_ER / RX_DV xor RX_ER)."""
    return data.StructLayout({"data": 8, "ctl": 2})


def delay_taps(ns):
    """``DELAYG`` taps for a delay of ``ns`` nanoseconds (0 to 3.175 ns, 25 ps steps)."""
    taps = round(ns / ECP5_DELAY_TAP_NS)
    if not 0 <= taps < 128:
        raise ValueError(f"an ECP5 DELAYG delays 0 to {127 * ECP5_DELAY_TAP_NS:.3f} ns, "
                         f"not {ns} ns")
    return taps


class RgmiiPhy(wiring.Component):
    """GMII bytes to and from an RGMII PHY at 1 Gb/s (125 MHz, both clock edges).

    Transmit (``tx_domain``): ``gmii_tx`` is registered, then driven on the pins on both edges;
    the RGMII transmit clock is the ``tx_domain`` clock, sent through its own DDR cell (1 then
    0), so that it has the data's path delay, then delayed by ``tx_delay_ns`` (the 2 ns
    clock-to-data skew RGMII asks for, where neither the PHY nor the board adds it).
    Receive (``rx_domain``, clocked by the PHY's RX clock; the board top makes it): the pins are
    delayed by ``rx_delay_ns`` (where the PHY does not delay its RX clock itself), sampled on
    both edges and registered onto ``gmii_rx``. 1 Gb/s only: the 10/100 Mb/s modes and the
    in-band status are not decoded.

    With ``pads`` (the ``eth_rgmii`` resource of an amaranth-boards ECP5 board, requested with
    ``dir="-"``; its subsignals ``tx_clk``, ``tx_ctl`` or ``tx_ctrl``, ``tx_data``,
    ``rx_ctl`` or ``rx_ctrl``, ``rx_data``) and an ECP5 platform, the DDR wires go through
    ``ODDRX1F``/``IDDRX1F`` cells and ``DELAYG`` delays (``DEL_MODE="SCLK_ALIGNED"``, the data's
    delay 0, the clock's or the receive data's the value asked). Without ``pads`` the DDR wires
    are the members ``ddr_tx``/``ddr_rx`` (:func:`rgmii_ddr_layout`), for a simulation model of
    the wires (``sim/rgmii.py``), with the same cycle latency as the cells' fabric side.

    Latency: ``gmii_tx`` -> ``ddr_tx`` (or the ODDRX1F inputs) 1 cycle; ``ddr_rx`` (or the
    IDDRX1F outputs) -> ``gmii_rx`` 1 cycle. Throughput: one byte per cycle each way.
    Backpressure: none (GMII has none).

    Parameters
    ----------
    pads : object or None
    tx_delay_ns, rx_delay_ns : float
        ``DELAYG`` delays (0 to 3.175 ns) of the transmit clock and of the receive wires.
    tx_domain, rx_domain : str

    Members
    -------
    gmii_tx : ``In(gmii_layout())`` (``tx_domain``)
    gmii_rx : ``Out(gmii_layout())`` (``rx_domain``)
    ddr_tx : ``Out(rgmii_ddr_layout())`` (``tx_domain``; without ``pads`` only)
    ddr_rx : ``In(rgmii_ddr_layout())`` (``rx_domain``; without ``pads`` only)

    Raises
    ------
    ValueError
        For a delay out of range; at elaboration, ``pads`` on a platform that is not ECP5.
    """

    def __init__(self, pads=None, *, tx_delay_ns=0.0, rx_delay_ns=0.0, tx_domain="sync",
                 rx_domain="eth_rx"):
        self._pads = pads
        self._tx_taps = delay_taps(tx_delay_ns)
        self._rx_taps = delay_taps(rx_delay_ns)
        self._tx_domain = tx_domain
        self._rx_domain = rx_domain
        members = {"gmii_tx": In(gmii_layout()), "gmii_rx": Out(gmii_layout())}
        if pads is None:
            members["ddr_tx"] = Out(rgmii_ddr_layout())
            members["ddr_rx"] = In(rgmii_ddr_layout())
        super().__init__(members)

    @property
    def tx_taps(self):
        """``DELAYG`` taps of the transmit clock."""
        return self._tx_taps

    @property
    def rx_taps(self):
        """``DELAYG`` taps of the receive wires."""
        return self._rx_taps

    def elaborate(self, platform):
        m = Module()
        tx = Signal(rgmii_ddr_layout())     # the transmit DDR cells' inputs, registered
        rx = Signal(rgmii_ddr_layout())     # the receive DDR cells' outputs
        m.d[self._tx_domain] += [
            tx.data.eq(self.gmii_tx.data),
            tx.ctl.eq(Cat(self.gmii_tx.en, self.gmii_tx.en ^ self.gmii_tx.er)),
        ]
        m.d[self._rx_domain] += [
            self.gmii_rx.data.eq(rx.data),
            self.gmii_rx.en.eq(rx.ctl[0]),
            self.gmii_rx.er.eq(rx.ctl[0] ^ rx.ctl[1]),
        ]
        if self._pads is None:
            m.d.comb += [self.ddr_tx.eq(tx), rx.eq(self.ddr_rx)]
            return m
        if getattr(platform, "family", None) != "ecp5":
            raise ValueError(f"RgmiiPhy with pads needs an ECP5 platform, not {platform!r}")
        self._ecp5_io(m, tx, rx)
        return m

    def _ecp5_io(self, m, tx, rx):
        pads = self._pads
        # (amaranth-boards spells the control wires both ways)
        tx_ctl = pads.tx_ctl if hasattr(pads, "tx_ctl") else pads.tx_ctrl
        rx_ctl = pads.rx_ctl if hasattr(pads, "rx_ctl") else pads.rx_ctrl
        tx_clk = ClockSignal(self._tx_domain)
        rx_clk = ClockSignal(self._rx_domain)

        def out_pins(name, port, d0, d1, taps):
            m.submodules[f"{name}_buf"] = buf = io.Buffer("o", port)
            for k in range(len(port)):
                q = Signal(name=f"{name}_ddr{k}")
                z = Signal(name=f"{name}_dly{k}")
                m.submodules[f"{name}_oddr{k}"] = Instance(
                    "ODDRX1F", i_SCLK=tx_clk, i_RST=Const(0), i_D0=d0[k], i_D1=d1[k], o_Q=q)
                m.submodules[f"{name}_delay{k}"] = Instance(
                    "DELAYG", p_DEL_MODE="SCLK_ALIGNED", p_DEL_VALUE=taps, i_A=q, o_Z=z)
                m.d.comb += buf.o[k].eq(z)

        def in_pins(name, port, q0, q1):
            m.submodules[f"{name}_buf"] = buf = io.Buffer("i", port)
            for k in range(len(port)):
                z = Signal(name=f"{name}_dly{k}")
                m.submodules[f"{name}_delay{k}"] = Instance(
                    "DELAYG", p_DEL_MODE="SCLK_ALIGNED", p_DEL_VALUE=self._rx_taps,
                    i_A=buf.i[k], o_Z=z)
                m.submodules[f"{name}_iddr{k}"] = Instance(
                    "IDDRX1F", i_SCLK=rx_clk, i_RST=Const(0), i_D=z, o_Q0=q0[k], o_Q1=q1[k])

        out_pins("tx_clk", pads.tx_clk, C(1, 1), C(0, 1), self._tx_taps)
        out_pins("tx_ctl", tx_ctl, tx.ctl[0:1], tx.ctl[1:2], 0)
        out_pins("tx_data", pads.tx_data, tx.data[0:4], tx.data[4:8], 0)
        in_pins("rx_ctl", rx_ctl, rx.ctl[0:1], rx.ctl[1:2])
        in_pins("rx_data", pads.rx_data, rx.data[0:4], rx.data[4:8])
