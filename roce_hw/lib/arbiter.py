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

    Arbitration happens at frame boundaries only: once a frame's first beat is passed, the
    grant stays with its source until its ``last`` beat (a frame is never interleaved with
    another; a source that idles inside a frame idles the output). Round robin: after a frame
    of source ``k`` the sources ``k + 1, ..., n - 1, 0, ..., k`` have priority in that order,
    so a source with a frame waiting waits for at most one frame of every other source.
    Beats pass unchanged (``data``, ``keep``, ``first``, ``last`` and, with ``abort``, the
    ``abort`` bit); framing is taken from ``last`` only.

    Latency: a beat transferred on ``i[k]`` in cycle ``t`` is offered on ``o`` in cycle
    ``t + 1``. Throughput: one beat per cycle; the first beat of the next frame (any source)
    follows the last beat of a frame in the next cycle, with no idle cycle, also for frames of
    one beat. Backpressure: ``o`` is a registered output (``valid``, ``payload``);
    ``i[k].ready`` = (``~o.valid | o.ready``) and "``k`` is granted", the grant being a
    register inside a frame and, between frames, a function of the ``i[*].valid`` and
    registers: ``o.ready`` reaches every ``i[k].ready`` through one gate.

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
    grant : ``Out(n)``
        One-hot: the source of the frame in progress on the input side (0 between frames);
        for monitoring.

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
            "grant": Out(n),
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

        locked = Signal()          # inside a frame: the grant stays with `cur`
        cur = Signal(n)            # one-hot source of the frame in progress
        prio = Signal(n, init=(1 << n) - 1)   # sources after the last one served
        # First valid source at or after the round-robin pointer, else the first valid one:
        # two priority chains over n bits, chosen by "any valid source after the pointer".
        req_hi = Signal(n)
        grant_hi = Signal(n)
        grant_lo = Signal(n)
        grant = Signal(n)
        m.d.comb += req_hi.eq(valid & prio)
        for k in range(n):
            m.d.comb += [
                grant_hi[k].eq(req_hi[k] & ~req_hi[:k].any() if k else req_hi[0]),
                grant_lo[k].eq(valid[k] & ~valid[:k].any() if k else valid[0]),
            ]
        m.d.comb += grant.eq(Mux(req_hi.any(), grant_hi, grant_lo))

        sel = Signal(n)
        o_free = Signal()
        take = Signal()
        m.d.comb += [
            sel.eq(Mux(locked, cur, grant)),
            o_free.eq(~self.o.valid | self.o.ready),
            take.eq(o_free & (sel & valid).any()),
            self.grant.eq(Mux(locked, cur, 0)),
        ]
        for k in range(n):
            m.d.comb += self.i[k].ready.eq(o_free & sel[k])
        # AND-OR select of the granted source's beat (sel is one-hot)
        beat = Signal(self.o.payload.shape())
        m.d.comb += beat.eq(or_tree([Mux(sel[k], self.i[k].payload.as_value(), 0)
                                     for k in range(n)]))

        with m.If(o_free):
            m.d.sync += self.o.valid.eq(take)
        with m.If(take):
            m.d.sync += [self.o.payload.eq(beat), locked.eq(~beat.last), cur.eq(sel)]
            with m.If(~locked):
                # the pointer moves past the source whose frame starts now
                m.d.sync += prio.eq(Cat(C(0, 1), *[sel[:k + 1].any() for k in range(n - 1)]))
        return m
