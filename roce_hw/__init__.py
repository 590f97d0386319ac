# SPDX-License-Identifier: BSD-2-Clause
"""roce-hw: an Amaranth HDL generator of a RoCEv2 RDMA transmit engine."""

__version__ = "0.1.0"
