# SPDX-License-Identifier: BSD-2-Clause
"""Check the Verilator back end against the models: ``python -m sim.verilator [--width 64 512]
[--messages 40] [--seed S] [--stall P] [--equiv]``.

For each width: build (or reuse) the library, set up QPs through the management port, post
RDMA WRITEs of chosen sizes and a seeded random mix of WRITE/WRITE_IMM/SEND/SEND_IMM
(:func:`sim.traffic.random_workload`), and check every transmitted frame against the golden
model (:func:`sim.traffic.requester_model`), every status report (refused WRs: a QP not set up,
a length mismatch) and the frame and refusal counters; then received frames (ARP, other
traffic) against :class:`roce_hw.model.engine.EngineModel`. Exit 1 on a mismatch. ``--equiv``
also runs a seeded stimulus (:mod:`sim.equiv`) through both back ends (whole engine and TX top)
and compares every output, cycles included. Speed: :mod:`bench.simspeed`.
"""

import argparse
import sys
import time

from roce_hw import proto
from roce_hw.config import EngineConfig
from sim.bfm import QPSetup, WorkItem
from sim.traffic import (DEFAULT_LOCAL_IP, DEFAULT_LOCAL_MAC, count_mismatches,
                         random_workload, requester_model)

SIZES = [1, 7, 8, 9, 64, 100, 1023, 1024, 1025, 2048, 3000, 4109, 0]


def check(width, *, messages=40, seed=1, stall=0.0, n_qp=16, log=print):
    """Directed WRITEs and a random mix at ``width``; returns the number of mismatches."""
    from sim.verilator import VerilatorEngine

    config = EngineConfig(data_width=width, n_qp=n_qp)
    qps, wrs = random_workload(n_qps=4, messages=messages,
                               ops=["write", "write_imm", "send", "send_imm"], min_size=0,
                               max_size=5000, pmtu=1024, seed=seed)
    qps.append(QPSetup(4, remote_qpn=0x123, remote_mac=0x02_00_00_00_00_02,
                       remote_ip=0x0A_00_00_02, start_psn=0xFFFFF0, pmtu=1024))
    directed = [WorkItem(qp=4, opcode=proto.WrOpcode.RDMA_WRITE,
                         payload=bytes((n * 7 + k) & 0xFF for k in range(size)),
                         remote_addr=0x1000 * n, r_key=0x55, wr_id=1000 + n)
                for n, size in enumerate(SIZES)]
    refused = [WorkItem(qp=9, opcode=proto.WrOpcode.RDMA_WRITE, payload=bytes(100), wr_id=2000),
               WorkItem(qp=4, opcode=proto.WrOpcode.RDMA_WRITE, payload=bytes(300), length=301,
                        wr_id=2001)]
    wrs = directed + refused + wrs
    eng = VerilatorEngine(config, seed=seed, log=log)
    eng.set_random(wr=stall, payload=stall, tx=stall, status=stall)
    eng.set_addr(DEFAULT_LOCAL_MAC, DEFAULT_LOCAL_IP)
    for q in qps:
        eng.write_qp(q)
    for w in wrs:
        eng.post(w)
    t0 = time.monotonic()
    cycles = eng.run(2_000_000, quiet=200)
    wall = time.monotonic() - t0
    tx = eng.pop_tx()
    got = [f[2] for f in tx if not f[3]]
    aborted = sum(1 for f in tx if f[3])
    model = requester_model(config, qps, wrs, local_mac=DEFAULT_LOCAL_MAC,
                            local_ip=DEFAULT_LOCAL_IP)
    expect = model.frames
    bad = count_mismatches(got, expect)
    statuses = [{k: s[k] for k in ("wr_id", "qp", "status")} for s in eng.pop_status()]
    want_status = [{k: int(s[k]) for k in ("wr_id", "qp", "status")} for s in model.statuses]
    bad_status = statuses != want_status
    rsps = eng.pop_mgmt_rsp()
    counters = eng.counters()
    log(f"  {width:>4} bits: {len(wrs)} WRs, {len(got)} frames ({len(expect)} expected), "
        f"{bad} mismatches, {len(statuses)} status reports "
        f"({'as' if not bad_status else 'NOT as'} the model's {len(want_status)}), "
        f"{aborted} aborted (model {model.aborted}), {len(rsps)} mgmt responses, counters "
        f"tx_frames={counters['tx_frames']} aborted={counters['tx_frames_aborted']} "
        f"tx_wrs_refused={counters['tx_wrs_refused']}; "
        f"{cycles} cycles in {wall:.3f} s")
    errors = bad + bad_status
    errors += aborted != model.aborted
    errors += counters["tx_frames"] != len(tx)                # aborted ones included
    errors += counters["tx_frames_aborted"] != aborted
    errors += counters["tx_wrs_refused"] != len(want_status)
    errors += len(rsps) != len(qps)
    errors += check_rx(eng, log=log)
    eng.close()
    return errors


def _arp_request(target_ip, sender_mac=0x02_00_00_00_00_02, sender_ip=0x0A_00_00_02):
    eth = proto.ETH.pack({"dst": (1 << 48) - 1, "src": sender_mac,
                          "ethertype": proto.ETHERTYPE_ARP})
    arp = proto.ARP.pack({"oper": proto.ArpOper.REQUEST, "sha": sender_mac, "spa": sender_ip,
                          "tha": 0, "tpa": target_ip})
    return eth + arp + bytes(18)


def check_rx(eng, *, log=print):
    """Received frames on an idle engine: an ARP request for the engine's IP (-> ARP reply), one
    for another IP and a frame of another EtherType (-> rx_other), each given an earliest
    cycle; outputs and RX counters against :class:`roce_hw.model.engine.EngineModel`."""
    from roce_hw.model.engine import EngineModel

    cfg = eng.config
    model = EngineModel(cfg.n_qp, local_mac=DEFAULT_LOCAL_MAC, local_ip=DEFAULT_LOCAL_IP,
                        cm_pmtu=cfg.cm_pmtu, ttl=cfg.ttl)
    before = eng.counters()
    other = proto.ETH.pack({"dst": DEFAULT_LOCAL_MAC, "src": 0x02_00_00_00_00_02,
                            "ethertype": 0x88B5}) + bytes(range(77))
    start = eng.cycle
    frames = [(_arp_request(DEFAULT_LOCAL_IP), start + 50), (_arp_request(0x0A_00_00_63), 0),
              (other, start + 500)]
    want_tx, want_other = [], []
    for f, at in frames:
        eng.push_rx(f, cycle=at)
        t, o = model.receive(f)
        want_tx += t
        want_other += o
    eng.run(20_000, quiet=300)
    tx, oth = eng.pop_tx(), eng.pop_rx_other()
    after = eng.counters()
    delta = {k: after[f"rx_{k}"] - before[f"rx_{k}"] for k in model.counters["rx"]
             if f"rx_{k}" in after}
    want_delta = {k: v for k, v in model.counters["rx"].items() if k in delta}
    errors = ([f[2] for f in tx] != want_tx) + ([f[2] for f in oth] != want_other)
    errors += delta != want_delta
    errors += not (tx and tx[0][0] > start + 50 and oth and oth[-1][0] > start + 500)
    log(f"        rx: {len(tx)} tx frames (model {len(want_tx)}), {len(oth)} rx_other "
        f"(model {len(want_other)}), rx counters {'as' if delta == want_delta else 'NOT as'} "
        f"the model's; first reply beat at +{tx[0][0] - start if tx else '-'} cycles, "
        f"other frame at +{oth[-1][0] - start if oth else '-'}")
    return errors


def equivalence(width, *, seed=1, top="engine", stall=0.2, messages=24, n_qp=16, log=print):
    """One seeded stimulus (:mod:`sim.equiv`: WR mixes, refusals, length mismatches, resumes,
    received frames, management, random idle/stall) through both back ends; returns the number
    of differences in their outputs (frames, status reports, responses, counters, cycles)."""
    from sim.backend import open_engine
    from sim.equiv import compare, drive, stimulus

    config = EngineConfig(data_width=width, n_qp=n_qp)
    stim = stimulus(config, seed, top=top, stall=stall, messages=messages)
    out = {}
    for backend in ("verilator", "amaranth"):
        eng = open_engine(config, backend=backend, top=top, seed=seed, log=log)
        t0 = time.monotonic()
        out[backend] = drive(eng, stim)
        wall = time.monotonic() - t0
        eng.close()
        log(f"  {width:>4} bits {top:>6} {backend:>9}: {out[backend]['cycle']} cycles in "
            f"{wall:.2f} s, {len(out[backend]['tx'])} tx frames")
    diffs = compare(out["verilator"], out["amaranth"])
    for d in diffs:
        log(f"    {d}")
    log(f"  {width:>4} bits {top:>6}: {'identical' if not diffs else f'{len(diffs)} differences'}")
    return len(diffs)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m sim.verilator",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, nargs="+", default=[64, 512])
    ap.add_argument("--messages", type=int, default=40, help="random WRs besides the directed ones")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stall", type=float, default=0.0,
                    help="probability of idle/stall on every stream in the check")
    ap.add_argument("--equiv", action="store_true",
                    help="also run a short stimulus through the Amaranth simulator and compare "
                         "frames and cycles")
    args = ap.parse_args(argv)
    from sim.verilator import VerilatorMissing
    errors = 0
    try:
        for w in args.width:
            t0 = time.monotonic()
            errors += check(w, messages=args.messages, seed=args.seed, stall=args.stall)
            print(f"  (build/load + check {time.monotonic() - t0:.1f} s)")
        if args.equiv:
            for w in args.width:
                for top in ("engine", "tx"):
                    errors += equivalence(w, seed=args.seed, top=top)
    except VerilatorMissing as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("OK" if not errors else f"FAIL: {errors} errors")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
