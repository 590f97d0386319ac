# SPDX-License-Identifier: BSD-2-Clause
"""The seeded lossy network (sim.lossy): timing, each fault, targeted drops, determinism,
parameter checks. Corrupted frames are checked with zlib-based iCRC and the independent
responder model."""

import pytest

from roce_hw import proto
from roce_hw.model.icrc import frame_icrc_ok
from roce_hw.model.packet import QPPath, build_ack_frame, build_cnp_frame, build_request_frame
from roce_hw.model.segment import segment_message
from sim.lossy import LossyLink, LossyNetwork, frame_class
from sim.peer import ResponderModel

__all__ = []

PATH = QPPath(src_mac=0x020000000001, dst_mac=0x020000000002, src_ip=0x0A000001,
              dst_ip=0x0A000002, dest_qp=0x11, udp_sport=0xC000)
BACK = QPPath(src_mac=0x020000000002, dst_mac=0x020000000001, src_ip=0x0A000002,
              dst_ip=0x0A000001, dest_qp=0x100, udp_sport=0xC000)


def data(psn, n=100, qp=0x11):
    PATH.dest_qp = qp
    spec = segment_message(proto.WrOpcode.SEND, bytes(range(n % 256)) * (n // 256 + 1),
                           pmtu=4096, start_psn=psn)[0]
    return build_request_frame(PATH, spec, ip_id=psn & 0xFFFF)


def ack(psn, syndrome=0x1F):
    return build_ack_frame(BACK, psn=psn, syndrome=syndrome)


def run(link, frames, start=0, step=10):
    for k, f in enumerate(frames):
        link.put(f, start + k * step)
    return link.pop(10**9)


def test_frame_classes():
    assert frame_class(data(5))[:3] == ("data", 0x11, 5)
    assert frame_class(ack(7)) == ("ack", 0x100, 7, 0x1F)
    assert frame_class(ack(7, 0x60)).cls == "nak"
    assert frame_class(ack(7, 0x21)).cls == "nak"
    assert frame_class(build_cnp_frame(BACK)).cls == "cnp"
    assert frame_class(b"\x00" * 60).cls == "other"


def test_delay_and_order():
    link = LossyLink(delay=50)
    frames = [data(k) for k in range(5)]
    link.put(frames[0], 0)
    assert link.next_time() == 50 and link.pop(49) == []
    link.put(frames[1], 0)                             # same cycle: order kept
    for k in range(2, 5):
        link.put(frames[k], 10 * k)
    assert link.pop(10**9) == [(50, frames[0]), (50, frames[1]), (70, frames[2]),
                               (80, frames[3]), (90, frames[4])]
    assert len(link) == 0 and link.next_time() is None
    assert link.counts["frames_in"] == link.counts["frames_out"] == 5


def test_drop_rate_and_determinism():
    frames = [data(k) for k in range(4000)]
    outs = [run(LossyLink(seed=s, delay=5, drop=0.05), frames) for s in (1, 1, 2)]
    assert outs[0] == outs[1] and outs[0] != outs[2]
    lost = 4000 - len(outs[0])
    assert 140 <= lost <= 260                          # 200 expected, sd 13.8
    # what survives is in order and untouched
    got = [f for _, f in outs[0]]
    assert got == [f for f in frames if f in set(got)]


def test_corrupted_frames_fail_the_icrc_and_the_responder_drops_them():
    link = LossyLink(seed=3, delay=1, corrupt=1.0)
    frames = [data(k, n=1 + 37 * k) for k in range(200)] + [ack(k) for k in range(50)]
    out = [f for _, f in run(link, frames)]
    assert link.counts["corrupted"] == 250
    assert all(len(a) == len(b) and sum(x != y for x, y in zip(a, b)) == 1
               for a, b in zip(out, frames))
    assert not any(frame_icrc_ok(f) for f in out)
    peer = ResponderModel()
    peer.add_qp(0x11, epsn=0, remote_qpn=0x100)
    peer.post_recv(0x11, 8000, 200)
    for f in out[:200]:
        assert peer.receive(f) == []
    assert peer.counters["bad_icrc"] == 200 and peer.completions == []


def test_duplicates_follow_the_original():
    link = LossyLink(seed=4, delay=20, dup=1.0)
    out = run(link, [data(0), data(1)])
    assert out == [(20, data(0)), (20, data(0)), (30, data(1)), (30, data(1))]
    assert link.counts["duplicated"] == 2


def test_reorder_holds_a_frame_behind_the_next_ones():
    link = LossyLink(seed=5, delay=20, reorder=1.0, reorder_depth=1, max_hold=1000)
    frames = [data(k) for k in range(3)]
    link.put(frames[0], 0)                             # held, waits for 1 later frame
    assert link.pop(500) == []
    link.put(frames[1], 600)                           # held too; releases frame 0 after it
    assert link.pop(1000) == [(620, frames[0])] and len(link) == 1
    assert link.next_time() == 600 + 20 + 1000         # frame 1 comes out at its deadline
    assert link.pop(10**9) == [(1620, frames[1])]
    # with reorder 0.5 every frame comes out, in a different order
    link = LossyLink(seed=6, delay=20, reorder=0.5, reorder_depth=3)
    frames = [data(k) for k in range(100)]
    got = [f for _, f in run(link, frames)]
    assert sorted(got) == sorted(frames) and got != frames
    assert link.counts["reordered"] > 20


def test_extra_delay():
    link = LossyLink(seed=7, delay=10, delay_p=1.0, delay_max=30)
    out = run(link, [data(k) for k in range(200)], step=1000)
    extra = [t - 1000 * k - 10 for k, (t, _) in enumerate(out)]
    assert min(extra) >= 1 and max(extra) <= 30 and len(set(extra)) > 20


def test_targeted_drops():
    link = LossyLink(delay=1, drop_data={1}, drop_ack={0}, drop_nak={1}, drop_retx={0})
    seq = [data(0), data(1), data(2), ack(0), ack(1), ack(5, 0x60), ack(6, 0x21), ack(7, 0x61),
           data(1), data(2), data(2)]
    out = [f for _, f in run(link, seq)]
    # dropped: data #1; ack #0; nak #1 (the RNR NAK); retransmission #0 (the 2nd data(1))
    assert out == [seq[k] for k in (0, 2, 4, 5, 7, 9, 10)]
    assert link.counts["targeted_dropped"] == 4 and link.counts["in_retx"] == 3


def test_qp_drop_overrides_the_drop_probability():
    link = LossyLink(seed=8, delay=1, qp_drop={0x12: 1.0})
    frames = [data(k, qp=0x11 + k % 2) for k in range(20)]
    out = [f for _, f in run(link, frames)]
    assert out == frames[::2] and link.counts["dropped"] == 10


def test_network_directions_are_independent_and_seeded():
    a = LossyNetwork(5, delay=3, drop=0.5)
    b = LossyNetwork(5, delay=3, drop=0.5, rev={"drop": 0.0})
    frames = [data(k) for k in range(200)]
    got_a = run(a.fwd, frames)
    assert got_a == run(b.fwd, frames) and got_a != run(a.rev, frames)
    assert len(run(b.rev, frames)) == 200
    assert set(a.counts) == {"fwd", "rev"}


@pytest.mark.parametrize("kw", [dict(drop=1.5), dict(dup=-0.1), dict(reorder="x"),
                                dict(corrupt=2), dict(delay_p=True), dict(delay=0),
                                dict(delay_p=0.5, delay_max=0), dict(reorder_depth=0),
                                dict(max_hold=0), dict(qp_drop={1: 7}), dict(drop_data=[-1]),
                                dict(drop_ack=["a"]), dict(delay=1.5)])
def test_bad_parameters(kw):
    with pytest.raises(ValueError):
        LossyLink(**kw)
