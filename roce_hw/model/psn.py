# SPDX-License-Identifier: BSD-2-Clause
"""24-bit packet sequence number arithmetic (PROTOCOL.md §5.6; Linux rxe ``psn_compare``).

PSNs wrap modulo 2**24. Two PSNs are ordered with the IBA half-window rule, computed exactly as
the sign of rxe's ``psn_compare(a, b) = (s32)((a - b) << 8)``: ``a`` is *ahead* of ``b`` when it
lies in ``(b, b + 2**23 - 1]`` and *behind* when it lies in ``[b - 2**23, b)``. The single point
``b + 2**23 == b - 2**23`` is ambiguous; rxe's shifted difference is ``INT32_MIN`` there, so it
counts as *behind*, and :func:`psn_diff` returns ``-2**23`` (PROTOCOL.md's prose "(b, b+2^23]"
differs from the rxe code at exactly this one point; the code is followed).
"""

from ..proto import PSN_BITS, PSN_MASK

__all__ = ["PSN_MODULUS", "PSN_HALF", "psn_add", "psn_diff", "psn_compare",
           "psn_lt", "psn_le", "psn_gt", "psn_ge", "psn_ahead", "psn_in_window"]

PSN_MODULUS = 1 << PSN_BITS     #: 2**24
PSN_HALF = 1 << (PSN_BITS - 1)  #: 2**23, the half window


def _check(name, value):
    value = int(value)
    if not 0 <= value <= PSN_MASK:
        raise ValueError(f"{name} = {value} is not a 24-bit PSN (0..{PSN_MASK})")
    return value


def psn_add(a, n):
    """``(a + n) mod 2**24``; ``n`` may be negative or larger than 2**24."""
    return (_check("a", a) + int(n)) & PSN_MASK


def psn_diff(a, b):
    """Signed distance ``a - b`` in the half window, in ``[-2**23, 2**23 - 1]``.

    Equals rxe's ``psn_compare(a, b) >> 8`` (arithmetic shift): positive when ``a`` is ahead of
    ``b``, negative when behind, 0 when equal.
    """
    d = (_check("a", a) - _check("b", b)) & PSN_MASK
    return d - PSN_MODULUS if d >= PSN_HALF else d


def psn_compare(a, b):
    """rxe's ``psn_compare``: the 32-bit signed value ``(a - b) << 8``; only its sign matters."""
    return psn_diff(a, b) << 8


def psn_lt(a, b):
    """``a`` is strictly behind ``b`` (half-window order)."""
    return psn_diff(a, b) < 0


def psn_le(a, b):
    """``a`` is behind or equal to ``b``."""
    return psn_diff(a, b) <= 0


def psn_gt(a, b):
    """``a`` is strictly ahead of ``b``."""
    return psn_diff(a, b) > 0


def psn_ge(a, b):
    """``a`` is ahead of or equal to ``b``."""
    return psn_diff(a, b) >= 0


def psn_ahead(a, b):
    """``a`` is strictly ahead of ``b`` (a responder receiving ``a`` while expecting ``b`` sees
    a sequence error). Same as :func:`psn_gt`."""
    return psn_diff(a, b) > 0


def psn_in_window(psn, start, count):
    """``psn`` is one of the ``count`` consecutive PSNs starting at ``start`` (modulo 2**24)."""
    if not 0 <= int(count) <= PSN_MODULUS:
        raise ValueError(f"window of {count} PSNs is not in 0..2**24")
    return ((_check("psn", psn) - _check("start", start)) & PSN_MASK) < int(count)
