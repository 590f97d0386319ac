# SPDX-License-Identifier: BSD-2-Clause
"""Golden model (roce_hw.model) against scapy.contrib.roce, zlib and the rxe PSN rule."""

import ipaddress
import random
import re
import struct
import zlib

import pytest
from scapy.contrib import roce as sroce
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Dot1Q, Ether
from scapy.packet import Raw

from roce_hw import proto
from roce_hw.proto import Opcode, Transport, WrOpcode
from roce_hw.model import icrc as micrc
from roce_hw.model.packet import (QPPath, build_ack_frame, build_cnp_frame,
                                  build_frame, build_request_frame, parse_frame)
from roce_hw.model.requester import PathRequester
from roce_hw.model.psn import (psn_add, psn_ahead, psn_compare, psn_diff, psn_ge, psn_gt,
                               psn_in_window, psn_le, psn_lt)
from roce_hw.model.segment import PacketSpec, segment_message
from sim.oracle import protocol_icrc, protocol_icrc_bytes
from sim.bfm import mac_str

__all__ = []

SEED = 4791
PMTUS = (256, 512, 1024, 2048, 4096)
WR_OPS = (WrOpcode.SEND, WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM)


def _ip(v, version):
    return str(ipaddress.IPv4Address(v) if version == 4 else ipaddress.IPv6Address(v))


# --- random packet cases ------------------------------------------------------------------------

def _random_case(rng):
    """Random field values for one frame; the same dict drives the model and scapy."""
    op = rng.choice(list(Opcode))
    version = rng.choice((4, 6))
    c = {
        "opcode": op,
        "ip_version": version,
        "vlan": rng.choice((None, {"pcp": rng.getrandbits(3), "dei": rng.getrandbits(1),
                                   "vid": rng.getrandbits(12)})),
        "dst_mac": rng.getrandbits(48), "src_mac": rng.getrandbits(48),
        "src_ip": rng.getrandbits(32 if version == 4 else 128),
        "dst_ip": rng.getrandbits(32 if version == 4 else 128),
        "sport": rng.getrandbits(16),
        "ttl": rng.getrandbits(8), "tos": rng.getrandbits(8), "ip_id": rng.getrandbits(16),
        "df": rng.getrandbits(1), "flow_label": rng.getrandbits(20),
        "bth": {"se": rng.getrandbits(1), "migreq": rng.getrandbits(1), "tver": rng.getrandbits(4),
                "p_key": rng.getrandbits(16), "fecn": rng.getrandbits(1),
                "becn": rng.getrandbits(1), "resv6": rng.getrandbits(6),
                "dest_qp": rng.getrandbits(24), "ack_req": rng.getrandbits(1),
                "resv7": rng.getrandbits(7), "psn": rng.getrandbits(24)},
        "headers": {},
        "payload": rng.randbytes(rng.choice((0, 1, 2, 3, 4, rng.randrange(300)))),
    }
    for h in proto.opcode_headers(op):
        c["headers"][h.name] = {n: rng.getrandbits(w) for n, w in h.fields}
    return c


def _model_frame(c):
    if c["ip_version"] == 4:
        ip = {"dscp": c["tos"] >> 2, "ecn": c["tos"] & 3, "identification": c["ip_id"],
              "flag_df": c["df"], "ttl": c["ttl"], "src": c["src_ip"], "dst": c["dst_ip"]}
    else:
        ip = {"traffic_class": c["tos"], "flow_label": c["flow_label"], "hop_limit": c["ttl"],
              "src": c["src_ip"], "dst": c["dst_ip"]}
    return build_frame(c["opcode"], eth={"dst": c["dst_mac"], "src": c["src_mac"]},
                       vlan=c["vlan"], ip_version=c["ip_version"], ip=ip,
                       udp={"src_port": c["sport"]}, bth=c["bth"], headers=c["headers"],
                       payload=c["payload"])


def _struct_ext(c):
    """Extension headers packed with struct (scapy has no RETH/ImmDt/DETH/IETH classes)."""
    out = b""
    for name, f in c["headers"].items():
        if name == "RETH":
            out += struct.pack(">QII", f["va"], f["r_key"], f["dma_length"])
        elif name in ("IMMDT",):
            out += struct.pack(">I", f["imm"])
        elif name == "IETH":
            out += struct.pack(">I", f["r_key"])
        elif name == "DETH":
            out += struct.pack(">IB", f["q_key"], f["resv"]) + f["src_qp"].to_bytes(3, "big")
        elif name == "AETH":
            out += bytes(sroce.AETH(syndrome=f["syndrome"], msn=f["msn"]))
        elif name == "CNP_PAD":
            r = f["reserved"]
            out += bytes(sroce.CNPPadding(reserved1=r >> 64, reserved2=r & (2 ** 64 - 1)))
        elif name == "ATOMICETH":
            out += struct.pack(">QIQQ", f["va"], f["r_key"], f["swap_add"], f["compare"])
        elif name == "ATOMICACKETH":
            out += struct.pack(">Q", f["orig"])
        elif name == "FETH":
            out += struct.pack(">I", (f["resv"] << 6) | (f["sel"] << 4) | f["plt"])
        else:  # pragma: no cover
            raise AssertionError(name)
    return out


def _scapy_packet(c, *, icrc=None):
    b = c["bth"]
    pad = (-len(c["payload"])) & 3
    p = Ether(dst=mac_str(c["dst_mac"]), src=mac_str(c["src_mac"]))
    if c["vlan"] is not None:
        v = c["vlan"]
        p = p / Dot1Q(prio=v["pcp"], dei=v["dei"], vlan=v["vid"])
    if c["ip_version"] == 4:
        p = p / IP(tos=c["tos"], id=c["ip_id"], flags=2 * c["df"], ttl=c["ttl"],
                   src=_ip(c["src_ip"], 4), dst=_ip(c["dst_ip"], 4))
    else:
        p = p / IPv6(tc=c["tos"], fl=c["flow_label"], hlim=c["ttl"],
                     src=_ip(c["src_ip"], 6), dst=_ip(c["dst_ip"], 6))
    p = p / UDP(sport=c["sport"], dport=4791, chksum=0)
    p = p / sroce.BTH(opcode=int(c["opcode"]), solicited=b["se"], migreq=b["migreq"],
                      padcount=pad, version=b["tver"], pkey=b["p_key"], fecn=b["fecn"],
                      becn=b["becn"], resv6=b["resv6"], dqpn=b["dest_qp"], ackreq=b["ack_req"],
                      resv7=b["resv7"], psn=b["psn"], icrc=icrc)
    return p / Raw(_struct_ext(c) + c["payload"] + bytes(pad))


def _check_scapy_decode(c, frame):
    q = Ether(frame)
    bth = q[sroce.BTH]
    b = c["bth"]
    assert (bth.opcode, bth.solicited, bth.migreq, bth.padcount, bth.version, bth.pkey) == \
        (c["opcode"], b["se"], b["migreq"], (-len(c["payload"])) & 3, b["tver"], b["p_key"])
    assert (bth.fecn, bth.becn, bth.resv6, bth.dqpn, bth.ackreq, bth.resv7, bth.psn) == \
        (b["fecn"], b["becn"], b["resv6"], b["dest_qp"], b["ack_req"], b["resv7"], b["psn"])
    if c["ip_version"] == 4:
        assert (q[IP].tos, q[IP].id, q[IP].ttl, q[IP].flags.DF) == \
            (c["tos"], c["ip_id"], c["ttl"], bool(c["df"]))
    else:
        assert (q[IPv6].tc, q[IPv6].fl, q[IPv6].hlim) == (c["tos"], c["flow_label"], c["ttl"])
    assert (q[UDP].sport, q[UDP].dport, q[UDP].chksum) == (c["sport"], 4791, 0)
    if c["vlan"] is not None:
        assert (q[Dot1Q].prio, q[Dot1Q].dei, q[Dot1Q].vlan) == \
            (c["vlan"]["pcp"], c["vlan"]["dei"], c["vlan"]["vid"])
    if c["opcode"] == Opcode.RC_ACKNOWLEDGE:
        a = q[sroce.AETH]
        assert (a.syndrome, a.msn) == (c["headers"]["AETH"]["syndrome"],
                                       c["headers"]["AETH"]["msn"])
    # everything after the BTH and before the iCRC, as scapy splits it
    body = bytes(bth.payload)
    ext = _struct_ext(c)
    assert body == ext + c["payload"] + bytes((-len(c["payload"])) & 3)
    # scapy recomputes lengths, the IPv4 checksum and the iCRC: all must equal the model's bytes
    r = Ether(frame)
    if c["ip_version"] == 4:
        del r[IP].chksum
        del r[IP].len
    else:
        del r[IPv6].plen
    del r[UDP].len
    r[sroce.BTH].icrc = None
    assert bytes(r) == frame
    assert r[sroce.BTH].icrc is None


def _check_model_decode(c, rf):
    assert rf.opcode == c["opcode"]
    assert rf.ip_version == c["ip_version"]
    assert (rf.eth["dst"], rf.eth["src"]) == (c["dst_mac"], c["src_mac"])
    assert rf.vlan == c["vlan"]
    if c["ip_version"] == 4:
        ip = rf.ip
        assert ((ip["dscp"] << 2) | ip["ecn"], ip["identification"], ip["flag_df"], ip["ttl"]) == \
            (c["tos"], c["ip_id"], c["df"], c["ttl"])
    else:
        ip = rf.ip
        assert (ip["traffic_class"], ip["flow_label"], ip["hop_limit"]) == \
            (c["tos"], c["flow_label"], c["ttl"])
    assert (ip["src"], ip["dst"]) == (c["src_ip"], c["dst_ip"])
    assert (rf.udp["src_port"], rf.udp["dst_port"], rf.udp["checksum"]) == (c["sport"], 4791, 0)
    for k, v in c["bth"].items():
        assert rf.bth[k] == v, k
    assert rf.bth["pad_cnt"] == rf.pad == (-len(c["payload"])) & 3
    assert list(rf.headers) == list(c["headers"])
    assert rf.headers == c["headers"]
    assert rf.payload == c["payload"]
    assert rf.pad_bytes == bytes(rf.pad)


N_RANDOM = 1500


def _cases(n, seed):
    rng = random.Random(seed)
    return [_random_case(rng) for _ in range(n)]


def test_model_to_scapy_random():
    """Model-built frames decode in scapy to the same fields and scapy recomputes the same
    lengths, checksum and iCRC (IPv4/IPv6, with/without VLAN, every opcode)."""
    seen = set()
    for c in _cases(N_RANDOM, SEED):
        frame = _model_frame(c)
        _check_scapy_decode(c, frame)
        seen.add((c["ip_version"], c["vlan"] is None))
    assert seen == {(4, True), (4, False), (6, True), (6, False)}


def test_scapy_to_model_random():
    """Scapy-built frames parse in the model to the same fields with a good iCRC, the model
    rebuilds them byte for byte, and any flipped bit in the iCRC-covered part is detected."""
    rng = random.Random(SEED + 1)
    ops = set()
    for c in _cases(N_RANDOM, SEED + 2):
        frame = bytes(_scapy_packet(c))
        rf = parse_frame(frame)
        assert rf.icrc_ok
        _check_model_decode(c, rf)
        assert _model_frame(c) == frame
        ops.add(c["opcode"])
        # a flipped bit anywhere after the BTH (ext headers, payload, pad, iCRC) is caught
        bth_end = (14 if c["vlan"] is None else 18) + (20 if c["ip_version"] == 4 else 40) + 20
        bad = bytearray(frame)
        bad[rng.randrange(bth_end, len(frame))] ^= 1 << rng.randrange(8)
        assert not parse_frame(bytes(bad)).icrc_ok
    assert ops == set(Opcode)


@pytest.mark.slow
def test_random_both_ways_many():
    for c in _cases(20000, SEED + 3):
        frame = _model_frame(c)
        _check_scapy_decode(c, frame)
        assert parse_frame(frame).icrc_ok
        _check_model_decode(c, parse_frame(bytes(_scapy_packet(c))))


def test_icrc_variant_fields_are_masked():
    """Changing TOS/TTL/checksum/UDP checksum/FECN/BECN/resv6 (IPv4) or TC/flow label/hop limit
    (IPv6) keeps the iCRC; changing any other covered byte changes it."""
    rng = random.Random(SEED + 4)
    for version in (4, 6):
        c = _random_case(rng)
        c["ip_version"] = version
        c["src_ip"] = rng.getrandbits(32 if version == 4 else 128)
        c["dst_ip"] = rng.getrandbits(32 if version == 4 else 128)
        c["vlan"] = None
        frame = _model_frame(c)
        l3 = frame[14:-4]
        crc = micrc.icrc(l3)
        ihl = 20 if version == 4 else 40
        masked = {1, 8, 10, 11} if version == 4 else {0, 1, 2, 3, 7}
        masked |= {ihl + 6, ihl + 7, ihl + 8 + 4}
        for pos in range(len(l3)):
            for bit in range(8):
                b = bytearray(l3)
                b[pos] ^= 1 << bit
                if pos == 0 and (version == 4 or bit >= 4):
                    continue            # version / IHL change the header structure itself
                if pos in masked:
                    assert micrc.icrc(bytes(b)) == crc, (version, pos, bit)
                else:
                    assert micrc.icrc(bytes(b)) != crc, (version, pos, bit)


def test_icrc_matches_protocol_md_reference():
    """The independent reference implementation printed in PROTOCOL.md §2 (sim.oracle)."""
    for c in _cases(300, SEED + 5):
        frame = _model_frame(c)
        off = 18 if c["vlan"] is not None else 14
        assert protocol_icrc_bytes(frame[off:-4]) == frame[-4:]


def test_oracle_is_the_code_printed_in_protocol_md(protocol_md):
    """sim.oracle.protocol_icrc is the ``rocev2_icrc`` of PROTOCOL.md §2: the document's code
    block, executed as printed, gives the same CRC on random and golden packets."""
    block = re.search(r"```python\n(.*?def rocev2_icrc.*?)```", protocol_md, re.S).group(1)
    scope = {}
    exec(compile(block, "PROTOCOL.md", "exec"), scope)
    frames = [_model_frame(c) for c in _cases(100, SEED + 12)] + [CX4_CNP]
    for frame in frames:
        off = 18 if frame[12:14] == b"\x81\x00" else 14
        l3 = frame[off:-4]
        assert scope["rocev2_icrc"](l3) == protocol_icrc(l3)
        if off == 14:     # the document's frame checker knows untagged frames only
            assert scope["check_rocev2_frame"](frame)
            bad = bytearray(frame); bad[-1] ^= 1
            assert not scope["check_rocev2_frame"](bytes(bad))


CX4_CNP = bytes.fromhex(
    "e41d2dab2bc27cfe90643b320800"
    "45c2003c718c400040119161" "0a0011010a001201"
    "000012b700280000"
    "8100ffff4000011800000000" "00000000000000000000000000000000" "82fd002a")


def test_cnp_golden_and_scapy():
    """The ConnectX-4 Lx CNP of PROTOCOL.md §5.11 parses, checks and rebuilds; the model's CNP
    builder matches scapy's ``cnp()``."""
    rf = parse_frame(CX4_CNP)
    assert rf.icrc_ok and rf.opcode == Opcode.CNP and rf.bth["becn"] == 1
    assert rf.dest_qp == 0x118 and rf.payload == b""
    assert build_frame(**rf.build_args()) == CX4_CNP
    assert zlib.crc32(b"\xff" * 8 + micrc.masked_l3(CX4_CNP[14:-4])) == 0x2A00FD82
    path = QPPath(src_mac=0x7CFE90643B32, dst_mac=0xE41D2DAB2BC2, src_ip=0x0A001101,
                  dst_ip=0x0A001201, dest_qp=0x118, udp_sport=0, dscp=48, ecn=2)
    assert build_cnp_frame(path, ip_id=0x718C) == CX4_CNP
    s = bytes(Ether(dst="e4:1d:2d:ab:2b:c2", src="7c:fe:90:64:3b:32") /
              IP(tos=0xC2, id=0x718C, flags=2, ttl=64, src="10.0.17.1", dst="10.0.18.1") /
              UDP(sport=0, dport=4791, chksum=0) / sroce.cnp(0x118))
    assert s == CX4_CNP


def test_ack_frame_vs_scapy():
    path = QPPath(src_mac=0x020000000001, dst_mac=0x020000000002, src_ip=0xC0A80001,
                  dst_ip=0xC0A80002, dest_qp=0x1234, udp_sport=0xC123)
    for syn, msn in ((0x1F, 1), (0x60, 0xABCDEF), (0x2E, 7)):
        f = build_ack_frame(path, psn=0x800000, syndrome=syn, msn=msn, ip_id=99)
        s = bytes(Ether(dst="02:00:00:00:00:02", src="02:00:00:00:00:01") /
                  IP(id=99, flags=2, ttl=64, src="192.168.0.1", dst="192.168.0.2") /
                  UDP(sport=0xC123, dport=4791, chksum=0) /
                  sroce.BTH(opcode=0x11, dqpn=0x1234, psn=0x800000) /
                  sroce.AETH(syndrome=syn, msn=msn))
        assert f == s


def test_parse_rejects_non_roce_and_malformed():
    c = _cases(1, SEED + 6)[0]
    c["vlan"] = None
    c["ip_version"] = 4
    c["src_ip"] &= 0xFFFFFFFF
    c["dst_ip"] &= 0xFFFFFFFF
    good = _model_frame(c)
    with pytest.raises(ValueError, match="shorter than an Ethernet"):
        parse_frame(b"\0" * 10)
    with pytest.raises(ValueError, match="ethertype 0x0806"):
        parse_frame(good[:12] + b"\x08\x06" + good[14:])
    tcp = bytearray(good); tcp[23] = 6
    with pytest.raises(ValueError, match="not UDP"):
        parse_frame(bytes(tcp))
    other_port = bytearray(good); other_port[36:38] = b"\x00\x35"
    with pytest.raises(ValueError, match="port 53"):
        parse_frame(bytes(other_port))
    with pytest.raises(ValueError, match="truncated"):
        parse_frame(good[:-1])
    reserved = bytearray(good); reserved[42] = 0x15
    with pytest.raises(ValueError, match="0x15"):
        parse_frame(bytes(reserved))
    short_udp = bytearray(good); short_udp[38:40] = (8 + 12 + 3).to_bytes(2, "big")
    with pytest.raises(ValueError, match="UDP length"):
        parse_frame(bytes(short_udp))
    # Ethernet padding after the packet is kept as trailer and does not upset the iCRC
    rf = parse_frame(good + bytes(6))
    assert rf.icrc_ok and rf.trailer == bytes(6)


def test_truncated_or_corrupt_frames_raise_value_error():
    """Every prefix of a good frame, and seeded random corruptions of it, either parse or raise
    ValueError (never IndexError/struct.error): ``frame_l3``/``frame_icrc_ok`` too."""
    rng = random.Random(SEED + 11)
    for ip_version in (4, 6):
        for vlan in (None, 7):
            good = build_frame(Opcode.RC_RDMA_WRITE_ONLY, vlan=vlan, ip_version=ip_version,
                               eth={"dst": 2, "src": 1}, ip={"src": 1, "dst": 2},
                               payload=bytes(range(13)))
            frames = [good[:n] for n in range(len(good))]
            for _ in range(300):
                b = bytearray(good)
                for _ in range(3):
                    b[rng.randrange(len(b))] = rng.getrandbits(8)
                frames.append(bytes(b))
            for frame in frames:
                for check in (parse_frame, micrc.frame_icrc_ok):
                    try:
                        check(frame)
                    except ValueError:
                        pass
            with pytest.raises(ValueError, match="truncated"):
                micrc.frame_l3(good[:14 + (4 if vlan else 0) + 3])
            assert micrc.frame_icrc_ok(good)


def test_build_frame_errors():
    with pytest.raises(ValueError, match="0x15"):
        build_frame(0x15)
    with pytest.raises(ValueError, match="RETH"):
        build_frame(Opcode.RC_SEND_ONLY, headers={"RETH": {}})
    with pytest.raises(ValueError, match="ip_version"):
        build_frame(Opcode.RC_SEND_ONLY, ip_version=5)
    with pytest.raises(ValueError, match="does not fit"):
        build_frame(Opcode.RC_SEND_ONLY, bth={"psn": 1 << 24})


# --- PSN arithmetic -----------------------------------------------------------------------------

def _rxe_psn_compare(a, b):
    """rxe.h: ``s32 diff = (psn_a - psn_b) << 8;`` emulated with 32-bit C arithmetic."""
    d = ((a - b) << 8) & 0xFFFFFFFF
    return d - (1 << 32) if d & 0x80000000 else d


def _psn_pairs():
    rng = random.Random(SEED + 7)
    edge = [0, 1, 2, (1 << 23) - 1, 1 << 23, (1 << 23) + 1, (1 << 24) - 2, (1 << 24) - 1]
    pairs = [(a, b) for a in edge for b in edge]
    for _ in range(20000):
        b = rng.getrandbits(24)
        pairs.append((rng.getrandbits(24), b))
        pairs.append(((b + rng.choice(edge) + rng.randrange(-3, 4)) & 0xFFFFFF, b))
    return pairs


def test_psn_compare_matches_rxe():
    for a, b in _psn_pairs():
        ref = _rxe_psn_compare(a, b)
        assert psn_compare(a, b) == ref
        assert psn_lt(a, b) == (ref < 0)
        assert psn_le(a, b) == (ref <= 0)
        assert psn_gt(a, b) == psn_ahead(a, b) == (ref > 0)
        assert psn_ge(a, b) == (ref >= 0)
        d = psn_diff(a, b)
        assert -(1 << 23) <= d < (1 << 23)
        assert (b + d) % (1 << 24) == a


def test_psn_wrap():
    assert psn_add(0xFFFFFF, 1) == 0
    assert psn_add(0, -1) == 0xFFFFFF
    assert psn_add(0xFFFFF0, 0x20) == 0x10
    assert psn_add(5, 1 << 24) == 5
    assert psn_diff(0, 0xFFFFFF) == 1 and psn_ahead(0, 0xFFFFFF)
    assert psn_diff(0xFFFFFF, 0) == -1 and psn_lt(0xFFFFFF, 0)
    assert psn_diff(0x7FFFFF, 0) == (1 << 23) - 1
    assert psn_diff(0x800000, 0) == -(1 << 23)        # rxe: INT32_MIN, i.e. "behind"
    assert psn_in_window(0x000002, 0xFFFFFE, 5) and not psn_in_window(0x000003, 0xFFFFFE, 5)
    for bad in (-1, 1 << 24):
        with pytest.raises(ValueError, match="24-bit"):
            psn_add(bad, 0)
        with pytest.raises(ValueError, match="24-bit"):
            psn_diff(0, bad)


# --- segmentation -------------------------------------------------------------------------------

def _expected_name(transport, wr, position):
    base = "SEND" if wr in (WrOpcode.SEND, WrOpcode.SEND_WITH_IMM) else "RDMA_WRITE"
    imm = wr in (WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE_WITH_IMM)
    suffix = "_WITH_IMMEDIATE" if imm and position in ("LAST", "ONLY") else ""
    return f"{transport.name}_{base}_{position}{suffix}"


def _check_segmentation(wr, length, pmtu, transport, start_psn, ack_every, solicited, rng):
    msg = rng.randbytes(length)
    va, rkey, imm = rng.getrandbits(64), rng.getrandbits(32), rng.getrandbits(32)
    pkts = segment_message(wr, msg, pmtu=pmtu, start_psn=start_psn, remote_addr=va, r_key=rkey,
                           imm=imm, solicited=solicited, ack_req_every=ack_every,
                           transport=transport)
    n = len(pkts)
    assert n == max(1, (length + pmtu - 1) // pmtu)
    assert b"".join(p.payload for p in pkts) == msg
    is_write = wr in (WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM)
    has_imm = wr in (WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE_WITH_IMM)
    for i, p in enumerate(pkts):
        last = i == n - 1
        pos = "ONLY" if n == 1 else "FIRST" if i == 0 else "LAST" if last else "MIDDLE"
        assert p.opcode.name == _expected_name(transport, wr, pos)
        assert p.psn == (start_psn + i) % (1 << 24)
        if last:
            assert (1 if length else 0) <= len(p.payload) <= pmtu
        else:
            assert len(p.payload) == pmtu
        assert p.pad == (4 - len(p.payload) % 4) % 4
        assert p.reth == ({"va": va, "r_key": rkey, "dma_length": length}
                          if is_write and i == 0 else None)
        assert p.imm == (imm if has_imm and last else None)
        assert p.se == (last and solicited and wr != WrOpcode.RDMA_WRITE)
        if transport == Transport.RC:
            assert p.ack_req == (last or (i + 1) % ack_every == 0)
        else:
            assert p.ack_req is False
        # the packet's headers are exactly the ones its opcode calls for
        names = [h.name for h in proto.opcode_headers(p.opcode)]
        assert names == [x for x, v in (("RETH", p.reth), ("IMMDT", p.imm)) if v is not None]


@pytest.mark.parametrize("pmtu", PMTUS)
def test_segmentation_properties_every_length(pmtu):
    """Every length 0..3*PMTU+17, every RC operation, at this PMTU (UC on every 7th length)."""
    rng = random.Random(SEED + pmtu)
    for length in range(3 * pmtu + 18):
        for wr in WR_OPS:
            _check_segmentation(wr, length, pmtu, Transport.RC,
                                rng.choice((0, 0xFFFFFE, rng.getrandbits(24))), 64,
                                rng.random() < 0.5, rng)
        if length % 7 == 0:
            _check_segmentation(rng.choice(WR_OPS), length, pmtu, Transport.UC,
                                rng.getrandbits(24), 64, rng.random() < 0.5, rng)


def test_segmentation_ack_req_every_and_wrap():
    rng = random.Random(SEED + 8)
    for every in (1, 2, 3, 5, 64):
        for n in (1, 2, 63, 64, 65, 66, 130):
            _check_segmentation(WrOpcode.RDMA_WRITE, n * 256 - rng.randrange(2), 256,
                                Transport.RC, 0xFFFFFF - rng.randrange(3), every, False, rng)
    pkts = segment_message(WrOpcode.RDMA_WRITE, bytes(256 * 130), pmtu=256, start_psn=0xFFFFFF)
    assert [i for i, p in enumerate(pkts) if p.ack_req] == [63, 127, 129]
    assert pkts[0].psn == 0xFFFFFF and pkts[1].psn == 0 and pkts[-1].psn == 128


def test_segmentation_errors():
    with pytest.raises(ValueError, match="256, 512, 1024, 2048, 4096"):
        segment_message(WrOpcode.SEND, b"x", pmtu=1500, start_psn=0)
    with pytest.raises(ValueError, match="RDMA_READ"):
        segment_message(WrOpcode.RDMA_READ, b"", pmtu=1024, start_psn=0)
    with pytest.raises(ValueError, match="24-bit"):
        segment_message(WrOpcode.SEND, b"", pmtu=1024, start_psn=1 << 24)
    with pytest.raises(ValueError, match="RC or UC"):
        segment_message(WrOpcode.SEND, b"", pmtu=1024, start_psn=0, transport=Transport.UD)
    with pytest.raises(ValueError, match="ack_req_every"):
        segment_message(WrOpcode.SEND, b"", pmtu=1024, start_psn=0, ack_req_every=0)
    with pytest.raises(ValueError, match="imm"):
        segment_message(WrOpcode.SEND_WITH_IMM, b"", pmtu=1024, start_psn=0, imm=1 << 32)


def test_packetspec_is_frozen_and_hashable():
    p = segment_message(WrOpcode.RDMA_WRITE, b"abc", pmtu=256, start_psn=1)[0]
    assert p.pad == 1
    with pytest.raises(Exception):
        p.psn = 2
    assert hash(p) == hash(PacketSpec(p.opcode, p.psn, p.ack_req, p.se, p.payload, dict(p.reth),
                                      p.imm))


# --- request frames and the TX model ------------------------------------------------------------

def _path(rng, vlan=None):
    return QPPath(src_mac=rng.getrandbits(48), dst_mac=rng.getrandbits(48),
                  src_ip=rng.getrandbits(32), dst_ip=rng.getrandbits(32),
                  dest_qp=rng.getrandbits(24), udp_sport=0xC000 | rng.getrandbits(14),
                  dscp=rng.getrandbits(6), ecn=rng.getrandbits(2), ttl=rng.randrange(1, 256),
                  migreq=rng.getrandbits(1), vlan=vlan)


def test_request_frames_vs_scapy():
    """build_request_frame == the same packet assembled by scapy (IPv4, with/without VLAN)."""
    rng = random.Random(SEED + 9)
    for k in range(200):
        path = _path(rng, vlan=rng.getrandbits(12) if k % 2 else None)
        wr = rng.choice(WR_OPS)
        pmtu = rng.choice(PMTUS)
        msg = rng.randbytes(rng.randrange(0, 3 * pmtu))
        ip_id = rng.getrandbits(16)
        for p in segment_message(wr, msg, pmtu=pmtu, start_psn=rng.getrandbits(24),
                                 remote_addr=rng.getrandbits(64), r_key=rng.getrandbits(32),
                                 imm=rng.getrandbits(32), solicited=rng.random() < 0.5):
            frame = build_request_frame(path, p, ip_id=ip_id)
            ext = b""
            if p.reth is not None:
                ext += struct.pack(">QII", p.reth["va"], p.reth["r_key"], p.reth["dma_length"])
            if p.imm is not None:
                ext += struct.pack(">I", p.imm)
            s = Ether(dst=mac_str(path.dst_mac), src=mac_str(path.src_mac))
            if path.vlan is not None:
                s = s / Dot1Q(vlan=path.vlan)
            s = s / IP(tos=(path.dscp << 2) | path.ecn, id=ip_id, flags=2, ttl=path.ttl,
                       src=_ip(path.src_ip, 4), dst=_ip(path.dst_ip, 4))
            s = s / UDP(sport=path.udp_sport, dport=4791, chksum=0)
            s = s / sroce.BTH(opcode=int(p.opcode), solicited=int(p.se), migreq=path.migreq,
                              padcount=p.pad, dqpn=path.dest_qp, ackreq=int(p.ack_req),
                              psn=p.psn)
            s = s / Raw(ext + p.payload + bytes(p.pad))
            assert frame == bytes(s)
            ip_id = (ip_id + 1) & 0xFFFF


def test_path_requester_psn_and_ip_id():
    rng = random.Random(SEED + 10)
    a, b = _path(rng), _path(rng)
    m = PathRequester(ip_id_start=0xFFFE, ack_req_every=2)
    with pytest.raises(ValueError, match="start PSN"):
        m.post(a, 1024, None, WrOpcode.SEND, b"x")
    fa = m.post(a, 256, 0xFFFFFE, WrOpcode.RDMA_WRITE, bytes(600), remote_addr=0x1000, r_key=7)
    fb = m.post(b, 256, 100, WrOpcode.SEND, b"hello")
    fa2 = m.post(a, 256, None, WrOpcode.SEND_WITH_IMM, bytes(257), imm=0xDEADBEEF,
                 solicited=True)
    parsed = [parse_frame(f) for f in fa + fb + fa2]
    assert all(p.icrc_ok for p in parsed)
    assert [p.ip["identification"] for p in parsed] == [0xFFFE, 0xFFFF, 0, 1, 2, 3]
    assert [p.psn for p in parsed] == [0xFFFFFE, 0xFFFFFF, 0, 100, 1, 2]
    assert [p.opcode.short_name for p in parsed] == [
        "RDMA_WRITE_FIRST", "RDMA_WRITE_MIDDLE", "RDMA_WRITE_LAST", "SEND_ONLY", "SEND_FIRST",
        "SEND_LAST_WITH_IMMEDIATE"]
    assert [p.bth["ack_req"] for p in parsed] == [0, 1, 1, 1, 0, 1]
    assert [p.bth["se"] for p in parsed] == [0, 0, 0, 0, 0, 1]
    assert parsed[-1].imm == 0xDEADBEEF
    assert m.next_psn(a.dest_qp) == 3 and m.next_psn(b.dest_qp) == 101
    # an explicit PSN restarts the QP's sequence
    assert parse_frame(m.post(b, 256, 5, WrOpcode.SEND, b"")[0]).psn == 5
    assert m.next_psn(b.dest_qp) == 6


def test_path_requester_errors():
    """What the path front end cannot send is an error, and leaves its state alone."""
    rng = random.Random(SEED + 11)
    a = _path(rng)
    m = PathRequester(ip_id_start=5, n_qp=2)
    with pytest.raises(ValueError, match="16-bit"):
        PathRequester(ip_id_start=1 << 16)
    with pytest.raises(ValueError, match="untagged"):
        m.post(QPPath(**{**a.__dict__, "vlan": 3}), 256, 0, WrOpcode.SEND, b"x")
    with pytest.raises(ValueError, match="PMTU"):
        m.post(a, 300, 0, WrOpcode.SEND, b"x")
    with pytest.raises(ValueError, match="refused"):
        m.post(a, 256, 0, 7, b"x")                      # not a WR opcode
    assert m.next_psn(a.dest_qp) is None and m.ip_id == 5
    m.post(a, 256, 0, WrOpcode.SEND, b"x")
    with pytest.raises(ValueError, match="refused"):
        m.post(a, 256, 9, 7, b"x")
    m.post(QPPath(**{**a.__dict__, "dest_qp": a.dest_qp ^ 1}), 256, 0, WrOpcode.SEND, b"")
    with pytest.raises(ValueError, match="more than 2 destination QPs"):
        m.post(QPPath(**{**a.__dict__, "dest_qp": a.dest_qp ^ 2}), 256, 0, WrOpcode.SEND, b"")
    assert m.ip_id == 7 and m.next_psn(a.dest_qp) == 1


def test_model_does_not_import_amaranth():
    import subprocess
    import sys
    code = ("import sys, roce_hw.model.packet, roce_hw.model.segment, roce_hw.model.psn, "
            "roce_hw.model.icrc; print(sorted(m for m in sys.modules if m.startswith('amaranth')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=__import__("pathlib").Path(__file__).resolve().parent.parent)
    assert out.stdout.strip() == "[]"


def test_ipv4_options_parse_and_rebuild():
    """An IPv4 header with options (IHL 6) parses, checks and rebuilds byte for byte."""
    from scapy.layers.inet import IPOption_NOP, IPOption_EOL
    frame = bytes(Ether(dst="02:00:00:00:00:02", src="02:00:00:00:00:01") /
                  IP(src="10.0.0.1", dst="10.0.0.2", flags=2, id=7,
                     options=[IPOption_NOP(), IPOption_NOP(), IPOption_NOP(), IPOption_EOL()]) /
                  UDP(sport=0xC000, dport=4791, chksum=0) /
                  sroce.BTH(opcode=0x0A, dqpn=3, psn=4, ackreq=1, padcount=1) /
                  Raw(struct.pack(">QII", 0x1000, 5, 3) + b"abc" + b"\0"))
    rf = parse_frame(frame)
    assert rf.ip["ihl"] == 6 and rf.ip_options == b"\x01\x01\x01\x00"
    assert rf.icrc_ok and rf.payload == b"abc" and rf.reth == {"va": 0x1000, "r_key": 5,
                                                               "dma_length": 3}
    assert build_frame(**rf.build_args()) == frame


@pytest.mark.slow
@pytest.mark.parametrize("pmtu", PMTUS)
def test_segmentation_properties_uc_every_length(pmtu):
    rng = random.Random(SEED + 11 + pmtu)
    for length in range(3 * pmtu + 18):
        for wr in WR_OPS:
            _check_segmentation(wr, length, pmtu, Transport.UC, rng.getrandbits(24),
                                rng.choice((1, 7, 64)), rng.random() < 0.5, rng)
