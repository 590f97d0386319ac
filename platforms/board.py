# SPDX-License-Identifier: BSD-2-Clause
"""What a board is to ``build.py --board``: one :class:`Board` per supported board.

Each board module of this package (``ecp5_1g``, ``xilinx_100g``, ...) exports ``BOARDS``, a
tuple of :class:`Board`; :mod:`platforms` merges them into one registry. ``build.py`` knows
nothing board-specific: it validates the options against a :class:`Board` and calls its
:attr:`~Board.build`.
"""

from dataclasses import dataclass, field
from typing import Callable

__all__ = ["Board", "BoardOptions"]


@dataclass(frozen=True)
class BoardOptions:
    """The options ``build.py`` hands to :attr:`Board.build` (already validated against the
    board: ``width`` is one of :attr:`Board.widths`).

    ``mac`` and ``ip`` are the board's own addresses (integers), ``bitstream`` asks for the
    vendor tools to run where they are open (else only the plan is written), ``log`` prints one
    progress line."""
    config: object          # roce_hw.config.EngineConfig
    out: str
    mac: int
    ip: int
    bitstream: bool = False
    seed: int = 1
    log: Callable = print


@dataclass(frozen=True)
class Board:
    """One board ``build.py --board`` can build for.

    Attributes
    ----------
    name : str
        The ``--board`` value (lower case, ``_`` separated).
    title : str
        Human name, e.g. ``"Lattice ECP5 Versa (LFE5UM-45F)"``.
    fpga : str
        The device as its vendor names it (e.g. ``"LFE5UM-45F-8BG381C"``, ``"xcu250-figd2104-2L-e"``).
    port : str
        The Ethernet port the design uses (e.g. ``"1000BASE-T, RGMII PHY"``, ``"QSFP28 0, 100GBASE-SR4"``).
    widths : tuple of int
        Datapath widths the board top carries; the first is the default.
    open_tools : bool
        True when ``--bitstream`` can run here with open tools (ECP5: yowasp).
    builds : str
        One line for ``--list-boards``: what ``build.py --board`` writes for it.
    build : callable
        ``build(options: BoardOptions) -> dict``: writes the build plan (and with
        ``options.bitstream`` the bitstream) under ``options.out`` and returns a summary
        (paths written, and with a bitstream: utilisation and Fmax per clock).
        Raises ``ValueError`` for an option the board cannot take (``build.py`` exits 2).
    max_qps : int or None
        Most QPs known to fit the FPGA (None: not measured); ``build.py`` warns above it.
    engine_clock_hz : int or None
        The engine's clock on this board in Hz (``EngineConfig.clock_hz``: the retransmission
        timers count it); None: the width's default.
    """
    name: str
    title: str
    fpga: str
    port: str
    widths: tuple
    open_tools: bool
    builds: str
    build: Callable = field(repr=False, compare=False)
    max_qps: int | None = None
    engine_clock_hz: int | None = None

    @property
    def default_width(self):
        return self.widths[0]
