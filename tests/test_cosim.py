# SPDX-License-Identifier: BSD-2-Clause
"""The emitted ``roce_tx.v`` in Icarus Verilog sends exactly the golden model's frames, in exactly
the cycles the Amaranth simulation of the same design sends them -- compiled as Verilog-2005 and
as SystemVerilog (``iverilog -g2012``) alike."""

import random

import pytest

from roce_hw import proto
from roce_hw.config import EngineConfig
from roce_hw.model.icrc import frame_icrc_ok
from sim import cosim
from sim.bfm import QPSetup, WorkItem
from sim.traffic import expected_frames

__all__ = []

PMTU = 256
#: Payload lengths around the PMTU boundaries (brief: 0, 1, 3, PMTU-1, PMTU, PMTU+1, 2*PMTU+17).
LENGTHS = (0, 1, 3, PMTU - 1, PMTU, PMTU + 1, 2 * PMTU + 17)
OPCODES = (proto.WrOpcode.RDMA_WRITE, proto.WrOpcode.RDMA_WRITE_WITH_IMM,
           proto.WrOpcode.SEND, proto.WrOpcode.SEND_WITH_IMM)
N_QP = 3        # QP index 3 exists on the 2-bit port but not in the table: a refusal case
LOCAL_MAC = 0x02_00_00_00_00_01
LOCAL_IP = 0x0A_00_00_01
#: Start the IP ID near the top so that the 16-bit counter wraps during the mixed run.
IP_ID_START = 0xFFF0


def _config(width):
    return EngineConfig(data_width=width, n_qp=N_QP, ip_id_start=IP_ID_START)


@pytest.fixture(scope="module")
def verilog(tmp_path_factory):
    """One emission per width and top option (``roce_hw.generate.generate``), shared by the
    tests of that width."""
    cache = {}

    def get(width, **top_options):
        key = (width, tuple(sorted(top_options.items())))
        if key not in cache:
            out = tmp_path_factory.mktemp(f"roce_tx_{width}")
            cache[key] = cosim.emit_verilog(_config(width), out, **top_options)
        return cache[key]
    return get


def _qps():
    return [
        QPSetup(index=0, remote_qpn=0x000011, remote_mac=0x02_00_00_00_00_02,
                remote_ip=0x0A_00_00_02, udp_sport=0xC001, start_psn=0, pmtu=PMTU),
        # PSN wraps mod 2**24 inside this QP's messages; non-default DSCP/ECN/P_Key/MigReq.
        QPSetup(index=1, remote_qpn=0xABCDEF, remote_mac=0x02_AA_BB_CC_DD_EE,
                remote_ip=0xC0_A8_01_07, udp_sport=0xE123, start_psn=0xFFFFFA, pmtu=PMTU,
                dscp=26, ecn=2, p_key=0x8001, migreq=1),
        QPSetup(index=2, remote_qpn=0x123456, remote_mac=0x02_00_00_00_00_03,
                remote_ip=0x0A_00_00_03, udp_sport=0xFFFF, start_psn=0x7FFFFF, pmtu=PMTU),
    ]


def _mixed_wrs(seed):
    """Every opcode at every length of LENGTHS, over three QPs, in a seeded order."""
    rng = random.Random(seed)
    wrs = []
    for op in OPCODES:
        for n in LENGTHS:
            wrs.append(WorkItem(qp=rng.randrange(N_QP), opcode=op, payload=rng.randbytes(n),
                                remote_addr=rng.getrandbits(64), r_key=rng.getrandbits(32),
                                imm=rng.getrandbits(32), solicited=rng.random() < 0.5))
    rng.shuffle(wrs)
    for k, w in enumerate(wrs):
        w.wr_id = 0x1000 + k
    return wrs


def _first_diff(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _check_frames(got, expect, what):
    assert [a for _, a in got] == [False] * len(got), f"{what}: aborted frame(s)"
    frames = [f for f, _ in got]
    assert len(frames) == len(expect), f"{what}: {len(frames)} frames, golden model {len(expect)}"
    for k, (g, e) in enumerate(zip(frames, expect)):
        assert g == e, (f"{what}: frame {k} differs from the golden model at byte "
                        f"{_first_diff(g, e)}\n got {g.hex()}\nwant {e.hex()}")
        assert frame_icrc_ok(g), f"{what}: frame {k} has a bad iCRC"


def _same_as_amaranth(res):
    """Every recorded event -- each m_axis_tx beat (all tdata bits, tkeep, tlast, tuser) with its
    cycle, each status and management response, the counters -- equals the Amaranth replay."""
    assert res.amaranth is not None
    diff = cosim.first_difference(res.events, res.amaranth.events)
    assert diff is None, f"Verilog and Amaranth differ at event {diff[0]}: {diff[1]} != {diff[2]}"


def _mixed(verilog, width, seed, stall=0.3, amaranth=True, std="2005"):
    config = _config(width)
    qps, wrs = _qps(), _mixed_wrs(seed)
    res = cosim.cosimulate(config, qps, wrs, local_mac=LOCAL_MAC, local_ip=LOCAL_IP, seed=seed,
                           p_idle=stall, p_stall=stall, verilog=verilog(width),
                           amaranth=amaranth, std=std)
    assert res.violations == []
    assert res.statuses == []
    assert [r["error"] for r in res.mgmt] == [0] * len(qps)
    # Packet count from the lengths alone (not from the model): ceil(len / PMTU), at least 1.
    n_packets = sum(max(1, -(-len(w.payload) // PMTU)) for w in wrs)
    assert len(res.frames) == n_packets
    expect = expected_frames(config, qps, wrs, local_mac=LOCAL_MAC, local_ip=LOCAL_IP,
                             ip_id_start=IP_ID_START)
    _check_frames(res.frames, expect, f"{width}-bit Verilog")
    assert res.counters == {"frames": n_packets, "frames_aborted": 0, "wrs_refused": 0,
                            "status_dropped": 0}
    if amaranth:
        _same_as_amaranth(res)
    return res


@pytest.mark.tools("iverilog", "vvp")
@pytest.mark.parametrize("std", cosim.IVERILOG_STDS)
@pytest.mark.parametrize("width", [64, 512])
def test_mixed_workload_matches_golden_model_and_amaranth(verilog, width, std):
    """Compiled as Verilog-2005 and as SystemVerilog, the same frames in the same cycles."""
    res = _mixed(verilog, width, seed=width, std=std)
    # the random tready pattern really stalled the engine in the middle of frames
    beats = res.beat_cycles
    assert any(b - a > 1 for a, b in zip(beats, beats[1:]))
    # coverage: QP 1's PSN wrapped 0xFFFFFF -> 0, and the IP ID wrapped 0xFFFF -> 0
    bth = 14 + 20 + 8
    psn_qp1 = [int.from_bytes(f[bth + 9:bth + 12], "big") for f, _ in res.frames
               if f[bth + 5:bth + 8] == bytes.fromhex("abcdef")]
    assert 0xFFFFFF in psn_qp1 and 0 in psn_qp1
    ip_ids = [int.from_bytes(f[18:20], "big") for f, _ in res.frames]
    assert 0xFFFF in ip_ids and 0 in ip_ids


@pytest.mark.parametrize("width", [64, 512])
def test_mixed_workload_back_to_back(verilog, width):
    """No idle input, no stall: frames follow each other on the bus without a gap."""
    res = _mixed(verilog, width, seed=width + 1, stall=0.0, amaranth=False)
    beats = set(res.beat_cycles)
    last_beats = [e[1] for e in res.events if e[0] == "B" and e[4]]      # tlast
    # some frame starts in the cycle right after the previous frame's last beat
    assert any(c + 1 in beats for c in last_beats[:-1])


@pytest.mark.slow
@pytest.mark.parametrize("width", [128, 256, 1024])
def test_mixed_workload_matches_golden_model_slow(verilog, width):
    _mixed(verilog, width, seed=width)


@pytest.mark.slow
@pytest.mark.parametrize("width", [64, 128, 256, 512, 1024])
@pytest.mark.parametrize("seed", [11, 12])
def test_random_workload_slow(verilog, width, seed):
    """Longer random messages at PMTU 1024 (several packets each), light stalls."""
    from sim.traffic import OPS, random_workload
    config = _config(width)
    qps, wrs = random_workload(n_qps=N_QP, messages=16, ops=list(OPS), min_size=0,
                               max_size=4000, pmtu=1024, seed=seed)
    res = cosim.cosimulate(config, qps, wrs, seed=seed, p_idle=0.1, p_stall=0.1,
                           verilog=verilog(width), amaranth=True,
                           std=cosim.IVERILOG_STDS[seed % 2])
    assert res.violations == [] and res.statuses == []
    _check_frames(res.frames, expected_frames(config, qps, wrs, ip_id_start=IP_ID_START),
                  f"{width}-bit Verilog")
    _same_as_amaranth(res)


def test_verilog_ports_are_the_flat_top_ports(verilog):
    """The testbench reads the port list from the .v; it is the FlatTop signature."""
    from roce_hw.lib.flat import FlatTop
    from roce_hw.engine import TxEngine
    config = _config(64)
    ports = cosim.verilog_ports(verilog(64).read_text())
    assert ports == cosim.amaranth_ports(FlatTop(TxEngine(config),
                                                 rename={"i": "payload", "o": "tx"}))
    assert ports["m_axis_tx_tdata"] == ("output", 64)
    assert ports["s_qp_mgmt_req_ctx_remote_mac"] == ("input", 48)


@pytest.mark.parametrize("width", [64, 512])
def test_refused_wrs_send_nothing_and_report(verilog, width):
    config = _config(width)
    qps = _qps()
    qps[1].state = proto.QPState.INIT        # QP 1 is not in RTS
    rng = random.Random(7)
    W = proto.WrOpcode
    wrs = [
        WorkItem(qp=0, opcode=W.SEND, payload=rng.randbytes(300), wr_id=1),
        WorkItem(qp=1, opcode=W.RDMA_WRITE, payload=rng.randbytes(300), wr_id=2),  # not RTS
        WorkItem(qp=0, opcode=W.RDMA_WRITE_WITH_IMM, payload=rng.randbytes(17), imm=5, wr_id=3),
        WorkItem(qp=1, opcode=W.SEND, payload=b"", wr_id=4),                       # not RTS
        WorkItem(qp=3, opcode=W.SEND, payload=rng.randbytes(40), wr_id=5),         # no QP 3
        WorkItem(qp=2, opcode=W.RDMA_READ, payload=b"", wr_id=6),                  # opcode
        WorkItem(qp=2, opcode=W.SEND_WITH_IMM, payload=rng.randbytes(PMTU + 1), imm=9, wr_id=7),
        WorkItem(qp=0, opcode=W.SEND, payload=rng.randbytes(3), wr_id=8),
    ]
    refused = {2, 4, 5, 6}
    res = cosim.cosimulate(config, qps, wrs, local_mac=LOCAL_MAC, local_ip=LOCAL_IP, seed=3,
                           p_idle=0.2, p_stall=0.2, verilog=verilog(width), amaranth=True)
    assert res.violations == []
    qp_op_err = 2      # libibverbs IBV_WC_LOC_QP_OP_ERR
    assert [(s["wr_id"], s["qp"], s["status"]) for s in res.statuses] == \
        [(2, 1, qp_op_err), (4, 1, qp_op_err), (5, 3, qp_op_err), (6, 2, qp_op_err)]
    # The accepted WRs go out as if the refused ones had never been posted: no IP ID, no PSN
    # used, and the refused payload (WR 2, WR 5) drained without reaching the frames.
    accepted = [w for w in wrs if w.wr_id not in refused]
    expect = expected_frames(config, qps, accepted, local_mac=LOCAL_MAC, local_ip=LOCAL_IP,
                             ip_id_start=IP_ID_START)
    _check_frames(res.frames, expect, f"{width}-bit Verilog")
    assert res.counters["wrs_refused"] == len(refused)
    assert res.counters["frames"] == len(expect)
    _same_as_amaranth(res)


@pytest.mark.parametrize("std", cosim.IVERILOG_STDS)
def test_length_mismatch_aborts_with_tuser(verilog, std):
    """A payload shorter than ``length`` ends the frame in flight with tuser (abort) = 1, reports
    LOC_LEN_ERR, puts the QP in ERROR (its next WR is refused) and leaves other QPs alone."""
    config = _config(64)
    qps = _qps()
    rng = random.Random(5)
    W = proto.WrOpcode
    short = rng.randbytes(300)                   # 300 bytes for a 600-byte message
    wrs = [WorkItem(qp=0, opcode=W.SEND, payload=short, length=600, wr_id=1),
           WorkItem(qp=0, opcode=W.SEND, payload=b"abc", wr_id=2),
           WorkItem(qp=2, opcode=W.RDMA_WRITE, payload=rng.randbytes(100), remote_addr=8,
                    r_key=3, wr_id=3)]
    res = cosim.cosimulate(config, qps, wrs, seed=4, p_idle=0.2, p_stall=0.2,
                           verilog=verilog(64), amaranth=True, std=std)
    assert res.violations == []
    assert [a for _, a in res.frames] == [False, True, False]
    # packet 0 of WR 1 went out whole; its second packet is the aborted frame (IP ID used)
    whole = WorkItem(qp=0, opcode=W.SEND, payload=short + bytes(300))
    first = expected_frames(config, qps, [whole], ip_id_start=IP_ID_START)[0]
    assert res.frames[0][0] == first
    third = expected_frames(config, qps, wrs[2:], ip_id_start=IP_ID_START + 2)
    assert [res.frames[2][0]] == third and frame_icrc_ok(third[0])
    loc_len_err, loc_qp_op_err = 1, 2            # libibverbs IBV_WC_* values
    assert [(s["wr_id"], s["qp"], s["status"]) for s in res.statuses] == \
        [(1, 0, loc_len_err), (2, 0, loc_qp_op_err)]
    assert res.counters == {"frames": 3, "frames_aborted": 1, "wrs_refused": 2,
                            "status_dropped": 0}
    _same_as_amaranth(res)


def test_detects_a_corrupted_netlist(verilog, tmp_path):
    """The comparison can fail: flip bit 0 of m_axis_tx_tdata in the emitted Verilog."""
    text = verilog(64).read_text()
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("assign m_axis_tx_tdata ="))
    bad = tmp_path / "roce_tx.v"
    bad.write_text(text.replace(line, line.rstrip(";") + " ^ 64'h1;"))
    config = _config(64)
    qps = _qps()
    wrs = [WorkItem(qp=0, opcode=proto.WrOpcode.SEND, payload=bytes(range(20)), wr_id=1)]
    res = cosim.cosimulate(config, qps, wrs, seed=1, verilog=bad)
    (frame, aborted), = res.frames
    expect, = expected_frames(config, qps, wrs, ip_id_start=IP_ID_START)
    assert frame != expect
    assert not frame_icrc_ok(frame)


def test_cycle_limit_raises_clearly(verilog):
    config = _config(64)
    wrs = [WorkItem(qp=0, opcode=proto.WrOpcode.SEND, payload=bytes(3000), wr_id=1)]
    with pytest.raises(cosim.CosimTimeout, match="limit of 50 cycles.*wrs="):
        cosim.cosimulate(config, _qps(), wrs, verilog=verilog(64), max_cycles=50)


def test_missing_iverilog_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(cosim.shutil, "which", lambda name: None)
    with pytest.raises(cosim.CosimError, match="iverilog.*apt-get install iverilog"):
        cosim.cosimulate(_config(64), _qps(), [])


def test_bad_probabilities_are_refused():
    with pytest.raises(ValueError, match="p_stall"):
        cosim.cosimulate(_config(64), _qps(), [], p_stall=1.0)


# --- the store-and-forward top (build.py --no-underrun) ------------------------------------------

def _gaps_inside_frames(res):
    """Cycles without a beat between the first and the last beat of each frame."""
    gaps, start = 0, None
    beats = [e for e in res.events if e[0] == "B"]
    for k, e in enumerate(beats):
        if start is None:
            start = k
        if e[4]:                                      # tlast
            cycles = [b[1] for b in beats[start:k + 1]]
            gaps += (cycles[-1] - cycles[0]) - (len(cycles) - 1)
            start = None
    return gaps


@pytest.mark.parametrize("std", cosim.IVERILOG_STDS)
@pytest.mark.parametrize("width", [64, 512])
def test_no_underrun_top_never_pauses_inside_a_frame(verilog, width, std):
    """With idle cycles on the payload input and the MAC always ready, the bare engine pauses
    inside frames and the --no-underrun top does not; both send the golden model's frames, and
    the FIFO top's Verilog matches its Amaranth simulation cycle for cycle."""
    config = _config(width)
    qps, wrs = _qps(), _mixed_wrs(width + 7)
    expect = expected_frames(config, qps, wrs, local_mac=LOCAL_MAC, local_ip=LOCAL_IP,
                             ip_id_start=IP_ID_START)
    kw = dict(local_mac=LOCAL_MAC, local_ip=LOCAL_IP, seed=9, p_idle=0.3, p_stall=0.0, std=std)
    bare = cosim.cosimulate(config, qps, wrs, verilog=verilog(width), **kw)
    _check_frames(bare.frames, expect, f"{width}-bit engine")
    assert _gaps_inside_frames(bare) > 0
    opts = {"no_underrun": True}
    fifo = cosim.cosimulate(config, qps, wrs, verilog=verilog(width, **opts), top_options=opts,
                            amaranth=std == "2005", **kw)
    assert fifo.violations == []
    _check_frames(fifo.frames, expect, f"{width}-bit engine + frame FIFO")
    assert _gaps_inside_frames(fifo) == 0
    if std == "2005":
        _same_as_amaranth(fifo)


def test_no_underrun_top_drops_aborted_frames(verilog):
    """The FIFO (default abort="drop") keeps an aborted frame from the MAC; the engine still
    counts it in frames_aborted and reports LOC_LEN_ERR."""
    config = _config(64)
    qps = _qps()
    rng = random.Random(5)
    W = proto.WrOpcode
    wrs = [WorkItem(qp=0, opcode=W.SEND, payload=rng.randbytes(300), length=600, wr_id=1),
           WorkItem(qp=2, opcode=W.RDMA_WRITE, payload=rng.randbytes(100), remote_addr=8,
                    r_key=3, wr_id=3)]
    opts = {"no_underrun": True}
    res = cosim.cosimulate(config, qps, wrs, seed=4, p_idle=0.2, p_stall=0.2,
                           verilog=verilog(64, **opts), top_options=opts, amaranth=True)
    assert res.violations == []
    assert [a for _, a in res.frames] == [False, False]
    assert res.counters["frames_aborted"] == 1 and res.counters["frames"] == 3
    whole = WorkItem(qp=0, opcode=W.SEND, payload=wrs[0].payload + bytes(300))
    assert res.frames[0][0] == expected_frames(config, qps, [whole], ip_id_start=IP_ID_START)[0]
    assert [res.frames[1][0]] == expected_frames(config, qps, wrs[1:],
                                                 ip_id_start=IP_ID_START + 2)
    assert [(s["wr_id"], s["status"]) for s in res.statuses] == [(1, 1)]
    _same_as_amaranth(res)
