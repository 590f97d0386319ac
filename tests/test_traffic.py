# SPDX-License-Identifier: BSD-2-Clause
"""sim.traffic: the simulated engine reproduces captured rxe frames; the CLI's pcap and JSON."""

import hashlib
import json
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT
from roce_hw import proto
from sim.pcap import read_capture

__all__ = []


def _rocev2_requests(path, opcodes):
    """The captured request frames (IPv4/UDP 4791) with the given BTH opcodes, in order."""
    out = []
    for p in read_capture(path):
        d = p.data
        if len(d) < 54 or d[12:14] != b"\x08\x00" or d[23] != proto.IP_PROTO_UDP:
            continue
        if proto.UDP.unpack(d, 34)["dst_port"] != proto.ROCEV2_UDP_PORT:
            continue
        if proto.BTH.unpack(d, 42)["opcode"] in opcodes:
            out.append(d)
    return out


def _scenario_from_capture(frames, opcode, tmp_path, width):
    """A scenario whose QP context, addresses and payload are taken from captured frames
    (fields in, bytes out: the engine has to rebuild every other byte itself)."""
    first = frames[0]
    eth = proto.ETH.unpack(first)
    ip = proto.IPV4.unpack(first, 14)
    udp = proto.UDP.unpack(first, 34)
    bth = proto.BTH.unpack(first, 42)
    wr = {"qp": 0, "opcode": opcode}
    off = 54
    if opcode == "write":
        reth = proto.RETH.unpack(first, 54)
        wr.update(remote_addr=reth["va"], r_key=reth["r_key"])
        off += 16
    payload = b""
    for n, fr in enumerate(frames):
        b = proto.BTH.unpack(fr, 42)
        start = off if n == 0 else 54
        payload += fr[start:len(fr) - 4 - b["pad_cnt"]]
    wr["payload_hex"] = payload.hex()
    mac = lambda v: ":".join(f"{(v >> (8 * (5 - i))) & 0xFF:02x}" for i in range(6))
    doc = {
        "width": width, "local_mac": mac(eth["src"]), "local_ip": ip["src"],
        "ip_id_start": ip["identification"],
        "qps": [{"index": 0, "remote_qpn": bth["dest_qp"], "remote_mac": mac(eth["dst"]),
                 "remote_ip": ip["dst"], "start_psn": bth["psn"], "udp_sport": udp["src_port"],
                 "pmtu": 1024, "dscp": ip["dscp"], "ecn": ip["ecn"]}],
        "wrs": [wr],
    }
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(doc))
    return path, payload


def _traffic(*args):
    return subprocess.run([sys.executable, "-m", "sim.traffic", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize("capture, opcode, ops", [
    ("rdma_write_bw.pcap", "write", (0x06, 0x07, 0x08)),
    ("rdma_send_bw.pcap", "send", (0x00, 0x01, 0x02)),
])
@pytest.mark.parametrize("width", [64, 512])
def test_scenario_reproduces_captured_message(golden_dir, tmp_path, capture, opcode, ops, width):
    frames = _rocev2_requests(golden_dir / capture, ops)[:3]
    assert [proto.BTH.unpack(f, 42)["opcode"] for f in frames] == list(ops)
    scenario, payload = _scenario_from_capture(frames, opcode, tmp_path, width)
    assert len(payload) == 3000
    pcap, js = tmp_path / "out.pcap", tmp_path / "out.json"
    res = _traffic("--scenario", str(scenario), "--pcap", str(pcap), "--json", str(js))
    assert res.returncode == 0, res.stderr + res.stdout
    got = [p.data for p in read_capture(pcap)]
    assert got == frames
    doc = json.loads(js.read_text())
    assert doc["messages"][0]["sha256"] == hashlib.sha256(payload).hexdigest()
    assert doc["totals"]["frames"] == 3


def test_random_run_is_a_function_of_the_seed(tmp_path):
    args = ["--width", "64", "--qps", "3", "--messages", "6", "--min-size", "0",
            "--max-size", "700", "--pmtu", "256", "--seed", "7"]
    docs = []
    for n in range(2):
        js = tmp_path / f"r{n}.json"
        pcap = tmp_path / f"r{n}.pcap"
        res = _traffic(*args, "--json", str(js), "--pcap", str(pcap))
        assert res.returncode == 0, res.stderr + res.stdout
        docs.append(json.loads(js.read_text()))
    assert docs[0]["messages"] == docs[1]["messages"]
    t = docs[0]["totals"]
    assert t["model_mismatches"] == 0
    assert t["framing_errors"] == 0
    assert t["frames"] == len(read_capture(tmp_path / "r0.pcap"))
    assert t["payload_bytes"] == sum(m["length"] for m in docs[0]["messages"])
    assert 0 < t["bus_utilisation"] <= 1
    assert {m["opcode"] for m in docs[0]["messages"]} <= {"write", "write_imm", "send", "send_imm"}


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed")
def test_pcap_decodes_in_tshark(tmp_path):
    pcap = tmp_path / "t.pcap"
    res = _traffic("--width", "64", "--qps", "2", "--messages", "4", "--max-size", "600",
                   "--pmtu", "256", "--seed", "3", "--pcap", str(pcap))
    assert res.returncode == 0, res.stderr + res.stdout
    out = subprocess.run(["tshark", "-r", str(pcap), "-T", "fields", "-e", "infiniband.bth.opcode",
                          "-e", "infiniband.bth.destqp"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [l for l in out.stdout.splitlines() if l.strip()]
    assert len(rows) == len(read_capture(pcap)) and all(r.split("\t")[0] for r in rows)


@pytest.mark.parametrize("args, word", [
    (["--width", "100"], "64, 128, 256, 512, 1024"),
    (["--pmtu", "1000"], "PMTU"),
    (["--ops", "read"], "read"),
])
def test_bad_arguments_exit_2(args, word):
    res = _traffic(*args)
    assert res.returncode == 2 and word in res.stderr and "Traceback" not in res.stderr


_QP0 = {"index": 0, "remote_qpn": 17, "remote_mac": "02:00:00:00:00:02", "remote_ip": "10.0.0.2"}


@pytest.mark.parametrize("doc, word", [
    ([1, 2], "JSON object"),
    ({"qps": [_QP0], "wrs": [{"qp": 3, "opcode": "write"}]}, "QP 3"),
    ({"qps": [dict(_QP0, start_psn=1 << 24)], "wrs": []}, "start_psn"),
    ({"qps": [dict(_QP0, pmtu=1000)], "wrs": []}, "PMTU"),
    ({"qps": [_QP0], "wrs": [{"qp": 0, "opcode": "write", "r_key": 1 << 32}]}, "r_key"),
    ({"qps": [_QP0]}, "wrs"),
])
def test_bad_scenario_exits_2_with_a_clear_message(tmp_path, doc, word):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    res = _traffic("--scenario", str(path), "--width", "64")
    assert res.returncode == 2, res.stderr
    assert word in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize("stall", ["1.0", "-0.5"])
def test_stall_outside_0_1_exits_2(stall):
    res = _traffic("--stall", stall, "--width", "64", "--messages", "1")
    assert res.returncode == 2 and "--stall" in res.stderr and "Traceback" not in res.stderr
