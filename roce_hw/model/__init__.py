# SPDX-License-Identifier: BSD-2-Clause
"""Pure-Python golden models (no Amaranth import), mirroring the hardware: packets, iCRC, PSN
arithmetic, headers, segmentation, the QP table, the requester (TX), the RX front end, the
connection manager and the traffic generator."""

__all__ = ["cm", "engine", "generator", "header", "icrc", "packet", "psn", "qp_table", "requester", "rx",
           "segment"]
