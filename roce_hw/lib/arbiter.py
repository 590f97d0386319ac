# SPDX-License-Identifier: BSD-2-Clause
"""Frame arbiter: several frame streams -> one, round robin at frame boundaries."""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .arith import or_tree
from .stream import frame_layout, packet_layout

__all__ = ["FrameArbiter"]


class FrameArbiter(wiring.Component):
    """Merges ``n`` frame streams into one, a whole frame at a time (e.g. data frames of the TX
    engine with connection-manager and ARP replies).

    Arbitration happens at frame boundaries only: once a source is granted, the grant stays
    with it until the ``last`` beat of its frame (a frame is never interleaved with another; a
    source that idles inside a frame idles the output). Round robin: after a frame of source
    ``k`` the sources ``k + 1, ..., n - 1, 0, ..., k`` have priority in that order, so a source
    with a frame waiting waits for at most one frame of every other source. Beats pass
    unchanged (``data``, ``keep``, ``first``, ``last`` and, with ``abort``, the ``abort``
    bit); framing is taken from ``last`` only.

    The grant is a register (one-hot ``sel``), chosen one cycle ahead: when a frame ends, the
    next source is picked among those already waiting (``valid`` and not taken in that cycle;
    a waiting source's ``valid`` stays high, as the stream rules require). If none waits, the
    source of the last frame keeps the grant without committing to it: its next frame can
    follow at once, and the first other source to raise ``valid`` is granted in the next
    cycle.

    Latency: a beat transferred on ``i[k]`` in cycle ``t`` is offered on ``o`` in cycle
    ``t + 1``. A frame's first beat is transferred in the cycle its ``valid`` rises if its
    source holds the grant (the source of the last frame, nobody else waiting), else from the
    next cycle. Throughput: one beat per cycle; the first beat of a waiting frame (any source)
    follows the last beat of the frame before in the next cycle, with no idle cycle, also for
    frames of one beat. Backpressure: ``o`` is a registered output (``valid``, ``payload``),
    and ``i[k].ready`` = (``~o.valid | o.ready``) & ``sel[k]``: one gate from ``o.ready`` and
    registers, independent of every ``valid``. The data path is one multiplexer on
    registered select lines (one LUT6 per bit up to 4 sources).

    Parameters
    ----------
    width : int
        Bus width in bits (64, 128, 256, 512 or 1024).
    n : int
        Number of sources (1 to 32).
    abort : bool
        With ``True`` the streams are :func:`~roce_hw.lib.stream.frame_layout` beats (with the
        ``abort`` bit), with ``False`` :func:`~roce_hw.lib.stream.packet_layout` beats.

    Members
    -------
    i : ``In(stream.Signature(layout)).array(n)``
        The sources; ``i[0]`` .. ``i[n - 1]``.
    o : ``Out(stream.Signature(layout))``
        The merged frames.

    Raises
    ------
    ValueError
        If ``n`` is not an integer from 1 to 32 (or ``width`` is not supported).
    """

    def __init__(self, width, n, *, abort=True):
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 32:
            raise ValueError(f"n must be an integer from 1 to 32 sources, not {n!r}")
        layout = frame_layout(width) if abort else packet_layout(width)
        self._width, self._n, self._abort = width, n, bool(abort)
        super().__init__({
            "i": In(stream.Signature(layout)).array(n),
            "o": Out(stream.Signature(layout)),
        })

    @property
    def n(self):
        """Number of sources."""
        return self._n

    def elaborate(self, platform):
        m = Module()
        n = self._n
        valid = Signal(n)
        m.d.comb += valid.eq(Cat(*[s.valid for s in self.i]))

        sel = Signal(n, init=1)    # one-hot: the source holding the grant
        index = Signal(range(n))   # its number (the data multiplexer's select)
        held = Signal()            # committed: a frame of `sel` is due or in progress
        o_free = Signal()
        take = Signal()
        m.d.comb += [
            o_free.eq(~self.o.valid | self.o.ready),
            take.eq(o_free & (valid & sel).any()),
        ]
        for k in range(n):
            m.d.comb += self.i[k].ready.eq(o_free & sel[k])

        beat = Signal(self.o.payload.shape())
        level = [self.i[k].payload.as_value() for k in range(n)]
        for b in range(len(index)):      # a binary tree of 2:1 multiplexers
            level = [Mux(index[b], level[j + 1], level[j]) if j + 1 < len(level) else level[j]
                     for j in range(0, len(level), 2)]
        m.d.comb += beat.eq(level[0])
        with m.If(o_free):
            # the payload register loads whenever it may (don't-care while `o.valid` is low)
            m.d.sync += [self.o.valid.eq(take), self.o.payload.eq(beat)]

        # The next grant. `after[k]`: source k comes after `sel` in round-robin order.
        waiting = Signal(n)        # valid in the next cycle too: valid and not taken now
        after = Signal(n)
        pick_hi = Signal(n)
        pick_lo = Signal(n)
        pick = Signal(n)
        m.d.comb += [
            waiting.eq(valid & ~Mux(take, sel, 0)),
            after.eq(Cat(C(0, 1), *[sel[:k + 1].any() for k in range(n - 1)])),
        ]
        hi = Signal(n)
        m.d.comb += hi.eq(waiting & after)
        for k in range(n):
            m.d.comb += [
                pick_hi[k].eq(hi[k] & ~hi[:k].any() if k else hi[0]),
                pick_lo[k].eq(waiting[k] & ~waiting[:k].any() if k else waiting[0]),
            ]
        m.d.comb += pick.eq(Mux(hi.any(), pick_hi, pick_lo))
        pick_index = Signal(range(n))
        m.d.comb += pick_index.eq(or_tree([C(k, len(index)) & pick[k].replicate(len(index))
                                           for k in range(n)]))

        with m.If(take & ~beat.last):
            m.d.sync += held.eq(1)             # inside a frame: keep `sel`
        with m.Elif(take | ~held):
            # a frame ended, or the grant is only kept speculatively: pick a waiting source
            with m.If(waiting.any()):
                m.d.sync += [sel.eq(pick), index.eq(pick_index), held.eq(1)]
            with m.Else():
                m.d.sync += held.eq(0)
        return m
