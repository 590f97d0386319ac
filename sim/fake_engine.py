# SPDX-License-Identifier: BSD-2-Clause
"""A fake engine: a UDP server thread that answers CM datagrams with the CM model.

For trying the host tool without hardware and for its tests::

    with FakeEngine("127.0.0.1", port=0) as eng:       # port 0: the kernel picks one
        ... python -m roce_hw.host open --engine-ip 127.0.0.1 --engine-port <eng.port> ...

Datagrams of any length other than 64 bytes are ignored (the RX front end drops them); the source
MAC is unknown to a UDP socket and given to the model as ``mac``; the kernel has verified the UDP
checksum, so the model is handed 0 ("not computed"); a ``reply_port`` of 0 is answered at the
datagram's source port, as the engine does.
"""

import socket
import threading

from roce_hw.model.cm import CmModel
from roce_hw.host import datagram as dg

__all__ = ["FakeEngine"]


class FakeEngine:
    """A :class:`~roce_hw.model.cm.CmModel` behind a UDP socket.

    Parameters
    ----------
    ip : str
        Address to listen on (also the engine IP the model puts in ``loc_ip``).
    port : int
        UDP port (0x4321; 0 lets the kernel choose: see :attr:`port`).
    n_qp : int
        QP table size.
    drop : int
        Drop the first ``drop`` datagrams without answering (to exercise retries).
    stray : int
        Before each of the first ``stray`` replies, send two stray datagrams to the reply
        address: a 10-byte one and a reply whose ``req_type`` does not match.
    on_start : callable, optional
        ``on_start(model, generator)`` is called when a txmeta start was obeyed (before the
        reply is sent); unless ``hold_generator`` the generator is then marked done.
    hold_generator : bool
        Keep the generator busy after a start (to exercise the ``busy`` NAK).
    mac : int
        Source MAC handed to the model for every datagram.
    """

    def __init__(self, ip="127.0.0.1", port=0, *, n_qp=4, drop=0, stray=0, on_start=None,
                 hold_generator=False, mac=0x02_00_00_00_00_FE, cm_pmtu=3):
        self.model = CmModel(n_qp, local_mac=0x02_00_00_00_00_01, local_ip=dg.ip_int(ip),
                             cm_pmtu=cm_pmtu)
        self.ip = ip
        self.drop = drop
        self.stray = stray
        self.on_start = on_start
        self.hold_generator = hold_generator
        self.mac = mac
        self.received = []             # every datagram (bytes, (ip, port)), dropped ones too
        self.lock = threading.Lock()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((ip, port))
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self.sock.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _serve(self):
        while not self._stop.is_set():
            try:
                data, addr = self.sock.recvfrom(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            with self.lock:
                self._one(data, addr)

    def _one(self, data, addr):
        self.received.append((data, addr))
        if self.drop > 0:
            self.drop -= 1
            return
        if len(data) != dg.SIZE:
            return
        gen_before = self.model.generator
        reply = self.model.handle(data, self.mac, dg.ip_int(addr[0]), addr[1], 0)
        gen = self.model.generator
        if gen is not None and gen is not gen_before:
            if self.on_start is not None:
                self.on_start(self.model, gen)
            if not self.hold_generator:
                self.model.generator_done()
        if reply is None:
            return
        dest = (dg.ip_str(reply.dst_ip), reply.dst_port)
        if self.stray > 0:
            self.stray -= 1
            self.sock.sendto(b"not a CM datagram", dest)
            fields = reply.fields
            fields["req_type"] = (fields["req_type"] + 1) & 7
            self.sock.sendto(dg.pack(fields), dest)
        self.sock.sendto(reply.dgram, dest)
