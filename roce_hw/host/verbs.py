# SPDX-License-Identifier: BSD-2-Clause
"""The ``verbs`` mode: a real RC QP on the host, connected to the engine through the CM.

The sequence (:meth:`VerbsSession.run`), for device ``DEVICE`` (e.g. ``rxe0``):

1. pick the source GID: the RoCE v2 GID ``::ffff:<our IPv4>`` of the port's GID table
   (:func:`choose_gid_index`), unless ``--gid-index`` names one;
2. create a CQ, an RC QP and a memory region of ``max(4096, count * length)`` bytes (local and
   remote write access), filled with the complement of the expected data (so no byte is right
   before the engine writes it);
3. OPEN_QP: our QPN, a random start PSN for our QP, the MR's R_Key and address, our IP; the
   engine's start PSN (``rem_psn``) random too. The ACK names the engine's QPN;
4. our QP RESET -> INIT (receive WRs posted here for SEND and WRITE with immediate: WR n takes
   message n into MR offset n * length) -> RTR (``dest_qp_num`` = engine QPN, ``rq_psn`` = the
   engine's start PSN, the path MTU, an address handle to ``::ffff:<engine IP>`` from our GID)
   -> RTS (``sq_psn`` = our start PSN);
5. MODIFY_QP_RTS to the engine (same fields);
6. txmeta start: the engine's generator sends ``count`` messages (``--wait``: someone else is
   asked to; nothing is sent);
7. collect until the expected messages are in or ``data_timeout`` passes: receive completions
   (SEND, SEND/WRITE with immediate), or the MR's contents (plain WRITE, which completes
   nothing at the responder);
8. check every byte against the generator pattern (byte k of message n = (k + n) & 0xFF; WRITE
   message n at MR offset n * length; SEND n in receive buffer n; immediate = n), completion
   order, lengths, opcodes, statuses;
9. ``close``: CLOSE_QP; ``reopen``: CLOSE_QP, our QP back to RESET, steps 3-8 again with new
   PSNs, then CLOSE_QP if ``close``.

Everything but the pyverbs calls is here and unit-tested with fakes; :class:`PyverbsBackend` is
the thin layer over pyverbs (imported when it is built; it runs on a host with an RDMA device,
e.g. the project's rxe guest).
"""

import ipaddress
import random
import socket
import time
from dataclasses import dataclass

from .. import proto
from ..proto import CmAck, WrOpcode
from . import datagram as dg

__all__ = ["VerbsError", "VerbsUnavailable", "CmRefused", "Traffic", "ipv4_gid",
           "choose_gid_index", "check_completions", "check_memory", "VerbsSession",
           "PyverbsBackend", "format_summary", "MAX_MR_BYTES"]

#: The largest memory region the tool registers (count * length).
MAX_MR_BYTES = 1 << 30
#: Receive completion opcodes (``enum ibv_wc_opcode``) by name.
WC_RECV, WC_RECV_RDMA_WITH_IMM = "RECV", "RECV_RDMA_WITH_IMM"
#: Errors listed in a summary (the counts hold them all).
MAX_ERRORS = 10


class VerbsError(Exception):
    """A set-up failure (exit code 2 on the command line)."""
    exit_code = 2


class VerbsUnavailable(VerbsError):
    """pyverbs cannot be imported."""


class CmRefused(VerbsError):
    """The engine answered a CM request with NAK, NO_QP or ERROR (exit code 1)."""
    exit_code = 1

    def __init__(self, what, reply):
        self.reply = reply
        super().__init__(f"{what} refused by the engine: {dg.ack_name(reply['ack_type'])}")


# --- pure helpers --------------------------------------------------------------------------------

def ipv4_gid(ip):
    """The RoCE v2 GID of an IPv4 address, ``::ffff:a.b.c.d``, written out in full
    (``0000:0000:0000:0000:0000:ffff:0a00:0001``) as pyverbs' ``GID`` wants it."""
    raw = ipaddress.IPv6Address("::ffff:" + dg.ip_str(dg.ip_int(ip))).packed
    return ":".join(raw[i:i + 2].hex() for i in range(0, 16, 2))


def _gid_bytes(gid):
    try:
        return ipaddress.IPv6Address(str(gid).strip()).packed
    except ValueError:
        return None


def choose_gid_index(table, ip):
    """Index of our IPv4 address's RoCE v2 GID (``::ffff:ip``) in a GID table.

    ``table`` is a sequence of ``{"index", "gid", "type"}`` (``gid`` in any IPv6 notation,
    ``type`` as sysfs writes it: ``"RoCE v2"``, ``"IB/RoCE v1"``, or ``""`` when unknown). The
    lowest index whose GID matches and whose type is RoCE v2 wins; an entry of unknown type is
    taken only if no RoCE v2 one matches. Raises :class:`VerbsError` naming the table otherwise.
    """
    want = ipaddress.IPv6Address(ipv4_gid(ip)).packed
    matches = [e for e in table if _gid_bytes(e.get("gid", "")) == want]
    for accept in (lambda t: "v2" in t.lower(), lambda t: not t.strip()):
        found = sorted(int(e["index"]) for e in matches if accept(str(e.get("type", ""))))
        if found:
            return found[0]
    listing = ", ".join(f"{e['index']}: {e['gid']} ({e.get('type') or '?'})" for e in table)
    raise VerbsError(f"no RoCE v2 GID ::ffff:{dg.ip_str(dg.ip_int(ip))} in the GID table "
                     f"[{listing}]; is the address configured on the RDMA device's netdev?")


@dataclass
class Traffic:
    """What the engine's generator is asked for (and what is checked).

    ``write`` selects RDMA WRITE (else SEND), ``imm`` the forms with immediate data."""
    length: int
    count: int
    period: int = 0
    write: bool = True
    imm: bool = False

    def __post_init__(self):
        if not 0 <= self.length <= 1 << 31:
            raise VerbsError(f"length {self.length} is not in 0 .. 2**31")
        if not 1 <= self.count < 1 << 32:
            raise VerbsError(f"count {self.count} is not in 1 .. 2**32 - 1")
        if not 0 <= self.period < 1 << 32:
            raise VerbsError(f"period {self.period} is not in 0 .. 2**32 - 1")
        if self.length * self.count > MAX_MR_BYTES:
            raise VerbsError(f"count * length = {self.length * self.count} bytes exceeds the "
                             f"{MAX_MR_BYTES}-byte memory region limit")

    @property
    def opcode(self):
        if self.write:
            return WrOpcode.RDMA_WRITE_WITH_IMM if self.imm else WrOpcode.RDMA_WRITE
        return WrOpcode.SEND_WITH_IMM if self.imm else WrOpcode.SEND

    @property
    def completions(self):
        """Receive completions expected: one per message, except for plain RDMA WRITE."""
        return self.count if (self.imm or not self.write) else 0

    @property
    def wc_opcode(self):
        return WC_RECV_RDMA_WITH_IMM if self.write else WC_RECV

    @property
    def mr_size(self):
        return max(4096, self.count * self.length)

    def expected(self):
        """The bytes of MR offsets 0 .. count * length once every message has landed."""
        return b"".join(proto.generator_payload(n, self.length) for n in range(self.count))

    def fill(self):
        """Initial MR contents: the complement of the expected bytes, then zeros."""
        want = self.expected()
        return want.translate(_COMPLEMENT) + bytes(self.mr_size - len(want))

    def recv_sge(self, n):
        """``(offset, length)`` of receive WR ``n``'s buffer (length 0: no scatter entry)."""
        if self.write:
            return 0, 0
        return n * self.length, self.length


_COMPLEMENT = bytes(255 - i for i in range(256))


def _diff(got, want):
    """Bytes that differ, a length difference counting as that many."""
    if got == want:
        return 0
    return sum(a != b for a, b in zip(got, want)) + abs(len(got) - len(want))


def check_memory(traffic, mem):
    """Compare the MR's first ``count * length`` bytes with the pattern: ``(mismatching
    bytes, indices of the messages not fully right)``."""
    L = traffic.length
    bad, mismatches = [], 0
    for n in range(traffic.count):
        d = _diff(mem[n * L:(n + 1) * L], proto.generator_payload(n, L))
        if d:
            bad.append(n)
            mismatches += d
    return mismatches, bad


def check_completions(traffic, wcs, read, *, check=True):
    """Check receive completions (``dict``\\ s with ``wr_id``, ``status``, ``opcode``,
    ``byte_len``, ``imm``) in CQ order against ``traffic``; ``read(offset, length)`` reads the
    MR. Returns a partial summary: ``completions``, ``bad_status``, ``bytes``, ``immediates``,
    ``mismatches``, ``missing``, ``errors``."""
    L = traffic.length
    out = {"completions": len(wcs), "bad_status": 0, "bytes": 0, "immediates": 0,
           "mismatches": 0 if check else None, "errors": []}
    errors = out["errors"]
    good = 0
    for i, wc in enumerate(wcs):
        if i >= traffic.count:
            errors.append(f"completion {i}: more completions than the {traffic.count} expected")
            continue
        if wc["status"] != 0:
            out["bad_status"] += 1
            errors.append(f"completion {i}: status {wc['status']}")
            continue
        good += 1
        out["bytes"] += wc["byte_len"]
        if wc.get("imm") is not None:
            out["immediates"] += 1
        if wc["opcode"] != traffic.wc_opcode:
            errors.append(f"completion {i}: opcode {wc['opcode']}, not {traffic.wc_opcode}")
        if wc["wr_id"] != i:
            errors.append(f"completion {i}: wr_id {wc['wr_id']} (receive WRs complete in order)")
        if wc["byte_len"] != L:
            errors.append(f"completion {i}: {wc['byte_len']} bytes, not {L}")
        if traffic.imm and wc.get("imm") != i:
            errors.append(f"completion {i}: immediate {wc.get('imm')}, not {i}")
        if not traffic.imm and wc.get("imm") is not None:
            errors.append(f"completion {i}: unexpected immediate {wc['imm']}")
        if check:
            d = _diff(read(i * L, min(wc["byte_len"], L)) if L else b"",
                      proto.generator_payload(i, L))
            if d:
                out["mismatches"] += d
                errors.append(f"message {i}: {d} bytes differ from the pattern")
    out["missing"] = max(0, traffic.count - good)
    return out


def format_summary(result):
    """Text lines of a :meth:`VerbsSession.run` result."""
    lines = [f"device {result['device']} port {result['port']} GID index {result['gid_index']}, "
             f"our IP {result['local_ip']}, engine {result['engine_ip']}"]
    for r in result["rounds"]:
        mism = "not checked" if r["mismatches"] is None else f"{r['mismatches']} mismatches"
        lines.append(
            f"round {r['round']}: engine QPN {r['engine_qpn']} (PSN {r['engine_psn']:#x}), our "
            f"QPN {r['qpn']} (PSN {r['psn']:#x}); {r['opcode']} {r['count']} x {r['length']} "
            f"B: {r['completions']}/{r['expected_completions']} completions, {r['bytes']} "
            f"bytes, {r['immediates']} immediates, {mism}, {r['missing']} missing, "
            f"{r['bad_status']} bad status, {r['elapsed_s']:.3f} s -> "
            f"{'OK' if r['ok'] else 'FAILED'}")
        lines.extend(f"  {e}" for e in r["errors"])
    if result.get("closed"):
        lines.append("closed")
    lines.append("OK" if result["ok"] else "FAILED")
    return lines


# --- the session ---------------------------------------------------------------------------------

class VerbsSession:
    """Connect a host QP to the engine and check the generator's traffic.

    Parameters
    ----------
    backend
        The verbs calls: :class:`PyverbsBackend` or a fake with the same methods.
    client : roce_hw.host.client.CmClient
        The CM exchange (its ``local_ip`` is our IP).
    traffic : Traffic
    pmtu : int
        Path MTU in bytes for our QP (256 .. 4096; the engine's is its build's CM PMTU).
    gid_index : int, optional
        Source GID index; default: :func:`choose_gid_index` on the backend's table.
    engine_qpn : int
        Ask OPEN for this engine QPN (0: the engine chooses).
    start : bool
        Ask the engine's generator for the traffic (``False``: ``--wait``).
    check : bool
        Compare the data with the generator pattern.
    data_timeout : float
        Seconds to wait for the traffic of one round.
    rng : random.Random, optional
        Source of the start PSNs.
    """

    def __init__(self, backend, client, traffic, *, pmtu=1024, gid_index=None, engine_qpn=0,
                 start=True, check=True, data_timeout=30.0, rng=None, log=None,
                 clock=time.monotonic, sleep=time.sleep):
        self.backend = backend
        self.client = client
        self.traffic = traffic
        try:
            self.pmtu_code = int(proto.pmtu_code(pmtu))
        except ValueError as exc:
            raise VerbsError(str(exc)) from None
        self.gid_index = gid_index
        self.engine_qpn_wanted = engine_qpn
        self.start = start
        self.check = check
        self.data_timeout = data_timeout
        self.rng = rng or random.Random()
        self.log = log or (lambda msg: None)
        self.clock, self.sleep = clock, sleep
        self.steps = []                 # what was done, in order (the state sequence)
        self.res = None                 # {"qpn", "rkey", "addr"} of our QP and MR
        self.engine_qpn = None
        self.psn = self.engine_psn = None
        self.rounds = []

    def _step(self, name):
        self.steps.append(name)
        self.log(name)

    def _cm(self, what, fn, *args, **kwargs):
        reply = fn(*args, **kwargs)
        if reply["ack_type"] != CmAck.ACK:
            raise CmRefused(what, reply)
        return reply

    def setup(self):
        """GID choice and the QP, CQ and MR (once)."""
        if self.gid_index is None:
            self.gid_index = choose_gid_index(self.backend.gid_table(), self.client.local_ip)
        self._step("gid")
        t = self.traffic
        max_recv = self.backend.max_recv()
        if t.completions > max_recv:
            raise VerbsError(f"{t.completions} receive WRs needed, the device allows {max_recv} "
                             f"per QP: ask for fewer messages")
        self.res = self.backend.create(t.mr_size, max(1, t.completions))
        self._step("create")

    def _new_psns(self):
        old = (self.psn, self.engine_psn)
        while True:
            psn, epsn = self.rng.randrange(1 << 24), self.rng.randrange(1 << 24)
            if psn != old[0] and epsn != old[1]:
                self.psn, self.engine_psn = psn, epsn
                return

    def connect(self):
        """OPEN, our QP to RTS, MODIFY_QP_RTS (our QP must be in RESET)."""
        t, res = self.traffic, self.res
        self._new_psns()
        self.backend.write(0, t.fill())
        reply = self._cm("OPEN_QP", self.client.open, res["qpn"], psn=self.psn,
                         r_key=res["rkey"], base_addr=res["addr"], engine_psn=self.engine_psn,
                         engine_qpn=self.engine_qpn_wanted)
        self.engine_qpn = reply["loc_qpn"]
        self._step("open")
        self.backend.to_init()
        self._step("init")
        for n in range(t.completions):
            self.backend.post_recv(n, *t.recv_sge(n))
        if t.completions:
            self._step("post_recv")
        self.backend.to_rtr(dest_qpn=self.engine_qpn, rq_psn=self.engine_psn,
                            path_mtu=self.pmtu_code, dgid=ipv4_gid(self.client.engine_ip),
                            sgid_index=self.gid_index)
        self._step("rtr")
        self.backend.to_rts(sq_psn=self.psn)
        self._step("rts")
        self._cm("MODIFY_QP_RTS", self.client.modify_rts, self.engine_qpn, res["qpn"],
                 psn=self.psn, r_key=res["rkey"], base_addr=res["addr"],
                 engine_psn=self.engine_psn)
        self._step("modify_rts")

    def traffic_round(self):
        """Ask for the traffic (unless ``start`` is off), collect and check it; the round's
        summary ``dict``."""
        t = self.traffic
        began = self.clock()
        if self.start:
            self._cm("txmeta start", self.client.start, self.engine_qpn, length=t.length,
                     count=t.count, period=t.period, write=t.write, imm=t.imm,
                     qpn=self.res["qpn"])
            self._step("start")
        deadline = began + self.data_timeout
        wcs = []
        size = t.count * t.length
        want = t.expected() if (self.check and not t.completions) else None
        while True:
            got = self.backend.poll(64)
            wcs.extend(got)
            if t.completions:
                if len(wcs) >= t.completions:
                    break
            elif want is not None and self.backend.read(0, size) == want:
                break
            if self.clock() >= deadline:
                break
            if not got:
                self.sleep(0.001 if t.completions else 0.02)
        self._step("collect")
        if t.completions:
            summary = check_completions(t, wcs, self.backend.read, check=self.check)
        else:
            summary = {"completions": len(wcs), "bad_status": 0, "immediates": 0,
                       "errors": [f"unexpected completion {wc}" for wc in wcs]}
            if self.check:
                mism, bad = check_memory(t, self.backend.read(0, size))
                summary.update(mismatches=mism, missing=len(bad), bytes=size - mism)
                if bad:
                    summary["errors"].append(f"{len(bad)} messages not (fully) written, "
                                             f"the first {bad[0]}")
            else:
                summary.update(mismatches=None, missing=0, bytes=size)
        self._step("check")
        errors = summary["errors"]
        summary.update(
            round=len(self.rounds) + 1, engine_qpn=self.engine_qpn, qpn=self.res["qpn"],
            psn=self.psn, engine_psn=self.engine_psn, opcode=t.opcode.name, length=t.length,
            count=t.count, period=t.period, expected_completions=t.completions,
            elapsed_s=self.clock() - began, errors=errors[:MAX_ERRORS],
            error_count=len(errors),
            ok=not errors and summary["missing"] == 0 and not summary["mismatches"]
            and summary["bad_status"] == 0)
        self.rounds.append(summary)
        return summary

    def close(self):
        self._cm("CLOSE_QP", self.client.close_qp, self.engine_qpn, qpn=self.res["qpn"])
        self._step("close")

    def reset(self):
        self.backend.to_reset()
        self._step("reset")

    def run(self, *, close=False, reopen=False):
        """The whole sequence; returns the result ``dict`` (:func:`format_summary`)."""
        self.setup()
        self.connect()
        self.traffic_round()
        if reopen:
            self.close()
            self.reset()
            self.connect()
            self.traffic_round()
        if close:
            self.close()
        return self.result(closed=close)

    def result(self, closed=False):
        return {"device": getattr(self.backend, "device", None),
                "port": getattr(self.backend, "port", None), "gid_index": self.gid_index,
                "local_ip": self.client.local_ip, "engine_ip": self.client.engine_ip,
                "rounds": self.rounds, "steps": self.steps, "closed": closed,
                "ok": bool(self.rounds) and all(r["ok"] for r in self.rounds)}


# --- pyverbs ------------------------------------------------------------------------------------

#: ``enum ibv_wc_opcode`` values to names.
WC_OPCODES = {0: "SEND", 1: "RDMA_WRITE", 2: "RDMA_READ", 3: "COMP_SWAP", 4: "FETCH_ADD",
              5: "BIND_MW", 6: "LOCAL_INV", 128: WC_RECV, 129: WC_RECV_RDMA_WITH_IMM}


def _read_text(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


class PyverbsBackend:
    """The verbs calls of :class:`VerbsSession` on a real device (pyverbs, lazily imported).

    The QP is RC with one CQ for sends and receives, at most one send WR (the host sends
    nothing but the ACKs its RDMA stack makes) and ``recv_depth`` receive WRs; the MR has local
    write and remote write access.
    """

    def __init__(self, device, port=1):
        try:
            import pyverbs.enums as e
            from pyverbs.device import Context
            from pyverbs.pd import PD
        except ImportError as exc:
            raise VerbsUnavailable(
                f"pyverbs is not installed ({exc}); on Debian/Ubuntu: apt-get install "
                f"python3-pyverbs") from None
        self.e = e
        self.device, self.port = device, port
        try:
            self.ctx = Context(name=device)
        except Exception as exc:          # pyverbs raises PyverbsRDMAError and friends
            raise VerbsError(f"cannot open RDMA device {device!r}: {exc}") from None
        self.pd = PD(self.ctx)
        self.qp = self.cq = self.mr = None

    def gid_table(self):
        """``[{index, gid, type}]`` of the port's non-zero GIDs (sysfs, else query_gid)."""
        base = f"/sys/class/infiniband/{self.device}/ports/{self.port}"
        n = self.ctx.query_port(self.port).gid_tbl_len
        out = []
        for i in range(n):
            gid = _read_text(f"{base}/gids/{i}")
            gtype = _read_text(f"{base}/gid_attrs/types/{i}") or ""
            if gid is None:
                try:
                    gid = str(self.ctx.query_gid(self.port, i))
                except Exception:
                    continue
            if _gid_bytes(gid) and any(_gid_bytes(gid)):
                out.append({"index": i, "gid": gid, "type": gtype})
        return out

    def max_recv(self):
        return self.ctx.query_device().max_qp_wr

    def create(self, mr_size, recv_depth):
        from pyverbs.cq import CQ
        from pyverbs.mr import MR
        from pyverbs.qp import QP, QPCap, QPInitAttr
        e = self.e
        self.cq = CQ(self.ctx, max(16, recv_depth + 16))
        self.mr = MR(self.pd, mr_size, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
        cap = QPCap(max_send_wr=1, max_recv_wr=recv_depth, max_send_sge=1, max_recv_sge=1)
        self.qp = QP(self.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq,
                                         cap=cap, sq_sig_all=0))
        return {"qpn": self.qp.qp_num, "rkey": self.mr.rkey, "addr": self.mr.buf}

    def write(self, offset, data):
        if data:
            self.mr.write(data, len(data), offset)

    def read(self, offset, length):
        return self.mr.read(length, offset) if length else b""

    def _modify(self, attr, mask):
        self.qp.modify(attr, mask)

    def to_reset(self):
        from pyverbs.qp import QPAttr
        self._modify(QPAttr(qp_state=self.e.IBV_QPS_RESET), self.e.IBV_QP_STATE)

    def to_init(self):
        from pyverbs.qp import QPAttr
        e = self.e
        attr = QPAttr(qp_state=e.IBV_QPS_INIT)
        attr.pkey_index = 0
        attr.port_num = self.port
        attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
        self._modify(attr, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT
                     | e.IBV_QP_ACCESS_FLAGS)

    def to_rtr(self, *, dest_qpn, rq_psn, path_mtu, dgid, sgid_index):
        from pyverbs.addr import GID, AHAttr, GlobalRoute
        from pyverbs.qp import QPAttr
        e = self.e
        gr = GlobalRoute(dgid=GID(dgid), sgid_index=sgid_index, hop_limit=64, traffic_class=0)
        attr = QPAttr(qp_state=e.IBV_QPS_RTR)
        attr.path_mtu = path_mtu
        attr.dest_qp_num = dest_qpn
        attr.rq_psn = rq_psn
        attr.max_dest_rd_atomic = 1
        attr.min_rnr_timer = 12
        attr.ah_attr = AHAttr(gr=gr, is_global=1, port_num=self.port)
        self._modify(attr, e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN
                     | e.IBV_QP_RQ_PSN | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER)

    def to_rts(self, *, sq_psn):
        from pyverbs.qp import QPAttr
        e = self.e
        attr = QPAttr(qp_state=e.IBV_QPS_RTS)
        attr.sq_psn = sq_psn
        attr.timeout = 14
        attr.retry_cnt = 7
        attr.rnr_retry = 7
        attr.max_rd_atomic = 1
        self._modify(attr, e.IBV_QP_STATE | e.IBV_QP_SQ_PSN | e.IBV_QP_TIMEOUT
                     | e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY | e.IBV_QP_MAX_QP_RD_ATOMIC)

    def post_recv(self, wr_id, offset, length):
        from pyverbs.wr import SGE, RecvWR
        # pyverbs' RecvWR needs a scatter entry: a 1-byte one where no data is expected
        # (RDMA WRITE with immediate places its data by the RETH, a 0-byte SEND none)
        sge = SGE(self.mr.buf + offset, max(1, length), self.mr.lkey)
        self.qp.post_recv(RecvWR(wr_id=wr_id, num_sge=1, sg=[sge]))

    def poll(self, max_entries):
        n, wcs = self.cq.poll(num_entries=max_entries)
        out = []
        for wc in wcs[:n]:
            imm = None
            if wc.wc_flags & self.e.IBV_WC_WITH_IMM:
                imm = socket.ntohl(wc.imm_data)
            out.append({"wr_id": wc.wr_id, "status": wc.status,
                        "opcode": WC_OPCODES.get(wc.opcode, str(wc.opcode)),
                        "byte_len": wc.byte_len, "imm": imm})
        return out

    def close(self):
        for obj in (self.qp, self.mr, self.cq, self.pd, self.ctx):
            if obj is not None:
                obj.close()
