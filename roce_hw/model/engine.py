# SPDX-License-Identifier: BSD-2-Clause
"""The whole engine's frame-level model (:class:`roce_hw.engine.RoceEngine`, timing aside): frames
in, frames out, QP table and counters, composed of the blocks' models. It is the oracle of the
engine's replay, fuzz and end-to-end tests (``sim.replay --model``, ``tests/test_replay.py``,
``tests/test_engine_fuzz.py``). Pure Python (no Amaranth import)."""

from .. import proto
from .cm import CmModel, generator_messages
from .header import insert
from .requester import RequesterModel
from .rx import RxCounterModel, classify

__all__ = ["arp_reply_frame", "EngineModel"]


def arp_reply_frame(*, local_mac, local_ip, sha, spa):
    """The engine's ARP reply to ``sha``/``spa`` (RFC 826; padded to 60 bytes)."""
    return insert((proto.ETH, proto.ARP, proto.ARP_PAD), {
        "eth": {"dst": sha, "src": local_mac, "ethertype": proto.ETHERTYPE_ARP},
        "arp": {"oper": int(proto.ArpOper.REPLY), "sha": local_mac, "spa": local_ip,
                "tha": sha, "tpa": spa},
    })


class EngineModel:
    """The whole engine at frame level, in Python: what :class:`roce_hw.engine.RoceEngine`
    must do with each received frame (timing aside), composed of the project's models.

    * :func:`roce_hw.model.rx.classify` (the RX front end's rules and counter names) decides;
    * an ARP request for ``local_ip`` -> :func:`arp_reply_frame`;
    * a CM datagram -> :class:`~roce_hw.model.cm.CmModel` and its reply frame; a generator start
      then sends all its messages at once (:func:`roce_hw.model.cm.generator_messages` posted
      to a :class:`~roce_hw.model.requester.RequesterModel` sharing the CM's QP rows, so PSNs
      continue and ``next_psn`` is written back);
    * a RoCEv2 frame with a good iCRC -> counted, nothing sent (the ACK path is a later issue's);
    * ``other`` -> ``rx_other`` unchanged (dropped and counted with ``rx_other=False``).

    No queue ever overflows here (the hardware's ``*_full`` counters stay 0 in the model).
    :meth:`receive` returns ``(tx frames, rx_other frames)`` for one frame; the counters are
    :attr:`counters` ``{"rx": ..., "cm": ...}`` as the hardware's ``counters.rx``/``.cm``.
    """

    def __init__(self, n_qp, *, local_mac, local_ip, cm_pmtu=int(proto.Pmtu.MTU_1024), ttl=64,
                 ack_req_every=64, ip_id_start=0, rx_other=True):
        self.local_mac, self.local_ip = int(local_mac), int(local_ip)
        self.rx_other = rx_other
        self.cm = CmModel(n_qp, local_mac=local_mac, local_ip=local_ip, cm_pmtu=cm_pmtu,
                          ttl=ttl)
        self.req = RequesterModel(n_qp=n_qp, ack_req_every=ack_req_every, ttl=ttl,
                                  ip_id_start=ip_id_start, local_mac=self.local_mac,
                                  local_ip=self.local_ip)
        self.req.qps.rows = self.cm.rows          # one QP table
        self.rx = RxCounterModel()

    @property
    def rows(self):
        return self.cm.rows

    @property
    def counters(self):
        return {"rx": dict(self.rx.counts), "cm": dict(self.cm.counters)}

    def receive(self, frame, bad=False):
        frame = bytes(frame)
        res = classify(frame, bad=bad, local_mac=self.local_mac, local_ip=self.local_ip)
        self.rx.add(res, taken=res.kind != "other" or self.rx_other)
        if res.kind == "arp":
            return [arp_reply_frame(local_mac=self.local_mac, local_ip=self.local_ip,
                                    sha=res.fields["sha"], spa=res.fields["spa"])], []
        if res.kind == "cm":
            f = res.fields
            reply = self.cm.handle(proto.CM_DATAGRAM.pack(f["dgram"]), f["src_mac"], f["src_ip"],
                                   f["src_port"], f["udp_checksum"])
            out = [] if reply is None else [self.cm.frame(reply)]
            gen = self.cm.generator
            if gen is not None:
                for wr in generator_messages(gen):
                    sent = self.req.post(qp=gen.qp, opcode=wr["opcode"], payload=wr["payload"],
                                         wr_id=wr["wr_id"], remote_addr=wr["remote_addr"],
                                         r_key=wr["r_key"], imm=wr["imm"] or 0)
                    out += [s.frame for s in sent if s.frame is not None]
                self.cm.generator_done()
            return out, []
        if res.kind == "other" and self.rx_other:
            return [], [frame]
        return [], []
