# SPDX-License-Identifier: BSD-2-Clause
"""Goodput of reliable delivery under random loss against the go-back-N bound (issue 35 Targets).

``python -m bench.goodput [--requester model] [--width W ...] [--qps N ...] [--loss P ...]``
runs long RDMA WRITEs through :func:`sim.reliable_loop.run_reliable_loop` (the requester, a
lossy network with loss ``p`` in both directions, the rxe-like responder) and prints, per
configuration:

* goodput: payload bytes delivered per cycle, and as a fraction ``eff`` of the lossless line
  rate of full packets (``pmtu / (packet cycles * bytes per beat)``: headers and the iCRC are
  not goodput, and no scheme can beat that);
* the go-back-N bound ``eta = min(1, W/N) (1-p) / (1 + p K + p q T)`` for the same loss, window,
  round trip and timeout (PROTOCOL.md §5.10a; ``N`` = round trip in packet times, ``W`` = window
  in packets (buffer / PMTU), ``K = min(W, N)`` packets in flight, ``q = 2p`` the share of losses
  only the timer repairs, ``T`` = timeout in packet times) and ``eff / eta``;
* retransmitted packets, timeouts and NAKs.

``--requester model`` is :class:`roce_hw.model.reliable.ReliableRequester`; ``--requester hw``
the whole engine (:class:`sim.reliable_loop.HardwareRequester`, ``--backend verilator`` by
default, the library of the width and ``max(16, QPs)`` QPs built on first use). The hardware
does not retransmit and makes no completions yet (docs/reliability.md): its goodput is measured
to the responder's last message (``basis`` ``delivery``; the model's to its last completion,
``completions``; ``delivery_goodput_bytes_per_cycle`` is on the delivery basis for both), and
under loss it loses messages: those rows say ``ok`` NO and the run exits 1.
"""

import argparse
import json
import math
import sys
import time

from roce_hw import proto
from roce_hw.model.reliable import ack_timeout_cycles
from sim.backend import BackendUnavailable
from sim.bfm import QPSetup, WorkItem
from sim.reliable_loop import CLOCK_HZ, run_reliable_loop

__all__ = ["REQUESTERS", "gbn_bound", "workload", "measure", "main"]

REQUESTERS = ("model", "hw")

#: Frame bytes around a WRITE MIDDLE payload: Ethernet, IPv4, UDP, BTH, iCRC.
_OVERHEAD = (proto.ETH.size + proto.IPV4.size + proto.UDP.size + proto.BTH.size
             + proto.ICRC_BYTES)
#: An ACK frame: the same with an AETH and no payload.
_ACK_BYTES = _OVERHEAD + proto.AETH.size


def gbn_bound(p, *, window, round_trip, timeout, in_flight=None, q=None):
    """``eta = min(1, W/N) (1-p) / (1 + p K + p q T)``: ``window`` W and ``in_flight`` K
    (default ``min(W, N)``) in packets, ``round_trip`` N and ``timeout`` T in packet times,
    ``q`` default ``2 p``."""
    if not 0 <= p < 1:
        raise ValueError(f"loss {p} is not in [0, 1)")
    k = min(window, round_trip) if in_flight is None else in_flight
    q = 2 * p if q is None else q
    return min(1.0, window / round_trip) * (1 - p) / (1 + p * k + p * q * timeout)


def workload(n_qps, total_bytes, message_bytes, pmtu):
    """``n_qps`` QPs sharing ``total_bytes`` of WRITEs of ``message_bytes`` each."""
    qps = [QPSetup(index=i, remote_qpn=0x11 + i, remote_mac=0x02_00_00_00_10_00 | i,
                   remote_ip=0x0A_00_01_01 + i, udp_sport=0xC000 | i, start_psn=0xFFF000 * i
                   & proto.PSN_MASK, pmtu=pmtu) for i in range(n_qps)]
    n = max(n_qps, total_bytes // message_bytes)
    body = bytes(range(256)) * (message_bytes // 256) + bytes(message_bytes % 256)
    wrs = [WorkItem(qp=k % n_qps, opcode=proto.WrOpcode.RDMA_WRITE, payload=body,
                    remote_addr=0x1000_0000 + k * message_bytes, r_key=0x100 + k, wr_id=k + 1)
           for k in range(n)]
    return qps, wrs


def measure(width, n_qps, loss, *, requester="model", total_bytes=4 << 20,
            message_bytes=64 << 10, pmtu=4096, buffer_bytes=128 << 10, delay=500, timeout=4,
            seed=1, backend="verilator"):
    """One configuration; returns a dict of figures. ``backend`` is the hardware's
    (``requester="hw"``); ``buffer_bytes`` is the model's retransmit buffer (the hardware has
    none yet)."""
    if requester not in REQUESTERS:
        raise ValueError(f"requester {requester!r} is not one of {', '.join(REQUESTERS)}")
    qps, wrs = workload(n_qps, total_bytes, message_bytes, pmtu)
    bpb = width // 8
    t0 = time.monotonic()
    kwargs = {"data_width": width, "buffer_bytes": buffer_bytes}
    if requester == "hw":
        from roce_hw.config import EngineConfig
        from sim.reliable_loop import HardwareRequester
        kwargs = {"requester": HardwareRequester(
            config=EngineConfig(data_width=width, n_qp=max(16, n_qps)), backend=backend,
            seed=seed, slice_cycles=max(1, min(128, delay)))}
    rep = run_reliable_loop(qps, wrs, seed=seed, network={"delay": delay, "drop": loss},
                            qp_params={"timeout": timeout, "retry_cnt": 7}, **kwargs)
    if requester == "hw":
        kwargs["requester"].close()
    wall = time.monotonic() - t0
    packet = math.ceil((pmtu + _OVERHEAD) / bpb)              # cycles of a full packet
    ack = math.ceil(_ACK_BYTES / bpb)
    round_trip = (packet + delay + ack + delay) / packet
    window = buffer_bytes / pmtu
    t_packets = ack_timeout_cycles(timeout, CLOCK_HZ[width]) / packet
    eta = gbn_bound(loss, window=window, round_trip=round_trip, timeout=t_packets)
    line = pmtu / (packet * bpb)
    eff = rep.goodput / line
    return {
        "requester": requester, "width": width, "qps": n_qps, "loss": loss,
        "ok": rep.ok, "all_delivered": rep.all_delivered, "cycles": rep.cycles,
        "messages": rep.messages, "delivered": rep.delivered,
        "payload_bytes": rep.payload_bytes,
        "basis": "completions" if rep.completions_ok is not None else "delivery",
        "goodput_bytes_per_cycle": rep.goodput * bpb,
        "delivery_goodput_bytes_per_cycle": rep.delivery_goodput * bpb,
        "efficiency": eff, "bound": eta,
        "ratio": eff / eta if eta else 0.0, "round_trip_packets": round_trip,
        "window_packets": window, "timeout_packets": t_packets,
        "retransmitted": rep.wire.get("tx_retransmitted", 0),
        "data_frames": rep.wire.get("tx_data", 0),
        "timeouts": rep.requester.get("timeouts", 0),
        "naks": rep.wire.get("rsp_nak", 0), "sim_seconds": wall,
    }


def _floats(text):
    return [float(x) for x in text.split(",") if x.strip()]


def _ints(text):
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.goodput",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--requester", choices=REQUESTERS, default="model",
                    help="the requester in the loop: the reliable requester model, or the "
                         "hardware engine (hw; it does not retransmit yet) (default: model)")
    ap.add_argument("--backend", choices=("amaranth", "verilator"), default="verilator",
                    help="simulator of --requester hw (default: verilator)")
    ap.add_argument("--width", type=_ints, default=[64, 512],
                    help="bus widths in bits, comma-separated (default: 64,512)")
    ap.add_argument("--qps", type=_ints, default=[1, 8],
                    help="QP counts, comma-separated (default: 1,8)")
    ap.add_argument("--loss", type=_floats, default=[0.001, 0.01],
                    help="loss probabilities, each direction, comma-separated "
                         "(default: 0.001,0.01)")
    ap.add_argument("--mbytes", type=float, default=4.0,
                    help="MiB of WRITEs per configuration (default: 4)")
    ap.add_argument("--message-kib", type=int, default=64,
                    help="KiB per WRITE (default: 64)")
    ap.add_argument("--pmtu", type=int, default=4096, help="path MTU in bytes (default: 4096)")
    ap.add_argument("--buffer-kib", type=int, default=128,
                    help="retransmit buffer in KiB (default: 128)")
    ap.add_argument("--delay", type=int, default=500,
                    help="network delay each way in cycles (default: 500)")
    ap.add_argument("--timeout", type=int, default=4,
                    help="QP local ACK timeout exponent: 4.096 us * 2**t (default: 4)")
    ap.add_argument("--seed", type=int, default=1, help="network seed (default: 1)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    try:
        for w in args.width:
            if w not in CLOCK_HZ:
                raise ValueError(f"width {w} is not one of {', '.join(map(str, CLOCK_HZ))}")
        for p in args.loss:
            if not 0 <= p < 1:
                raise ValueError(f"loss {p} is not in [0, 1)")
        if min(args.qps) < 1 or args.mbytes <= 0 or args.message_kib < 1:
            raise ValueError("--qps, --mbytes and --message-kib must be positive")
        proto.pmtu_code(args.pmtu)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = []
    bad = 0
    print(f"{'req':>5} {'width':>5} {'QPs':>3} {'loss':>6} {'B/cycle':>8} {'eff':>6} "
          f"{'bound':>6} {'ratio':>6} {'N pkt':>6} {'T pkt':>7} {'retx':>6} {'t/o':>4} "
          f"{'NAKs':>5} {'delivered':>11} {'ok':>3}")
    for w in args.width:
        for n in args.qps:
            for p in args.loss:
                try:
                    r = measure(w, n, p, requester=args.requester,
                                total_bytes=int(args.mbytes * (1 << 20)),
                                message_bytes=args.message_kib << 10, pmtu=args.pmtu,
                                buffer_bytes=args.buffer_kib << 10, delay=args.delay,
                                timeout=args.timeout, seed=args.seed, backend=args.backend)
                except BackendUnavailable as e:
                    print(f"error: --backend {args.backend}: {e}", file=sys.stderr)
                    return 2
                rows.append(r)
                bad += not r["ok"]
                print(f"{r['requester']:>5} {w:>5} {n:>3} {p:>6.3f} "
                      f"{r['goodput_bytes_per_cycle']:>8.2f} {r['efficiency']:>6.3f} "
                      f"{r['bound']:>6.3f} {r['ratio']:>6.3f} {r['round_trip_packets']:>6.1f} "
                      f"{r['timeout_packets']:>7.1f} {r['retransmitted']:>6} "
                      f"{r['timeouts']:>4} {r['naks']:>5} "
                      f"{str(r['delivered']) + '/' + str(r['messages']):>11} "
                      f"{'yes' if r['ok'] else 'NO':>3}",
                      flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    if bad:
        print(f"{bad} configurations did not deliver everything exactly once", file=sys.stderr)
        if args.requester == "hw":
            print("the engine does not retransmit yet (docs/reliability.md): a lost packet "
                  "loses its message and the QP's later ones", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
