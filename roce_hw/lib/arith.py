# SPDX-License-Identifier: BSD-2-Clause
"""Short-path arithmetic: wide counters built from narrow carry chains.

A ``w``-bit ``+ 1`` synthesised as one adder is one carry chain through every bit (Yosys maps
4 bits per CARRY4 cell: a 24-bit PSN increment is 7 cells deep, a 32-bit counter 9), and an AND
of the low bits as the carry into a higher piece is turned back into a carry chain by Yosys.
:class:`FastCounter` keeps, for every ``chunk``-bit piece, a registered flag "all the bits below
are ones" (zeros when counting down), updated one step ahead, so no path crosses more than one
piece: about 5 cells at any width.
"""

from amaranth import *

__all__ = ["FastCounter", "counter_flag_bits", "load_flags", "event_counter", "or_tree",
           "not_before_parts"]


def counter_flag_bits(width, chunk=12):
    """The bit positions of a :class:`FastCounter`'s look-ahead flags (its chunk boundaries),
    low first."""
    return tuple(range(chunk, width, chunk))


def load_flags(m, x, name, *, flag_bits, down=False):
    """The look-ahead flags that a :class:`FastCounter` with flags at ``flag_bits``
    (:func:`counter_flag_bits`) takes on a load of ``x``, as a list of signals (comb in ``m``):
    "the bits of ``x`` below each position are all ones" (all zeros with ``down``). For a block
    that registers a value before a counter elsewhere loads it (its flags registered with it)."""
    x = Value.cast(x)
    out = []
    for lo in flag_bits:
        f = Signal(name=f"{name}_f{lo}")
        m.d.comb += f.eq(x[:lo] == (0 if down else (1 << lo) - 1))
        out.append(f)
    return out


class FastCounter:
    """A ``width``-bit register that counts up (or down) by one, or loads a value, with short
    paths.

    ``FastCounter(m, width, name)`` adds the register to ``m``; use the statements of
    :meth:`advance` and :meth:`load` in ``m.d.sync`` (inside ``m.If`` as needed).

    Attributes
    ----------
    value : Signal(width)
        The count.
    step : Signal(width)
        ``value + 1`` (``value - 1`` with ``down``), modulo ``2**width`` (combinational from
        registers: one ``chunk``-bit carry chain).
    """

    def __init__(self, m, width, name, *, down=False, chunk=12, init=0):
        self._down = down
        self.value = Signal(width, name=name, init=init)
        self.step = Signal(width, name=f"{name}_step")
        self._flags = {}
        for lo in counter_flag_bits(width, chunk):
            low = init & ((1 << lo) - 1)
            self._flags[lo] = Signal(name=f"{name}_f{lo}",
                                     init=(low == 0) if down else (low == (1 << lo) - 1))
        for lo in range(0, width, chunk):
            hi = min(width, lo + chunk)
            cin = self._flags[lo] if lo else C(1, 1)
            part = Signal(hi - lo, name=f"{name}_s{lo}")
            m.d.comb += part.eq(self.value[lo:hi] - cin if down else self.value[lo:hi] + cin)
            m.d.comb += self.step[lo:hi].eq(part)

    def advance(self):
        """Statements: count one step."""
        return [self.value.eq(self.step)] + self._stepped_flags(self.value)

    def load_step(self, x):
        """Statements: load the value one step from ``x`` (``x + 1``, or ``x - 1`` counting
        down), its flags computed from ``x`` itself (no compare behind the adder)."""
        x = Value.cast(x)
        width = len(self.value)
        return [self.value.eq((x - 1 if self._down else x + 1)[:width])] + \
            self._stepped_flags(x)

    def _stepped_flags(self, x):
        # after a step from x the bits below `lo` are all ones (up) / zeros (down) exactly
        # when they are one step before that in x
        return [f.eq(x[:lo] == (1 if self._down else (1 << lo) - 2))
                for lo, f in self._flags.items()]

    @property
    def flag_bits(self):
        """The bit positions of the look-ahead flags (the chunk boundaries), low first."""
        return tuple(self._flags)

    def load_flags(self, m, x, name):
        """The look-ahead flags a load of ``x`` sets, as a list of signals (comb in ``m``).

        For a value chosen among several sources: compute the flags of every source with this
        and choose them with the same select as the value (:meth:`load` ``flags=``), so no
        comparator sits after the select."""
        return load_flags(m, x, name, flag_bits=self.flag_bits, down=self._down)

    def _loaded_flag(self, x, lo):
        # the bits below `lo` of a loaded value are all zeros (down) / ones (up)
        return x[:lo] == (0 if self._down else (1 << lo) - 1)

    def load(self, x, flags=None):
        """Statements: load ``x``; ``flags``: its :meth:`load_flags` (computed here if not
        given)."""
        x = Value.cast(x)
        stmts = [self.value.eq(x)]
        for k, (lo, f) in enumerate(self._flags.items()):
            stmts.append(f.eq(self._loaded_flag(x, lo) if flags is None else flags[k]))
        return stmts


def event_counter(m, width, inc, name, *, saturate=False):
    """A wrapping (or saturating) ``width``-bit count of the cycles with ``inc`` high, as a
    :class:`FastCounter`; returns its value."""
    c = FastCounter(m, width, name)
    with m.If(inc & ~c.value.all() if saturate else inc):
        m.d.sync += c.advance()
    return c.value


def or_tree(values):
    """OR of a list of values as a balanced tree (an AND-OR select of one-hot terms builds no
    priority chain)."""
    values = list(values)
    while len(values) > 1:
        values = [values[k] | values[k + 1] if k + 1 < len(values) else values[k]
                  for k in range(0, len(values), 2)]
    return values[0]


def not_before_parts(m, a, b, name, *, chunk=12):
    """"``a`` is ``b`` or after it" in modular (half-window) order -- the sign bit of
    ``(a - b) mod 2**w`` is 0, for two ``w``-bit values (PSNs: PROTOCOL.md §5.6) -- in three
    pieces, so that no path crosses a ``w``-bit carry chain (7 cells for 24 bits; a piece is
    about 5): ``(borrow, hi0, hi1)``, "the low ``chunk`` bits of ``a`` are below ``b``'s" and
    the sign bits of the high pieces' difference without and with that borrow (``w`` >
    ``chunk``). ``a`` is ``b`` or after it when ``~Mux(borrow, hi1, hi0)``. Register the
    pieces before that multiplexer: Yosys otherwise shares the two high subtractions as one
    with the borrow as carry-in, which makes one chain of the whole width again."""
    a, b = Value.cast(a), Value.cast(b)
    if len(a) != len(b):
        raise ValueError(f"operands of {len(a)} and {len(b)} bits")
    w = len(a)
    if w <= chunk:
        raise ValueError(f"{w}-bit operands need no pieces of {chunk} bits")
    borrow = Signal(name=f"{name}_borrow")
    hi0 = Signal(name=f"{name}_hi0")
    hi1 = Signal(name=f"{name}_hi1")
    m.d.comb += [
        borrow.eq(a[:chunk] < b[:chunk]),
        hi0.eq((a[chunk:] - b[chunk:])[w - chunk - 1]),
        # (a - b - 1 as a + ~b: one carry chain, where Yosys builds "- b - 1" as two)
        hi1.eq((a[chunk:] + ~b[chunk:])[w - chunk - 1]),
    ]
    return borrow, hi0, hi1
