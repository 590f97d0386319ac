# SPDX-License-Identifier: BSD-2-Clause
"""The segmenter's resume preparation: the rest of a message from a packet on, for a resume
request in the accept register."""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In

from .. import proto
from ..config import check_config
from .seg_common import HZ, LEN_BITS, PMTU_CODES, ResumePrepSignature, precompute

__all__ = ["ResumePrep"]

#: Bits of the rest subtracted per cycle.
_STEP_BITS = 12
#: The subtraction's width: three steps cover the offset (``start_packet`` << the largest shift).
_SUB_BITS = 3 * _STEP_BITS


class ResumePrep(wiring.Component):
    """A resume request: offset = ``start_packet`` * PMTU (the row's), rest = ``length`` - offset
    12 bits per cycle (shift registers, no multiplexer by step), then the checks and the
    precomputes from the rest, one step per cycle (a one-hot step register, each step an AND).

    Steps (one per cycle while ``req.busy``): 0 copies the row's PMTU code (the offset's
    multiplexer then reads a register of its own, not the row's: ECP5 timing); 1 loads the
    offset and the length; 2-4 subtract 12 bits each; 5 sets the request's ``rem`` (0 past the
    message's end); 6 registers its low bits and zero flags; 7 flags a ``start_packet`` that is
    not a packet of the message (past its end, or past byte 0 of a 0-byte message); 8 the
    precomputes are final (``done``: the request may be loaded). Latency: ``done`` in the ninth
    cycle of ``busy``. ``pre`` is registered in every cycle from registers that no longer change
    after step 7.

    Members
    -------
    req : ``In(ResumePrepSignature(config))``
    """

    def __init__(self, config):
        self._config = check_config(config)
        super().__init__({"req": In(ResumePrepSignature(config))})

    def elaborate(self, platform):
        m = Module()
        req = self.req
        assert all(len(req.spkt) + proto.pmtu_shift(c) <= _SUB_BITS for c in PMTU_CODES)
        assert LEN_BITS <= _SUB_BITS
        step = Signal(9, init=1, name="res_step")   # one-hot: each step enables with one AND
        off = Signal(_SUB_BITS, name="res_off")
        lsh = Signal(_SUB_BITS, name="res_len")
        rest = Signal(_SUB_BITS, name="res_rest")
        borrow = Signal(name="res_borrow")
        zero = Signal(name="res_zero")
        going = Signal()
        m.d.comb += going.eq(req.busy)
        off_in = Signal(_SUB_BITS)
        code = Signal.like(req.pmtu, name="res_pmtu")
        with m.If(going & step[0]):
            m.d.sync += code.eq(req.pmtu)
        with m.Switch(code):
            for c in PMTU_CODES:
                with m.Case(c):
                    m.d.comb += off_in.eq(req.spkt << proto.pmtu_shift(c))
        # lsh - off - borrow as one adder: lsh + ~off + (1 - borrow), carry out = no borrow
        sb = _STEP_BITS
        acc = Signal(sb + 2, name="res_acc")
        m.d.comb += acc.eq(Cat(C(1, 1), lsh[:sb]) + Cat(~borrow, ~off[:sb]))
        part = Signal(sb + 1, name="res_part")
        m.d.comb += part.eq(Cat(acc[1:sb + 1], ~acc[sb + 1]))
        # The precomputes from the rest in two register stages: rem is final from step 6;
        # its low bits, "the high part is zero" and "nibble i is not zero" registered from
        # step 7 (`zero` is then one LUT of them); the precomputes from step 8, taken at step 9.
        r_rem = Signal(HZ, name="res_rem")
        r_hz = Signal(name="res_hz")
        r_nib = [Signal(name=f"res_nib{i}") for i in range(4)]
        m.d.sync += [r_rem.eq(req.rem[:HZ]), r_hz.eq(~req.rem[HZ:].any())]
        m.d.sync += [r_nib[i].eq(req.rem[4 * i:4 * i + 4].any()) for i in range(4)]
        m.d.comb += zero.eq(r_hz & ~Cat(*r_nib).any())
        pre = precompute(m, self._config, r_rem, req.reth, req.imm, "r", hz=r_hz, nib=r_nib)
        with m.If(going):
            m.d.sync += step.eq(step.rotate_left(1))
        with m.If(going & step[1]):
            m.d.sync += [off.eq(off_in), lsh.eq(req.length), borrow.eq(0)]
        with m.If(going & (step[2] | step[3] | step[4])):
            m.d.sync += [borrow.eq(part[sb]), rest.eq(Cat(rest[sb:], part[:sb])),
                         off.eq(off[sb:]), lsh.eq(lsh[sb:])]
        m.d.comb += [req.set_rem.eq(going & step[5]),
                     req.rem_next.eq(Mux(borrow, 0, rest[:LEN_BITS]))]
        # not a packet of the message: past its end (rem is 0 then), or past byte 0 of a
        # 0-byte one
        m.d.comb += req.bad.eq(going & step[7] & (borrow | (zero & ~req.first)))
        m.d.comb += req.done.eq(going & step[8])
        # (computed every cycle from res_*, which no longer change after step 7)
        pre_r = Signal.like(pre, name="a_r")
        m.d.sync += pre_r.eq(pre)
        m.d.comb += req.pre.eq(pre_r)
        return m
