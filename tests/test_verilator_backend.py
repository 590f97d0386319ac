# SPDX-License-Identifier: BSD-2-Clause
"""The Verilator back end (sim/verilator, prototype of issue 34): the whole engine compiled by
Verilator and driven in transactions sends exactly the golden model's frames.

``slow``: the first build of each width takes minutes (later runs reuse build/verilator/)."""

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.tools("verilator")]


@pytest.mark.parametrize("width", [64, 512])
@pytest.mark.parametrize("stall", [0.0, 0.3])
def test_frames_match_model(width, stall):
    from sim.verilator.__main__ import check
    assert check(width, messages=30, seed=width + int(stall * 10), stall=stall,
                 log=lambda *a: None) == 0


def test_port_header_follows_port_list(tmp_path):
    from sim.verilator import ports_header
    text = ports_header([("input", 64, "s_wr_wr_id"), ("input", 4, "s_wr_qp"),
                         ("input", 1, "s_wr_valid"), ("output", 1, "s_wr_ready"),
                         ("input", 3, "s_qp_mgmt_req_ctx_state"),
                         ("output", 32, "counters_tx_frames")])
    assert "#define WR_FIELDS(X) X(wr_id) X(qp)\n" in text
    assert "#define CTX_FIELDS(X) X(state)\n" in text
    assert '#define COUNTER_NAMES "tx_frames"' in text
