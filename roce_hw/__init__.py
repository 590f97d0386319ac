# SPDX-License-Identifier: BSD-2-Clause
"""roce-hw: an Amaranth HDL generator of a RoCEv2 RDMA transmit engine."""

from .config import DATA_WIDTHS, EngineConfig

__all__ = ["__version__", "DATA_WIDTHS", "EngineConfig"]

__version__ = "0.1.0"
