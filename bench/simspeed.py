# SPDX-License-Identifier: BSD-2-Clause
"""Simulation speed of the whole engine on each back end: simulated cycles per wall second.

``python -m bench.simspeed [--backend amaranth verilator] [--width 64 512] [--cycles N]
[--amaranth-cycles N] [--json OUT]``

Every closed-loop test and tool runs at this speed, so it is a benchmark of its own. For each
width, the whole engine (``roce_engine``, 16 QPs, four of them set up) on each back end
(:mod:`sim.backend`), side by side in one run:

* **open**: the engine kept busy: 1500-byte RDMA WRITEs posted back to back on the four QPs,
  the payload always valid, the output always ready; cycles per second of the run proper
  (elaboration, compilation and QP set-up excluded);
* **closed**: a closed loop through the responder model (:func:`sim.traffic.run_closed_loop`:
  every frame to :class:`sim.peer.ResponderModel`, its ACKs back into the engine's RX port, in
  slices of 256 cycles), random WRITE/SEND mixes up to 3,000 bytes on four QPs;
* **bare** (Verilator only): the same model driven by a plain C++ loop with no bus-functional
  models (``rh_bare_busy``: a WR always offered, payload always valid, output always ready), and
  the harness overhead: bare cycles/s over the harness's open cycles/s.

The ratios (Verilator over Amaranth, from the same run) are the figures to compare: the
machine is shared, so absolute cycles/s move with its load. Issue 34's targets: at least 100x at
512 bits and 50x at 64 bits (open), harness overhead at most 2x, closed loop at least 30x at 512.
"""

import argparse
import json
import sys
import time

__all__ = ["measure_open", "measure_closed", "measure_bare", "main"]

LOCAL_MAC, LOCAL_IP = 0x02_00_00_00_00_01, 0x0A_00_00_01


def _qps():
    from sim.bfm import QPSetup
    return [QPSetup(k, remote_qpn=17 + k, remote_mac=0x02_00_00_00_00_02 + k,
                    remote_ip=0x0A_00_00_02 + k, pmtu=1024) for k in range(4)]


def measure_open(width, backend, cycles, payload=1500):
    """Cycles per second with the engine busy on ``payload``-byte WRITEs; a ``dict``."""
    from roce_hw import proto
    from roce_hw.config import EngineConfig
    from sim.backend import open_engine
    from sim.bfm import WorkItem

    t0 = time.monotonic()
    eng = open_engine(EngineConfig(data_width=width, n_qp=16), backend=backend,
                      log=lambda text: print(f"  {text}", file=sys.stderr, flush=True))
    eng.set_addr(LOCAL_MAC, LOCAL_IP)
    for q in _qps():
        eng.write_qp(q)
    eng.run(200)                                     # set-up (and the simulator's start)
    body = bytes(range(256)) * (payload // 256) + bytes(payload % 256)
    n_msgs = cycles // max(1, payload * 8 // width) + 8          # never runs dry
    for n in range(n_msgs):
        eng.post(WorkItem(qp=n % 4, opcode=proto.WrOpcode.RDMA_WRITE, payload=body,
                          remote_addr=0x1000, r_key=5, wr_id=n + 1))
    beats0 = eng.count("tx_beats_total")
    t1 = time.monotonic()
    eng.run(cycles)
    run = time.monotonic() - t1
    beats = eng.count("tx_beats_total") - beats0
    eng.close()
    return {"width": width, "backend": backend, "load": "open", "setup_s": round(t1 - t0, 2),
            "cycles": cycles, "run_s": round(run, 3), "cycles_per_s": round(cycles / run),
            "output_busy": round(beats / cycles, 3)}


def measure_closed(width, backend, messages, seed=1):
    """Cycles per second of the closed loop through the responder model; a ``dict``."""
    from roce_hw.config import EngineConfig
    from sim.traffic import random_workload, run_closed_loop

    qps, wrs = random_workload(n_qps=4, messages=messages,
                               ops=["write", "write_imm", "send", "send_imm"], min_size=0,
                               max_size=3000, pmtu=1024, seed=seed)
    res = run_closed_loop(EngineConfig(data_width=width, n_qp=16), qps, wrs, seed=seed,
                          backend=backend)
    ok = len(res.completions) == len(wrs) and not res.violations
    return {"width": width, "backend": backend, "load": "closed", "messages": messages,
            "cycles": res.cycles, "run_s": round(res.sim_seconds, 3),
            "cycles_per_s": round(res.cycles / res.sim_seconds), "replies": res.replies,
            "delivered": ok}


def measure_bare(width, cycles, payload=1500):
    """The plain C++ loop over the same Verilated model; a ``dict``."""
    from roce_hw.config import EngineConfig
    from sim.verilator import VerilatorEngine

    eng = VerilatorEngine(EngineConfig(data_width=width, n_qp=16))
    eng.set_addr(LOCAL_MAC, LOCAL_IP)
    eng.write_qp(_qps()[0])
    eng.run(200)
    t0 = time.monotonic()
    beats = eng.bare_busy(cycles, payload, 0)
    run = time.monotonic() - t0
    eng.close()
    return {"width": width, "backend": "verilator", "load": "bare", "cycles": cycles,
            "run_s": round(run, 3), "cycles_per_s": round(cycles / run),
            "output_busy": round(beats / cycles, 3)}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.simspeed",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--backend", nargs="+", default=["amaranth", "verilator"],
                    choices=["amaranth", "verilator"], help="back ends to measure")
    ap.add_argument("--width", type=int, nargs="+", default=[64, 512], help="bus widths in bits")
    ap.add_argument("--cycles", type=int, default=300_000,
                    help="busy cycles simulated per width on the Verilator back end")
    ap.add_argument("--amaranth-cycles", type=int, default=3000,
                    help="busy cycles simulated per width on the Amaranth back end")
    ap.add_argument("--closed-messages", type=int, nargs=2, default=[8, 600],
                    metavar=("AMARANTH", "VERILATOR"),
                    help="messages of the closed loop on each back end")
    ap.add_argument("--json", default=None, help="also write the figures here as JSON")
    args = ap.parse_args(argv)
    from roce_hw.config import check_data_width
    from sim.backend import BackendUnavailable
    try:
        for w in args.width:
            check_data_width(w)
        if args.cycles < 1 or args.amaranth_cycles < 1:
            raise ValueError("--cycles and --amaranth-cycles must be at least 1")
    except (ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    backends = list(dict.fromkeys(args.backend))
    rows = []
    print(f"{'W':>5} {'back end':>9} {'open c/s':>10} {'busy':>6} {'closed c/s':>11} "
          f"{'bare C++ c/s':>13} {'overhead':>9} {'open ratio':>11} {'closed ratio':>13}")
    for w in args.width:
        got = {}
        try:
            for b in backends:
                print(f"  {w} bits, {b} ...", file=sys.stderr, flush=True)
                op = measure_open(w, b, args.cycles if b == "verilator" else
                                  args.amaranth_cycles)
                cl = measure_closed(w, b, args.closed_messages[b == "verilator"])
                bare = measure_bare(w, args.cycles) if b == "verilator" else None
                got[b] = (op, cl, bare)
                rows += [r for r in (op, cl, bare) if r]
        except BackendUnavailable as e:
            print(f"error: --backend verilator: {e}", file=sys.stderr)
            return 2
        for b, (op, cl, bare) in got.items():
            ratio = closed_ratio = overhead = ""
            if b == "verilator" and "amaranth" in got:
                ratio = f"{op['cycles_per_s'] / got['amaranth'][0]['cycles_per_s']:.0f}x"
                closed_ratio = f"{cl['cycles_per_s'] / got['amaranth'][1]['cycles_per_s']:.0f}x"
            if bare:
                overhead = f"{bare['cycles_per_s'] / op['cycles_per_s']:.2f}x"
            print(f"{w:>5} {b:>9} {op['cycles_per_s']:>10,} {op['output_busy']:>6.1%} "
                  f"{cl['cycles_per_s']:>11,} "
                  f"{format(bare['cycles_per_s'], ',') if bare else '':>13} {overhead:>9} "
                  f"{ratio:>11} {closed_ratio:>13}", flush=True)
            if not cl["delivered"]:
                print(f"warning: the {b} closed loop at {w} bits did not deliver every message",
                      file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
