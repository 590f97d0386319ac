# SPDX-License-Identifier: BSD-2-Clause
"""The receive path: :mod:`roce_hw.rx.frontend` (frames from the MAC checked whole and sorted into
ARP requests, CM datagrams, RoCEv2 packets and the rest); the CM and ACK handling build on it."""
