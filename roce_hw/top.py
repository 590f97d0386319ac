# SPDX-License-Identifier: BSD-2-Clause
"""The Verilog top of the TX engine: flat AXI-Stream-style ports, optionally a frame FIFO.

:class:`TxTop` is what ``python build.py`` emits as module ``roce_tx``: the
:class:`~roce_hw.engine.TxEngine` wrapped by :class:`~roce_hw.lib.flat.FlatTop`, its payload
input named ``s_axis_payload_*`` and its frame output ``m_axis_tx_*`` (:data:`PORT_NAMES`).
With ``no_underrun=True`` a store-and-forward :class:`~roce_hw.lib.frame_fifo.FrameFifo` sits
between the engine and ``m_axis_tx``, so that a frame never pauses once started.
"""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In

from . import proto
from .config import EngineConfig
from .engine import TxEngine
from .lib.compose import connect_through
from .lib.flat import FlatTop
from .lib.frame_fifo import FrameFifo

__all__ = ["PORT_NAMES", "ENGINE_PORT_NAMES", "MAX_PMTU", "max_frame_bytes", "max_frame_beats",
           "TxTop", "EngineTop", "BufferedTxEngine"]

#: Names of the engine's streams in the flat Verilog ports (``s_axis_payload_*``, ``m_axis_tx_*``).
PORT_NAMES = {"i": "payload", "o": "tx"}

#: Names of the whole engine's streams in the flat Verilog ports (``s_axis_rx_*``,
#: ``m_axis_tx_*``, ``m_axis_rx_other_*``, ``s_axis_payload_*``).
ENGINE_PORT_NAMES = {"i": "payload"}

#: Largest PMTU a QP can be given (``ctx_pmtu`` 5), in bytes.
MAX_PMTU = 4096


def max_frame_bytes(config):
    """Longest frame the engine can send, in bytes (without FCS): Ethernet + IPv4 + UDP + BTH
    + RETH + ImmDt headers, a full PMTU of payload (a multiple of 4, so no pad) and the iCRC."""
    headers = (proto.ETH, proto.IPV4, proto.UDP, proto.BTH, proto.RETH, proto.IMMDT)
    return sum(h.size for h in headers) + MAX_PMTU + 4


def max_frame_beats(config):
    """:func:`max_frame_bytes` in bus beats of ``config.data_width`` bits."""
    return -(-max_frame_bytes(config) // config.data_bytes)


class BufferedTxEngine(wiring.Component):
    """A :class:`~roce_hw.engine.TxEngine` whose ``o`` goes through a
    :class:`~roce_hw.lib.frame_fifo.FrameFifo`: the same members as the engine, every one wired
    straight through except ``o``. Latency WR -> first byte grows by the time to receive the
    whole frame plus 2 cycles (see :class:`~roce_hw.lib.frame_fifo.FrameFifo`)."""

    def __init__(self, config, *, fifo_depth, abort="drop"):
        self._engine = TxEngine(config)
        self._fifo = FrameFifo(config.data_width, fifo_depth, abort=abort)
        super().__init__(self._engine.signature)

    @property
    def engine(self):
        return self._engine

    @property
    def fifo(self):
        return self._fifo

    def elaborate(self, platform):
        m = Module()
        m.submodules.engine = engine = self._engine
        m.submodules.fifo = fifo = self._fifo
        wiring.connect(m, engine.o, fifo.i)
        wiring.connect(m, fifo.o, wiring.flipped(self.o))
        connect_through(m, self, engine, exclude=("o",))
        return m


class TxTop(FlatTop):
    """The flat-port top of the TX engine, as emitted by ``build.py`` (see the module docstring
    and README "Using the generated Verilog" for the port list).

    Parameters
    ----------
    config : EngineConfig
    no_underrun : bool
        Put a store-and-forward :class:`~roce_hw.lib.frame_fifo.FrameFifo` after the engine, so
        that ``m_axis_tx_tvalid`` never drops inside a frame (for MACs that underflow on a pause).
    fifo_depth : int, optional
        Its depth in beats; default twice :func:`max_frame_beats` (so a frame can fill while the
        previous one drains). Must hold the longest frame.
    fifo_abort : str
        ``"drop"`` (default: aborted frames never reach the MAC) or ``"pass"`` (sent with
        ``tuser`` on their last beat).

    Raises
    ------
    ValueError
        ``fifo_depth`` (or ``fifo_abort``) without ``no_underrun``, or a ``fifo_depth`` that
        cannot hold the longest frame.
    """

    def __init__(self, config, *, no_underrun=False, fifo_depth=None, fifo_abort="drop"):
        if not isinstance(config, EngineConfig):
            raise TypeError(f"config must be an EngineConfig, not {config!r}")
        need = max_frame_beats(config)
        if not no_underrun:
            if fifo_depth is not None:
                raise ValueError("fifo_depth only applies with no_underrun=True")
            inner = TxEngine(config)
        else:
            if fifo_depth is None:
                fifo_depth = 2 * need
            if isinstance(fifo_depth, bool) or not isinstance(fifo_depth, int) or \
                    fifo_depth < need:
                raise ValueError(
                    f"FIFO depth {fifo_depth!r} beats cannot hold the longest frame: "
                    f"{max_frame_bytes(config)} bytes = {need} beats of {config.data_width} "
                    f"bits (PMTU {MAX_PMTU}); use at least {need}")
            inner = BufferedTxEngine(config, fifo_depth=fifo_depth, abort=fifo_abort)
        self._config = config
        self._fifo_depth = fifo_depth if no_underrun else None
        super().__init__(inner, rename=PORT_NAMES)

    @property
    def config(self):
        return self._config

    @property
    def fifo_depth(self):
        """Depth of the frame FIFO in beats, or ``None`` without one."""
        return self._fifo_depth


class EngineTop(FlatTop):
    """The flat-port top of the whole engine (:class:`~roce_hw.engine.RoceEngine`: TX, RX front
    end, connection manager, ARP, traffic generator), as ``build.py --top engine`` emits it as
    module ``roce_engine``. Frames from the MAC come in on ``s_axis_rx_*`` (``tuser`` = bad
    frame; ``s_axis_rx_tready`` is constant 1), frames to the MAC leave on ``m_axis_tx_*``,
    other traffic on ``m_axis_rx_other_*`` (``config.rx_other``); the counters are one port
    each (``counters_rx_icrc``, ``counters_cm_no_qp``, ...)."""

    def __init__(self, config):
        from .engine import RoceEngine

        if not isinstance(config, EngineConfig):
            raise TypeError(f"config must be an EngineConfig, not {config!r}")
        self._config = config
        super().__init__(RoceEngine(config), rename=ENGINE_PORT_NAMES)

    @property
    def config(self):
        return self._config
