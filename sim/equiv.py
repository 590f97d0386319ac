# SPDX-License-Identifier: BSD-2-Clause
"""Back-end equivalence: one seeded stimulus through both back ends of :mod:`sim.backend`, and
every output compared, cycles included.

:func:`stimulus` draws a workload from a seed: QPs set up through the management port, a random
mix of the four opcodes (sizes 0 to 3 PMTU, PSNs about to wrap), WRs the engine must refuse (a QP
not set up, a length mismatch), resumes part-way into a message, an IP identification load,
and, for the whole engine, received frames at seeded cycles (ARP requests for the engine and for
another address, CM OPEN / MODIFY / START and a corrupted CM datagram, a ping, a frame with a bad
FCS flag, a stray RoCE ACK) and a QP table read; random idle/stall on every stream. :func:`drive`
applies it to an engine in seeded slices of cycles, draining the outputs between slices as a
closed loop does, and returns everything that came out. Used by tests/test_backends.py and
``python -m sim.verilator --equiv``.
"""

import random

from roce_hw import proto
from sim.bfm import QPSetup, WorkItem, wr_fields

__all__ = ["stimulus", "drive", "compare", "ENGINE_MAC", "ENGINE_IP"]

ENGINE_MAC = 0x02_00_00_00_00_01
ENGINE_IP = 0x0A_00_00_01
HOST_MAC = 0x02_00_00_00_00_02
HOST_IP = 0x0A_00_00_02

_OPS = [proto.WrOpcode.RDMA_WRITE, proto.WrOpcode.RDMA_WRITE_WITH_IMM, proto.WrOpcode.SEND,
        proto.WrOpcode.SEND_WITH_IMM]


def _arp(target_ip):
    from scapy.layers.l2 import ARP, Ether
    return bytes(Ether(src=HOST_MAC.to_bytes(6, "big"), dst=b"\xff" * 6)
                 / ARP(op=1, hwsrc=HOST_MAC.to_bytes(6, "big"), psrc="10.0.0.2",
                       pdst=".".join(str(b) for b in target_ip.to_bytes(4, "big"))))


def _cm(fields, *, corrupt=False):
    from roce_hw.model.cm import request_frame
    frame = bytearray(request_frame(proto.CM_DATAGRAM.pack(fields), src_mac=HOST_MAC,
                                    dst_mac=ENGINE_MAC, src_ip=HOST_IP, dst_ip=ENGINE_IP,
                                    checksum=True))
    if corrupt:
        frame[-3] ^= 0x10
    return bytes(frame)


def _rx_frames(rng, n_qp):
    """Received frames for the whole engine: ``[(name, bytes, tuser)]``."""
    from scapy.layers.inet import ICMP, IP
    from scapy.layers.l2 import Ether
    host = {"loc_qpn": 0x11, "loc_psn": 0x100, "loc_r_key": 0xABCD, "loc_base_addr": 0x1000,
            "loc_ip": HOST_IP}
    qp = rng.randrange(n_qp)
    frames = [
        ("arp", _arp(ENGINE_IP), 0),
        ("arp_other", _arp(ENGINE_IP + 7), 0),
        ("open", _cm({"valid": 1, "req_type": int(proto.CmReq.OPEN_QP), "rem_psn": 0xFFFFF0,
                      "reply_port": 0x4322, **host}), 0),
        ("ping", bytes(Ether(src=HOST_MAC.to_bytes(6, "big"), dst=ENGINE_MAC.to_bytes(6, "big"))
                       / IP(src="10.0.0.2", dst="10.0.0.1") / ICMP()), 0),
        ("bad_fcs", _arp(ENGINE_IP), 1),
        ("cm_corrupt", _cm({"valid": 1, "req_type": int(proto.CmReq.OPEN_QP),
                            "reply_port": 0x4322, **host}, corrupt=True), 0),
        ("modify", _cm({"valid": 1, "req_type": int(proto.CmReq.MODIFY_QP_RTS),
                        "rem_qpn": proto.LOCAL_QPN_BASE + qp, "reply_port": 0x4322, **host}), 0),
    ]
    return frames


def stimulus(config, seed, *, top="engine", messages=24, stall=0.2):
    """A seeded stimulus for ``config``'s ``top``: a ``dict`` that :func:`drive` applies."""
    rng = random.Random(seed)
    n_qp = config.n_qp
    qps = []
    for k, index in enumerate(rng.sample(range(n_qp), min(4, n_qp))):
        qps.append(QPSetup(index, remote_qpn=0x100 + k, remote_mac=HOST_MAC + k,
                           remote_ip=HOST_IP + k, start_psn=(1 << 24) - rng.randrange(1, 40),
                           udp_sport=0xC000 + k, pmtu=rng.choice([256, 512, 1024])))
    pmtu = {q.index: q.pmtu for q in qps}
    unused = next(i for i in range(n_qp) if i not in pmtu) if n_qp > len(qps) else None
    items = []
    for n in range(messages):
        q = rng.choice(qps)
        size = rng.choice([0, 1, rng.randrange(2, 3 * q.pmtu + 5)])
        # every kind at least once: a refused WR, a length mismatch, a resume
        kind = {2: 0.0, 5: 0.1, 8: 0.95}.get(n, rng.random())
        if kind > 0.9:
            size = rng.randrange(q.pmtu + 1, 3 * q.pmtu + 5)
        elif kind < 0.16:
            size = max(size, 2)         # a mismatch keeps length >= 1: a WR of length 0 takes
                                        # no payload packet, which would shift every later one
        payload = bytes(rng.getrandbits(8) for _ in range(size))
        w = WorkItem(qp=q.index, opcode=rng.choice(_OPS), payload=payload,
                     remote_addr=rng.getrandbits(48), r_key=rng.getrandbits(32),
                     imm=rng.getrandbits(32), solicited=rng.random() < 0.3,
                     signaled=rng.random() < 0.8, wr_id=n + 1)
        if kind < 0.08 and unused is not None:
            w.qp = unused                                  # refused: QP not set up
        elif kind < 0.16:
            w.length = size + rng.choice([-1, 1])          # length mismatch: aborted
        items.append(("wr", w))
        if kind > 0.9 and size > q.pmtu:                   # resume part-way into a message
            start = rng.randrange(1, -(-size // q.pmtu))
            r = WorkItem(qp=q.index, opcode=w.opcode, payload=payload[start * q.pmtu:],
                         remote_addr=w.remote_addr, r_key=w.r_key, imm=w.imm, wr_id=1000 + n)
            fields = dict(wr_fields(r), length=size, start_packet=start,
                          start_psn=rng.getrandbits(24))
            items.append(("resume", fields, r.payload))
    rx = []
    if top == "engine":
        at = 0
        for name, frame, tuser in _rx_frames(rng, n_qp):
            at += rng.randrange(0, 150)
            rx.append((frame, at, tuser))
    slices = [rng.choice([1, 2, 7, 50, 133]) for _ in range(64)]
    probs = {s: stall * rng.random() for s in ("wr", "payload", "rx", "resume", "tx", "status",
                                                "other")} if stall else {}
    return {"qps": qps, "items": items, "rx": rx, "slices": slices, "probs": probs,
            "ip_id": rng.getrandbits(16), "top": top}


def drive(eng, stim, *, max_cycles=400_000, quiet=300):
    """Apply :func:`stimulus` ``stim`` to ``eng`` and run it to the end; returns every output
    (``dict``: tx and rx_other frames, status reports, management responses, WR accept cycles,
    counter snapshots, final counters and cycle)."""
    out = {"tx": [], "other": [], "status": [], "mgmt": [], "accepts": [], "snapshots": []}
    eng.set_addr(ENGINE_MAC, ENGINE_IP)
    if stim["probs"]:
        probs = dict(stim["probs"])
        if "RX_OTHER" not in eng.features:
            probs.pop("other")
        eng.set_random(**probs)
    eng.snapshot_every(97)
    for q in stim["qps"]:
        eng.write_qp(q)
    if "IP_ID_LOAD" in eng.features:
        eng.push_ip_id(stim["ip_id"])
    for item in stim["items"]:
        if item[0] == "wr":
            eng.post(item[1])
    for frame, at, tuser in stim["rx"]:
        eng.push_rx(frame, cycle=at, tuser=tuser)

    def drain():
        out["tx"] += eng.pop_tx()
        out["other"] += eng.pop_rx_other() if "RX_OTHER" in eng.features else []
        out["status"] += eng.pop_status()
        out["mgmt"] += eng.pop_mgmt_rsp()
        out["accepts"] += eng.pop_wr_accepts()
        out["snapshots"] += eng.pop_counters()

    for n in stim["slices"][:32]:
        eng.run(n)
        drain()
    eng.run(2000, until_tx=3)
    drain()
    # Resumes once every WR and its payload are in: the payload stream is shared, and a
    # resume's payload must follow the message the engine takes next.
    for _ in range(max_cycles // 100):
        if not (eng.count("wr_pending") or eng.count("payload_pending")):
            break
        eng.run(100)
        drain()
    if "RESUME" in eng.features:
        for item in stim["items"]:
            if item[0] == "resume":
                eng.push_resume(item[1])
                eng.push_payload(item[2])
    eng.read_qp(stim["qps"][0].index)
    for n in stim["slices"][32:]:
        eng.run(n)
        drain()
    eng.run(max_cycles, quiet=quiet)
    drain()
    out["counters"] = eng.counters()
    out["cycle"] = eng.cycle
    return out


def compare(a, b):
    """Differences between two :func:`drive` results: ``[text]`` (empty: identical)."""
    diffs = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if x == y:
            continue
        if isinstance(x, list) and isinstance(y, list):
            for k, (p, q) in enumerate(zip(x, y)):
                if p != q:
                    diffs.append(f"{key}[{k}]: {_short(p)} != {_short(q)}")
                    break
            if len(x) != len(y):
                diffs.append(f"{key}: {len(x)} != {len(y)} entries")
        elif isinstance(x, dict) and isinstance(y, dict):
            keys = [k for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)]
            diffs.append(f"{key}: " + ", ".join(f"{k} {x.get(k)} != {y.get(k)}" for k in keys))
        else:
            diffs.append(f"{key}: {_short(x)} != {_short(y)}")
    return diffs


def _short(v):
    text = repr(v)
    return text if len(text) < 300 else text[:300] + "..."
