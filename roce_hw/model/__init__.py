# SPDX-License-Identifier: BSD-2-Clause
"""Pure-Python golden models (no Amaranth import): packets, iCRC, PSN arithmetic, segmentation."""

__all__ = ["icrc", "psn", "segment", "packet"]
