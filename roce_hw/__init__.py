# SPDX-License-Identifier: BSD-2-Clause
"""roce-hw: an Amaranth HDL generator of a RoCEv2 RDMA engine.

The public API is imported lazily, so that the pure-Python parts (:mod:`roce_hw.proto`,
:mod:`roce_hw.model`) can be used on a host without importing Amaranth.
"""

import importlib

__all__ = ["__version__", "DATA_WIDTHS", "EngineConfig", "TxEngine"]

__version__ = "0.1.0"

_LAZY = {
    "DATA_WIDTHS": ".config",
    "EngineConfig": ".config",
    "TxEngine": ".tx.engine",
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
