# SPDX-License-Identifier: BSD-2-Clause
"""roce-hw: an Amaranth HDL generator of a RoCEv2 RDMA engine.

Public API (imported lazily, so that the pure-Python parts, :mod:`roce_hw.proto` and
:mod:`roce_hw.model`, can be used on a host without importing Amaranth)::

    from roce_hw import EngineConfig, TxEngine, TxTop, generate
    generate(EngineConfig(data_width=512, n_qp=16), "build/roce_tx_512")   # roce_tx.v + ports

* :class:`EngineConfig` (:mod:`roce_hw.config`) -- build parameters; :data:`DATA_WIDTHS`;
* :class:`TxEngine` (:mod:`roce_hw.engine`) -- the TX engine (datapath and QP table) as an Amaranth component;
* :class:`TxTop` (:mod:`roce_hw.top`) -- its flat-port Verilog top (``roce_tx``), optionally
  with the store-and-forward :class:`FrameFifo`;
* :func:`generate`, :func:`lint`, :func:`verilog_text` (:mod:`roce_hw.generate`) -- write the
  Verilog and its port list; lint with Verilator.
"""

import importlib

__all__ = ["__version__", "DATA_WIDTHS", "EngineConfig", "TxEngine", "TxTop", "FrameFifo",
           "generate", "lint", "verilog_text"]

__version__ = "0.1.0"

# Imported eagerly (roce_hw.generate imports only the standard library at module level): the
# package attribute ``generate`` must be the function, not the submodule of the same name. Use
# ``from roce_hw.generate import ...`` for the module's other names.
from .generate import generate, lint, verilog_text  # noqa: E402

_LAZY = {
    "DATA_WIDTHS": ".config",
    "EngineConfig": ".config",
    "TxEngine": ".engine",
    "TxTop": ".top",
    "FrameFifo": ".lib.frame_fifo",
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {name!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
