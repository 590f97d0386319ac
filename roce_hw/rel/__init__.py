# SPDX-License-Identifier: BSD-2-Clause
"""Reliability (ACK/NAK handling, retransmission, completions): later issues."""
