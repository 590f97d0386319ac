# SPDX-License-Identifier: BSD-2-Clause
"""Throughput and latency of the TX engine in simulation, per bus width.

``python -m bench.throughput [--width W ...] [--json OUT]`` prints, for each width:

* latency: cycles from a WR being accepted to the first beat of its frame on the output, on
  an idle engine (64-byte WRITE_ONLY);
* bus utilisation (beats / cycles with the receiver ready, first to last beat) and goodput
  (payload bytes per cycle, and Gb/s at the width's clock: 156.25 MHz at 64 bits, 250 MHz at
  128/256 bits, 322 MHz at 512/1024 bits) for a stream of 64-byte WRITE_ONLY messages and for
  64 KiB WRITEs at PMTU 4096, with every input always valid and the output always ready;
* the longest frame in beats against ceil(frame bytes / bytes per beat).

Every frame is also compared with the golden model and every beat checked against the framing
rules of :mod:`roce_hw.lib.stream`; a mismatch or a framing error makes the exit status 1.
"""

import argparse
import json
import math
import sys
import time

from roce_hw import proto
from roce_hw.config import DATA_WIDTHS, EngineConfig
from sim.backend import BACKENDS, BackendUnavailable
from sim.traffic import CLOCK_MHZ   # re-exported: the clock assumed per width for Gb/s

__all__ = ["CLOCK_MHZ", "measure", "main"]


def _workload(kind, width):
    from sim.bfm import QPSetup, WorkItem
    qps = [QPSetup(index=0, remote_qpn=0x11, remote_mac=0x02_00_00_00_00_02,
                   remote_ip=0x0A000002, start_psn=0xFFFF00, pmtu=4096 if kind == "64k" else 1024)]
    if kind == "latency":
        return qps, [WorkItem(qp=0, opcode=proto.WrOpcode.RDMA_WRITE, payload=bytes(range(64)))]
    if kind == "64b":
        n = 256
        return qps, [WorkItem(qp=0, opcode=proto.WrOpcode.RDMA_WRITE,
                              payload=bytes((i + j) & 0xFF for j in range(64)),
                              remote_addr=0x1000 * i, r_key=7) for i in range(n)]
    if kind == "64k":
        n = 2 if width <= 128 else 4
        return qps, [WorkItem(qp=0, opcode=proto.WrOpcode.RDMA_WRITE,
                              payload=bytes((i * 7 + j) & 0xFF for j in range(65536)),
                              remote_addr=0x10000 * i, r_key=7) for i in range(n)]
    raise ValueError(kind)


def measure(width, kind, backend="amaranth"):
    """Simulate one workload on ``backend``; returns a dict of figures."""
    from sim.traffic import count_mismatches, expected_frames, run_traffic
    config = EngineConfig(data_width=width, n_qp=16)
    qps, wrs = _workload(kind, width)
    t0 = time.monotonic()
    res = run_traffic(config, qps, wrs, backend=backend)
    wall = time.monotonic() - t0
    expect = expected_frames(config, qps, wrs)
    got = res.good_frames
    mismatches = count_mismatches(got, expect)
    nbytes = width // 8
    over = max((beats - math.ceil(len(fr) / nbytes) for _, _, fr, _, beats in res.frames),
               default=0)
    payload = sum(len(w.payload) for w in wrs)
    # Goodput over the steady state: from the first to the last beat on the bus.
    goodput = payload / res.span_cycles if res.span_cycles else 0.0
    out = {
        "width": width, "workload": kind, "messages": len(wrs), "frames": len(got),
        "latency_cycles": res.latency,
        "utilisation": res.utilisation, "goodput_bytes_per_cycle": goodput,
        "goodput_gbps": goodput * 8 * CLOCK_MHZ[width] / 1000,
        "extra_beats": over, "model_mismatches": mismatches,
        "framing_errors": len(res.framing_errors), "sim_seconds": wall, "backend": backend,
    }
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, action="append",
                    help=f"width(s) to measure (default all: {', '.join(map(str, DATA_WIDTHS))})")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--backend", choices=BACKENDS, default="amaranth",
                    help="simulator (sim.backend); the figures are the same on both")
    args = ap.parse_args(argv)
    widths = args.width or list(DATA_WIDTHS)
    for w in widths:
        if w not in DATA_WIDTHS:
            print(f"error: width {w} is not one of {', '.join(map(str, DATA_WIDTHS))}", file=sys.stderr)
            return 2
    rows = []
    bad = 0
    print(f"{'width':>5} {'latency':>8} {'64B util':>9} {'64B B/cyc':>9} {'64B Gb/s':>9} "
          f"{'64K util':>9} {'64K B/cyc':>9} {'64K Gb/s':>9} {'clock':>7} {'extra beats':>11}")
    for w in widths:
        print(f"  simulating {w}-bit ...", file=sys.stderr, flush=True)
        try:
            lat = measure(w, "latency", args.backend)
            small = measure(w, "64b", args.backend)
            big = measure(w, "64k", args.backend)
        except BackendUnavailable as e:
            print(f"error: --backend {args.backend}: {e}", file=sys.stderr)
            return 2
        bad += sum(r["model_mismatches"] + r["framing_errors"] for r in (lat, small, big))
        rows += [lat, small, big]
        print(f"{w:>5} {str(lat['latency_cycles']):>8} {small['utilisation']:>9.4f} "
              f"{small['goodput_bytes_per_cycle']:>9.2f} {small['goodput_gbps']:>9.1f} "
              f"{big['utilisation']:>9.4f} {big['goodput_bytes_per_cycle']:>9.2f} "
              f"{big['goodput_gbps']:>9.1f} {CLOCK_MHZ[w]:>7} "
              f"{max(small['extra_beats'], big['extra_beats']):>11}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    if bad:
        print(f"{bad} frames differ from the golden model or break the stream framing",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
