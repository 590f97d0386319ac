# SPDX-License-Identifier: BSD-2-Clause
"""The verbs-level layouts shared by TX, RX and reliability (``roce_hw/verbs.py``)."""

from amaranth import Shape

from roce_hw.config import EngineConfig
from roce_hw.proto import WcOpcode, WcStatus, WrOpcode
from roce_hw.verbs import completion_layout, resume_layout, status_layout, wr_layout

__all__ = []


def _widths(layout):
    return {name: Shape.cast(fld.shape).width for name, fld in layout}


def test_enumerations_fit_their_fields():
    for n_qp in (1, 16, 300):
        cfg = EngineConfig(data_width=64, n_qp=n_qp)
        wr, st, wc = _widths(wr_layout(cfg)), _widths(status_layout(cfg)), \
            _widths(completion_layout(cfg))
        assert max(WrOpcode) < 1 << wr["opcode"]
        assert max(WcStatus) < 1 << st["status"] and max(WcStatus) < 1 << wc["status"]
        assert max(WcOpcode) < 1 << wc["opcode"]
        assert n_qp - 1 < 1 << wc["qp"] and wc["qp"] == wr["qp"] == st["qp"]


def test_a_status_report_is_the_start_of_a_completion():
    """The ``status`` stream's fields are a completion's, with the same widths: a refused
    request's report becomes a completion without conversion."""
    cfg = EngineConfig(data_width=512, n_qp=16)
    st, wc = _widths(status_layout(cfg)), _widths(completion_layout(cfg))
    assert all(wc[name] == w for name, w in st.items())


def test_completion_fields_are_ibv_wc_sized():
    """``struct ibv_wc``: ``uint64_t wr_id``, ``uint32_t byte_len``, ``__be32 imm_data``; a
    receive opcode has bit 7 set (``IBV_WC_RECV = 1 << 7``)."""
    wc = _widths(completion_layout(EngineConfig(data_width=64)))
    assert (wc["wr_id"], wc["byte_len"], wc["imm"], wc["with_imm"]) == (64, 32, 32, 1)
    assert {op for op in WcOpcode if op & WcOpcode.RECV} == {WcOpcode.RECV,
                                                             WcOpcode.RECV_RDMA_WITH_IMM}


def test_resume_extends_the_work_request():
    cfg = EngineConfig(data_width=64, n_qp=4)
    wr, res = _widths(wr_layout(cfg)), _widths(resume_layout(cfg))
    assert {k: res[k] for k in wr} == wr and set(res) - set(wr) == {"start_packet", "start_psn"}
