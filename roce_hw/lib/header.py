# SPDX-License-Identifier: BSD-2-Clause
"""Generic header inserter and extractor: a choice of header stacks (``variants``) in front of /
taken off a packet stream, at any data width, one beat per cycle.

A *variant* is a tuple of :class:`roce_hw.proto.Header` in wire order, e.g.
``(proto.ETH, proto.IPV4, proto.UDP, proto.BTH, proto.RETH)``. Header values travel on a separate
``hdr`` stream whose ``fields`` member holds every distinct header of every variant
(:func:`header_fields_layout`); only the headers of the transfer's variant matter. All lengths
and offsets come from :mod:`roce_hw.proto` (``Header.size`` and the field lists); the pure-Python
references are in :mod:`roce_hw.model.header`.
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import layouts, proto
from ..config import check_data_width
from .stream import frame_layout, packet_layout

__all__ = ["check_variants", "header_fields_layout", "inserter_hdr_layout",
           "extractor_hdr_layout", "HeaderInserter", "HeaderExtractor"]


def check_variants(variants):
    """Validate ``variants`` and return it as a tuple of tuples of :class:`proto.Header`.

    Raises ``TypeError`` if ``variants`` is not a sequence of sequences of ``proto.Header``, and
    ``ValueError`` if it is empty, a variant is empty, a variant holds the same header twice, or
    two different headers share a name (their ``fields`` keys would collide)."""
    if isinstance(variants, (str, bytes, proto.Header)) or not hasattr(variants, "__iter__"):
        raise TypeError(f"variants must be a sequence of tuples of proto.Header, not {variants!r}")
    result = []
    by_name = {}
    for index, variant in enumerate(variants):
        if isinstance(variant, (str, bytes, proto.Header)) or not hasattr(variant, "__iter__"):
            raise TypeError(f"variant {index} must be a tuple of proto.Header, not {variant!r}")
        variant = tuple(variant)
        if not variant:
            raise ValueError(f"variant {index} has no header")
        for header in variant:
            if not isinstance(header, proto.Header):
                raise TypeError(f"variant {index}: {header!r} is not a proto.Header")
            other = by_name.setdefault(header.name.lower(), header)
            if other is not header:
                raise ValueError(f"two different headers are named {header.name!r}")
        if len(set(map(id, variant))) != len(variant):
            raise ValueError(f"variant {index} holds the same header twice: "
                             + ", ".join(h.name for h in variant))
        result.append(variant)
    if not result:
        raise ValueError("variants must hold at least one variant")
    return tuple(result)


def _distinct_headers(variants):
    seen = {}
    for variant in variants:
        for header in variant:
            seen.setdefault(header.name.lower(), header)
    return seen


def header_fields_layout(variants):
    """``data.StructLayout`` with one :func:`roce_hw.layouts.network_struct` member per distinct
    header of ``variants``, named ``header.name.lower()`` (``"eth"``, ``"ipv4"``, ``"bth"``...)."""
    variants = check_variants(variants)
    return data.StructLayout({name: layouts.network_struct(header)
                              for name, header in _distinct_headers(variants).items()})


def inserter_hdr_layout(variants):
    """Payload of :class:`HeaderInserter`'s ``hdr`` stream: ``{variant, payload, fields}``."""
    variants = check_variants(variants)
    return data.StructLayout({"variant": range(len(variants)), "payload": 1,
                              "fields": header_fields_layout(variants)})


def extractor_hdr_layout(variants, *, abort=False):
    """Payload of :class:`HeaderExtractor`'s ``hdr`` stream:
    ``{variant, payload, short, fields}`` (and ``abort`` with ``abort=True``)."""
    variants = check_variants(variants)
    members = {"variant": range(len(variants)), "payload": 1, "short": 1}
    if abort:
        members["abort"] = 1
    members["fields"] = header_fields_layout(variants)
    return data.StructLayout(members)


def _check_flag(name, value):
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, not {value!r}")
    return value


def _or(terms):
    """OR of a list of 1-bit values (0 for an empty list)."""
    result = C(0, 1)
    for term in terms:
        result = result | term
    return result


class _Geometry:
    """Elaboration-time constants of a set of variants at a data width: header length ``H``,
    pure header beats ``H // N``, realignment shift ``H % N`` (and its index among the distinct
    shifts) per variant."""

    def __init__(self, width, variants):
        self.n = n = width // 8
        self.sizes = [sum(h.size for h in v) for v in variants]
        self.beats = [size // n for size in self.sizes]
        self.shift = [size % n for size in self.sizes]
        self.shifts = sorted(set(self.shift))
        self.shift_index = [self.shifts.index(s) for s in self.shift]
        self.max_beats = max(self.beats)
        # header image: the longest header rounded up to whole beats
        self.image_bytes = n * max(1, -(-max(self.sizes) // n))


def _byte_sources(variant):
    """``[(header key, byte index within that header)]`` of every byte of a variant."""
    return [(header.name.lower(), i) for header in variant for i in range(header.size)]


def _decode_variant(m, variant, count, name):
    """One-hot Signal of ``count`` bits from a variant index."""
    sel = Signal(count, name=name)
    if count == 1:
        m.d.comb += sel.eq(1)
    else:
        for v in range(count):
            m.d.comb += sel[v].eq(variant == v)
    return sel


class HeaderInserter(wiring.Component):
    """Header inserter: puts the header stack of one of several variants in front of a payload
    packet.

    Each ``hdr`` transfer starts one frame on ``o``: the wire bytes of the headers of variant
    ``hdr.variant`` (each header is ``header.pack(fields)``, in the variant's order; ``H`` bytes
    in all), followed by the bytes of one packet taken from ``i`` if ``hdr.payload`` is 1. With
    ``hdr.payload == 0`` the frame is the header alone and nothing is taken from ``i``. The
    frame is exactly ``ceil((H + payload bytes) / (W/8))`` beats. Lanes outside ``keep`` carry
    0 or the input's own lanes outside its ``keep`` (a deterministic function of the inputs; not
    zeroed, to keep the data path at two-three LUT levels).

    The realignment shift ``H mod (W/8)`` is one of at most ``len(variants)`` constants; it is
    registered one-hot with the header, so each output bit is one small multiplexer of the
    header register and the input beat. The header register holds the frame's header in lane
    order and shifts down by one beat per header beat; during the payload its low lanes keep the
    input bytes that spill over into the next output beat.

    Latency: 2 cycles from a ``hdr`` transfer (to an idle inserter) to ``o.valid`` with the first
    beat; 1 cycle from an ``i`` transfer to ``o.valid`` with the output beat that holds its first
    byte.

    Throughput: one beat per cycle; no idle cycle between frames (the next ``hdr`` is taken in
    the cycle the previous frame's last beat is produced, from a one-entry prefetch register
    or straight from the ``hdr`` stream).

    Backpressure: ``o`` is driven from registers (``o.valid`` never depends on ``o.ready``).
    ``i.ready`` is a one-LUT function of ``o.ready`` and registered state; ``hdr.ready`` is
    registered (the prefetch register is empty).

    Parameters
    ----------
    data_width : int
        Bus width in bits, one of :data:`roce_hw.config.DATA_WIDTHS`.
    variants : sequence of tuple of :class:`roce_hw.proto.Header`
        The header stacks; ``hdr.variant`` indexes this sequence.
    abort : bool
        Use :func:`~roce_hw.lib.stream.frame_layout` beats on ``i`` and ``o``: the ``abort`` bit
        of the payload's last beat goes out on the frame's last beat (0 for a frame without
        payload).

    Members
    -------
    hdr : ``In(stream.Signature(inserter_hdr_layout(variants)))``
        One transfer per frame: ``variant`` (``range(len(variants))``), ``payload`` (1 bit: a
        payload packet follows on ``i``), ``fields`` (:func:`header_fields_layout`).
    i : ``In(stream.Signature(packet_layout(W)))`` (``frame_layout(W)`` with ``abort``)
        Payload packets, one per ``hdr`` transfer with ``payload`` = 1, any length >= 1 byte.
    o : ``Out(stream.Signature(...))``, same layout as ``i``
        Frames.

    Raises
    ------
    TypeError, ValueError
        On an unsupported ``data_width`` or malformed ``variants`` (see :func:`check_variants`).
    """

    def __init__(self, data_width, variants, *, abort=False):
        self._width = check_data_width(data_width)
        self._variants = check_variants(variants)
        self._abort = _check_flag("abort", abort)
        beat = frame_layout(data_width) if abort else packet_layout(data_width)
        super().__init__({
            "hdr": In(stream.Signature(inserter_hdr_layout(self._variants))),
            "i": In(stream.Signature(beat)),
            "o": Out(stream.Signature(beat)),
        })

    @property
    def data_width(self):
        return self._width

    @property
    def variants(self):
        return self._variants

    #: Cycles from a ``hdr`` transfer to ``o.valid`` with the frame's first beat (idle inserter).
    latency = 2

    def _ctl_layout(self, geo):
        # therm: pure header beats still to go (thermometer); shift: one-hot realignment shift;
        # tkeep: keep of the tail beat of a frame without payload; pop_now: the next beat is the
        # last one to read the header register; pop_in: that beat also takes an input beat
        return data.StructLayout({"therm": max(1, geo.max_beats), "shift": len(geo.shifts),
                                  "payload": 1, "tkeep": geo.n, "pop_now": 1, "pop_in": 1,
                                  "first": 1})

    def _image(self, m, geo):
        """Header image (lane order, zero padded) and control of the ``hdr`` payload."""
        variants = self._variants
        fields = self.hdr.payload.fields
        sel = _decode_variant(m, self.hdr.payload.variant, len(variants), "port_variant")
        lanes = {}
        for name, header in _distinct_headers(variants).items():
            sig = Signal(header.bits, name=f"port_{name}_lanes")
            m.d.comb += sig.eq(layouts.to_lanes(fields[name], header.size))
            lanes[name] = sig
        sources = [_byte_sources(v) for v in variants]
        image = Signal(geo.image_bytes * 8, name="port_image")
        for b in range(geo.image_bytes):
            by_src = {}
            for v, src in enumerate(sources):
                if b < len(src):
                    by_src.setdefault(src[b], []).append(v)
            if not by_src:
                continue
            if len(by_src) == 1 and len(next(iter(by_src.values()))) == len(variants):
                (key, i), = by_src
                m.d.comb += image.word_select(b, 8).eq(lanes[key].word_select(i, 8))
                continue
            # a multiplexer on the variant index (maps to LUT6 + MUXF7/F8)
            byte = image.word_select(b, 8)
            with m.Switch(self.hdr.payload.variant):
                for (key, i), vs in by_src.items():
                    with m.Case(*vs):
                        m.d.comb += byte.eq(lanes[key].word_select(i, 8))
        ctl = Signal(self._ctl_layout(geo), name="port_ctl")
        pay = self.hdr.payload.payload
        for v in range(len(variants)):
            hb, sh = geo.beats[v], geo.shift[v]
            with m.If(sel[v]):
                m.d.comb += [ctl.therm.eq((1 << hb) - 1),
                             ctl.shift.eq(1 << geo.shift_index[v]),
                             ctl.tkeep.eq((1 << sh) - 1),
                             ctl.pop_now.eq(int(hb == 0 or (hb == 1 and sh == 0))),
                             ctl.pop_in.eq(pay if hb == 0 else 0)]
        m.d.comb += [ctl.payload.eq(pay), ctl.first.eq(1)]
        return image, ctl

    def _prefetch(self, m, geo, load):
        """One-entry prefetch register in front of the header register; returns
        ``(src_valid, src_image, src_ctl)`` (prefetch register, else the ``hdr`` stream)."""
        port_image, port_ctl = self._image(m, geo)
        pf_valid = Signal()
        pf_image = Signal.like(port_image, name="pf_image")
        pf_ctl = Signal.like(port_ctl, name="pf_ctl")
        src_valid = Signal()
        src_image = Signal.like(port_image, name="src_image")
        src_ctl = Signal.like(port_ctl, name="src_ctl")
        m.d.comb += [
            self.hdr.ready.eq(~pf_valid),
            src_valid.eq(pf_valid | self.hdr.valid),
            src_image.eq(Mux(pf_valid, pf_image, port_image)),
            src_ctl.eq(Mux(pf_valid, pf_ctl, port_ctl)),
        ]
        with m.If(pf_valid):
            with m.If(load):
                m.d.sync += pf_valid.eq(0)
        with m.Elif(self.hdr.valid & ~load):
            m.d.sync += [pf_valid.eq(1), pf_image.eq(port_image), pf_ctl.eq(port_ctl)]
        return src_valid, src_image, src_ctl

    def elaborate(self, platform):
        m = Module()
        geo = _Geometry(self._width, self._variants)
        n, w = geo.n, self._width
        shifts = geo.shifts
        smax = max(shifts)
        cur = self.i.payload.data
        keep = self.i.payload.keep

        load = Signal()
        src_valid, src_image, src_ctl = self._prefetch(m, geo, load)

        # header register: the header of the frame being output until its last reader beat
        # (the "pop": last header beat, or the junction beat that also holds the first payload
        # bytes), then already the next frame's
        hd = Signal(geo.image_bytes * 8)
        hd_valid = Signal()
        hc = Signal(self._ctl_layout(geo))
        # after the pop: payload beats (post & ~tph) and the tail beat (post & tph)
        post = Signal()
        tph = Signal()
        tail = Signal(smax * 8)         # input bytes that spill into the next output beat
        t_keep = Signal(n)
        t_abort = Signal()
        # e_sh: one-hot realignment shift of the frame of the next beat that takes input
        # (hc.shift until the pop, then kept until the frame's last input beat); e_all: the next beat takes no input (every lane from
        # the header register or the tail)
        e_sh = Signal(len(shifts))
        e_all = Signal()

        therm0 = hc.therm[0]
        therm1 = hc.therm[1] if len(hc.therm) > 1 else C(0)
        therm2 = hc.therm[2] if len(hc.therm) > 2 else C(0)
        s0 = hc.shift[0] if shifts[0] == 0 else C(0)

        o_load = Signal()
        act = Signal()          # the next beat reads the header register
        produce = Signal()
        pop = Signal()
        spill = Signal()
        p_end = Signal()
        m.d.comb += [
            o_load.eq(~self.o.valid | self.o.ready),
            act.eq(hd_valid & ~post),
            self.i.ready.eq(o_load & ((hd_valid & ~post & hc.pop_in) | (post & ~tph))),
            produce.eq(o_load & ((act & (~hc.pop_in | self.i.valid)) |
                                 (post & (tph | self.i.valid)))),
            pop.eq(o_load & act & hc.pop_now & (~hc.pop_in | self.i.valid)),
            load.eq(src_valid & (~hd_valid | pop)),
            spill.eq(_or([e_sh[x] & keep[n - s] for x, s in enumerate(shifts) if s])),
            p_end.eq(self.i.payload.last & ~spill),
        ]

        beat = self._beat(m, geo, hd, hc, act, post, tph, e_sh, e_all, tail, t_keep, t_abort,
                          p_end, s0, therm1)
        with m.If(o_load):
            m.d.sync += self.o.valid.eq(produce)
            with m.If(produce):
                m.d.sync += self.o.payload.eq(beat)

        # header register
        hd_valid_n = Signal()
        hc_n = Signal.like(hc)
        m.d.comb += [hd_valid_n.eq(hd_valid), hc_n.eq(hc)]
        with m.If(load):
            m.d.comb += [hc_n.eq(src_ctl), hd_valid_n.eq(1)]
            m.d.sync += hd.eq(src_image)
        with m.Elif(pop):
            m.d.comb += hd_valid_n.eq(0)
        with m.Elif(produce & act):         # a pure header beat that is not the last reader
            m.d.comb += [
                hc_n.therm.eq(hc.therm[1:]), hc_n.first.eq(0),
                hc_n.pop_now.eq(Mux(therm1, ~therm2 & s0, 1)),
                hc_n.pop_in.eq(~therm1 & hc.payload),
            ]
            m.d.sync += hd.eq(hd[w:])
        m.d.sync += [hd_valid.eq(hd_valid_n), hc.eq(hc_n)]

        # input beat: the bytes that spill into the next output beat, their keep, zeros above
        spill_data = Signal(smax * 8)
        spill_keep = Signal(n)
        for j in range(smax):
            on = [(x, e_sh[x] & keep[n - s + j]) for x, s in enumerate(shifts) if j < s]
            m.d.comb += [
                spill_data.word_select(j, 8).eq(_or_bytes([
                    cur.word_select(n - shifts[x] + j, 8) & c.replicate(8) for x, c in on])),
                spill_keep[j].eq(_or([c for _, c in on])),
            ]
        with m.If(produce & ~e_all):
            m.d.sync += [tail.eq(spill_data), t_keep.eq(spill_keep)]
            if self._abort:
                m.d.sync += t_abort.eq(self.i.payload.abort)

        # after the pop
        post_n = Signal()
        tph_n = Signal()
        m.d.comb += [post_n.eq(post), tph_n.eq(tph)]
        with m.If(pop):
            with m.If(hc.pop_in):           # junction beat with payload
                m.d.comb += [post_n.eq(~p_end), tph_n.eq(self.i.payload.last & spill)]
            with m.Else():                  # last header beat (shift 0) or header-only tail
                m.d.comb += [post_n.eq(hc.payload & therm0), tph_n.eq(0)]
        with m.Elif(produce & post):
            with m.If(tph | p_end):
                m.d.comb += [post_n.eq(0), tph_n.eq(0)]
            with m.Elif(self.i.payload.last):
                m.d.comb += tph_n.eq(1)
        # e_sh only matters for beats that take input: if the next one is a payload beat after
        # the pop, the shift stays (it is this frame's); otherwise it is the next header's (the
        # tail beat ignores it). "Next beat is a payload beat" needs i.last but not the spill.
        next_p = Signal()
        m.d.comb += next_p.eq((post & ~tph & ~(produce & self.i.payload.last)) |
                              (pop & Mux(hc.pop_in, ~self.i.payload.last,
                                         hc.payload & therm0)))
        m.d.sync += [
            post.eq(post_n), tph.eq(tph_n),
            e_sh.eq(Mux(next_p, e_sh, hc_n.shift)),
        ]
        m.d.comb += e_all.eq((act & ~hc.pop_in) | tph)
        return m

    def _beat(self, m, geo, hd, hc, act, post, tph, e_sh, e_all, tail, t_keep, t_abort, p_end,
              s0, therm1):
        """The output beat being produced (combinational, registered by the caller)."""
        n = geo.n
        shifts = geo.shifts
        smax = max(shifts)
        cur = self.i.payload.data
        keep = self.i.payload.keep
        beat = Signal(self.o.payload.shape(), name="beat")
        data_ = Signal(self._width)
        p_keep = Signal(n)
        for j in range(n):
            # lane j from the header register / tail (below the shift, or every lane of a beat
            # that takes no input), else from input lane j - shift
            lo_lane = Signal(name=f"lo_lane_{j}")
            below = _or([e_sh[x] for x, s in enumerate(shifts) if j < s])
            m.d.comb += lo_lane.eq(e_all | below)
            if j < smax:
                lo_val = Mux(post, tail.word_select(j, 8), hd.word_select(j, 8))
            else:
                lo_val = hd.word_select(j, 8) & (~post).replicate(8)
            cur_val = _or_bytes([cur.word_select(j - s, 8) & e_sh[x].replicate(8)
                                 for x, s in enumerate(shifts) if j >= s])
            m.d.comb += [data_.word_select(j, 8).eq(Mux(lo_lane, lo_val, cur_val)),
                         p_keep[j].eq(below | _or([e_sh[x] & keep[j - s]
                                                   for x, s in enumerate(shifts) if j >= s]))]
        fin_h = Signal()
        m.d.comb += fin_h.eq(act & hc.therm[0] & ~therm1 & s0 & ~hc.payload)
        m.d.comb += [beat.data.eq(data_), beat.first.eq(act & hc.first)]
        with m.If(~e_all):
            m.d.comb += [beat.keep.eq(p_keep), beat.last.eq(p_end)]
            if self._abort:
                m.d.comb += beat.abort.eq(self.i.payload.abort & p_end)
        with m.Elif(tph):
            m.d.comb += [beat.keep.eq(t_keep), beat.last.eq(1)]
            if self._abort:
                m.d.comb += beat.abort.eq(t_abort)
        with m.Elif(hc.therm[0]):
            m.d.comb += [beat.keep.eq((1 << n) - 1), beat.last.eq(fin_h)]
        with m.Else():
            m.d.comb += [beat.keep.eq(hc.tkeep), beat.last.eq(1)]
        return beat


def _or_bytes(terms):
    result = C(0, 8)
    for term in terms:
        result = result | term
    return result


class HeaderExtractor(wiring.Component):
    """Placeholder, defined below."""
