# SPDX-License-Identifier: BSD-2-Clause
"""The reliable requester model (roce_hw.model.reliable): ACK/NAK checks, go-back-N, timers,
retry counts, the shared buffer, completions. Frames are decoded with scapy (an independent
parser); expected timer cycles are worked out by hand from PROTOCOL.md §5.5/§5.10."""

from fractions import Fraction

import pytest
from scapy.contrib import roce as sroce
from scapy.layers.inet import UDP
from scapy.layers.l2 import Ether

from roce_hw import proto
from roce_hw.model.packet import QPPath, build_ack_frame, build_cnp_frame, build_frame
from roce_hw.model.reliable import (PSN_CAP, ReliableRequester, ack_timeout_cycles,
                                    rnr_wait_cycles)
from roce_hw.model.requester import RequesterModel
from sim.bfm import QPSetup, qp_context

__all__ = []

WS = proto.WcStatus
OP = proto.WrOpcode
LOCAL_MAC, LOCAL_IP = 0x02_00_00_00_00_01, 0x0A_00_00_01
PEER_MAC = 0x02_00_00_00_00_02
CLK = 156_250_000             # 64-bit clock: 6.4 ns a cycle


def peer_ip(i):
    return 0x0A_00_01_01 + i


def make(n_qp=4, **kw):
    kw.setdefault("data_width", 64)
    kw.setdefault("clock_hz", CLK)
    return ReliableRequester(n_qp, local_mac=LOCAL_MAC, local_ip=LOCAL_IP, **kw)


def open_qp(req, i, *, psn=1000, pmtu=1024, retry_cnt=7, rnr_retry=7, timeout=0, state=None):
    q = QPSetup(index=i, remote_qpn=0x11 + i, remote_mac=PEER_MAC, remote_ip=peer_ip(i),
                udp_sport=0xC000 + i, start_psn=psn, pmtu=pmtu)
    ctx = qp_context(q)
    ctx.update(retry_cnt=retry_cnt, rnr_retry=rnr_retry, timeout=timeout, min_rnr_timer=1)
    if state is not None:
        ctx["state"] = int(state)
    req.write_qp(i, ctx)
    return ctx


def reply(i, psn, syndrome=0x1F, *, src_ip=None, dest_qp=None):
    """An ACKNOWLEDGE from QP ``i``'s peer."""
    path = QPPath(src_mac=PEER_MAC, dst_mac=LOCAL_MAC,
                  src_ip=peer_ip(i) if src_ip is None else src_ip, dst_ip=LOCAL_IP,
                  dest_qp=proto.LOCAL_QPN_BASE + i if dest_qp is None else dest_qp,
                  udp_sport=0xC000)
    return build_ack_frame(path, psn=psn & proto.PSN_MASK, syndrome=syndrome)


def bth(frame):
    return Ether(frame)[sroce.BTH]


def sent(req, until=None):
    """Run to ``until`` (default: until the output is quiet) and return the frames."""
    req.run_until(until if until is not None else req.cycle + 100_000)
    return req.pop_tx()


def post(req, qp, op, n, wr_id, **kw):
    return req.post(qp=qp, opcode=op, payload=bytes((wr_id + k) & 0xFF for k in range(n)),
                    wr_id=wr_id, remote_addr=0x1000 * wr_id, r_key=0x77, **kw)


def snapshot(req, qps=range(4)):
    return ([req.read_qp(i) for i in qps], [req.outstanding(i) for i in qps], req.buffer_used,
            req.next_event(), list(req.events))


# --- timer arithmetic ------------------------------------------------------------------------

def test_timer_cycles_round_up():
    # 4.096 us * 2**14 = 67.108864 ms; at 322 MHz 21,609,054.208 cycles; 8.192 us at 156.25 MHz
    # is 1280 exactly
    assert ack_timeout_cycles(14, 322_000_000) == 21_609_055
    assert ack_timeout_cycles(1, CLK) == 1280
    assert ack_timeout_cycles(0, CLK) == 0
    # RNR code 1 = 10 us; 0 = 655.36 ms; 25 = 61.44 ms (not rxe's 61.41)
    assert rnr_wait_cycles(1, 322_000_000) == 3220
    assert rnr_wait_cycles(0, 322_000_000) == 211_025_920
    assert rnr_wait_cycles(25, CLK) == 9_600_000
    assert rnr_wait_cycles(1, CLK) == 1563                  # 1562.5, never short
    assert rnr_wait_cycles(1, 100_000_001) == 1001          # 1000.00001
    assert ack_timeout_cycles(2, Fraction(10**9, 3)) == 5462   # 16.384 us * 333.3 MHz
    with pytest.raises(ValueError):
        ack_timeout_cycles(32, CLK)
    with pytest.raises(ValueError):
        rnr_wait_cycles(-1, CLK)


# --- sending -----------------------------------------------------------------------------------

def test_lossless_frames_equal_the_requester_model():
    """With every packet acknowledged at once the frames are the one-way requester model's,
    byte for byte (IP IDs included), and back to back on the 64-bit port."""
    req = make(ip_id_start=7)
    ref = RequesterModel(n_qp=4, ip_id_start=7, local_mac=LOCAL_MAC, local_ip=LOCAL_IP)
    ctx = open_qp(req, 0, psn=0xFFFFFD)
    ref.write_qp(0, ctx)
    wrs = [(OP.RDMA_WRITE, 3000), (OP.SEND, 0), (OP.SEND_WITH_IMM, 1025),
           (OP.RDMA_WRITE_WITH_IMM, 17)]
    for n, (op, size) in enumerate(wrs):
        post(req, 0, op, size, n + 1, imm=n)
        ref.post(qp=0, opcode=op, payload=bytes((n + 1 + k) & 0xFF for k in range(size)),
                 wr_id=n + 1, remote_addr=0x1000 * (n + 1), r_key=0x77, imm=n)
    frames = sent(req)
    assert [f.data for f in frames] == ref.frames
    for a, b in zip(frames, frames[1:]):
        assert b.first == a.last + 1
    assert all(f.last - f.first + 1 == -(-len(f.data) // 8) for f in frames)
    assert [f.retransmission for f in frames] == [False] * len(frames)
    req.receive(reply(0, frames[-1].psn))
    assert [(c.wr_id, c.status, c.opcode, c.byte_len) for c in req.pop_completions()] == [
        (1, WS.SUCCESS, proto.WcOpcode.RDMA_WRITE, 3000), (2, WS.SUCCESS, proto.WcOpcode.SEND, 0),
        (3, WS.SUCCESS, proto.WcOpcode.SEND, 1025),
        (4, WS.SUCCESS, proto.WcOpcode.RDMA_WRITE, 17)]
    assert req.buffer_used == 0 and req.idle()
    assert req.read_qp(0)["una_psn"] == req.read_qp(0)["next_psn"] == (0xFFFFFD + 7) & 0xFFFFFF


def test_refused_requests():
    req = make()
    open_qp(req, 0)
    open_qp(req, 1, state=proto.QPState.INIT)
    got = [req.post(qp=9, opcode=OP.SEND, payload=b"x", wr_id=1),
           req.post(qp=1, opcode=OP.SEND, payload=b"x", wr_id=2),
           req.post(qp=0, opcode=OP.RDMA_READ, payload=b"", wr_id=3),
           req.post(qp=0, opcode=OP.SEND, payload=b"xy", length=3, wr_id=4),
           req.post(qp=0, opcode=OP.SEND, payload=b"", length=(1 << 31) + 1, wr_id=5)]
    assert [(c.wr_id, c.status) for c in got] == [
        (1, WS.LOC_QP_OP_ERR), (2, WS.LOC_QP_OP_ERR), (3, WS.LOC_QP_OP_ERR),
        (4, WS.LOC_LEN_ERR), (5, WS.LOC_LEN_ERR)]
    assert got[2].opcode is None and got[3].opcode == proto.WcOpcode.SEND
    assert req.pop_completions() == got
    assert sent(req) == [] and req.idle()


@pytest.mark.parametrize("kw", [dict(buffer_bytes=4095), dict(qp_cap_bytes=100),
                                dict(data_width=100), dict(clock_hz=0),
                                dict(timer_slack_cycles=-1), dict(buffer_unit=0),
                                dict(desc_entries=0)])
def test_bad_parameters(kw):
    with pytest.raises(ValueError):
        make(**kw)


# --- ACKs ----------------------------------------------------------------------------------------

def test_one_ack_for_n_packets_of_m_messages_completes_m_in_order():
    req = make()
    open_qp(req, 0, psn=500)
    post(req, 0, OP.RDMA_WRITE, 3000, 1)              # PSN 500-502
    post(req, 0, OP.SEND, 100, 2, signaled=False)     # 503
    post(req, 0, OP.RDMA_WRITE_WITH_IMM, 2049, 3)     # 504-506
    post(req, 0, OP.SEND, 10, 4)                      # 507
    frames = sent(req)
    assert [f.psn for f in frames] == list(range(500, 508))
    req.receive(reply(0, 501))                         # inside WR 1: nothing completes
    assert req.pop_completions() == [] and req.outstanding(0)[0] == 6
    req.receive(reply(0, 506))                         # covers WRs 1-3
    assert [(c.wr_id, c.status) for c in req.pop_completions()] == [(1, WS.SUCCESS),
                                                                     (3, WS.SUCCESS)]
    assert req.read_qp(0)["una_psn"] == 507 and req.outstanding(0) == (1, 10)
    req.receive(reply(0, 507))
    assert [c.wr_id for c in req.pop_completions()] == [4]
    assert req.counters["acks"] == 3 and req.buffer_used == 0


@pytest.mark.parametrize("case", ["unsent", "stale", "duplicate", "bad_src", "not_rts",
                                  "unknown_qp", "bad_icrc", "reserved_syndrome", "nak_code_4",
                                  "malformed", "stale_nak", "wrong_mac"])
def test_forged_or_stale_acks_change_nothing(case):
    req = make()
    open_qp(req, 0, psn=100, timeout=3)
    open_qp(req, 1, state=proto.QPState.RESET)
    post(req, 0, OP.RDMA_WRITE, 4096, 1)               # PSN 100-103
    frames = sent(req, until=2000)
    req.receive(reply(0, 101))                          # una = 102
    req.pop_completions()
    before = snapshot(req)
    frame, counter = {
        "unsent": (reply(0, 104), "psn_unsent"),
        "stale": (reply(0, 95), "acks_stale"),
        "duplicate": (reply(0, 101), "acks_stale"),
        "bad_src": (reply(0, 103, src_ip=0x0A_00_09_09), "bad_src"),
        "not_rts": (reply(1, 103), "qp_not_open"),
        "unknown_qp": (reply(0, 103, dest_qp=proto.LOCAL_QPN_BASE + 4), "unknown_qp"),
        "bad_icrc": (reply(0, 103)[:-1] + bytes([reply(0, 103)[-1] ^ 1]), None),
        "reserved_syndrome": (reply(0, 103, syndrome=0x40), "bad_syndrome"),
        "nak_code_4": (reply(0, 103, syndrome=0x64), "bad_syndrome"),
        "malformed": (build_frame(proto.Opcode.RC_ACKNOWLEDGE, payload=b"abcd",
                                  **_ack_args(0, 103)), "not_ack"),
        "stale_nak": (reply(0, 101, syndrome=0x60), "naks_stale"),
        "wrong_mac": (_other_mac(reply(0, 103)), None),
    }[case]
    req.receive(frame)
    assert snapshot(req) == before
    assert req.pop_completions() == [] and req.pop_tx() == []
    if counter:
        assert req.counters[counter] == 1
    elif case == "bad_icrc":
        assert req.rx.counts["icrc"] == 1
    else:
        assert req.rx.counts["other"] == 1
    assert frames and req.counters["acks"] == 1


def _ack_args(i, psn):
    return {"eth": {"dst": LOCAL_MAC, "src": PEER_MAC},
            "ip": {"src": peer_ip(i), "dst": LOCAL_IP, "flag_df": 1, "ttl": 64},
            "udp": {"src_port": 0xC000},
            "bth": {"dest_qp": proto.LOCAL_QPN_BASE + i, "psn": psn},
            "headers": {"AETH": {"syndrome": 0x1F}}}


def _other_mac(frame):
    return bytes.fromhex("020000000099") + frame[6:]


# --- NAKs and go-back-N ------------------------------------------------------------------------

def test_sequence_nak_acks_before_and_replays_identical_packets():
    req = make()
    open_qp(req, 0, psn=0xFFFFFE)                       # the replay crosses the PSN wrap
    post(req, 0, OP.RDMA_WRITE, 5000, 1, imm=0)         # 5 packets: FFFFFE, FFFFFF, 0, 1, 2
    post(req, 0, OP.SEND_WITH_IMM, 300, 2, imm=0xABCD)  # 3
    first = sent(req)
    assert [f.psn for f in first] == [0xFFFFFE, 0xFFFFFF, 0, 1, 2, 3]
    req.receive(reply(0, 0, syndrome=0x60))             # lost PSN 0
    replay = sent(req)
    assert [f.psn for f in replay] == [0, 1, 2, 3]
    assert all(f.retransmission for f in replay)
    # same transport headers and payload: identical from the UDP header to the pad (the iCRC
    # covers the IPv4 identification, which differs)
    assert [f.data[34:-4] for f in replay] == [f.data[34:-4] for f in first[2:]]
    assert [f.data[18:20] for f in replay] != [f.data[18:20] for f in first[2:]]   # IP ID
    b = bth(replay[0].data)
    assert b.opcode == 0x07                                                       # MIDDLE
    assert Ether(replay[0].data)[UDP].len == 8 + 12 + 1024 + 4                    # no RETH
    assert req.read_qp(0)["una_psn"] == 0 and req.outstanding(0)[0] == 4
    assert req.counters["go_back_nak"] == 1 and req.counters["retransmitted"] == 4
    # the same NAK again (a duplicate) starts nothing
    req.receive(reply(0, 0, syndrome=0x60))
    assert sent(req) == [] and req.counters["nak_seq_repeat"] == 1
    req.receive(reply(0, 3))
    assert [(c.wr_id, c.status) for c in req.pop_completions()] == [(1, WS.SUCCESS),
                                                                     (2, WS.SUCCESS)]


def test_rnr_nak_implicitly_acks_earlier_wrs():
    req = make()
    open_qp(req, 0, psn=10)
    post(req, 0, OP.RDMA_WRITE, 100, 1)                 # 10 (its ACK is lost)
    post(req, 0, OP.SEND, 100, 2)                       # 11
    sent(req)
    req.receive(reply(0, 11, syndrome=0x20 | 1))
    assert [(c.wr_id, c.status) for c in req.pop_completions()] == [(1, WS.SUCCESS)]
    assert req.read_qp(0)["una_psn"] == 11


@pytest.mark.parametrize("syndrome, status", [(0x61, WS.REM_INV_REQ_ERR),
                                              (0x62, WS.REM_ACCESS_ERR),
                                              (0x63, WS.REM_OP_ERR)])
def test_fatal_nak_fails_the_wr_flushes_the_rest_and_spares_other_qps(syndrome, status):
    req = make()
    open_qp(req, 0, psn=10, timeout=2)
    open_qp(req, 1, psn=50, timeout=2)
    post(req, 0, OP.SEND, 100, 1)                       # 10
    post(req, 0, OP.RDMA_WRITE, 2000, 2, signaled=False)   # 11-12
    post(req, 0, OP.SEND, 100, 3, signaled=False)       # 13
    post(req, 1, OP.SEND, 100, 9)                       # 50
    sent(req, until=3000)
    req.receive(reply(0, 12, syndrome=syndrome))        # the second packet of WR 2
    assert [(c.wr_id, c.qp, c.status) for c in req.pop_completions()] == [
        (1, 0, WS.SUCCESS), (2, 0, status), (3, 0, WS.WR_FLUSH_ERR)]
    assert req.read_qp(0)["state"] == proto.QPState.ERROR and req.outstanding(0) == (0, 0)
    assert req.post(qp=0, opcode=OP.SEND, payload=b"", wr_id=4).status == WS.LOC_QP_OP_ERR
    req.pop_completions()
    req.receive(reply(1, 50))
    assert [(c.wr_id, c.status) for c in req.pop_completions()] == [(9, WS.SUCCESS)]
    assert req.idle() and sent(req) == []


# --- timers -------------------------------------------------------------------------------------

@pytest.mark.parametrize("retry_cnt", [0, 2, 7])
def test_timeout_exact_and_retry_cnt_is_a_count(retry_cnt):
    """retry_cnt n allows exactly n retries (7 is not infinite); each timeout fires exactly
    4.096 us * 2**t after the timer was armed; the other QP is undisturbed."""
    req = make(timer_slack_cycles=5)
    open_qp(req, 0, psn=7, retry_cnt=retry_cnt, timeout=1)      # 1280 cycles
    open_qp(req, 1, psn=70, timeout=1)
    post(req, 0, OP.SEND, 10, 1)
    post(req, 0, OP.SEND, 10, 2)
    post(req, 1, OP.SEND, 10, 3)
    first = sent(req, until=30)
    assert [(f.qp, f.first) for f in first] == [(0, 0), (1, 9), (0, 18)]   # per message
    req.receive(reply(1, 70))
    req.run_until(1_000_000)
    tx = req.pop_tx()
    timeouts = [e for e in req.events if e.kind == "ack_timeout"]
    assert [e.cycle for e in timeouts] == [1280 * (k + 1) for k in range(retry_cnt + 1)]
    assert all(e.due == e.cycle and e.latest == e.cycle + 5 for e in timeouts)
    assert [f.first for f in tx] == [c for e in timeouts[:-1] for c in (e.cycle, e.cycle + 9)]
    assert [(c.wr_id, c.status) for c in req.pop_completions()] == [
        (3, WS.SUCCESS), (1, WS.RETRY_EXC_ERR), (2, WS.WR_FLUSH_ERR)]
    assert req.read_qp(0)["state"] == proto.QPState.ERROR
    assert req.read_qp(1)["state"] == proto.QPState.RTS
    assert req.qp_stats(0)["retransmitted"] == 2 * retry_cnt


def test_no_timer_when_timeout_is_zero():
    req = make()
    open_qp(req, 0, timeout=0)
    post(req, 0, OP.SEND, 10, 1)
    sent(req)
    assert req.next_event() is None and not req.idle()
    req.run_until(10**9)
    assert req.events == [] and req.pop_completions() == []


def test_progress_rearms_the_timer_and_reloads_retry():
    req = make()
    open_qp(req, 0, psn=0, retry_cnt=1, timeout=1)
    for n in range(3):
        post(req, 0, OP.SEND, 10, n + 1)
    sent(req, until=1280)                               # 3 packets, timer due at 1280
    req.run_until(1281)                                 # timeout 1: replay, retry_left 0
    assert [e.cycle for e in req.events] == [1280]
    req.run_until(2000)
    req.pop_tx()
    req.receive(reply(0, 0))                            # progress at 2000: retry reloads
    req.run_until(2000 + 1280)
    assert [e.cycle for e in req.events] == [1280]      # re-armed at 2000, not at 1280 + 1280
    req.run_until(2000 + 1281)
    assert [e.cycle for e in req.events] == [1280, 3280]
    assert req.read_qp(0)["state"] == proto.QPState.RTS     # a retry was left again
    req.receive(reply(0, 2))
    assert [c.wr_id for c in req.pop_completions()] == [1, 2, 3]


def test_pause_freezes_the_timer():
    req = make()
    open_qp(req, 0, timeout=1)
    post(req, 0, OP.SEND, 10, 1)
    req.run_until(500)
    req.set_pause(True)
    req.run_until(1500)
    assert req.next_event() is None                     # frozen
    req.set_pause(False)
    req.run_until(10_000)
    assert req.events[0].cycle == 1280 + 1000


def test_rnr_wait_is_never_short_and_the_ack_timer_does_not_cut_it():
    req = make()
    open_qp(req, 0, psn=5, rnr_retry=2, timeout=1)      # ACK timeout 1280 cycles
    post(req, 0, OP.SEND, 10, 1)
    post(req, 0, OP.SEND, 10, 2)
    sent(req, until=100)
    wait = rnr_wait_cycles(14, CLK)                     # 1.28 ms = 200,000 cycles
    assert wait == 200_000
    for k in range(3):
        req.receive(reply(0, 5, syndrome=0x20 | 14))
        c = req.cycle
        if k == 2:
            break
        tx = sent(req, until=c + wait + 100)
        assert tx[0].first == c + wait and [f.psn for f in tx] == [5, 6]
        assert not [e for e in req.events if e.kind == "ack_timeout"]
    assert [(x.wr_id, x.status) for x in req.pop_completions()] == [
        (1, WS.RNR_RETRY_EXC_ERR), (2, WS.WR_FLUSH_ERR)]
    assert req.counters["rnr_waits"] == 2 and req.counters["rnr_retry_exceeded"] == 1


def test_rnr_retry_7_survives_1000_rnr_naks():
    req = make()
    open_qp(req, 0, psn=5, rnr_retry=7, timeout=1)
    post(req, 0, OP.SEND, 10, 1)
    sent(req, until=100)
    wait = rnr_wait_cycles(1, CLK)
    for _ in range(1000):
        req.receive(reply(0, 5, syndrome=0x21))
        c = req.cycle
        req.run_until(c + wait)
        assert req.pop_tx() == []
        req.run_until(c + wait + 1)
        assert [f.psn for f in req.pop_tx()] == [5]
    req.receive(reply(0, 5))
    assert [(x.wr_id, x.status) for x in req.pop_completions()] == [(1, WS.SUCCESS)]
    assert req.counters["rnr_waits"] == 1000


def test_sequence_nak_during_an_rnr_wait_only_retires():
    req = make()
    open_qp(req, 0, psn=20, timeout=1)
    for n in range(3):
        post(req, 0, OP.SEND, 10, n + 1)                # 20, 21, 22
    sent(req, until=100)
    req.receive(reply(0, 21, syndrome=0x21))            # WR 1 done, WR 2 not ready
    req.receive(reply(0, 21, syndrome=0x60))            # the responder saw 22 behind it
    assert req.counters["nak_seq_in_rnr_wait"] == 1 and req.pop_tx() == []
    assert [c.wr_id for c in req.pop_completions()] == [1]
    tx = sent(req, until=req.cycle + rnr_wait_cycles(1, CLK) + 50)
    assert [f.psn for f in tx] == [21, 22]


# --- buffer ----------------------------------------------------------------------------------

def test_shared_buffer_one_qp_may_use_all_of_it():
    req = make(buffer_bytes=8192)
    open_qp(req, 0)
    open_qp(req, 1)
    post(req, 0, OP.RDMA_WRITE, 65536, 1)
    post(req, 1, OP.SEND, 100, 2)
    tx = sent(req)
    assert [f.qp for f in tx] == [0] * 8                # no static split: QP 0 takes 8 KiB
    assert req.buffer_used == 8192


def test_qp_cap_lets_other_qps_flow_and_nothing_is_freed_before_its_ack():
    req = make(buffer_bytes=8192, qp_cap_bytes=4096)
    open_qp(req, 0, psn=0)
    open_qp(req, 1, psn=0)
    post(req, 0, OP.RDMA_WRITE, 65536, 1)
    for n in range(6):
        post(req, 1, OP.SEND, 1000, 10 + n)
    tx = sent(req)
    assert [f.qp for f in tx] == [0] * 4 + [1] * 4      # each up to its cap
    assert req.outstanding(0) == (4, 4096) and req.outstanding(1) == (4, 4000)
    req.run_until(req.cycle + 10**6)
    assert req.pop_tx() == [] and req.buffer_used == 8096
    req.receive(reply(1, 3))
    assert [c.wr_id for c in req.pop_completions()] == [10, 11, 12, 13]
    assert [f.qp for f in sent(req)] == [1, 1]


def test_ack_requested_when_the_window_is_half_full():
    """A window smaller than ack_req_every packets: the packets that leave the pool more than
    half full ask for an ACK, so it never fills without one."""
    req = make(buffer_bytes=8192)
    open_qp(req, 0, psn=0)
    post(req, 0, OP.RDMA_WRITE, 65536, 1)
    tx = sent(req)
    assert [bth(f.data).ackreq for f in tx] == [0, 0, 0, 0, 1, 1, 1, 1]
    req.receive(reply(0, 7))
    assert [bth(f.data).ackreq for f in sent(req)] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_ack_requested_when_half_the_timeout_is_gone():
    req = make()
    open_qp(req, 0, psn=0, timeout=1)                   # 1280 cycles; half = 640
    post(req, 0, OP.RDMA_WRITE, 10 * 1024, 1)
    tx = sent(req, until=1000)
    # FIRST (with RETH) 1098 bytes = 138 cycles, MIDDLE 1082 bytes = 136 cycles: the packet at
    # 682 is the first after 640
    assert [(f.first, bth(f.data).ackreq) for f in tx[:7]] == [
        (0, 0), (138, 0), (274, 0), (410, 0), (546, 0), (682, 1), (818, 1)]


def test_psn_cap():
    assert PSN_CAP == (1 << 23) - 1


# --- QP table, CNPs ------------------------------------------------------------------------------

def test_close_and_reopen_flushes_and_starts_at_the_new_psn():
    req = make()
    open_qp(req, 0, psn=100, timeout=1)
    post(req, 0, OP.RDMA_WRITE, 3000, 1)
    post(req, 0, OP.SEND, 10, 2)
    sent(req, until=200)                                # part sent
    open_qp(req, 0, psn=0x5000, timeout=1)              # reopen with a new PSN
    assert [(c.wr_id, c.status) for c in req.pop_completions()] == [
        (1, WS.WR_FLUSH_ERR), (2, WS.WR_FLUSH_ERR)]
    assert req.buffer_used == 0 and req.idle()
    req.receive(reply(0, 100))                          # the old connection's ACK
    assert req.counters["acks_stale"] + req.counters["psn_unsent"] == 1
    post(req, 0, OP.SEND, 10, 3)
    tx = sent(req, until=req.cycle + 1000)
    assert [bth(f.data).psn for f in tx] == [0x5000]
    assert not [e for e in req.events if e.kind == "ack_timeout"]


def test_cnps_are_counted_per_qp():
    req = make()
    open_qp(req, 1)
    path = QPPath(src_mac=PEER_MAC, dst_mac=LOCAL_MAC, src_ip=peer_ip(1), dst_ip=LOCAL_IP,
                  dest_qp=proto.LOCAL_QPN_BASE + 1, udp_sport=0)
    req.receive(build_cnp_frame(path))
    req.receive(build_cnp_frame(path))
    path.dest_qp = 0x11
    req.receive(build_cnp_frame(path))
    assert req.qp_stats(1)["cnp"] == 2 and req.counters["cnps"] == 2 and req.counters["unknown_qp"] == 1
