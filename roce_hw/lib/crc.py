# SPDX-License-Identifier: BSD-2-Clause
"""CRC-32 (reflected, ``zlib.crc32``) GF(2) matrices derived from the bit-serial definition, and a
pipelined wide :class:`CRC32` component with byte-granular ``keep``.

Matrix convention
-----------------
The CRC register ``r`` is 32 bits in the *reflected* domain of ``zlib``/Linux ``crc32_le``: one
data bit ``b`` (bytes LSB first, wire byte 0 first) updates it as
``r = (r >> 1) ^ (POLY if (r ^ b) & 1 else 0)``. This is linear over GF(2) in ``(r, data)``, so
``nbits`` data bits map ``r`` to ``A r ^ B d``. Matrices are stored as **rows**: a list of 32
Python integers; output bit ``i`` is the parity of ``vector & rows[i]``. Every matrix is derived
here by linearity from the bit-serial step (:func:`step_matrices`), never written by hand.
``zlib.crc32(msg) == ~r`` after processing ``msg`` from ``r = 0xFFFFFFFF``.
"""

import functools

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..config import check_data_width
from .stream import PacketSignature

__all__ = [
    "POLY", "CRC_INIT", "crc_bits", "step_matrices", "update_rows", "advance", "advance_rows", "apply_rows",
    "rows_mul", "residue_register", "xor_rows", "thermometer_count", "empty_lanes",
    "data_term_partials",
    "revert_stages", "rewind_product",
    "CRC32",
]

#: Reflected CRC-32 polynomial (0x04C11DB7 bit-reversed).
POLY = 0xEDB88320
#: Register value before the first bit (``zlib.crc32`` starts from ``~0``).
CRC_INIT = 0xFFFFFFFF
_MASK = 0xFFFFFFFF


def _step(r):
    """One zero data bit through the register (the ``A`` of a single bit)."""
    return (r >> 1) ^ (POLY if r & 1 else 0)


def _unstep(r):
    """Inverse of :func:`_step` (bit 31 of POLY is set, so the shifted-out bit is recoverable)."""
    low = r >> 31
    return (((r ^ (POLY if low else 0)) << 1) & _MASK) | low


def crc_bits(state, data, nbits):
    """Bit-serial reference: register ``state`` after ``nbits`` bits of ``data`` (bit 0 first)."""
    for k in range(nbits):
        state = (state >> 1) ^ (POLY if (state ^ (data >> k)) & 1 else 0)
    return state


def _cols_to_rows(cols):
    return [sum(((c >> i) & 1) << j for j, c in enumerate(cols)) for i in range(32)]


@functools.lru_cache(maxsize=None)
def step_matrices(nbits):
    """``(a_rows, b_rows)`` with ``crc_bits(r, d, nbits) == apply_rows(a_rows, r) ^
    apply_rows(b_rows, d)``, derived column by column from the bit-serial step by linearity:
    column ``j`` of ``A`` is the image of state bit ``j``; data bit ``k`` alone (from a zero state)
    gives ``POLY`` followed by ``nbits - 1 - k`` zero steps."""
    if nbits < 1:
        raise ValueError(f"nbits must be positive, not {nbits}")
    a_cols = [advance(1 << j, nbits) for j in range(32)]
    b_cols = [0] * nbits
    v = POLY
    for k in reversed(range(nbits)):
        b_cols[k] = v
        v = _step(v)
    return tuple(_cols_to_rows(a_cols)), tuple(_cols_to_rows(b_cols))


def update_rows(nbits):
    """Rows of the whole update ``crc_bits(r, d, nbits)`` as one matrix over ``Cat(r, d)``
    (register bits 0-31, then the ``nbits`` data bits): ``apply_rows(update_rows(n), r | d << 32)
    == crc_bits(r, d, n)``. One parity per register bit, for a narrow (byte-serial) CRC register
    such as the 1G MAC's (:mod:`roce_hw.mac`)."""
    a_rows, b_rows = step_matrices(nbits)
    return [a | (b << 32) for a, b in zip(a_rows, b_rows)]


def advance(state, nbits):
    """Register ``state`` after ``nbits`` zero bits; a negative ``nbits`` rewinds."""
    for _ in range(abs(nbits)):
        state = _step(state) if nbits > 0 else _unstep(state)
    return state


def advance_rows(nbits):
    """Rows of the matrix that advances the register by ``nbits`` zero bits (negative: rewind)."""
    return _cols_to_rows([advance(1 << j, nbits) for j in range(32)])


def apply_rows(rows, vector):
    """Matrix-vector product over GF(2) for a rows-matrix and an integer ``vector``."""
    return sum((bin(vector & r).count("1") & 1) << i for i, r in enumerate(rows))


def residue_register():
    """Register value after a message followed by its own CRC (little-endian): a constant
    (``~0x2144DF1C`` in ``zlib`` terms), derived here from the definition."""
    msg = b"\x5a"
    crc = ~crc_bits(CRC_INIT, msg[0], 8) & _MASK
    return crc_bits(crc_bits(CRC_INIT, msg[0], 8), crc, 32)


# --- hardware helpers ------------------------------------------------------------------------

def xor_rows(m, rows, vector, name, const=0):
    """Add to ``m.d.comb`` and return a named ``Signal(32)``: bit ``i`` = parity of
    ``vector & rows[i]`` XOR bit ``i`` of the constant ``const``."""
    out = Signal(32, name=name)
    bits = []
    for i, r in enumerate(rows):
        term = (vector & r).xor() if r else C(0, 1)
        bits.append(~term if (const >> i) & 1 else term)
    m.d.comb += out.eq(Cat(*bits))
    return out


def thermometer_count(m, therm, name):
    """Number of ones of a thermometer code ``therm`` (ones contiguous from bit 0), as a named
    Signal; each output bit is an OR of ANDs (no adder), about 3 LUT levels at 64 lanes."""
    n = len(therm)
    width = n.bit_length()
    out = Signal(width, name=name)
    bits = []
    for b in range(width):
        terms = []
        period = 1 << (b + 1)
        for lo in range(1 << b, n + 1, period):
            hi = lo + (1 << b)          # count in [lo, hi) has bit b set
            t = therm[lo - 1]
            if hi - 1 < n:
                t = t & ~therm[hi - 1]
            terms.append(t)
        bits.append(Cat(*terms).any() if terms else C(0, 1))
    m.d.comb += out.eq(Cat(*bits))
    return out


def empty_lanes(m, keep, name):
    """Number of lanes without ``keep`` (a keep contiguous from bit 0) as a named Signal: the
    zero bytes padding a partial last beat, which the rewind stages take back."""
    n = len(keep)
    zeros = Signal(n, name=f"{name}_zeros")
    m.d.comb += zeros.eq(Cat(*[~keep[n - 1 - j] for j in range(n)]))
    return thermometer_count(m, zeros, name)


def _default_chunk(width):
    """Data bits per first-stage partial XOR: about 32 matrix ones per output bit, 3 LUT levels."""
    return 64


def data_term_partials(m, en, vector, rows, chunk, name):
    """Register ``len(vector) // chunk`` partial data terms (one 32-bit XOR per chunk) when ``en``;
    returns the list of registered Signals. The XOR of all of them is ``rows * vector``."""
    parts = []
    for c in range(len(vector) // chunk):
        lo = c * chunk
        sub = [(r >> lo) & ((1 << chunk) - 1) for r in rows]
        comb = xor_rows(m, sub, vector[lo:lo + chunk], f"{name}_x{c}")
        reg = Signal(32, name=f"{name}_p{c}", reset_less=True)
        with m.If(en):
            m.d.sync += reg.eq(comb)
        parts.append(reg)
    return parts


def rows_mul(left, right):
    """Rows of the GF(2) product ``left * right`` (both rows-matrices)."""
    out = []
    for r in left:
        acc = 0
        for k in range(len(right)):
            if (r >> k) & 1:
                acc ^= right[k]
        out.append(acc)
    return out


def _gated_group(m, x, sels, combos, name, *, lut_groups=False):
    """``combos[c] * x`` for ``c`` = the select bits ``sels``, as a gated parity per bit.

    ``lut_groups``: the terms of each output bit are first gathered in groups of ``6 - g``
    (one 6-input function each: ``g`` selects and ``6 - g`` data bits), each a ``keep`` wire so
    that ABC maps it as one LUT; the groups then meet in a parity tree. Without it ABC maps the
    ``g >= 3`` select functions in chains of LUTs (measured: 7 levels at ``g = 4``)."""
    g = len(sels)
    sel = Signal(g, name=f"{name}_sel")
    m.d.comb += sel.eq(Cat(*sels))
    y = Signal(32, name=name)
    bits = []
    per_lut = max(1, 6 - g)
    for i in range(32):
        terms = []
        for b in range(32):
            truth = sum(((combos[c][i] >> b) & 1) << c for c in range(1 << g))
            if truth == (1 << (1 << g)) - 1:
                terms.append(x[b])
            elif truth:
                terms.append(x[b] & C(truth, 1 << g).bit_select(sel, 1))
        if lut_groups and len(terms) > per_lut:
            groups = []
            for k in range(0, len(terms), per_lut):
                t = Signal(name=f"{name}_t{i}_{k // per_lut}", attrs={"keep": 1})
                m.d.comb += t.eq(Cat(*terms[k:k + per_lut]).xor())
                groups.append(t)
            terms = groups
        bits.append(Cat(*terms).xor() if terms else C(0, 1))
    m.d.comb += y.eq(Cat(*bits))
    return y


def _rewind_combos(nbytes):
    """Rows of the rewind for every combination of select bits (bit ``k`` of the index: the
    stage that rewinds ``nbytes[k]`` bytes is taken)."""
    ident = [1 << i for i in range(32)]
    combos = []
    for c in range(1 << len(nbytes)):
        rows = ident
        for k, nb in enumerate(nbytes):
            if (c >> k) & 1:
                rows = rows_mul(advance_rows(-8 * nb), rows)
        combos.append(rows)
    return combos


def rewind_product(m, x, sel_bits, nbytes_per_bit, name):
    """Combinational variable rewind: ``x`` times ``A^(-8 * sum(sel_bits[b] *
    nbytes_per_bit[b]))`` as one gated product (see :func:`revert_stages`): output bit ``i``
    is the parity of ``x[b] & F_ib(sel)``. With ``g`` select bits a LUT6 takes ``6 - g`` terms
    (one at ``g = 5``), then a parity tree over at most 32 terms: 3 LUT levels for ``g <= 5``.
    Returns a named ``Signal(32)``."""
    if not sel_bits:
        raise ValueError("rewind_product needs at least one select bit")
    return _gated_group(m, x, list(sel_bits), _rewind_combos(list(nbytes_per_bit)), name,
                        lut_groups=True)


def revert_stages(m, en, x, sel_bits, nbytes_per_bit, per_cycle, name, complement=False,
                  carry=()):
    """Pipelined variable rewind: ``x`` times ``A^(-8 * sum(sel_bits[b] * nbytes_per_bit[b]))``,
    ``per_cycle`` conditional constant-matrix stages per register. ``carry`` is a list of Signals
    delayed alongside. Returns ``(result, carried, cycles)``; ``complement`` inverts the result.

    A single stage per register is "constant matrix, then 2:1 mux". A group of ``g >= 2`` stages
    is one gated matrix product instead: output bit ``i`` is the parity of ``x[b] & F_ib(sel)``
    over the input bits ``b``, where ``F_ib`` is the constant truth table over the group's ``g``
    select bits of "bit ``b`` feeds bit ``i``". With ``g = 2`` a LUT6 takes four such terms
    (4 data bits + 2 selects), so two stages cost about three LUT levels, where a chain of two
    "matrix, then mux" stages measured seven (Yosys, xcup, 512 bits)."""
    stages = list(zip(sel_bits, nbytes_per_bit))
    cycles = 0
    sel_cur = list(sel_bits)
    carried = list(carry)
    idx = 0
    if not stages and complement:
        raise ValueError("complement needs at least one stage")
    while idx < len(stages):
        group = stages[idx:idx + per_cycle]
        g = len(group)
        if g == 1:
            # A single stage: matrix, then a 2:1 mux (as cheap as the gated form, and smaller).
            t = xor_rows(m, advance_rows(-8 * group[0][1]), x, f"{name}_m{idx}")
            y = Signal(32, name=f"{name}_g{cycles}")
            m.d.comb += y.eq(Mux(sel_cur[idx], t, x))
        else:
            y = _gated_group(m, x, sel_cur[idx:idx + g], _rewind_combos([nb for _, nb in group]),
                             f"{name}_g{cycles}")
        last = idx + per_cycle >= len(stages)
        reg = Signal(32, name=f"{name}_r{cycles}", reset_less=True)
        new_sel = [Signal(name=f"{name}_sel{cycles}_{b}", reset_less=True)
                   for b in range(len(stages))]
        new_carry = [Signal.like(c, name=f"{name}_c{cycles}_{j}") for j, c in enumerate(carried)]
        with m.If(en):
            m.d.sync += reg.eq(~y if (complement and last) else y)
            m.d.sync += [ns.eq(s) for ns, s in zip(new_sel, sel_cur)]
            m.d.sync += [nc.eq(c) for nc, c in zip(new_carry, carried)]
        x, sel_cur, carried = reg, new_sel, new_carry
        cycles += 1
        idx += per_cycle
    return x, carried, cycles


class CRC32(wiring.Component):
    """Pipelined CRC-32 (``zlib.crc32``) of packets on a wide stream, one CRC per packet.

    Architecture: (1) the beat is registered with the bytes whose ``keep`` is 0 forced to zero
    (a synchronous reset of those flip-flops, no LUT); (2) the data term ``B d`` is computed as
    ``data_width / 64`` registered partial sums; (3) the feedback register holds only
    ``state' = A state ^ XOR(partials)`` (``A`` = 32x32 matrix of a full beat; the first beat
    uses the constant ``A * 0xFFFFFFFF``); (4) a zero-padded last beat is corrected by rewinding
    the state by the number of missing bytes, ``log2(data_width / 8)`` conditional constant
    matrices, one per register stage; the last stage also applies the final inversion.

    Latency: :attr:`latency` cycles from the transfer of a packet's last beat to ``o.valid``
    (``2 + log2(data_width / 8)``: 5 at 64 up to 9 at 1024 bits), constant. Throughput: one
    beat per cycle, back-to-back packets (a one-beat packet every cycle) included. The data-path
    registers have no reset (their flip-flop reset pins do the zeroing). Backpressure: the whole
    pipeline stalls while ``o`` is valid and not ready (``i.ready = ~o.valid | o.ready``).

    Parameters
    ----------
    data_width : int
        64, 128, 256, 512 or 1024.

    Members
    -------
    i : ``In(PacketSignature(data_width))``
        Packets; ``keep`` matters on the ``last`` beat only (contiguous from lane 0); the bytes in
        lanes without ``keep`` are ignored.
    o : ``Out(stream.Signature(32))``
        ``zlib.crc32`` of each packet, in packet order.

    Raises
    ------
    ValueError
        For an unsupported ``data_width``.
    """

    def __init__(self, data_width):
        self._width = check_data_width(data_width)
        self._nbytes = data_width // 8
        self._rev_bits = (self._nbytes - 1).bit_length()
        self._rev_cycles = self._rev_bits
        super().__init__({"i": In(PacketSignature(data_width)), "o": Out(stream.Signature(32))})

    @property
    def data_width(self):
        return self._width

    @property
    def latency(self):
        """Cycles from the last beat's transfer to ``o.valid`` (no backpressure)."""
        return 2 + self._rev_cycles

    def elaborate(self, platform):
        m = Module()
        w, n = self._width, self._nbytes
        a_rows, b_rows = step_matrices(w)

        en = Signal()
        m.d.comb += [en.eq(~self.o.valid | self.o.ready), self.i.ready.eq(en)]

        # Stage 1: zero the bytes without keep (synchronous-reset flip-flops).
        d1 = Signal(w, reset_less=True)      # data path: no reset, so the FF reset pin is free
        keep1 = Signal(n, reset_less=True)
        v1, first1, last1 = Signal(), Signal(), Signal()
        with m.If(en):
            m.d.sync += [v1.eq(self.i.valid), first1.eq(self.i.payload.first),
                         last1.eq(self.i.payload.last), keep1.eq(self.i.payload.keep)]
            for j in range(n):
                lane = self.i.payload.data[8 * j:8 * j + 8]
                m.d.sync += d1[8 * j:8 * j + 8].eq(Mux(self.i.payload.keep[j], lane, 0))

        # Stage 2: partial data terms; pad count of the last beat.
        parts = data_term_partials(m, en, d1, b_rows, _default_chunk(w), "dt")
        pad = empty_lanes(m, keep1, "pad")
        v2, first2, last2 = Signal(), Signal(), Signal()
        pad2 = Signal(self._rev_bits, reset_less=True)
        with m.If(en):
            m.d.sync += [v2.eq(v1), first2.eq(first1), last2.eq(last1), pad2.eq(pad)]

        # Stage 3: the feedback loop; holds only A * state.
        state = Signal(32, reset_less=True)
        a_state = xor_rows(m, a_rows, state, "a_state")
        a_init = apply_rows(a_rows, CRC_INIT)
        dsum = Signal(32)
        m.d.comb += dsum.eq(Cat(*[Cat(*[p[b] for p in parts]).xor() for b in range(32)]))
        nxt = Signal(32)
        m.d.comb += nxt.eq(Mux(first2, C(a_init, 32), a_state) ^ dsum)
        v3 = Signal()
        pad3 = Signal(self._rev_bits, reset_less=True)
        with m.If(en):
            with m.If(v2):
                m.d.sync += state.eq(nxt)
            m.d.sync += [v3.eq(v2 & last2), pad3.eq(pad2)]

        # Stages 4..: rewind by the pad bytes of the last beat, then invert.
        res, (vout,), _ = revert_stages(
            m, en, state, [pad3[b] for b in range(self._rev_bits)],
            [1 << b for b in range(self._rev_bits)], 1, "rw", complement=True, carry=[v3])
        m.d.comb += [self.o.valid.eq(vout), self.o.payload.eq(res)]
        return m
