# SPDX-License-Identifier: BSD-2-Clause
"""Short-path arithmetic: wide increments and decrements built from narrow carry chains.

A ``w``-bit ``+ 1`` synthesised as one adder is one carry chain through every bit (Yosys maps
4 bits per CARRY4 cell: a 24-bit PSN increment is 7 cells deep, a 32-bit counter 9). Split into
``chunk``-bit pieces whose carry-in is the AND of all the bits below them (a tree of LUTs,
two levels for up to 36 bits), no path crosses more than one chunk's chain: about 5 cells for
any width up to 72 bits.
"""

from amaranth import *

__all__ = ["fast_inc", "fast_dec", "Counter"]


def _and_tree(m, bits, name):
    """AND of ``bits`` (a list of 1-bit values) as a balanced tree of 6-input terms."""
    level = list(bits)
    depth = 0
    while len(level) > 1:
        nxt = []
        for k in range(0, len(level), 6):
            s = Signal(name=f"{name}_a{depth}_{k // 6}")
            m.d.comb += s.eq(Cat(*level[k:k + 6]).all())
            nxt.append(s)
        level, depth = nxt, depth + 1
    return level[0] if level else C(1, 1)


def _chunked(m, value, name, chunk, dec):
    v = Value.cast(value)
    out = Signal(len(v), name=name)
    for lo in range(0, len(v), chunk):
        hi = min(len(v), lo + chunk)
        # carry (borrow) into this chunk: every bit below is 1 (0 for a decrement)
        below = [v[j] if not dec else ~v[j] for j in range(lo)]
        cin = _and_tree(m, below, f"{name}_c{lo}") if lo else C(1, 1)
        part = Signal(hi - lo, name=f"{name}_p{lo}")
        if dec:
            m.d.comb += part.eq(v[lo:hi] - cin)
        else:
            m.d.comb += part.eq(v[lo:hi] + cin)
        m.d.comb += out[lo:hi].eq(part)
    return out


def fast_inc(m, value, name, chunk=12):
    """``value + 1`` (modulo ``2**len(value)``) as a named Signal with short carry chains."""
    return _chunked(m, value, name, chunk, dec=False)


def fast_dec(m, value, name, chunk=12):
    """``value - 1`` (modulo ``2**len(value)``) as a named Signal with short carry chains."""
    return _chunked(m, value, name, chunk, dec=True)


class Counter:
    """A wrapping ``width``-bit event counter with short paths (:func:`fast_inc`).

    ``Counter(m, 32, inc, name)`` adds the register and its update to ``m``; ``.value`` is the
    count (the cycle after an ``inc`` it has gone up by one).
    """

    def __init__(self, m, width, inc, name, *, saturate=False):
        self.value = Signal(width, name=name)
        nxt = fast_inc(m, self.value, f"{name}_inc")
        cond = inc & ~self.value.all() if saturate else inc
        with m.If(cond):
            m.d.sync += self.value.eq(nxt)
