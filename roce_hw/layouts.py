# SPDX-License-Identifier: BSD-2-Clause
"""Amaranth views of the protocol headers of :mod:`roce_hw.proto`, and lane helpers.

``network_struct(header)`` turns a wire-order :class:`roce_hw.proto.Header` into a
``data.StructLayout`` whose bit image, read as a big-endian integer, is the wire image::

    layout.const(fields).as_bits().to_bytes(header.size, "big") == header.pack(fields)

On a packet bus the first wire byte travels in ``data[7:0]`` (see :mod:`roce_hw.lib.stream`);
:func:`to_lanes` converts a header value into that lane order and :func:`from_lanes` back.
"""

from amaranth import *
from amaranth.lib import data

from . import proto

__all__ = [
    "network_struct", "to_lanes", "from_lanes",
    "ETH", "VLAN_TAG", "IPV4", "IPV6", "UDP", "BTH", "RETH", "AETH", "IMMDT", "IETH", "DETH",
    "CNP_PAD", "CM_DATAGRAM", "ARP",
]


def network_struct(header):
    """``data.StructLayout`` for a :class:`~roce_hw.proto.Header` (wire order, MSB first)."""
    if not isinstance(header, proto.Header):
        raise TypeError(f"expected a proto.Header, not {header!r}")
    return data.StructLayout(dict(reversed(header.fields)))


def _byte_reverse(value, nbytes):
    # Reversing the byte order is its own inverse, so one function serves both directions.
    v = Value.cast(value)
    if len(v) != nbytes * 8:
        raise ValueError(f"value is {len(v)} bits, expected {nbytes * 8}")
    return Cat(*[v.word_select(nbytes - 1 - i, 8) for i in range(nbytes)])


def to_lanes(value, nbytes):
    """Reorder a big-endian (wire-order) bit vector of ``nbytes`` bytes into bus lane order,
    wire byte 0 in bits [7:0]. ``value`` may be a ``data.View`` or any ``Value``.

    Raises ``ValueError`` if ``value`` is not ``8 * nbytes`` bits wide."""
    return _byte_reverse(value, nbytes)


def from_lanes(value, nbytes):
    """Inverse of :func:`to_lanes`: lane-ordered bytes to a big-endian bit vector.

    Raises ``ValueError`` if ``value`` is not ``8 * nbytes`` bits wide."""
    return _byte_reverse(value, nbytes)


ETH = network_struct(proto.ETH)
VLAN_TAG = network_struct(proto.VLAN_TAG)
IPV4 = network_struct(proto.IPV4)
IPV6 = network_struct(proto.IPV6)
UDP = network_struct(proto.UDP)
BTH = network_struct(proto.BTH)
RETH = network_struct(proto.RETH)
AETH = network_struct(proto.AETH)
IMMDT = network_struct(proto.IMMDT)
IETH = network_struct(proto.IETH)
DETH = network_struct(proto.DETH)
CNP_PAD = network_struct(proto.CNP_PAD)
CM_DATAGRAM = network_struct(proto.CM_DATAGRAM)
ARP = network_struct(proto.ARP)
