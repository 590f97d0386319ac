# SPDX-License-Identifier: BSD-2-Clause
"""The capture analyzer CLI (python -m sim.analyze) on golden, corrupted and generated captures."""

import json
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from scapy.contrib import roce as sroce
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP, Dot1Q, Ether
from scapy.packet import Raw
from scapy.utils import wrpcap, wrpcapng

from roce_hw.proto import WrOpcode
from roce_hw.model.packet import QPPath, build_ack_frame, build_cnp_frame
from roce_hw.model.requester import PathRequester
from sim.pcap import read_capture, write_pcap

__all__ = []

ROOT = Path(__file__).resolve().parent.parent

#: RoCEv2 frames / all frames per golden file (counted with tshark, "udp.dstport == 4791").
GOLDEN = {"pingpong_rc.pcap": (20, 31), "pingpong_uc.pcap": (10, 21), "pingpong_ud.pcap": (10, 21),
          "rdma_atomic_bw.pcap": (10, 48), "rdma_cm.pcap": (96, 96), "rdma_read_bw.pcap": (20, 60),
          "rdma_read_lat.pcap": (10, 38), "rdma_send_bw.pcap": (20, 50),
          "rdma_write_bw.pcap": (20, 60), "rdma_write_lat.pcap": (20, 45), "rping.pcap": (65, 65)}


def run(*args, pre=None, timeout=120):
    """Run the analyzer CLI from the repository root; ``pre`` is Python run before main()."""
    if pre is None:
        cmd = [sys.executable, "-m", "sim.analyze", *map(str, args)]
    else:
        code = pre + "\nimport sys\nfrom sim.analyze import main\nsys.exit(main(sys.argv[1:]))"
        cmd = [sys.executable, "-c", code, *map(str, args)]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _last_line(out):
    return out.strip().splitlines()[-1]


def _no_traceback(r):
    assert "Traceback" not in r.stdout + r.stderr


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_all_pass(golden_dir, name, tmp_path):
    n_roce, n_all = GOLDEN[name]
    out = tmp_path / "report.json"
    r = run(golden_dir / name, "--json", out)
    _no_traceback(r)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _last_line(r.stdout) == f"{n_roce} passed, 0 failed"
    rep = json.loads(out.read_text())
    assert rep["frames_total"] == n_all
    assert rep["roce_frames"] == n_roce
    assert rep["non_roce_frames"] == n_all - n_roce
    assert rep["icrc"]["passed"] == n_roce and rep["icrc"]["failed"] == 0
    assert sum(rep["opcodes"].values()) == n_roce
    # one line per RoCE frame, each with its verdict
    lines = [ln for ln in r.stdout.splitlines() if " icrc=" in ln]
    assert len(lines) == n_roce and all("icrc=good" in ln for ln in lines)
    # the soft-RoCE captures have no loss or retransmission
    for f in rep["flows"]:
        assert f["psn_gaps"] == f["duplicates"] == f["retransmissions"] == 0, f


def test_golden_write_bw_report_content(golden_dir, tmp_path):
    out = tmp_path / "wbw.json"
    r = run(golden_dir / "rdma_write_bw.pcap", "--json", out)
    assert r.returncode == 0
    rep = json.loads(out.read_text())
    assert rep["opcodes"] == {"RC_ACKNOWLEDGE": 5, "RC_RDMA_WRITE_FIRST": 5,
                              "RC_RDMA_WRITE_LAST": 5, "RC_RDMA_WRITE_MIDDLE": 5}
    first = rep["packets"][0]
    # values read off the capture with tshark
    assert (first["opcode"], first["dest_qp"], first["psn"], first["ack_req"]) == \
        ("RC_RDMA_WRITE_FIRST", 0x1B, 5454383, 0)
    assert first["reth"] == {"va": 0x5E6B89B96000, "r_key": 0xCE6, "dma_length": 3000}
    assert (first["src"], first["dst"], first["payload_len"], first["pad"]) == \
        ("10.1.16.62", "10.1.16.61", 1024, 0)
    flows = {(f["src"], f["dest_qp"]): f for f in rep["flows"]}
    req = flows[("10.1.16.62", 0x1B)]
    assert (req["requests"], req["first_psn"], req["last_psn"]) == (15, 5454383, 5454397)
    ack = flows[("10.1.16.61", 0x1D)]
    assert (ack["acks"], ack["responses"], ack["naks"]) == (5, 5, {})
    assert sum(req["ipg_hist"]["counts"]) == req["frames"] - 1
    line = r.stdout.splitlines()[0]
    for piece in ("10.1.16.62 -> 10.1.16.61", "RC_RDMA_WRITE_FIRST", "psn=5454383", "A=0",
                  "RETH(va=0x5e6b89b96000 rkey=0xce6 len=3000)", "len=1024", "pad=0",
                  "icrc=good"):
        assert piece in line
    ack_line = next(ln for ln in r.stdout.splitlines() if "RC_ACKNOWLEDGE" in ln)
    assert "AETH(ACK credits=unlimited msn=1)" in ack_line


def _flip_roce_bits(src, dst):
    """Copy a pcap, flipping the last bit before the iCRC of every RoCEv2 frame."""
    buf = bytearray(Path(src).read_bytes())
    pos, n = 24, 0
    while pos < len(buf):
        incl = struct.unpack_from("<I", buf, pos + 8)[0]
        start = pos + 16
        frame = buf[start:start + incl]
        if frame[12:14] == b"\x08\x00" and frame[23] == 17 and frame[36:38] == b"\x12\xb7":
            buf[start + incl - 5] ^= 0x01          # last payload/pad/ext byte before the iCRC
            n += 1
        pos = start + incl
    Path(dst).write_bytes(bytes(buf))
    return n


@pytest.mark.parametrize("name", ["rdma_write_bw.pcap", "rdma_cm.pcap", "pingpong_ud.pcap"])
def test_flipped_bit_flags_every_frame(golden_dir, tmp_path, name):
    bad = tmp_path / f"bad_{name}"
    n = _flip_roce_bits(golden_dir / name, bad)
    assert n == GOLDEN[name][0]
    out = tmp_path / "bad.json"
    r = run(bad, "--json", out)
    _no_traceback(r)
    assert r.returncode == 1
    assert _last_line(r.stdout) == f"0 passed, {n} failed"
    rep = json.loads(out.read_text())
    assert rep["icrc"]["failed"] == n and len(rep["icrc"]["failed_frames"]) == n
    assert all(p["icrc"] == "bad" for p in rep["packets"])
    assert sum("icrc=bad" in ln for ln in r.stdout.splitlines()) == n


def test_truncated_capture(golden_dir, tmp_path):
    data = (golden_dir / "rdma_write_bw.pcap").read_bytes()
    for cut in (len(data) - 7, 24 + 16 + 5, 30, 3):
        p = tmp_path / f"trunc{cut}.pcap"
        p.write_bytes(data[:cut])
        r = run(p)
        _no_traceback(r)
        assert r.returncode == 2, cut
        assert "error:" in r.stderr and ("truncated" in r.stderr or "too short" in r.stderr)
        if cut == len(data) - 7:
            # the 59 whole packets before the cut are still analyzed (the last frame, cut here,
            # is not RoCE, so all 20 RoCEv2 frames are among them)
            assert "only the 59 packets" in r.stderr
            assert _last_line(r.stdout) == "20 passed, 0 failed"


def test_garbage_empty_and_missing_files(tmp_path):
    garbage = tmp_path / "garbage.pcap"
    garbage.write_bytes(random.Random(1).randbytes(5000))
    empty = tmp_path / "empty.pcap"
    empty.write_bytes(b"")
    bad_ng = tmp_path / "bad.pcapng"
    bad_ng.write_bytes(b"\x0a\x0d\x0d\x0a" + random.Random(2).randbytes(200))
    for path, words in ((garbage, "not a pcap"), (empty, "too short"),
                        (tmp_path / "missing.pcap", "cannot read"), (bad_ng, "pcapng")):
        r = run(path)
        _no_traceback(r)
        assert r.returncode == 2, path
        assert words in r.stderr, r.stderr


def _scapy_frames(rng):
    """RoCEv2 frames built by scapy (not the model): IPv6, VLAN, IPv4+VLAN, and non-RoCE."""
    frames = []
    for k in range(12):
        pay = rng.randbytes(rng.randrange(0, 100))
        pad = (-len(pay)) & 3
        l2 = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
        if k % 3 != 0:
            l2 = l2 / Dot1Q(vlan=100 + k, prio=k % 8)
        l3 = IPv6(src="fd00::1", dst="fd00::2", hlim=64) if k % 2 else \
            IP(src="192.168.1.1", dst="192.168.1.2", flags=2, id=k)
        frames.append(bytes(l2 / l3 / UDP(sport=0xC001, dport=4791, chksum=0) /
                            sroce.BTH(opcode=0x04, dqpn=0x123, psn=1000 + k, padcount=pad,
                                      ackreq=1) / Raw(pay + bytes(pad))))
    frames.insert(3, bytes(Ether() / ARP()))
    frames.insert(7, bytes(Ether() / IP() / UDP(sport=1, dport=53) / Raw(b"dns?")))
    return frames


def test_pcapng_vlan_ipv6(tmp_path):
    frames = _scapy_frames(random.Random(7))
    p = tmp_path / "gen.pcapng"
    wrpcapng(str(p), [Ether(f) for f in frames])
    assert p.read_bytes()[:4] == b"\x0a\x0d\x0d\x0a"
    out = tmp_path / "gen.json"
    r = run(p, "--json", out)
    _no_traceback(r)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _last_line(r.stdout) == "12 passed, 0 failed"
    rep = json.loads(out.read_text())
    assert rep["non_roce_frames"] == 2 and rep["roce_frames"] == 12
    pk = rep["packets"]
    assert [p["psn"] for p in pk] == list(range(1000, 1012))
    assert {p["ip_version"] for p in pk} == {4, 6}
    assert [p["vlan"] for p in pk] == [None if k % 3 == 0 else 100 + k for k in range(12)]
    assert pk[1]["src"] == "fd00::1" and pk[0]["src"] == "192.168.1.1"
    flow_keys = {(f["src"], f["dst"], f["dest_qp"]) for f in rep["flows"]}
    assert flow_keys == {("192.168.1.1", "192.168.1.2", 0x123), ("fd00::1", "fd00::2", 0x123)}
    # each flow sees every other PSN: 5 gaps of 1 missing PSN
    assert all(f["psn_gaps"] == 5 and f["missing_psns"] == 5 for f in rep["flows"])
    # the same frames as classic pcap (scapy writer) give the same verdicts; then corrupt one
    p2 = tmp_path / "gen.pcap"
    frames[5] = frames[5][:-1] + bytes([frames[5][-1] ^ 0x80])
    wrpcap(str(p2), [Ether(f) for f in frames])
    r = run(p2, "--quiet")
    assert r.returncode == 1 and _last_line(r.stdout) == "11 passed, 1 failed"
    assert "icrc=" not in r.stdout        # --quiet: summary only


def test_psn_gap_duplicate_retransmission(tmp_path):
    """A capture with a known loss, duplicate and go-back-N retransmission, built with the
    model: the analyzer counts exactly those."""
    path = QPPath(src_mac=0x020000000001, dst_mac=0x020000000002, src_ip=0x0A000001,
                  dst_ip=0x0A000002, dest_qp=0x42, udp_sport=0xC100)
    m = PathRequester(ip_id_start=1)
    frames = m.post(path, 256, 0xFFFFFD, WrOpcode.RDMA_WRITE, bytes(256 * 6))   # PSN ..FD..02
    seq = [frames[0], frames[1], frames[3], frames[4], frames[4], frames[5]]    # lose [2], dup [4]
    # go-back-N from PSN 0xFFFFFF (= frames[2]): same PSNs, new IP IDs -> retransmissions
    m.ip_id = 100
    again = m.post(path, 256, 0xFFFFFF, WrOpcode.RDMA_WRITE, bytes(256 * 4))
    seq += again[:1]                      # fills the gap at 0xFFFFFF: out of order? no: resent
    seq += again[1:]
    m2 = m.post(path, 256, None, WrOpcode.SEND, b"tail")                         # PSN 3, in order
    seq += m2
    p = tmp_path / "gbn.pcap"
    write_pcap(p, seq)
    out = tmp_path / "gbn.json"
    r = run(p, "--json", out)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(out.read_text())
    (flow,) = rep["flows"]
    assert flow["requests"] == len(seq)
    assert (flow["psn_gaps"], flow["duplicates"]) == (1, 1)
    # the resend of 0xFFFFFF fills the hole (out of order); 0, 1, 2 were seen -> retransmissions
    assert (flow["out_of_order"], flow["retransmissions"], flow["missing_psns"]) == (1, 3, 0)
    notes = [p.get("psn_note") for p in rep["packets"]]
    assert notes == ["ok", "ok", "gap(1 missing)", "ok", "duplicate", "ok", "out-of-order",
                     "retransmission", "retransmission", "retransmission", "ok"]


def test_plot(golden_dir, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "ipg.png"
    r = run(golden_dir / "rping.pcap", "--plot", png, "--quiet")
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib(golden_dir, tmp_path):
    r = run(golden_dir / "rping.pcap", "--plot", tmp_path / "x.png", "--quiet",
            pre="import sys\nsys.modules['matplotlib'] = None")
    _no_traceback(r)
    assert r.returncode == 2 and "matplotlib" in r.stderr


def test_hw_missing_module(golden_dir):
    r = run(golden_dir / "rdma_write_lat.pcap", "--hw",
            pre="import sys\nsys.modules['sim.icrc_hw'] = None")
    _no_traceback(r)
    assert r.returncode == 2 and "sim/icrc_hw.py" in r.stderr


_FAKE_HW = """
import sys, types
fake = types.ModuleType("sim.icrc_hw")
def check_frames(frames, width):
    print(f"FAKE HW width={width} frames={len(frames)}")
    return [%s for f in frames]
fake.check_frames = check_frames
sys.modules["sim.icrc_hw"] = fake
import sim
sim.icrc_hw = fake
"""


def test_hw_plumbing_with_stub(golden_dir, tmp_path):
    """--hw hands the RoCE frames to sim.icrc_hw.check_frames(frames, width) and fails when the
    hardware disagrees with the model (a stub stands in for the simulated checker)."""
    agree = run(golden_dir / "rdma_write_lat.pcap", "--hw", "--width", "64", "--quiet",
                pre=_FAKE_HW % "True")
    assert agree.returncode == 0, agree.stderr
    assert "FAKE HW width=64 frames=20" in agree.stdout
    assert _last_line(agree.stdout) == "20 passed, 0 failed"
    default = run(golden_dir / "rdma_write_lat.pcap", "--hw", "--quiet", pre=_FAKE_HW % "True")
    assert "FAKE HW width=512 frames=20" in default.stdout
    wrong = run(golden_dir / "rdma_write_lat.pcap", "--hw", "--quiet",
                pre=_FAKE_HW % "(f[42] != 0x11)")     # "hardware" rejects every ACK
    assert wrong.returncode == 1
    assert _last_line(wrong.stdout) == "10 passed, 10 failed"
    assert "10 disagree with the model" in wrong.stdout


def test_width_without_hw(golden_dir):
    r = run(golden_dir / "rdma_write_lat.pcap", "--width", "64")
    assert r.returncode == 2 and "--hw" in r.stderr


def test_read_capture_pcapng_matches_scapy(tmp_path):
    """sim.pcap reads scapy-written pcapng with the same bytes and timestamps."""
    frames = _scapy_frames(random.Random(8))
    pkts = [Ether(f) for f in frames]
    for i, pk in enumerate(pkts):
        pk.time = 1700000000 + i * 0.001
    p = tmp_path / "t.pcapng"
    wrpcapng(str(p), pkts)
    got = read_capture(p)
    assert [g.data for g in got] == frames
    assert all(abs(g.time - (1700000000 + i * 0.001)) < 1e-6 for i, g in enumerate(got))


def test_malformed_and_snapped_frames(tmp_path):
    """An RD opcode (not modelled) and a snapped frame are reported, not crashed on: the RD
    frame's iCRC is still checked; the snapped frame's cannot be and is not counted."""
    rd = bytes(Ether() / IP(src="10.0.0.1", dst="10.0.0.2", flags=2) /
               UDP(sport=0xC000, dport=4791, chksum=0) /
               sroce.BTH(opcode=0x44, dqpn=5, psn=9) / Raw(bytes(8 + 4 + 16)))
    good = bytes(Ether() / IP(src="10.0.0.1", dst="10.0.0.2", flags=2) /
                 UDP(sport=0xC000, dport=4791, chksum=0) /
                 sroce.BTH(opcode=0x04, dqpn=5, psn=10, ackreq=1) / Raw(bytes(400)))
    p = tmp_path / "odd.pcap"
    with open(p, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 128, 1))
        for i, (data, orig) in enumerate(((rd, len(rd)), (good[:128], len(good)),
                                          (good, len(good)))):
            f.write(struct.pack("<IIII", 1, i, len(data), orig) + data)
    out = tmp_path / "odd.json"
    r = run(p, "--json", out)
    _no_traceback(r)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert "MALFORMED (unknown or reserved BTH opcode 0x44) icrc=good" in lines[0]
    assert "10.0.0.1 -> 10.0.0.2 MALFORMED" in lines[1] and "captured 128 of 458 bytes" in lines[1]
    assert "icrc=unchecked" in lines[1]
    assert "RC_SEND_ONLY" in lines[2] and "icrc=good" in lines[2]
    rep = json.loads(out.read_text())
    assert rep["malformed_roce_frames"] == 2
    assert rep["icrc"] == {"passed": 2, "failed": 0, "unchecked": 1, "snapped": 1,
                           "failed_frames": []}
    assert _last_line(r.stdout) == "2 passed, 0 failed"


def test_ack_nak_rnr_cnp_counts(tmp_path):
    back = QPPath(src_mac=2, dst_mac=1, src_ip=0x0A000002, dst_ip=0x0A000001, dest_qp=0x77,
                  udp_sport=0xC200)
    frames = [build_ack_frame(back, psn=5, syndrome=0x1F, msn=1, ip_id=1),
              build_ack_frame(back, psn=6, syndrome=0x60, msn=1, ip_id=2),
              build_ack_frame(back, psn=6, syndrome=0x62, msn=1, ip_id=3),
              build_ack_frame(back, psn=6, syndrome=0x2E, msn=1, ip_id=4),
              build_ack_frame(back, psn=9, syndrome=0x05, msn=2, ip_id=5),
              build_cnp_frame(back, ip_id=6)]
    p = tmp_path / "acks.pcap"
    write_pcap(p, frames)
    out = tmp_path / "acks.json"
    r = run(p, "--json", out)
    assert r.returncode == 0, r.stderr
    (flow,) = json.loads(out.read_text())["flows"]
    assert (flow["acks"], flow["cnps"], flow["responses"]) == (2, 1, 5)
    assert flow["naks"] == {"PSN_SEQUENCE_ERROR": 1, "REMOTE_ACCESS_ERROR": 1, "RNR": 1}
    text = r.stdout
    assert "AETH(NAK PSN_SEQUENCE_ERROR msn=1)" in text
    assert "AETH(RNR-NAK timer=14(1.28ms) msn=1)" in text
    assert "AETH(ACK credits=6 msn=2)" in text
    assert " CNP " in text


def test_hw_checker_agrees_with_model(golden_dir, tmp_path):
    """The simulated hardware iCRC checker (sim.icrc_hw, 64-bit datapath) agrees with the model
    on a golden capture and on its one-bit-flipped copy."""
    pytest.importorskip("sim.icrc_hw")
    good = run(golden_dir / "rdma_write_lat.pcap", "--hw", "--width", "64", "--quiet")
    _no_traceback(good)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "Hardware iCRC check (width 64): 20 of 20 good, 0 disagree with the model" in good.stdout
    bad = tmp_path / "bad.pcap"
    assert _flip_roce_bits(golden_dir / "rdma_write_lat.pcap", bad) == 20
    r = run(bad, "--hw", "--width", "64", "--quiet")
    assert r.returncode == 1
    assert "Hardware iCRC check (width 64): 0 of 20 good, 0 disagree with the model" in r.stdout
    assert _last_line(r.stdout) == "0 passed, 20 failed"
    bad_width = run(golden_dir / "rdma_write_lat.pcap", "--hw", "--width", "100", "--quiet")
    _no_traceback(bad_width)
    assert bad_width.returncode == 2 and "100" in bad_width.stderr


# --- captures users actually have: Linux cooked (SLL, SLL2), pcapng; CLI edges ---------------

def _report(path, tmp_path, tag):
    out = tmp_path / f"{tag}.json"
    r = run(path, "--json", out, "--quiet")
    _no_traceback(r)
    rep = json.loads(out.read_text())
    for rec in rep["packets"]:
        rec.pop("time"), rec.pop("t")          # compared separately
    rep.pop("file")
    return r, rep


@pytest.mark.parametrize("link", ["sll", "sll2"])
@pytest.mark.parametrize("name", ["rdma_write_bw.pcap", "rdma_cm.pcap", "pingpong_ud.pcap"])
def test_reads_linux_cooked_captures(golden_dir, tmp_path, name, link):
    """The golden frames re-encapsulated as ``tcpdump -i any`` writes them (sim.pcap's
    documented SLL/SLL2 writer) give the same report as the Ethernet originals."""
    packets = read_capture(golden_dir / name)
    cooked = tmp_path / f"{link}.pcap"
    write_pcap(cooked, [(p.time, p.data) for p in packets], link=link)
    assert struct.unpack_from("<I", cooked.read_bytes(), 20)[0] == \
        {"sll": 113, "sll2": 276}[link]
    r0, rep0 = _report(golden_dir / name, tmp_path, "eth")
    r1, rep1 = _report(cooked, tmp_path, link)
    assert r1.returncode == 0 and r1.stdout == r0.stdout
    assert rep1 == rep0
    back = read_capture(cooked)
    assert [p.linktype for p in back] == [{"sll": 113, "sll2": 276}[link]] * len(packets)
    assert [p.data[6:] for p in back] == [p.data[6:] for p in packets]   # all but the dst MAC


_TSHARK_ROCE = ["frame.encap_type", "ip.src", "udp.dstport", "infiniband.bth.opcode",
                "infiniband.bth.psn", "infiniband.bth.destqp"]


def _tshark_rows(path):
    cmd = ["tshark", "-r", str(path), "-Y", "udp.dstport == 4791", "-T", "fields",
           "-E", "separator=;"]
    for f in _TSHARK_ROCE:
        cmd += ["-e", f]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return [ln.split(";") for ln in res.stdout.splitlines() if ln.strip()]


@pytest.mark.tools("tshark")
@pytest.mark.parametrize("link, encap", [("sll", "25"), ("sll2", "210")])
def test_tshark_decodes_our_cooked_captures(golden_dir, tmp_path, link, encap):
    """An outside decoder agrees that the SLL/SLL2 writer makes Linux cooked captures of
    RoCEv2 (UDP 4791) frames: same IP, BTH opcode, PSN and QP as the Ethernet originals."""
    src = golden_dir / "rdma_write_bw.pcap"
    cooked = tmp_path / f"{link}.pcap"
    write_pcap(cooked, [(p.time, p.data) for p in read_capture(src)], link=link)
    eth, ours = _tshark_rows(src), _tshark_rows(cooked)
    assert len(ours) == len(eth) == 20
    assert {row[0] for row in ours} == {encap}          # WTAP_ENCAP_SLL / WTAP_ENCAP_SLL2
    assert [row[1:] for row in ours] == [row[1:] for row in eth]


@pytest.mark.tools("tshark")
@pytest.mark.parametrize("link", ["ethernet", "sll2"])
def test_reads_tshark_pcapng(golden_dir, tmp_path, link):
    """pcapng as tshark/dumpcap write it (also what ibdump's pcapng looks like: section header,
    interface description, enhanced packet blocks), from Ethernet and from SLL2."""
    src = golden_dir / "rping.pcap"
    if link != "ethernet":
        cooked = tmp_path / "in.pcap"
        write_pcap(cooked, [(p.time, p.data) for p in read_capture(src)], link=link)
        src = cooked
    ng = tmp_path / "out.pcapng"
    res = subprocess.run(["tshark", "-r", str(src), "-F", "pcapng", "-w", str(ng)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert ng.read_bytes()[:4] == b"\x0a\x0d\x0d\x0a"
    r = run(ng, "--quiet")
    _no_traceback(r)
    assert r.returncode == 0 and _last_line(r.stdout) == "65 passed, 0 failed"


def test_other_link_types_are_refused_clearly(tmp_path):
    p = tmp_path / "wifi.pcap"
    write_pcap(p, [bytes(60)])
    data = bytearray(p.read_bytes())
    struct.pack_into("<I", data, 20, 105)                 # IEEE 802.11
    p.write_bytes(bytes(data))
    r = run(p)
    _no_traceback(r)
    assert r.returncode == 2 and "link type 105 is not supported" in r.stderr
    assert "113" in r.stderr and "276" in r.stderr


def test_nanosecond_capture_shows_real_times(golden_dir, tmp_path):
    """Simulated traffic is a few ns apart: a nanosecond pcap's time column shows it (the
    column used to print 0.000000 for every frame)."""
    frames = [p.data for p in read_capture(golden_dir / "rdma_write_lat.pcap")]
    period = 1 / 322e6                                    # 3.1 ns cycles
    p = tmp_path / "ns.pcap"
    write_pcap(p, [(k * 7 * period, f) for k, f in enumerate(frames)], nanoseconds=True)
    # then move every record to an epoch-sized time (1.7e9 s), where a float has no ns left
    data = bytearray(p.read_bytes())
    pos = 24
    while pos < len(data):
        sec, _, incl, _ = struct.unpack_from("<IIII", data, pos)
        struct.pack_into("<I", data, pos, sec + 1_700_000_000)
        pos += 16 + incl
    p.write_bytes(bytes(data))
    r = run(p)
    assert r.returncode == 0, r.stderr
    rows = [ln.split() for ln in r.stdout.splitlines() if "icrc=" in ln]
    times = [float(row[1]) for row in rows]
    assert len(set(times)) == len(times) == 20
    assert all(len(row[1].split(".")[1]) == 9 for row in rows)
    n = [int(row[0]) for row in rows]
    for k, t in zip(n, times):        # frame k at (k - 1) * 7 cycles, to the nanosecond
        assert abs(t - (k - 1) * 7 * period) < 1.5e-9, (k, t)
    # a microsecond capture keeps its 6 decimals
    r = run(golden_dir / "rdma_write_lat.pcap")
    row = next(ln.split() for ln in r.stdout.splitlines() if "icrc=" in ln)
    assert len(row[1].split(".")[1]) == 6


def test_broken_pipe_ends_quietly(golden_dir, tmp_path):
    """``python -m sim.analyze CAPTURE | head``: no BrokenPipeError traceback."""
    frames = [p.data for p in read_capture(golden_dir / "rdma_write_bw.pcap")] * 200
    big = tmp_path / "big.pcap"
    write_pcap(big, frames)                                # far more output than a pipe holds
    proc = subprocess.Popen([sys.executable, "-m", "sim.analyze", str(big)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()                                    # what `head -1` does
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert b"icrc=" in first
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert proc.returncode in (0, 1)
    # and through a real shell pipe
    res = subprocess.run(f"{sys.executable} -m sim.analyze {big} | head -3", shell=True,
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert len(res.stdout.splitlines()) == 3 and "Traceback" not in res.stderr, res.stderr
