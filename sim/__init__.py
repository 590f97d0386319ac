# SPDX-License-Identifier: BSD-2-Clause
"""Simulation helpers: simulator harness, stream BFMs, pcap I/O, traffic, co-simulation, peers."""

__all__ = []
