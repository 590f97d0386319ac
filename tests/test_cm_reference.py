# SPDX-License-Identifier: BSD-2-Clause
"""The reference host script against the whole engine.

``send_connection_info.py`` (100G-verilog-RoCEv2-lite, ``Scripts/``) is the host tool the CM
datagram comes from. Every datagram it can send -- each path of its command line (``-r 1``,
``-r 3``, ``-r 4``, ``-s`` with and without ``-i``, ``-t``, ``-rt``) and each of its functions
(``request_qp_info``, ``send_qp_info``, ``modify_qp_rts``, ``close_rem_qp``, ``send_txmeta``
with start 1 and 0) -- is packed here as the script packs it (one ``struct.pack`` per field, its
formats, its defaults: not our codec) into a frame as its UDP socket sends it (scapy: a real UDP
checksum, an ephemeral source port), and replayed into :class:`roce_hw.engine.RoceEngine`
(:func:`sim.replay.replay`).

The engine must do what the reference design does (``rtl/connection_manager/
udp_RoCE_connection_manager.sv``, "Slave" mode, with ``_rx.sv`` and ``_tx.sv``): which requests
are answered, with which code and which fields -- read from the reply as the script's
``decode_udp_packet()`` reads them, bytes 0 to 48 --, which are ignored, which start the
generator with what. Where we deliberately differ (the model's docstring, "Compatibility with
the reference design"), the step says so and checks our behaviour instead. Every frame the
engine sends, its QP table and counters are also the frame-level model's
(:class:`sim.replay.EngineModel`), byte for byte.
"""

import argparse
import ipaddress
import struct

import pytest
from scapy.contrib import roce as sroce
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from roce_hw import proto
from sim import replay as rp
from sim.traffic import CLOCK_MHZ

__all__ = []

# -- the script, as it is ------------------------------------------------------------------------
#: Its defaults: ``-ir`` 22.1.212.11 ("client", but the address it sends to: the engine) and
#: ``-il`` 22.1.212.10 (the address it binds its reply socket to: the host).
ENGINE_IP, HOST_IP = "22.1.212.11", "22.1.212.10"
ENGINE_MAC, HOST_MAC = "02:00:00:00:00:01", "02:00:00:00:00:02"
REM_UDP_PORT = 0x4321
LISTENING_UDP_PORT = 0x4322
REQ_NULL, REQ_OPEN_QP, REQ_SEND_QP_INFO, REQ_MODIFY_QP_RTS, REQ_CLOSE_QP = 0, 1, 2, 3, 4
ACK_NULL, ACK_ACK, ACK_NO_QP, ACK_NAK, ACK_ERROR = 0, 1, 2, 3, 7


def ip_int(text):
    return int(ipaddress.IPv4Address(text))


def _message(qpinfo_flags, loc_qpn, loc_psn, loc_r_key, loc_base_addr, loc_ip, rem_qpn, rem_psn,
             rem_r_key, rem_base_addr, rem_ip, port, txmeta_flags, length, count, rate):
    """MESSAGE as every function of the script builds it, field by field."""
    message = b""
    message += struct.pack(">B", qpinfo_flags)
    message += struct.pack(">L", loc_qpn)
    message += struct.pack(">L", loc_psn)
    message += struct.pack(">L", loc_r_key)
    message += struct.pack(">Q", loc_base_addr)
    message += struct.pack(">L", ip_int(loc_ip))
    message += struct.pack(">L", rem_qpn)
    message += struct.pack(">L", rem_psn)
    message += struct.pack(">L", rem_r_key)
    message += struct.pack(">Q", rem_base_addr)
    message += struct.pack(">L", ip_int(rem_ip))
    message += struct.pack(">H", port)
    message += struct.pack(">B", txmeta_flags)
    message += struct.pack(">L", length)
    message += struct.pack(">L", count)
    message += struct.pack(">L", rate)
    return message


# Each function returns (MESSAGE, the UDP port it is sent to).
def request_qp_info(rem_ip_addr="22.1.212.10", loc_ip_addr="22.1.212.11", loc_qpn=0x100,
                    loc_psn=0x0, loc_r_key=0x1234, loc_base_addr=0x12345678):
    flags = 0x1 | (REQ_OPEN_QP << 1) | (0 << 4) | (ACK_NULL << 5)
    return _message(flags, loc_qpn, loc_psn, loc_r_key, loc_base_addr, loc_ip_addr, 0, 0, 0, 0,
                    rem_ip_addr, LISTENING_UDP_PORT, 0, 0, 0, 0), REM_UDP_PORT


def send_qp_info(rem_ip_addr="22.1.212.10", rem_qpn=0x100, rem_psn=0x0, rem_r_key=0x1234,
                 rem_base_addr=0x12345678, loc_ip_addr="22.1.212.11", loc_qpn=0x100,
                 loc_psn=0x0, loc_r_key=0x1234, loc_base_addr=0x12345678):
    flags = 0x1 | (REQ_SEND_QP_INFO << 1) | (0 << 4) | (ACK_NULL << 5)
    return _message(flags, loc_qpn, loc_psn, loc_r_key, loc_base_addr, loc_ip_addr, rem_qpn,
                    rem_psn, rem_r_key, rem_base_addr, rem_ip_addr, REM_UDP_PORT, 0, 0, 0,
                    0), LISTENING_UDP_PORT


def _modify_or_close(req, rem_ip_addr, rem_qpn, rem_psn, rem_r_key, rem_base_addr, loc_ip_addr,
                     loc_qpn, loc_psn, loc_r_key, loc_base_addr):
    flags = 0x1 | (req << 1) | (0 << 4) | (ACK_NULL << 5)
    return _message(flags, loc_qpn, loc_psn, loc_r_key, loc_base_addr, loc_ip_addr, rem_qpn,
                    rem_psn, rem_r_key, rem_base_addr, rem_ip_addr, LISTENING_UDP_PORT, 0, 0, 0,
                    0), REM_UDP_PORT


def modify_qp_rts(rem_ip_addr="22.1.212.10", rem_qpn=0x100, rem_psn=0x0, rem_r_key=0x1234,
                  rem_base_addr=0x12345678, loc_ip_addr="22.1.212.11", loc_qpn=0x100,
                  loc_psn=0x0, loc_r_key=0x1234, loc_base_addr=0x12345678):
    return _modify_or_close(REQ_MODIFY_QP_RTS, rem_ip_addr, rem_qpn, rem_psn, rem_r_key,
                            rem_base_addr, loc_ip_addr, loc_qpn, loc_psn, loc_r_key,
                            loc_base_addr)


def close_rem_qp(rem_ip_addr="22.1.212.10", rem_qpn=0x100, rem_psn=0x0, rem_r_key=0x1234,
                 rem_base_addr=0x12345678, loc_ip_addr="22.1.212.11", loc_qpn=0x100,
                 loc_psn=0x0, loc_r_key=0x1234, loc_base_addr=0x12345678):
    return _modify_or_close(REQ_CLOSE_QP, rem_ip_addr, rem_qpn, rem_psn, rem_r_key,
                            rem_base_addr, loc_ip_addr, loc_qpn, loc_psn, loc_r_key,
                            loc_base_addr)


def send_txmeta(rem_ip_addr="22.1.212.11", loc_ip_addr="22.1.212.10", rem_qpn=0x11, loc_qpn=0x12,
                rdma_length=0x0, n_trasnfers=1, msg_wait_ctr=0, start_flag=0, immd_flag=0,
                txtype_flag=1):
    flags = 0x0 | (REQ_NULL << 1) | (0 << 4) | (ACK_NULL << 5)
    txmeta_flags = 0x1 | (start_flag << 1) | (immd_flag << 2) | (txtype_flag << 3)
    return _message(flags, loc_qpn, 0, 0, 0, loc_ip_addr, rem_qpn, 0, 0, 0, rem_ip_addr,
                    0x0, txmeta_flags, rdma_length, n_trasnfers, msg_wait_ctr), REM_UDP_PORT


def _parser():
    """The script's command line (its options, types, defaults and actions)."""
    p = argparse.ArgumentParser()
    p.add_argument("-ir", "--rem_ip_addr", type=str, default="22.1.212.11")
    p.add_argument("-il", "--loc_ip_addr", type=str, default="22.1.212.10")
    p.add_argument("-rr", "--rem_rkey", type=int, default=0x234)
    p.add_argument("-lr", "--loc_rkey", type=int, default=0x234)
    p.add_argument("-ra", "--rem_base_addr", type=int, default=0x12341242)
    p.add_argument("-la", "--loc_base_addr", type=int, default=0x12341242)
    p.add_argument("-rq", "--rem_qpn", type=int, default=0x11)
    p.add_argument("-lq", "--loc_qpn", type=int, default=0x12)
    p.add_argument("-rp", "--rem_psn", type=int, default=0x0)
    p.add_argument("-lp", "--loc_psn", type=int, default=0x0)
    p.add_argument("-l", "--length", type=int, default=128)
    p.add_argument("-n", "--nTransfers", type=int, default=0x1)
    p.add_argument("-rt", "--msgrate", type=int, default=0x0)
    p.add_argument("-c", "--clock", type=int, default=300e6)
    p.add_argument("-i", "--immediate", action="store_true")
    p.add_argument("-t", "--txtype", action="store_false")
    p.add_argument("-s", "--start", action="store_true")
    p.add_argument("-r", "--request", type=int, default=0x0)
    return p


def script(argv):
    """``(MESSAGE, port)`` that ``python send_connection_info.py <argv>`` sends (its
    ``__main__``), or ``None`` when it sends nothing."""
    args = _parser().parse_args(argv.split())
    if args.start:
        # np.uint32(clock / rate): the float truncated
        rate = 0 if args.msgrate == 0 else int(args.clock / args.msgrate) & 0xFFFFFFFF
        return send_txmeta(loc_ip_addr=args.loc_ip_addr, rem_ip_addr=args.rem_ip_addr,
                           rem_qpn=args.rem_qpn, n_trasnfers=args.nTransfers,
                           msg_wait_ctr=rate, rdma_length=args.length, start_flag=args.start,
                           immd_flag=args.immediate, txtype_flag=args.txtype)
    common = dict(loc_ip_addr=args.loc_ip_addr, rem_ip_addr=args.rem_ip_addr,
                  loc_qpn=args.loc_qpn, loc_psn=args.loc_psn, loc_r_key=args.loc_rkey,
                  loc_base_addr=args.loc_base_addr)
    if args.request == REQ_OPEN_QP:
        return request_qp_info(**common)
    if args.request == REQ_CLOSE_QP:
        return close_rem_qp(**common, rem_qpn=args.rem_qpn, rem_psn=0, rem_r_key=0,
                            rem_base_addr=0)
    if args.request == REQ_MODIFY_QP_RTS:
        return modify_qp_rts(**common, rem_qpn=args.rem_qpn, rem_psn=0, rem_r_key=0,
                             rem_base_addr=0)
    return None


def decode(payload):
    """A reply as ``decode_udp_packet()`` reads it (bytes 0 to 48)."""
    flags = struct.unpack(">B", payload[0:1])[0]
    return {"valid": flags & 1, "req": (flags >> 1) & 0x07, "ack_valid": (flags >> 4) & 0x01,
            "ack": (flags >> 5) & 0x07,
            "loc_qpn": struct.unpack(">L", payload[1:5])[0],
            "loc_psn": struct.unpack(">L", payload[5:9])[0],
            "loc_r_key": struct.unpack(">L", payload[9:13])[0],
            "loc_base_addr": struct.unpack(">Q", payload[13:21])[0],
            "loc_ip": struct.unpack(">L", payload[21:25])[0],
            "rem_qpn": struct.unpack(">L", payload[25:29])[0],
            "rem_psn": struct.unpack(">L", payload[29:33])[0],
            "rem_r_key": struct.unpack(">L", payload[33:37])[0],
            "rem_base_addr": struct.unpack(">Q", payload[37:45])[0],
            "rem_ip": struct.unpack(">L", payload[45:49])[0]}


# -- the frames ----------------------------------------------------------------------------------
#: The source ports of the script's unbound sockets (the kernel's ephemeral range), one a step.
def ephemeral(k):
    return 0xC000 + 0x123 * (k + 1)


def frame(message, port, sport):
    """What the host's UDP socket puts on the wire (the kernel computes the UDP checksum)."""
    return bytes(Ether(src=HOST_MAC, dst=ENGINE_MAC) / IP(src=HOST_IP, dst=ENGINE_IP, flags="DF")
                 / UDP(sport=sport, dport=port) / Raw(message))


N_QP = 4
HOST = {"loc_qpn": 0x12, "loc_psn": 0, "loc_r_key": 0x234, "loc_base_addr": 0x12341242,
        "loc_ip": ip_int(HOST_IP)}


def ref_ack(req, *, loc_qpn, loc_psn=0, loc_r_key=0, loc_base_addr=0, rem=HOST):
    """The reference's ACK reply fields (bytes 0-48): its own loc_*, the request's loc_* as
    rem_*."""
    return {"valid": 1, "req": req, "ack_valid": 1, "ack": ACK_ACK, "loc_qpn": loc_qpn,
            "loc_psn": loc_psn, "loc_r_key": loc_r_key, "loc_base_addr": loc_base_addr,
            "loc_ip": ip_int(ENGINE_IP), **{"rem" + k[3:]: v for k, v in rem.items()}}


class Step:
    """One invocation: the datagram, what the reference does with it (``ref``: ``None`` no
    reply, an ack code, or a dict of the reply's fields), and where we differ (``ours``: what
    we do instead, and ``why``)."""

    def __init__(self, what, sent, ref, *, ours="same", why=None, gen=None, wait=400):
        self.what, (self.message, self.port) = what, sent
        self.ref, self.ours, self.why, self.gen, self.wait = ref, ours, why, gen, wait


def steps():
    open_ack = ref_ack(REQ_OPEN_QP, loc_qpn=256)
    modify_ack = ref_ack(REQ_MODIFY_QP_RTS, loc_qpn=256)

    def opened(qpn, loc_qpn):
        return ref_ack(REQ_OPEN_QP, loc_qpn=qpn, rem=dict(HOST, loc_qpn=loc_qpn))
    return [
        Step("send_qp_info()", send_qp_info(rem_ip_addr=ENGINE_IP, loc_ip_addr=HOST_IP), None),
        Step("-r 1", script("-r 1"), open_ack),
        Step("-r 3 (-rq 0x11: not a QP of the engine)", script("-r 3"), ACK_ERROR, ours=ACK_NAK,
             why="a QPN out of range is a NAK (the reference's table answers ERROR, or works on "
                 "the row its low bits name)"),
        Step("-r 3 -rq 256", script("-r 3 -rq 256"), modify_ack),
        Step("-s", script("-s -rq 256"), None, ours=ACK_ACK, why="we reply to txmeta (at the UDP "
             "source port: its reply_port is 0)", gen=(0x0A, 128, 1, 0)),
        Step("-s -i", script("-s -rq 256 -l 300 -n 2 -i"), None, ours=ACK_ACK, why="as -s",
             gen=(0x0B, 300, 2, 0)),
        Step("-s -t", script("-s -rq 256 -l 300 -n 2 -t"), None, ours=ACK_ACK, why="as -s",
             gen=(0x04, 300, 2, 0)),
        Step("-s -i -t", script("-s -rq 256 -l 300 -n 2 -i -t"), None, ours=ACK_ACK,
             why="as -s", gen=(0x05, 300, 2, 0)),
        Step("-s -rt 1000000", script("-s -rq 256 -l 64 -n 3 -rt 1000000"), None, ours=ACK_ACK,
             why="as -s", gen=(0x0A, 64, 3, 300)),
        Step("send_txmeta(start_flag=0)", send_txmeta(rem_ip_addr=ENGINE_IP, loc_ip_addr=HOST_IP,
                                                      rem_qpn=256, start_flag=0),
             None, ours=ACK_ACK, why="a stop is obeyed and answered (nothing runs)"),
        Step("send_qp_info() to the CM port", (send_qp_info(rem_ip_addr=ENGINE_IP,
                                                            loc_ip_addr=HOST_IP)[0],
                                               REM_UDP_PORT), None),
        Step("-r 4 (-rq 0x11)", script("-r 4"), ACK_NAK),
        Step("-r 4 -rq 256", script("-r 4 -rq 256"), ref_ack(REQ_CLOSE_QP, loc_qpn=256),
             ours="loc_psn", why="loc_psn is the QP's send PSN, after the generator's packets "
                                 "(the reference echoes rem_psn, 0)"),
        Step("-r 4 -rq 256 again", script("-r 4 -rq 256"), ACK_ERROR, ours=ACK_NAK,
             why="closing a free QP is a NAK (the reference's table answers ERROR)"),
        # the reference's QPN FIFO gives them back in the order they were freed: 256 last
        *[Step(f"-r 1 -lq {q:#x}", script(f"-r 1 -lq {q}"), opened(fifo, q),
               ours=opened(256 + k, q), why="the lowest free QP, not the order they were freed")
          for k, (q, fifo) in enumerate(zip(range(0x20, 0x20 + N_QP), (257, 258, 259, 256)))],
        Step("-r 1 -lq 0x30: full", script(f"-r 1 -lq {0x30}"), ACK_NO_QP),
        Step("-r 1 -lq 0x21 again", script(f"-r 1 -lq {0x21}"), ACK_NO_QP,
             ours=opened(257, 0x21), why="a re-open of the same (IP, QPN) keeps its QP"),
    ]


def schedule(all_steps, width):
    """Start cycle of each step's frame: the previous one answered, its generator run done."""
    starts, at = [], 50
    for s in all_steps:
        starts.append(at)
        run = 0
        if s.gen:
            _, length, count, period = s.gen
            run = count * (length // (width // 8) + 60 + period)
        at += s.wait + run
    return starts


def test_the_script_is_replicated():
    """No simulation: the command line's paths and the defaults, as the script has them."""
    assert script("") is None and script("-r 2") is None and script("-r 5") is None
    assert script("-r 7") is None
    msg, port = script("-r 1")
    assert port == REM_UDP_PORT and len(msg) == proto.CM_DATAGRAM_BYTES
    assert decode(msg)["loc_qpn"] == 0x12 and decode(msg)["rem_ip"] == ip_int(ENGINE_IP)
    msg, _ = script("-s -l 16000 -n 100")
    assert msg[0] == 0 and msg[49:51] == bytes(2) and msg[51] == 0b1011    # WRITE, start
    assert struct.unpack(">LLL", msg[52:64]) == (16000, 100, 0)
    msg, _ = script("-s -rt 1000000 -t -i")
    assert msg[51] == 0b0111 and struct.unpack(">L", msg[60:64])[0] == 300
    assert send_qp_info()[1] == LISTENING_UDP_PORT


def run(width):
    all_steps = steps()
    frames = [frame(s.message, s.port, ephemeral(k)) for k, s in enumerate(all_steps)]
    starts = schedule(all_steps, width)
    times = [c / (CLOCK_MHZ[width] * 1e6) for c in starts]
    kw = dict(width=width, n_qp=N_QP, local_mac=rp.parse_mac(ENGINE_MAC),
              local_ip=ip_int(ENGINE_IP), timing="capture", times=times, drain=600)
    return all_steps, frames, starts, rp.replay(frames, **kw), rp.replay(frames, model=True, **kw)


def _kind(f):
    p = Ether(f)
    if UDP in p and p[UDP].sport == proto.CM_UDP_PORT:
        return "cm"
    return "data" if UDP in p and p[UDP].dport == proto.ROCEV2_UDP_PORT else "?"


@pytest.mark.parametrize("width", [64])
def test_every_script_request_through_the_engine(width):
    all_steps, frames, starts, hw, model = run(width)
    # the frame-level model, byte for byte: replies, data, rx_other, QP table, counters
    for kind in ("cm", "data"):
        assert [f for _, f in hw.tx if _kind(f) == kind] == \
            [f for _, f in model.tx if _kind(f) == kind], kind
    assert all(_kind(f) != "?" for _, f in hw.tx)
    assert [f for _, f in hw.other] == [f for _, f in model.other] == [frames[0]]
    assert [{k: v for k, v in r.items()} for r in hw.qp_table] == model.qp_table
    assert hw.counters["cm"] == model.counters["cm"]
    assert hw.counters["rx"] == model.counters["rx"]

    # step by step against the reference
    ends = starts[1:] + [hw.cycles + 1]
    sent = 0                                   # data packets so far (PSNs from 0, one each)
    for k, s in enumerate(all_steps):
        out = [(c, f) for c, f in hw.tx if starts[k] <= c < ends[k]]
        replies = [Ether(f) for _, f in out if _kind(f) == "cm"]
        data = [Ether(f) for _, f in out if _kind(f) == "data"]
        want = {"same": s.ref, "loc_psn": s.ref}.get(s.ours, s.ours) \
            if isinstance(s.ours, str) else s.ours
        if s.ours == "loc_psn":
            want = dict(s.ref, loc_psn=sent)
        where = f"step {k} ({s.what})"
        if want is None:
            assert replies == [], where
        else:
            (reply,) = replies
            assert reply[IP].dst == HOST_IP and reply[IP].src == ENGINE_IP, where
            # the reply port the datagram names, or its UDP source port
            named = struct.unpack(">H", s.message[49:51])[0]
            assert reply[UDP].dport == (named or ephemeral(k)), where
            got = decode(bytes(reply[UDP].payload))
            if isinstance(want, dict):
                assert got == want, where
            else:
                assert got["ack_valid"] == 1 and got["ack"] == want, where
        if s.gen:
            opcode, length, count, period = s.gen
            assert len(data) == count, where
            for n, p in enumerate(data):
                bth = p[sroce.BTH]
                assert (bth.opcode, bth.dqpn, bth.psn) == (opcode, HOST["loc_qpn"], sent), where
                sent += 1
                assert len(bytes(p[UDP].payload)) - 12 - 4 - (16 if opcode >= 6 else 0) - \
                    (4 if opcode in (0x05, 0x0B) else 0) == length, where
            # -rt: the messages leave about `period` cycles apart (the period counts from a
            # WR to the next; the first frame of a run leaves a few cycles later after its WR)
            cycles = [c for c, f in out if _kind(f) == "data"]
            assert all(period - 10 <= b - a for a, b in zip(cycles, cycles[1:])), where
            if period:
                assert all(b - a <= period + 20 for a, b in zip(cycles, cycles[1:])), where
        else:
            assert data == [], where
    # what the step notes say we do differently is what the model's docstring says
    from roce_hw.model import cm
    for s in all_steps:
        assert s.ours == "same" or s.why, s.what
    assert "Compatibility with the reference design" in cm.__doc__


@pytest.mark.slow
def test_the_reference_start_at_full_size():
    """``-s -l 16000 -n 100`` (the reproduction of issue 33 item 1.3) runs to the end: 100
    RDMA WRITEs of 16000 bytes (16 packets each at PMTU 1024), every byte the model's."""
    width = 512
    sends = [script("-r 1"), script("-r 3 -rq 256"), script("-s -rq 256 -l 16000 -n 100")]
    frames = [frame(m, p, ephemeral(k)) for k, (m, p) in enumerate(sends)]
    starts = [50, 450, 850]
    kw = dict(width=width, n_qp=2, local_mac=rp.parse_mac(ENGINE_MAC), local_ip=ip_int(ENGINE_IP),
              timing="capture", times=[c / (CLOCK_MHZ[width] * 1e6) for c in starts], drain=600)
    hw, model = rp.replay(frames, **kw), rp.replay(frames, model=True, **kw)
    data = [f for _, f in hw.tx if _kind(f) == "data"]
    assert len(data) == 100 * 16
    assert data == [f for _, f in model.tx if _kind(f) == "data"]
    assert hw.counters["cm"] == model.counters["cm"] and hw.counters["cm"]["ok"] == 3
    assert hw.qp_table == model.qp_table
