# SPDX-License-Identifier: BSD-2-Clause
"""Pure-Python golden models (no Amaranth import), mirroring the hardware: packets, iCRC, PSN
arithmetic, headers, segmentation, the QP table, the requester (TX), the RX front end, the
ACK handler, the completer, the connection manager and the traffic generator."""

__all__ = ["ack", "cm", "completer", "engine", "generator", "header", "icrc", "packet", "psn", "qp_table", "requester", "rx",
           "segment"]
