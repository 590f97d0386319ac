# SPDX-License-Identifier: BSD-2-Clause
"""Guest agent of the soft-RoCE VM: drives ``rxe0`` through pyverbs on the host's request.

Runs *inside* the guest (Python 3.11 and pyverbs from Debian); it imports nothing from this
repository. It talks on a serial port (``/dev/ttyS1``, raw mode) in JSON lines:

* host -> guest: ``{"id": N, "cmd": NAME, ...arguments}``, one object per line;
* guest -> host: ``@@rxe {"id": N, "ok": true, "result": ...}`` or
  ``@@rxe {"id": N, "ok": false, "error": TEXT}``; events without ``id``
  (``{"event": "ready", ...}`` once at start). Lines without the ``@@rxe`` prefix are not ours.

Commands (see :data:`COMMANDS`): ``info``, ``create_qp``, ``connect``, ``query_qp``,
``post_recv``, ``post_send``, ``poll``, ``mem_hash``, ``mem_read``, ``mem_write``, ``counters``,
``neigh``, ``destroy_qp``, ``exec`` (run Python source in the agent, with its objects in scope:
how later guest-side code such as a CM client is run without rebuilding the image), ``spawn`` /
``join`` (the same in a background thread, for code that waits on the simulated engine while
the agent keeps answering), ``sh`` and ``shutdown``. Addresses in requests and replies are integers; MACs and IPs are strings.
"""

import base64
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import traceback
import tty

__all__ = ["Agent", "COMMANDS", "PREFIX", "main"]

PREFIX = "@@rxe "
DEVICE = "rxe0"
PORT = 1
NETDEV = "eth0"
SYSFS_PORT = f"/sys/class/infiniband/{DEVICE}/ports/{PORT}"

COMMANDS = ("info", "create_qp", "connect", "query_qp", "post_recv", "post_send", "poll",
            "mem_hash", "mem_read", "mem_write", "counters", "neigh", "destroy_qp", "exec",
            "spawn", "join", "sh", "shutdown")

#: ibv_qp_state names, index = value.
QP_STATES = ("RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR", "UNKNOWN")
#: ibv_wc_opcode values to names.
WC_OPCODES = {0: "SEND", 1: "RDMA_WRITE", 2: "RDMA_READ", 3: "COMP_SWAP", 4: "FETCH_ADD",
              5: "BIND_MW", 6: "LOCAL_INV", 128: "RECV", 129: "RECV_RDMA_WITH_IMM"}
#: PMTU in bytes to ibv_mtu.
MTU_ENUM = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}


def _read(path, default=""):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def gid_table():
    """``[{index, gid, type}]`` of the port's non-zero GIDs (from sysfs)."""
    out = []
    for i in range(64):
        gid = _read(f"{SYSFS_PORT}/gids/{i}")
        if not gid:
            break
        if gid.replace(":", "").strip("0"):
            out.append({"index": i, "gid": gid,
                        "type": _read(f"{SYSFS_PORT}/gid_attrs/types/{i}")})
    return out


def ipv4_gid_index(ip):
    """Index of the RoCE v2 GID ``::ffff:ip`` (the one RoCEv2 over IPv4 uses)."""
    want = socket.inet_pton(socket.AF_INET6, "::ffff:" + ip)
    for g in gid_table():
        if socket.inet_pton(socket.AF_INET6, g["gid"]) == want and "v2" in g["type"]:
            return g["index"]
    raise RuntimeError(f"no RoCE v2 GID for {ip} on {DEVICE}: {gid_table()}")


def _ipv4_gid(ip):
    """``::ffff:a.b.c.d`` written out in full, as pyverbs' ``GID`` wants it."""
    raw = socket.inet_pton(socket.AF_INET6, "::ffff:" + ip)
    return ":".join(raw[i:i + 2].hex() for i in range(0, 16, 2))


def link_addresses():
    """(MAC, IPv4 address, prefix length) of the agent's netdev."""
    mac = _read(f"/sys/class/net/{NETDEV}/address")
    out = subprocess.run(["/bin/ip", "-4", "-o", "addr", "show", "dev", NETDEV],
                         capture_output=True, text=True).stdout.split()
    cidr = out[out.index("inet") + 1] if "inet" in out else "0.0.0.0/0"
    ip, plen = cidr.split("/")
    return mac, ip, int(plen)


class _QPEntry:
    """One RC QP with its CQ, MR (RDMA target / send source) and receive buffers."""

    def __init__(self, agent, mr_size, recv_count, recv_size, send_depth):
        from pyverbs.cq import CQ
        from pyverbs.mr import MR
        from pyverbs.qp import QP, QPCap, QPInitAttr
        import pyverbs.enums as e
        self.e = e
        depth = max(16, recv_count + send_depth + 4)
        self.cq = CQ(agent.ctx, depth)
        access = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
                  | e.IBV_ACCESS_REMOTE_READ)
        self.mr_size = max(1, mr_size)
        self.mr = MR(agent.pd, self.mr_size, access)
        self.recv_size = max(1, recv_size)
        self.recv_slots = max(1, recv_count)
        self.rmr = MR(agent.pd, self.recv_size * self.recv_slots, e.IBV_ACCESS_LOCAL_WRITE)
        cap = QPCap(max_send_wr=max(1, send_depth), max_recv_wr=self.recv_slots,
                    max_send_sge=1, max_recv_sge=1)
        self.qp = QP(agent.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq,
                                          cap=cap, sq_sig_all=0))
        self.next_slot = 0          # receive slots are posted round robin
        self.slot_of = {}           # recv wr_id -> slot
        self.posted = 0
        self.sq_psn = 0

    def post_recv(self, count):
        from pyverbs.wr import RecvWR, SGE
        ids = []
        for _ in range(count):
            slot = self.next_slot % self.recv_slots
            self.next_slot += 1
            wr_id = self.next_slot
            sge = SGE(self.rmr.buf + slot * self.recv_size, self.recv_size, self.rmr.lkey)
            self.qp.post_recv(RecvWR(wr_id=wr_id, num_sge=1, sg=[sge]))
            self.slot_of[wr_id] = slot
            self.posted += 1
            ids.append(wr_id)
        return ids


class Agent:
    """The command handlers; one instance per guest boot."""

    def __init__(self):
        from pyverbs.device import Context
        from pyverbs.pd import PD
        self.ctx = Context(name=DEVICE)
        self.pd = PD(self.ctx)
        self.qps = {}               # handle -> _QPEntry
        self.next_handle = 1
        self.scope = {"agent": self}  # namespace of ``exec``
        self.tasks = {}               # spawn() number -> state

    # -- information -------------------------------------------------------------------
    def info(self):
        mac, ip, plen = link_addresses()
        return {"device": DEVICE, "port": PORT, "netdev": NETDEV, "mac": mac, "ip": ip,
                "prefix": plen, "kernel": os.uname().release,
                "mtu": int(_read(f"/sys/class/net/{NETDEV}/mtu", "0")),
                "active_mtu": 128 << self.ctx.query_port(PORT).active_mtu,
                "gids": gid_table(), "gid_index": ipv4_gid_index(ip),
                "python": sys.version.split()[0],
                "uptime": float(_read("/proc/uptime", "0").split()[0])}

    def counters(self):
        d = f"{SYSFS_PORT}/hw_counters"
        try:
            names = sorted(os.listdir(d))
        except OSError:
            return {}
        out = {}
        for n in names:
            v = _read(f"{d}/{n}")
            try:
                out[n] = int(v)
            except ValueError:
                out[n] = v
        return out

    # -- QPs ---------------------------------------------------------------------------
    def _qp(self, handle):
        try:
            return self.qps[handle]
        except KeyError:
            raise ValueError(f"no QP with handle {handle}") from None

    def _describe(self, h, q):
        mac, ip, _ = link_addresses()
        return {"handle": h, "qpn": q.qp.qp_num, "rkey": q.mr.rkey, "lkey": q.mr.lkey,
                "addr": q.mr.buf, "mr_size": q.mr_size, "recv_addr": q.rmr.buf,
                "recv_size": q.recv_size, "recv_slots": q.recv_slots, "recv_posted": q.posted,
                "sq_psn": q.sq_psn, "mac": mac, "ip": ip, "gid_index": ipv4_gid_index(ip)}

    def create_qp(self, mr_size=65536, recv_count=16, recv_size=16384, send_depth=16,
                  sq_psn=0, fill=0):
        """New RC QP in RESET with an MR of ``mr_size`` bytes filled with ``fill`` and
        ``recv_count`` receive buffers of ``recv_size`` bytes (posted once the QP is in INIT,
        by :meth:`connect`)."""
        q = _QPEntry(self, mr_size, recv_count, recv_size, send_depth)
        if fill:
            q.mr.write(bytes([fill]) * q.mr_size, q.mr_size)
        q.sq_psn = sq_psn & 0xFFFFFF
        q.pending_recv = recv_count
        h = self.next_handle
        self.next_handle += 1
        self.qps[h] = q
        return self._describe(h, q)

    def connect(self, handle, remote_qpn, remote_ip, rq_psn, pmtu=1024, sq_psn=None,
                remote_mac=None, min_rnr_timer=1, timeout=14, retry_cnt=7, rnr_retry=7,
                max_rd_atomic=1, max_dest_rd_atomic=1, hop_limit=64, traffic_class=0):
        """Move the QP RESET -> INIT -> RTR -> RTS towards ``remote_qpn`` at ``remote_ip``
        (receive PSN ``rq_psn``), posting its receive buffers in INIT. With ``remote_mac`` a
        permanent neighbour entry for ``remote_ip`` is (re)written first."""
        from pyverbs.addr import AHAttr, GID, GlobalRoute
        from pyverbs.qp import QPAttr
        q = self._qp(handle)
        e = q.e
        if remote_mac:
            self.neigh(remote_ip, remote_mac)
        if pmtu not in MTU_ENUM:
            raise ValueError(f"pmtu {pmtu} is not one of {sorted(MTU_ENUM)}")
        if sq_psn is not None:
            q.sq_psn = sq_psn & 0xFFFFFF
        _, ip, _ = link_addresses()
        attr = QPAttr(qp_state=e.IBV_QPS_INIT)
        attr.pkey_index = 0
        attr.port_num = PORT
        attr.qp_access_flags = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
                                | e.IBV_ACCESS_REMOTE_READ)
        q.qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT
                    | e.IBV_QP_ACCESS_FLAGS)
        if q.pending_recv:
            q.post_recv(q.pending_recv)
            q.pending_recv = 0
        gr = GlobalRoute(dgid=GID(_ipv4_gid(remote_ip)), sgid_index=ipv4_gid_index(ip),
                         hop_limit=hop_limit, traffic_class=traffic_class)
        ah = AHAttr(gr=gr, is_global=1, port_num=PORT)
        attr = QPAttr(qp_state=e.IBV_QPS_RTR)
        attr.path_mtu = MTU_ENUM[pmtu]
        attr.dest_qp_num = remote_qpn
        attr.rq_psn = rq_psn & 0xFFFFFF
        attr.max_dest_rd_atomic = max_dest_rd_atomic
        attr.min_rnr_timer = min_rnr_timer
        attr.ah_attr = ah
        q.qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN
                    | e.IBV_QP_RQ_PSN | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER)
        attr = QPAttr(qp_state=e.IBV_QPS_RTS)
        attr.sq_psn = q.sq_psn
        attr.timeout = timeout
        attr.retry_cnt = retry_cnt
        attr.rnr_retry = rnr_retry
        attr.max_rd_atomic = max_rd_atomic
        q.qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_SQ_PSN | e.IBV_QP_TIMEOUT
                    | e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY | e.IBV_QP_MAX_QP_RD_ATOMIC)
        return self.query_qp(handle)

    def query_qp(self, handle):
        q = self._qp(handle)
        e = q.e
        attr, _ = q.qp.query(e.IBV_QP_STATE | e.IBV_QP_SQ_PSN | e.IBV_QP_RQ_PSN
                             | e.IBV_QP_DEST_QPN | e.IBV_QP_PATH_MTU)
        return {"handle": handle, "qpn": q.qp.qp_num, "state": QP_STATES[attr.qp_state],
                "state_code": attr.qp_state, "sq_psn": attr.sq_psn, "rq_psn": attr.rq_psn,
                "dest_qpn": attr.dest_qp_num, "path_mtu": 128 << attr.path_mtu}

    def post_recv(self, handle, count=1):
        return {"wr_ids": self._qp(handle).post_recv(count)}

    def post_send(self, handle, opcode, length, offset=0, remote_addr=0, rkey=0, imm=0,
                  wr_id=0, signaled=True, solicited=False):
        """Post one WR as requester: ``opcode`` "write", "write_imm", "send" or "send_imm",
        ``length`` bytes from the QP's MR at ``offset``."""
        from pyverbs.wr import SGE, SendWR
        q = self._qp(handle)
        e = q.e
        ops = {"write": e.IBV_WR_RDMA_WRITE, "write_imm": e.IBV_WR_RDMA_WRITE_WITH_IMM,
               "send": e.IBV_WR_SEND, "send_imm": e.IBV_WR_SEND_WITH_IMM}
        if opcode not in ops:
            raise ValueError(f"opcode {opcode!r} is not one of {sorted(ops)}")
        if offset < 0 or offset + length > q.mr_size:
            raise ValueError(f"{length} bytes at offset {offset} exceed the MR ({q.mr_size})")
        flags = (e.IBV_SEND_SIGNALED if signaled else 0) | \
            (e.IBV_SEND_SOLICITED if solicited else 0)
        sg = [SGE(q.mr.buf + offset, length, q.mr.lkey)] if length else []
        wr = SendWR(wr_id=wr_id, opcode=ops[opcode], num_sge=len(sg), sg=sg or None,
                    send_flags=flags)
        if opcode in ("write", "write_imm"):
            wr.set_wr_rdma(rkey, remote_addr)
        if opcode in ("write_imm", "send_imm"):
            wr.imm_data = socket.htonl(imm & 0xFFFFFFFF)
        q.qp.post_send(wr)
        return {"wr_id": wr_id}

    def poll(self, handle, max=64, timeout_ms=0, count=None):
        """Work completions of the QP's CQ: up to ``max``; waits up to ``timeout_ms`` for at
        least ``count`` (default 1 if ``timeout_ms`` else 0) to arrive. Receive completions
        carry ``data_sha256`` of the receive buffer's first ``byte_len`` bytes (SEND)."""
        q = self._qp(handle)
        want = (1 if timeout_ms else 0) if count is None else count
        deadline = time.monotonic() + timeout_ms / 1000
        out = []
        while True:
            n, wcs = q.cq.poll(num_entries=max - len(out))
            for wc in wcs[:n]:
                out.append(self._wc(q, wc))
            if len(out) >= max or len(out) >= want or time.monotonic() >= deadline:
                return out
            time.sleep(0.001)

    def _wc(self, q, wc):
        op = WC_OPCODES.get(wc.opcode, str(wc.opcode))
        d = {"wr_id": wc.wr_id, "status": wc.status, "opcode": op, "byte_len": wc.byte_len,
             "qp_num": wc.qp_num, "src_qp": wc.src_qp, "wc_flags": wc.wc_flags,
             "vendor_err": wc.vendor_err}
        if wc.wc_flags & q.e.IBV_WC_WITH_IMM:
            d["imm"] = socket.ntohl(wc.imm_data)
        if wc.opcode & 0x80:        # receive completion: the buffer it consumed
            slot = q.slot_of.pop(wc.wr_id, None)
            d["slot"] = slot
            if slot is not None and op == "RECV" and wc.status == 0:
                data = q.rmr.read(min(wc.byte_len, q.recv_size), slot * q.recv_size)
                d["data_sha256"] = hashlib.sha256(data).hexdigest()
        return d

    # -- memory ------------------------------------------------------------------------
    def _mr(self, handle, which):
        q = self._qp(handle)
        return (q.rmr, q.recv_size * q.recv_slots) if which == "recv" else (q.mr, q.mr_size)

    def mem_hash(self, handle, ranges, which="mr"):
        """SHA-256 of each ``[offset, length]`` of the QP's MR (or receive buffers)."""
        mr, size = self._mr(handle, which)
        out = []
        for off, length in ranges:
            if off < 0 or off + length > size:
                raise ValueError(f"range {off}+{length} outside the MR ({size} bytes)")
            out.append(hashlib.sha256(mr.read(length, off) if length else b"").hexdigest())
        return out

    def mem_read(self, handle, offset, length, which="mr"):
        mr, size = self._mr(handle, which)
        if offset < 0 or offset + length > size:
            raise ValueError(f"range {offset}+{length} outside the MR ({size} bytes)")
        return {"b64": base64.b64encode(mr.read(length, offset) if length else b"").decode()}

    def mem_write(self, handle, offset, b64, which="mr"):
        mr, size = self._mr(handle, which)
        data = base64.b64decode(b64)
        if offset < 0 or offset + len(data) > size:
            raise ValueError(f"range {offset}+{len(data)} outside the MR ({size} bytes)")
        if data:
            mr.write(data, len(data), offset)
        return {"written": len(data)}

    # -- misc --------------------------------------------------------------------------
    def neigh(self, ip, mac):
        subprocess.run(["/bin/ip", "neigh", "replace", ip, "lladdr", mac, "dev", NETDEV,
                        "nud", "permanent"], check=True, capture_output=True)
        return {"ip": ip, "mac": mac}

    def destroy_qp(self, handle):
        q = self.qps.pop(handle, None)
        if q is not None:
            for obj in (q.qp, q.cq, q.mr, q.rmr):
                obj.close()
        return {"handle": handle}

    def exec(self, code):
        """Run Python ``code`` in the agent's namespace (``agent`` is this object); returns the
        value the code left in ``result`` (must be JSON-serialisable)."""
        self.scope.pop("result", None)
        exec(compile(code, "<host>", "exec"), self.scope)
        return self.scope.get("result")

    def spawn(self, code):
        """Start Python ``code`` in a background thread (``agent`` in scope; its ``result``
        is kept) and return ``{"task": N}`` at once, so that the agent keeps serving commands
        while, e.g., a guest-side CM client waits for the simulated engine."""
        task = {"done": False, "result": None, "error": None}
        n = len(self.tasks) + 1
        self.tasks[n] = task
        scope = {"agent": self}

        def run():
            try:
                exec(compile(code, f"<task {n}>", "exec"), scope)
                task["result"] = scope.get("result")
            except BaseException as exc:      # reported to the host, not raised here
                task["error"] = f"{type(exc).__name__}: {exc}"
                task["trace"] = traceback.format_exc()[-4000:]
            task["done"] = True

        threading.Thread(target=run, daemon=True).start()
        return {"task": n}

    def join(self, task, timeout_ms=0):
        """State of a :meth:`spawn` task, waiting up to ``timeout_ms`` for it to finish."""
        t = self.tasks.get(task)
        if t is None:
            raise ValueError(f"no task {task}")
        deadline = time.monotonic() + timeout_ms / 1000
        while not t["done"] and time.monotonic() < deadline:
            time.sleep(0.005)
        return dict(t)

    def sh(self, argv, timeout=10):
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return {"rc": p.returncode, "stdout": p.stdout[-20000:], "stderr": p.stderr[-20000:]}

    def shutdown(self):
        raise SystemExit(0)


class _Port:
    """Line I/O on the raw serial port."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_RDWR | os.O_NOCTTY)
        tty.setraw(self.fd)
        self.buf = b""

    def send(self, obj):
        data = (PREFIX + json.dumps(obj, separators=(",", ":")) + "\n").encode()
        while data:
            data = data[os.write(self.fd, data):]

    def lines(self):
        while True:
            chunk = os.read(self.fd, 65536)
            if not chunk:
                return
            self.buf += chunk
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                line = line.strip(b"\r")
                if line.strip():
                    yield line.decode(errors="replace")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    port = _Port(argv[0] if argv else "/dev/ttyS1")
    try:
        agent = Agent()
        port.send({"event": "ready", "info": agent.info()})
    except Exception as exc:
        port.send({"event": "fatal", "error": f"{type(exc).__name__}: {exc}",
                   "trace": traceback.format_exc()})
        return 1
    for line in port.lines():
        req_id = None
        try:
            req = json.loads(line)
            req_id = req.pop("id", None)
            cmd = req.pop("cmd")
            if cmd not in COMMANDS:
                raise ValueError(f"unknown command {cmd!r}")
            result = getattr(agent, cmd)(**req)
            port.send({"id": req_id, "ok": True, "result": result})
        except SystemExit:
            port.send({"id": req_id, "ok": True, "result": "bye"})
            return 0
        except Exception as exc:
            port.send({"id": req_id, "ok": False, "error": f"{type(exc).__name__}: {exc}",
                       "trace": traceback.format_exc()[-4000:]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
