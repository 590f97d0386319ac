# SPDX-License-Identifier: BSD-2-Clause
"""The reliable requester model against the independent responder model (sim.peer) through the
lossy network (sim.lossy), in the loop of sim.reliable_loop: nothing lost, duplicated or
reordered, completions exact, under random and targeted faults."""

import pytest

from roce_hw import proto
from roce_hw.config import EngineConfig
from roce_hw.model.packet import QPPath, build_ack_frame
from sim.bfm import QPSetup, WorkItem
from sim.reliable_loop import (HardwareRequester, ModelRequester, loop_workload,
                               make_responder, reliable_context, run_reliable_loop)

__all__ = []

WS = proto.WcStatus
OP = proto.WrOpcode
LOSSY = dict(drop=0.05, dup=0.01, reorder=0.01, corrupt=0.01, reorder_depth=3)


def _check(r, *, failed=None):
    assert r.finished, r.problems
    assert r.delivery_ok and r.completions_ok, r.problems
    assert r.failed_qps == (failed or {}), r.failed_qps
    if not failed:
        assert r.all_delivered and r.by_status == {"SUCCESS": r.messages}


@pytest.mark.parametrize("width", [64, 512])
def test_lossy_loop_1000_messages_4_qps(width):
    """Issue 35 'Model loop': 1,000 messages over 4 QPs, 5 % loss, 1 % duplication, 1 %
    reordering, 1 % corruption in both directions: nothing lost, duplicated or reordered."""
    qps, wrs = loop_workload(n_qps=4, messages=1000, sizes=(0, 3 * 1024), seed=width)
    r = run_reliable_loop(qps, wrs, data_width=width, seed=width + 1, network=LOSSY,
                          qp_params={"timeout": 5})
    _check(r)
    assert r.wire["tx_retransmitted"] > 100 and r.wire["rsp_nak_0x60"] > 20
    assert r.requester["timeouts"] > 0 and r.requester["go_back_nak"] > 0
    n = r.network
    for d in ("fwd", "rev"):
        assert min(n[d]["dropped"], n[d]["duplicated"], n[d]["reordered"],
                   n[d]["corrupted"]) > 0
    assert r.responder["bad_icrc"] > 0 and r.responder["duplicates"] > 0
    assert r.requester["acks_stale"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("seed", [11, 12, 13])
@pytest.mark.parametrize("width", [64, 128, 256, 512, 1024])
def test_lossy_loop_seeds(width, seed):
    qps, wrs = loop_workload(n_qps=4, messages=1000, sizes=(0, 5000), seed=seed, pmtu=512)
    r = run_reliable_loop(qps, wrs, data_width=width, seed=seed,
                          network=dict(LOSSY, delay_p=0.02, delay_max=400),
                          qp_params={"timeout": 4}, buffer_bytes=32 << 10)
    _check(r)


def test_one_qp_at_total_loss_fails_alone():
    """All of QP 2's frames are lost: it ends in ERROR with RETRY_EXC_ERR then WR_FLUSH_ERR
    for the rest, while the other QPs deliver everything, no later than without QP 2."""
    qps, wrs = loop_workload(n_qps=4, messages=120, sizes=(1, 4000), seed=3)
    params = {"timeout": 3, "retry_cnt": 3}
    r = run_reliable_loop(qps, wrs, data_width=64, qp_params=params,
                          network={"fwd": {"qp_drop": {qps[2].remote_qpn: 1.0}}})
    _check(r, failed={2: "RETRY_EXC_ERR"})
    mine = [c for c in r.completions if c["qp"] == 2]
    n2 = sum(1 for w in wrs if w.qp == 2)
    assert [WS(c["status"]) for c in mine] == [WS.RETRY_EXC_ERR] + [WS.WR_FLUSH_ERR] * (n2 - 1)
    others = [c for c in r.completions if c["qp"] != 2]
    assert len(others) == len(wrs) - n2 and {c["status"] for c in others} == {WS.SUCCESS}
    assert r.requester["timeouts"] == 4             # retry_cnt 3: three retries, then failed
    # the others are not slowed down: they finish before the lossless run with QP 2 does
    ref = run_reliable_loop(qps, wrs, data_width=64, qp_params=params)
    _check(ref)
    assert max(c["cycle"] for c in others) <= max(c["cycle"] for c in ref.completions)


def test_wrong_r_key_gives_rem_access_err_and_a_flush():
    qps, wrs = loop_workload(n_qps=3, messages=40, sizes=(1, 3000), seed=4,
                             ops=(OP.RDMA_WRITE,))
    bad = next(w for w in wrs if w.qp == 1 and w.wr_id > 5)
    peer = make_responder(qps, wrs, skip_rkeys={bad.r_key})
    r = run_reliable_loop(qps, wrs, data_width=512, responder=peer, network={"drop": 0.02},
                          qp_params={"timeout": 3})
    _check(r, failed={1: "REM_ACCESS_ERR"})
    mine = [(c["wr_id"], WS(c["status"])) for c in r.completions if c["qp"] == 1]
    ok = [w.wr_id for w in wrs if w.qp == 1 and w.wr_id < bad.wr_id]
    later = [w.wr_id for w in wrs if w.qp == 1 and w.wr_id > bad.wr_id]
    assert mine == [(i, WS.SUCCESS) for i in ok] + [(bad.wr_id, WS.REM_ACCESS_ERR)] + \
        [(i, WS.WR_FLUSH_ERR) for i in later]
    assert r.responder["naks_sent"] >= 1 and peer.qp_state(qps[1].remote_qpn)["error"]


def test_send_without_a_receive_gets_rnr_naks_then_succeeds():
    qps, wrs = loop_workload(n_qps=2, messages=20, sizes=(1, 2500), seed=5)
    wrs = [WorkItem(qp=0, opcode=OP.SEND, payload=b"hello" * 300, wr_id=100)] + wrs
    peer = make_responder(qps, wrs, recv=False)         # no receive anywhere, at first
    post_at = 100_000
    r = run_reliable_loop(qps, wrs, data_width=64, responder=peer,
                          qp_params={"timeout": 3, "min_rnr_timer": 1},
                          actions=[(post_at, lambda loop: _post_all(loop, qps, wrs))])
    _check(r)
    assert r.requester["rnr_waits"] >= 5 and r.wire["rsp_nak_rnr"] >= 5
    first = next(c for c in r.completions if c["wr_id"] == 100)
    assert first["status"] == WS.SUCCESS and first["cycle"] > post_at


def _post_all(loop, qps, wrs):
    for q in qps:
        need = sum(1 for w in wrs if w.qp == q.index and w.opcode != OP.RDMA_WRITE)
        loop.responder.post_recv(q.remote_qpn, 4096, need)


def test_rnr_retry_7_survives_1000_rnr_naks():
    qp = QPSetup(index=0, remote_qpn=0x11, remote_mac=0x020000001000, remote_ip=0x0A000101)
    wrs = [WorkItem(qp=0, opcode=OP.SEND_WITH_IMM, payload=b"late", imm=5, wr_id=1)]
    peer = make_responder([qp], wrs, recv=False)

    def poll(loop):
        if loop.responder.counters["rnr_naks_sent"] >= 1000:
            loop.responder.post_recv(0x11, 64)
            return None
        return loop.cycle + 50_000
    r = run_reliable_loop([qp], wrs, data_width=512, responder=peer,
                          qp_params={"rnr_retry": 7, "timeout": 1, "min_rnr_timer": 1},
                          actions=[(0, poll)])
    _check(r)
    assert r.requester["rnr_waits"] >= 1000 and r.requester.get("timeouts", 0) == 0


def test_forged_and_stale_acks_change_nothing():
    """Forged frames injected during a lossy run (PSN never sent, an old PSN, a wrong source
    IP, a QP not open, a bad iCRC) leave every frame and completion as in the run without."""
    qps, wrs = loop_workload(n_qps=2, messages=60, sizes=(1, 3000), seed=6)

    def forge(loop):
        c = loop.cycle
        row = loop.requester.model.read_qp(0)
        path = QPPath(src_mac=0x020000001000, dst_mac=0x020000000001, src_ip=qps[0].remote_ip,
                      dst_ip=0x0A000001, dest_qp=proto.LOCAL_QPN_BASE, udp_sport=0xC000)
        una = row["una_psn"]
        frames = [build_ack_frame(path, psn=(row["next_psn"] + 5) & 0xFFFFFF),   # never sent
                  build_ack_frame(path, psn=(una - 3) & 0xFFFFFF)]                  # old
        path.src_ip = 0x0A000909                                                   # wrong IP
        frames.append(build_ack_frame(path, psn=una))
        path.src_ip, path.dest_qp = qps[0].remote_ip, proto.LOCAL_QPN_BASE + 7      # not open
        frames.append(build_ack_frame(path, psn=una))
        path.dest_qp = proto.LOCAL_QPN_BASE
        f = bytearray(build_ack_frame(path, psn=una))                               # bad iCRC
        f[-2] ^= 0x10
        frames.append(bytes(f))
        for x in frames:
            loop.requester.push_rx(x, c)
        return c + 3000 if c < 60_000 else None
    runs = [run_reliable_loop(qps, wrs, data_width=64, network=dict(drop=0.03),
                              qp_params={"timeout": 3}, seed=9, actions=actions)
            for actions in ((), [(500, forge)])]
    for r in runs:
        _check(r)
    assert runs[0].completions == runs[1].completions and runs[0].wire == runs[1].wire
    got = runs[1].requester
    for name in ("psn_unsent", "acks_stale", "bad_src", "qp_not_open"):
        assert got.get(name, 0) > runs[0].requester.get(name, 0), name


@pytest.mark.parametrize("fault", [{"fwd": {"drop_data": {7}}}, {"rev": {"drop_ack": {3}}},
                                   {"fwd": {"drop_data": {7}}, "rev": {"drop_nak": {0}}},
                                   {"fwd": {"drop_data": {7}, "drop_retx": {0}}},
                                   {"fwd": {"drop_data": {0}}},
                                   {"rev": {"drop_ack": {0, 1, 2, 3, 4}}}])
def test_any_single_targeted_drop_is_recovered(fault):
    qps, wrs = loop_workload(n_qps=2, messages=12, sizes=(100, 5000), seed=7)
    r = run_reliable_loop(qps, wrs, data_width=64, network=fault, qp_params={"timeout": 3})
    _check(r)
    assert r.network["fwd"]["targeted_dropped"] + r.network["rev"]["targeted_dropped"] >= 1
    if "drop_data" in fault.get("fwd", {}) and 7 in fault["fwd"]["drop_data"]:
        assert r.wire["tx_retransmitted"] >= 1


def test_rnr_nak_during_a_replay():
    """A lost WRITE packet starts a go-back-N whose replay reaches a SEND with no receive:
    RNR NAK during the replay, then success once the receive is posted."""
    qp = QPSetup(index=0, remote_qpn=0x11, remote_mac=0x020000001000, remote_ip=0x0A000101,
                 start_psn=0xFFFFFA)
    wrs = [WorkItem(qp=0, opcode=OP.RDMA_WRITE, payload=bytes(range(256)) * 20,
                    remote_addr=0x1000, r_key=0x99, wr_id=1),     # PSN FFFFFA..FFFFFE
           WorkItem(qp=0, opcode=OP.SEND, payload=b"needs a buffer", wr_id=2),   # FFFFFF
           WorkItem(qp=0, opcode=OP.RDMA_WRITE, payload=b"after", remote_addr=0x9000,
                    r_key=0x98, wr_id=3)]
    peer = make_responder([qp], wrs, recv=False)
    req = ModelRequester(4, data_width=64)
    r = run_reliable_loop([qp], wrs, requester=req, responder=peer,
                          network={"fwd": {"drop_data": {2}}},
                          qp_params={"timeout": 4, "min_rnr_timer": 2},
                          actions=[(40_000, lambda loop: loop.responder.post_recv(0x11, 64))])
    _check(r)
    events = [(e.kind, e.psn) for e in req.model.events]
    assert events.index(("go_back", 0xFFFFFC)) < events.index(("rnr_wait", 0xFFFFFF))
    assert r.wire["tx_retransmitted"] >= 3


def test_replay_after_the_psn_wraps():
    qps, wrs = loop_workload(n_qps=2, messages=40, sizes=(500, 4000), seed=8,
                             start_psns=[0xFFFFF0, 0xFFFFFF])
    r = run_reliable_loop(qps, wrs, data_width=512, network={"drop": 0.08},
                          qp_params={"timeout": 3})
    _check(r)
    assert r.wire["tx_retransmitted"] > 0


def test_close_and_reopen_with_a_new_psn():
    """After its work is done QP 0 is closed and reopened toward a new peer QP with a new PSN:
    the first packet after carries the new PSN and the new messages are delivered."""
    qps, wrs = loop_workload(n_qps=1, messages=10, sizes=(1, 3000), seed=9)
    new = QPSetup(index=0, remote_qpn=0x21, remote_mac=qps[0].remote_mac,
                  remote_ip=qps[0].remote_ip, start_psn=0x123456)
    later = [WorkItem(qp=0, opcode=OP.SEND, payload=bytes([n]) * 100, wr_id=200 + n)
             for n in range(5)]
    peer = make_responder(qps, wrs)

    def reopen(loop):
        assert loop.requester.idle()
        loop.responder.add_qp(0x21, epsn=0x123456, remote_qpn=proto.LOCAL_QPN_BASE)
        loop.responder.post_recv(0x21, 100, 5)
        loop.requester.write_qp(0, reliable_context(new, timeout=3))
        for w in later:
            loop.post(w)
    r = run_reliable_loop(qps, wrs, data_width=64, responder=peer, network={"drop": 0.05},
                          qp_params={"timeout": 3}, actions=[(2_000_000, reopen)])
    # (the report knows one connection per QP: the checks of the reopened one are here)
    assert r.finished
    assert [c["wr_id"] for c in r.completions] == [w.wr_id for w in wrs + later]
    assert {c["status"] for c in r.completions} == {WS.SUCCESS}
    old = [c for c in peer.completions if c.qpn == 0x11]
    fresh = [c for c in peer.completions if c.qpn == 0x21]
    assert len(old) == len(wrs) and [c.data for c in fresh] == [w.payload for w in later]
    assert fresh[0].first_psn == 0x123456


def test_message_sizes_64_bytes_to_1_mib():
    sizes = [64, 65, 4095, 4096, 4097, 65536, 1 << 20]
    qp = QPSetup(index=0, remote_qpn=0x11, remote_mac=0x020000001000, remote_ip=0x0A000101,
                 start_psn=0xFFFF00, pmtu=4096)
    wrs = [WorkItem(qp=0, opcode=OP.RDMA_WRITE, payload=bytes([k]) * n,
                    remote_addr=0x100_0000 * (k + 1), r_key=0x500 + k, wr_id=k + 1)
           for k, n in enumerate(sizes)]
    wrs += [WorkItem(qp=0, opcode=OP.SEND, payload=bytes(range(256)) * 256, wr_id=99)]
    r = run_reliable_loop([qp], wrs, data_width=512, network={"drop": 0.01},
                          qp_params={"timeout": 3}, buffer_bytes=16 << 10)
    _check(r)
    assert r.payload_bytes == sum(sizes) + 65536


# --- the loop's checks can fail ----------------------------------------------------------------

class _Skipping(ModelRequester):
    """Never sends WR 5 (and so never completes it)."""

    def post(self, item):
        if item.wr_id != 5:
            super().post(item)


class _Swapping(ModelRequester):
    """Posts WR 4 before WR 3 (on the same QP)."""

    def post(self, item):
        if item.wr_id == 3:
            self._held = item
            return
        super().post(item)
        if item.wr_id == 4:
            super().post(self._held)


class _Lying(ModelRequester):
    """Reports WR 2 complete before it is sent."""

    def pop_completions(self):
        out = super().pop_completions()
        if not getattr(self, "_lied", False):
            self._lied = True
            out.insert(0, {"wr_id": 2, "qp": 0, "opcode": 0, "status": WS.SUCCESS,
                           "byte_len": 0, "cycle": 0})
        return out


@pytest.mark.parametrize("broken, check", [(_Skipping, "all_delivered"),
                                           (_Swapping, "delivery_ok"),
                                           (_Lying, "completions_ok")])
def test_the_checks_catch_a_broken_requester(broken, check):
    qps, wrs = loop_workload(n_qps=1, messages=8, sizes=(10, 100), seed=10)
    r = run_reliable_loop(qps, wrs, requester=broken(4, data_width=64),
                          qp_params={"timeout": 3})
    assert not getattr(r, check) and r.problems and not r.ok


class _Silent(ModelRequester):
    """A requester that makes no completions (as the hardware today)."""

    completes = False

    def pop_completions(self):
        super().pop_completions()
        return []


class _SilentSkipping(_Silent, _Skipping):
    pass


def test_a_requester_without_completions_is_judged_on_delivery():
    """``completes = False``: completions are not checked (``None``), delivery is, and the
    goodput is measured to the responder's last message."""
    qps, wrs = loop_workload(n_qps=2, messages=12, sizes=(10, 900), seed=12)
    ref = run_reliable_loop(qps, wrs, data_width=64, qp_params={"timeout": 3})
    _check(ref)
    r = run_reliable_loop(qps, wrs, requester=_Silent(4, data_width=64),
                          qp_params={"timeout": 3})
    assert r.ok and r.completions_ok is None and r.completions == [] and not r.problems
    assert r.cycles == r.delivered_cycles == ref.delivered_cycles < ref.cycles
    assert r.goodput == r.delivery_goodput == ref.delivery_goodput > ref.goodput
    bad = run_reliable_loop(qps, wrs, requester=_SilentSkipping(4, data_width=64),
                            qp_params={"timeout": 3})
    assert not bad.ok and bad.problems and bad.completions_ok is None


# --- the hardware in the loop (sim.backend's engine top, Verilator) ----------------------------

#: The Verilator library of this configuration is shared with tests/test_backends.py and the
#: other 64-bit engine-top tests (built once, about 2 minutes).
HW_CONFIG = EngineConfig(data_width=64, n_qp=16)


def _hw_loop(loss, messages, seed, backend="verilator"):
    qps, wrs = loop_workload(n_qps=4, messages=messages, sizes=(0, 3 * 1024), seed=seed)
    hw = HardwareRequester(config=HW_CONFIG, backend=backend, seed=seed)
    try:
        r = run_reliable_loop(qps, wrs, requester=hw, seed=seed, network={"drop": loss},
                              max_cycles=400_000)
    finally:
        hw.close()
    return qps, wrs, r


@pytest.mark.tools("verilator")
def test_hardware_in_the_loop_delivers_everything_without_loss():
    """The whole engine behind HardwareRequester, the responder model, no loss: every message
    arrives exactly once, in order, byte-identical; the engine's ACK handler counts every ACK
    the responder sent; no completions yet (refusals only); goodput to the last delivery as
    the requester model's, to 1 %."""
    qps, wrs, r = _hw_loop(0.0, 60, seed=21)
    assert r.finished and r.ok, r.problems
    assert r.delivery_ok and r.all_delivered and r.delivered == len(wrs) == 60
    assert r.completions_ok is None and r.by_status == {}
    assert r.requester["ack_acks"] == r.wire["rsp_ack"] == r.responder["acks_sent"]
    assert r.requester["ack_naks_seq"] == 0 and r.wire.get("tx_retransmitted", 0) == 0
    model = run_reliable_loop(qps, wrs, data_width=64, seed=21)
    _check(model)
    assert r.delivery_goodput == pytest.approx(model.delivery_goodput, rel=0.01)


@pytest.mark.tools("verilator")
def test_hardware_in_the_loop_reports_loss():
    """1 % loss both ways: the engine does not retransmit yet, so the loop ends (bounded, no
    hang) and reports the messages lost, while what did arrive arrived exactly once, in order,
    byte-identical; the NAKs the responder sent that reached the engine are counted by its ACK
    handler."""
    _, wrs, r = _hw_loop(0.01, 200, seed=22)
    n = r.network
    assert n["fwd"]["dropped"] > 0                     # the seed does lose data packets
    assert r.finished and r.cycles < 400_000
    assert not r.ok and not r.all_delivered and r.delivery_ok
    assert r.delivered < len(wrs) and any("messages delivered" in p for p in r.problems)
    assert r.wire["rsp_nak_0x60"] >= 1
    assert r.requester["ack_naks_seq"] + r.requester["ack_naks_stale"] <= r.wire["rsp_nak_0x60"]
    assert r.requester["ack_naks_seq"] >= 1
    assert r.wire.get("tx_retransmitted", 0) == 0 and r.by_status == {}


@pytest.mark.slow
@pytest.mark.tools("verilator")
def test_hardware_in_the_loop_same_on_both_back_ends():
    """HardwareRequester on Amaranth's simulator and on Verilator: the same loop, the same
    report (cycles, counters, network, verdict), with losses."""
    reports = [_hw_loop(0.2, 8, seed=23, backend=b)[2].summary()
               for b in ("amaranth", "verilator")]
    assert reports[0] == reports[1]
    assert sum(reports[0]["network"][d].get("dropped", 0) for d in ("fwd", "rev")) > 0
