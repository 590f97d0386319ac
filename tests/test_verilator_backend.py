# SPDX-License-Identifier: BSD-2-Clause
"""The Verilator back end (sim/verilator): the whole engine compiled by Verilator and driven in
transactions sends exactly the golden model's frames and EngineModel's replies.

The first build of each configuration takes 1-3 minutes (later runs reuse build/verilator/, or
``$RHW_VERILATOR_CACHE``); every test here uses the two configurations the rest of the suite
uses (whole engine, 16 QPs, 64 and 512 bits), so a run builds at most two libraries."""

import pytest

pytestmark = [pytest.mark.tools("verilator")]


@pytest.mark.parametrize("width", [64, 512])
@pytest.mark.parametrize("stall", [0.0, 0.3])
def test_frames_match_model(width, stall):
    from sim.verilator.__main__ import check
    assert check(width, messages=30, seed=width + int(stall * 10), stall=stall,
                 log=lambda *a: None) == 0


def test_port_header_follows_port_list():
    from sim.verilator import ports_header
    text = ports_header([("input", 64, "s_wr_wr_id"), ("input", 4, "s_wr_qp"),
                         ("input", 1, "s_wr_valid"), ("output", 1, "s_wr_ready"),
                         ("input", 3, "s_qp_mgmt_req_ctx_state"),
                         ("input", 1, "s_resume_valid"), ("input", 23, "s_resume_start_packet"),
                         ("output", 32, "counters_tx_frames"), ("output", 32, "frames"),
                         ("input", 64, "s_axis_rx_tdata")])
    assert "#define WR_FIELDS(X) X(wr_id) X(qp)\n" in text
    assert "#define RESUME_FIELDS(X) X(start_packet)\n" in text
    assert "#define CTX_FIELDS(X) X(state)\n" in text
    assert "#define COUNTERS(X) X(counters_tx_frames) X(frames)\n" in text
    assert '#define COUNTER_NAMES "tx_frames,frames"' in text
    assert "#define HAS_RX 1" in text and "#define HAS_RX_OTHER 0" in text
    assert "#define HAS_RESUME 1" in text and "#define HAS_IP_ID_LOAD 0" in text


def test_run_in_slices():
    """run(until_tx=k) stops with k frames queued; runs in slices lose nothing; the cycle
    count goes on across calls; frame cycles are increasing."""
    from roce_hw import proto
    from roce_hw.config import EngineConfig
    from sim.bfm import QPSetup, WorkItem
    from sim.verilator import VerilatorEngine

    with VerilatorEngine(EngineConfig(data_width=64, n_qp=16), seed=3) as eng:
        eng.set_addr("02:00:00:00:00:01", "10.0.0.1")
        eng.write_qp(QPSetup(2, remote_qpn=9, remote_mac=0x020000000002, remote_ip=0x0A000002,
                             pmtu=256))
        for n in range(4):
            eng.post(WorkItem(qp=2, opcode=proto.WrOpcode.RDMA_WRITE, payload=bytes(1000),
                              wr_id=n))
        ran = eng.run(100_000, until_tx=3)
        assert eng.count("tx") == 3 and eng.cycle >= ran
        first = eng.pop_tx()
        assert len(first) == 3 and eng.count("tx") == 0
        while eng.count("tx_frames_total") < 16:
            assert eng.run(50) == 50
        rest = eng.pop_tx()
        eng.run(1000, quiet=100)
        rest += eng.pop_tx()
        frames = first + rest
        assert len(frames) == 16                       # 4 x ceil(1000 / 256)
        assert all(a[1] < b[0] for a, b in zip(frames, frames[1:]))
        assert [r["qp"] for r in eng.pop_mgmt_rsp()] == [2]
