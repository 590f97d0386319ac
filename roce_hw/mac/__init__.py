# SPDX-License-Identifier: BSD-2-Clause
"""A 1 Gb/s Ethernet MAC for the engine's board tops: the byte-wide transmitter
(:class:`~roce_hw.mac.tx.TxMac`) and receiver (:class:`~roce_hw.mac.rx.RxMac`) on the GMII side,
the width converters to the engine's bus (:mod:`~roce_hw.mac.convert`), the receive clock
crossing (:class:`~roce_hw.mac.cdc.RxFrameCdc`), the RGMII PHY interface
(:class:`~roce_hw.mac.rgmii.RgmiiPhy`) and the whole MAC (:class:`~roce_hw.mac.mac.Mac1G`).

Conventions: the engine side is :func:`roce_hw.lib.stream.frame_layout` (frames without FCS,
``abort`` on the last beat = a bad frame); the byte side is :func:`byte_frame_layout` (the same
with one byte per beat); the GMII side is :func:`gmii_layout`, one byte per clock cycle of
125 MHz (1 Gb/s)."""

from .common import ByteFrameSignature, byte_frame_layout, gmii_layout, mac_counters_layout

__all__ = ["ByteFrameSignature", "byte_frame_layout", "gmii_layout", "mac_counters_layout"]
