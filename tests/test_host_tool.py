# SPDX-License-Identifier: BSD-2-Clause
"""The host tool (python -m roce_hw.host) against a fake engine on 127.0.0.1 (a UDP server
thread running the CM model): every sub-command, decoded output, exit codes, timeouts, retries,
stray datagrams, --json; and the verbs mode's logic with a fake verbs backend."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import deque

import pytest

from conftest import ROOT
from roce_hw import proto
from roce_hw.host import datagram as dg
from roce_hw.host import verbs
from roce_hw.host.__main__ import _verbs_alias, main
from roce_hw.host.client import CmClient, NoReply
from sim.fake_engine import FakeEngine
from roce_hw.model.cm import GeneratorState, generator_messages
from roce_hw.proto import CmAck, QPState

__all__ = []

LOCAL = "127.0.0.1"
LOCAL_INT = dg.ip_int(LOCAL)


@pytest.fixture
def engine():
    with FakeEngine(LOCAL, n_qp=4) as eng:
        yield eng


def common(eng_port, timeout=0.5, retries=3):
    return ["--engine-ip", LOCAL, "--engine-port", str(eng_port), "--reply-port", "0",
            "--timeout", str(timeout), "--retries", str(retries)]


def run(capsys, argv, **kw):
    """In process: (exit code, stdout, stderr)."""
    code = main(argv, **kw)
    out = capsys.readouterr()
    return code, out.out, out.err


def run_sub(argv, timeout=30):
    """As a subprocess: (exit code, stdout, stderr)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "roce_hw.host", *argv], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def sub_cmd(name, eng, *extra, json_out=False, **kw):
    return [name, *common(eng.port, **kw), *extra, *(["--json"] if json_out else [])]


# --- sub-commands against the fake engine ---------------------------------------------------------

def test_full_cycle_in_process(capsys, engine):
    code, out, err = run(capsys, sub_cmd("open", engine, "--qpn", "0x11", "--psn", "0x100",
                                         "--rkey", "0x537", "--addr", "0x7f0000000000",
                                         "--engine-psn", "0x222"))
    assert code == 0 and err == ""
    assert out.splitlines()[0].startswith(f"open: ACK from {LOCAL}:{engine.port}")
    assert "loc_qpn: 256 (0x100)" in out and f"loc_ip: {LOCAL}" in out
    assert "rem_qpn: 17 (0x11)" in out and "rem_r_key: 0x537" in out
    assert "rem_base_addr: 0x7f0000000000" in out and "request: OPEN_QP" in out
    row = engine.model.rows[0]
    assert (row["state"], row["remote_qpn"], row["rq_psn"], row["next_psn"], row["remote_ip"]) \
        == (QPState.INIT, 0x11, 0x100, 0x222, LOCAL_INT)

    code, out, _ = run(capsys, sub_cmd("rts", engine, "--engine-qpn", "256", "--qpn", "0x11",
                                       "--psn", "0x100", "--rkey", "0x537",
                                       "--addr", "0x7f0000000000", "--engine-psn", "0x333"))
    assert code == 0 and "rts: ACK" in out and "loc_psn: 819 (0x333)" in out
    assert engine.model.rows[0]["state"] == QPState.RTS

    code, out, _ = run(capsys, sub_cmd("info", engine, "--engine-qpn", "256"))
    assert code == 0 and "state: RTS" in out and "rem_psn: 256 (0x100)" in out

    starts = []
    engine.on_start = lambda model, gen: starts.append(gen)
    code, out, _ = run(capsys, sub_cmd("start", engine, "--engine-qpn", "256", "--length",
                                       "4096", "--count", "3", "--period", "10", "--send",
                                       "--imm"))
    assert code == 0 and "start: ACK" in out and "request: txmeta (valid 0" in out
    assert "txmeta: valid 1 start 1 immediate 1 type 0 (SEND)" in out
    assert "length 4096 count 3 period 10" in out
    (gen,) = starts
    assert (gen.qp, gen.opcode, gen.length, gen.count, gen.period, gen.r_key) == \
        (0, proto.WrOpcode.SEND_WITH_IMM, 4096, 3, 10, 0x537)

    code, out, _ = run(capsys, sub_cmd("start", engine, "--engine-qpn", "256", "--count", "2"))
    assert code == 0 and starts[-1].opcode == proto.WrOpcode.RDMA_WRITE    # --write default

    code, out, _ = run(capsys, sub_cmd("stop", engine, "--engine-qpn", "256"))
    assert code == 0 and "stop: ACK" in out and "start 0" in out

    code, out, _ = run(capsys, sub_cmd("close", engine, "--engine-qpn", "256", "--qpn", "17"))
    assert code == 0 and "close: ACK" in out and "loc_psn: 819 (0x333)" in out
    assert engine.model.rows[0]["state"] == QPState.RESET
    assert engine.model.counters["ok"] == 7 and sum(engine.model.counters.values()) == 7


def test_refusals_exit_1(capsys):
    with FakeEngine(LOCAL, n_qp=1) as eng:
        code, out, _ = run(capsys, sub_cmd("rts", eng, "--engine-qpn", "256", "--qpn", "1"))
        assert code == 1 and "rts: NAK" in out
        assert run(capsys, sub_cmd("open", eng, "--qpn", "1"))[0] == 0
        code, out, _ = run(capsys, sub_cmd("open", eng, "--qpn", "2"))
        assert code == 1 and "open: NO_QP" in out
        code, out, _ = run(capsys, sub_cmd("open", eng, "--qpn", "0x1000000"))
        assert code == 1 and "open: ERROR" in out                      # bad_field
        run(capsys, sub_cmd("rts", eng, "--engine-qpn", "256", "--qpn", "1"))
        code, out, _ = run(capsys, sub_cmd("start", eng, "--engine-qpn", "256", "--count", "0"))
        assert code == 1 and "start: ERROR" in out                     # bad_txmeta
        code, out, _ = run(capsys, sub_cmd("info", eng, "--engine-qpn", "257"))
        assert code == 1 and "info: NAK" in out
        c = eng.model.counters
        assert (c["bad_state"], c["no_qp"], c["bad_field"], c["bad_txmeta"], c["bad_qpn"]) == \
            (1, 1, 1, 1, 1)


def test_json_output_every_subcommand(capsys, engine):
    seen = {}
    for argv in (["open", "--qpn", "5", "--psn", "7"],
                 ["rts", "--engine-qpn", "256", "--qpn", "5", "--psn", "7"],
                 ["info", "--engine-qpn", "256"],
                 ["start", "--engine-qpn", "256", "--length", "64", "--count", "1"],
                 ["stop", "--engine-qpn", "256"],
                 ["close", "--engine-qpn", "256"],
                 ["close", "--engine-qpn", "256"]):
        code, out, _ = run(capsys, [argv[0], *common(engine.port), *argv[1:], "--json"])
        d = json.loads(out)
        assert set(dg.FIELDS) <= set(d)
        assert d["ack_valid"] == 1 and d["loc_ip_str"] == LOCAL and d["attempts"] == 1
        assert code == (0 if d["ack"] == "ACK" else 1)
        seen.setdefault(argv[0], []).append(d)
    assert seen["open"][0]["loc_qpn"] == 256 and seen["open"][0]["req"] == "OPEN_QP"
    assert seen["info"][0]["state"] == "RTS" and seen["info"][0]["loc_r_key"] == QPState.RTS
    assert seen["start"][0]["tx_op"] == "WRITE" and seen["start"][0]["req"] == "NULL"
    assert [d["ack"] for d in seen["close"]] == ["ACK", "NAK"]


def test_subprocess_open_json_and_nak(engine):
    code, out, err = run_sub(sub_cmd("open", engine, "--qpn", "0x99", "--psn", "3",
                                     json_out=True))
    assert code == 0, err
    d = json.loads(out)
    assert (d["ack"], d["loc_qpn"], d["rem_qpn"], d["rem_psn"], d["rem_ip_str"]) == \
        ("ACK", 256, 0x99, 3, LOCAL)
    code, out, err = run_sub(sub_cmd("close", engine, "--engine-qpn", "259"))
    assert code == 1 and "close: NAK" in out and err == ""


def test_usage_errors_exit_2_without_traceback(engine):
    for argv in ([], ["open", "--qpn", "1"], ["open", "--engine-ip", "10.0.0.1"],
                 ["open", "--engine-ip", "999.0.0.1", "--qpn", "1"],
                 ["open", "--engine-ip", "10.0.0.1", "--qpn", "x"],
                 ["rts", "--engine-ip", "10.0.0.1", "--qpn", "1"],
                 ["start", *common(engine.port), "--engine-qpn", "256", "--write", "--send"],
                 ["bogus", "--engine-ip", "10.0.0.1"],
                 ["open", *common(engine.port), "--qpn", str(1 << 32)]):
        code, out, err = run_sub(argv)
        assert code == 2, (argv, out, err)
        assert "Traceback" not in err and "error:" in err, (argv, err)
    code, out, _ = run_sub(["--help"])
    assert code == 0 and "open" in out and "verbs" in out


def test_value_too_wide_is_a_clear_error(capsys, engine):
    code, out, err = run(capsys, sub_cmd("open", engine, "--qpn", str(1 << 32)))
    assert code == 2 and out == "" and err.startswith("error:") and "fit in 32 bits" in err
    assert engine.received == []


def test_retry_after_a_dropped_datagram(capsys):
    with FakeEngine(LOCAL, drop=1) as eng:
        code, out, err = run(capsys, sub_cmd("open", eng, "--qpn", "1", timeout=0.3))
        assert code == 0 and "open: ACK" in out and "(attempt 2)" in out
        assert "sending again (attempt 2 of 3)" in err
        assert len(eng.received) == 2 and eng.received[0][0] == eng.received[1][0]
    with FakeEngine(LOCAL, drop=2) as eng:
        code, out, _ = run(capsys, sub_cmd("open", eng, "--qpn", "1", "--json", timeout=0.3))
        assert code == 0 and json.loads(out)["attempts"] == 3
    with FakeEngine(LOCAL, drop=3) as eng:
        code, out, err = run(capsys, sub_cmd("open", eng, "--qpn", "1", timeout=0.3))
        assert code == 2 and out == "" and "error: no reply to OPEN_QP" in err
        assert "after 3 attempts of 0.3 s" in err and len(eng.received) == 3


@pytest.mark.parametrize("how", ["in_process", "subprocess"])
def test_no_engine_exits_2_within_timeout_times_retries(capsys, how):
    # a bound socket that never answers (so no ICMP error either)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        silent.bind((LOCAL, 0))
        argv = ["info", *common(silent.getsockname()[1], timeout=0.25, retries=3),
                "--engine-qpn", "256"]
        t0 = time.monotonic()
        if how == "in_process":
            code, out, err = run(capsys, argv)
            elapsed = time.monotonic() - t0
            assert 0.75 <= elapsed < 0.75 + 0.5
        else:
            code, out, err = run_sub(argv)
            assert time.monotonic() - t0 < 0.75 + 5        # interpreter start-up included
        assert code == 2 and out == ""
        assert "error: no reply to FETCH_QP_INFO" in err and "Traceback" not in err
        for _ in range(3):
            assert len(silent.recvfrom(100)[0]) == 64


def test_no_listener_at_all_exits_2(capsys):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((LOCAL, 0))
        port = s.getsockname()[1]
    code, _, err = run(capsys, ["info", *common(port, timeout=0.2, retries=2),
                                "--engine-qpn", "256"])
    assert code == 2 and "error: no reply" in err


def test_stray_datagrams_are_ignored(capsys):
    with FakeEngine(LOCAL, stray=1) as eng:
        code, out, err = run(capsys, sub_cmd("open", eng, "--qpn", "1"))
        assert code == 0 and "open: ACK" in out and "(attempt 1)" in out
        assert err.count("ignoring a stray datagram") == 2
        assert "17 bytes, not 64" in err and "req_type 2 (SEND_QP_INFO) does not match" in err


def test_client_ignores_other_senders_and_non_replies():
    with FakeEngine(LOCAL) as eng, CmClient(LOCAL, engine_port=eng.port, reply_port=0,
                                            timeout=0.5, attempts=1, log=lambda m: None) as c:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other:
            reply_like = dg.pack(dg.datagram(valid=1, req_type=5, ack_valid=1, ack_type=1))
            other.sendto(reply_like, (LOCAL, c.reply_port))           # not from the engine
            eng.sock.sendto(dg.pack(dg.datagram(valid=1, req_type=5)), (LOCAL, c.reply_port))
            time.sleep(0.05)
            assert c.info(256)["ack_type"] == CmAck.NAK          # QP 256 is not open
            assert c.strays == 2
        with pytest.raises(NoReply):
            CmClient(LOCAL, engine_port=eng.port, reply_port=0, timeout=0.1, attempts=1,
                     log=lambda m: None).request({"valid": 1, "req_type": 1, "reply_port": 1})


def test_reply_port_named_in_the_datagram(engine):
    with CmClient(LOCAL, engine_port=engine.port, reply_port=0) as c:
        c.open(7)
        sent = dg.unpack(engine.received[-1][0])
        assert sent["reply_port"] == c.reply_port != 0
        assert sent["loc_ip"] == LOCAL_INT and engine.received[-1][1][1] == c.reply_port


def test_reply_port_zero_answered_at_the_source_port(engine):
    """As the engine does (issue 33 item 1.3): the reference script's txmeta datagram names no
    reply port; the fake engine answers it at the socket it came from."""
    with CmClient(LOCAL, engine_port=engine.port, reply_port=0) as c:
        c.open(7)
        c.modify_rts(256, 7)
    start = dg.txmeta_request(loc_ip=LOCAL, engine_qpn=256, length=16000, count=100,
                              reply_port=0)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(5)
        s.sendto(dg.pack(start), (LOCAL, engine.port))
        data, addr = s.recvfrom(1024)
    reply = dg.unpack(data)
    assert addr == (LOCAL, engine.port) and reply["ack_type"] == CmAck.ACK
    assert (reply["tx_dma_length"], reply["tx_n_transfers"]) == (16000, 100)


def test_verbs_alias():
    assert _verbs_alias(["--verbs", "rxe0", "--engine-ip", "1.2.3.4"]) == \
        ["verbs", "rxe0", "--engine-ip", "1.2.3.4"]
    assert _verbs_alias(["--engine-ip", "1.2.3.4", "--verbs=mlx5_0", "--send"]) == \
        ["verbs", "mlx5_0", "--engine-ip", "1.2.3.4", "--send"]
    assert _verbs_alias(["open", "--qpn", "1"]) == ["open", "--qpn", "1"]


def test_verbs_without_pyverbs_is_a_clear_error(engine):
    try:
        import pyverbs  # noqa: F401
        pytest.skip("pyverbs is installed here")
    except ImportError:
        pass
    code, out, err = run_sub(["--verbs", "rxe0", *common(engine.port)])
    assert code == 2 and "error: pyverbs is not installed" in err and "Traceback" not in err
    assert "python3-pyverbs" in err
    assert engine.received == []


# --- the verbs logic with a fake backend ----------------------------------------------------------

class FakeVerbs:
    """A fake RDMA device whose responder behaves as rxe's for the generator's messages."""

    GIDS = [{"index": 0, "gid": "fe80:0000:0000:0000:0000:00ff:fe00:0001", "type": "IB/RoCE v1"},
            {"index": 1, "gid": "fe80::ff:fe00:1", "type": "RoCE v2"},
            {"index": 2, "gid": verbs.ipv4_gid(LOCAL), "type": "IB/RoCE v1"},
            {"index": 3, "gid": verbs.ipv4_gid(LOCAL), "type": "RoCE v2"}]

    def __init__(self, device="rxe0", port=1, *, mangle=None, max_recv=16384):
        self.device, self.port = device, port
        self.mangle = mangle or (lambda msgs: msgs)
        self._max_recv = max_recv
        self.state = "RESET"
        self.states = []
        self.recvs = deque()
        self.cq = deque()
        self.lock = threading.Lock()
        self.attrs = {}
        self.closed = False
        self.delivered = 0

    def gid_table(self):
        return list(self.GIDS)

    def max_recv(self):
        return self._max_recv

    def create(self, mr_size, recv_depth):
        self.mem = bytearray(mr_size)
        self.recv_depth = recv_depth
        self.res = {"qpn": 0x1234, "rkey": 0xABCD, "addr": 0x7F00_0000_1000}
        return dict(self.res)

    def write(self, offset, data):
        self.mem[offset:offset + len(data)] = data

    def read(self, offset, length):
        return bytes(self.mem[offset:offset + length])

    def _to(self, new, *frm):
        assert self.state in frm, (self.state, new)
        self.state = new
        self.states.append(new)

    def to_init(self):
        self._to("INIT", "RESET")

    def to_rtr(self, **kw):
        self._to("RTR", "INIT")
        self.attrs.update(kw)

    def to_rts(self, *, sq_psn):
        self._to("RTS", "RTR")
        self.attrs["sq_psn"] = sq_psn

    def to_reset(self):
        self.state = "RESET"
        self.states.append("RESET")
        self.recvs.clear()
        self.cq.clear()

    def post_recv(self, wr_id, offset, length):
        assert self.state in ("INIT", "RTR", "RTS")
        assert len(self.recvs) < self.recv_depth
        self.recvs.append((wr_id, offset, length))

    def poll(self, max_entries):
        with self.lock:
            out = []
            while self.cq and len(out) < max_entries:
                out.append(self.cq.popleft())
            return out

    def close(self):
        self.closed = True

    def deliver(self, gen, row):
        """The engine's generator sent ``gen``'s messages on the connection ``row``: place
        them as rxe would (drop them all if the connection's parameters are not ours)."""
        assert self.state in ("RTR", "RTS")
        if (row["remote_qpn"], row["r_key"], row["remote_va"], row["next_psn"]) != \
                (self.res["qpn"], self.res["rkey"], self.res["addr"], self.attrs["rq_psn"]):
            return
        with self.lock:
            for msg in self.mangle(generator_messages(gen)):
                self.delivered += 1
                op = msg["opcode"]
                write = op in (proto.WrOpcode.RDMA_WRITE, proto.WrOpcode.RDMA_WRITE_WITH_IMM)
                if write:
                    off = msg["remote_addr"] - self.res["addr"]
                    self.mem[off:off + len(msg["payload"])] = msg["payload"]
                    if msg["imm"] is None:
                        continue
                wr_id, off, length = self.recvs.popleft()
                if not write:
                    assert len(msg["payload"]) <= length
                    self.mem[off:off + len(msg["payload"])] = msg["payload"]
                self.cq.append({"wr_id": wr_id, "status": 0,
                                "opcode": "RECV_RDMA_WITH_IMM" if write else "RECV",
                                "byte_len": len(msg["payload"]), "imm": msg["imm"]})


def session(eng, fake, traffic, **kw):
    client = CmClient(LOCAL, engine_port=eng.port, reply_port=0, timeout=0.5, attempts=2,
                      log=lambda m: None)
    eng.on_start = lambda model, gen: fake.deliver(gen, model.rows[gen.qp])
    kw.setdefault("data_timeout", 2.0)
    return verbs.VerbsSession(fake, client, traffic, rng=__import__("random").Random(5), **kw)


def test_choose_gid_index():
    assert verbs.choose_gid_index(FakeVerbs.GIDS, LOCAL) == 3
    assert verbs.choose_gid_index(FakeVerbs.GIDS, LOCAL_INT) == 3
    assert verbs.ipv4_gid("10.0.0.2") == "0000:0000:0000:0000:0000:ffff:0a00:0002"
    # types unknown (no sysfs): the first matching GID; RoCE v2 preferred over unknown
    table = [{"index": 5, "gid": "::ffff:10.0.0.2", "type": ""},
             {"index": 2, "gid": "::ffff:10.0.0.2", "type": ""}]
    assert verbs.choose_gid_index(table, "10.0.0.2") == 2
    assert verbs.choose_gid_index(table + [{"index": 7, "gid": "::ffff:10.0.0.2",
                                            "type": "RoCE v2"}], "10.0.0.2") == 7
    with pytest.raises(verbs.VerbsError, match=r"no RoCE v2 GID ::ffff:10.0.0.3 .*3: "):
        verbs.choose_gid_index(FakeVerbs.GIDS, "10.0.0.3")
    with pytest.raises(verbs.VerbsError):          # only a RoCE v1 entry
        verbs.choose_gid_index(FakeVerbs.GIDS[2:3], LOCAL)


def test_traffic_spec():
    t = verbs.Traffic(length=300, count=3, write=False, imm=True)
    assert t.opcode == proto.WrOpcode.SEND_WITH_IMM and t.completions == 3
    assert t.mr_size == 4096 and t.recv_sge(2) == (600, 300)
    assert t.expected()[300:303] == bytes([1, 2, 3])
    fill = t.fill()
    assert len(fill) == 4096 and all(a != b for a, b in zip(fill, t.expected()))
    w = verbs.Traffic(length=4096, count=3)
    assert w.opcode == proto.WrOpcode.RDMA_WRITE and w.completions == 0
    assert w.mr_size == 3 * 4096 and w.recv_sge(1) == (0, 0)
    assert verbs.Traffic(length=1, count=1, write=True, imm=True).completions == 1
    for bad in (dict(length=-1, count=1), dict(length=(1 << 31) + 1, count=1),
                dict(length=1, count=0), dict(length=1 << 20, count=1 << 11)):
        with pytest.raises(verbs.VerbsError):
            verbs.Traffic(**bad)


@pytest.mark.parametrize("write,imm", [(True, False), (True, True), (False, False),
                                       (False, True)])
def test_session_every_opcode_with_reopen(engine, write, imm):
    fake = FakeVerbs()
    t = verbs.Traffic(length=1000, count=5, write=write, imm=imm)
    s = session(engine, fake, t)
    result = s.run(close=True, reopen=True)
    assert result["ok"], result
    recv = ["post_recv"] if t.completions else []
    one = ["open", "init", *recv, "rtr", "rts", "modify_rts", "start", "collect", "check"]
    assert s.steps == ["gid", "create", *one, "close", "reset", *one, "close"]
    assert fake.states == ["INIT", "RTR", "RTS", "RESET", "INIT", "RTR", "RTS"]
    r1, r2 = result["rounds"]
    assert r1["engine_qpn"] == r2["engine_qpn"] == 256
    assert r1["psn"] != r2["psn"] and r1["engine_psn"] != r2["engine_psn"]
    for r in (r1, r2):
        assert (r["mismatches"], r["missing"], r["bad_status"], r["errors"]) == (0, 0, 0, [])
        assert r["bytes"] == 5000 and r["completions"] == t.completions
        assert r["immediates"] == (5 if imm else 0) and r["opcode"] == t.opcode.name
    assert fake.attrs["dest_qpn"] == 256 and fake.attrs["sgid_index"] == 3
    assert fake.attrs["dgid"] == verbs.ipv4_gid(LOCAL) and fake.attrs["path_mtu"] == 3
    assert fake.attrs["rq_psn"] == r2["engine_psn"] and fake.attrs["sq_psn"] == r2["psn"]
    assert engine.model.rows[0] == engine.model.zero_row()
    text = "\n".join(verbs.format_summary(result))
    assert "round 2: engine QPN 256" in text and text.endswith("OK")


@pytest.mark.parametrize("write,imm", [(True, False), (True, True), (False, True)])
def test_session_finds_bad_data(engine, write, imm):
    def corrupt(msgs):
        msgs = [dict(m) for m in msgs]
        p = bytearray(msgs[1]["payload"])
        p[7] ^= 0x40
        msgs[1]["payload"] = bytes(p)
        if imm:
            msgs[2]["imm"] = 99
        return msgs[:-1]                              # the last message never arrives
    fake = FakeVerbs(mangle=corrupt)
    t = verbs.Traffic(length=64, count=4, write=write, imm=imm)
    r = session(engine, fake, t, data_timeout=0.3).run()["rounds"][0]
    assert not r["ok"]
    # plain WRITE: missing = messages not fully right (1 and 3), the unwritten one all wrong
    assert r["missing"] == (1 if t.completions else 2)
    assert r["mismatches"] == (1 if t.completions else 1 + 64)
    if imm:
        assert any("immediate 99, not 2" in e for e in r["errors"])


def test_session_wrong_engine_psn_delivers_nothing(engine):
    """The fake drops a connection whose PSNs disagree (as rxe would): a check that can
    fail."""
    fake = FakeVerbs()
    t = verbs.Traffic(length=64, count=2, write=False)
    s = session(engine, fake, t, data_timeout=0.2)
    s.setup()
    s.connect()
    engine.model.rows[0]["next_psn"] ^= 1
    r = s.traffic_round()
    assert not r["ok"] and r["missing"] == 2 and r["completions"] == 0 and fake.delivered == 0


class _Replay:
    """A stand-in random source replaying fixed values."""

    def __init__(self, values):
        self.values = list(values)

    def randrange(self, n):
        return self.values.pop(0)


def test_reopen_always_takes_new_psns(engine):
    fake = FakeVerbs()
    s = session(engine, fake, verbs.Traffic(length=8, count=1, write=False))
    s.rng = _Replay([5, 6, 5, 9, 7, 6, 7, 8])
    result = s.run(reopen=True)
    assert [(r["psn"], r["engine_psn"]) for r in result["rounds"]] == [(5, 6), (7, 8)]
    assert result["ok"]


def test_session_wait_mode(engine):
    fake = FakeVerbs()
    t = verbs.Traffic(length=128, count=3, write=True, imm=False)
    s = session(engine, fake, t, start=False, data_timeout=1.0)
    s.setup()
    s.connect()
    model = engine.model
    assert model.generator is None
    # the user's logic sends the same pattern a little later
    verbs_gen = GeneratorState(qp=0, opcode=t.opcode, length=128, count=3, period=0,
                               remote_va=model.rows[0]["remote_va"], r_key=model.rows[0]["r_key"])
    timer = threading.Timer(0.1, fake.deliver, (verbs_gen, model.rows[0]))
    timer.start()
    r = s.traffic_round()
    timer.join()
    assert r["ok"] and "start" not in s.steps and engine.model.gen_log == []


def test_session_refused_open_and_too_many_receives(engine):
    fake = FakeVerbs(max_recv=4)
    with pytest.raises(verbs.VerbsError, match="4 per QP"):
        session(engine, fake, verbs.Traffic(length=8, count=5, write=False)).setup()
    s = session(engine, FakeVerbs(), verbs.Traffic(length=8, count=1), engine_qpn=300)
    s.setup()
    with pytest.raises(verbs.CmRefused, match="OPEN_QP refused by the engine: NAK") as exc:
        s.connect()
    assert exc.value.exit_code == 1


def test_verbs_command_line_with_a_fake_backend(capsys, engine):
    made = []

    def factory(device, port):
        fake = FakeVerbs(device, port)
        engine.on_start = lambda model, gen: fake.deliver(gen, model.rows[gen.qp])
        made.append(fake)
        return fake

    argv = ["--verbs", "rxe0", *common(engine.port), "--send", "--imm", "--length", "100",
            "--count", "5", "--reopen", "--close", "--seed", "1", "--json"]
    code, out, err = run(capsys, argv, backend_factory=factory)
    assert code == 0, err
    d = json.loads(out)
    assert d["ok"] and d["device"] == "rxe0" and d["gid_index"] == 3 and d["closed"]
    assert [r["opcode"] for r in d["rounds"]] == ["SEND_WITH_IMM"] * 2
    assert made[0].closed
    # the same seed gives the same PSNs
    code, out2, _ = run(capsys, argv, backend_factory=factory)
    assert [r["psn"] for r in json.loads(out2)["rounds"]] == [r["psn"] for r in d["rounds"]]
    # text output; no data (nobody delivers) -> exit 1
    engine.on_start = None
    engine_noop = FakeVerbs()
    code, out, err = run(capsys, ["verbs", "rxe0", *common(engine.port), "--count", "2",
                                  "--length", "16", "--data-timeout", "0.2", "--close"],
                         backend_factory=lambda d, p: engine_noop)
    assert code == 1 and "FAILED" in out and "2 missing" in out
    # a failing verbs call: exit 2 and an error line, no traceback
    class Broken(FakeVerbs):
        def to_rtr(self, **kw):
            raise RuntimeError("Failed to modify QP state to RTR. Errno: 110")
    code, out, err = run(capsys, ["verbs", "rxe0", *common(engine.port)],
                         backend_factory=lambda d, p: Broken())
    assert code == 2 and err == "error: RuntimeError: Failed to modify QP state to RTR. " \
        "Errno: 110\n"
    # an engine that refuses: exit 1 and an error line
    code, out, err = run(capsys, ["verbs", "rxe0", *common(engine.port), "--engine-qpn", "999"],
                         backend_factory=factory)
    assert code == 1 and "error: OPEN_QP refused by the engine: NAK" in err


# --- the thin pyverbs layer against stubs with pyverbs' signatures --------------------------------

def _stub_pyverbs(monkeypatch, calls):
    """Install stand-in ``pyverbs`` modules whose constructors take the keyword arguments of
    rdma-core's pyverbs (qp.pyx, cq.pyx, mr.pyx, addr.pyx, wr.pyx, device.pyx) and record every
    call in ``calls``; the enum values are libibverbs' (verbs.h)."""
    import types
    mods = {n: types.ModuleType(n) for n in ("pyverbs", "pyverbs.enums", "pyverbs.device",
                                             "pyverbs.pd", "pyverbs.cq", "pyverbs.mr",
                                             "pyverbs.qp", "pyverbs.addr", "pyverbs.wr")}
    e = mods["pyverbs.enums"]
    for name, value in dict(
            IBV_QP_STATE=1 << 0, IBV_QP_ACCESS_FLAGS=1 << 3, IBV_QP_PKEY_INDEX=1 << 4,
            IBV_QP_PORT=1 << 5, IBV_QP_AV=1 << 7, IBV_QP_PATH_MTU=1 << 8, IBV_QP_TIMEOUT=1 << 9,
            IBV_QP_RETRY_CNT=1 << 10, IBV_QP_RNR_RETRY=1 << 11, IBV_QP_RQ_PSN=1 << 12,
            IBV_QP_MAX_QP_RD_ATOMIC=1 << 13, IBV_QP_MIN_RNR_TIMER=1 << 15,
            IBV_QP_SQ_PSN=1 << 16, IBV_QP_MAX_DEST_RD_ATOMIC=1 << 17, IBV_QP_DEST_QPN=1 << 20,
            IBV_QPS_RESET=0, IBV_QPS_INIT=1, IBV_QPS_RTR=2, IBV_QPS_RTS=3, IBV_QPT_RC=2,
            IBV_ACCESS_LOCAL_WRITE=1, IBV_ACCESS_REMOTE_WRITE=2, IBV_WC_WITH_IMM=2).items():
        setattr(e, name, value)

    class Obj:
        def __init__(self, **kw):
            self.__dict__.update(kw)
            calls.append((type(self).__name__, kw))

        def close(self):
            calls.append((type(self).__name__ + ".close", {}))

    class Context(Obj):
        def __init__(self, *, name):
            super().__init__(name=name)

        def query_port(self, port_num):
            return types.SimpleNamespace(gid_tbl_len=3)

        def query_gid(self, port_num, index):
            return ["fe80:0000:0000:0000:0000:0000:0000:0001",
                    "0000:0000:0000:0000:0000:ffff:7f00:0001",
                    "0000:0000:0000:0000:0000:0000:0000:0000"][index]

        def query_device(self):
            return types.SimpleNamespace(max_qp_wr=16384)

    class PD(Obj):
        def __init__(self, context):
            super().__init__(context=context)

    class CQ(Obj):
        def __init__(self, context, cqe, cq_context=None, channel=None, comp_vector=0):
            super().__init__(context=context, cqe=cqe)
            self.wcs = []

        def poll(self, num_entries=1):
            out, self.wcs = self.wcs[:num_entries], self.wcs[num_entries:]
            return len(out), out

    class MR(Obj):
        def __init__(self, creator, length, access, address=None, implicit=False, **kw):
            super().__init__(length=length, access=access)
            self.buf, self.rkey, self.lkey = 0x7F00_0000_0000, 0x55, 0x66
            self.data = bytearray(length)

        def write(self, data, length, offset=0):
            self.data[offset:offset + length] = data[:length]

        def read(self, length, offset):
            return bytes(self.data[offset:offset + length])

    class QPCap(Obj):
        def __init__(self, max_send_wr=1, max_recv_wr=10, max_send_sge=1, max_recv_sge=1,
                     max_inline_data=0):
            super().__init__(max_send_wr=max_send_wr, max_recv_wr=max_recv_wr,
                             max_send_sge=max_send_sge, max_recv_sge=max_recv_sge)

    class QPInitAttr(Obj):
        def __init__(self, qp_type=4, qp_context=None, scq=None, rcq=None, srq=None, cap=None,
                     sq_sig_all=1):
            super().__init__(qp_type=qp_type, scq=scq, rcq=rcq, cap=cap, sq_sig_all=sq_sig_all)

    class QPAttr:
        def __init__(self, qp_state=1, cur_qp_state=0, port_num=1, path_mtu=3):
            self.qp_state = qp_state

    class QP(Obj):
        def __init__(self, creator, init_attr, qp_attr=None):
            super().__init__(init_attr=init_attr)
            self.qp_num = 0x77

        def modify(self, qp_attr, comp_mask):
            calls.append(("modify", dict(vars(qp_attr), mask=comp_mask)))

        def post_recv(self, wr, bad_wr=None):
            calls.append(("post_recv", vars(wr)))

    class GID(Obj):
        def __init__(self, val=None):
            super().__init__(val=val)

    class GlobalRoute(Obj):
        def __init__(self, dgid=None, flow_label=0, sgid_index=0, hop_limit=1,
                     traffic_class=0):
            super().__init__(dgid=dgid, sgid_index=sgid_index, hop_limit=hop_limit)

    class AHAttr(Obj):
        def __init__(self, dlid=0, sl=0, src_path_bits=0, static_rate=0, is_global=0,
                     port_num=1, gr=None):
            super().__init__(is_global=is_global, port_num=port_num, gr=gr)

    class SGE(Obj):
        def __init__(self, addr, length, lkey):
            super().__init__(addr=addr, length=length, lkey=lkey)

    class RecvWR:
        def __init__(self, wr_id=0, num_sge=0, sg=None, next_wr=None):
            if num_sge < 1 or sg is None:
                raise ValueError("A WR needs at least one SGE")
            self.wr_id, self.num_sge, self.sg = wr_id, num_sge, sg

    for mod, names in (("pyverbs.device", (Context,)), ("pyverbs.pd", (PD,)),
                       ("pyverbs.cq", (CQ,)), ("pyverbs.mr", (MR,)),
                       ("pyverbs.qp", (QP, QPCap, QPInitAttr, QPAttr)),
                       ("pyverbs.addr", (GID, GlobalRoute, AHAttr)),
                       ("pyverbs.wr", (SGE, RecvWR))):
        for cls in names:
            setattr(mods[mod], cls.__name__, cls)
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    mods["pyverbs"].enums = e
    return mods


def test_pyverbs_backend_calls(monkeypatch):
    calls = []
    mods = _stub_pyverbs(monkeypatch, calls)
    b = verbs.PyverbsBackend("stub_rxe_none", 1)       # no sysfs entry: query_gid is used
    e = mods["pyverbs.enums"]
    table = b.gid_table()
    assert [g["index"] for g in table] == [0, 1] and all(g["type"] == "" for g in table)
    assert verbs.choose_gid_index(table, LOCAL) == 1
    assert b.max_recv() == 16384
    res = b.create(8192, 5)
    assert res == {"qpn": 0x77, "rkey": 0x55, "addr": 0x7F00_0000_0000}
    kinds = dict((name, kw) for name, kw in calls)
    assert kinds["MR"] == {"length": 8192, "access": 3}
    assert kinds["QPCap"]["max_recv_wr"] == 5 and kinds["QPInitAttr"]["qp_type"] == 2
    assert kinds["QPInitAttr"]["sq_sig_all"] == 0 and kinds["CQ"]["cqe"] >= 5
    b.write(10, b"abc")
    assert b.read(9, 5) == b"\0abc\0" and b.read(0, 0) == b""
    calls.clear()
    b.to_init()
    b.post_recv(3, 300, 100)
    b.post_recv(4, 0, 0)
    b.to_rtr(dest_qpn=256, rq_psn=0x123, path_mtu=3, dgid=verbs.ipv4_gid("10.0.0.1"),
             sgid_index=1)
    b.to_rts(sq_psn=0x456)
    b.to_reset()
    mods_ = [kw for name, kw in calls if name == "modify"]
    assert [m["qp_state"] for m in mods_] == [1, 2, 3, 0]
    init, rtr, rts, reset = mods_
    assert init["mask"] == e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | \
        e.IBV_QP_ACCESS_FLAGS
    assert init["qp_access_flags"] == 3 and init["port_num"] == 1
    assert rtr["mask"] == e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | \
        e.IBV_QP_DEST_QPN | e.IBV_QP_RQ_PSN | e.IBV_QP_MAX_DEST_RD_ATOMIC | \
        e.IBV_QP_MIN_RNR_TIMER
    assert (rtr["dest_qp_num"], rtr["rq_psn"], rtr["path_mtu"]) == (256, 0x123, 3)
    ah = rtr["ah_attr"]
    assert ah.is_global == 1 and ah.port_num == 1 and ah.gr.sgid_index == 1
    assert ah.gr.dgid.val == "0000:0000:0000:0000:0000:ffff:0a00:0001"
    assert rts["mask"] == e.IBV_QP_STATE | e.IBV_QP_SQ_PSN | e.IBV_QP_TIMEOUT | \
        e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY | e.IBV_QP_MAX_QP_RD_ATOMIC
    assert rts["sq_psn"] == 0x456 and reset["mask"] == e.IBV_QP_STATE
    posts = [kw for name, kw in calls if name == "post_recv"]
    assert [(p["wr_id"], p["sg"][0].addr - 0x7F00_0000_0000, p["sg"][0].length) for p in posts] \
        == [(3, 300, 100), (4, 0, 1)]
    import types
    b.cq.wcs = [types.SimpleNamespace(wr_id=1, status=0, opcode=129, byte_len=64, wc_flags=2,
                                      imm_data=socket.htonl(7)),
                types.SimpleNamespace(wr_id=2, status=5, opcode=128, byte_len=0, wc_flags=0,
                                      imm_data=0)]
    assert b.poll(64) == [
        {"wr_id": 1, "status": 0, "opcode": "RECV_RDMA_WITH_IMM", "byte_len": 64, "imm": 7},
        {"wr_id": 2, "status": 5, "opcode": "RECV", "byte_len": 0, "imm": None}]
    b.close()
    assert [n for n, _ in calls if n.endswith(".close")] == \
        ["QP.close", "MR.close", "CQ.close", "PD.close", "Context.close"]
