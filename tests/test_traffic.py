# SPDX-License-Identifier: BSD-2-Clause
"""sim.traffic: the simulated engine reproduces captured rxe frames; the CLI's pcap and JSON."""

import hashlib
import json
import re
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
@pytest.mark.parametrize("width", [64, 512] + [pytest.param(w, marks=pytest.mark.slow)
                                                 for w in (128, 256, 1024)])
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


@pytest.mark.tools("verilator")
def test_both_back_ends_write_the_same_pcap(tmp_path):
    """The same seeded run (random idle and stall on every stream) on both back ends: the
    same pcap, byte for byte (time stamps are cycles), and the same JSON."""
    args = ["--width", "512", "--qps", "3", "--messages", "10", "--max-size", "2500",
            "--pmtu", "1024", "--seed", "5", "--stall", "0.2", "--quiet"]
    out = {}
    for backend in ("amaranth", "verilator"):
        pcap, js = tmp_path / f"{backend}.pcap", tmp_path / f"{backend}.json"
        res = _traffic(*args, "--backend", backend, "--pcap", str(pcap), "--json", str(js))
        assert res.returncode == 0, res.stderr + res.stdout
        out[backend] = (pcap.read_bytes(), json.loads(js.read_text()))
    assert out["amaranth"][0] == out["verilator"][0]
    assert out["amaranth"][1] == out["verilator"][1]
    assert out["verilator"][1]["totals"]["frames"] >= 10
    assert out["verilator"][1]["totals"]["model_mismatches"] == 0


@pytest.mark.slow
@pytest.mark.tools("verilator")
def test_issue_34_run_on_verilator(tmp_path):
    """The issue's run: 2,000 messages up to 12,000 bytes on 16 QPs at 512 bits, in minutes."""
    import time
    js = tmp_path / "big.json"
    t0 = time.monotonic()
    res = _traffic("--backend", "verilator", "--width", "512", "--qps", "16", "--messages",
                   "2000", "--max-size", "12000", "--json", str(js), "--quiet")
    assert res.returncode == 0, res.stderr + res.stdout
    assert time.monotonic() - t0 < 600
    t = json.loads(js.read_text())["totals"]
    assert t["frames"] >= 2000 and t["model_mismatches"] == 0 and t["framing_errors"] == 0


@pytest.mark.tools("tshark")
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


@pytest.mark.parametrize("doc, words", [
    # a typo at every level is named, with the key it probably meant
    ({"qps": [dict(_QP0, pmut=1024)], "wrs": []}, ["qps[0]", "'pmut'", "'pmtu'"]),
    ({"qps": [_QP0], "wrs": [{"qp": 0, "opcode": "write", "rkey": 5}]},
     ["wrs[0]", "'rkey'", "'r_key'"]),
    ({"qps": [_QP0], "wrs": [], "local_iq": "10.0.0.1"}, ["top level", "'local_iq'", "'local_ip'"]),
    ({"qps": [_QP0], "wrs": [], "colour": "red"}, ["top level", "'colour'", "allowed:"]),
    ({"qps": [_QP0, dict(_QP0, index=1, foo=1)], "wrs": []}, ["qps[1]", "'foo'"]),
    ({"qps": [_QP0], "wrs": [{"qp": 0, "opcode": "write"}, {"qp": 0, "opcode": "send",
                                                            "length": 3}]}, ["wrs[1]", "'length'"]),
    ({"qps": {"index": 0}, "wrs": []}, ["'qps' must be a JSON list"]),
    ({"qps": [_QP0], "wrs": ["write"]}, ["wrs[0] must be a JSON object"]),
])
def test_scenario_unknown_keys_are_refused_by_name(tmp_path, doc, words):
    path = tmp_path / "typo.json"
    path.write_text(json.dumps(doc))
    res = _traffic("--scenario", str(path), "--width", "64")
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    for w in words:
        assert w in res.stderr, (w, res.stderr)


def test_scenario_keys_are_the_ones_the_loader_reads():
    """Every allowed key is read by load_scenario (none allowed and then silently ignored)."""
    import inspect

    from sim import traffic
    src = inspect.getsource(traffic.load_scenario)
    for level, keys in traffic.SCENARIO_KEYS.items():
        for key in keys:
            assert f'"{key}"' in src, (level, key)


def test_help_has_text_and_default_for_every_option():
    import argparse

    from sim import traffic
    res = _traffic("--help")
    assert res.returncode == 0 and "usage: python -m sim.traffic" in res.stdout
    text = " ".join(res.stdout.split())
    parser_actions = []

    def capture(self, *a, **k):
        parser_actions.append(self)
        raise SystemExit(0)
    orig = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = capture
    try:
        with pytest.raises(SystemExit):
            traffic.main([])
    finally:
        argparse.ArgumentParser.parse_args = orig
    (parser,) = parser_actions
    for action in parser._actions:
        if action.dest == "help":
            continue
        assert action.help and len(action.help) > 10, action.option_strings
        opt = action.option_strings[0]
        assert opt in text, opt
        if action.default is not False:            # flags are off unless given
            fmt = parser._get_formatter()._get_help_string(action)
            assert "default" in fmt, opt
    # every default is shown in the help output
    for opt, default in (("--qps", "2"), ("--messages", "20"), ("--pmtu", "1024"),
                         ("--seed", "1"), ("--stall", "0.0"), ("--max-size", "4096"),
                         ("--min-size", "0"), ("--progress-interval", "5.0")):
        assert f"(default: {default})" in text, opt
    assert "else 512" in text and "(default: not written)" in text


def test_progress_lines(tmp_path):
    """A run longer than --progress-interval reports messages, frames, cycles and rate on
    stderr; --quiet and short runs print none."""
    args = ["--width", "64", "--qps", "2", "--messages", "6", "--max-size", "800",
            "--pmtu", "256", "--seed", "2"]
    res = _traffic(*args, "--progress-interval", "0")
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("sim.traffic: ")]
    assert len(lines) >= 2, res.stderr
    for ln in lines:
        assert re.fullmatch(r"sim\.traffic: \d+/6 messages posted, \d+ frames, \d+ cycles, "
                            r"[\d,]+ cycles/s, \d+ s", ln), ln
    assert lines[-1].startswith("sim.traffic: 6/6 messages posted")
    quiet = _traffic(*args, "--progress-interval", "0", "--quiet")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    # a run shorter than the interval is quiet (600 s: the default 5 s is exceeded by this
    # run on a loaded machine)
    short = _traffic(*args, "--progress-interval", "600")
    assert not [ln for ln in short.stderr.splitlines() if ln.startswith("sim.traffic: ")]
    assert quiet.stdout == short.stdout == res.stdout


def test_progress_helper():
    import io

    from sim.harness import Progress
    now = [0.0]
    out = io.StringIO()
    p = Progress("x", 10, interval=5.0, stream=out, clock=lambda: now[0])
    p.update(100, 1)
    assert out.getvalue() == ""                   # nothing before the first interval
    now[0] = 6.0
    p.update(6000, 3, 2)
    assert out.getvalue() == "x: 3/10 messages, 2 frames, 6000 cycles, 1,000 cycles/s, 6 s\n"
    now[0] = 7.0
    p.update(7000, 4)                             # at most one line per interval
    assert out.getvalue().count("\n") == 1
    p.finish(9000, 10, 8)
    assert out.getvalue().splitlines()[-1].startswith("x: 10/10 messages, 8 frames, 9000")


# --- the lossy network between the engine and the responder model (issue 35) ------------------

@pytest.mark.parametrize("args, word", [
    (["--loss", "1.5"], "--loss"), (["--dup", "-0.1"], "--dup"),
    (["--reorder", "lots"], "--reorder"), (["--corrupt", "2"], "--corrupt"),
    (["--delay", "0.1", "--delay-max", "0"], "--delay-max"), (["--latency", "0"], "--latency"),
    (["--reorder-depth", "0"], "--reorder-depth"), (["--drop-data", "1,x"], "--drop-data"),
    (["--drop-ack", ","], "--drop-ack")])
def test_bad_network_options_exit_2(args, word, capsys):
    from sim import traffic
    assert traffic.main(["--width", "64", "--messages", "1", "--quiet", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and word in err and "Traceback" not in err


_LOOP = ["--backend", "verilator", "--width", "64", "--qps", "3", "--messages", "30",
         "--max-size", "2500", "--seed", "4", "--quiet"]


@pytest.mark.tools("verilator")
def test_lossy_closed_loop_reports_the_loss(tmp_path):
    """Random faults both ways and one targeted drop: the JSON counts what the network did per
    direction, what the engine received (every frame out of the reverse link is judged by its
    ACK handler or dropped for its iCRC), and the delivery verdict; the engine does not
    retransmit yet, so messages are lost: exit 1 and a FAIL line."""
    js = tmp_path / "lossy.json"
    res = _traffic(*_LOOP, "--loss", "0.03", "--dup", "0.03", "--reorder", "0.03",
                   "--corrupt", "0.03", "--drop-data", "5", "--json", str(js))
    doc = json.loads(js.read_text())
    net, rel, d = doc["network"], doc["reliability"], doc["delivery"]
    keys = {"frames_in", "frames_out", "dropped", "targeted_dropped", "duplicated", "reordered",
            "corrupted", "delayed"}
    assert set(net["fwd"]) == set(net["rev"]) == keys
    assert net["options"]["drop"] == 0.03 and net["options"]["fwd"] == {"drop_data": [5]}
    assert net["fwd"]["targeted_dropped"] == 1
    assert net["fwd"]["frames_in"] == doc["totals"]["frames"]
    assert net["rev"]["frames_in"] == d["responder"]["acks_sent"] + d["responder"]["naks_sent"]
    assert sum(net[k][x] for k in ("fwd", "rev") for x in ("dropped", "duplicated", "reordered",
                                                           "corrupted")) > 0
    assert rel["ack_counters"]["ack_items"] == net["rev"]["frames_out"] - rel["rx_icrc_dropped"]
    assert rel["naks_received"]["seq"] >= 1 and rel["naks_sent_by_peer"]["0x60"] >= 1
    assert (rel["retransmitted"], rel["timeouts"], rel["rnr_waits"]) == (0, 0, 0)
    assert rel["completions_by_status"] == {} and "retransmit" in rel["not_built"]
    assert d["messages"] == 30 and d["delivered"] + d["lost"] + d["refused"] == 30
    assert not d["ok"] and d["lost"] >= 1 and d["arrived_ok"] and not d["all_arrived"]
    assert doc["totals"]["model_mismatches"] == 0       # it sends what it sends without loss
    assert res.returncode == 1, res.stderr + res.stdout
    last = res.stdout.splitlines()[-1]
    assert last.startswith("delivery: FAIL") and "does not retransmit" in last


@pytest.mark.tools("verilator")
def test_closed_loop_without_loss_passes(tmp_path):
    """``--loss 0``: the closed loop delivers every message and the engine's ACK handler counts
    every ACK; the frames are those of the run without the option (which stays the open-loop
    run it was: no network section)."""
    js, js0 = tmp_path / "loop.json", tmp_path / "open.json"
    res = _traffic(*_LOOP, "--loss", "0", "--json", str(js))
    assert res.returncode == 0, res.stderr + res.stdout
    assert res.stdout.splitlines()[-1].startswith("delivery: PASS, 30 of 30")
    doc = json.loads(js.read_text())
    d, rel, net = doc["delivery"], doc["reliability"], doc["network"]
    assert d["ok"] and d["delivered"] == 30 and d["lost"] == 0
    assert rel["acks_received"] == d["responder"]["acks_sent"] == net["rev"]["frames_in"]
    assert rel["naks_received"] == {"seq": 0, "rnr": 0, "fatal": 0}
    assert all(net[k][x] == 0 for k in ("fwd", "rev") for x in ("dropped", "corrupted"))
    res0 = _traffic(*_LOOP, "--json", str(js0))
    assert res0.returncode == 0, res0.stderr + res0.stdout
    doc0 = json.loads(js0.read_text())
    assert "network" not in doc0 and "delivery" not in doc0
    assert doc0["messages"] == doc["messages"]
    assert doc0["totals"]["frames"] == doc["totals"]["frames"]
    assert doc["totals"]["model_mismatches"] == doc0["totals"]["model_mismatches"] == 0
