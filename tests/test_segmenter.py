# SPDX-License-Identifier: BSD-2-Clause
"""The segmenter alone (``roce_hw/tx/segmenter.py``): work and resume requests and a QP table
in, packet descriptors out, against the golden segmentation (``model.segment``) and the golden
frame builder (``model.packet``: the descriptor's IPv4 and UDP lengths), with random ``o``
backpressure. No PSN forwarding and no write-backs here: every new message takes its row's
``next_psn`` as read (the engine tests cover the forwarding)."""

import random

import pytest

from roce_hw import proto
from roce_hw.config import EngineConfig
from roce_hw.model.packet import QPPath, build_request_frame
from roce_hw.model.segment import segment_message
from roce_hw.proto import QPState, WcStatus, WrOpcode
from roce_hw.tx.segmenter import Segmenter
from sim.harness import run_simulation

__all__ = []

_OPS = (WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM, WrOpcode.SEND, WrOpcode.SEND_WITH_IMM)


def _rows(rng, n_qp):
    """QP rows: RTS with a random PMTU, but row 1 in INIT and row 2 with PMTU code 0."""
    rows = []
    for k in range(n_qp):
        rows.append({"state": int(QPState.RTS), "remote_qpn": rng.randrange(1 << 24),
                     "remote_mac": rng.randrange(1 << 48), "remote_ip": rng.randrange(1 << 32),
                     "udp_sport": rng.randrange(1 << 16), "dscp": rng.randrange(64),
                     "ecn": rng.randrange(4), "p_key": rng.randrange(1 << 16),
                     "migreq": rng.randrange(2),
                     "pmtu": rng.choice([int(c) for c in proto.PMTU_BYTES]),
                     "next_psn": rng.choice([rng.randrange(1 << 24), (1 << 24) - 2])})
    rows[1]["state"] = int(QPState.INIT)
    rows[2]["pmtu"] = 0
    return rows


def _requests(rng, rows, count):
    """``(port, payload)`` requests: mostly valid, some refused for each reason."""
    out = []
    for k in range(count):
        qp = rng.choice([0, 0, 3, 3, 1, 2, 0])            # (rows 1 and 2 refuse)
        row = rows[qp]
        pmtu = proto.PMTU_BYTES.get(row["pmtu"], 256)
        op = rng.choice(_OPS + (_OPS[0], WrOpcode.RDMA_READ) if k % 5 == 4 else _OPS)
        resume = rng.randrange(3) == 0
        if resume:          # mostly a message of several packets, resumed past packet 0
            n = rng.choice([rng.randrange(2 * pmtu + 1, 4 * pmtu + 7), rng.randrange(2 * pmtu)])
        else:
            n = rng.choice([0, 1, pmtu - 1, pmtu, pmtu + 1, rng.randrange(4 * pmtu + 7)])
        if k % 11 == 10:
            n = (1 << 31) + 1                                    # LOC_LEN_ERR
        wr = {"wr_id": rng.randrange(1 << 64), "opcode": int(op), "qp": qp,
              "remote_addr": rng.randrange(1 << 64), "r_key": rng.randrange(1 << 32),
              "length": n, "imm": rng.randrange(1 << 32), "signaled": 1,
              "solicited": rng.randrange(2)}
        if resume and n <= 1 << 31:
            npk = max(1, -(-n // pmtu))
            if k % 4 == 3:
                j = npk                                          # past the end: refused
            else:
                j = rng.randrange(1, npk) if npk > 1 and rng.randrange(4) else 0
            out.append(("resume", {**wr, "start_packet": j,
                                   "start_psn": rng.randrange(1 << 24)}))
        else:
            out.append(("wr", wr))
    return out


def _expected(cfg, rows, reqs):
    """Descriptor fields expected, in order: a dict per packet, or per refusal."""
    out = []
    for port, r in reqs:
        row = rows[r["qp"]]
        refuse = 0
        if row["state"] != QPState.RTS or row["pmtu"] not in proto.PMTU_BYTES or \
                r["opcode"] not in [int(o) for o in _OPS]:
            refuse = WcStatus.LOC_QP_OP_ERR
        elif r["length"] > 1 << 31:
            refuse = WcStatus.LOC_LEN_ERR
        else:
            pmtu = proto.PMTU_BYTES[row["pmtu"]]
            npk = max(1, -(-r["length"] // pmtu))
            j = r["start_packet"] if port == "resume" else 0
            if j >= npk:
                refuse = WcStatus.LOC_QP_OP_ERR
        if refuse:
            out.append({"wr_id": r["wr_id"], "refuse": int(refuse), "last": 1})
            continue
        start = r["start_psn"] if port == "resume" else row["next_psn"]
        pkts = segment_message(WrOpcode(r["opcode"]), bytes(r["length"]), pmtu=pmtu,
                               start_psn=start, remote_addr=r["remote_addr"], r_key=r["r_key"],
                               imm=r["imm"], solicited=bool(r["solicited"]),
                               ack_req_every=cfg.ack_req_every, start_packet=j)
        path = QPPath(src_mac=0, dst_mac=row["remote_mac"], src_ip=0, dst_ip=row["remote_ip"],
                      dest_qp=row["remote_qpn"], udp_sport=row["udp_sport"], dscp=row["dscp"],
                      ecn=row["ecn"], p_key=row["p_key"], migreq=row["migreq"])
        for i, p in enumerate(pkts):
            ip_len = len(build_request_frame(path, p, ip_id=0)) - proto.ETH.size
            d = {"wr_id": r["wr_id"], "refuse": 0, "qp": r["qp"],
                 "first": int(port == "wr" and i == 0), "last": int(i == len(pkts) - 1),
                 "resumed": int(port == "resume"), "index": j + i, "pay_len": len(p.payload),
                 "tot_len": ip_len, "udp_len": ip_len - proto.IPV4.size,
                 "reth": int(p.reth is not None), "imm": int(p.imm is not None),
                 "opcode": int(p.opcode), "psn": p.psn, "se": int(p.se),
                 "ack_req": int(p.ack_req), "pad_cnt": p.pad, "dest_qp": row["remote_qpn"],
                 "p_key": row["p_key"], "migreq": row["migreq"],
                 "remote_mac": row["remote_mac"], "remote_ip": row["remote_ip"],
                 "udp_sport": row["udp_sport"], "dscp": row["dscp"], "ecn": row["ecn"]}
            if p.reth is not None:
                d.update(va=p.reth["va"], r_key=p.reth["r_key"],
                         dma_length=p.reth["dma_length"])
            if p.imm is not None:
                d["imm_data"] = p.imm
            out.append(d)
    return out


def _run(width, seed, count=40, p_ready=0.6):
    rng = random.Random(seed)
    cfg = EngineConfig(data_width=width, n_qp=4, ack_req_every=rng.choice([1, 3, 64]))
    rows = _rows(rng, cfg.n_qp)
    reqs = _requests(rng, rows, count)
    want = _expected(cfg, rows, reqs)
    dut = Segmenter(cfg)
    got = []
    state = {"fed": False}

    async def feed(ctx):
        for port, payload in reqs:
            s = dut.wr if port == "wr" else dut.resume
            ctx.set(s.payload, payload)
            ctx.set(s.valid, 1)
            await ctx.tick().until(s.ready)
            ctx.set(s.valid, 0)
            for _ in range(rng.choice([0, 0, 1, 3])):
                await ctx.tick()
        state["fed"] = True

    async def qp_table(ctx):
        # the table's read port: the row of `addr` the cycle after `en`
        async for _, _, en, addr in ctx.tick().sample(dut.qp_rd.en, dut.qp_rd.addr):
            if en:
                ctx.set(dut.qp_rd.data, rows[addr] if addr < len(rows) else {})

    async def collect(ctx):
        prng = random.Random(seed + 1)
        ctx.set(dut.o.ready, 1)
        async for _, _, valid, ready, p in ctx.tick().sample(dut.o.valid, dut.o.ready,
                                                            dut.o.payload):
            if valid and ready:
                got.append(p)
            ctx.set(dut.o.ready, int(prng.random() < p_ready))

    async def wait_done(ctx):
        while not (state["fed"] and len(got) >= len(want)):
            await ctx.tick()
        await ctx.tick().repeat(40)                      # nothing more comes out

    run_simulation(dut, [feed, wait_done], [qp_table, collect], cycles=200 * count + 2000)
    assert len(got) == len(want)
    for k, (p, w) in enumerate(zip(got, want)):
        have = {"wr_id": p.wr_id, "refuse": p.refuse, "last": p.last}
        if not w["refuse"]:
            have.update(qp=p.qp, first=p.first, resumed=p.resumed, index=p.index,
                        pay_len=p.pay_len, tot_len=p.tot_len, udp_len=p.udp_len, reth=p.reth,
                        imm=p.imm, opcode=p.bth.opcode, psn=p.bth.psn, se=p.bth.se,
                        ack_req=p.bth.ack_req, pad_cnt=p.bth.pad_cnt, dest_qp=p.bth.dest_qp,
                        p_key=p.bth.p_key, migreq=p.bth.migreq, remote_mac=p.remote_mac,
                        remote_ip=p.remote_ip, udp_sport=p.udp_sport, dscp=p.dscp, ecn=p.ecn)
            if w["reth"]:
                have.update(va=p.va, r_key=p.r_key, dma_length=p.dma_length)
            if w["imm"]:
                have["imm_data"] = p.imm_data
        assert have == w, f"descriptor {k}"
    return want


@pytest.mark.parametrize("width", [64, 512])
def test_segmenter_matches_golden_segmentation(width):
    want = _run(width, seed=40 + width)
    # the stimulus covers what the test claims: refusals of each status, resumed MIDDLE/LAST
    # packets, RETH and ImmDt, multi-packet messages
    assert {w["refuse"] for w in want} == {0, WcStatus.LOC_QP_OP_ERR, WcStatus.LOC_LEN_ERR}
    sent = [w for w in want if not w["refuse"]]
    assert any(w["resumed"] and w["index"] > 0 and not w["last"] for w in sent)
    assert any(w["resumed"] and w["index"] > 0 and w["last"] for w in sent)
    assert any(w["reth"] for w in sent) and any(w["imm"] for w in sent)
    assert any(w["index"] >= 2 and not w["resumed"] for w in sent)


@pytest.mark.slow
@pytest.mark.parametrize("width", [128, 256, 1024])
def test_segmenter_matches_golden_segmentation_other_widths(width):
    _run(width, seed=50 + width)
