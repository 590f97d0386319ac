# SPDX-License-Identifier: BSD-2-Clause
"""Boot the soft-RoCE guest in QEMU and bridge Ethernet frames between it and a simulation.

:class:`RxeVM` boots the image of :mod:`sim.guest` (TCG unless the CPU has vmx/svm), talks to
the guest agent on a serial port (:meth:`RxeVM.call`) and exchanges Ethernet frames with the
guest's one NIC: QEMU's ``-netdev dgram`` carries each frame as one UDP datagram between QEMU
and a socket of this process, both bound to 127.0.0.1 (``-nodefaults -nic none`` otherwise), so
nothing can leave the machine. QEMU is always killed on exit (context manager, ``stop``, and a
finaliser). With ``pylib`` the repository's pure-Python code (the host tool) is appended to the
image as a layer built from the working tree at this boot (:func:`sim.guest.write_python_layer`);
:meth:`RxeVM.spawn_program` runs a program in the guest with it on ``PYTHONPATH`` while the agent
keeps answering. With ``peer_mac=None`` the guest has no neighbour entry for the peer and must
learn its MAC by ARP.

:class:`RxeBridge` connects a simulated engine to the VM. It delivers each frame of the engine
stamped with the cycle count once its last beat is transferred -- per cycle with the testbench
:meth:`RxeBridge.drive_output`, or per slice of cycles with :meth:`RxeBridge.deliver_frames`
(for the transaction-level back ends of :mod:`sim.backend`, which run the engine in slices and
return the frames with their cycles) -- and keeps simulated time and rxe's replies causally
ordered: after a frame that asks for an acknowledgement (BTH AckReq) the caller is held (wall
clock, bounded by ``reply_timeout``) until rxe has answered it, so no further frame reaches rxe
before the ACK and nothing stalls if rxe stays silent (the frame is then recorded as
unanswered). Replies are stamped with the simulated cycle at which they arrived and queued for
:meth:`RxeBridge.drive_input`, the slot for an engine receive path (ACK/NAK, CM). Hooks on both
directions (``to_guest_hook``, ``from_guest_hook``) may drop, alter or duplicate frames (the
reliability tests' fault injection).
"""

import collections
import json
import os
import select
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

__all__ = ["VMError", "AgentError", "RxeVM", "RxeBridge", "CapturedFrame", "RoceInfo",
           "parse_roce", "choose_accel", "LOCALHOST", "ROCE_UDP_PORT", "OP_ACKNOWLEDGE"]

#: The only address frames are ever sent to or received from.
LOCALHOST = "127.0.0.1"
ROCE_UDP_PORT = 4791
OP_ACKNOWLEDGE = 0x11
PREFIX = "@@rxe "

_PSN_MASK = 0xFFFFFF


#: Guest-side body of :meth:`RxeVM.spawn_program` (``spec`` is defined before it).
_PROGRAM_CODE = """
import os, subprocess, time
def _text(b):
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
t0 = time.monotonic()
try:
    p = subprocess.run(spec["argv"], capture_output=True, timeout=spec["timeout"],
                       env={**os.environ, **spec["env"]})
    rc, out, err = p.returncode, _text(p.stdout), _text(p.stderr)
except subprocess.TimeoutExpired as e:
    rc, out = None, _text(e.stdout)
    err = _text(e.stderr) + f"\\n(killed after {spec['timeout']} s)"
result = {"rc": rc, "stdout": out[-200000:], "stderr": err[-200000:],
          "seconds": time.monotonic() - t0}
"""


class VMError(RuntimeError):
    """QEMU could not be started, the guest did not come up, or it died."""


class AgentError(RuntimeError):
    """The guest agent refused a command (the message includes the guest's traceback tail)."""


def choose_accel(requested="auto"):
    """``"kvm"`` only if asked, or if ``auto`` and the CPU shows vmx/svm and /dev/kvm is usable;
    otherwise ``"tcg"`` (a paravirtual /dev/kvm without vmx/svm cannot boot a stock kernel)."""
    requested = os.environ.get("RXE_ACCEL", requested)
    if requested != "auto":
        return requested
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        flags = ""
    if (" vmx" in flags or " svm" in flags) and os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "kvm"
    return "tcg"


def _free_udp_port():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((LOCALHOST, 0))
        return s.getsockname()[1]


def _die_with_parent():
    """In the QEMU child before exec: be killed if this Python process dies (even SIGKILL)."""
    try:
        import ctypes
        import signal
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):     # not Linux/glibc: the finaliser still kills it
        pass


def _kill(proc):
    """Kill QEMU (the finaliser and ``stop`` both end here)."""
    if proc.poll() is None:
        proc.kill()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


class RxeVM:
    """The soft-RoCE guest. Use as a context manager::

        with RxeVM() as vm:
            qp = vm.call("create_qp", mr_size=65536, recv_count=8, recv_size=4096)
            vm.send_frame(frame); reply = vm.recv_frame(timeout=1.0)

    Parameters
    ----------
    image : :class:`sim.guest.GuestImage`, optional
        Built (or taken from the cache) by :func:`sim.guest.build_image` when omitted.
    guest_mac, guest_ip, prefix : the guest NIC's addresses.
    peer_mac, peer_ip : the engine's addresses (a permanent neighbour entry in the guest;
        ``peer_mac=None``: none, the guest resolves ``peer_ip`` by ARP).
    pylib : tuple of str, optional
        Repository packages to put in the guest under :data:`sim.guest.PYLIB` (e.g.
        :data:`sim.guest.GUEST_PYTHON`); default none.
    mtu : guest link MTU (9000 lets rxe use every PMTU up to 4096).
    boot_timeout : seconds to wait for the agent's ``ready``.
    log_path : the guest kernel console is written there (default: a file under
        ``build/rxe-guest/logs/``).
    """

    def __init__(self, image=None, *, guest_mac="02:00:00:00:00:02", guest_ip="10.0.0.2",
                 prefix=24, peer_mac="02:00:00:00:00:01", peer_ip="10.0.0.1", mtu=9000,
                 memory_mb=768, boot_timeout=180.0, accel="auto", log_path=None, log=None,
                 pylib=None):
        self.image = image
        self.pylib = tuple(pylib or ())
        self.pylib_files = []             #: relative paths of the layer's files
        self.pylib_key = None             #: hash of the layer's files
        self._initrd_tmp = None
        self.guest_mac, self.guest_ip, self.prefix = guest_mac, guest_ip, prefix
        self.peer_mac, self.peer_ip, self.mtu = peer_mac, peer_ip, mtu
        self.memory_mb, self.boot_timeout = memory_mb, boot_timeout
        self.accel = accel
        self.log_path = log_path
        self.log = log or (lambda msg: None)
        self.proc = None
        self.sock = None
        self.qemu_port = None
        self.info = None                  #: the agent's ``info`` at boot
        self.boot_seconds = None
        self.events = []                  #: unsolicited agent events
        self.serial_noise = []            #: agent-port lines without the prefix
        self._replies = {}
        self._cond = threading.Condition()
        self._next_id = 1
        self._reader = None
        self._finalizer = None
        self._eof = False

    # -- life cycle ----------------------------------------------------------------------
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self):
        """Boot the guest and wait for the agent; raises :class:`VMError` on failure."""
        from sim.guest import build_image, find_qemu
        qemu = find_qemu()
        if self.image is None:
            self.image = build_image(log=self.log)
        if self.log_path is None:
            logs = self.image.kernel.parent.parent / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            for old in sorted(logs.glob("console-*.log"), key=lambda p: p.stat().st_mtime)[:-20]:
                old.unlink(missing_ok=True)      # keep the 20 newest consoles
            self.log_path = Path(tempfile.mkstemp(prefix="console-", suffix=".log",
                                                  dir=logs)[1])
        initrd = self.image.initrd
        if self.pylib:
            initrd = self._layered_initrd(logs_dir=Path(self.log_path).parent)
        host_port = self._bind(0)
        accel = choose_accel(self.accel)
        t0 = time.monotonic()
        for attempt in range(4):
            self.qemu_port = _free_udp_port()
            netdev = (f"dgram,id=n0,local.type=inet,local.host={LOCALHOST},"
                      f"local.port={self.qemu_port},remote.type=inet,remote.host={LOCALHOST},"
                      f"remote.port={host_port}")
            append = (f"console=ttyS0 quiet loglevel=3 panic=-1 rxe.ip={self.guest_ip}/"
                      f"{self.prefix} rxe.peer_ip={self.peer_ip} "
                      f"rxe.peer_mac={self.peer_mac or 'none'} "
                      f"rxe.mtu={self.mtu}")
            cmd = [qemu, "-accel", accel, "-m", str(self.memory_mb), "-smp", "1",
                   "-nodefaults", "-nic", "none", "-display", "none", "-no-reboot",
                   "-kernel", str(self.image.kernel), "-initrd", str(initrd),
                   "-append", append,
                   "-serial", f"file:{self.log_path}",
                   "-chardev", "stdio,id=agent,signal=off", "-serial", "chardev:agent",
                   "-netdev", netdev,
                   "-device", f"virtio-net-pci,netdev=n0,mac={self.guest_mac}"]
            if accel == "kvm":
                cmd += ["-cpu", "host"]
            self.log(f"booting the rxe guest ({accel}, {self.image.key})")
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, start_new_session=True,
                                         preexec_fn=_die_with_parent)
            self._finalizer = weakref.finalize(self, _kill, self.proc)
            self._eof = False
            self._reader = threading.Thread(target=self._read_serial, daemon=True)
            self._reader.start()
            try:
                # Under KVM the guest is up in seconds; a hang there means KVM cannot run it.
                ready = self._wait_event("ready", self.boot_timeout if accel != "kvm"
                                         else min(self.boot_timeout, 60.0))
            except VMError as e:
                err = self._stderr()
                self.stop()
                if "Address already in use" in err and attempt < 3:
                    self._bind(host_port)
                    continue
                if accel == "kvm" and attempt < 3:
                    self.log(f"KVM boot failed ({e}); retrying under TCG")
                    accel = "tcg"
                    self._bind(host_port)
                    continue
                raise VMError(f"{e}{': ' + err if err else ''}") from None
            self.info = ready["info"]
            self._drop_initrd_tmp()          # QEMU read it at start
            self.boot_seconds = time.monotonic() - t0
            self.log(f"guest ready in {self.boot_seconds:.1f} s (guest uptime "
                     f"{self.info.get('uptime', 0):.1f} s): {self.info['kernel']}, "
                     f"{self.info['mac']} {self.info['ip']}")
            self.drain_frames()
            return self
        raise VMError("could not start QEMU")  # pragma: no cover

    def _layered_initrd(self, logs_dir):
        """The image's initramfs with the repository layer appended, in a temporary file
        (deleted once the guest is up, or by :meth:`stop`)."""
        from sim.guest import write_python_layer
        fd, combined = tempfile.mkstemp(prefix="initrd-", suffix=".cpio", dir=logs_dir)
        self._initrd_tmp = Path(combined)
        layer = self._initrd_tmp.with_suffix(".layer")
        try:
            self.pylib_key, self.pylib_files = write_python_layer(layer, self.pylib)
            with os.fdopen(fd, "wb") as out, open(self.image.initrd, "rb") as base:
                while chunk := base.read(1 << 22):
                    out.write(chunk)
                out.write(layer.read_bytes())
        except BaseException:
            self._drop_initrd_tmp()
            raise
        finally:
            layer.unlink(missing_ok=True)
        self.log(f"guest Python layer {self.pylib_key}: {len(self.pylib_files)} files of "
                 f"{', '.join(self.pylib)}")
        return self._initrd_tmp

    def _drop_initrd_tmp(self):
        if self._initrd_tmp is not None:
            self._initrd_tmp.unlink(missing_ok=True)
            self._initrd_tmp = None

    def _bind(self, port):
        """Open the frame socket on 127.0.0.1:``port`` (0: any); returns the port."""
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.bind((LOCALHOST, port))
        return self.sock.getsockname()[1]

    def _stderr(self):
        if self.proc is None or self.proc.poll() is None:
            return ""
        try:
            return self.proc.stderr.read().decode(errors="replace").strip()[-2000:]
        except (OSError, ValueError):
            return ""

    def stop(self):
        """Ask the agent to power off, then kill QEMU in any case; idempotent."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None and not self._eof and self.info is not None:
                try:
                    self.proc = proc
                    self.call("shutdown", timeout=3)
                except (AgentError, VMError):
                    pass
                finally:
                    self.proc = None
                try:
                    proc.wait(3)
                except subprocess.TimeoutExpired:
                    pass
            _kill(proc)
            for f in (proc.stdin, proc.stdout, proc.stderr):
                try:
                    f.close()
                except OSError:
                    pass
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self._drop_initrd_tmp()

    @property
    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def console(self):
        """The guest's kernel console so far (for error messages)."""
        try:
            return Path(self.log_path).read_text(errors="replace")
        except (OSError, TypeError):
            return ""

    # -- agent -----------------------------------------------------------------------------
    def _read_serial(self):
        buf = b""
        out = self.proc.stdout
        while True:
            chunk = out.read1(65536) if hasattr(out, "read1") else out.read(4096)
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                text = line.decode(errors="replace").strip("\r")
                pos = text.find(PREFIX)
                if pos < 0:
                    if text.strip():
                        self.serial_noise.append(text)
                    continue
                try:
                    msg = json.loads(text[pos + len(PREFIX):])
                except json.JSONDecodeError:
                    self.serial_noise.append(text)
                    continue
                with self._cond:
                    if msg.get("id") is not None:
                        self._replies[msg["id"]] = msg
                    else:
                        self.events.append(msg)
                    self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def _wait_event(self, name, timeout):
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for ev in self.events:
                    if ev.get("event") == "fatal":
                        raise VMError(f"guest failed: {ev.get('error')}")
                    if ev.get("event") == name:
                        return ev
                if self._eof:
                    raise VMError(f"QEMU exited before the guest agent was {name}"
                                  f"{self._console_tail()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise VMError(f"guest agent not {name} after {timeout:.0f} s"
                                  f"{self._console_tail()}")
                self._cond.wait(left)

    def _console_tail(self):
        tail = self.console().strip().splitlines()[-8:]
        return ("; guest console:\n  " + "\n  ".join(tail)) if tail else ""

    def call(self, cmd, *, timeout=60.0, **args):
        """Run agent command ``cmd`` with keyword ``args``; returns its result or raises
        :class:`AgentError` (refused) / :class:`VMError` (no answer within ``timeout``)."""
        return self.reply(self.request(cmd, **args), timeout=timeout)

    def request(self, cmd, **args):
        """Send agent command ``cmd`` without waiting; returns the id for :meth:`reply`."""
        if not self.alive:
            raise VMError("the VM is not running")
        with self._cond:
            req_id = self._next_id
            self._next_id += 1
        line = json.dumps({"id": req_id, "cmd": cmd, **args}, separators=(",", ":")) + "\n"
        try:
            self.proc.stdin.write(line.encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError) as e:
            raise VMError(f"cannot talk to the guest: {e}") from None
        return req_id

    def reply(self, req_id, *, timeout=60.0):
        """The result of request ``req_id`` (waiting up to ``timeout`` s; 0 polls: ``None``
        if it has not arrived). Raises like :meth:`call`."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while req_id not in self._replies:
                if self._eof:
                    raise VMError(f"the guest went away (request {req_id})"
                                  f"{self._console_tail()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    if timeout == 0:
                        return None
                    raise VMError(f"no answer from the guest agent to request {req_id} "
                                  f"in {timeout} s")
                self._cond.wait(left)
            msg = self._replies.pop(req_id)
        if not msg.get("ok"):
            raise AgentError(f"{msg.get('error')}\n{msg.get('trace', '')}".rstrip())
        return msg.get("result")

    # -- programs ----------------------------------------------------------------------------
    def spawn_program(self, argv, *, timeout=600.0, env=None):
        """Start ``argv`` in the guest (in a thread of the agent, which keeps answering) with
        :data:`sim.guest.PYLIB` on ``PYTHONPATH`` and ``env`` added; returns the task number
        for :meth:`program_result`. The program is killed after ``timeout`` seconds."""
        from sim.guest import PYLIB
        spec = json.dumps({"argv": [str(a) for a in argv], "timeout": timeout,
                           "env": {"PYTHONPATH": PYLIB, **(env or {})}})
        code = f"import json\nspec = json.loads({spec!r})\n" + _PROGRAM_CODE
        return self.call("spawn", code=code)["task"]

    def program_result(self, task, *, timeout=0.0):
        """``{rc, stdout, stderr, seconds}`` of a :meth:`spawn_program` task once it has ended
        (``rc`` None: killed at its timeout), waiting up to ``timeout`` seconds; ``None`` while
        it runs. Raises :class:`AgentError` if the task itself failed."""
        state = self.call("join", task=task, timeout_ms=int(timeout * 1000),
                          timeout=timeout + 60.0)
        if not state["done"]:
            return None
        if state.get("error"):
            raise AgentError(f"{state['error']}\n{state.get('trace', '')}".rstrip())
        return state["result"]

    # -- frames ----------------------------------------------------------------------------
    def send_frame(self, frame):
        """Put one Ethernet frame (no FCS) on the guest's wire."""
        self.sock.sendto(bytes(frame), (LOCALHOST, self.qemu_port))

    def recv_frame(self, timeout=0.0):
        """The next frame from the guest, or ``None`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = max(0.0, deadline - time.monotonic())
            r, _, _ = select.select([self.sock], [], [], left)
            if not r:
                return None
            data, addr = self.sock.recvfrom(65536)
            if addr == (LOCALHOST, self.qemu_port):
                return data
            # Anything else on our port is not the guest's: ignored.

    def drain_frames(self):
        """Discard and return frames already waiting."""
        out = []
        while (f := self.recv_frame(0)) is not None:
            out.append(f)
        return out


@dataclass
class RoceInfo:
    """What the bridge needs from a RoCEv2 frame's headers."""
    opcode: int
    dest_qp: int
    psn: int
    ack_req: bool
    pad: int
    header_len: int          #: bytes before the payload (Eth .. BTH and extension headers)
    src_ip: int
    dst_ip: int
    syndrome: int | None = None   #: AETH syndrome (ACK/NAK frames)
    msn: int | None = None

    @property
    def is_ack(self):
        return self.opcode == OP_ACKNOWLEDGE

    @property
    def is_nak(self):
        return self.syndrome is not None and self.syndrome >> 5 in (1, 3)


#: Extension header bytes after the BTH of the RC opcodes (RETH 16, ImmDt 4, AETH 4, ...).
_EXT_BYTES = {0x00: 0, 0x01: 0, 0x02: 0, 0x03: 4, 0x04: 0, 0x05: 4, 0x06: 16, 0x07: 0,
              0x08: 0, 0x09: 4, 0x0A: 16, 0x0B: 20, 0x0C: 16, 0x0D: 4, 0x0E: 0, 0x0F: 4,
              0x10: 4, 0x11: 4, 0x12: 8, 0x13: 28, 0x14: 28, 0x16: 4, 0x17: 4}


def parse_roce(frame):
    """:class:`RoceInfo` of an Ethernet/IPv4/UDP 4791 frame, or ``None`` for anything else."""
    if len(frame) < 14 + 20 + 8 + 12 or frame[12:14] != b"\x08\x00":
        return None
    ihl = (frame[14] & 0x0F) * 4
    if frame[14] >> 4 != 4 or frame[23] != 17:
        return None
    udp = 14 + ihl
    if int.from_bytes(frame[udp + 2:udp + 4], "big") != ROCE_UDP_PORT:
        return None
    bth = udp + 8
    if len(frame) < bth + 12:
        return None
    op = frame[bth]
    info = RoceInfo(opcode=op, dest_qp=int.from_bytes(frame[bth + 5:bth + 8], "big"),
                    psn=int.from_bytes(frame[bth + 9:bth + 12], "big"),
                    ack_req=bool(frame[bth + 8] & 0x80), pad=(frame[bth + 1] >> 4) & 3,
                    header_len=bth + 12 + _EXT_BYTES.get(op & 0x1F, 0),
                    src_ip=int.from_bytes(frame[26:30], "big"),
                    dst_ip=int.from_bytes(frame[30:34], "big"))
    if op in (0x0D, 0x0E, 0x0F, 0x10, 0x11, 0x12) and len(frame) >= bth + 16:
        info.syndrome = frame[bth + 12]
        info.msn = int.from_bytes(frame[bth + 13:bth + 16], "big")
    return info


def _psn_le(a, b):
    """``a`` at or before ``b`` in 24-bit PSN order (within half the space)."""
    return ((b - a) & _PSN_MASK) < (1 << 23)


@dataclass
class CapturedFrame:
    """One frame seen by the bridge, in the order it happened."""
    direction: str            #: "to_guest" or "from_guest"
    cycle: int                #: simulated cycle (engine clock) it was delivered / arrived at
    wall: float               #: time.monotonic()
    data: bytes
    note: str = ""            #: "dropped", "altered", ... (set by hooks' effect)


@dataclass
class _Outstanding:
    engine_qpn: int | None
    guest_qpn: int
    psn: int
    cycle: int
    sent: float


class RxeBridge:
    """Connects a simulated engine's frame streams to an :class:`RxeVM`.

    Parameters
    ----------
    vm : RxeVM
    reply_timeout : float
        Seconds (wall clock) to wait for rxe's answer to a frame with AckReq before giving up
        on it and letting simulated time go on (recorded in :attr:`unanswered`).
    window : int
        Frames with AckReq that may be unanswered before the simulation is held (1: hold after
        every one; the simulation then never runs more than one message ahead of rxe).
    to_guest_hook, from_guest_hook : callable, optional
        ``hook(frame, index) -> bytes | list[bytes] | None`` for every frame in that direction
        (``index`` counts frames from 0): return the frame (possibly altered), a list (several
        or none) or ``None`` to drop it. The engine's bookkeeping (:attr:`capture`) records
        what was actually put on the wire, with a note when the hook changed it.
    expect_reply : callable, optional
        ``expect_reply(frame, info) -> bool``, called for every RoCEv2 frame sent to the guest
        (``info`` its :class:`RoceInfo`): whether rxe will act on it, so that an AckReq frame
        is worth waiting for. By default a frame is waited for unless rxe NAKed its QP and
        this is not the NAKed PSN sent again; a lossy network (frames reordered, corrupted,
        PSN gaps rxe drops silently) needs a model of rxe's expected PSN instead
        (``sim.rxe.RxeExpectation``).
    """

    def __init__(self, vm, *, reply_timeout=2.0, window=1, to_guest_hook=None,
                 from_guest_hook=None, expect_reply=None):
        self.vm = vm
        self.reply_timeout = reply_timeout
        self.window = max(1, window)
        self.to_guest_hook = to_guest_hook
        self.from_guest_hook = from_guest_hook
        self.expect_reply = expect_reply
        self.capture = []                 #: every frame both ways, :class:`CapturedFrame`
        self.replies = []                 #: (cycle, RoceInfo, bytes) of rxe's RoCE frames
        self.rx_queue = collections.deque()   #: (cycle, bytes) for :meth:`drive_input`
        self.unanswered = []              #: _Outstanding frames rxe never answered
        self.frames_out = 0               #: frames offered by the engine
        self.frames_in = 0                #: frames received from the guest
        self.aborted = 0                  #: aborted frames seen by :meth:`drive_output`
        self._outstanding = []
        self._engine_qpn = {}             # guest QPN -> engine QPN
        self._blocked = {}                # guest QPN -> PSN rxe NAKed (or "dead")
        self._wait_seconds = 0.0

    def pair(self, guest_qpn, engine_qpn):
        """Tell the bridge that guest QP ``guest_qpn`` talks to engine QP ``engine_qpn`` (the
        ACK's BTH names the engine QP; the request names the guest QP)."""
        self._engine_qpn[guest_qpn] = engine_qpn

    @property
    def wait_seconds(self):
        """Wall-clock seconds the simulation was held waiting for rxe."""
        return self._wait_seconds

    # -- to the guest ----------------------------------------------------------------------
    def deliver(self, frame, cycle):
        """Send one frame from the engine to the guest at simulated ``cycle``, then hold the
        caller until rxe has answered enough outstanding AckReq frames."""
        index = self.frames_out
        self.frames_out += 1
        frames, note = [bytes(frame)], ""
        if self.to_guest_hook is not None:
            got = self.to_guest_hook(bytes(frame), index)
            frames = [] if got is None else [got] if isinstance(got, (bytes, bytearray)) \
                else list(got)
            if not frames:
                note = "dropped"
            elif len(frames) != 1 or frames[0] != frame:
                note = "altered"
        if not frames:
            self.capture.append(CapturedFrame("to_guest", cycle, time.monotonic(),
                                              bytes(frame), "dropped"))
        for f in frames:
            f = bytes(f)
            self.vm.send_frame(f)
            now = time.monotonic()
            self.capture.append(CapturedFrame("to_guest", cycle, now, f, note))
            info = parse_roce(f)
            if info is None:
                continue
            if self.expect_reply is not None:
                blocked = None if self.expect_reply(f, info) else "no reply expected"
            else:
                blocked = self._blocked.get(info.dest_qp)
                if blocked == info.psn:               # the NAKed PSN is being sent again
                    del self._blocked[info.dest_qp]
                    blocked = None
            if info.ack_req and blocked is None:
                self._outstanding.append(_Outstanding(self._engine_qpn.get(info.dest_qp),
                                                      info.dest_qp, info.psn, cycle, now))
        self.poll(cycle)
        self._hold(cycle, self.window - 1)

    def _hold(self, cycle, allowed):
        t0 = time.monotonic()
        while len(self._outstanding) > allowed:
            oldest = self._outstanding[0]
            left = oldest.sent + self.reply_timeout - time.monotonic()
            if left <= 0:
                self.unanswered.append(self._outstanding.pop(0))
                continue
            self.poll(cycle, timeout=left)
        self._wait_seconds += time.monotonic() - t0

    def flush(self, cycle, quiet=0.2):
        """Wait (bounded) until every AckReq frame is answered, then ``quiet`` seconds more
        for stray replies."""
        self._hold(cycle, 0)
        end = time.monotonic() + quiet
        while (left := end - time.monotonic()) > 0:
            self.poll(cycle, timeout=left)

    # -- from the guest --------------------------------------------------------------------
    def poll(self, cycle, timeout=0.0):
        """Take frames from the guest (waiting up to ``timeout`` for the first); each is
        stamped with ``cycle`` and queued for :meth:`drive_input`. Returns how many."""
        n = 0
        while True:
            frame = self.vm.recv_frame(timeout if n == 0 else 0.0)
            if frame is None:
                return n
            n += 1
            index = self.frames_in
            self.frames_in += 1
            frames = [frame]
            if self.from_guest_hook is not None:
                got = self.from_guest_hook(frame, index)
                frames = [] if got is None else [got] if isinstance(got, (bytes, bytearray)) \
                    else list(got)
                if not frames:
                    self.capture.append(CapturedFrame("from_guest", cycle, time.monotonic(),
                                                      frame, "dropped"))
            for f in frames:
                f = bytes(f)
                self.capture.append(CapturedFrame("from_guest", cycle, time.monotonic(), f))
                self.rx_queue.append((cycle, f))
                info = parse_roce(f)
                if info is not None:
                    self.replies.append((cycle, info, f))
                    self._resolve(info)

    def _resolve(self, info):
        if not info.is_ack:
            return
        engine_qpn = info.dest_qp
        if info.is_nak:
            # rxe ignores this QP's requests after the NAKed PSN until it is sent again
            # (PSN sequence error, RNR) or for good (other NAKs put the QP in ERROR).
            code = info.syndrome
            again = code == 0x60 or code >> 5 == 1
            for guest_qpn, eq in self._engine_qpn.items():
                if eq == engine_qpn:
                    self._blocked[guest_qpn] = info.psn if again else "dead"
            self._outstanding = [o for o in self._outstanding
                                 if not (o.engine_qpn == engine_qpn or o.engine_qpn is None)]
            return
        self._outstanding = [o for o in self._outstanding
                             if not ((o.engine_qpn == engine_qpn or o.engine_qpn is None)
                                     and _psn_le(o.psn, info.psn))]

    def output_frame(self, frame, cycle, *, aborted=False):
        """One frame that left the engine, complete at ``cycle``: :meth:`deliver` it, or count
        it in :attr:`aborted` (an aborted frame never reaches the guest)."""
        if aborted:
            self.aborted += 1
        else:
            self.deliver(frame, cycle)

    def deliver_frames(self, frames, cycle):
        """The slice-based counterpart of :meth:`drive_output`, for an engine simulated in
        slices of cycles (:mod:`sim.backend`: run a slice, pop its frames, call this, repeat).

        ``frames`` are the frames that left the engine during the slice, oldest first, each with
        ``data``, ``last`` (the cycle of its last beat, cycle 0 the first after reset) and
        ``tuser`` (aborted), as :class:`sim.backend.TxFrame`; ``cycle`` is the cycle count at
        the end of the slice. Each frame goes through :meth:`output_frame` at cycle ``last + 1``
        (once its last beat has been transferred: the count :meth:`drive_output` stamps), so rxe
        sees the same frames, in the same order, stamped and paced the same way (held until rxe
        has answered every AckReq frame beyond ``window - 1``) as with :meth:`drive_output`.
        The engine itself runs ahead of rxe by up to one slice, which it cannot notice as long
        as it does not receive rxe's replies (an engine that does must end its slices where it
        waits for them). Then the guest is polled once, replies stamped with ``cycle`` (the
        per-cycle testbench polls every 4096 idle cycles). Returns how many frames were
        delivered."""
        n = 0
        for f in frames:
            self.output_frame(bytes(f.data), int(f.last) + 1, aborted=bool(f.tuser))
            n += not f.tuser
        self.poll(cycle)
        return n

    # -- testbenches -------------------------------------------------------------------------
    async def drive_output(self, ctx, stream, nbytes, *, done, cycle=None):
        """Testbench: hold ``stream.ready`` high, assemble frames ({data, keep, first, last,
        abort} beats, byte 0 in data[7:0]) and :meth:`deliver` each one at the cycle of its
        last beat (aborted frames are not delivered; they are counted in :attr:`aborted`).
        Returns when ``done()`` is true (checked once per cycle). ``cycle`` is a one-element
        list updated with the cycle count, if given."""
        ctx.set(stream.ready, 1)
        cur = bytearray()
        n = 0
        while not done():
            _, _, valid, p = await ctx.tick().sample(stream.valid, stream.payload)
            n += 1
            if cycle is not None:
                cycle[0] = n
            if not valid:
                if n % 4096 == 0:
                    self.poll(n)
                continue
            cur += int(p.data).to_bytes(nbytes, "little")[:int(p.keep).bit_length()]
            if p.last:
                self.output_frame(bytes(cur), n, aborted=bool(getattr(p, "abort", 0)))
                cur = bytearray()
        ctx.set(stream.ready, 0)

    async def drive_input(self, ctx, stream, nbytes, *, done):
        """Testbench for an engine *input* stream (the receive path of later issues): sends
        each queued frame from the guest as one packet, never before the cycle it arrived."""
        n = 0
        while not done():
            if not self.rx_queue or self.rx_queue[0][0] > n:
                await ctx.tick()
                n += 1
                continue
            _, frame = self.rx_queue.popleft()
            chunks = [frame[i:i + nbytes] for i in range(0, len(frame), nbytes)]
            for k, c in enumerate(chunks):
                ctx.set(stream.payload, {"data": int.from_bytes(c, "little"),
                                         "keep": (1 << len(c)) - 1, "first": int(k == 0),
                                         "last": int(k == len(chunks) - 1)})
                ctx.set(stream.valid, 1)
                await ctx.tick().until(stream.ready)
                n += 1
            ctx.set(stream.valid, 0)

    def pcap_frames(self, clock_mhz):
        """``(time, bytes)`` pairs of :attr:`capture` for :func:`sim.pcap.write_pcap`: simulated
        time (cycle / clock), kept strictly increasing in capture order."""
        out, last = [], -1.0
        for c in self.capture:
            if c.note == "dropped":
                continue
            t = max(c.cycle / (clock_mhz * 1e6), last + 1e-9)
            out.append((t, c.data))
            last = t
        return out
