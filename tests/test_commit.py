# SPDX-License-Identifier: BSD-2-Clause
"""Commit alone (roce_hw/tx/commit.py) against a reference written here from its docstring:
headers, cutter commands, write-backs, flushes, status reports and counters for random
messages (new, resumed, refused) with random payload mismatches, with stand-ins for the
segmenter (reacting to flushes) and the payload cutter (``done`` at a random time); the
ordering rules (a packet waits for the check of the one before, nothing is committed in the
cycle after a write-back or flush), the latency and the throughput checked cycle by cycle."""

import random

import pytest

from roce_hw import proto
from roce_hw.config import EngineConfig
from roce_hw.tx.commit import Commit
from roce_hw.verbs import WcStatus
from sim.harness import run_simulation

__all__ = []

LOCAL_MAC = 0x02_00_00_00_00_01
LOCAL_IP = 0x0A_00_00_01
BTH_FIELDS = ("opcode", "se", "migreq", "pad_cnt", "tver", "p_key", "fecn", "becn", "resv6",
              "dest_qp", "ack_req", "resv7", "psn")
PSN_MASK = proto.PSN_MASK


def make_messages(rng, config, count, *, p_refused=0.2, p_resumed=0.2):
    """Random messages: lists of descriptor dicts (the segmenter's output for one request).
    Refused: one descriptor; new and resumed: 1 to 4 packets with consecutive PSNs, payload
    in every packet but maybe the last."""
    n = config.data_bytes
    msgs = []
    tag = 0
    for k in range(count):
        qp = rng.randrange(config.n_qp)
        wr_id = rng.getrandbits(64)
        common = {"qp": qp, "wr_id": wr_id, "tag": tag, "remote_mac": rng.getrandbits(48),
                  "remote_ip": rng.getrandbits(32), "udp_sport": rng.getrandbits(16),
                  "dscp": rng.getrandbits(6), "ecn": rng.getrandbits(2), "reth": 0, "imm": 0,
                  "va": rng.getrandbits(64), "r_key": rng.getrandbits(32),
                  "dma_length": rng.getrandbits(32), "imm_data": rng.getrandbits(32)}
        tag ^= 1
        r = rng.random()
        if r < p_refused:
            msgs.append([dict(common, refused=1, refuse=rng.choice([WcStatus.LOC_LEN_ERR,
                                                                    WcStatus.LOC_QP_OP_ERR]),
                              first=0, last=1, resumed=0, has_payload=rng.randrange(2),
                              has_pay=0, **_packet_fields(rng, n, 0))])
            continue
        resumed = r < p_refused + p_resumed
        npk = rng.choice([1, 1, 2, 3, 4])
        psn = rng.choice([rng.getrandbits(24), PSN_MASK - 1])
        pays = [1] * (npk - 1) + [rng.choice([0, 1, 1])]
        msg = []
        for i in range(npk):
            msg.append(dict(common, refused=0, refuse=0, first=int(i == 0 and not resumed),
                            last=int(i == npk - 1), resumed=int(resumed),
                            has_payload=int(any(pays)), has_pay=pays[i],
                            reth=int(i == 0 and not resumed and rng.randrange(2)),
                            imm=int(i == npk - 1 and rng.randrange(2)),
                            **_packet_fields(rng, n, (psn + i) & PSN_MASK)))
        msgs.append(msg)
    return msgs


def _packet_fields(rng, n, psn):
    bth = {f: rng.getrandbits(w) for f, w in proto.BTH.fields}
    bth["psn"] = psn
    pkc = rng.randrange(1, n + 1)
    return {"bth": bth, "psn_next": (psn + 1) & PSN_MASK, "index": rng.getrandbits(23),
            "pay_len": rng.getrandbits(13), "beats": rng.randrange(1, 8),
            "pk": (1 << pkc) - 1, "lik": (1 << min(n, -(-pkc // 4) * 4)) - 1, "pkc": pkc,
            "tot_len": rng.getrandbits(16), "udp_len": rng.getrandbits(16)}


def reference(config, msgs, mism, *, ip_id_start=None):
    """What Commit's docstring says the messages become, given ``mism`` (per committed packet
    with payload, in commit order: its payload check fails). Returns a dict of lists: ``hdr``
    (expected header fields), ``cut`` (commands, with ``mism`` for the stand-in cutter),
    ``wb`` (qp, psn, err), ``flush`` (tags), ``status``, and the counters."""
    out = {"hdr": [], "cut": [], "wb": [], "flush": [], "status": [], "aborted": 0}
    ip_id = config.ip_id_start if ip_id_start is None else ip_id_start
    checks = iter(mism)
    for msg in msgs:
        for i, d in enumerate(msg):
            if d["refused"]:
                out["status"].append({"wr_id": d["wr_id"], "qp": d["qp"],
                                      "status": int(d["refuse"])})
                if d["has_payload"]:
                    out["cut"].append(_cut(d, drain=1, mism=None))
                continue
            out["hdr"].append(_hdr(config, d, ip_id))
            ip_id = (ip_id + 1) & 0xFFFF
            bad = next(checks) if d["has_pay"] else False
            if d["has_pay"]:
                out["cut"].append(_cut(d, drain=0, mism=bad))
            if d["last"] and not d["resumed"]:
                out["wb"].append((d["qp"], d["psn_next"], 0))      # the message is done
            if not bad:
                continue
            # the payload check failed: the frame was aborted
            out["aborted"] += 1
            out["status"].append({"wr_id": d["wr_id"], "qp": d["qp"],
                                  "status": int(WcStatus.LOC_LEN_ERR)})
            lead = i == 0                    # the first packet of the message committed
            if not lead:
                out["wb"].append((d["qp"], d["bth"]["psn"], 1))    # ERROR, the aborted PSN
            elif d["first"] and d["last"]:
                out["wb"].append((d["qp"], d["bth"]["psn"], 0))    # undo its write-back
            if not d["last"]:
                out["flush"].append(d["tag"])
                break                        # the rest of the message is never committed
    out["frames"] = len(out["hdr"])
    return out


def _cut(d, *, drain, mism):
    return {"beats": d["beats"], "pk": d["pk"], "lik": d["lik"], "pkc": d["pkc"],
            "last_msg": d["last"], "drain": drain, "mism": mism}


def _hdr(config, d, ip_id):
    return {
        "variant": d["imm"] | d["reth"] << 1, "payload": d["has_pay"],
        "eth": {"dst": d["remote_mac"], "src": LOCAL_MAC, "ethertype": proto.ETHERTYPE_IPV4},
        "ipv4": {"version": 4, "ihl": proto.IPV4.size // 4, "dscp": d["dscp"], "ecn": d["ecn"],
                 "total_length": d["tot_len"], "identification": ip_id, "flag_df": 1,
                 "ttl": config.ttl, "protocol": proto.IP_PROTO_UDP, "src": LOCAL_IP,
                 "dst": d["remote_ip"]},
        "udp": {"src_port": d["udp_sport"], "dst_port": proto.ROCEV2_UDP_PORT,
                "length": d["udp_len"]},
        "bth": dict(d["bth"]),
        "reth": {"va": d["va"], "r_key": d["r_key"], "dma_length": d["dma_length"]},
        "immdt": {"imm": d["imm_data"]},
    }


def _got_hdr(p, want):
    """The fields of header payload ``p`` that ``want`` names."""
    f = p.fields
    return {"variant": int(p.variant), "payload": int(p.payload),
            **{h: {k: int(getattr(getattr(f, h), k)) for k in want[h]}
               for h in ("eth", "ipv4", "udp", "bth", "reth", "immdt")}}


def run_commit(config, msgs, mism, *, seed=0, early_check=False, p_idle=0.3, p_stall=0.3,
               status_ready=True, done_delay=(None, 6), cycles=None):
    """Drive ``msgs`` through a Commit with a stand-in segmenter (offers the descriptors in
    order, with random idle between them; on a flush of the message it offers, withdraws it
    and skips the rest of that message) and a stand-in cutter (takes commands with random
    ``ready``; for a packet's command, pulses ``done`` with the reference's ``mism`` a random
    ``done_delay`` cycles after it was taken, at least 2, 1 with ``early_check``).

    Checks every cycle: a descriptor is taken only with its header and cutter command (as it
    needs them) and never while a write-back or flush is signalled or while the check of the
    packet before is outstanding (unless it comes back good in that cycle). Returns what came
    out and the cycles of the takes."""
    dut = Commit(config, early_check=early_check)
    ref = reference(config, msgs, mism)
    rng = random.Random(seed)
    rngs = [random.Random(rng.getrandbits(32)) for _ in range(6)]
    res = {"hdr": [], "cut": [], "wb": [], "upd": [], "flush": [], "status": [], "takes": [],
           "presented": [], "cycle": 0}
    st = {"fed": False}
    min_delay = 1 if early_check else 2
    lo, hi = done_delay
    lo = min_delay if lo is None else max(lo, min_delay)

    async def segmenter(ctx):
        # It samples the flush in every cycle it spends on a message (a flush names the
        # message by its tag; the one offered is the only one it can name: the message before
        # was checked before any packet of this one was taken).
        ctx.set(dut.local_mac, LOCAL_MAC)
        ctx.set(dut.local_ip, LOCAL_IP)

        async def tick(tag):
            _, _, ready, fv, ft = await ctx.tick().sample(dut.i.ready, dut.flush.valid,
                                                          dut.flush.tag)
            return ready, bool(fv and ft == tag)

        for msg in msgs:
            flushed = False
            for d in msg:
                while p_idle and rngs[0].random() < p_idle and not flushed:
                    _, f = await tick(d["tag"])
                    flushed |= f
                if flushed:
                    break
                ctx.set(dut.i.payload, d)
                ctx.set(dut.i.valid, 1)
                res["presented"].append(res["cycle"])
                while True:
                    ready, f = await tick(d["tag"])
                    flushed |= f
                    if ready or flushed:
                        break
                ctx.set(dut.i.valid, 0)
                assert not (ready and flushed), "taken in a flush cycle"
                if flushed:
                    break
        st["fed"] = True

    async def cutter(ctx):
        # one command at a time; the next one may be taken in the cycle of the last one's done
        cmds = ref["cut"]
        idx, due, bad, cycle = 0, None, 0, 0
        while idx < len(cmds) or due is not None:
            busy = due is not None and cycle < due
            rdy = idx < len(cmds) and not busy and not (p_stall and rngs[1].random() < p_stall)
            ctx.set(dut.cut.ready, rdy)
            ctx.set(dut.done.valid, cycle == due)
            ctx.set(dut.done.payload, {"mism": bad})
            _, _, valid, p = await ctx.tick().sample(dut.cut.valid, dut.cut.payload)
            if cycle == due:
                due = None
            if valid and rdy:
                cmd = cmds[idx]
                idx += 1
                res["cut"].append({k: int(getattr(p, k)) for k in cmd if k != "mism"})
                if not cmd["drain"]:
                    due, bad = cycle + rngs[2].randint(lo, max(lo, hi)), int(cmd["mism"])
            cycle += 1
        ctx.set(dut.cut.ready, 0)
        ctx.set(dut.done.valid, 0)

    async def sinks(ctx):
        hdrs = iter(ref["hdr"])
        while not (st["fed"] and len(res["hdr"]) == len(ref["hdr"])
                   and len(res["cut"]) == len(ref["cut"])):
            h_rdy = not (p_stall and rngs[3].random() < p_stall)
            s_rdy = status_ready and not (p_stall and rngs[4].random() < p_stall)
            u_rdy = not (p_stall and rngs[5].random() < p_stall / 2)
            ctx.set(dut.hdr.ready, h_rdy)
            ctx.set(dut.status.ready, s_rdy)
            ctx.set(dut.tx_upd.ready, u_rdy)
            _, _, *v = await ctx.tick().sample(
                dut.i.valid, dut.i.ready, dut.hdr.valid, dut.hdr.payload, dut.cut.valid,
                dut.cut.ready, dut.done.valid, dut.done.payload, dut.wb.valid, dut.wb.qp,
                dut.wb.psn, dut.wb.err, dut.flush.valid, dut.flush.tag, dut.status.valid,
                dut.status.payload, dut.tx_upd.valid, dut.tx_upd.payload, dut.i.payload)
            (iv, ir, hv, hp, cv, cr, dv, dp, wv, wq, wpsn, we, fv, ft, sv, sp, uv, up, ip) = v
            cycle = res["cycle"]
            take = iv and ir
            if take:
                res["takes"].append(cycle)
                refused = ip.refused
                need_cut = ip.has_payload if refused else ip.has_pay
                assert bool(hv and h_rdy) == (not refused), f"cycle {cycle}: header"
                assert bool(cv and cr) == bool(need_cut), f"cycle {cycle}: cutter command"
                assert not (wv or fv), f"cycle {cycle}: taken while a write-back/flush is made"
                assert not st.get("awaiting") or (dv and not dp.mism), \
                    f"cycle {cycle}: taken before the packet before it was checked"
            else:
                assert not (hv and h_rdy) and not (cv and cr), f"cycle {cycle}: half a commit"
            if hv and h_rdy:
                want = next(hdrs)
                res["hdr"].append(_got_hdr(hp, want))
            if dv:
                st["awaiting"] = False
            if take and not ip.refused and ip.has_pay:
                st["awaiting"] = True
            if wv:
                res["wb"].append((int(wq), int(wpsn), int(we)))
            if fv:
                res["flush"].append(int(ft))
            if sv and s_rdy:
                res["status"].append({"wr_id": int(sp.wr_id), "qp": int(sp.qp),
                                      "status": int(sp.status)})
            if uv and u_rdy:
                res["upd"].append((int(up.qp), int(up.next_psn), int(up.state_we),
                                   int(up.psn_we), int(up.state)))
            res["cycle"] = cycle + 1
        # let the last reports and write-backs out
        ctx.set(dut.status.ready, status_ready)
        ctx.set(dut.tx_upd.ready, 1)
        for _ in range(12):
            _, _, sv, sp, uv, up, wv, wq, wpsn, we, *cnt = await ctx.tick().sample(
                dut.status.valid, dut.status.payload, dut.tx_upd.valid, dut.tx_upd.payload,
                dut.wb.valid, dut.wb.qp, dut.wb.psn, dut.wb.err,
                dut.frames, dut.frames_aborted, dut.wrs_refused, dut.status_dropped)
            if sv and status_ready:
                res["status"].append({"wr_id": int(sp.wr_id), "qp": int(sp.qp),
                                      "status": int(sp.status)})
            if uv:
                res["upd"].append((int(up.qp), int(up.next_psn), int(up.state_we),
                                   int(up.psn_we), int(up.state)))
            if wv:
                res["wb"].append((int(wq), int(wpsn), int(we)))
            res["counters"] = dict(zip(("frames", "aborted", "refused", "dropped"),
                                       map(int, cnt)))

    if cycles is None:
        cycles = 2000 + 60 * sum(len(msg) for msg in msgs)
    run_simulation(dut, [segmenter, cutter, sinks], cycles=cycles, vcd_name="commit")
    return res, ref


def check(res, ref):
    assert res["hdr"] == ref["hdr"]
    assert res["cut"] == [{k: v for k, v in c.items() if k != "mism"} for c in ref["cut"]]
    assert res["wb"] == ref["wb"]
    # tx_upd: the same write-backs, the state written (ERROR) only with err
    assert res["upd"] == [(q, psn, err, 1, int(proto.QPState.ERROR)) for q, psn, err in ref["wb"]]
    assert res["flush"] == ref["flush"]
    assert res["status"] == ref["status"]
    c = res["counters"]
    assert (c["frames"], c["aborted"], c["refused"], c["dropped"]) == \
        (ref["frames"], ref["aborted"], len(ref["status"]), 0)


def _mism(rng, msgs, p=0.15):
    """Enough random check results for every packet with payload."""
    return [rng.random() < p for _ in range(sum(len(m) for m in msgs))]


@pytest.mark.parametrize("width", [64, 512])
@pytest.mark.parametrize("early_check", [False, True])
def test_random(width, early_check):
    rng = random.Random(width + early_check)
    config = EngineConfig(data_width=width, n_qp=8)
    msgs = make_messages(rng, config, 40)
    mism = _mism(rng, msgs)
    res, ref = run_commit(config, msgs, mism, seed=width, early_check=early_check)
    check(res, ref)
    # the stimulus reached what the test claims: aborts in first and later packets, flushes,
    # refusals, undone write-backs
    assert ref["aborted"] >= 3 and ref["flush"] and any(e for _, _, e in ref["wb"])
    assert any(s["status"] != WcStatus.LOC_LEN_ERR for s in ref["status"])


@pytest.mark.slow
@pytest.mark.parametrize("width", [128, 256, 1024])
@pytest.mark.parametrize("seed", [1, 2])
def test_random_more(width, seed):
    rng = random.Random(1000 * seed + width)
    config = EngineConfig(data_width=width, n_qp=8)
    msgs = make_messages(rng, config, 80)
    res, ref = run_commit(config, msgs, _mism(rng, msgs, 0.2), seed=seed)
    check(res, ref)


def test_check_can_fail():
    """The reference disagrees with a run whose mismatches it was not told of, and with a
    swapped pair of write-backs."""
    rng = random.Random(5)
    config = EngineConfig(data_width=64, n_qp=8)
    msgs = make_messages(rng, config, 12, p_refused=0)
    mism = _mism(rng, msgs, 0.3)
    res, ref = run_commit(config, msgs, mism, p_idle=0, p_stall=0)
    check(res, ref)
    other = reference(config, msgs, [False] * len(mism))
    with pytest.raises(AssertionError):
        check(res, other)
    bad = dict(res, wb=res["wb"][::-1])
    with pytest.raises(AssertionError):
        check(bad, ref)


def test_latency_and_throughput():
    """Everything ready: a descriptor is committed in the cycle it is presented unless
    something holds it; refused descriptors without payload one per cycle; after a packet with
    payload the next one in the cycle its check comes back; nothing in the cycle after a
    write-back."""
    rng = random.Random(7)
    config = EngineConfig(data_width=64, n_qp=8)
    refused = make_messages(rng, config, 6, p_refused=1.0)
    for msg in refused:
        msg[0]["has_payload"] = 0
    three = [m for m in make_messages(rng, config, 40, p_refused=0, p_resumed=0)
             if len(m) == 3 and m[-1]["has_pay"]][0]
    msgs = refused + [three]
    for k, msg in enumerate(msgs):
        for d in msg:
            d["tag"] = k & 1
    res, ref = run_commit(config, msgs, [False] * 3, p_idle=0, p_stall=0,
                          done_delay=(4, 4))
    check(res, ref)
    takes = res["takes"]
    assert takes[:6] == list(range(takes[0], takes[0] + 6)), "refusals not one per cycle"
    assert takes[0] == res["presented"][0]
    # the three packets: each next one in the cycle the check of the one before comes back
    # (4 cycles after its take)
    assert takes[7] - takes[6] == 4 and takes[8] - takes[7] == 4
    assert res["wb"] == [(three[-1]["qp"], three[-1]["psn_next"], 0)]


def test_status_fifo_full_drops_and_counts():
    """``status`` never read: four reports wait in its FIFO, the others are dropped and
    counted; nothing else is disturbed."""
    rng = random.Random(9)
    config = EngineConfig(data_width=64, n_qp=8)
    msgs = make_messages(rng, config, 10, p_refused=1.0)
    res, ref = run_commit(config, msgs, [], status_ready=False, p_idle=0.2, p_stall=0.2)
    assert res["status"] == [] and res["hdr"] == []
    assert res["counters"]["refused"] == 10 and res["counters"]["dropped"] == 10 - 4
    assert res["cut"] == [{k: v for k, v in c.items() if k != "mism"} for c in ref["cut"]]
