# SPDX-License-Identifier: BSD-2-Clause
"""The requester's transmit path: segmenter, PSN forwarding, packet builder, engine."""
