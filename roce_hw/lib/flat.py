# SPDX-License-Identifier: BSD-2-Clause
"""Flat-port Verilog top for RTL integrators: every stream becomes AXI-Stream-style named ports.

Amaranth emits a stream with a struct payload as one wide ``<name>__payload`` vector. An FPGA
engineer instantiating ``roce_tx`` wants one port per field instead. :class:`FlatTop` wraps any
component whose members are streams and plain signals and exposes:

* a packet stream (payload ``{data, keep, first, last[, abort]}``) as AXI-Stream:
  ``s_axis_<name>_tdata/tkeep/tlast/tvalid/tready[/tuser]`` for inputs,
  ``m_axis_<name>_tdata/tkeep/tlast/tvalid/tready[/tuser]`` for outputs (``tuser`` = ``abort``).
  ``first`` is derived for inputs (the beat after a ``tlast``, or the first beat after reset)
  and dropped for outputs, as AXI-Stream has no start-of-packet flag;
* any other stream as ``s_<name>_valid/ready`` / ``m_<name>_valid/ready`` plus one port per
  payload field, nested fields joined with ``_`` (``s_qp_mgmt_req_ctx_remote_mac``);
* a plain signal under its own name; one with a struct shape (a set of counters) as one port
  per leaf field, ``<name>_<field>[_<field>...]``.

The wrapper adds no register and no latency: every port is wired straight through, except
the one-bit ``first`` tracker per input packet stream.
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["FlatTop", "flat_ports"]

_PACKET_FIELDS = {"data", "keep", "first", "last"}


def _is_packet(layout):
    return isinstance(layout, data.StructLayout) and \
        _PACKET_FIELDS <= set(name for name, _ in layout) <= _PACKET_FIELDS | {"abort"}


def _leaves(layout, prefix):
    """(flat name, path tuple, shape) for every leaf field of a (nested) struct layout."""
    if isinstance(layout, data.StructLayout):
        for name, fld in layout:
            yield from _leaves(fld.shape, prefix + (name,))
    else:
        yield "_".join(prefix), prefix, layout


def _payload_layout(name, member):
    sig = member.signature
    if isinstance(sig, wiring.FlippedSignature):
        sig = sig.flip()
    if not isinstance(sig, stream.Signature):
        raise TypeError(f"member {name!r}: only streams and plain ports can be flattened")
    shape = sig.members["payload"].shape
    if isinstance(shape, data.Layout):
        return shape
    # A plain-shaped payload is exposed as one port, <prefix><name>_data.
    return data.StructLayout({"data": shape})


def _get(view, path):
    if not isinstance(view, data.View):
        assert path == ("data",)
        return view
    for p in path:
        view = view[p]
    return view


def flat_ports(signature, rename=None):
    """``{port name: (In/Out member, description)}`` of the flat top for ``signature``: the
    specification of what :class:`FlatTop` exposes. ``rename`` maps member names to the names
    used in the flat ports (``{"i": "payload"}`` gives ``s_axis_payload_tdata``)."""
    members = {}
    rename = rename or {}
    unknown = set(rename) - set(signature.members)
    if unknown:
        raise ValueError(f"rename names {sorted(unknown)}, which are not members of the "
                         f"signature ({', '.join(signature.members)})")

    def add(port, value):
        if port in members:
            raise ValueError(f"two members flatten to the same port name {port!r}; "
                             f"use rename= to tell them apart")
        members[port] = value

    for orig, member in signature.members.items():
        name = rename.get(orig, orig)
        if member.is_port:
            if isinstance(member.shape, data.StructLayout):
                # a struct-shaped port (a set of counters...) becomes one port per leaf field
                for flat, path, shape in _leaves(member.shape, ()):
                    add(f"{name}_{flat}", ((In if member.flow == In else Out)(shape), None))
            else:
                add(name, (member, None))
            continue
        sink = member.flow == In   # the component consumes it
        layout = _payload_layout(name, member)
        pre = ("s_" if sink else "m_")
        if _is_packet(layout):
            base = f"{pre}axis_{name}_"
            fields = {"tdata": layout["data"].shape, "tkeep": layout["keep"].shape,
                      "tlast": 1}
            if "abort" in (n for n, _ in layout):
                fields["tuser"] = 1
            d_in = In if sink else Out
            for f, shape in fields.items():
                add(base + f, (d_in(shape), None))
            add(base + "tvalid", (d_in(1), None))
            add(base + "tready", ((Out if sink else In)(1), None))
        else:
            d_in = In if sink else Out
            for flat, path, shape in _leaves(layout, ()):
                add(f"{pre}{name}_{flat}", (d_in(shape), None))
            add(f"{pre}{name}_valid", (d_in(1), None))
            add(f"{pre}{name}_ready", ((Out if sink else In)(1), None))
    return members


class FlatTop(wiring.Component):
    """Wrap ``inner`` (a ``wiring.Component``) so that its Verilog has one port per field.

    Latency: none; throughput and backpressure: those of ``inner`` (every ``valid``, ``ready``
    and payload bit is wired straight through). The only state is one bit per input packet
    stream that remembers whether a packet is open, to derive ``first``. See the module
    docstring for the naming rules.

    Parameters
    ----------
    inner : wiring.Component
        The component to wrap; its members must be streams or plain ports.
    rename : dict of str to str, optional
        Member names of ``inner`` -> names used in the flat ports (``{"i": "payload"}``).

    Members
    -------
    The ports listed by :func:`flat_ports` for ``inner.signature``.

    Raises
    ------
    TypeError
        If a member of ``inner`` is neither a stream nor a plain port.
    ValueError
        If ``rename`` names a member ``inner`` does not have, or two members would flatten to
        the same port name.
    """

    def __init__(self, inner, rename=None):
        self._inner = inner
        self._rename = dict(rename or {})
        spec = flat_ports(inner.signature, self._rename)
        super().__init__({name: m for name, (m, _) in spec.items()})

    def elaborate(self, platform):
        m = Module()
        m.submodules.core = inner = self._inner
        for orig, member in inner.signature.members.items():
            port = getattr(inner, orig)
            name = self._rename.get(orig, orig)
            if member.is_port:
                if isinstance(member.shape, data.StructLayout):
                    pairs = [(getattr(self, f"{name}_{flat}"), _get(port, path))
                             for flat, path, _ in _leaves(member.shape, ())]
                else:
                    pairs = [(getattr(self, name), port)]
                for outer, inner_field in pairs:
                    if member.flow == In:
                        m.d.comb += inner_field.eq(outer)
                    else:
                        m.d.comb += outer.eq(inner_field)
                continue
            sink = member.flow == In
            layout = _payload_layout(name, member)
            pre = "s_" if sink else "m_"
            if _is_packet(layout):
                base = f"{pre}axis_{name}_"
                tvalid, tready = getattr(self, base + "tvalid"), getattr(self, base + "tready")
                tdata, tkeep, tlast = (getattr(self, base + f) for f in ("tdata", "tkeep", "tlast"))
                if sink:
                    # AXI-Stream has no start-of-packet flag: the first beat is the one after
                    # a tlast (or the first after reset).
                    in_packet = Signal(name=f"{name}_in_packet")
                    with m.If(tvalid & tready):
                        m.d.sync += in_packet.eq(~tlast)
                    m.d.comb += [
                        port.payload.data.eq(tdata), port.payload.keep.eq(tkeep),
                        port.payload.last.eq(tlast), port.payload.first.eq(~in_packet),
                        port.valid.eq(tvalid), tready.eq(port.ready),
                    ]
                    if hasattr(self, base + "tuser"):
                        m.d.comb += port.payload.abort.eq(getattr(self, base + "tuser"))
                else:
                    m.d.comb += [
                        tdata.eq(port.payload.data), tkeep.eq(port.payload.keep),
                        tlast.eq(port.payload.last), tvalid.eq(port.valid),
                        port.ready.eq(tready),
                    ]
                    if hasattr(self, base + "tuser"):
                        m.d.comb += getattr(self, base + "tuser").eq(port.payload.abort)
            else:
                valid, ready = getattr(self, f"{pre}{name}_valid"), getattr(self, f"{pre}{name}_ready")
                for flat, path, _ in _leaves(layout, ()):
                    outer = getattr(self, f"{pre}{name}_{flat}")
                    inner_field = _get(port.payload, path)
                    if sink:
                        m.d.comb += inner_field.eq(outer)
                    else:
                        m.d.comb += outer.eq(inner_field)
                if sink:
                    m.d.comb += [port.valid.eq(valid), ready.eq(port.ready)]
                else:
                    m.d.comb += [valid.eq(port.valid), port.ready.eq(ready)]
        return m
