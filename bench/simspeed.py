# SPDX-License-Identifier: BSD-2-Clause
"""Simulation speed of the TX engine in Amaranth's simulator: simulated cycles per wall second.

``python -m bench.simspeed [--width 64 512] [--cycles N] [--json OUT]``

Every closed-loop test and tool (``sim.traffic``, the co-simulation's Amaranth replay, the
coming ACK/retransmission loops) runs at this speed, so it is a benchmark of its own. For each
width the engine (16 QPs) is set up with one QP, then kept busy for ``--cycles`` cycles: WRs
of 1500-byte RDMA WRITEs posted back to back, the payload always valid, the output always
ready. Reported: elaboration + simulator set-up time, the cycles simulated, the wall time
of the run and cycles per second (the figure to compare), and beats per second on the output.
Figures, not a test: they depend on the machine and its load.
"""

import argparse
import json
import sys
import time

__all__ = ["measure", "main"]


def measure(width, cycles=4000, payload=1500):
    """Simulate the engine at ``width`` bits for ``cycles`` busy cycles; returns a dict."""
    from amaranth.sim import Simulator

    from roce_hw.config import EngineConfig
    from roce_hw.engine import TxEngine
    from sim.stream import beats_of
    from sim.bfm import QPSetup, set_up
    from sim.traffic import DEFAULT_LOCAL_IP, DEFAULT_LOCAL_MAC

    t0 = time.monotonic()
    dut = TxEngine(EngineConfig(data_width=width, n_qp=16))
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    body = bytes(range(256)) * (payload // 256) + bytes(payload % 256)
    beats = beats_of(body, width)
    state = {"beats_out": 0, "setup": 0}

    async def driver(ctx):
        await set_up(ctx, dut, local_mac=DEFAULT_LOCAL_MAC, local_ip=DEFAULT_LOCAL_IP,
                     qps=[QPSetup(0, remote_qpn=17, remote_mac=0x020000000002,
                                  remote_ip=0x0A000002)])
        state["setup"] = 1
        ctx.set(dut.wr.payload, {"wr_id": 1, "opcode": 0, "qp": 0, "remote_addr": 0x1000,
                                 "r_key": 5, "length": payload})
        ctx.set(dut.wr.valid, 1)                     # WRs always offered (one per message)

    async def payload_src(ctx):
        k = 0
        ctx.set(dut.i.payload, beats[0])
        ctx.set(dut.i.valid, 1)
        async for _, _, ready in ctx.tick().sample(dut.i.ready):
            if ready:                                # a beat was transferred at this edge
                k = (k + 1) % len(beats)
                ctx.set(dut.i.payload, beats[k])

    async def sink(ctx):
        ctx.set(dut.o.ready, 1)
        ctx.set(dut.status.ready, 1)
        async for _, _, valid in ctx.tick().sample(dut.o.valid):
            state["beats_out"] += int(valid)

    sim.add_testbench(driver, background=True)
    sim.add_testbench(payload_src, background=True)
    sim.add_testbench(sink, background=True)
    sim.run_until(1e-8 * 32)                         # first cycles: compile and QP set-up
    t1 = time.monotonic()
    start_beats = state["beats_out"]
    sim.run_until(1e-8 * (32 + cycles))
    t2 = time.monotonic()
    run = t2 - t1
    return {"width": width, "setup_s": round(t1 - t0, 2), "cycles": cycles,
            "run_s": round(run, 2), "cycles_per_s": round(cycles / run),
            "beats_out": state["beats_out"] - start_beats,
            "utilisation": round((state["beats_out"] - start_beats) / cycles, 3)}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.simspeed",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--width", type=int, nargs="+", default=[64, 512],
                    help="bus widths in bits")
    ap.add_argument("--cycles", type=int, default=4000, help="busy cycles simulated per width")
    ap.add_argument("--json", default=None, help="also write the figures here as JSON")
    args = ap.parse_args(argv)
    from roce_hw.config import check_data_width
    try:
        for w in args.width:
            check_data_width(w)
        if args.cycles < 1:
            raise ValueError("--cycles must be at least 1")
    except (ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = []
    print(f"{'W':>5} {'set-up s':>9} {'cycles':>8} {'run s':>7} {'cycles/s':>9} "
          f"{'output busy':>11}")
    for w in args.width:
        r = measure(w, args.cycles)
        rows.append(r)
        print(f"{r['width']:>5} {r['setup_s']:>9.2f} {r['cycles']:>8} {r['run_s']:>7.2f} "
              f"{r['cycles_per_s']:>9,} {r['utilisation']:>10.1%}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
