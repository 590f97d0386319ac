# SPDX-License-Identifier: BSD-2-Clause
"""Layouts shared by the 1G MAC's blocks: GMII bytes, byte-wide frames, counters."""

from amaranth.lib import data, stream

from .. import proto

__all__ = ["gmii_layout", "byte_frame_layout", "ByteFrameSignature", "mac_counters_layout"]


def gmii_layout():
    """One GMII byte time: ``data`` (8 bits), ``en`` (TX_EN / RX_DV: ``data`` is part of a
    frame, its preamble included), ``er`` (TX_ER / RX_ER: error)."""
    return data.StructLayout({"data": 8, "en": 1, "er": 1})


def byte_frame_layout():
    """A byte of a frame on the MAC side of the width converters: ``data``, ``first``,
    ``last`` and ``abort`` (meaningful with ``last``: a bad frame), as
    :func:`roce_hw.lib.stream.frame_layout` with one byte per beat (no ``keep``)."""
    return data.StructLayout({"data": 8, "first": 1, "last": 1, "abort": 1})


def ByteFrameSignature():
    """``stream.Signature`` carrying :func:`byte_frame_layout` beats."""
    return stream.Signature(byte_frame_layout())


def mac_tx_counters_layout():
    """The transmitter's counters (:class:`~roce_hw.mac.tx.TxMac`), 32 bits each, wrapping:
    :data:`roce_hw.proto.MAC_TX_COUNTERS`."""
    return data.StructLayout({name: 32 for name in proto.MAC_TX_COUNTERS})


def mac_rx_counters_layout():
    """The receiver's counters (:class:`~roce_hw.mac.rx.RxMac`), 32 bits each, wrapping:
    :data:`roce_hw.proto.MAC_RX_COUNTERS`."""
    return data.StructLayout({name: 32 for name in proto.MAC_RX_COUNTERS})


def mac_counters_layout():
    """The MAC's counters, wrapping: ``tx`` (:func:`mac_tx_counters_layout`, plus
    ``fifo_dropped``, 16 bits: aborted frames the transmit FIFO discarded) and ``rx``
    (:func:`mac_rx_counters_layout`)."""
    tx = dict(mac_tx_counters_layout().members)
    tx["fifo_dropped"] = 16
    return data.StructLayout({"tx": data.StructLayout(tx), "rx": mac_rx_counters_layout()})
