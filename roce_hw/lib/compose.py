# SPDX-License-Identifier: BSD-2-Clause
"""Composition helper: a wrapper component's members wired straight to an inner component's."""

from amaranth.lib import wiring
from amaranth.lib.wiring import In

__all__ = ["connect_through"]


def connect_through(m, outer, inner, *, exclude=()):
    """Wire every member of ``outer`` (a wrapper's own interface) to the member of the same
    name of ``inner`` (a component it instantiates), except the names in ``exclude``: ports
    are assigned in their direction, interfaces joined with ``wiring.connect``. Adds no logic.
    """
    for name, member in outer.signature.members.items():
        if name in exclude:
            continue
        if member.is_port:
            if member.flow == In:
                m.d.comb += getattr(inner, name).eq(getattr(outer, name))
            else:
                m.d.comb += getattr(outer, name).eq(getattr(inner, name))
        else:
            wiring.connect(m, wiring.flipped(getattr(outer, name)), getattr(inner, name))
