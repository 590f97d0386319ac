# SPDX-License-Identifier: BSD-2-Clause
"""Pure-Python golden models (no Amaranth import), mirroring the hardware: packets, iCRC, PSN
arithmetic, headers, segmentation, the QP table, the requester (TX), the RX front end, the
ACK handler, the connection manager and the traffic generator."""

__all__ = ["ack", "cm", "engine", "generator", "header", "icrc", "packet", "psn", "qp_table", "requester", "rx",
           "segment"]
