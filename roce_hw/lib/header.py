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

from itertools import combinations

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


def _variant_shape(variants):
    # At least one bit: a single variant would give a zero-width field, which Yosys writes as
    # `wire [-1:0]` (Verilator: LITENDIAN, so the file would not lint clean). Always 0 then.
    return range(max(len(variants), 2))


def inserter_hdr_layout(variants):
    """Payload of :class:`HeaderInserter`'s ``hdr`` stream: ``{variant, payload, fields}``
    (``variant`` is at least one bit wide, 0 with a single variant)."""
    variants = check_variants(variants)
    return data.StructLayout({"variant": _variant_shape(variants), "payload": 1,
                              "fields": header_fields_layout(variants)})


def extractor_hdr_layout(variants, *, abort=False):
    """Payload of :class:`HeaderExtractor`'s ``hdr`` stream:
    ``{variant, payload, short, fields}`` (and ``abort`` with ``abort=True``; ``variant`` is at
    least one bit wide, 0 with a single variant)."""
    variants = check_variants(variants)
    members = {"variant": _variant_shape(variants), "payload": 1, "short": 1}
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
        self.hmax = max(self.sizes)
        # header image: the longest header rounded up to whole beats
        self.image_bytes = n * max(1, -(-self.hmax // n))


def _byte_sources(variant):
    """``[(header key, byte index within that header)]`` of every byte of a variant."""
    return [(header.name.lower(), i) for header in variant for i in range(header.size)]


def _project(index, bits):
    """The value of ``index``'s bits at positions ``bits`` (``bits[0]`` the lowest)."""
    return sum((index >> k & 1) << p for p, k in enumerate(bits))


def _separating_bits(groups, width):
    """The fewest bit positions of a ``width``-bit index on which every two indices of
    different ``groups`` (lists of indices) differ."""
    for size in range(width + 1):
        for bits in combinations(range(width), size):
            codes = [{_project(v, bits) for v in g} for g in groups]
            if all(not (a & b) for a, b in combinations(codes, 2)):
                return bits
    raise AssertionError("indices of different groups are equal")


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
    frame is exactly ``ceil((H + payload bytes) / (W/8))`` beats. Lanes outside ``keep`` are
    don't-care (a deterministic function of the inputs so far; not zeroed, which would cost a LUT
    input on every data bit).

    Structure: the ``hdr`` payload is turned into the variant's header image (lane order, as
    long as the longest header; bytes past the variant's own header are don't-care) and a few
    control bits (realignment shift ``H mod (W/8)``, pure header beats as a thermometer, ...),
    kept in a one-entry prefetch register or loaded straight into the header register. The
    header register shifts down by one beat per pure header beat; its last reader (the last
    header beat, or the junction beat holding the header's end and the first payload bytes)
    frees it for the next frame's header. Payload beats are
    ``Cat(tail[:shift], i.data[:W - shift])``, where the tail register keeps the input bytes that
    spill into the next output beat. The shift is registered as a Gray code of its index among
    the variants' distinct shifts; lanes with the same possible sources (tail, header register,
    input lane ``j - s`` for each shift ``s``) share a select code, so each output bit is one
    LUT6 multiplexer for up to four sources (two LUTs beyond). All outputs are registered.

    With ``lazy`` the header register's only enables are two flip-flops, "a header was taken"
    and "a header beat was produced" one cycle before: it loads from the prefetch register
    (which holds the header taken, or has just caught it from ``hdr``) or shifts a cycle after
    the event, and the output beat reads the header register's first beat through a
    multiplexer that makes up for the lag (the prefetch register's, the register's second or
    its first beat). The handshake then reaches two flip-flops, not the enable of every bit of
    a register many beats long (ECP5: its fan-out was 3 ns of routing). "The next beat takes
    input", of which ``i.ready`` and the tail register's enable are functions, is then a
    flip-flop as well.

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
    lazy : bool or None
        The header register follows the header it stands for a cycle late (see Structure):
        ``None`` (default) where the longest header is at least four beats (64 and 128 bits for
        RoCEv2 headers); with it, "the next beat takes input" is a flip-flop too.

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

    def __init__(self, data_width, variants, *, abort=False, lazy=None):
        self._width = check_data_width(data_width)
        self._variants = check_variants(variants)
        self._abort = _check_flag("abort", abort)
        if lazy is not None:
            _check_flag("lazy", lazy)
        self._lazy = lazy
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
        # scode: the shift as the Gray code of its index in geo.shifts; s0: the shift is 0;
        # pop_now: the next beat is the last one to read the header register; pop_in: that beat
        # also takes an input beat
        return data.StructLayout({"therm": max(1, geo.max_beats),
                                  "shift": len(geo.shifts),
                                  "scode": _code_width(len(geo.shifts)), "s0": 1,
                                  "payload": 1, "pop_now": 1, "pop_in": 1, "first": 1})

    def _image(self, m, geo):
        """Header image (lane order, ``hmax`` bytes) and control of the ``hdr`` payload."""
        variants = self._variants
        fields = self.hdr.payload.fields
        sel = _decode_variant(m, self.hdr.payload.variant, len(variants), "port_variant")
        lanes = {}
        for name, header in _distinct_headers(variants).items():
            sig = Signal(header.bits, name=f"port_{name}_lanes")
            m.d.comb += sig.eq(layouts.to_lanes(fields[name], header.size))
            lanes[name] = sig
        sources = [_byte_sources(v) for v in variants]
        index = self.hdr.payload.variant
        image = Signal(geo.hmax * 8, name="port_image")
        for b in range(geo.hmax):
            # (a byte past a variant's header is never read inside keep: don't-care there)
            by_src = {}
            for v, src in enumerate(sources):
                if b < len(src):
                    by_src.setdefault(src[b], []).append(v)
            byte = image.word_select(b, 8)
            if len(by_src) == 1:
                (key, i), = by_src
                m.d.comb += byte.eq(lanes[key].word_select(i, 8))
                continue
            # a multiplexer on the fewest variant index bits that tell the sources apart
            bits = _separating_bits(list(by_src.values()), len(index))
            sel_bits = Cat(*[index[k] for k in bits])
            ((dkey, di), _), *rest = sorted(by_src.items(), key=lambda kv: -len(kv[1]))
            m.d.comb += byte.eq(lanes[dkey].word_select(di, 8))
            for (key, i), vs in rest:
                codes = sorted({_project(v, bits) for v in vs})
                with m.If(_or([sel_bits == c for c in codes])):
                    m.d.comb += byte.eq(lanes[key].word_select(i, 8))
        ctl = Signal(self._ctl_layout(geo), name="port_ctl")
        pay = self.hdr.payload.payload
        for v in range(len(variants)):
            hb, sh = geo.beats[v], geo.shift[v]
            with m.If(sel[v]):
                m.d.comb += [ctl.therm.eq((1 << hb) - 1),
                             ctl.shift.eq(1 << geo.shift_index[v]),
                             ctl.scode.eq(_gray(geo.shift_index[v])),
                             ctl.s0.eq(int(sh == 0)),
                             ctl.pop_now.eq(int(hb == 0 or (hb == 1 and sh == 0))),
                             ctl.pop_in.eq(pay if hb == 0 else 0)]
        m.d.comb += [ctl.payload.eq(pay), ctl.first.eq(1)]
        return image, ctl

    def _prefetch(self, m, geo, load):
        """One-entry prefetch register in front of the header register; returns
        ``(pf_valid, pf_valid_n, src_valid, src_ctl, pf_image, port_image)`` (``pf_valid_n``:
        ``pf_valid`` in the next cycle): the control comes from the prefetch register if it is
        full, else from the ``hdr`` stream; the image is selected by the caller, as part of the
        header register's own input multiplexer."""
        port_image, port_ctl = self._image(m, geo)
        pf_valid = Signal()
        pf_image = Signal.like(port_image, name="pf_image")
        pf_ctl = Signal.like(port_ctl, name="pf_ctl")
        src_valid = Signal()
        src_ctl = Signal.like(port_ctl, name="src_ctl")
        m.d.comb += [
            self.hdr.ready.eq(~pf_valid),
            src_valid.eq(pf_valid | self.hdr.valid),
            src_ctl.eq(Mux(pf_valid, pf_ctl, port_ctl)),
        ]
        pf_valid_n = Signal()       # pf_valid in the next cycle
        m.d.comb += pf_valid_n.eq(~load & (pf_valid | self.hdr.valid))
        m.d.sync += pf_valid.eq(pf_valid_n)
        with m.If(~pf_valid):
            # the (wide) prefetch register follows the hdr stream while it is empty, so that
            # its enable is the registered ~pf_valid, not the late `load`
            m.d.sync += [pf_image.eq(port_image), pf_ctl.eq(port_ctl)]
        return pf_valid, pf_valid_n, src_valid, src_ctl, pf_image, port_image

    def elaborate(self, platform):
        m = Module()
        geo = _Geometry(self._width, self._variants)
        n = geo.n
        shifts = geo.shifts
        smax = max(shifts)
        cur = self.i.payload.data
        keep = self.i.payload.keep

        load = Signal()
        pf_valid, pf_valid_n, src_valid, src_ctl, pf_image, port_image = \
            self._prefetch(m, geo, load)

        lazy = self._lazy if self._lazy is not None else geo.hmax >= 4 * geo.n
        hd_valid = Signal()
        hc = Signal(self._ctl_layout(geo))
        # after the pop: payload beats (post & ~tph) and the tail beat (post & tph)
        post = Signal()
        tph = Signal()
        tail = Signal(smax * 8)         # input bytes that spill into the next output beat
        t_keep = Signal(n)
        t_abort = Signal()
        # e_code: realignment shift (Gray code of its index in `shifts`) of the frame of the
        # next beat that takes input (hc.scode until the pop, then kept until the frame's last
        # input beat); e_all: the next beat takes no input (every lane from the header register
        # or the tail)
        e_code = Signal(_code_width(len(shifts)))
        # (and one-hot, for the spill and keep terms: Yosys maps the control shallower so)
        e_sh = Signal(len(shifts))
        e_all = Signal()

        therm0 = hc.therm[0]
        therm1 = hc.therm[1] if len(hc.therm) > 1 else C(0)
        therm2 = hc.therm[2] if len(hc.therm) > 2 else C(0)
        s0 = hc.s0

        o_load = Signal()
        # "the next beat takes input" (a pop with payload, or a payload beat after the pop)
        tin = Signal(name="takes_in")
        act = Signal()          # the next beat reads the header register
        produce = Signal()
        pop = Signal()
        spill = Signal()
        p_end = Signal()
        m.d.comb += [
            o_load.eq(~self.o.valid | self.o.ready),
            act.eq(hd_valid & ~post),
            self.i.ready.eq(o_load & tin),
            produce.eq(o_load & ((act & (~hc.pop_in | self.i.valid)) |
                                 (post & (tph | self.i.valid)))),
            pop.eq(o_load & act & hc.pop_now & (~hc.pop_in | self.i.valid)),
            load.eq(src_valid & (~hd_valid | pop)),
            spill.eq(_or([e_sh[x] & keep[n - s] for x, s in enumerate(shifts) if s])),
            p_end.eq(self.i.payload.last & ~spill),
        ]

        # header register: the header of the frame being output until its last reader beat
        # (the "pop": last header beat, or the junction beat that also holds the first payload
        # bytes), then already the next frame's
        hd_valid_n = Signal()
        hc_n = Signal.like(hc)
        m.d.comb += [hd_valid_n.eq(hd_valid), hc_n.eq(hc)]
        # (the image's source is decided by two separate loads, so that the prefetch register
        # takes the hdr stream as it is and each header bit is one multiplexer of its sources)
        # The wide register takes its source whenever it is free (empty, or popped now), valid
        # or not (hd_valid says which): its enable is a function of this block's registers,
        # o.ready and i.valid only, never of the late `hdr.valid` of the header's producer.
        # The enable is "empty, or a header beat produced now" (the pop or a shift), two LUT4
        # levels from registers (a keep wire: the mapper may not fold it into each bit's
        # logic). Whether it takes the next header (from the prefetch register or the port)
        # or shifts is known a cycle ahead: the selects of each bit's multiplexer are
        # flip-flops (~hd_valid | pop_now, and the same & pf_valid, from their next values),
        # so their fan-out to every bit is their only delay (ECP5 timing).
        hd_en = Signal(attrs={"keep": 1})
        hd_take = Signal(init=1)
        take_n = Signal()           # hd_take of the next cycle (below)
        # (its two terms are keep wires too: each is one LUT of registers and the handshake
        # signals of the neighbouring ready-breaks, so the enable is two LUT levels and ABC
        # cannot fold it into shared logic: its fan-out, every header flip-flop, is its delay)
        hd_en_o = Signal(attrs={"keep": 1})
        hd_en_i = Signal(attrs={"keep": 1})
        m.d.comb += [hd_en_o.eq(o_load & ~post), hd_en_i.eq(~hc.pop_in | self.i.valid),
                     hd_en.eq(~hd_valid | (hd_en_o & hd_en_i))]
        # The register itself, one of two forms with the same contract (the header's first
        # beat as it stands for the output; see the docstring's ``lazy``): the only place the
        # two differ but for the timing of `takes_in` (below).
        if lazy:
            hd = self._lazy_register(m, geo, hd_en, hd_take, pf_image)
        else:
            hd = self._eager_register(m, geo, hd_en, hd_take, take_n & pf_valid_n, pf_image,
                                      port_image)

        beat = self._beat(m, geo, hd, hc, act, post, tph, e_code, e_all, tail, t_keep, t_abort,
                          p_end, s0, therm1)
        # (the payload register loads whenever it may: a beat that is not produced is not
        # valid, so `produce` stays off the wide data path's enable)
        with m.If(o_load):
            m.d.sync += [self.o.valid.eq(produce), self.o.payload.eq(beat)]

        # pop_now after a pure header beat that is not the last reader
        shift_pop_now = Mux(therm1, ~therm2 & s0, 1)
        # The control register takes its source whenever the header register is free (empty,
        # or popped now), valid or not, like the wide register: hd_valid says which, and no
        # control bit waits on the late `hdr.valid` of the header's producer (ECP5 timing). A
        # control register without a header is read by nothing.
        free = Signal()
        m.d.comb += free.eq(~hd_valid | pop)
        with m.If(free):
            m.d.comb += [hc_n.eq(src_ctl), hd_valid_n.eq(src_valid)]
        with m.Elif(produce & act):         # a pure header beat that is not the last reader
            m.d.comb += [
                hc_n.therm.eq(hc.therm[1:]), hc_n.first.eq(0),
                hc_n.pop_now.eq(shift_pop_now),
                hc_n.pop_in.eq(~therm1 & hc.payload),
            ]
        m.d.sync += [hd_valid.eq(hd_valid_n), hc.eq(hc_n)]
        # the next cycle's take (~hd_valid | pop_now of the next cycle), from the conditions
        # themselves rather than from hc_n: hc_n then has the control register as its only
        # user, and the control register keeps its enable (4 levels, not 5, at 512 bits)
        with m.If(load):
            m.d.comb += take_n.eq(src_ctl.pop_now)
        with m.Elif(pop):
            m.d.comb += take_n.eq(1)
        with m.Elif(produce & act):
            m.d.comb += take_n.eq(shift_pop_now)
        with m.Else():
            m.d.comb += take_n.eq(~hd_valid | hc.pop_now)
        m.d.sync += hd_take.eq(take_n)

        # input beat: the bytes that spill into the next output beat and their keep
        spill_data = Signal(smax * 8)
        spill_keep = Signal(n)
        for j in range(smax):
            # (the data is not masked by keep: lanes outside t_keep are don't-care)
            m.d.comb += [
                spill_data.word_select(j, 8).eq(_select(e_code, [
                    cur.word_select(n - s + j, 8) if j < s else None for s in shifts])),
                spill_keep[j].eq(_or([e_sh[x] & keep[n - s + j]
                                      for x, s in enumerate(shifts) if j < s])),
            ]
        # (an input transfer, `i.valid & i.ready`: a produced beat that takes input)
        with m.If(self.i.valid & o_load & tin):
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
        # e_code only matters for beats that take input: if the next one is a payload beat after
        # the pop, the shift stays (it is this frame's); otherwise it is the next header's (the
        # tail beat ignores it). "Next beat is a payload beat" needs i.last but not the spill.
        next_p = Signal()
        m.d.comb += next_p.eq((post & ~tph & ~(produce & self.i.payload.last)) |
                              (pop & Mux(hc.pop_in, ~self.i.payload.last,
                                         hc.payload & therm0)))
        m.d.sync += [post.eq(post_n), tph.eq(tph_n)]

        def takes_in(hd_valid, post, tph, pop_in):
            return (hd_valid & ~post & pop_in) | (post & ~tph)
        if lazy:
            # a flip-flop loaded from the next values of the registers it is a function of:
            # i.ready and the tail's enable (an input transfer) are then one LUT of registers
            # and i.valid (ECP5 timing: four LUTs from i.valid to the tail's enable). Its input
            # cone is deeper than the function itself (Yosys xcup: 5 levels at 256 and 512
            # bits, where the inserter keeps 4 without it), so only where the header is long.
            m.d.sync += tin.eq(takes_in(hd_valid_n, post_n, tph_n, hc_n.pop_in))
        else:
            m.d.comb += tin.eq(takes_in(hd_valid, post, tph, hc.pop_in))
        m.d.sync += [
            e_code.eq(Mux(next_p, e_code, hc_n.scode)),
            e_sh.eq(Mux(next_p, e_sh, hc_n.shift)),
        ]
        m.d.comb += e_all.eq((act & ~hc.pop_in) | tph)
        return m

    @staticmethod
    def _eager_register(m, geo, en, take, take_pf_n, pf_image, port_image):
        """The header register, loaded or shifted in the cycle of its event (``en``): the
        next frame's header from the prefetch register or the ``hdr`` port (``take``, and
        ``take_pf_n``: the next cycle's "take it from the prefetch register", registered here),
        or its next beat. Returns its first beat (a register)."""
        w = geo.n * 8
        hd = Signal(geo.hmax * 8, name="hd")   # (a byte past the longest header would be 0)
        take_pf = Signal(name="hd_take_pf")
        m.d.sync += take_pf.eq(take_pf_n)
        # The If/Elif form of hd_next maps to one LUT per bit (a nested Mux measured two).
        hd_next = Signal.like(hd)
        with m.If(~take):
            m.d.comb += hd_next.eq(hd[w:])
        with m.Elif(take_pf):
            m.d.comb += hd_next.eq(pf_image)
        with m.Else():
            m.d.comb += hd_next.eq(port_image)
        with m.If(en):
            m.d.sync += hd.eq(hd_next)
        return hd[:min(geo.hmax, geo.n) * 8]

    @staticmethod
    def _lazy_register(m, geo, en, take, pf_image):
        """The header register a cycle behind its events: the events of this cycle (``en``
        with ``take``: load the next header; without: shift) are applied in the next, so its
        enables and its multiplexer's select are two flip-flops (the prefetch register holds a
        header taken from it through the next cycle, and catches one taken from ``hdr`` as it is
        taken: either way the next cycle's header is the prefetch register's). Returns the
        header's first beat as it stands (a multiplexer that makes up for the lag)."""
        w = geo.n * 8
        reg = Signal(geo.hmax * 8, name="hd_reg")
        took = Signal(name="hd_took")
        shifted = Signal(name="hd_shifted")
        m.d.sync += [took.eq(en & take), shifted.eq(en & ~take)]
        with m.If(took):
            m.d.sync += reg.eq(pf_image)
        with m.Elif(shifted):
            m.d.sync += reg.eq(reg[w:])
        lo = min(geo.hmax, geo.n) * 8
        hd = Signal(lo, name="hd")
        m.d.comb += hd.eq(Mux(took, pf_image[:lo], Mux(shifted, reg[w:w + lo], reg[:lo])))
        return hd

    def _beat(self, m, geo, hd, hc, act, post, tph, e_code, e_all, tail, t_keep, t_abort, p_end,
              s0, therm1):
        """The output beat being produced (combinational, registered by the caller)."""
        n = geo.n
        shifts = geo.shifts
        smax = max(shifts)
        keep = self.i.payload.keep
        beat = Signal(self.o.payload.shape(), name="beat")
        # Lane j of the data comes from the tail (j < smax), the header register (j < hmax) or
        # input lane j - s (every shift s <= j). Lanes with the same sources form a run that
        # shares one select code (a LUT of registers), so that each data bit is one multiplexer
        # (a LUT6 for up to four sources); lanes outside keep are don't-care, keep is exact.
        data_ = Signal(self._width)
        keep_ = Signal(n)
        cur = self.i.payload.data
        runs = {}
        for j in range(n):
            key = (j < smax, j < geo.hmax, sum(s <= j for s in shifts))
            runs.setdefault(key, []).append(j)
        for (has_tail, has_hd, n_cur), lanes in runs.items():
            first = lanes[0]
            # the frame's shift is above these lanes: they come from the tail or header register
            below = Signal(name=f"below_{first}")
            m.d.comb += below.eq(_or([e_code == _gray(x) for x in range(n_cur, len(shifts))]))
            # the header register's lanes are in keep in a pure header beat, and below the
            # shift (the header's end in a junction beat or a header-only frame's last beat)
            hd_keep = Signal(name=f"hd_keep_{first}")
            m.d.comb += hd_keep.eq(hc.therm[0] | below)
            sources = []            # (condition, lane j -> (data byte, keep bit))
            if has_tail:
                sources.append((post & (tph | below),
                                lambda j: (tail.word_select(j, 8), t_keep[j])))
            if has_hd:
                sources.append((act & (~hc.pop_in | below),
                                lambda j, k=hd_keep: (hd.word_select(j, 8), k)))
            for x in range(n_cur):
                sources.append((~e_all & (e_code == _gray(x)),
                                lambda j, s=shifts[x]: (cur.word_select(j - s, 8), keep[j - s])))
            # keep is exact: 0 where the beat has no source for the lane (the data is don't-care)
            kill = Signal(name=f"kill_{first}")
            m.d.comb += kill.eq(_or(([] if has_tail else [tph]) +
                                    ([] if has_hd else [act & ~hc.pop_in])))
            if len(sources) > 4 and len(sources) > n_cur:
                # too many for one LUT6: the input lanes by the registered shift, then that or
                # the tail / header register (two LUTs, two levels)
                lo = Signal(name=f"lo_{first}")
                m.d.comb += lo.eq(e_all | below)
                lo_src = [f for c, f in sources[:len(sources) - n_cur]]
                cur_src = [f for c, f in sources[len(sources) - n_cur:]]
                for j in lanes:
                    lo_pairs = [f(j) for f in lo_src]
                    cur_pairs = [f(j) for f in cur_src]
                    if len(lo_pairs) == 1:
                        lo_d, lo_k = lo_pairs[0]
                    else:           # (tail, header register)
                        lo_d = Mux(post, lo_pairs[0][0], lo_pairs[1][0])
                        lo_k = Mux(post, lo_pairs[0][1], lo_pairs[1][1])
                    m.d.comb += [
                        data_.word_select(j, 8).eq(Mux(lo, lo_d, _select(
                            e_code, [d for d, _ in cur_pairs]))),
                        keep_[j].eq(Mux(lo, lo_k, _select(e_code, [k for _, k in cur_pairs]))
                                    & ~kill),
                    ]
                continue
            # (a keep wire: the select is computed once per run, not re-derived in each bit's
            # LUT chain)
            code = Signal(_code_width(len(sources)), name=f"sel_{first}", attrs={"keep": 1})
            if len(sources) == n_cur:
                # input lanes only (the others are outside keep when no input is taken)
                m.d.comb += code.eq(e_code)
            else:
                for b in range(len(code)):
                    m.d.comb += code[b].eq(_or([c for k, (c, _) in enumerate(sources)
                                                if _gray(k) >> b & 1]))
            for j in lanes:
                pairs = [f(j) for _, f in sources]
                m.d.comb += [data_.word_select(j, 8).eq(_select(code, [d for d, _ in pairs])),
                             keep_[j].eq(_select(code, [k for _, k in pairs]) & ~kill)]
        fin_h = Signal()
        m.d.comb += fin_h.eq(act & hc.therm[0] & ~therm1 & s0 & ~hc.payload)
        m.d.comb += [beat.data.eq(data_), beat.keep.eq(keep_), beat.first.eq(act & hc.first)]
        with m.If(~e_all):
            m.d.comb += beat.last.eq(p_end)
            if self._abort:
                m.d.comb += beat.abort.eq(self.i.payload.abort & p_end)
        with m.Elif(tph):
            m.d.comb += beat.last.eq(1)
            if self._abort:
                m.d.comb += beat.abort.eq(t_abort)
        with m.Elif(hc.therm[0]):
            m.d.comb += beat.last.eq(fin_h)
        with m.Else():
            m.d.comb += beat.last.eq(1)
        return beat


def _code_width(count):
    """Bits of a binary select code among ``count`` sources (at least 1)."""
    return max(1, (count - 1).bit_length())


def _gray(index):
    """Gray code of ``index``."""
    return index ^ (index >> 1)


def _select(code, values):
    """Multiplexer tree: ``values[k]`` where ``code`` is the Gray code of ``k``; ``None`` entries
    are don't-care (filled from an entry whose code differs in one bit, the highest possible, so
    the tree ignores that bit).

    (Gray order: the 2:1 multiplexers of one tree pair their sources in alternating order, so
    that Yosys/ABC does not share one between lanes whose shifts differ by the same amount, which
    would cost a second LUT in each of them.)"""
    size = 1 << len(code)
    leaves = [None] * size
    for k, v in enumerate(values):
        leaves[_gray(k)] = v
    while any(v is None for v in leaves) and any(v is not None for v in leaves):
        for i in range(size):
            if leaves[i] is None:
                for b in reversed(range(len(code))):
                    if leaves[i ^ (1 << b)] is not None:
                        leaves[i] = leaves[i ^ (1 << b)]
                        break
    leaves = [C(0) if v is None else v for v in leaves]
    for b in range(len(code)):
        leaves = [Mux(code[b], leaves[k + 1], leaves[k]) for k in range(0, len(leaves), 2)]
    return leaves[0]


def _or_bytes(terms):
    result = C(0, 8)
    for term in terms:
        result = result | term
    return result


class HeaderExtractor(wiring.Component):
    """Header extractor: splits each frame into its header fields and its payload.

    Each frame on ``i`` gives one ``hdr`` transfer and, if it has payload bytes, one payload
    packet on ``o`` (the bytes after the header, realigned to lane 0). The variant is chosen by
    ``classify`` from the headers that all variants start with (their common prefix), decoded
    from the frame; with a single variant no ``classify`` is needed.

    The ``hdr`` transfer of a frame is offered when the beat holding the end of its header is
    processed, i.e. before (or in the same cycle as) its first payload beat: a consumer may wait
    for ``hdr`` before it takes the payload. ``hdr.payload`` is 0 for a frame that is exactly
    the header; ``hdr.short`` is 1 for a frame shorter than its header (or than the common
    prefix): then no payload packet follows, the rest of the frame is dropped, and only the
    fields that arrived are meaningful (``variant`` too is meaningless if the frame ended inside
    the common prefix). With ``abort=True`` the ``abort`` bit of a frame's last beat goes to the
    payload's last beat, or, if the frame ends inside or exactly at the end of its header, to
    ``hdr.abort``.

    Structure: every input beat is written into a capture register (beat ``b`` of a frame at
    lanes ``b * W/8``...) and passes two beat registers. The variant is classified from the
    capture register when the beat completing the common prefix moves into the second register;
    the second register's beat is then a pure header beat (dropped), the junction beat (header
    end: ``hdr`` is emitted) or a payload beat; payload beats leave as
    ``Cat(r2[shift:], r1[:shift])`` with the variant's registered one-hot shift ``H mod (W/8)``.

    Latency: 3 cycles from an ``i`` transfer to ``o.valid`` / ``hdr.valid`` for the beat it
    completes (when the following beat is already there or the frame ends).

    Throughput: one input beat per cycle, no idle cycle between frames (as long as ``hdr`` and
    ``o`` are taken).

    Backpressure: ``o`` and ``hdr`` are driven from registers. ``i.ready`` is a function of
    ``o.ready``, ``hdr.ready`` and registered state.

    Parameters
    ----------
    data_width : int
        Bus width in bits, one of :data:`roce_hw.config.DATA_WIDTHS`.
    variants : sequence of tuple of :class:`roce_hw.proto.Header`
    classify : callable ``classify(m, fields) -> Value``, optional
        Required with more than one variant. ``fields`` is a ``data.View`` of
        :func:`header_fields_layout` where the headers of the common prefix are valid (the
        others read 0); the returned value is the variant index (out of range: undefined).
        It is evaluated on registers and its result is registered.
    abort : bool
        Use :func:`~roce_hw.lib.stream.frame_layout` beats on ``i`` and ``o`` and add ``abort``
        to ``hdr``.

    Members
    -------
    i : ``In(stream.Signature(packet_layout(W)))`` (``frame_layout(W)`` with ``abort``)
        Frames.
    hdr : ``Out(stream.Signature(extractor_hdr_layout(variants, abort=abort)))``
        One transfer per frame: ``variant``, ``payload``, ``short``, [``abort``], ``fields``.
    o : ``Out(stream.Signature(...))``, same layout as ``i``
        Payload packets (frames with ``hdr.payload`` = 1).

    Raises
    ------
    TypeError, ValueError
        Bad ``data_width``, ``variants``, ``abort``, or a missing/non-callable ``classify``.
    """

    #: Cycles from the ``i`` transfer of a beat to ``o.valid`` with the output beat it ends.
    latency = 3

    def __init__(self, data_width, variants, *, classify=None, abort=False):
        self._width = check_data_width(data_width)
        self._variants = check_variants(variants)
        self._abort = _check_flag("abort", abort)
        if classify is not None and not callable(classify):
            raise TypeError(f"classify must be callable, not {classify!r}")
        if classify is None and len(self._variants) > 1:
            raise ValueError("several variants need a classify function")
        self._classify = classify
        beat = frame_layout(data_width) if abort else packet_layout(data_width)
        super().__init__({
            "i": In(stream.Signature(beat)),
            "hdr": Out(stream.Signature(extractor_hdr_layout(self._variants, abort=abort))),
            "o": Out(stream.Signature(beat)),
        })

    @property
    def data_width(self):
        return self._width

    @property
    def variants(self):
        return self._variants

    def _classify_variant(self, m, geo, cap, prefix):
        """One-hot variant from the capture register (comb)."""
        nv = len(self._variants)
        cls = Signal(nv, name="cls")
        if nv == 1:
            m.d.comb += cls.eq(1)
            return cls
        view = Signal(header_fields_layout(self._variants), name="cls_fields")
        pos = 0
        for header in prefix:
            lanes = cap[pos * 8:(pos + header.size) * 8]
            m.d.comb += view[header.name.lower()].eq(layouts.from_lanes(lanes, header.size))
            pos += header.size
        index = Signal(range(nv), name="cls_index")
        m.d.comb += index.eq(self._classify(m, view))
        for v in range(nv):
            m.d.comb += cls[v].eq(index == v)
        return cls

    def _fields(self, m, geo, raw, fv):
        """``fields`` of the hdr stream from the header snapshot ``raw`` and one-hot ``fv``."""
        layout = header_fields_layout(self._variants)
        out = Signal(layout, name="x_fields")
        offsets = {}
        for v, variant in enumerate(self._variants):
            pos = 0
            for header in variant:
                offsets.setdefault(header.name.lower(), []).append((v, pos))
                pos += header.size
        for name, header in _distinct_headers(self._variants).items():
            lanes = Signal(header.bits, name=f"x_{name}_lanes")
            by_off = {}
            for v, off in offsets[name]:
                by_off.setdefault(off, []).append(v)
            for i in range(header.size):
                if len(by_off) == 1:
                    (off, _), = by_off.items()
                    m.d.comb += lanes.word_select(i, 8).eq(raw.word_select(off + i, 8))
                else:
                    m.d.comb += lanes.word_select(i, 8).eq(_or_bytes([
                        raw.word_select(off + i, 8) & _or([fv[v] for v in vs]).replicate(8)
                        for off, vs in by_off.items()]))
            m.d.comb += out[name].eq(layouts.from_lanes(lanes, header.size))
        return out

    def elaborate(self, platform):
        m = Module()
        geo = _Geometry(self._width, self._variants)
        n, w = geo.n, self._width
        nv = len(self._variants)
        shifts = geo.shifts
        cb = geo.image_bytes // n                   # beats captured per frame
        prefix = proto.common_prefix(self._variants) if nv > 1 else ()
        pb = max(0, sum(h.size for h in prefix) - 1) // n   # beat completing the prefix
        beat_layout = self.i.payload.shape()

        # --- input: capture register and first beat register
        ipos = Signal(cb + 1, init=1)               # one-hot index of the next input beat
        cap = Signal(geo.image_bytes * 8)
        r1 = Signal(beat_layout)
        r1v = Signal()
        r1pos = Signal(cb + 1)
        adv1 = Signal()
        m.d.comb += self.i.ready.eq(~r1v | adv1)
        take = Signal()
        m.d.comb += take.eq(self.i.valid & self.i.ready)
        with m.If(take):
            m.d.sync += [r1.eq(self.i.payload), r1pos.eq(ipos),
                         ipos.eq(Mux(self.i.payload.last, 1,
                                     Cat(C(0, 1), ipos[:cb - 1], ipos[cb - 1] | ipos[cb])))]
            for q in range(cb):
                with m.If(ipos[q]):
                    m.d.sync += cap.word_select(q, w).eq(self.i.payload.data)
        with m.If(take):
            m.d.sync += r1v.eq(1)
        with m.Elif(adv1):
            m.d.sync += r1v.eq(0)

        # --- classification and roles, registered as a beat moves from r1 to r2
        cls = self._classify_variant(m, geo, cap, prefix)
        fv = Signal(nv, init=1)     # one-hot variant of the frame in r2
        fs = Signal(len(shifts), init=1)            # its one-hot shift
        hraw = Signal(geo.image_bytes * 8)          # header snapshot
        r2 = Signal(beat_layout)
        r2v = Signal()
        j2 = Signal()               # r2 is the junction beat (holds the header's end)
        h2 = Signal()               # r2 is a pure header beat
        adv2 = Signal()
        m.d.comb += adv1.eq(r1v & (~r2v | adv2))
        at_pb = r1pos[pb]
        j_n = Signal()
        h_n = Signal()
        fs_cls = Signal(len(shifts))
        for x in range(len(shifts)):
            m.d.comb += fs_cls[x].eq(_or([cls[v] for v in range(nv) if geo.shift_index[v] == x]))
        with m.If(at_pb):
            m.d.comb += [
                j_n.eq(_or([cls[v] for v in range(nv) if geo.beats[v] == pb])),
                h_n.eq(_or([cls[v] for v in range(nv) if geo.beats[v] > pb])),
            ]
        with m.Elif(_or([r1pos[q] for q in range(pb)])):
            m.d.comb += h_n.eq(1)
        with m.Else():
            m.d.comb += [
                j_n.eq(_or([fv[v] & r1pos[geo.beats[v]] for v in range(nv)])),
                h_n.eq(_or([fv[v] & _or([r1pos[q] for q in range(geo.beats[v])])
                            for v in range(nv)])),
            ]
        with m.If(adv1):
            m.d.sync += [r2.eq(r1), j2.eq(j_n), h2.eq(h_n), r2v.eq(1)]
            with m.If(at_pb):
                m.d.sync += [fv.eq(cls), fs.eq(fs_cls)]
            with m.If(~r1pos[cb]):
                m.d.sync += hraw.eq(cap)
        with m.Elif(adv2):
            m.d.sync += r2v.eq(0)

        # --- the beat in r2
        def at_shift(keep, delta):
            """keep[s + delta] for the frame's shift s (1 below lane 0, 0 above the beat)."""
            terms = []
            for x, s in enumerate(shifts):
                lane = s + delta
                if lane < 0:
                    terms.append(fs[x])
                elif lane < n:
                    terms.append(fs[x] & keep[lane])
            return _or(terms)

        k2s = Signal()              # r2 has a byte at lane s (payload bytes in it)
        k2s1 = Signal()             # r2 has a byte at lane s - 1 (the whole header in it)
        k1s = Signal()              # r1 has a byte at lane s (not all in this output beat)
        s_zero = fs[0] if shifts[0] == 0 else C(0)
        m.d.comb += [
            k2s.eq(at_shift(r2.keep, 0)),
            k2s1.eq(at_shift(r2.keep, -1)),
            k1s.eq(at_shift(r1.keep, 0)),
        ]
        short = Signal()
        hdr_evt = Signal()
        out_evt = Signal()
        need_r1 = Signal()
        o_free = Signal()
        h_free = Signal()
        m.d.comb += [
            short.eq(r2.last & (h2 | (j2 & ~k2s1))),
            hdr_evt.eq(j2 | (h2 & r2.last)),
            out_evt.eq(~h2 & (~r2.last | k2s)),
            need_r1.eq(~h2 & ~r2.last & ~s_zero),
            o_free.eq(~self.o.valid | self.o.ready),
            h_free.eq(~self.hdr.valid | self.hdr.ready),
            adv2.eq(r2v & (~need_r1 | r1v) & (~hdr_evt | h_free) & (~out_evt | o_free)),
        ]

        # hdr
        fields = self._fields(m, geo, hraw, fv)
        variant = Signal(_variant_shape(self._variants))
        for v in range(1, nv):
            with m.If(fv[v]):
                m.d.comb += variant.eq(v)
        with m.If(h_free):
            m.d.sync += self.hdr.valid.eq(adv2 & hdr_evt)
        with m.If(adv2 & hdr_evt):
            m.d.sync += [
                self.hdr.payload.variant.eq(variant),
                self.hdr.payload.payload.eq(j2 & (~r2.last | k2s)),
                self.hdr.payload.short.eq(short),
                self.hdr.payload.fields.eq(fields),
            ]
            if self._abort:
                m.d.sync += self.hdr.payload.abort.eq(r2.last & r2.abort)

        # payload beat: Cat(r2[s:], r1[:s])
        data_ = Signal(w)
        keep_ = Signal(n)
        for j in range(n):
            d_terms, k_terms = [], []
            for x, s in enumerate(shifts):
                if j + s < n:
                    d_terms.append(r2.data.word_select(j + s, 8) & fs[x].replicate(8))
                    k_terms.append(fs[x] & r2.keep[j + s])
                else:
                    d_terms.append(r1.data.word_select(j + s - n, 8) & fs[x].replicate(8))
                    k_terms.append(fs[x] & ~r2.last & r1.keep[j + s - n])
            m.d.comb += [data_.word_select(j, 8).eq(_or_bytes(d_terms)),
                         keep_[j].eq(_or(k_terms))]
        o_last = Signal()
        m.d.comb += o_last.eq(r2.last | (r1.last & ~k1s))
        with m.If(o_free):
            m.d.sync += self.o.valid.eq(adv2 & out_evt)
        with m.If(adv2 & out_evt):
            m.d.sync += [
                self.o.payload.data.eq(data_), self.o.payload.keep.eq(keep_),
                self.o.payload.first.eq(j2), self.o.payload.last.eq(o_last),
            ]
            if self._abort:
                m.d.sync += self.o.payload.abort.eq(Mux(r2.last, r2.abort, r1.abort & o_last))
        return m
