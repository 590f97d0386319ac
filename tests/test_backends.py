# SPDX-License-Identifier: BSD-2-Clause
"""The two simulation back ends of sim.backend give the same results, cycle for cycle.

One seeded stimulus (sim.equiv: random WR mixes on four QPs, refused WRs, length mismatches,
resumes, an IP ID load, received ARP/CM/ping/bad-FCS frames at given cycles, a QP table read,
random idle/stall on every stream, runs in slices) goes through Amaranth's simulator and through
the Verilog compiled by Verilator; every output must be identical: frames (bytes, tuser, the
cycles of their first and last beats), status reports, management responses, WR accept cycles,
counter snapshots and final counters. This also proves the emitted Verilog equals the Amaranth
design under Verilator. 64 and 512 bits in the default suite (whole engine); every width, the
TX top and other QP counts with --slow.
"""

import subprocess
import sys

import pytest

from roce_hw.config import EngineConfig
from sim.backend import Splitmix64, open_engine
from sim.equiv import compare, drive, stimulus

from conftest import ROOT

__all__ = []


def test_splitmix64_is_the_published_generator():
    """The idle/stall generator is splitmix64 (Steele, Lea, Flood 2014; Vigna's reference
    splitmix64.c): these are the first outputs of its reference code for seed 1234567."""
    r = Splitmix64(0, 0)
    r.state = 1234567
    assert [r.next() for _ in range(5)] == [
        6457827717110365317, 3203168211198807973, 9817491932198370423, 4593380528125082431,
        16408922859458223821]


def test_draw_probability():
    r = Splitmix64(7, 3)
    r.threshold = int(0.25 * (1 << 32))
    n = sum(r.draw() for _ in range(20000))
    assert 4600 < n < 5400


def _equivalent(width, top, seed, *, n_qp=16, messages=16):
    config = EngineConfig(data_width=width, n_qp=n_qp)
    stim = stimulus(config, seed, top=top, messages=messages)
    out = {b: drive(open_engine(config, backend=b, top=top, seed=seed), stim)
           for b in ("verilator", "amaranth")}
    diffs = compare(out["verilator"], out["amaranth"])
    assert not diffs, "\n".join(diffs)
    got = out["verilator"]
    # the stimulus did what it is for: frames, aborts, refusals, resumes, replies; and the
    # engine went quiet on its own (no WR left waiting for payload until the cycle limit)
    assert got["cycle"] < 50_000, got["cycle"]
    assert len(got["tx"]) > messages // 2
    assert any(f.tuser for f in got["tx"]), "no length mismatch aborted a frame"
    assert got["status"], "no WR was refused"
    assert got["mgmt"] and got["snapshots"] and got["accepts"]
    if top == "engine":
        assert got["other"], "nothing on rx_other"
        assert got["counters"]["rx_arp"] and got["counters"]["cm_bad_checksum"]
    return got


@pytest.mark.tools("verilator")
@pytest.mark.parametrize("width", [64, 512])
def test_same_outputs_same_cycles(width):
    _equivalent(width, "engine", seed=width + 1)


@pytest.mark.slow
@pytest.mark.tools("verilator")
@pytest.mark.parametrize("top", ["engine", "tx"])
@pytest.mark.parametrize("width", [64, 128, 256, 512, 1024])
def test_same_outputs_every_width(width, top):
    _equivalent(width, top, seed=3 * width + len(top), messages=24)


@pytest.mark.slow
@pytest.mark.tools("verilator")
@pytest.mark.parametrize("n_qp", [4, 64])
def test_same_outputs_other_qp_counts(n_qp):
    _equivalent(64, "engine", seed=n_qp, n_qp=n_qp)


def _loaded(config, stim, seed):
    """A Verilator engine with ``stim``'s QPs, WRs and received frames queued (no resumes)."""
    eng = open_engine(config, backend="verilator", seed=seed)
    eng.set_addr(0x02_00_00_00_00_01, 0x0A_00_00_01)
    if stim["probs"]:
        eng.set_random(**stim["probs"])
    for q in stim["qps"]:
        eng.write_qp(q)
    for item in stim["items"]:
        if item[0] == "wr":
            eng.post(item[1])
    for frame, at, tuser in stim["rx"]:
        eng.push_rx(frame, cycle=at, tuser=tuser)
    return eng


@pytest.mark.tools("verilator")
def test_slices_change_nothing():
    """A run in one go and the same run in many slices of random lengths give the same outputs,
    cycles included (the closed loops depend on it; the quiet count goes on across calls)."""
    import random

    config = EngineConfig(data_width=64, n_qp=16)
    stim = stimulus(config, 11, messages=12)
    outs = []
    for sliced in (False, True):
        eng = _loaded(config, stim, 11)
        rng = random.Random(5)
        tx = []
        if sliced:
            while eng.run(rng.choice([1, 2, 3, 50, 299]), quiet=300):
                tx += eng.pop_tx()
        else:
            eng.run(10**6, quiet=300)
        tx += eng.pop_tx()
        outs.append((tx, eng.pop_status(), eng.pop_rx_other(), eng.counters()))
    assert outs[0] == outs[1]
    assert len(outs[0][0]) > 6


@pytest.mark.tools("verilator")
def test_qp_table_and_counter_snapshots():
    from sim.bfm import QPSetup, qp_context
    eng = open_engine(EngineConfig(data_width=64, n_qp=16), backend="verilator")
    q = QPSetup(5, remote_qpn=0x1234, remote_mac=0x02_00_00_00_00_09, remote_ip=0x0A00_0009,
                start_psn=0xABCDE, pmtu=512)
    eng.write_qp(q)
    eng.snapshot_every(10)
    table = eng.qp_table()
    assert [r["qp"] for r in table[1:]] == list(range(16))
    row = table[1 + 5]["ctx"]
    for name, value in qp_context(q).items():
        assert row[name] == value, name
    snaps = eng.pop_counters()
    assert snaps and all(s["cycle"] % 10 == 0 for s in snaps)
    assert eng.counters()["cycle"] == eng.cycle


def test_bad_probability_and_stream_are_refused():
    eng = open_engine(EngineConfig(data_width=64, n_qp=16), backend="amaranth", top="tx")
    with pytest.raises(ValueError, match="probability"):
        eng.set_random(tx=1.0)
    with pytest.raises(ValueError, match="streams: wr, payload"):
        eng.set_random(txx=0.1)
    with pytest.raises(ValueError, match="no receive port"):
        eng.push_rx(b"x" * 60)
    with pytest.raises(ValueError, match="backend must be one of amaranth, verilator"):
        open_engine(EngineConfig(data_width=64, n_qp=16), backend="iverilog")


def _without_verilator(tmp_path):
    """A PATH with python but no verilator."""
    import os
    import shutil
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("g++", "make"):
        if shutil.which(tool):
            (bindir / tool).symlink_to(shutil.which(tool))
    return dict(os.environ, PATH=f"{bindir}:{os.path.dirname(sys.executable)}")


@pytest.mark.parametrize("tool", ["sim.traffic", "bench.throughput", "bench.simspeed"])
def test_missing_verilator_exits_2(tmp_path, tool):
    args = {"sim.traffic": ["--messages", "1", "--width", "64"],
            "bench.throughput": ["--width", "64"], "bench.simspeed": ["--width", "64"]}[tool]
    res = subprocess.run([sys.executable, "-m", tool, "--backend", "verilator", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=_without_verilator(tmp_path))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "error:" in res.stderr and "apt-get install verilator" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.tools("verilator")
def test_replies_sorted_by_kind():
    """ARP and CM replies come out of m_axis_tx between data frames; pop_tx_by_kind sorts
    them (CM/ARP reply queues of the harness)."""
    config = EngineConfig(data_width=64, n_qp=16)
    stim = stimulus(config, 21, messages=6, stall=0.0)
    eng = _loaded(config, stim, 21)
    eng.run(100_000, quiet=300)
    kinds = eng.pop_tx_by_kind()
    assert len(kinds["arp"]) == 1                 # one good ARP request for the engine
    assert len(kinds["cm"]) == 2                  # OPEN and MODIFY (the corrupted one: none)
    assert all(f.data[12:14] == b"\x08\x00" for f in kinds["data"] + kinds["cm"])
    assert eng.pop_tx() == []
