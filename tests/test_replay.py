# SPDX-License-Identifier: BSD-2-Clause
"""``python -m sim.replay``: a capture into the simulated engine, its frames and final state out.

The input capture is built with scapy (the oracle of the frame formats): an ARP request, an
OPEN_QP datagram packed as the reference host script packs it
(``struct.pack('>BLLLQLLLLQLHBLLL', ...)``), MODIFY_QP_RTS, a txmeta start of the generator, a
malformed request and other traffic. The output is decoded with scapy and the same struct
format, and compared byte for byte with the frame-level model (:class:`sim.replay.EngineModel`).
"""

import json
import struct
import subprocess
import sys

import pytest
from scapy.contrib import roce as sroce
from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw
from scapy.utils import wrpcap

from roce_hw import proto
from roce_hw.model.cm import generator_payload
from sim import replay as rp
from sim.oracle import protocol_icrc_bytes
from sim.pcap import read_capture

from conftest import ROOT

__all__ = []

ENGINE_MAC = "02:00:00:00:00:01"
ENGINE_IP = "10.0.0.1"
HOST_MAC = "02:00:00:00:00:02"
HOST_IP = "10.0.0.2"
#: The reference host script's datagram format.
FMT = ">BLLLQLLLLQLHBLLL"
REPLY_PORT = 0x4322

HOST_QPN, HOST_PSN, HOST_RKEY, HOST_VA = 0x11, 0x000100, 0xABCD1234, 0x7F00_0000_1000
ENGINE_PSN = 0xFFFFFE             # the engine's start PSN: wraps within the generator's run
GEN_LEN, GEN_COUNT = 100, 3


def ip_int(s):
    return int.from_bytes(bytes(int(x) for x in s.split(".")), "big")


def dgram(*, valid=1, req_type=0, ack_valid=0, ack_type=0, loc_qpn=0, loc_psn=0, loc_r_key=0,
          loc_base_addr=0, loc_ip=0, rem_qpn=0, rem_psn=0, rem_r_key=0, rem_base_addr=0,
          rem_ip=0, reply_port=REPLY_PORT, tx_valid=0, tx_start=0, tx_immediate=0, tx_type=0,
          tx_resv=0, tx_dma_length=0, tx_n_transfers=0, tx_period=0):
    """A datagram exactly as the reference ``send_connection_info.py`` packs it."""
    flags = valid | req_type << 1 | ack_valid << 4 | ack_type << 5
    tx_flags = tx_valid | tx_start << 1 | tx_immediate << 2 | tx_type << 3 | tx_resv << 4
    return struct.pack(FMT, flags, loc_qpn, loc_psn, loc_r_key, loc_base_addr, loc_ip, rem_qpn,
                       rem_psn, rem_r_key, rem_base_addr, rem_ip, reply_port, tx_flags,
                       tx_dma_length, tx_n_transfers, tx_period)


def undgram(b):
    """The reply's fields, decoded with the same struct format."""
    (flags, loc_qpn, loc_psn, loc_r_key, loc_base_addr, loc_ip, rem_qpn, rem_psn, rem_r_key,
     rem_base_addr, rem_ip, reply_port, tx_flags, tx_dma_length, tx_n_transfers,
     tx_period) = struct.unpack(FMT, b)
    return {"valid": flags & 1, "req_type": flags >> 1 & 7, "ack_valid": flags >> 4 & 1,
            "ack_type": flags >> 5, "loc_qpn": loc_qpn, "loc_psn": loc_psn,
            "loc_r_key": loc_r_key, "loc_base_addr": loc_base_addr, "loc_ip": loc_ip,
            "rem_qpn": rem_qpn, "rem_psn": rem_psn, "rem_r_key": rem_r_key,
            "rem_base_addr": rem_base_addr, "rem_ip": rem_ip, "reply_port": reply_port,
            "tx_flags": tx_flags, "tx_dma_length": tx_dma_length,
            "tx_n_transfers": tx_n_transfers, "tx_period": tx_period}


def cm_frame(payload, *, mac=HOST_MAC, ip=HOST_IP):
    """A CM datagram from ``mac``/``ip`` to the engine (scapy computes the checksums)."""
    return bytes(Ether(src=mac, dst=ENGINE_MAC) / IP(src=ip, dst=ENGINE_IP, flags="DF")
                 / UDP(sport=REPLY_PORT, dport=proto.CM_UDP_PORT) / Raw(payload))


def scenario():
    """``(name, frame)`` of the input capture, in order."""
    host = dict(loc_qpn=HOST_QPN, loc_psn=HOST_PSN, loc_r_key=HOST_RKEY, loc_base_addr=HOST_VA,
                loc_ip=ip_int(HOST_IP))
    return [
        ("arp", bytes(Ether(src=HOST_MAC, dst="ff:ff:ff:ff:ff:ff")
                      / ARP(op=1, hwsrc=HOST_MAC, psrc=HOST_IP, pdst=ENGINE_IP))),
        ("arp_other_ip", bytes(Ether(src=HOST_MAC, dst="ff:ff:ff:ff:ff:ff")
                               / ARP(op=1, hwsrc=HOST_MAC, psrc=HOST_IP, pdst="10.0.0.99"))),
        ("open", cm_frame(dgram(req_type=proto.CmReq.OPEN_QP, rem_psn=ENGINE_PSN, **host))),
        ("ping", bytes(Ether(src=HOST_MAC, dst=ENGINE_MAC) / IP(src=HOST_IP, dst=ENGINE_IP)
                       / ICMP() / Raw(b"ping" * 10))),
        ("modify", cm_frame(dgram(req_type=proto.CmReq.MODIFY_QP_RTS, rem_qpn=256,
                                  rem_psn=ENGINE_PSN, **host))),
        ("bad_flags", cm_frame(dgram(req_type=proto.CmReq.OPEN_QP, ack_valid=1, **host))),
        ("udp_other", bytes(Ether(src=HOST_MAC, dst=ENGINE_MAC) / IP(src=HOST_IP, dst=ENGINE_IP)
                            / UDP(sport=1234, dport=9999) / Raw(b"x" * 30))),
        ("start", cm_frame(dgram(valid=0, rem_qpn=256, tx_valid=1, tx_start=1, tx_type=1,
                                 tx_immediate=1, tx_dma_length=GEN_LEN,
                                 tx_n_transfers=GEN_COUNT, **host))),
    ]


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    d = tmp_path_factory.mktemp("replay")
    frames = scenario()
    wrpcap(str(d / "in.pcap"), [Ether(f) for _, f in frames])
    return d, frames


def _classify(frames):
    """Output frames by kind, decoded with scapy: ``{"arp": [...], "cm": [...], "roce": [...]}``."""
    out = {"arp": [], "cm": [], "roce": [], "?": []}
    for f in frames:
        p = Ether(f)
        if ARP in p:
            out["arp"].append(p)
        elif UDP in p and p[UDP].sport == proto.CM_UDP_PORT:
            out["cm"].append(p)
        elif UDP in p and p[UDP].dport == proto.ROCEV2_UDP_PORT:
            out["roce"].append(p)
        else:
            out["?"].append(p)
    return out


def _check_outputs(frames):
    """The replies and data frames of :func:`scenario`, checked with scapy and struct."""
    k = _classify(frames)
    assert not k["?"]
    (arp,) = k["arp"]
    assert arp[Ether].dst == HOST_MAC and arp[Ether].src == ENGINE_MAC
    assert arp[ARP].op == 2 and arp[ARP].hwsrc == ENGINE_MAC and arp[ARP].psrc == ENGINE_IP
    assert arp[ARP].hwdst == HOST_MAC and arp[ARP].pdst == HOST_IP
    assert len(bytes(arp)) == 60
    replies = [undgram(bytes(p[UDP].payload)) for p in k["cm"]]
    for p in k["cm"]:
        assert p[Ether].dst == HOST_MAC and p[IP].dst == HOST_IP and p[IP].src == ENGINE_IP
        assert p[UDP].dport == REPLY_PORT and len(bytes(p[UDP].payload)) == 64
        assert p[IP].flags == "DF" and p[UDP].chksum == 0 and p[IP].ttl == 64
        fresh = p[IP].copy()
        fresh.chksum = None
        assert IP(bytes(fresh)).chksum == p[IP].chksum           # scapy recomputes it
    assert [(r["req_type"], r["valid"], r["ack_type"]) for r in replies] == [
        (proto.CmReq.OPEN_QP, 1, proto.CmAck.ACK),
        (proto.CmReq.MODIFY_QP_RTS, 1, proto.CmAck.ACK),
        (proto.CmReq.OPEN_QP, 1, proto.CmAck.ERROR),
        (0, 0, proto.CmAck.ACK)]
    assert all(r["ack_valid"] == 1 for r in replies)
    opened = replies[0]
    assert opened["loc_qpn"] == 256 and opened["loc_psn"] == ENGINE_PSN
    assert opened["loc_ip"] == ip_int(ENGINE_IP)
    assert (opened["rem_qpn"], opened["rem_psn"], opened["rem_r_key"], opened["rem_base_addr"],
            opened["rem_ip"]) == (HOST_QPN, HOST_PSN, HOST_RKEY, HOST_VA, ip_int(HOST_IP))
    assert replies[3]["tx_dma_length"] == GEN_LEN and replies[3]["tx_n_transfers"] == GEN_COUNT
    # the generator's WRITE_WITH_IMM messages: one ONLY packet each (100 < PMTU 1024)
    data = k["roce"]
    assert len(data) == GEN_COUNT
    for n, p in enumerate(data):
        bth = p[sroce.BTH]
        assert bth.opcode == 0x0B and bth.dqpn == HOST_QPN and bth.ackreq == 1
        assert bth.psn == (ENGINE_PSN + n) & proto.PSN_MASK
        assert p[Ether].dst == HOST_MAC and p[IP].dst == HOST_IP
        raw = bytes(p[UDP].payload)
        reth = struct.unpack(">QII", raw[12:28])
        assert reth == (HOST_VA + n * GEN_LEN, HOST_RKEY, GEN_LEN)
        assert struct.unpack(">I", raw[28:32])[0] == n          # ImmDt = message number
        assert raw[32:32 + GEN_LEN] == generator_payload(n, GEN_LEN)
        l3 = bytes(p[IP])
        assert protocol_icrc_bytes(l3[:-4]) == l3[-4:]
    return k


# -- no simulation ---------------------------------------------------------------------------
def test_reference_packing_is_the_datagram_layout():
    """The struct format and the project's CM_DATAGRAM declaration agree (independent oracle)."""
    b = dgram(req_type=3, loc_qpn=0x123456, loc_psn=7, loc_r_key=0xDEADBEEF,
              loc_base_addr=0x0102030405060708, loc_ip=ip_int(HOST_IP), rem_qpn=257,
              rem_psn=0xABCDEF, tx_valid=0, tx_type=1, tx_dma_length=5, tx_period=9)
    assert len(b) == proto.CM_DATAGRAM_BYTES
    f = proto.CM_DATAGRAM.unpack(b)
    assert (f["valid"], f["req_type"], f["loc_qpn"], f["loc_base_addr"], f["rem_psn"],
            f["tx_type"], f["tx_period"]) == (1, 3, 0x123456, 0x0102030405060708, 0xABCDEF, 1, 9)


def test_model_replay(capture):
    """The frame-level model answers the scenario as the CM spec says (the hardware's oracle)."""
    _, frames = capture
    res = rp.replay([f for _, f in frames], width=64, n_qp=4, local_mac=rp.parse_mac(ENGINE_MAC),
                    local_ip=rp.parse_ip(ENGINE_IP), model=True)
    _check_outputs([f for _, f in res.tx])
    assert [bytes(f) for _, f in res.other] == [f for n, f in frames
                                                if n in ("arp_other_ip", "ping", "udp_other")]
    row = res.qp_table[0]
    assert row["state"] == proto.QPState.RTS and row["remote_qpn"] == HOST_QPN
    assert row["next_psn"] == (ENGINE_PSN + GEN_COUNT) & proto.PSN_MASK
    assert all(r["state"] == 0 for r in res.qp_table[1:])
    assert res.counters["cm"]["ok"] == 3 and res.counters["cm"]["bad_flags"] == 1
    rx = {k: v for k, v in res.counters["rx"].items() if v}
    assert rx == {"rx_frames": 8, "arp": 1, "cm": 4, "other": 3}


def test_cli_errors(tmp_path, capture):
    d, _ = capture
    good = ["--width", "64", "--qps", "4", "--mac", ENGINE_MAC, "--ip", ENGINE_IP,
            "--rx", str(d / "in.pcap"), "--tx", str(tmp_path / "o.pcap"),
            "--json", str(tmp_path / "s.json"), "--model", "--quiet"]

    def run(*changes):
        args = list(good)
        for opt, val in changes:
            args[args.index(opt) + 1] = val
        r = subprocess.run([sys.executable, "-m", "sim.replay", *args], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
        return r.returncode, r.stderr.strip()

    bad_pcap = tmp_path / "bad.pcap"
    bad_pcap.write_bytes(b"not a capture at all")
    cut = tmp_path / "cut.pcap"
    cut.write_bytes((d / "in.pcap").read_bytes()[:-7])
    for change, words in [
            (("--width", "100"), "64, 128"), (("--qps", "0"), "--qps"),
            (("--mac", "02:00:00:00:01"), "MAC"), (("--ip", "10.0.0.300"), "IPv4"),
            (("--rx", str(tmp_path / "missing.pcap")), "missing.pcap"),
            (("--rx", str(bad_pcap)), "not a pcap"), (("--rx", str(cut)), "cut.pcap"),
            (("--json", str(tmp_path)), "directory")]:
        rc, err = run(change)
        assert rc == 2, (change, err)
        assert len(err.splitlines()) == 1 and err.startswith("error:") and words in err, \
            (change, err)
    rc, err = run()
    assert rc == 0, err
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["engine"] == "model" and doc["qp_table"][0]["state"] == proto.QPState.RTS
    assert len(read_capture(tmp_path / "o.pcap")) == 1 + 4 + GEN_COUNT


# -- the slice-based driver ------------------------------------------------------------------
@pytest.mark.parametrize("width", [64, 512])
def test_driver(width):
    """EngineDriver on the Amaranth back end: frames in back to back (and after a gap), at
    start cycles known when they are queued; frames out on m_axis_rx_other byte for byte, an
    ARP reply on m_axis_tx, a frame flagged bad (tuser) dropped; idle() and slices; the QP
    table read row by row through the management port and the counters nested by name."""
    import random
    from roce_hw.config import EngineConfig
    rng = random.Random(width)
    others = [bytes(Ether(src=HOST_MAC, dst=ENGINE_MAC) / IP(src=HOST_IP, dst=ENGINE_IP)
                    / UDP(sport=1000 + k, dport=9999) / Raw(rng.randbytes(rng.randrange(0, 150))))
              for k in range(5)]
    others.append(bytes(Ether(src=HOST_MAC, dst=ENGINE_MAC, type=0x88B5) / Raw(b"local" * 9)))
    arp = bytes(Ether(src=HOST_MAC, dst="ff:ff:ff:ff:ff:ff")
                / ARP(op=1, hwsrc=HOST_MAC, psrc=HOST_IP, pdst=ENGINE_IP))
    lanes = width // 8
    with rp.EngineDriver(EngineConfig(data_width=width, n_qp=3), local_mac=ENGINE_MAC,
                         local_ip=ENGINE_IP) as drv:
        assert drv.backend == "amaranth" and drv.cycle == 0 and drv.idle() == 0
        starts = [drv.send(f) for f in others[:3]]
        starts.append(drv.send(arp, gap=7))
        starts.append(drv.send(arp, tuser=1))            # bad FCS: dropped
        starts += [drv.send(f) for f in others[3:]]
        sent = others[:3] + [arp, arp] + others[3:]
        beats = [-(-len(f) // lanes) for f in sent]
        assert starts[0] == 0
        assert [b - a for a, b in zip(starts, starts[1:])] == \
            [n + (7 if k == 3 else 0) for k, n in enumerate(beats[:-1])]
        assert drv.rx_end == starts[-1] + beats[-1] and drv.rx_frames == 8
        tx, other = [], []
        while drv.cycle < drv.rx_end:                   # in slices of 5 cycles
            assert drv.idle() == 0
            t, o = drv.run(5)
            tx += t
            other += o
        while drv.idle() < 100:
            t, o = drv.run(100 - drv.idle())
            tx += t
            other += o
        assert drv.idle() == 100 and not drv.tx_in_progress()
        assert [f.data for f in other] == others
        assert all(a.last < b.first for a, b in zip(other, other[1:]))
        assert all(f.first >= s for f, s in zip(other, starts[:3] + starts[5:]))
        (reply,) = tx
        assert reply.tuser == 0 and reply.first > starts[3]
        assert Ether(reply.data)[ARP].op == 2 and Ether(reply.data)[ARP].pdst == HOST_IP
        assert drv.last_move == max(other[-1].last, reply.last) + 1
        assert (drv.tx_frames, drv.tx_aborted, drv.other_frames) == (1, 0, 6)
        table, counters = drv.finish()
    assert [r["qp"] for r in table] == [0, 1, 2] and table is drv.qp_table
    assert table[1] == {"qp": 1, "qpn": 257, **{name: 0 for name, _ in proto.QP_CONTEXT_FIELDS}}
    assert set(counters) == {"tx", "rx", "cm", "ack"}
    assert not any(counters["ack"].values())          # no RoCEv2 frame was received
    assert {k: v for k, v in counters["rx"].items() if v} == {
        "rx_frames": 8, "other": 6, "arp": 1, "mac_bad": 1}
    # the ARP reply is not a TX engine frame: no tx counter moved
    assert not any(counters["tx"].values()) and not any(counters["cm"].values())
    assert drv.statuses == []


def test_nest_counters():
    from roce_hw.engine import engine_counters_layout
    flat = {"cycle": 5}
    for block, fld in engine_counters_layout():
        for k, (name, _) in enumerate(fld.shape):
            flat[f"{block}_{name}"] = len(block) * 100 + k
    nested = rp.nest_counters(flat)
    assert nested["rx"]["rx_frames"] == 200 and nested["rx"]["other"] == 204
    assert nested["cm"]["ok"] == 200 and nested["tx"]["frames"] == 200
    assert sum(len(v) for v in nested.values()) == len(flat) - 1


# -- the hardware ----------------------------------------------------------------------------
def _replay_cli(d, width, *extra, qps=4):
    tag = f"{width}_{qps}_{'_'.join(extra)}"
    out, js, other = d / f"out{tag}.pcap", d / f"s{tag}.json", d / f"other{tag}.pcap"
    r = subprocess.run([sys.executable, "-m", "sim.replay", "--width", str(width),
                        "--qps", str(qps), "--mac", ENGINE_MAC, "--ip", ENGINE_IP,
                        "--rx", str(d / "in.pcap"), "--tx", str(out), "--json", str(js),
                        "--other", str(other), "--quiet", *extra], cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    return ([p.data for p in read_capture(out)], [p.data for p in read_capture(other)],
            json.loads(js.read_text()), r.stdout)


def _check_hardware(capture, width, *extra, qps=4):
    d, frames = capture
    tx, other, doc, stdout = _replay_cli(d, width, *extra, qps=qps)
    _check_outputs(tx)
    model = rp.replay([f for _, f in frames], width=width, n_qp=qps,
                      local_mac=rp.parse_mac(ENGINE_MAC), local_ip=rp.parse_ip(ENGINE_IP),
                      model=True)
    # byte for byte as the model, kind by kind (replies and data may interleave differently)
    for kind in ("arp", "cm", "roce"):
        assert [bytes(p) for p in _classify(tx)[kind]] == \
            [bytes(p) for p in _classify([f for _, f in model.tx])[kind]], kind
    assert other == [f for _, f in model.other]
    assert doc["engine"] == "RoceEngine" and doc["width"] == width and doc["stopped"] == "quiet"
    assert doc["output"] == {"path": doc["output"]["path"], "frames": len(tx), "aborted": 0,
                             "rx_other": 3}
    assert doc["qp_table"] == model.qp_table
    assert doc["counters"]["rx"] == model.counters["rx"]
    assert doc["counters"]["cm"] == model.counters["cm"]
    assert doc["counters"]["tx"]["frames"] == doc["counters"]["tx"]["gen_sent"] == GEN_COUNT
    assert doc["status"] == []
    assert stdout.startswith("8 frames in, 8 out (0 aborted, 3 on rx_other)")
    return doc


def test_hardware_replay_64(capture):
    """The engine at 64 bits: ARP reply, CM replies, generator data, rx_other, QP table and
    counters, all as the frame-level model says (and as scapy decodes them)."""
    _check_hardware(capture, 64)


@pytest.mark.slow
@pytest.mark.parametrize("width", [128, 256, 512, 1024])
def test_hardware_replay_widths(capture, width):
    _check_hardware(capture, width)


@pytest.mark.tools("verilator")
def test_hardware_replay_spacing(capture):
    """Idle cycles between frames and the capture's own time stamps change the timing only.
    On the Verilator back end: the scenario's time stamps are milliseconds apart (scapy builds
    the frames slowly), about 870,000 cycles at 64 bits, which Amaranth's simulator took more
    than 15 minutes for."""
    fast = _check_hardware(capture, 64, "--backend", "verilator", qps=16)
    gapped = _check_hardware(capture, 64, "--gap", "50", "--backend", "verilator", qps=16)
    assert gapped["cycles"] > fast["cycles"]
    timed = _check_hardware(capture, 64, "--timing", "capture", "--backend", "verilator",
                            qps=16)
    assert timed["qp_table"] == fast["qp_table"]
    stamps = [p.time for p in read_capture(capture[0] / "in.pcap")]
    assert timed["cycles"] >= (stamps[-1] - stamps[0]) * 156.25e6


def test_hardware_replay_stops_at_the_cycle_limit(tmp_path, capture):
    d, _ = capture
    r = subprocess.run([sys.executable, "-m", "sim.replay", "--width", "64", "--qps", "2",
                        "--mac", ENGINE_MAC, "--ip", ENGINE_IP, "--rx", str(d / "in.pcap"),
                        "--tx", str(tmp_path / "o.pcap"), "--json", str(tmp_path / "s.json"),
                        "--max-cycles", "40", "--quiet"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.strip().endswith("stopped: limit")
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["stopped"] == "limit" and len(doc["qp_table"]) == 2
    assert 40 <= doc["cycles"] < 40 + 14          # a frame being fed is finished first


# -- the two back ends -----------------------------------------------------------------------
#: Capture time stamps for the scenario's eight frames (``timing="capture"``).
TIMES = [0.0, 1e-6, 3e-6, 3.5e-6, 9e-6, 10e-6, 20e-6, 21e-6]


def _replay_on(backend, frames, width, *, n_qp=16, **kw):
    return rp.replay(frames, width=width, n_qp=n_qp, local_mac=rp.parse_mac(ENGINE_MAC),
                     local_ip=rp.parse_ip(ENGINE_IP), backend=backend, **kw)


def _assert_same(a, b):
    """Two replays gave the same output: frames and their cycles, QP table, counters, refused
    WR reports, end cycle and reason (everything but the wall-clock time and the back end)."""
    for name in ("inputs", "tx", "aborted", "other", "qp_table", "counters", "statuses",
                 "cycles", "stopped", "drain"):
        assert getattr(a, name) == getattr(b, name), name


@pytest.mark.tools("verilator")
@pytest.mark.parametrize("width", [64, 512])
def test_backends_give_the_same_replay(capture, width):
    """The scenario through the Amaranth and the Verilator back ends: the same frames at the
    same cycles, the same QP table, counters and end; also with the capture's time stamps, a
    gap and a cycle limit; in slices of 7 cycles instead of 4096, the same again."""
    frames = [f for _, f in capture[1]]
    am = _replay_on("amaranth", frames, width)
    ve = _replay_on("verilator", frames, width)
    assert (am.backend, ve.backend) == ("amaranth", "verilator")
    _assert_same(am, ve)
    _check_outputs([f for _, f in ve.tx])
    assert ve.stopped == "quiet" and len(ve.tx) == 8 and len(ve.other) == 3
    assert all(a[0] < b[0] for a, b in zip(ve.tx, ve.tx[1:]))
    _assert_same(ve, _replay_on("verilator", frames, width, slice_cycles=7))
    kw = dict(timing="capture", times=TIMES, gap=13, max_cycles=1000)
    am, ve = _replay_on("amaranth", frames, width, **kw), _replay_on("verilator", frames, width,
                                                                     **kw)
    _assert_same(am, ve)
    assert ve.stopped == "limit" and 1000 <= ve.cycles < 1050 and 0 < len(ve.tx) < 8
    _assert_same(ve, _replay_on("verilator", frames, width, slice_cycles=7, **kw))


@pytest.mark.tools("verilator")
def test_hardware_replay_cli_verilator(capture):
    """``python -m sim.replay --backend verilator``: the frames, QP table and counters the model
    says, and the same pcap (time stamps included) as the Amaranth back end."""
    from sim.traffic import CLOCK_MHZ
    d, frames = capture
    doc = _check_hardware(capture, 64, "--backend", "verilator", qps=16)
    assert doc["backend"] == "verilator"
    am = _replay_on("amaranth", [f for _, f in frames], 64)
    assert doc["cycles"] == am.cycles and doc["counters"] == am.counters
    got = read_capture(d / "out64_16_--backend_verilator.pcap")
    assert [p.data for p in got] == [f for _, f in am.tx]
    period = 1e-6 / CLOCK_MHZ[64]
    assert [round(p.time * 1e9) for p in got] == [round(c * period * 1e9) for c, _ in am.tx]


def test_backend_verilator_missing(tmp_path, capture, monkeypatch, capsys):
    """``--backend verilator`` without Verilator or g++: exit 2, one ``error:`` line naming the
    package to install; an unknown back end: exit 2 too."""
    import shutil
    d, _ = capture
    argv = ["--width", "64", "--qps", "4", "--mac", ENGINE_MAC, "--ip", ENGINE_IP,
            "--rx", str(d / "in.pcap"), "--tx", str(tmp_path / "o.pcap"),
            "--json", str(tmp_path / "s.json"), "--quiet", "--backend", "verilator"]
    which = shutil.which
    monkeypatch.delenv("CXX", raising=False)
    for tool in ("verilator", "g++"):
        monkeypatch.setattr(shutil, "which",
                            lambda name, *a, tool=tool, **k: None if name == tool else
                            which(name, *a, **k))
        assert rp.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("error: --backend verilator:"), err
        assert f"{tool} is not installed" in err and f"apt-get install {tool}" in err, err
        assert not (tmp_path / "s.json").exists()
    monkeypatch.setattr(shutil, "which", which)
    with pytest.raises(SystemExit) as e:
        rp.main(argv[:-1] + ["vcs"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "--backend" in err and "verilator" in err, err


# -- bursts: every queue of the RX front end holds what arrives back to back ------------------
def _host(k):
    """Host ``k`` of a burst: its MAC, IP and the fields of its OPEN_QP."""
    mac, ip = f"02:00:00:00:01:{k:02x}", f"10.0.1.{k + 1}"
    return mac, ip, dict(loc_qpn=0x40 + k, loc_psn=0x1000 * (k + 1), loc_r_key=0xBEEF0000 + k,
                         loc_base_addr=HOST_VA + (k << 20), loc_ip=ip_int(ip))


def _replay_both(frames, width, n_qp, backend):
    kw = dict(width=width, n_qp=n_qp, local_mac=rp.parse_mac(ENGINE_MAC),
              local_ip=rp.parse_ip(ENGINE_IP))
    return rp.replay(frames, backend=backend, **kw), rp.replay(frames, model=True, **kw)


#: The burst tests run on the Verilator back end (0.1 s each once built; 16 QPs, the build the
#: other Verilator tests use); on Amaranth's simulator (10-20 s each) under ``--slow``.
BACKENDS = pytest.mark.parametrize("backend", [
    pytest.param("verilator", marks=pytest.mark.tools("verilator")),
    pytest.param("amaranth", marks=pytest.mark.slow)])


def _check_against_model(hw, model, frames):
    """The hardware did what the frame-level model did with ``frames``: the same frames out
    (byte for byte, kind by kind), QP table and counters; the RX front end passed every
    datagram and ARP request on (nothing lost to a full queue)."""
    assert hw.stopped == "quiet"
    for kind in ("arp", "cm", "roce"):
        assert [bytes(p) for p in _classify([f for _, f in hw.tx])[kind]] == \
            [bytes(p) for p in _classify([f for _, f in model.tx])[kind]], kind
    assert hw.qp_table == model.qp_table
    assert hw.counters["rx"] == model.counters["rx"]
    assert hw.counters["cm"] == model.counters["cm"]
    rx = hw.counters["rx"]
    assert rx["rx_frames"] == len(frames) == rx["arp"] + rx["cm"]
    assert rx["arp_full"] == rx["cm_full"] == 0
    assert sum(hw.counters["cm"].values()) == rx["cm"]        # the CM served every datagram


@BACKENDS
def test_cm_burst_of_ten_512(backend):
    """Issue 33, item 1.5: ten CM datagrams back to back at 512 bits (a connection, four
    malformed requests, a close, a MODIFY of the closed QP, the reconnection): the CM queue
    held them all (with 4 entries, ``cm_full`` dropped five and the reconnection never
    happened), and every reply is the model's and the CM rules'."""
    mac, ip, host = _host(0)
    q = proto.LOCAL_QPN_BASE
    R = proto.CmReq
    frames = [cm_frame(d, mac=mac, ip=ip) for d in (
        dgram(req_type=R.OPEN_QP, rem_psn=ENGINE_PSN, **host),
        dgram(req_type=R.MODIFY_QP_RTS, rem_qpn=q, rem_psn=ENGINE_PSN, **host),
        dgram(req_type=R.OPEN_QP, ack_valid=1, **host),                 # a request with an ack
        dgram(req_type=6, **host),                                      # no such request
        dgram(req_type=R.MODIFY_QP_RTS, rem_qpn=q + 40, **host),        # no such QP
        dgram(req_type=R.OPEN_QP, tx_valid=1, **host),                  # two requests in one
        dgram(req_type=R.CLOSE_QP, rem_qpn=q, **host),
        dgram(req_type=R.MODIFY_QP_RTS, rem_qpn=q, rem_psn=5, **host),  # the QP is closed
        dgram(req_type=R.OPEN_QP, rem_psn=7, **host),                   # reconnection
        dgram(req_type=R.MODIFY_QP_RTS, rem_qpn=q, rem_psn=7, **host))]
    hw, model = _replay_both(frames, 512, 16, backend)
    _check_against_model(hw, model, frames)
    replies = [undgram(bytes(p[UDP].payload)) for p in _classify([f for _, f in hw.tx])["cm"]]
    A = proto.CmAck
    assert [r["ack_type"] for r in replies] == [A.ACK, A.ACK, A.ERROR, A.ERROR, A.NAK, A.ERROR,
                                                A.ACK, A.NAK, A.ACK, A.ACK]
    assert [r["loc_qpn"] for r in replies if r["ack_type"] == A.ACK] == [q] * 5
    row = hw.qp_table[0]
    assert row["state"] == proto.QPState.RTS and row["next_psn"] == 7
    assert (row["remote_qpn"], row["remote_ip"]) == (host["loc_qpn"], ip_int(ip))


@BACKENDS
def test_sixteen_hosts_connect_at_once_64(backend):
    """Sixteen hosts connect at once: their OPEN_QP and MODIFY_QP_RTS datagrams, 32 back to
    back at 64 bits, all held by the CM queue and served; each host gets its own QP in RTS."""
    frames = []
    for k in range(16):
        mac, ip, host = _host(k)
        frames.append(cm_frame(dgram(req_type=proto.CmReq.OPEN_QP, rem_psn=k, **host),
                               mac=mac, ip=ip))
    for k in range(16):
        mac, ip, host = _host(k)
        frames.append(cm_frame(dgram(req_type=proto.CmReq.MODIFY_QP_RTS,
                                     rem_qpn=proto.LOCAL_QPN_BASE + k, rem_psn=k, **host),
                               mac=mac, ip=ip))
    hw, model = _replay_both(frames, 64, 16, backend)
    _check_against_model(hw, model, frames)
    replies = [(p[IP].dst, undgram(bytes(p[UDP].payload)))
               for p in _classify([f for _, f in hw.tx])["cm"]]
    assert len(replies) == 32
    assert all(r["ack_type"] == proto.CmAck.ACK for _, r in replies)
    for k in range(16):
        _, ip, host = _host(k)
        row = hw.qp_table[k]
        assert row["state"] == proto.QPState.RTS and row["next_psn"] == k
        assert (row["remote_qpn"], row["remote_ip"]) == (host["loc_qpn"], ip_int(ip))


@BACKENDS
def test_sixteen_arp_requests_at_once_512(backend):
    """Sixteen ARP requests back to back at 512 bits (one beat each): the ARP queue holds them
    all (with 4 entries, five were dropped as ``arp_full``) and each host gets its reply."""
    hosts = [_host(k)[:2] for k in range(16)]
    frames = [bytes(Ether(src=mac, dst="ff:ff:ff:ff:ff:ff")
                    / ARP(op=1, hwsrc=mac, psrc=ip, pdst=ENGINE_IP)) for mac, ip in hosts]
    hw, model = _replay_both(frames, 512, 16, backend)
    _check_against_model(hw, model, frames)
    arps = _classify([f for _, f in hw.tx])["arp"]
    assert [(p[ARP].op, p[ARP].hwdst, p[ARP].pdst) for p in arps] == \
        [(2, mac, ip) for mac, ip in hosts]


def test_struct_to_dict():
    from amaranth.lib import data
    layout = data.StructLayout({"a": 3, "s": data.StructLayout({"x": 8, "y": 1}),
                                "arr": data.ArrayLayout(4, 3)})
    value = layout.const({"a": 5, "s": {"x": 0xA5, "y": 1}, "arr": [1, 15, 7]})
    assert rp.struct_to_dict(layout, value) == {"a": 5, "s": {"x": 0xA5, "y": 1},
                                                "arr": [1, 15, 7]}
    assert rp.struct_to_dict(layout, value.as_value().value) == rp.struct_to_dict(layout, value)
