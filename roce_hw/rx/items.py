# SPDX-License-Identifier: BSD-2-Clause
"""What the RX front end hands on: its items (ARP requests, CM datagrams, RoCEv2 headers) and
its counters."""

from amaranth.lib import data

from .. import layouts, proto

__all__ = ["arp_req_layout", "cm_rx_layout", "roce_rx_layout", "rx_counters_layout",
           "rx_outcome_layout"]


def _width(layout, name):
    return layout[name].shape


def arp_req_layout():
    """Payload of the ``arp`` stream: the sender of an ARP request for our IP,
    ``{sha 48, spa 32}`` (hardware and protocol address, as integers)."""
    return data.StructLayout({"sha": _width(layouts.ARP, "sha"),
                              "spa": _width(layouts.ARP, "spa")})


def cm_rx_layout():
    """Payload of the ``cm`` stream: ``{src_mac 48, src_ip 32, src_port 16, udp_checksum 16,
    dgram}`` with ``dgram`` a :data:`roce_hw.layouts.CM_DATAGRAM` and ``udp_checksum`` the UDP
    header's checksum field as received (the connection manager verifies it)."""
    return data.StructLayout({"src_mac": _width(layouts.ETH, "src"),
                              "src_ip": _width(layouts.IPV4, "src"),
                              "src_port": _width(layouts.UDP, "src_port"),
                              "udp_checksum": _width(layouts.UDP, "checksum"),
                              "dgram": layouts.CM_DATAGRAM})


def roce_rx_layout():
    """Payload of the ``roce`` stream, one per good RoCEv2 packet:
    ``{src_ip 32, src_port 16, udp_length 16, bth_aeth_only 1, bth, aeth}``.

    ``bth`` is a :data:`roce_hw.layouts.BTH`; ``aeth`` the 4 bytes after the BTH as a
    :data:`roce_hw.layouts.AETH` (meaningful for the opcodes that carry an AETH);
    ``bth_aeth_only`` is 1 when the packet is exactly BTH + AETH + iCRC (UDP length 28), the
    shape of an ACK/NAK; ``udp_length`` gives the rest (payload + pad = ``udp_length`` - 8 - 12
    - extension headers - 4)."""
    return data.StructLayout({"src_ip": _width(layouts.IPV4, "src"),
                              "src_port": _width(layouts.UDP, "src_port"),
                              "udp_length": _width(layouts.UDP, "length"),
                              "bth_aeth_only": 1, "bth": layouts.BTH, "aeth": layouts.AETH})


def rx_counters_layout():
    """``StructLayout`` of the front end's 32-bit wrapping counters, one member per name of
    :data:`roce_hw.proto.RX_COUNTERS`."""
    return data.StructLayout({name: 32 for name in proto.RX_COUNTERS})


def rx_outcome_layout():
    """What became of one frame: one bit per counter of :data:`roce_hw.proto.RX_COUNTERS` but
    ``rx_frames``, exactly one of them set."""
    return data.StructLayout({name: 1 for name in proto.RX_COUNTERS[1:]})
