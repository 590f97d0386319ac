# SPDX-License-Identifier: BSD-2-Clause
"""Benchmarks: simulated throughput/latency (``bench.throughput``) and synthesis figures."""

__all__ = []
