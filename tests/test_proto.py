# SPDX-License-Identifier: BSD-2-Clause
"""roce_hw.proto headers and enums against struct, scapy, PROTOCOL.md and the Amaranth layouts."""

import random
import re
import struct
import ipaddress

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Dot1Q, Ether
from scapy.contrib import roce as sroce

from roce_hw import layouts, proto
from sim.bfm import mac_str

__all__ = []

SEED = 20261121


def _rand_fields(header, rng):
    return {name: rng.getrandbits(width) for name, width in header.fields}


# --- scapy / struct encoders of the same field values (the independent oracles) --------------

def _scapy_eth(f):
    return bytes(Ether(dst=mac_str(f["dst"]), src=mac_str(f["src"]), type=f["ethertype"]))


def _scapy_vlan(f):
    # proto.VLAN_TAG is TPID + TCI; scapy puts the TPID in Ether.type and the TCI in Dot1Q.
    raw = bytes(Ether(dst="00:00:00:00:00:00", src="00:00:00:00:00:00", type=f["tpid"]) /
                Dot1Q(prio=f["pcp"], dei=f["dei"], vlan=f["vid"], type=0))
    return raw[12:16]


def _scapy_ipv4(f):
    p = IP(version=f["version"], ihl=f["ihl"], tos=(f["dscp"] << 2) | f["ecn"],
           len=f["total_length"], id=f["identification"],
           flags=(f["flag_rsv"] << 2) | (f["flag_df"] << 1) | f["flag_mf"],
           frag=f["frag_offset"], ttl=f["ttl"], proto=f["protocol"], chksum=f["checksum"],
           src=str(ipaddress.IPv4Address(f["src"])), dst=str(ipaddress.IPv4Address(f["dst"])))
    return bytes(p)[:20]


def _scapy_ipv6(f):
    p = IPv6(version=f["version"], tc=f["traffic_class"], fl=f["flow_label"],
             plen=f["payload_length"], nh=f["next_header"], hlim=f["hop_limit"],
             src=str(ipaddress.IPv6Address(f["src"])), dst=str(ipaddress.IPv6Address(f["dst"])))
    return bytes(p)[:40]


def _scapy_udp(f):
    return bytes(UDP(sport=f["src_port"], dport=f["dst_port"], len=f["length"],
                     chksum=f["checksum"]))[:8]


def _scapy_bth(f):
    p = sroce.BTH(opcode=f["opcode"], solicited=f["se"], migreq=f["migreq"],
                  padcount=f["pad_cnt"], version=f["tver"], pkey=f["p_key"], fecn=f["fecn"],
                  becn=f["becn"], resv6=f["resv6"], dqpn=f["dest_qp"], ackreq=f["ack_req"],
                  resv7=f["resv7"], psn=f["psn"], icrc=0)
    return bytes(p)[:12]      # drop scapy's trailing iCRC field


def _scapy_aeth(f):
    return bytes(sroce.AETH(syndrome=f["syndrome"], msn=f["msn"]))


def _scapy_cnp_pad(f):
    r = f["reserved"]
    return bytes(sroce.CNPPadding(reserved1=r >> 64, reserved2=r & (2 ** 64 - 1)))


def _struct_reth(f):
    return struct.pack(">QII", f["va"], f["r_key"], f["dma_length"])


def _struct_immdt(f):
    return struct.pack(">I", f["imm"])


def _struct_ieth(f):
    return struct.pack(">I", f["r_key"])


def _struct_deth(f):
    return struct.pack(">IB", f["q_key"], f["resv"]) + f["src_qp"].to_bytes(3, "big")


def _struct_cm(f):
    flags = f["valid"] | (f["req_type"] << 1) | (f["ack_valid"] << 4) | (f["ack_type"] << 5)
    tx = f["tx_valid"] | (f["tx_start"] << 1) | (f["tx_immediate"] << 2) | \
        (f["tx_type"] << 3) | (f["tx_resv"] << 4)
    return struct.pack(">BIIIQIIIIQIHBIII", flags,
                       f["loc_qpn"], f["loc_psn"], f["loc_r_key"], f["loc_base_addr"], f["loc_ip"],
                       f["rem_qpn"], f["rem_psn"], f["rem_r_key"], f["rem_base_addr"], f["rem_ip"],
                       f["reply_port"], tx, f["tx_dma_length"], f["tx_n_transfers"],
                       f["tx_period"])


ORACLES = {
    "ETH": (proto.ETH, _scapy_eth, 14),
    "VLAN_TAG": (proto.VLAN_TAG, _scapy_vlan, 4),
    "IPV4": (proto.IPV4, _scapy_ipv4, 20),
    "IPV6": (proto.IPV6, _scapy_ipv6, 40),
    "UDP": (proto.UDP, _scapy_udp, 8),
    "BTH": (proto.BTH, _scapy_bth, 12),
    "AETH": (proto.AETH, _scapy_aeth, 4),
    "CNP_PAD": (proto.CNP_PAD, _scapy_cnp_pad, 16),
    "RETH": (proto.RETH, _struct_reth, 16),
    "IMMDT": (proto.IMMDT, _struct_immdt, 4),
    "IETH": (proto.IETH, _struct_ieth, 4),
    "DETH": (proto.DETH, _struct_deth, 8),
    "CM_DATAGRAM": (proto.CM_DATAGRAM, _struct_cm, 64),
}

#: Byte offset of each multi-byte / byte-aligned field, typed from PROTOCOL.md §5.2, §5.3, §7 and
#: the RFCs (not read from proto.py).
EXPECTED_OFFSETS = {
    "ETH": {"dst": 0, "src": 6, "ethertype": 12},
    "VLAN_TAG": {"tpid": 0},
    "IPV4": {"total_length": 2, "identification": 4, "ttl": 8, "protocol": 9, "checksum": 10,
             "src": 12, "dst": 16},
    "IPV6": {"payload_length": 4, "next_header": 6, "hop_limit": 7, "src": 8, "dst": 24},
    "UDP": {"src_port": 0, "dst_port": 2, "length": 4, "checksum": 6},
    "BTH": {"opcode": 0, "p_key": 2, "psn": 9, "dest_qp": 5},
    "RETH": {"va": 0, "r_key": 8, "dma_length": 12},
    "AETH": {"syndrome": 0, "msn": 1},
    "IMMDT": {"imm": 0},
    "IETH": {"r_key": 0},
    "DETH": {"q_key": 0, "resv": 4, "src_qp": 5},
    "CM_DATAGRAM": {"loc_qpn": 1, "loc_psn": 5, "loc_r_key": 9, "loc_base_addr": 13, "loc_ip": 21,
                    "rem_qpn": 25, "rem_psn": 29, "rem_r_key": 33, "rem_base_addr": 37,
                    "rem_ip": 45, "reply_port": 49, "tx_dma_length": 52, "tx_n_transfers": 56,
                    "tx_period": 60},
}

#: (byte, bit-from-MSB) of the sub-byte fields (PROTOCOL.md §5.2 "bit 7 = MSB", §7 flag bytes).
EXPECTED_BITS = {
    "BTH": {"se": (1, 0), "migreq": (1, 1), "pad_cnt": (1, 2), "tver": (1, 4), "fecn": (4, 0),
            "becn": (4, 1), "resv6": (4, 2), "ack_req": (8, 0), "resv7": (8, 1)},
    "IPV4": {"version": (0, 0), "ihl": (0, 4), "dscp": (1, 0), "ecn": (1, 6), "flag_df": (6, 1),
             "flag_mf": (6, 2)},
    "VLAN_TAG": {"pcp": (2, 0), "dei": (2, 3), "vid": (2, 4)},
    "CM_DATAGRAM": {"valid": (0, 7), "req_type": (0, 4), "ack_valid": (0, 3), "ack_type": (0, 0),
                    "tx_valid": (51, 7), "tx_start": (51, 6), "tx_immediate": (51, 5),
                    "tx_type": (51, 4), "tx_resv": (51, 0)},
}


@pytest.mark.parametrize("name", sorted(ORACLES))
def test_header_size(name):
    header, oracle, size = ORACLES[name]
    assert header.size == size
    assert header.bits == 8 * size
    assert len(oracle({n: 0 for n, _ in header.fields})) == size


@pytest.mark.parametrize("name", sorted(ORACLES))
def test_header_pack_matches_oracle(name):
    header, oracle, _ = ORACLES[name]
    rng = random.Random(f"{SEED}-{name}")
    for _ in range(200):
        f = _rand_fields(header, rng)
        wire = header.pack(f)
        assert wire == oracle(f), f
        assert header.unpack(wire) == f


@pytest.mark.parametrize("name", sorted(ORACLES))
def test_each_field_lands_where_the_oracle_puts_it(name):
    """Setting one field to all ones changes exactly the oracle's bytes/bits for that field."""
    header, oracle, _ = ORACLES[name]
    zero = {n: 0 for n, _ in header.fields}
    for fname, width in header.fields:
        f = dict(zero, **{fname: (1 << width) - 1})
        assert header.pack(f) == oracle(f), fname
        mask = int.from_bytes(oracle(f), "big")
        assert mask == ((1 << width) - 1) << header.lsb(fname), fname
        byte, bit = header.offset(fname)
        first = header.bits - header.lsb(fname) - width
        assert (byte, bit) == divmod(first, 8)


@pytest.mark.parametrize("name", sorted(EXPECTED_OFFSETS))
def test_documented_byte_offsets(name):
    header = ORACLES[name][0]
    for fname, off in EXPECTED_OFFSETS[name].items():
        byte, bit = header.offset(fname)
        assert (byte, bit) == (off, 0), fname


@pytest.mark.parametrize("name", sorted(EXPECTED_BITS))
def test_documented_bit_positions(name):
    header = ORACLES[name][0]
    for fname, pos in EXPECTED_BITS[name].items():
        assert header.offset(fname) == pos, fname


_LAYOUTS = {
    "ETH": layouts.ETH, "VLAN_TAG": layouts.VLAN_TAG, "IPV4": layouts.IPV4, "IPV6": layouts.IPV6,
    "UDP": layouts.UDP, "BTH": layouts.BTH, "RETH": layouts.RETH, "AETH": layouts.AETH,
    "IMMDT": layouts.IMMDT, "IETH": layouts.IETH, "DETH": layouts.DETH,
    "CNP_PAD": layouts.CNP_PAD, "CM_DATAGRAM": layouts.CM_DATAGRAM,
}


@pytest.mark.parametrize("name", sorted(_LAYOUTS))
def test_amaranth_layout_wire_image(name):
    layout = _LAYOUTS[name]
    header, oracle, size = ORACLES[name]
    assert layout.size == 8 * size
    rng = random.Random(f"{SEED}-layout-{name}")
    for _ in range(50):
        f = _rand_fields(header, rng)
        assert layout.const(f).as_bits().to_bytes(size, "big") == header.pack(f) == oracle(f)


def test_to_lanes_puts_wire_byte_0_in_lane_0():
    """``to_lanes`` of a header signal, read little-endian (lane 0 first), is the oracle's wire
    image; ``from_lanes`` undoes it; a value of the wrong width is refused."""
    from amaranth import Module, Signal
    from amaranth.sim import Simulator

    sigs = {name: Signal(_LAYOUTS[name]) for name in ("BTH", "RETH", "VLAN_TAG", "CM_DATAGRAM")}
    rng = random.Random(f"{SEED}-lanes")
    checked = []

    async def tb(ctx):
        for name, sig in sigs.items():
            header, oracle, size = ORACLES[name]
            lanes = layouts.to_lanes(sig, size)
            back = layouts.from_lanes(lanes, size)
            for _ in range(20):
                f = _rand_fields(header, rng)
                ctx.set(sig, f)
                assert ctx.get(lanes).to_bytes(size, "little") == oracle(f), (name, f)
                assert ctx.get(back) == ctx.get(sig.as_value())
                checked.append(name)

    sim = Simulator(Module())
    sim.add_testbench(tb)
    sim.run()
    assert len(checked) == 20 * len(sigs)
    with pytest.raises(ValueError, match="expected 96"):
        layouts.to_lanes(Signal(95), 12)
    with pytest.raises(ValueError, match="expected 128"):
        layouts.from_lanes(Signal(96), 16)


def test_header_pack_rejects_bad_values():
    with pytest.raises(ValueError):
        proto.BTH.pack(psn=1 << 24)
    with pytest.raises(KeyError):
        proto.BTH.pack(nonexistent=1)
    with pytest.raises(ValueError):
        proto.BTH.unpack(b"\0" * 11)


def test_header_defaults():
    assert proto.BTH.unpack(proto.BTH.pack())["p_key"] == 0xFFFF
    ip = proto.IPV4.unpack(proto.IPV4.pack())
    assert (ip["version"], ip["ihl"], ip["flag_df"], ip["ttl"], ip["protocol"]) == (4, 5, 1, 64, 17)
    assert proto.UDP.unpack(proto.UDP.pack())["dst_port"] == 4791
    assert proto.VLAN_TAG.pack()[:2] == b"\x81\x00"


def test_header_mask():
    """``Header.mask`` sets exactly the fields' bits (IPv4 and BTH byte positions of RFC 791 and
    IBTA 9.2, typed here), and the iCRC-masked fields' masks are PROTOCOL.md §2's bytes."""
    assert proto.IPV4.mask(["ttl"]) == bytes(8) + b"\xff" + bytes(11)
    assert proto.IPV4.mask(["flag_df", "version"]) == b"\xf0" + bytes(5) + b"\x40" + bytes(13)
    assert proto.BTH.mask(["pad_cnt", "ack_req"]) == b"\x00\x30" + bytes(6) + b"\x80" + bytes(3)
    assert proto.BTH.mask([]) == bytes(12)
    masked = {name: getattr(proto, name).mask(fields)
              for name, fields in proto.ICRC_MASKED_FIELDS.items()}
    assert masked["IPV4"] == b"\x00\xff" + bytes(6) + b"\xff\x00\xff\xff" + bytes(8)
    assert masked["IPV6"] == b"\x0f\xff\xff\xff" + bytes(3) + b"\xff" + bytes(32)
    assert masked["UDP"] == bytes(6) + b"\xff\xff"
    assert masked["BTH"] == bytes(4) + b"\xff" + bytes(7)
    with pytest.raises(KeyError):
        proto.BTH.mask(["nonexistent"])


# --- enums and tables --------------------------------------------------------------------------

#: PROTOCOL.md §5.4 opcode table (typed from the document).
DOC_RC_OPCODES = {
    "SEND_FIRST": 0x00, "SEND_MIDDLE": 0x01, "SEND_LAST": 0x02, "SEND_LAST_WITH_IMMEDIATE": 0x03,
    "SEND_ONLY": 0x04, "SEND_ONLY_WITH_IMMEDIATE": 0x05, "RDMA_WRITE_FIRST": 0x06,
    "RDMA_WRITE_MIDDLE": 0x07, "RDMA_WRITE_LAST": 0x08, "RDMA_WRITE_LAST_WITH_IMMEDIATE": 0x09,
    "RDMA_WRITE_ONLY": 0x0A, "RDMA_WRITE_ONLY_WITH_IMMEDIATE": 0x0B, "RDMA_READ_REQUEST": 0x0C,
    "RDMA_READ_RESPONSE_FIRST": 0x0D, "RDMA_READ_RESPONSE_MIDDLE": 0x0E,
    "RDMA_READ_RESPONSE_LAST": 0x0F, "RDMA_READ_RESPONSE_ONLY": 0x10, "ACKNOWLEDGE": 0x11,
    "ATOMIC_ACKNOWLEDGE": 0x12, "COMPARE_SWAP": 0x13, "FETCH_ADD": 0x14,
    "SEND_LAST_WITH_INVALIDATE": 0x16, "SEND_ONLY_WITH_INVALIDATE": 0x17, "FLUSH": 0x1C,
    "ATOMIC_WRITE": 0x1D,
}


def test_rc_uc_ud_cnp_opcodes_match_protocol_md():
    for name, value in DOC_RC_OPCODES.items():
        assert proto.Opcode[f"RC_{name}"] == value
    for low in range(0x0C):          # UC = 0x20 | (0x00..0x0B)
        rc = proto.Opcode(low)
        assert proto.Opcode[f"UC_{rc.short_name}"] == 0x20 | low
    assert proto.Opcode.UD_SEND_ONLY == 0x64
    assert proto.Opcode.UD_SEND_ONLY_WITH_IMMEDIATE == 0x65
    assert proto.Opcode.CNP == 0x81
    expected = {f"RC_{n}" for n in DOC_RC_OPCODES} | \
        {f"UC_{proto.Opcode(i).short_name}" for i in range(0x0C)} | \
        {"UD_SEND_ONLY", "UD_SEND_ONLY_WITH_IMMEDIATE", "CNP"}
    assert {op.name for op in proto.Opcode} == expected


def test_opcodes_match_scapy_table():
    scapy_ops = {name: value for value, name in sroce._bth_opcodes.items()}
    for op in proto.Opcode:
        if op.name in scapy_ops:
            assert scapy_ops[op.name] == op, op.name
    # every RC/UC/UD opcode scapy knows is in proto.Opcode with the same value
    for name, value in scapy_ops.items():
        if name.startswith(("RC_", "UC_", "UD_")) or name == "CNP":
            assert proto.Opcode[name] == value


def test_opcode_headers_match_protocol_md():
    H = proto
    expect = {
        "SEND_FIRST": (), "SEND_MIDDLE": (), "SEND_LAST": (), "SEND_ONLY": (),
        "SEND_LAST_WITH_IMMEDIATE": (H.IMMDT,), "SEND_ONLY_WITH_IMMEDIATE": (H.IMMDT,),
        "RDMA_WRITE_FIRST": (H.RETH,), "RDMA_WRITE_MIDDLE": (), "RDMA_WRITE_LAST": (),
        "RDMA_WRITE_LAST_WITH_IMMEDIATE": (H.IMMDT,), "RDMA_WRITE_ONLY": (H.RETH,),
        "RDMA_WRITE_ONLY_WITH_IMMEDIATE": (H.RETH, H.IMMDT), "RDMA_READ_REQUEST": (H.RETH,),
        "RDMA_READ_RESPONSE_FIRST": (H.AETH,), "RDMA_READ_RESPONSE_MIDDLE": (),
        "RDMA_READ_RESPONSE_LAST": (H.AETH,), "RDMA_READ_RESPONSE_ONLY": (H.AETH,),
        "ACKNOWLEDGE": (H.AETH,), "SEND_LAST_WITH_INVALIDATE": (H.IETH,),
        "SEND_ONLY_WITH_INVALIDATE": (H.IETH,),
    }
    for name, hdrs in expect.items():
        assert proto.opcode_headers(proto.Opcode[f"RC_{name}"]) == hdrs, name
    assert [h.size for h in proto.opcode_headers(proto.Opcode.RC_ATOMIC_ACKNOWLEDGE)] == [4, 8]
    assert [h.size for h in proto.opcode_headers(proto.Opcode.RC_FETCH_ADD)] == [28]
    assert proto.opcode_headers(proto.Opcode.UD_SEND_ONLY) == (H.DETH,)
    assert proto.opcode_headers(proto.Opcode.UD_SEND_ONLY_WITH_IMMEDIATE) == (H.DETH, H.IMMDT)
    assert proto.opcode_headers(proto.Opcode.CNP) == (H.CNP_PAD,)
    with pytest.raises(ValueError, match="0x15"):
        proto.opcode_headers(0x15)


def test_aeth_syndromes():
    assert proto.aeth_syndrome(proto.AethType.ACK, 0x1F) == 0x1F == proto.AETH_ACK_UNLIMITED
    assert proto.aeth_syndrome(proto.AethType.RNR_NAK, 0) == 0x20
    for code, value in [("PSN_SEQUENCE_ERROR", 0x60), ("INVALID_REQUEST", 0x61),
                        ("REMOTE_ACCESS_ERROR", 0x62), ("REMOTE_OPERATIONAL_ERROR", 0x63),
                        ("INVALID_RD_REQUEST", 0x64)]:
        assert proto.aeth_syndrome(proto.AethType.NAK, proto.NakCode[code]) == value
        assert proto.aeth_decode(value) == (proto.AethType.NAK, proto.NakCode[code])
    assert proto.aeth_decode(0x85) == (proto.AethType.ACK, 5)    # bit 7 reserved, ignored
    with pytest.raises(ValueError):
        proto.aeth_syndrome(proto.AethType.ACK, 32)


def test_credit_table_matches_protocol_md(protocol_md):
    m = re.search(r"Codes 0-30 map to ([\d,]+) credits", protocol_md)
    assert m, "credit list not found in PROTOCOL.md"
    assert tuple(int(x) for x in m.group(1).split(",")) == proto.CREDIT_TABLE
    assert len(proto.CREDIT_TABLE) == 31


def test_rnr_table_matches_protocol_md(protocol_md):
    m = re.search(r"RNR timer code: (.*?) ms \|", protocol_md)
    assert m, "RNR list not found in PROTOCOL.md"
    pairs = re.findall(r"(\d+)=([\d.]+)", m.group(1))
    assert [int(c) for c, _ in pairs] == list(range(32))
    doc_us = [round(float(ms) * 1000) for _, ms in pairs]
    assert doc_us == list(proto.RNR_TIMER_US)


def test_pmtu_codes():
    assert [proto.pmtu_bytes(c) for c in range(1, 6)] == [256, 512, 1024, 2048, 4096]
    assert [proto.pmtu_code(n) for n in (256, 512, 1024, 2048, 4096)] == [1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="256"):
        proto.pmtu_code(1500)
    with pytest.raises(ValueError, match="1..5"):
        proto.pmtu_bytes(6)


def test_misc_constants():
    assert proto.ROCEV2_UDP_PORT == 4791
    assert proto.CM_UDP_PORT == 17185 and proto.CM_REPLY_UDP_PORT == 17186
    assert proto.GSI_QKEY == 0x80010000
    assert proto.PSN_MASK == 0xFFFFFF
    assert proto.CM_DATAGRAM_BYTES == proto.CM_DATAGRAM.size == 64
    assert (proto.ETHERTYPE_IPV4, proto.ETHERTYPE_IPV6, proto.ETHERTYPE_VLAN) == \
        (0x0800, 0x86DD, 0x8100)
    assert [int(x) for x in proto.CmReq] == [0, 1, 2, 3, 4, 5, 7]
    assert {x.name: int(x) for x in proto.CmAck} == \
        {"NULL": 0, "ACK": 1, "NO_QP": 2, "NAK": 3, "ERROR": 7}
    assert {x.name: int(x) for x in proto.Transport} == \
        {"RC": 0, "UC": 0x20, "RD": 0x40, "UD": 0x60, "CNP": 0x80, "XRC": 0xA0}


def test_cm_datagram_example():
    """A hand-assembled OPEN_QP datagram decodes field by field."""
    wire = bytes([0x01 | (1 << 1)]) + struct.pack(">IIIQI", 0x11, 0xC23298, 0x1234, 0xDEAD0000,
                                                   0xC0A80218) + bytes(24) + \
        struct.pack(">H", 0x4322) + bytes([0b1011]) + struct.pack(">III", 4096, 10, 0)
    assert len(wire) == 64
    f = proto.CM_DATAGRAM.unpack(wire)
    assert (f["valid"], f["req_type"], f["ack_valid"]) == (1, proto.CmReq.OPEN_QP, 0)
    assert (f["loc_qpn"], f["loc_psn"], f["loc_r_key"]) == (0x11, 0xC23298, 0x1234)
    assert (f["loc_base_addr"], f["loc_ip"], f["reply_port"]) == (0xDEAD0000, 0xC0A80218, 0x4322)
    assert (f["tx_valid"], f["tx_start"], f["tx_type"], f["tx_dma_length"], f["tx_n_transfers"]) \
        == (1, 1, 1, 4096, 10)


def test_split_l2_against_scapy():
    """The ethertype, tag and L3 offset of untagged and tagged frames, as scapy builds them;
    a frame that ends in the Ethernet header or in the tag is an error."""
    plain = bytes(Ether(dst="02:00:00:00:00:02", src="02:00:00:00:00:01", type=0x0800) / b"x")
    tagged = bytes(Ether(dst="02:00:00:00:00:02", src="02:00:00:00:00:01") /
                   Dot1Q(prio=5, dei=1, vlan=0x123, type=0x86DD) / b"x")
    assert proto.split_l2(plain) == (0x0800, None, 14)
    assert proto.split_l2(tagged) == (0x86DD, {"pcp": 5, "dei": 1, "vid": 0x123}, 18)
    with pytest.raises(ValueError, match="shorter than an Ethernet header"):
        proto.split_l2(plain[:13])
    with pytest.raises(ValueError, match="inside the 802.1Q tag"):
        proto.split_l2(tagged[:17])
