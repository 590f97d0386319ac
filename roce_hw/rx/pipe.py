# SPDX-License-Identifier: BSD-2-Clause
"""Register stages of the RX front end's fixed-latency pipeline."""

from amaranth import *
from amaranth.lib import data

__all__ = ["delay", "reg"]


def delay(m, value, cycles, name, *, data_only=False):
    """``value`` after ``cycles`` register stages (no enable: the pipeline never stalls).
    ``data_only``: no reset (data whose use is gated by a flag that has one), so that synthesis
    may map the chain to shift-register LUTs."""
    shape = value.shape() if isinstance(value, data.View) else Value.cast(value).shape()
    for k in range(cycles):
        r = Signal(shape, name=f"{name}_d{k + 1}", reset_less=data_only)
        m.d.sync += r.eq(value)
        value = r
    return value


def reg(m, value, name):
    """``value`` registered once, without reset: a field compare of the decision pipeline,
    whose use is gated by the frame-end flag (which has a reset)."""
    r = Signal(Value.cast(value).shape(), name=name, reset_less=True)
    m.d.sync += r.eq(value)
    return r
