# SPDX-License-Identifier: BSD-2-Clause
"""PsnForward alone, against a reference written from its docstring: the newest of the last
``depth`` write-backs of the looked-up QP, the write-back of the current cycle included, with
the entries of a QP forgotten by a management write of it (with ``registered_key``: for the key
of the cycle before); random write-backs, management writes and look-ups, few QPs so that they
collide."""

import random
from collections import deque

import pytest

from roce_hw.layouts import qp_index_width
from roce_hw.tx.psn import PsnForward
from sim.harness import run_simulation


class _Reference:
    """The last ``depth`` write-backs, oldest first, each ``[qp, psn, err, forgotten]``. With
    ``registered``, a management write forgets a cycle later (the entries present then, not a
    write-back of that cycle)."""

    def __init__(self, depth, registered=False):
        self.history = deque(maxlen=depth)
        self.registered = registered
        self.pending = None

    def lookup(self, q, wb):
        if wb is not None and wb[0] == q:
            return 1, wb[1], wb[2]
        for qp, psn, err, forgotten in reversed(self.history):
            if qp == q:                       # the newest write-back of q decides
                return (0, None, None) if forgotten else (1, psn, err)
        return 0, None, None

    def step(self, wb, snoop):
        if self.registered:
            snoop, self.pending = self.pending, snoop
        if snoop is not None:
            for e in self.history:
                if e[0] == snoop:
                    e[3] = True
        if wb is not None:
            self.history.append([wb[0], wb[1], wb[2], snoop == wb[0] and not self.registered])


@pytest.mark.parametrize("registered", [False, True])
@pytest.mark.parametrize("n_qp, depth, seed", [(16, 8, 1), (5, 3, 2), (2, 1, 3)])
def test_psn_forward_against_reference(n_qp, depth, seed, registered):
    rng = random.Random(seed)
    dut = PsnForward(n_qp, depth, registered_key=registered)
    span = 1 << qp_index_width(n_qp)
    hot = [rng.randrange(span) for _ in range(3)]
    ref = _Reference(depth, registered)
    checked = {"hits": 0, "misses": 0}

    def qp():
        return rng.choice(hot) if rng.random() < 0.7 else rng.randrange(span)

    async def bench(ctx):
        prev_q = None
        # the write-backs' QPs (of the cycles without one too) drawn a cycle ahead: `qp_next`
        # is the next cycle's
        wb_qps = [qp() for _ in range(3001)]
        for i in range(3000):
            wb = (wb_qps[i], rng.getrandbits(24), rng.getrandbits(1)) \
                if rng.random() < 0.5 else None
            snoop = qp() if rng.random() < 0.1 else None
            q = qp()
            ctx.set(dut.wb.valid, wb is not None)
            ctx.set(dut.wb.qp, wb_qps[i])
            ctx.set(dut.wb.qp_next, wb_qps[i + 1])
            if wb is not None:
                ctx.set(dut.wb.psn, wb[1])
                ctx.set(dut.wb.err, wb[2])
            ctx.set(dut.snoop_valid, snoop is not None)
            ctx.set(dut.snoop_qp, snoop or 0)
            ctx.set(dut.q.qp, q)
            key = prev_q if registered else q
            if key is not None:
                hit, psn, err = ref.lookup(key, wb)
                assert ctx.get(dut.q.hit) == hit, (key, wb, list(ref.history))
                if hit:
                    assert (ctx.get(dut.q.psn), ctx.get(dut.q.err)) == (psn, err)
                checked["hits" if hit else "misses"] += 1
            prev_q = q
            await ctx.tick()
            ref.step(wb, snoop)

    run_simulation(dut, [bench], cycles=4000)
    assert checked["hits"] > 500 and checked["misses"] > 300


@pytest.mark.parametrize("depth", [0, 65, True, 2.0])
def test_psn_forward_bad_depth(depth):
    with pytest.raises(ValueError, match="depth"):
        PsnForward(16, depth)
