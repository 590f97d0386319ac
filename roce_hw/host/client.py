# SPDX-License-Identifier: BSD-2-Clause
"""A CM client: requests to the engine over UDP with a timeout and retries.

:class:`CmClient` binds one UDP socket to the reply port (the datagram's ``reply_port`` names
it), sends each request to ``engine_ip:0x4321`` and waits for the matching reply: one from the
engine's address whose ``ack_valid`` is set and whose ``valid``, ``req_type`` and ``tx_valid``
are the request's (the engine echoes them, also in an ERROR reply). Anything else arriving on the
socket is a stray datagram: reported through ``log`` and ignored. Without a matching reply within
``timeout`` seconds the request is sent again, ``attempts`` times in all; then
:class:`NoReply` is raised.

Every request is safe to repeat: a repeated OPEN of the same (IP, QPN) re-opens the same engine
QP, a repeated MODIFY_QP_RTS is RTS -> RTS; only a repeated CLOSE_QP whose first reply was lost
is answered NAK (the QP is already free).
"""

import socket
import sys
import time

from .. import proto
from . import datagram as dg

__all__ = ["CmClient", "NoReply", "route_source_ip"]


class NoReply(Exception):
    """No matching reply after every attempt."""


def route_source_ip(dest_ip, port=proto.CM_UDP_PORT):
    """The local IPv4 address the kernel uses to reach ``dest_ip`` (nothing is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((dest_ip, port))
        return s.getsockname()[0]


def _stderr(msg):
    print(msg, file=sys.stderr, flush=True)


class CmClient:
    """Requests to one engine.

    Parameters
    ----------
    engine_ip : str
        The engine's IPv4 address.
    local_ip : str, optional
        Our address, sent as ``loc_ip`` (the engine requires it to be the frame's source IP for
        an OPEN). Default: the address the kernel routes ``engine_ip`` from.
    bind_ip : str, optional
        Address the socket binds to (default ``local_ip``, so the source IP is ``loc_ip``).
    reply_port : int
        UDP port we listen on and name in ``reply_port`` (default 0x4322); 0 lets the kernel
        choose one.
    engine_port : int
        The engine's CM port (0x4321).
    timeout : float
        Seconds to wait for a reply per attempt.
    attempts : int
        Sends per request (the first one included), at least 1.
    log : callable, optional
        ``log(text)`` for notes (stray datagrams, retries); default: standard error.
    """

    def __init__(self, engine_ip, *, local_ip=None, bind_ip=None,
                 reply_port=proto.CM_REPLY_UDP_PORT, engine_port=proto.CM_UDP_PORT,
                 timeout=1.0, attempts=3, log=None):
        self.engine_ip = str(dg.ip_str(dg.ip_int(engine_ip)))
        self.engine_port = int(engine_port)
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, not {timeout}")
        if attempts < 1:
            raise ValueError(f"attempts must be at least 1, not {attempts}")
        self.timeout = float(timeout)
        self.attempts = int(attempts)
        self.log = log or _stderr
        self.local_ip = dg.ip_str(dg.ip_int(local_ip)) if local_ip else \
            route_source_ip(self.engine_ip, self.engine_port)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.sock.bind((self.local_ip if bind_ip is None else bind_ip, int(reply_port)))
        except OSError:
            self.sock.close()
            raise
        self.reply_port = self.sock.getsockname()[1]
        #: Sends of the last request (1 = answered at the first attempt).
        self.last_attempts = 0
        self.strays = 0

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- the exchange ---------------------------------------------------------------------------
    def _mismatch(self, req, data, addr):
        """Why ``data`` from ``addr`` is not the reply to ``req`` (``None`` if it is)."""
        if addr[0] != self.engine_ip or addr[1] != self.engine_port:
            return f"from {addr[0]}:{addr[1]}, not the engine {self.engine_ip}:{self.engine_port}"
        if len(data) != dg.SIZE:
            return f"{len(data)} bytes, not {dg.SIZE}"
        rep = dg.unpack(data)
        if not rep["ack_valid"]:
            return "ack_valid is 0 (not a reply)"
        for k in ("valid", "req_type", "tx_valid"):
            if rep[k] != req[k]:
                return (f"{k} {rep[k]} ({dg.req_name(rep[k]) if k == 'req_type' else rep[k]}) "
                        f"does not match the request's {req[k]}")
        return None

    def request(self, fields):
        """Send ``fields`` (a datagram ``dict``; ``reply_port`` and ``loc_ip`` are filled in
        when 0) and return the reply's fields. Raises :class:`NoReply`."""
        req = dg.datagram(**fields)
        if not req["reply_port"]:
            req["reply_port"] = self.reply_port
        if not req["loc_ip"]:
            req["loc_ip"] = dg.ip_int(self.local_ip)
        data = dg.pack(req)
        dest = (self.engine_ip, self.engine_port)
        name = dg.req_name(req["req_type"]) if req["valid"] else "txmeta"
        for attempt in range(1, self.attempts + 1):
            if attempt > 1:
                self.log(f"no reply to {name} within {self.timeout:g} s, sending again "
                         f"(attempt {attempt} of {self.attempts})")
            self.sock.sendto(data, dest)
            deadline = time.monotonic() + self.timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.sock.settimeout(left)
                try:
                    rdata, addr = self.sock.recvfrom(65536)
                except socket.timeout:
                    break
                except ConnectionRefusedError:       # ICMP port unreachable from a probe
                    continue
                why = self._mismatch(req, rdata, addr)
                if why is None:
                    self.last_attempts = attempt
                    return dg.unpack(rdata)
                self.strays += 1
                self.log(f"ignoring a stray datagram: {why}")
        self.last_attempts = self.attempts
        raise NoReply(f"no reply to {name} from {self.engine_ip}:{self.engine_port} after "
                      f"{self.attempts} attempt{'s' if self.attempts > 1 else ''} of "
                      f"{self.timeout:g} s")

    # -- the requests --------------------------------------------------------------------------
    def open(self, qpn, *, psn=0, r_key=0, base_addr=0, engine_psn=0, engine_qpn=0):
        """OPEN_QP (see :func:`roce_hw.host.datagram.open_request`)."""
        return self.request(dg.open_request(
            loc_ip=self.local_ip, qpn=qpn, psn=psn, r_key=r_key, base_addr=base_addr,
            engine_psn=engine_psn, engine_qpn=engine_qpn, reply_port=self.reply_port))

    def modify_rts(self, engine_qpn, qpn, *, psn=0, r_key=0, base_addr=0, engine_psn=0):
        """MODIFY_QP_RTS."""
        return self.request(dg.rts_request(
            loc_ip=self.local_ip, engine_qpn=engine_qpn, qpn=qpn, psn=psn, r_key=r_key,
            base_addr=base_addr, engine_psn=engine_psn, reply_port=self.reply_port))

    def close_qp(self, engine_qpn, *, qpn=0):
        """CLOSE_QP."""
        return self.request(dg.close_request(loc_ip=self.local_ip, engine_qpn=engine_qpn,
                                             qpn=qpn, reply_port=self.reply_port))

    def info(self, engine_qpn, *, qpn=0):
        """FETCH_QP_INFO."""
        return self.request(dg.info_request(loc_ip=self.local_ip, engine_qpn=engine_qpn,
                                            qpn=qpn, reply_port=self.reply_port))

    def start(self, engine_qpn, *, length, count, period=0, write=True, imm=False, qpn=0):
        """txmeta start: the engine's generator sends ``count`` messages."""
        return self.request(dg.txmeta_request(
            loc_ip=self.local_ip, engine_qpn=engine_qpn, start=True, length=length, count=count,
            period=period, write=write, imm=imm, qpn=qpn, reply_port=self.reply_port))

    def stop(self, engine_qpn, *, qpn=0):
        """txmeta stop."""
        return self.request(dg.txmeta_request(loc_ip=self.local_ip, engine_qpn=engine_qpn,
                                              start=False, qpn=qpn, reply_port=self.reply_port))
