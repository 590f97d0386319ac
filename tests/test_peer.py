# SPDX-License-Identifier: BSD-2-Clause
"""The independent responder model (sim.peer) against real rxe captures, scapy-built frames and
every class of malformed request."""

import random
import struct

import pytest
from scapy.contrib import roce as sroce
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from roce_hw.model.icrc import icrc_bytes
from sim.pcap import read_capture
from sim.peer import Completion, ResponderModel, Violation, deliver

__all__ = []

# --- golden captures ---------------------------------------------------------------------------

GOLDEN_RC = ["rdma_write_bw.pcap", "rdma_send_bw.pcap", "rdma_write_lat.pcap", "pingpong_rc.pcap"]

#: per capture: (request frames, ACK frames, completed messages), counted with tshark
#: ("udp.dstport == 4791", by opcode) when this test was written
GOLDEN_COUNTS = {"rdma_write_bw.pcap": (15, 5, 5), "rdma_send_bw.pcap": (15, 5, 5),
                 "rdma_write_lat.pcap": (10, 10, 10), "pingpong_rc.pcap": (10, 10, 10)}


def _roce(frames):
    """Untagged IPv4/UDP frames to port 4791, picked with plain byte offsets."""
    return [f for f in frames if len(f) >= 58 and f[12:14] == b"\x08\x00" and f[14] == 0x45
            and f[23] == 17 and struct.unpack_from("!H", f, 36)[0] == 4791]


def _opcode(f):
    return f[42]


def _dqp(f):
    return int.from_bytes(f[47:50], "big")


def _psn(f):
    return int.from_bytes(f[51:54], "big")


_EXT = {0x00: 0, 0x01: 0, 0x02: 0, 0x03: 4, 0x04: 0, 0x05: 4, 0x06: 16, 0x07: 0, 0x08: 0,
        0x09: 4, 0x0A: 16, 0x0B: 20}


def _payload(f):
    pad = (f[43] >> 4) & 3
    return f[54 + _EXT[_opcode(f)]:len(f) - 4 - pad]


@pytest.mark.parametrize("name", GOLDEN_RC)
def test_golden_capture_requests_and_acks(golden_dir, name):
    """Every RC request of a real rxe capture is accepted with zero violations, and the ACKs
    the model sends equal the captured ACKs byte for byte once the IP ID is the captured one."""
    roce = _roce([p.data for p in read_capture(golden_dir / name)])
    requests = [f for f in roce if _opcode(f) <= 0x0B]
    n_req, n_ack, n_msg = GOLDEN_COUNTS[name]
    assert len(requests) == n_req
    total_acks = total_msgs = 0
    for qpn in sorted({_dqp(f) for f in requests}):
        reqs = [f for f in requests if _dqp(f) == qpn]
        host_ip = reqs[0][30:34]
        acks = [f for f in roce if _opcode(f) == 0x11 and f[26:30] == host_ip]
        peer = ResponderModel(mac=reqs[0][0:6], ip=host_ip)
        peer.add_qp(qpn, epsn=_psn(reqs[0]), pmtu=1024, remote_qpn=_dqp(acks[0]))
        reths = [struct.unpack_from("!QII", f, 54) for f in reqs if _opcode(f) in (0x06, 0x0A)]
        if reths:
            lo = min(va for va, _, _ in reths)
            hi = max(va + n for va, _, n in reths)
            assert len({rk for _, rk, _ in reths}) == 1
            peer.register_mr(lo, hi - lo, reths[0][1])
        peer.post_recv(qpn, size=4096, count=len(reqs))
        out = []
        for f in reqs:
            out += peer.receive(f)
        assert peer.violations == []
        assert peer.counters["accepted"] == len(reqs)
        assert len(out) == len(acks)
        for ours, theirs in zip(out, acks):
            assert _opcode(ours) == _opcode(theirs) == 0x11
            assert _psn(ours) == _psn(theirs)
            assert _dqp(ours) == _dqp(theirs)
            assert ours[54:58] == theirs[54:58]          # AETH syndrome (0x1F) and MSN
            # The whole frame, with the capture's IP ID and hence its IP checksum and iCRC
            patched = bytearray(ours)
            patched[18:20] = theirs[18:20]
            patched[24:26] = b"\0\0"
            s = sum(struct.unpack("!10H", bytes(patched[14:34])))
            s = (s & 0xFFFF) + (s >> 16)
            patched[24:26] = struct.pack("!H", ~((s & 0xFFFF) + (s >> 16)) & 0xFFFF)
            patched[-4:] = icrc_bytes(bytes(patched[14:-4]))
            assert bytes(patched) == theirs
        # completed messages carry exactly the payload bytes of the captured packets
        messages, cur = [], b""
        for f in reqs:
            cur += _payload(f)
            if _opcode(f) in (0x02, 0x03, 0x04, 0x05, 0x08, 0x09, 0x0A, 0x0B):
                messages.append(cur)
                cur = b""
        assert [c.data for c in peer.completions] == messages
        assert [c.msn for c in peer.completions] == list(range(1, len(messages) + 1))
        total_acks += len(out)
        total_msgs += len(peer.completions)
    assert (total_acks, total_msgs) == (n_ack, n_msg)


# --- scapy-built requests ----------------------------------------------------------------------

A_MAC, B_MAC = "02:00:00:00:00:0a", "02:00:00:00:00:0b"
A_IP, B_IP = "10.0.0.1", "10.0.0.2"
QPN, REMOTE_QPN, EPSN, RKEY, VA = 0x123, 0x45, 0xFFFFFE, 0x1234, 0x10000
SPORT = 0xC123

OP = {"SEND_FIRST": 0x00, "SEND_MIDDLE": 0x01, "SEND_LAST": 0x02, "SEND_LAST_IMM": 0x03,
      "SEND_ONLY": 0x04, "SEND_ONLY_IMM": 0x05, "WRITE_FIRST": 0x06, "WRITE_MIDDLE": 0x07,
      "WRITE_LAST": 0x08, "WRITE_LAST_IMM": 0x09, "WRITE_ONLY": 0x0A, "WRITE_ONLY_IMM": 0x0B,
      "READ": 0x0C}


def frame(op, psn, payload=b"", *, reth=None, imm=None, ackreq=None, se=0, qpn=QPN, pad=None,
          pad_bytes=None, uc=False, ip_flags="DF", pkey=0xFFFF, ip_id=1):
    """A request built with scapy (contrib.roce BTH computes the iCRC) + raw RETH/ImmDt bytes."""
    opcode = OP[op] | (0x20 if uc else 0)
    ext = b""
    if reth is not None:
        ext += struct.pack("!QII", *reth)
    if imm is not None:
        ext += struct.pack("!I", imm)
    n_pad = (-len(payload)) & 3
    pad = n_pad if pad is None else pad
    pad_bytes = bytes(pad) if pad_bytes is None else pad_bytes
    if ackreq is None:
        ackreq = int(op.endswith(("LAST", "ONLY", "IMM", "READ")))
    pkt = (Ether(src=A_MAC, dst=B_MAC) / IP(src=A_IP, dst=B_IP, flags=ip_flags, id=ip_id) /
           UDP(sport=SPORT, dport=4791, chksum=0) /
           sroce.BTH(opcode=opcode, solicited=se, padcount=pad, pkey=pkey, dqpn=qpn,
                     ackreq=ackreq, psn=psn & 0xFFFFFF) /
           Raw(ext + payload + pad_bytes))
    return bytes(pkt)


def make_peer(*, recv=4, pmtu=1024, transport="RC", mr_len=16384):
    peer = ResponderModel(mac=B_MAC, ip=B_IP, ip_id_start=100)
    peer.add_qp(QPN, epsn=EPSN, pmtu=pmtu, transport=transport, remote_qpn=REMOTE_QPN)
    peer.register_mr(VA, mr_len, RKEY)
    peer.post_recv(QPN, size=4096, count=recv)
    return peer


def scapy_ack(f):
    """(opcode, dest QP, PSN, syndrome, MSN) decoded by scapy, after checking with scapy that the
    iCRC, IP checksum and lengths of the response are what scapy itself would compute."""
    p = Ether(f)
    assert p[UDP].dport == 4791 and p[UDP].sport == SPORT and p[UDP].chksum == 0
    assert p[IP].src == B_IP and p[IP].dst == A_IP and p[IP].flags == "DF" and p[IP].ttl == 64
    assert p[Ether].src == B_MAC and p[Ether].dst == A_MAC
    q = Ether(f)
    q[sroce.BTH].icrc = None
    del q[IP].chksum, q[IP].len, q[UDP].len
    assert bytes(q) == f, "iCRC/checksum/length of the response differ from scapy's"
    bth = p[sroce.BTH]
    if bth.opcode == 0x11:
        return bth.opcode, bth.dqpn, bth.psn, p[sroce.AETH].syndrome, p[sroce.AETH].msn
    return bth.opcode, bth.dqpn, bth.psn, None, None


def _data(n, seed):
    return random.Random(seed).randbytes(n)


def test_scapy_write_and_send_accepted():
    peer = make_peer()
    wdata, sdata = _data(2500, 1), _data(1499, 2)
    frames = [
        frame("WRITE_FIRST", EPSN, wdata[:1024], reth=(VA + 8, RKEY, 2500)),
        frame("WRITE_MIDDLE", EPSN + 1, wdata[1024:2048]),
        frame("WRITE_LAST", EPSN + 2, wdata[2048:]),                       # PSN wraps to 0
        frame("SEND_FIRST", EPSN + 3, sdata[:1024]),
        frame("SEND_LAST", EPSN + 4, sdata[1024:], se=1),                  # 475 B, pad 1
        frame("SEND_ONLY_IMM", EPSN + 5, b"abcdefg", imm=0xCAFEF00D),
        frame("WRITE_ONLY_IMM", EPSN + 6, b"12345", reth=(VA + 4000, RKEY, 5), imm=7),
        frame("WRITE_ONLY", EPSN + 7, b"", reth=(0, 0, 0)),                # 0 bytes, any key
        frame("SEND_ONLY", EPSN + 8, b""),
    ]
    out = []
    for f in frames:
        out += peer.receive(f)
    assert peer.violations == []
    assert peer.counters["accepted"] == 9
    assert [scapy_ack(f) for f in out] == [
        (0x11, REMOTE_QPN, (EPSN + k) & 0xFFFFFF, 0x1F, msn)
        for k, msn in [(2, 1), (4, 2), (5, 3), (6, 4), (7, 5), (8, 6)]]
    assert peer.read_memory(VA + 8, 2500) == wdata
    assert peer.read_memory(VA + 4000, 5) == b"12345"
    assert peer.read_memory(VA, 8) == bytes(8)
    got = [(c.kind, c.data, c.imm, c.solicited, c.va, c.length) for c in peer.completions]
    assert got == [("WRITE", wdata, None, False, VA + 8, 2500),
                   ("SEND", sdata, None, True, None, 1499),
                   ("SEND_IMM", b"abcdefg", 0xCAFEF00D, False, None, 7),
                   ("WRITE_IMM", b"12345", 7, False, VA + 4000, 5),
                   ("WRITE", b"", None, False, 0, 0),
                   ("SEND", b"", None, False, None, 0)]
    # the 2-packet SEND, SEND_IMM, WRITE_IMM and the empty SEND used the 4 receive buffers
    assert peer.qp_state(QPN) == {"epsn": (EPSN + 9) & 0xFFFFFF, "msn": 6, "error": None,
                                  "recv_posted": 0, "in_message": False}


def test_rnr_nak_then_retry():
    peer = make_peer(recv=0)
    f = frame("SEND_ONLY", EPSN, b"hello")
    out = peer.receive(f)
    assert [scapy_ack(x) for x in out] == [(0x11, REMOTE_QPN, EPSN, 0x20 | 12, 0)]
    assert [v.kind for v in peer.violations] == ["rnr"]
    assert peer.counters["rnr_naks_sent"] == 1 and peer.qp_state(QPN)["epsn"] == EPSN
    peer.post_recv(QPN, size=64)
    out = peer.receive(f)                                   # the requester retries the same PSN
    assert [scapy_ack(x) for x in out] == [(0x11, REMOTE_QPN, EPSN, 0x1F, 1)]
    assert [c.data for c in peer.completions] == [b"hello"]


def test_send_longer_than_receive_buffer():
    peer = ResponderModel()
    peer.add_qp(QPN, epsn=0, remote_qpn=REMOTE_QPN)
    peer.post_recv(QPN, size=100)
    out = peer.receive(frame("SEND_ONLY", 0, bytes(101)))
    assert [scapy_ack(x)[3] for x in out] == [0x61]
    assert peer.violations[0].kind == "recv_overflow"


def test_read_request_answered_from_memory():
    peer = make_peer()
    data = _data(2101, 3)
    peer.regions[0].data[100:100 + 2101] = data
    out = peer.receive(frame("READ", EPSN, reth=(VA + 100, RKEY, 2101)))
    assert peer.violations == []
    assert [(Ether(f)[sroce.BTH].opcode, Ether(f)[sroce.BTH].psn) for f in out] == [
        (0x0D, EPSN), (0x0E, (EPSN + 1) & 0xFFFFFF), (0x0F, (EPSN + 2) & 0xFFFFFF)]
    for f in out:
        scapy_ack(f)                                         # iCRC/lengths as scapy computes
    # FIRST and LAST carry an AETH (ACK, MSN 1), MIDDLE does not; then payload + pad
    assert out[0][54:58] == b"\x1f\x00\x00\x01" and out[2][54:58] == b"\x1f\x00\x00\x01"
    # the LAST carries 53 bytes, PadCnt 3 and three zero pad bytes
    assert Ether(out[2])[sroce.BTH].padcount == 3 and out[2][-7:-4] == b"\0\0\0"
    body = out[0][58:-4] + out[1][54:-4] + out[2][58:-7]
    assert body == data
    assert peer.qp_state(QPN)["epsn"] == (EPSN + 3) & 0xFFFFFF
    # a WRITE after the READ continues at the PSN after the responses
    out = peer.receive(frame("WRITE_ONLY", EPSN + 3, b"xy", reth=(VA, RKEY, 2)))
    assert [scapy_ack(f)[2:] for f in out] == [((EPSN + 3) & 0xFFFFFF, 0x1F, 2)]
    # a duplicate READ (retry from the second response) is replayed from its RETH
    out = peer.receive(frame("READ", EPSN + 1, reth=(VA + 100 + 1024, RKEY, 2101 - 1024)))
    assert [Ether(f)[sroce.BTH].opcode for f in out] == [0x0E, 0x0F]
    assert peer.counters["duplicates"] == 1 and peer.violations == []


def test_uc_no_acks_and_drop_until_first():
    peer = make_peer(transport="UC")
    d = _data(3000, 4)
    out = []
    out += peer.receive(frame("WRITE_FIRST", EPSN, d[:1024], reth=(VA, RKEY, 3000), uc=True,
                              ackreq=0))
    # the MIDDLE is lost: LAST arrives with a PSN gap and is dropped
    out += peer.receive(frame("WRITE_LAST", EPSN + 2, d[2048:], uc=True, ackreq=0))
    # next message: ONLY is accepted again only after the broken message is abandoned
    out += peer.receive(frame("SEND_ONLY", EPSN + 3, b"ok", uc=True, ackreq=0))
    out += peer.receive(frame("SEND_ONLY", EPSN + 4, b"ok2", uc=True, ackreq=0))
    assert out == []
    kinds = [v.kind for v in peer.violations]
    assert kinds == ["uc_dropped", "bad_op_seq"]               # rxe D1E: the ONLY is lost too
    assert [c.data for c in peer.completions] == [b"ok2"]


# --- every violation class ---------------------------------------------------------------------

def _kinds(peer):
    return [v.kind for v in peer.violations]


def test_bad_icrc_dropped_silently():
    peer = make_peer()
    good = frame("SEND_ONLY", EPSN, b"payload!")
    bad = bytearray(good)
    bad[60] ^= 0x04
    assert peer.receive(bytes(bad)) == []
    assert _kinds(peer) == ["bad_icrc"] and peer.counters["bad_icrc"] == 1
    assert peer.qp_state(QPN)["epsn"] == EPSN
    assert len(peer.receive(good)) == 1 and peer.counters["accepted"] == 1


def test_psn_ahead_one_nak_then_silence():
    peer = make_peer()
    out = peer.receive(frame("SEND_ONLY", EPSN + 2, b"a"))
    assert [scapy_ack(f) for f in out] == [(0x11, REMOTE_QPN, EPSN, 0x60, 0)]
    assert peer.receive(frame("SEND_ONLY", EPSN + 3, b"b")) == []
    assert peer.receive(frame("SEND_ONLY", EPSN + 4, b"c")) == []
    assert peer.counters["seq_errors"] == 1 and peer.counters["out_of_seq_dropped"] == 2
    assert peer.counters["naks_sent"] == 1
    # go-back-N: the requester resends from ePSN
    out = []
    for k, d in enumerate([b"z", b"a", b"b"]):
        out += peer.receive(frame("SEND_ONLY", EPSN + k, d))
    assert [scapy_ack(f)[2:] for f in out] == [
        (EPSN, 0x1F, 1), ((EPSN + 1) & 0xFFFFFF, 0x1F, 2), ((EPSN + 2) & 0xFFFFFF, 0x1F, 3)]
    # a new gap after recovery gets a new NAK
    out = peer.receive(frame("SEND_ONLY", EPSN + 9, b"x"))
    assert [scapy_ack(f)[2:] for f in out] == [((EPSN + 3) & 0xFFFFFF, 0x60, 3)]
    assert all(v.kind == "psn_ahead" for v in peer.violations)


def test_duplicate_reacked_not_reexecuted():
    peer = make_peer()
    peer.receive(frame("WRITE_ONLY", EPSN, b"AAAA", reth=(VA, RKEY, 4)))
    peer.receive(frame("WRITE_ONLY", EPSN + 1, b"BBBB", reth=(VA + 4, RKEY, 4)))
    out = peer.receive(frame("WRITE_ONLY", EPSN, b"CCCC", reth=(VA, RKEY, 4)))
    assert [scapy_ack(f)[2:] for f in out] == [((EPSN + 1) & 0xFFFFFF, 0x1F, 2)]
    assert peer.counters["duplicates"] == 1 and peer.violations == []
    assert peer.read_memory(VA, 8) == b"AAAABBBB" and len(peer.completions) == 2
    # a duplicate FIRST without AckReq is re-ACKed too (rxe C9-105)
    out = peer.receive(frame("SEND_FIRST", EPSN - 5, bytes(1024)))
    assert [scapy_ack(f)[2:] for f in out] == [((EPSN + 1) & 0xFFFFFF, 0x1F, 2)]


def test_middle_without_first():
    peer = make_peer()
    out = peer.receive(frame("WRITE_MIDDLE", EPSN, bytes(1024)))
    assert [scapy_ack(f)[2:] for f in out] == [(EPSN, 0x61, 0)]
    assert _kinds(peer) == ["bad_op_seq"] and "without a preceding FIRST" in \
        peer.violations[0].reason
    assert peer.qp_state(QPN)["error"]
    # the QP is now in the error state: everything is dropped
    assert peer.receive(frame("SEND_ONLY", EPSN + 1, b"x")) == []
    assert _kinds(peer)[-1] == "qp_error"


def test_new_message_inside_a_message():
    peer = make_peer()
    peer.receive(frame("SEND_FIRST", EPSN, bytes(1024)))
    out = peer.receive(frame("WRITE_ONLY", EPSN + 1, b"x", reth=(VA, RKEY, 1)))
    assert [scapy_ack(f)[3] for f in out] == [0x61]
    assert _kinds(peer) == ["bad_op_seq"] and "SEND message is in progress" in \
        peer.violations[0].reason


@pytest.mark.parametrize("op,n", [("WRITE_MIDDLE", 1000), ("WRITE_MIDDLE", 1028),
                                  ("WRITE_FIRST", 1020), ("WRITE_LAST", 0)])
def test_wrong_packet_size(op, n):
    peer = make_peer()
    f0 = frame("WRITE_FIRST", EPSN, bytes(1024), reth=(VA, RKEY, 3000))
    if op == "WRITE_FIRST":
        f0 = frame("WRITE_FIRST", EPSN, bytes(n), reth=(VA, RKEY, 3000))
        frames = [f0]
    else:
        frames = [f0, frame(op, EPSN + 1, bytes(n))]
    out = []
    for f in frames:
        out += peer.receive(f)
    assert [scapy_ack(f)[3] for f in out] == [0x61]
    assert _kinds(peer) == ["bad_length"]


@pytest.mark.parametrize("sizes,dma", [([64], 100), ([1024, 1024, 900], 3000),
                                       ([1024, 1024, 952], 2500), ([1024, 1024], 2048 + 10)])
def test_reth_length_mismatch(sizes, dma):
    peer = make_peer()
    ops = (["WRITE_ONLY"] if len(sizes) == 1 else
           ["WRITE_FIRST"] + ["WRITE_MIDDLE"] * (len(sizes) - 2) + ["WRITE_LAST"])
    out = []
    for k, (op, n) in enumerate(zip(ops, sizes)):
        reth = (VA, RKEY, dma) if k == 0 else None
        out += peer.receive(frame(op, EPSN + k, bytes(n), reth=reth))
    assert _kinds(peer) == ["reth_length"]
    assert [scapy_ack(f)[3] for f in out] == [0x61]
    assert peer.completions == []


def test_pad_bytes_nonzero_reported_but_accepted():
    peer = make_peer()
    out = peer.receive(frame("SEND_ONLY", EPSN, b"12345", pad_bytes=b"\x00\x07\x00"))
    assert len(out) == 1 and [c.data for c in peer.completions] == [b"12345"]
    assert _kinds(peer) == ["pad_nonzero"] and not peer.violations[0].fatal


def test_wrong_padcnt():
    peer = make_peer()
    # PadCnt 2 with 2 pad bytes after 5 payload bytes: BTH..pad is not 4-byte aligned
    assert peer.receive(frame("SEND_ONLY", EPSN, b"12345", pad=2, pad_bytes=b"\0\0")) == []
    assert _kinds(peer) == ["bad_padcnt"] and peer.counters["malformed"] == 1
    # PadCnt 1 on a 64-byte WRITE without pad bytes: the responder sees 63 bytes != DMA length
    out = peer.receive(frame("WRITE_ONLY", EPSN, bytes(64), reth=(VA, RKEY, 64), pad=1,
                             pad_bytes=b""))
    assert _kinds(peer) == ["bad_padcnt", "reth_length"]
    assert [scapy_ack(f)[3] for f in out] == [0x61]
    # PadCnt 0 on a 1-byte WRITE LAST followed by 3 zero pad bytes: the frame is aligned, but
    # the responder sees a 4-byte payload where the RETH leaves 1 byte
    peer = make_peer()
    peer.receive(frame("WRITE_FIRST", EPSN, bytes(1024), reth=(VA, RKEY, 1024 + 1)))
    out = peer.receive(frame("WRITE_LAST", EPSN + 1, b"\x01\0\0\0", pad=0, pad_bytes=b""))
    assert _kinds(peer) == ["reth_length"]
    assert [scapy_ack(f)[3] for f in out] == [0x61]


def test_padcnt_larger_than_packet():
    peer = make_peer()
    assert peer.receive(frame("SEND_ONLY", EPSN, b"", pad=3, pad_bytes=b"")) == []
    assert _kinds(peer) == ["bad_padcnt"]


def test_bad_ipv4_checksum():
    peer = make_peer()
    f = bytearray(frame("SEND_ONLY", EPSN, b"abcd"))
    f[24] ^= 0x10                      # checksum byte; masked out of the iCRC
    assert peer.receive(bytes(f)) == []
    assert _kinds(peer) == ["bad_ip_checksum"]


def test_unknown_qp():
    peer = make_peer()
    assert peer.receive(frame("SEND_ONLY", EPSN, b"abcd", qpn=QPN + 1)) == []
    assert _kinds(peer) == ["unknown_qp"] and peer.counters["unknown_qp"] == 1
    assert peer.receive(frame("SEND_ONLY", EPSN, b"abcd", qpn=0)) == []
    assert _kinds(peer) == ["unknown_qp"] * 2


@pytest.mark.parametrize("va,n,rkey", [(VA + 16384 - 100, 101, RKEY), (VA - 1, 4, RKEY),
                                       (VA, 4, RKEY + 1)])
def test_write_outside_memory_region(va, n, rkey):
    peer = make_peer()
    out = peer.receive(frame("WRITE_ONLY", EPSN, bytes(n), reth=(va, rkey, n)))
    assert [scapy_ack(f)[2:] for f in out] == [(EPSN, 0x62, 0)]
    assert _kinds(peer) == (["rkey"] if rkey != RKEY else ["out_of_region"])
    assert peer.qp_state(QPN)["error"]


def test_write_running_past_region_in_later_packet():
    peer = make_peer(mr_len=2048)
    out = peer.receive(frame("WRITE_FIRST", EPSN, bytes(1024), reth=(VA + 1024, RKEY, 3000)))
    assert [scapy_ack(f)[3] for f in out] == [0x62]


def test_layer2_to_4_checks():
    peer = make_peer()
    good = frame("SEND_ONLY", EPSN, b"abcd")
    cases = []
    f = bytearray(good)
    f[36:38] = struct.pack("!H", 4792)                      # not RoCEv2 (iCRC irrelevant)
    cases.append((bytes(f), "not_roce"))
    f = bytearray(good)
    f[0:6] = bytes.fromhex("020000000099")
    cases.append((bytes(f), "wrong_mac"))
    cases.append((frame("SEND_ONLY", EPSN, b"abcd", pkey=0x1234), "bad_pkey"))
    cases.append((frame("SEND_ONLY", EPSN, b"abcd", uc=True), "bad_transport"))
    cases.append((good[:-1], "malformed"))                   # IP total length beyond frame
    for f, kind in cases:
        assert peer.receive(f) == []
        assert _kinds(peer)[-1] == kind, (kind, peer.violations[-1])
    assert peer.counters["accepted"] == 0
    # DF clear: reported, still accepted
    out = peer.receive(frame("SEND_ONLY", EPSN, b"abcd", ip_flags=0))
    assert len(out) == 1 and _kinds(peer)[-1] == "ipv4_no_df" and not peer.violations[-1].fatal


def test_vlan_ipv6_request_and_response():
    """An 802.1Q-tagged IPv6 request is accepted; the ACK keeps the tag, swaps the addresses and
    carries the iCRC scapy computes for IPv6."""
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import Dot1Q
    a6, b6 = "fd00::1", "fd00::2"
    peer = ResponderModel(mac=B_MAC, ip=b6)
    peer.add_qp(QPN, epsn=5, remote_qpn=REMOTE_QPN)
    peer.post_recv(QPN, size=64)
    req = bytes(Ether(src=A_MAC, dst=B_MAC) / Dot1Q(vlan=42, prio=3) /
                IPv6(src=a6, dst=b6, hlim=64) / UDP(sport=SPORT, dport=4791, chksum=0) /
                sroce.BTH(opcode=0x04, dqpn=QPN, psn=5, ackreq=1, padcount=2) /
                Raw(b"hi!!!!" + b"\0\0"))
    out = peer.receive(req)
    assert peer.violations == [] and [c.data for c in peer.completions] == [b"hi!!!!"]
    assert len(out) == 1
    p = Ether(out[0])
    assert p[Dot1Q].vlan == 42 and p[Dot1Q].prio == 3
    assert (p[IPv6].src, p[IPv6].dst, p[IPv6].plen) == (b6, a6, 8 + 12 + 4 + 4)
    assert (p[sroce.BTH].opcode, p[sroce.BTH].psn, p[sroce.AETH].syndrome,
            p[sroce.AETH].msn) == (0x11, 5, 0x1F, 1)
    q = Ether(out[0])
    q[sroce.BTH].icrc = None
    assert bytes(q) == out[0]
    bad = bytearray(req)
    bad[-6] ^= 1
    assert peer.receive(bytes(bad)) == [] and _kinds(peer) == ["bad_icrc"]


def test_bad_tver():
    peer = make_peer()
    pkt = Ether(frame("SEND_ONLY", EPSN, b"abcd"))
    pkt[sroce.BTH].version = 1
    pkt[sroce.BTH].icrc = None
    assert peer.receive(bytes(pkt)) == []
    assert _kinds(peer) == ["bad_tver"]


def test_every_violation_has_a_reason():
    peer = make_peer()
    peer.receive(b"\x00" * 10)
    peer.receive(frame("WRITE_MIDDLE", EPSN, bytes(1024)))
    assert all(isinstance(v, Violation) and v.reason and str(v) for v in peer.violations)
    assert "frame 1 QP 0x123 PSN 16777214: bad_op_seq" in str(peer.violations[1])


# --- configuration errors ----------------------------------------------------------------------

def test_bad_configuration_raises():
    peer = ResponderModel()
    with pytest.raises(ValueError, match="PMTU"):
        peer.add_qp(1, epsn=0, pmtu=1500)
    with pytest.raises(ValueError, match="transport"):
        peer.add_qp(1, epsn=0, transport="UD")
    with pytest.raises(ValueError, match="QPN"):
        peer.add_qp(0, epsn=0)
    peer.add_qp(1, epsn=0)
    with pytest.raises(ValueError, match="already exists"):
        peer.add_qp(1, epsn=0)
    with pytest.raises(ValueError, match="no QP"):
        peer.post_recv(2, 100)
    with pytest.raises(ValueError, match="MAC"):
        ResponderModel(mac=b"\x00" * 5)


# --- deliver() and a long random run -----------------------------------------------------------

def _segment_by_hand(op, psn, data, *, va=0, imm=None, pmtu=1024):
    """The test's own segmentation (rxe next_opcode_rc): FIRST/MIDDLE carry PMTU bytes."""
    chunks = [data[i:i + pmtu] for i in range(0, len(data), pmtu)] or [b""]
    frames = []
    for k, c in enumerate(chunks):
        first, last = k == 0, k == len(chunks) - 1
        base = "SEND" if op.startswith("SEND") else "WRITE"
        pos = "ONLY" if first and last else "FIRST" if first else "LAST" if last else "MIDDLE"
        name = f"{base}_{pos}" + ("_IMM" if imm is not None and last else "")
        reth = (va, RKEY, len(data)) if base == "WRITE" and first else None
        frames.append(frame(name, psn + k, c, reth=reth, imm=imm if last else None,
                            ackreq=int(last)))
    return frames


def test_deliver_random_messages():
    """A seeded mix of 60 messages (0..5000 bytes, every kind) split by the test itself."""
    rng = random.Random(7)
    peer = make_peer(recv=60, mr_len=1 << 20)
    frames, expect, psn = [], [], EPSN
    for _ in range(60):
        kind = rng.choice(["SEND", "SEND_IMM", "WRITE", "WRITE_IMM"])
        data = rng.randbytes(rng.choice([0, 1, 3, 4, 1023, 1024, 1025, rng.randrange(5000)]))
        if kind in ("SEND", "SEND_IMM") and len(data) > 4096:
            data = data[:4096]
        if kind == "WRITE_IMM" and not data:
            data = b"\x01"
        imm = rng.getrandbits(32) if kind.endswith("IMM") else None
        va = VA + rng.randrange((1 << 20) - 5000)
        fs = _segment_by_hand(kind, psn, data, va=va, imm=imm)
        frames += fs
        psn += len(fs)
        expect.append((kind, data, imm))
    got = deliver(frames, peer, strict=True)
    assert all(isinstance(c, Completion) for c in got)
    assert [(c.kind, c.data, c.imm) for c in got] == expect
    assert peer.counters["acks_sent"] == 60 and peer.violations == []
    assert peer.qp_state(QPN)["epsn"] == psn & 0xFFFFFF


def test_deliver_strict_raises_on_rejection():
    peer = make_peer()
    with pytest.raises(AssertionError, match="bad_op_seq"):
        deliver([frame("SEND_LAST", EPSN, b"x")], peer, strict=True)


# --- the project's frames, checked by the independent responder ---------------------------------

@pytest.mark.parametrize("pmtu,transport,seed", [(256, "RC", 1), (1024, "RC", 2), (4096, "RC", 3),
                                                 (512, "UC", 4)])
def test_golden_model_frames_accepted(pmtu, transport, seed):
    """Frames of the project's pure-Python requester model (roce_hw.model.requester.PathRequester) for a
    seeded mix of WRs: the independent responder accepts all of them and completes each
    message with its bytes; with AckReq every 8 packets it ACKs mid-message too."""
    from roce_hw.model.packet import QPPath
    from roce_hw.model.requester import PathRequester
    from roce_hw.proto import Transport, WrOpcode
    rng = random.Random(seed)
    path = QPPath(src_mac=0x02000000000A, dst_mac=0x02000000000B, src_ip=0x0A000001,
                  dst_ip=0x0A000002, dest_qp=QPN, udp_sport=SPORT)
    tx = PathRequester(ip_id_start=0xFFF0, ack_req_every=8)
    peer = ResponderModel(mac=B_MAC, ip=B_IP)
    peer.add_qp(QPN, epsn=EPSN, pmtu=pmtu, transport=transport, remote_qpn=REMOTE_QPN)
    peer.register_mr(VA, 1 << 20, RKEY)
    peer.post_recv(QPN, size=4096 * 3, count=40)
    frames, expect, psn = [], [], EPSN
    for k in range(40):
        op = rng.choice(list(WrOpcode)[:4])
        n = rng.choice([0, 1, 2, 3, pmtu - 1, pmtu, pmtu + 1, rng.randrange(3 * 4096)])
        if op == WrOpcode.RDMA_WRITE_WITH_IMM and n == 0:
            n = 1
        data = rng.randbytes(n)
        va = VA + rng.randrange((1 << 20) - n)
        fs = tx.post(path, pmtu, psn if k == 0 else None, op, data, remote_addr=va, r_key=RKEY,
                     imm=k, solicited=bool(k & 1),
                     transport=Transport.RC if transport == "RC" else Transport.UC)
        frames += fs
        kind = {WrOpcode.RDMA_WRITE: "WRITE", WrOpcode.RDMA_WRITE_WITH_IMM: "WRITE_IMM",
                WrOpcode.SEND: "SEND", WrOpcode.SEND_WITH_IMM: "SEND_IMM"}[op]
        expect.append((kind, data, k if kind.endswith("IMM") else None))
    got = deliver(frames, peer, strict=True)
    assert peer.violations == []
    assert [(c.kind, c.data, c.imm) for c in got] == expect
    assert peer.qp_state(QPN)["epsn"] == tx.next_psn(QPN)
    if transport == "RC":
        n_ackreq = sum(1 for f in frames if f[50] & 0x80)
        assert peer.counters["acks_sent"] == n_ackreq >= 40
    else:
        assert peer.sent == []


@pytest.mark.parametrize("width", [64, 512])
def test_tx_engine_frames_accepted(width):
    """The simulated TX engine's output (sim.traffic.run_traffic) through the responder."""
    from roce_hw.config import EngineConfig
    from roce_hw.proto import WrOpcode
    from sim.bfm import QPSetup, WorkItem
    from sim.traffic import run_traffic
    rng = random.Random(width)
    qps = [QPSetup(index=0, remote_qpn=QPN, remote_mac=0x02000000000B, remote_ip=0x0A000002,
                   start_psn=EPSN, pmtu=1024, udp_sport=SPORT)]
    wrs = []
    for n in range(12):
        op = list(WrOpcode)[n % 4]
        size = rng.choice([0, 1, 5, 1024, 1025, 3000])
        if op == WrOpcode.RDMA_WRITE_WITH_IMM and size == 0:
            size = 1
        wrs.append(WorkItem(qp=0, opcode=op, payload=rng.randbytes(size),
                            remote_addr=VA + n * 4096, r_key=RKEY, imm=n, wr_id=n + 1))
    res = run_traffic(EngineConfig(data_width=width), qps, wrs, seed=1)
    peer = ResponderModel(mac=B_MAC, ip=B_IP)
    peer.add_qp(QPN, epsn=EPSN, pmtu=1024, remote_qpn=REMOTE_QPN)
    peer.register_mr(VA, 12 * 4096, RKEY)
    peer.post_recv(QPN, size=4096, count=12)
    got = deliver(res.good_frames, peer, strict=True)
    assert [c.data for c in got] == [w.payload for w in wrs]
    assert [c.imm for c in got] == [w.imm if w.opcode in (1, 3) else None for w in wrs]
    assert peer.violations == [] and peer.counters["acks_sent"] == 12


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_go_back_n_after_a_lost_frame(seed):
    """Drop one random frame of a seeded stream: the responder NAKs once with the lost PSN,
    stays silent for the rest, and a go-back-N resend from the NAK PSN (including frames it
    already has, mid-message without a RETH) completes every message exactly once."""
    rng = random.Random(seed)
    peer = make_peer(recv=30, mr_len=1 << 18)
    frames, expect, psn = [], [], EPSN
    for _ in range(30):
        kind = rng.choice(["SEND", "WRITE", "WRITE_IMM"])
        data = rng.randbytes(rng.choice([1, 100, 1024, 2049, 4000]))
        imm = rng.getrandbits(32) if kind.endswith("IMM") else None
        fs = _segment_by_hand(kind, psn, data, va=VA + rng.randrange((1 << 18) - 4000), imm=imm)
        frames += fs
        psn += len(fs)
        expect.append((kind, data))
    lost = rng.randrange(1, len(frames) - 1)
    out = []
    for k, f in enumerate(frames):
        if k != lost:
            out += peer.receive(f)
    naks = [scapy_ack(f) for f in out if scapy_ack(f)[3] != 0x1F]
    assert naks == [(0x11, REMOTE_QPN, (EPSN + lost) & 0xFFFFFF, 0x60, naks[0][4])]
    assert peer.counters["out_of_seq_dropped"] == len(frames) - lost - 2
    # go back N: resend from one frame before the NAK PSN (that one is a duplicate)
    out = []
    for f in frames[lost - 1:]:
        out += peer.receive(f)
    assert peer.counters["duplicates"] == 1
    assert [(c.kind, c.data) for c in peer.completions] == expect
    assert all(scapy_ack(f)[3] == 0x1F for f in out)
    assert [v.kind for v in peer.violations if v.fatal] == ["psn_ahead"] * (len(frames) - lost - 1)


# --- the rxe behaviours the reliable requester relies on (issue 35) ------------------------------

def _acks(out):
    return [scapy_ack(f)[2:4] for f in out]


def test_rnr_on_a_multi_packet_send_then_the_retry_succeeds():
    """rxe check_resource: SEND FIRST without a receive WQE gets an RNR NAK with its PSN; the
    packets behind it are ahead of ePSN (one sequence NAK, then silence); once a receive is
    posted the whole message, resent from FIRST, completes."""
    peer = make_peer(recv=0)
    d = _data(2500, 11)
    fs = _segment_by_hand("SEND", EPSN, d)
    out = []
    for f in fs:
        out += peer.receive(f)
    assert _acks(out) == [(EPSN, 0x20 | 12), (EPSN, 0x60)]
    assert peer.counters["out_of_seq_dropped"] == 1 and peer.completions == []
    out = []
    for f in fs:                                        # the retry, still not ready
        out += peer.receive(f)
    assert _acks(out) == [(EPSN, 0x20 | 12), (EPSN, 0x60)]
    peer.post_recv(QPN, size=4096)
    out = []
    for f in fs:
        out += peer.receive(f)
    assert _acks(out) == [((EPSN + 2) & 0xFFFFFF, 0x1F)]
    assert [c.data for c in peer.completions] == [d]
    assert peer.qp_state(QPN)["error"] is None


def test_rnr_on_write_with_immediate_last_keeps_the_written_part():
    """WRITE LAST with immediate consumes a receive WQE (RXE_RWR_MASK): without one it is RNR
    NAKed at its own PSN while the FIRST already wrote; resending only the LAST completes."""
    peer = make_peer(recv=0)
    d = _data(1500, 12)
    fs = _segment_by_hand("WRITE_IMM", EPSN, d, va=VA, imm=0x1234)
    assert peer.receive(fs[0]) == []
    assert _acks(peer.receive(fs[1])) == [((EPSN + 1) & 0xFFFFFF, 0x20 | 12)]
    assert peer.read_memory(VA, 1024) == d[:1024] and peer.completions == []
    peer.post_recv(QPN, size=64)
    assert _acks(peer.receive(fs[1])) == [((EPSN + 1) & 0xFFFFFF, 0x1F)]
    assert [(c.kind, c.data, c.imm) for c in peer.completions] == [("WRITE_IMM", d, 0x1234)]


@pytest.mark.parametrize("ops", [("SEND_FIRST", "SEND_FIRST"),
                                 ("WRITE_FIRST", "WRITE_MIDDLE", "WRITE_FIRST"),
                                 ("SEND_FIRST", "WRITE_FIRST")])
def test_first_in_mid_message_is_an_invalid_request(ops):
    """rxe check_op_seq: after FIRST/MIDDLE only MIDDLE/LAST of the same kind; a FIRST is
    ERR_MISSING_OPCODE_LAST_C: NAK invalid request (0x61) with its PSN, QP to error."""
    peer = make_peer()
    out = []
    for k, op in enumerate(ops):
        reth = (VA, RKEY, 4096) if op == "WRITE_FIRST" else None
        out += peer.receive(frame(op, EPSN + k, bytes(1024), reth=reth, ackreq=0))
    assert _acks(out) == [((EPSN + len(ops) - 1) & 0xFFFFFF, 0x61)]
    assert peer.qp_state(QPN)["error"] and peer.violations[-1].kind == "bad_op_seq"


def test_duplicate_inside_a_message_is_reacked_and_keeps_the_message():
    """A duplicate (PSN < ePSN) FIRST while the message is half received: re-ACKed with ePSN-1
    (rxe duplicate_request, C9-105), nothing re-executed, and the LAST still completes."""
    peer = make_peer()
    d = _data(2100, 13)
    fs = _segment_by_hand("WRITE", EPSN, d, va=VA)
    assert peer.receive(fs[0]) + peer.receive(fs[1]) == []
    assert _acks(peer.receive(fs[0])) == [((EPSN + 1) & 0xFFFFFF, 0x1F)]
    assert _acks(peer.receive(fs[1])) == [((EPSN + 1) & 0xFFFFFF, 0x1F)]
    assert _acks(peer.receive(fs[2])) == [((EPSN + 2) & 0xFFFFFF, 0x1F)]
    assert [c.data for c in peer.completions] == [d] and peer.counters["duplicates"] == 2


def test_remote_access_nak_on_a_bad_r_key():
    """A WRITE whose R_Key names no region: NAK remote access error (0x62) with its PSN after
    the earlier messages were executed (MSN counts them), then the QP drops everything."""
    peer = make_peer()
    assert _acks(peer.receive(frame("SEND_ONLY", EPSN, b"ok"))) == [(EPSN, 0x1F)]
    out = peer.receive(frame("WRITE_ONLY", EPSN + 1, b"abcd", reth=(VA, RKEY + 1, 4)))
    assert [scapy_ack(f)[2:] for f in out] == [((EPSN + 1) & 0xFFFFFF, 0x62, 1)]
    assert peer.receive(frame("SEND_ONLY", EPSN + 2, b"x")) == []
    assert [v.kind for v in peer.violations] == ["rkey", "qp_error"]


def test_responder_is_independent_of_the_requester_models():
    """sim/peer.py imports nothing of the requester side (only proto and the iCRC)."""
    import ast

    from conftest import ROOT
    tree = ast.parse((ROOT / "sim" / "peer.py").read_text())
    mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    mods |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    ours = {m for m in mods if m.startswith(("roce_hw", "sim"))}
    assert ours == {"roce_hw", "roce_hw.model.icrc"}
