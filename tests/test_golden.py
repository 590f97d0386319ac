# SPDX-License-Identifier: BSD-2-Clause
"""The golden model against the real soft-RoCE captures in tests/captures (independent oracle)."""

import hashlib
import re
import shutil
import struct
import subprocess

import pytest

from roce_hw import proto
from roce_hw.proto import Opcode, Transport, WrOpcode
from roce_hw.model.icrc import frame_icrc_ok
from roce_hw.model.packet import QPPath, build_frame, build_request_frame, parse_frame
from roce_hw.model.requester import PathRequester
from roce_hw.model.segment import segment_message
from sim.pcap import read_capture

__all__ = []

GOLDEN_FILES = ["pingpong_rc.pcap", "pingpong_uc.pcap", "pingpong_ud.pcap", "rdma_atomic_bw.pcap",
                "rdma_cm.pcap", "rdma_read_bw.pcap", "rdma_read_lat.pcap", "rdma_send_bw.pcap",
                "rdma_write_bw.pcap", "rdma_write_lat.pcap", "rping.pcap"]

#: RoCEv2 frames per file, counted with tshark ("udp.dstport == 4791") when the test was written.
ROCE_FRAMES = {"pingpong_rc.pcap": 20, "pingpong_uc.pcap": 10, "pingpong_ud.pcap": 10,
               "rdma_atomic_bw.pcap": 10, "rdma_cm.pcap": 96, "rdma_read_bw.pcap": 20,
               "rdma_read_lat.pcap": 10, "rdma_send_bw.pcap": 20, "rdma_write_bw.pcap": 20,
               "rdma_write_lat.pcap": 20, "rping.pcap": 65}


def _is_rocev2(frame):
    """Plain byte test, independent of the model: untagged IPv4, UDP, destination port 4791."""
    return (len(frame) >= 42 and frame[12:14] == b"\x08\x00" and frame[23] == 17
            and struct.unpack_from("!H", frame, 14 + (frame[14] & 0xF) * 4 + 2)[0] == 4791)


def _roce_frames(golden_dir, name):
    return [p.data for p in read_capture(golden_dir / name) if _is_rocev2(p.data)]


def test_golden_files_present(golden_dir):
    assert sorted(p.name for p in golden_dir.glob("*.pcap")) == sorted(GOLDEN_FILES)


def test_captures_match_their_readme(golden_dir):
    """tests/captures/README.md lists every capture with its SHA-256: none changed unnoticed."""
    readme = (golden_dir / "README.md").read_text()
    listed = dict((name, digest) for digest, name in
                  re.findall(r"^([0-9a-f]{64})  (\S+\.pcap)$", readme, re.M))
    assert sorted(listed) == sorted(GOLDEN_FILES)
    for name, digest in listed.items():
        assert hashlib.sha256((golden_dir / name).read_bytes()).hexdigest() == digest, name
        assert f"`{name}`" in readme, f"{name} not described in the README table"
    assert "linlinw5/rdma_ib_tutorial" in readme


def test_tests_need_nothing_outside_the_repository():
    """No test builds a path into ../shared; only conftest's optional ``shared_dir`` does."""
    from conftest import ROOT
    pattern = re.compile(r"""/ *["']shared["']|(Path|open)\( *["']\.\./shared|parent *\.parent */""")
    for path in (ROOT / "tests").glob("*.py"):
        if path.name != "conftest.py":
            assert not pattern.search(path.read_text()), path.name


def _excerpt_parts(text):
    return re.findall(r"^<!-- begin PROTOCOL.md (.*?) -->\n(.*?)^<!-- end -->", text, re.S | re.M)


def test_protocol_excerpt_is_a_verbatim_copy(shared_dir):
    """When the full reference is at hand, every part of tests/reference/PROTOCOL_excerpt.md is
    still copied from it verbatim."""
    from conftest import PROTOCOL_EXCERPT
    full = (shared_dir / "PROTOCOL.md").read_text()
    parts = _excerpt_parts(PROTOCOL_EXCERPT.read_text())
    assert [name for name, _ in parts] == ["section 2", "section 5.5"]
    for name, body in parts:
        assert body in full, f"{name} of the excerpt differs from {shared_dir}/PROTOCOL.md"


def test_protocol_excerpt_has_what_the_tests_read(protocol_md):
    parts = dict(_excerpt_parts(protocol_md))
    assert "def rocev2_icrc" in parts["section 2"] and "def check_rocev2_frame" in parts["section 2"]
    assert "Codes 0-30 map to" in parts["section 5.5"]
    assert "RNR timer code:" in parts["section 5.5"]


def test_captures_are_the_shared_golden_files(shared_dir, golden_dir):
    """The copies in the repository are byte for byte the shared golden captures."""
    for name in GOLDEN_FILES:
        shared = shared_dir / "golden" / name
        if shared.exists():
            assert shared.read_bytes() == (golden_dir / name).read_bytes(), name


@pytest.mark.parametrize("name", GOLDEN_FILES)
def test_parse_check_rebuild(golden_dir, name):
    """Every RoCEv2 frame parses, its iCRC checks, and rebuilding it from its parsed fields
    (lengths, checksum, PadCnt, pad and iCRC recomputed) gives its bytes exactly."""
    frames = _roce_frames(golden_dir, name)
    assert len(frames) == ROCE_FRAMES[name]
    for i, frame in enumerate(frames):
        rf = parse_frame(frame)
        assert rf.icrc_ok, (name, i)
        assert frame_icrc_ok(frame)
        assert rf.trailer == b""
        assert build_frame(**rf.build_args()) == frame, (name, i)
        # and the model notices a single flipped payload/header bit after the BTH
        bad = bytearray(frame)
        bad[len(frame) - 5] ^= 0x01
        assert not parse_frame(bytes(bad)).icrc_ok


def test_non_roce_frames_are_rejected(golden_dir):
    n = 0
    for name in GOLDEN_FILES:
        for p in read_capture(golden_dir / name):
            if not _is_rocev2(p.data):
                n += 1
                with pytest.raises(ValueError):
                    parse_frame(p.data)
    assert n == 234       # 535 frames in all, 301 RoCEv2


_TSHARK_FIELDS = ["infiniband.bth.opcode", "infiniband.bth.psn", "infiniband.bth.destqp",
                  "infiniband.bth.a", "infiniband.bth.se", "infiniband.bth.padcnt",
                  "infiniband.bth.p_key", "infiniband.reth.va", "infiniband.reth.r_key",
                  "infiniband.reth.dmalen", "infiniband.aeth.syndrome", "infiniband.aeth.msn",
                  "infiniband.deth.q_key", "infiniband.deth.srcqp", "infiniband.invariant.crc"]


def _int(s):
    s = s.strip()
    if s in ("", None):
        return None
    if s in ("True", "False"):
        return int(s == "True")
    return int(s, 0)


@pytest.mark.tools("tshark")
@pytest.mark.parametrize("name", ["rdma_write_bw.pcap", "rdma_cm.pcap", "rping.pcap",
                                  "pingpong_ud.pcap", "rdma_atomic_bw.pcap"])
def test_field_decode_agrees_with_tshark(golden_dir, name):
    """Wireshark's InfiniBand dissector is a second, independent decoder of the same bytes."""
    cmd = ["tshark", "-r", str(golden_dir / name), "-Y", "udp.dstport == 4791", "-T", "fields",
           "-E", "separator=;", "-E", "occurrence=f"]
    for f in _TSHARK_FIELDS:
        cmd += ["-e", f]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
    rows = [line.split(";") for line in out.splitlines() if line.strip()]
    frames = _roce_frames(golden_dir, name)
    assert len(rows) == len(frames)
    crc_seen = 0
    for row, frame in zip(rows, frames):
        t = dict(zip(_TSHARK_FIELDS, map(_int, row)))
        rf = parse_frame(frame)
        b = rf.bth
        assert (t["infiniband.bth.opcode"], t["infiniband.bth.psn"], t["infiniband.bth.destqp"],
                t["infiniband.bth.a"], t["infiniband.bth.se"], t["infiniband.bth.padcnt"],
                t["infiniband.bth.p_key"]) == \
            (b["opcode"], b["psn"], b["dest_qp"], b["ack_req"], b["se"], b["pad_cnt"], b["p_key"])
        # tshark shows an AtomicETH's VA and R_Key in its reth fields
        reth = rf.reth or rf.headers.get("ATOMICETH") or {}
        assert (t["infiniband.reth.va"], t["infiniband.reth.r_key"],
                t["infiniband.reth.dmalen"]) == \
            (reth.get("va"), reth.get("r_key"), reth.get("dma_length"))
        aeth = rf.aeth or {}
        assert (t["infiniband.aeth.syndrome"], t["infiniband.aeth.msn"]) == \
            (aeth.get("syndrome"), aeth.get("msn"))
        deth = rf.deth or {}
        assert (t["infiniband.deth.q_key"], t["infiniband.deth.srcqp"]) == \
            (deth.get("q_key"), deth.get("src_qp"))
        # tshark shows the wire bytes read big-endian (PROTOCOL.md §2); it omits the field
        # for a few packets whose payload it hands to another dissector
        if t["infiniband.invariant.crc"] is not None:
            assert t["infiniband.invariant.crc"] == int.from_bytes(rf.icrc, "big")
            crc_seen += 1
    assert crc_seen >= len(frames) // 2


# --- segmentation against the captured message sequences ---------------------------------------

def _requests(golden_dir, name):
    return [parse_frame(f) for f in _roce_frames(golden_dir, name)
            if Opcode(f[42]) not in (Opcode.RC_ACKNOWLEDGE,)]


def _transport_bytes(frame_or_rf):
    """BTH + extension headers of a parsed frame, re-packed with proto.Header (wire order)."""
    rf = frame_or_rf
    out = proto.BTH.pack(rf.bth)
    for h in proto.opcode_headers(rf.opcode):
        out += h.pack(rf.headers[h.name])
    return out


@pytest.mark.parametrize("name, wr, first", [
    ("rdma_write_bw.pcap", WrOpcode.RDMA_WRITE, Opcode.RC_RDMA_WRITE_FIRST),
    ("rdma_send_bw.pcap", WrOpcode.SEND, Opcode.RC_SEND_FIRST),
])
def test_segmentation_reproduces_3000_byte_messages(golden_dir, name, wr, first):
    """A 3000-byte message at PMTU 1024 gives the captured FIRST/MIDDLE/LAST BTH(+RETH) bytes.

    Inputs taken from the capture's first packet: PSN, dest QP (and VA, R_Key for WRITE). The
    message bytes are the captured payloads. Everything else (opcodes, PSN sequence, AckReq,
    PadCnt, RETH length, payload split) is compared. PSNs continue across the 5 messages.
    """
    reqs = _requests(golden_dir, name)
    frames = [f for f in _roce_frames(golden_dir, name) if Opcode(f[42]) != Opcode.RC_ACKNOWLEDGE]
    assert len(reqs) == 15 and reqs[0].opcode == first
    psn = reqs[0].psn
    for k in range(5):
        msg = reqs[3 * k:3 * k + 3]
        payload = b"".join(r.payload for r in msg)
        assert len(payload) == 3000
        kw = {}
        if wr == WrOpcode.RDMA_WRITE:
            assert reqs[0].reth["dma_length"] == 3000
            kw = {"remote_addr": reqs[0].reth["va"], "r_key": reqs[0].reth["r_key"]}
        pkts = segment_message(wr, payload, pmtu=1024, start_psn=psn, **kw)
        assert [len(p.payload) for p in pkts] == [1024, 1024, 952]
        path = QPPath(src_mac=0, dst_mac=0, src_ip=0, dst_ip=0, dest_qp=reqs[0].dest_qp,
                      udp_sport=0)
        for p, r, raw in zip(pkts, msg, frames[3 * k:3 * k + 3]):
            model = parse_frame(build_request_frame(path, p, ip_id=0))
            n = 12 + sum(h.size for h in proto.opcode_headers(p.opcode))
            assert _transport_bytes(model) == raw[42:42 + n] == _transport_bytes(r)
            assert model.payload == r.payload
        psn = (pkts[-1].psn + 1) & 0xFFFFFF


def _messages(reqs):
    """Group captured RC/UC SEND/WRITE request packets into messages, per (source IP, dest QP)."""
    open_msgs, done = {}, []
    for r in reqs:
        short = r.opcode.short_name
        if not short.startswith(("SEND", "RDMA_WRITE")) or r.opcode.transport not in (
                Transport.RC, Transport.UC):
            continue
        key = (r.ip["src"], r.dest_qp)
        if short.endswith("FIRST") or "ONLY" in short:
            open_msgs[key] = [r]
        else:
            open_msgs[key].append(r)
        if "LAST" in short or "ONLY" in short:
            done.append(open_msgs.pop(key))
    assert not open_msgs
    return done


def _wr_of(msg):
    last = msg[-1].opcode.short_name
    if last.startswith("SEND"):
        return WrOpcode.SEND_WITH_IMM if "IMMEDIATE" in last else WrOpcode.SEND
    return WrOpcode.RDMA_WRITE_WITH_IMM if "IMMEDIATE" in last else WrOpcode.RDMA_WRITE


@pytest.mark.parametrize("name", ["rdma_write_bw.pcap", "rdma_send_bw.pcap", "rdma_write_lat.pcap",
                                  "pingpong_rc.pcap", "pingpong_uc.pcap", "rdma_cm.pcap",
                                  "rping.pcap"])
def test_tx_model_reproduces_full_frames(golden_dir, name):
    """The TX model, given the capture's MACs, IPs, UDP source port, first PSN, first IP ID,
    VA/R_Key/immediate, solicited flag and message bytes, emits every captured SEND/WRITE frame
    byte for byte (IP ID and PSN continue inside each message; PMTU 1024)."""
    reqs = [parse_frame(f) for f in _roce_frames(golden_dir, name)]
    msgs = _messages(reqs)
    assert msgs
    n = 0
    for msg in msgs:
        r0 = msg[0]
        path = QPPath(src_mac=r0.eth["src"], dst_mac=r0.eth["dst"], src_ip=r0.ip["src"],
                      dst_ip=r0.ip["dst"], dest_qp=r0.dest_qp, udp_sport=r0.udp["src_port"],
                      dscp=r0.ip["dscp"], ecn=r0.ip["ecn"], ttl=r0.ip["ttl"],
                      p_key=r0.bth["p_key"], migreq=r0.bth["migreq"])
        model = PathRequester(ip_id_start=r0.ip["identification"])
        reth = r0.reth or {"va": 0, "r_key": 0}
        frames = model.post(path, 1024, r0.psn, _wr_of(msg), b"".join(r.payload for r in msg),
                            remote_addr=reth["va"], r_key=reth["r_key"], imm=msg[-1].imm or 0,
                            solicited=bool(msg[-1].bth["se"]), transport=r0.opcode.transport)
        assert len(frames) == len(msg)
        for f, r in zip(frames, msg):
            rebuilt = build_frame(**r.build_args())
            assert f == rebuilt, (name, r.psn)
            n += 1
    assert n >= 10


def test_path_requester_continues_psn_and_ip_id_over_write_bw(golden_dir):
    """One PathRequester posting the 5 WRITEs of rdma_write_bw.pcap with start PSN only on the first:
    all 15 frames equal the capture (the requester's IP IDs are consecutive there)."""
    raw = [f for f in _roce_frames(golden_dir, "rdma_write_bw.pcap")
           if Opcode(f[42]) != Opcode.RC_ACKNOWLEDGE]
    reqs = [parse_frame(f) for f in raw]
    r0 = reqs[0]
    path = QPPath(src_mac=r0.eth["src"], dst_mac=r0.eth["dst"], src_ip=r0.ip["src"],
                  dst_ip=r0.ip["dst"], dest_qp=r0.dest_qp, udp_sport=r0.udp["src_port"])
    model = PathRequester(ip_id_start=r0.ip["identification"])
    out = []
    for k in range(5):
        payload = b"".join(r.payload for r in reqs[3 * k:3 * k + 3])
        out += model.post(path, 1024, r0.psn if k == 0 else None, WrOpcode.RDMA_WRITE, payload,
                          remote_addr=r0.reth["va"], r_key=r0.reth["r_key"])
    assert out == raw
