# SPDX-License-Identifier: BSD-2-Clause
"""A minimal cocotb test of roce_engine.v (docs/verilator.md): one ARP request for the engine's
IP on s_axis_rx, and its ARP reply on m_axis_tx. Any width."""

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge

MAC, PEER_MAC = 0x020000000001, 0x020000000002
IP, PEER_IP = 0x0A000001, 0x0A000002          # 10.0.0.1, 10.0.0.2


def arp_request():
    """ "Who has 10.0.0.1, tell 10.0.0.2" (RFC 826), padded to 60 bytes."""
    f = (b"\xff" * 6 + PEER_MAC.to_bytes(6, "big") + b"\x08\x06"
         + bytes.fromhex("0001 0800 06 04 0001") + PEER_MAC.to_bytes(6, "big")
         + PEER_IP.to_bytes(4, "big") + bytes(6) + IP.to_bytes(4, "big"))
    return f.ljust(60, b"\0")


@cocotb.test()
async def arp_reply(dut):
    nbytes = len(dut.s_axis_rx_tdata) // 8
    cocotb.start_soon(Clock(dut.clk, 10, units="ns").start())
    dut.local_mac.value = MAC
    dut.local_ip.value = IP
    dut.m_axis_tx_tready.value = 1
    dut.m_axis_rx_other_tready.value = 1
    for name in ("s_axis_rx_tvalid", "s_wr_valid", "s_resume_valid", "s_axis_payload_tvalid",
                 "s_qp_mgmt_req_valid", "s_ip_id_load_valid"):
        getattr(dut, name).value = 0
    dut.m_status_ready.value = 1
    dut.m_qp_mgmt_rsp_ready.value = 1
    dut.rst.value = 1
    for _ in range(4):
        await RisingEdge(dut.clk)
    dut.rst.value = 0

    frame = arp_request()
    for at in range(0, len(frame), nbytes):          # s_axis_rx_tready is constant 1
        beat = frame[at:at + nbytes]
        dut.s_axis_rx_tdata.value = int.from_bytes(beat, "little")   # byte 0 in tdata[7:0]
        dut.s_axis_rx_tkeep.value = (1 << len(beat)) - 1
        dut.s_axis_rx_tlast.value = at + nbytes >= len(frame)
        dut.s_axis_rx_tuser.value = 0
        dut.s_axis_rx_tvalid.value = 1
        await RisingEdge(dut.clk)
    dut.s_axis_rx_tvalid.value = 0

    reply = b""
    for _ in range(1000):
        await ReadOnly()
        if dut.m_axis_tx_tvalid.value:
            keep = dut.m_axis_tx_tkeep.value.integer
            data = dut.m_axis_tx_tdata.value.integer.to_bytes(nbytes, "little")
            reply += bytes(b for k, b in enumerate(data) if keep >> k & 1)
            if dut.m_axis_tx_tlast.value:
                break
        await RisingEdge(dut.clk)
    dut._log.info("reply: %s", reply.hex(" "))
    assert reply[0:6] == PEER_MAC.to_bytes(6, "big") and reply[12:14] == b"\x08\x06"
    assert reply[20:22] == b"\x00\x02"                # ARP reply
    assert reply[22:28] == MAC.to_bytes(6, "big") and reply[28:32] == IP.to_bytes(4, "big")
