# SPDX-License-Identifier: BSD-2-Clause
"""TX framer: work requests + payload -> RoCEv2 frames without iCRC (QP look-up, segmentation,
header build, header/payload merge)."""

from amaranth import *
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import layouts, proto
from ..config import EngineConfig
from ..lib.stream import PacketSignature, frame_layout
from ..qp_state import QPReadSignature, qp_index_width, tx_upd_layout
from ..verbs import status_layout, wr_layout

__all__ = ["HEADER_BYTES", "TxFramer"]

#: Frame header lengths (Eth 14 + IPv4 20 + UDP 8 + BTH 12 [+ RETH 16] [+ ImmDt 4]) indexed by
#: the header class ``(reth << 1) | imm``.
HEADER_BYTES = (54, 58, 70, 74)
_MAX_HDR = 74
_ETH_IPV4_UDP_BTH = 54
_OFF_IP_ID = 18
_OFF_IP_CSUM = 24
_OFF_PSN = 51

#: Number of recent PSN/state write-backs the framer remembers for WRs that read the QP table
#: before those write-backs landed (see :class:`TxFramer`, "PSN forwarding").
_CAM_DEPTH = 8

_STATUS_FIFO_DEPTH = 4

# WrOpcode (2 low bits) -> (FIRST, MIDDLE, LAST, ONLY) RC opcodes (IBTA Table 38)
_OPCODES = {
    int(proto.WrOpcode.RDMA_WRITE): (0x06, 0x07, 0x08, 0x0A),
    int(proto.WrOpcode.RDMA_WRITE_WITH_IMM): (0x06, 0x07, 0x09, 0x0B),
    int(proto.WrOpcode.SEND): (0x00, 0x01, 0x02, 0x04),
    int(proto.WrOpcode.SEND_WITH_IMM): (0x00, 0x01, 0x03, 0x05),
}

_LOC_LEN_ERR = 1
_LOC_QP_OP_ERR = 2


def _ceil_div_pow2(value, n, width):
    """``ceil(value / n)`` for a power-of-two ``n`` (an expression of ``width`` bits)."""
    shift = (n - 1).bit_length()
    return ((value + (n - 1)) >> shift)[:width]


def _fold(m, raw, name):
    """End-around-carry fold of a sum ``raw`` (< 2**21) to 16 bits, both carry outcomes added
    in parallel (one carry chain): the value in 1..0xFFFF congruent to ``raw`` mod 0xFFFF
    (``raw`` > 0). Returns the named 16-bit Signal."""
    s0 = Signal(17, name=f"{name}_s0")
    s1 = Signal(18, name=f"{name}_s1")   # 2 * (lo + hi + 1): the +1 as a carry in, not a
    out = Signal(16, name=name)           # second adder after lo + hi
    m.d.comb += [
        s0.eq(raw[:16] + raw[16:]),
        s1.eq(Cat(C(1, 1), raw[:16]) + Cat(C(1, 1), raw[16:])),
        out.eq(Mux(s0[16], s1[1:17], s0[:16])),
    ]
    return out


def _le_pow2(value, k):
    """``value <= 2**k`` without a carry chain."""
    return (value[k:] == 0) | ((value[k:] == 1) & (value[:k] == 0))


def _count_keep(cnt, n):
    """``keep`` of a beat holding ``cnt`` bytes (``cnt`` of log2(n) bits, 0 meaning ``n``)."""
    return Cat(*[(cnt == 0) | (cnt > j) if j < n - 1 else (cnt == 0) for j in range(n)])


def _select_by_pmtu(m, code, bits, out):
    """``out = bits[code]`` for a PMTU code 1..5 (``bits[1]`` for any other code: such a QP is
    refused before its packets are used)."""
    with m.Switch(code):
        for c in range(1, 6):
            with m.Case(c):
                m.d.comb += out.eq(bits[c])
        with m.Default():
            m.d.comb += out.eq(bits[1])


class TxFramer(wiring.Component):
    """Work requests + payload -> complete RoCEv2 Ethernet frames **without** the iCRC.

    This is the datapath of :class:`roce_hw.tx.engine.TxEngine` (which adds the QP table,
    the iCRC inserter and the documentation of the behaviour seen from outside). Pipeline:

    1. **Accept** (cycle 0): a WR transfer starts the QP read (``tx_rd``, 1 cycle). The WR
       waits in the accept register (the row held on the read port) until the segmenter takes
       it.
    2. **Segment** (cycle 1 for a message's first packet, straight from the accept register
       and the row; then one packet per cycle from the segmenter registers): the WR/QP checks
       and a packet descriptor -- opcode, lengths, PadCnt, AckReq, SE, RETH/ImmDt, the whole
       header except IP ID, IP checksum and PSN, the folded checksum sum, beat counts and
       keeps -- into a 1-entry descriptor register. Timing: "rest <= PMTU" comes from flags
       registered one step ahead (with the WR, or when the previous packet was built), every
       length is one adder of a mux and a small table constant, and the IPv4 checksum is one
       multi-operand sum per outcome of "last packet" with a carry-select fold, so no carry
       chain feeds another one except sum -> fold.
    3. **Merge** (cycle 2; with ``config.low_latency`` already in cycle 1 when the descriptor
       register is empty): the descriptor is taken; IP ID, checksum (``~(sum + id)``, one's
       complement) and PSN (from the row or the forwarding CAM, then +1 per packet) are patched
       in (with ``config.low_latency``, a descriptor taken straight from the segmenter gets a
       checksum summed there with a registered ``k_sum + IP ID`` term), and the header is merged
       with the realigned payload. ``o`` is driven
       combinationally from this stage (``o.valid`` never depends on ``o.ready``). The header
       length ``H`` is 54/58/70/74 bytes; every packet's payload starts in lane 0 of an input
       beat (PMTU >= 256 is a multiple of the bytes per beat), so the realignment shift is
       ``H mod (W/8)``: one of at most 4 constants, chosen by the header class. A shift
       register holds the header beats still to go, then the tail of the previous input beat.

    Giving up a message. When the merger refuses a message late (its QP went to ERROR while
    the WR was in the pipeline) or ends one on a length mismatch before its last packet, it
    drops that message's remaining descriptors at once (descriptor register and segmenter,
    found by a 1-bit message tag), so even a 2**31-byte message is abandoned in one cycle.

    PSN forwarding. The PSN and state that a WR reads in cycle 0 may be stale by the
    write-backs of the messages still ahead of it in the pipeline (at most 6 of them: segmenter,
    descriptor register, merger, and two write-backs waiting for ``tx_upd``). The
    merger keeps its last 8 write-backs (QP index, next PSN, error) and, when it starts a
    message, uses the newest matching one instead of the row read. Management writes to a QP
    (seen on ``mgmt_snoop_*``) clear its entries.

    Members
    -------
    wr, i, status, local_mac, local_ip, ip_id_load, frames, frames_aborted, wrs_refused,
    status_dropped
        As in :class:`roce_hw.tx.engine.TxEngine`.
    o : ``Out(stream.Signature(frame_layout(W)))``
        Frames without iCRC (``abort`` on the last beat of a frame to discard).
    tx_rd : ``Out(QPReadSignature(idx_width))``
        QP table read port.
    tx_upd : ``Out(stream.Signature(tx_upd_layout(n_qp)))``
        QP table write-back (next PSN; state ERROR after a mid-message length mismatch).
    mgmt_snoop_valid : ``In(1)``, mgmt_snoop_qp : ``In(idx_width)``
        A management write of QP ``mgmt_snoop_qp`` is taking place this cycle.
    """

    def __init__(self, config):
        if not isinstance(config, EngineConfig):
            raise TypeError(f"expected an EngineConfig, not {config!r}")
        self._config = config
        w = config.data_width
        qw = qp_index_width(config.n_qp)
        super().__init__({
            "wr": In(stream.Signature(wr_layout(config))),
            "i": In(PacketSignature(w)),
            "o": Out(stream.Signature(frame_layout(w))),
            "status": Out(stream.Signature(status_layout(config))),
            "tx_rd": Out(QPReadSignature(qw)),
            "tx_upd": Out(stream.Signature(tx_upd_layout(config.n_qp))),
            "mgmt_snoop_valid": In(1),
            "mgmt_snoop_qp": In(qw),
            "local_mac": In(48),
            "local_ip": In(32),
            "ip_id_load": In(stream.Signature(data.StructLayout({"value": 16}))),
            "frames": Out(32),
            "frames_aborted": Out(32),
            "wrs_refused": Out(32),
            "status_dropped": Out(16),
        })

    def elaborate(self, platform):
        cfg = self._config
        m = Module()
        N = cfg.data_bytes
        W = cfg.data_width
        lg = (N - 1).bit_length()
        qw = qp_index_width(cfg.n_qp)
        srb = N * -(-_MAX_HDR // N)          # shift register bytes: header rounded up to beats
        hb = [h // N for h in HEADER_BYTES]  # pure header beats per class
        sh = [h % N for h in HEADER_BYTES]   # realignment shift per class (never 0)
        ack_every = cfg.ack_req_every

        # ------------------------------------------------------------------ accept + check
        a_valid = Signal()
        a_wr = Signal(self.wr.payload.shape())
        a_move = Signal()
        wr_go = Signal()
        m.d.comb += [
            self.wr.ready.eq(~a_valid | a_move),
            wr_go.eq(self.wr.valid & self.wr.ready),
            self.tx_rd.addr.eq(self.wr.payload.qp),
            self.tx_rd.en.eq(wr_go),
        ]
        a_le = Signal(6)        # a_wr.length <= 128 << code, per PMTU code 1..5
        wr_le = Signal(6)
        for code in range(1, 6):
            m.d.comb += wr_le[code].eq(_le_pow2(self.wr.payload.length, 7 + code))
        with m.If(wr_go):
            m.d.sync += [a_wr.eq(self.wr.payload), a_valid.eq(1), a_le.eq(wr_le)]
        with m.Elif(a_move):
            m.d.sync += a_valid.eq(0)

        ctx = self.tx_rd.data
        bad_qp = Signal()
        bad_op = Signal()
        bad_state = Signal()
        bad_pmtu = Signal()
        bad_len = Signal()
        a_refuse = Signal(5)
        m.d.comb += [
            bad_qp.eq(a_wr.qp >= cfg.n_qp) if cfg.n_qp < (1 << qw) else bad_qp.eq(0),
            bad_op.eq(a_wr.opcode > 3),
            bad_state.eq(ctx.state != proto.QPState.RTS),
            bad_pmtu.eq((ctx.pmtu < 1) | (ctx.pmtu > 5)),
            bad_len.eq(a_wr.length > (1 << 31)),
        ]
        with m.If(bad_qp | bad_op | bad_state | bad_pmtu):
            m.d.comb += a_refuse.eq(_LOC_QP_OP_ERR)
        with m.Elif(bad_len):
            m.d.comb += a_refuse.eq(_LOC_LEN_ERR)

        # ------------------------------------------------------------------ segmenter
        msg_layout = data.StructLayout({
            "wr_id": 64, "opcode": 2, "qp": qw, "remote_addr": 64, "r_key": 32, "length": 32,
            "imm": 32, "solicited": 1, "refuse": 5, "remote_qpn": 24, "remote_mac": 48,
            "remote_ip": 32, "udp_sport": 16, "dscp": 6, "ecn": 2, "p_key": 16, "migreq": 1,
            "pmtu": 3, "next_psn": 24, "tag": 1,
        })
        s_valid = Signal()          # a message with packets left is in the segmenter
        a_tag = Signal()            # tag of the next message the segmenter takes
        s = Signal(msg_layout)
        s_rem = Signal(32)
        s_first = Signal()
        s_le = Signal()             # s_rem <= PMTU
        s_ackcnt = Signal(range(max(2, ack_every)))
        # the segmenter works on its registers, or straight on the accepted WR and its QP row
        # when it is empty (so the first descriptor is ready the cycle after the read)
        v = Signal(msg_layout)
        v_rem = Signal(32)
        v_first = Signal()
        v_ackcnt = Signal.like(s_ackcnt)
        with m.If(s_valid):
            m.d.comb += [v.eq(s), v_rem.eq(s_rem), v_first.eq(s_first), v_ackcnt.eq(s_ackcnt)]
        with m.Else():
            m.d.comb += [
                v.wr_id.eq(a_wr.wr_id), v.opcode.eq(a_wr.opcode[:2]), v.qp.eq(a_wr.qp),
                v.remote_addr.eq(a_wr.remote_addr), v.r_key.eq(a_wr.r_key),
                v.length.eq(a_wr.length), v.imm.eq(a_wr.imm), v.solicited.eq(a_wr.solicited),
                v.refuse.eq(a_refuse),
                v.remote_qpn.eq(ctx.remote_qpn), v.remote_mac.eq(ctx.remote_mac),
                v.remote_ip.eq(ctx.remote_ip), v.udp_sport.eq(ctx.udp_sport),
                v.dscp.eq(ctx.dscp), v.ecn.eq(ctx.ecn), v.p_key.eq(ctx.p_key),
                v.migreq.eq(ctx.migreq), v.pmtu.eq(ctx.pmtu), v.next_psn.eq(ctx.next_psn),
                v.tag.eq(a_tag),
                v_rem.eq(a_wr.length), v_first.eq(1), v_ackcnt.eq(0),
            ]

        pd_layout = data.StructLayout({
            "hdr": _MAX_HDR * 8,
            "sel": 2,                 # header class: bit 1 RETH, bit 0 ImmDt
            "out_beats": 11,
            "in_beats": 11,
            "lik": N,                 # keep of the packet's last input beat
            "lok": N,                 # keep of the frame's last beat
            "csum": 16,               # folded IPv4 checksum sum without the IP ID
            "first": 1, "last": 1,    # first / last packet of the message
            "qp": qw, "ram_psn": 24, "refuse": 5, "has_payload": 1, "wr_id": 64,
            "tag": 1,                 # message tag (alternates per message), for flushing
        })
        ph_valid = Signal()
        ph = Signal(pd_layout)
        ph_take = Signal()
        pd = Signal(pd_layout)
        pd_push = Signal()
        # the merger sees the descriptor register, or (low_latency) the descriptor being built
        # when the register is empty
        pe = Signal(pd_layout)
        pe_valid = Signal()
        pe_take = Signal()
        direct = Signal()
        m.d.comb += [
            pe.eq(Mux(ph_valid, ph, pd) if cfg.low_latency else ph),
            pe_valid.eq(ph_valid | (s_valid | a_valid) if cfg.low_latency else ph_valid),
            ph_take.eq(pe_take & ph_valid),
            direct.eq(pe_take & ~ph_valid),
            pd_push.eq((s_valid | a_valid) & (~ph_valid | ph_take)),
            a_move.eq(a_valid & ~s_valid & pd_push),
        ]
        with m.If(pd_push & ~direct):
            m.d.sync += [ph.eq(pd), ph_valid.eq(1)]
        with m.Elif(ph_take):
            m.d.sync += ph_valid.eq(0)
        with m.If(a_move):
            m.d.sync += a_tag.eq(~a_tag)
        # flush: the merger gave up a message (refused late, or a length mismatch before its
        # last packet): drop its descriptors still in the descriptor register or to come from
        # the segmenter (at most one message is ever split between them and the merger)
        flush = Signal()
        flush_tag = Signal()
        new_ph_tag = Signal()
        new_s_tag = Signal()
        m.d.comb += [
            new_ph_tag.eq(Mux(pd_push & ~direct, pd.tag, ph.tag)),
            new_s_tag.eq(Mux(pd_push, v.tag, s.tag)),
        ]

        pmtu_bytes = Signal(13)
        with m.Switch(v.pmtu):
            for code in range(1, 6):
                with m.Case(code):
                    m.d.comb += pmtu_bytes.eq(128 << code)
            with m.Default():
                m.d.comb += pmtu_bytes.eq(256)
        # rem_le: the rest of the message fits in this packet (v_rem <= PMTU), from registered
        # flags: a message's first packet uses `a_le` (length <= 2**k for every PMTU code, taken
        # with the WR), a later one `s_le` (v_rem <= 2 * PMTU when the previous packet was built)
        rem_le = Signal()
        rem_le_a = Signal()
        _select_by_pmtu(m, ctx.pmtu, a_le, rem_le_a)
        m.d.comb += rem_le.eq(Mux(s_valid, s_le, rem_le_a))
        rem_le2_k = Signal(6)
        rem_le2 = Signal()
        for code in range(1, 6):
            m.d.comb += rem_le2_k[code].eq(_le_pow2(v_rem, 8 + code))
        _select_by_pmtu(m, v.pmtu, rem_le2_k, rem_le2)
        p_last = Signal()
        p_len = Signal(13)
        p_pad = Signal(2)
        is_write = Signal()
        has_imm = Signal()
        p_reth = Signal()
        p_imm = Signal()
        p_opcode = Signal(8)
        p_ack = Signal()
        p_se = Signal()
        p_tot = Signal(16)
        p_flen = Signal(13)
        # every length is A + B: A = the padded payload length without its 2 low bits
        # (a mux, no adder: v_rem of a last packet, else the PMTU) and B a constant chosen by
        # RETH / ImmDt / "v_rem not a multiple of 4" from small tables (no carry chain before
        # the one adder per length)
        p_a = Signal(13)
        nz4 = Signal()
        b_tot = Signal(7)     # IPv4 + UDP + BTH + ext + iCRC + 4 * nz4
        b_udp = Signal(7)     # b_tot - 20
        b_flen = Signal(7)    # b_tot + 10 (Ethernet header minus the iCRC)
        b_outc = Signal(8)    # b_flen + N - 1 (ceil to beats)
        p_udp = Signal(16)
        p_outc = Signal(14)
        m.d.comb += [
            p_last.eq(rem_le | (v.refuse != 0)),
            p_len.eq(Mux(rem_le, v_rem[:13], pmtu_bytes)),
            p_pad.eq(Mux(rem_le, -v_rem[:2], 0)),
            is_write.eq((v.opcode == proto.WrOpcode.RDMA_WRITE) |
                        (v.opcode == proto.WrOpcode.RDMA_WRITE_WITH_IMM)),
            has_imm.eq((v.opcode == proto.WrOpcode.RDMA_WRITE_WITH_IMM) |
                       (v.opcode == proto.WrOpcode.SEND_WITH_IMM)),
            p_reth.eq(is_write & v_first),
            # the header fields use `rem_le`, not `p_last`: they differ only for a refused
            # WR, whose header is never sent (keeps the QP-row checks off these paths)
            p_imm.eq(has_imm & rem_le),
            p_ack.eq(rem_le | (v_ackcnt == ack_every - 1)),
            p_se.eq(rem_le & v.solicited & (v.opcode != proto.WrOpcode.RDMA_WRITE)),
            nz4.eq(rem_le & (v_rem[:2] != 0)),
            p_a.eq(Mux(rem_le, Cat(C(0, 2), v_rem[2:13]), pmtu_bytes)),
        ]
        with m.Switch(Cat(nz4, p_imm, p_reth)):
            for c in range(8):
                with m.Case(c):
                    bt = 20 + 8 + 12 + proto.ICRC_BYTES + 4 * (c & 1) + 4 * ((c >> 1) & 1) + \
                        16 * (c >> 2)
                    m.d.comb += [b_tot.eq(bt), b_udp.eq(bt - 20),
                                 b_flen.eq(bt + _ETH_IPV4_UDP_BTH - 40 - proto.ICRC_BYTES),
                                 b_outc.eq(bt + _ETH_IPV4_UDP_BTH - 40 - proto.ICRC_BYTES +
                                           N - 1)]
        m.d.comb += [
            p_tot.eq(p_a + b_tot),
            p_udp.eq(p_a + b_udp),
            p_flen.eq(p_a + b_flen),
            p_outc.eq(p_a + b_outc),
        ]
        with m.Switch(Cat(rem_le, v_first, v.opcode)):
            for op, codes in _OPCODES.items():
                for first in (0, 1):
                    for last in (0, 1):
                        code = codes[(2 if last else 1) if not first else (3 if last else 0)]
                        with m.Case(last | (first << 1) | (op << 2)):
                            m.d.comb += p_opcode.eq(code)

        with m.If(pd_push):
            # (s_rem only matters when the packet was not the last one, i.e. a full one)
            m.d.sync += [s_valid.eq(~p_last), s.eq(v), s_rem.eq(v_rem - pmtu_bytes), s_first.eq(0),
                         s_le.eq(rem_le2),
                         s_ackcnt.eq(Mux(v_ackcnt == ack_every - 1, 0, v_ackcnt + 1))]

        # header (IP ID, IP checksum and PSN left 0: patched in by the merger)
        eth = Signal(layouts.ETH)
        ip = Signal(layouts.IPV4)
        udp = Signal(layouts.UDP)
        bth = Signal(layouts.BTH)
        reth = Signal(layouts.RETH)
        immdt = Signal(layouts.IMMDT)
        m.d.comb += [
            eth.dst.eq(v.remote_mac), eth.src.eq(self.local_mac),
            eth.ethertype.eq(proto.ETHERTYPE_IPV4),
            ip.version.eq(4), ip.ihl.eq(5), ip.dscp.eq(v.dscp), ip.ecn.eq(v.ecn),
            ip.total_length.eq(p_tot), ip.flag_df.eq(1), ip.ttl.eq(cfg.ttl),
            ip.protocol.eq(proto.IP_PROTO_UDP), ip.src.eq(self.local_ip), ip.dst.eq(v.remote_ip),
            udp.src_port.eq(v.udp_sport), udp.dst_port.eq(proto.ROCEV2_UDP_PORT),
            udp.length.eq(p_udp),
            bth.opcode.eq(p_opcode), bth.se.eq(p_se), bth.migreq.eq(v.migreq),
            bth.pad_cnt.eq(p_pad), bth.p_key.eq(v.p_key), bth.dest_qp.eq(v.remote_qpn),
            bth.ack_req.eq(p_ack),
            reth.va.eq(v.remote_addr), reth.r_key.eq(v.r_key), reth.dma_length.eq(v.length),
            immdt.imm.eq(v.imm),
        ]
        ext = Signal(20 * 8)
        with m.If(p_reth):
            m.d.comb += ext.eq(Cat(layouts.to_lanes(reth, 16), layouts.to_lanes(immdt, 4)))
        with m.Else():
            m.d.comb += ext.eq(layouts.to_lanes(immdt, 4))
        csum_const = 0x4500 + 0x4000 + ((cfg.ttl << 8) | proto.IP_PROTO_UDP)
        src_sum_in = Signal(17)
        k_sum = Signal(18, init=csum_const)   # checksum terms of the constant fields + source
        m.d.comb += src_sum_in.eq(self.local_ip[16:32] + self.local_ip[:16])
        m.d.sync += k_sum.eq(csum_const + src_sum_in)
        ip_id = Signal(16, init=cfg.ip_id_start)
        # IPv4 checksum: every term in one multi-operand adder, then an end-around fold (the
        # folded value is the same whatever the order of the terms: the one in 1..0xFFFF
        # congruent to the sum mod 0xFFFF). Both outcomes of `rem_le` are summed in parallel
        # (a last packet: padded v_rem + its header; a full one: the PMTU + its header) and
        # chosen after the fold, so the QP row's PMTU check is off the adder path.
        tos = Signal(8)
        b_tot_last = Signal(7)
        b_tot_full = Signal(7)
        m.d.comb += [
            tos.eq(Cat(v.ecn, v.dscp)),
            b_tot_full.eq(Mux(p_reth, 16, 0) + (20 + 8 + 12 + proto.ICRC_BYTES)),
        ]
        with m.Switch(Cat(v_rem[:2] != 0, has_imm, p_reth)):
            for c in range(8):
                with m.Case(c):
                    m.d.comb += b_tot_last.eq(20 + 8 + 12 + proto.ICRC_BYTES + 4 * (c & 1) +
                                              4 * ((c >> 1) & 1) + 16 * (c >> 2))

        def csum_sum(k, name):
            raws = []
            for case, length, hdr in (("l", Cat(C(0, 2), v_rem[2:13]), b_tot_last),
                                      ("f", pmtu_bytes, b_tot_full)):
                raw = Signal(21, name=f"{name}_raw_{case}")
                # (the two terms that make the 4 sums differ first: a common prefix would be
                # shared between them, i.e. an adder chained in front)
                m.d.comb += raw.eq(length + k + hdr + tos + v.remote_ip[16:32] +
                                   v.remote_ip[:16])
                raws.append(_fold(m, raw, f"{name}_{case}"))
            out = Signal(16, name=name)
            m.d.comb += out.eq(Mux(rem_le, raws[0], raws[1]))
            return out

        csum_f = csum_sum(k_sum, "csum_f")
        # the same sum with the IP ID, for the descriptor taken straight from here
        # (low_latency): `id_sum` = k_sum + ip_id is kept in a register
        id_sum = Signal(18, init=csum_const + cfg.ip_id_start)
        csum_d = Signal(16)
        if cfg.low_latency:
            m.d.comb += csum_d.eq(~csum_sum(id_sum, "csum_d_f"))
        in_cnt = Signal(lg)          # bytes in the last input beat, 0 meaning N
        out_cnt = Signal(lg)
        m.d.comb += [in_cnt.eq(p_len[:lg]), out_cnt.eq(p_flen[:lg])]
        m.d.comb += [
            pd.hdr.eq(Cat(layouts.to_lanes(eth, 14), layouts.to_lanes(ip, 20),
                          layouts.to_lanes(udp, 8), layouts.to_lanes(bth, 12), ext)),
            pd.sel.eq(Cat(p_imm, p_reth)),
            pd.out_beats.eq(p_outc[lg:]),
            pd.in_beats.eq(Mux(rem_le, _ceil_div_pow2(v_rem[:13], N, 11), pmtu_bytes >> lg)),
            pd.lik.eq(_count_keep(in_cnt, N)),
            pd.lok.eq(_count_keep(out_cnt, N)),
            pd.csum.eq(csum_f),
            pd.first.eq(v_first), pd.last.eq(p_last),
            pd.qp.eq(v.qp), pd.ram_psn.eq(v.next_psn), pd.refuse.eq(v.refuse),
            pd.has_payload.eq(v.length != 0), pd.wr_id.eq(v.wr_id), pd.tag.eq(v.tag),
        ]

        # ------------------------------------------------------------------ merger
        # CAM of recent write-backs
        cam_v = [Signal(name=f"cam{k}_valid") for k in range(_CAM_DEPTH)]
        cam_qp = [Signal(qw, name=f"cam{k}_qp") for k in range(_CAM_DEPTH)]
        cam_psn = [Signal(24, name=f"cam{k}_psn") for k in range(_CAM_DEPTH)]
        cam_err = [Signal(name=f"cam{k}_err") for k in range(_CAM_DEPTH)]
        hit = Signal()
        hit_psn = Signal(24)
        hit_err = Signal()
        for k in reversed(range(_CAM_DEPTH)):      # newest (0) wins
            with m.If(cam_v[k] & (cam_qp[k] == pe.qp)):
                m.d.comb += [hit.eq(1), hit_psn.eq(cam_psn[k]), hit_err.eq(cam_err[k])]

        # merger mode (a plain register rather than m.FSM: its next value is decided by the
        # beat datapath below in a few places): IDLE = between packets, BUSY = in a packet,
        # DRAIN = dropping the rest of a refused or mismatched payload packet from `i`
        IDLE, BUSY, DRAIN = range(3)
        mode = Signal(2)
        sr = Signal(srb * 8)
        c_sel = Signal(2)
        c_hdr_left = Signal(range(max(hb) + 2))
        c_in_left = Signal(11)
        c_out_left = Signal(11)
        c_final = Signal()        # last packet of its message
        c_first = Signal()        # first packet of its message
        c_lik = Signal(N)
        c_lok = Signal(N)
        c_beat0 = Signal()        # next beat is the frame's first
        c_qp = Signal(qw)
        c_wr_id = Signal(64)
        psn = Signal(24)
        c_tag = Signal()

        # write-backs wait in a 2-entry FIFO: the merger needs room for one (a registered
        # condition, so `o.valid` never depends on `tx_upd.ready`)
        wb = Signal(tx_upd_layout(cfg.n_qp))
        wb_space = Signal()
        m.submodules.wb_fifo = wb_fifo = fifo.SyncFIFO(
            width=Shape.cast(tx_upd_layout(cfg.n_qp)).width, depth=2)
        m.d.comb += [
            wb_fifo.w_data.eq(wb),
            self.tx_upd.valid.eq(wb_fifo.r_rdy),
            self.tx_upd.payload.eq(wb_fifo.r_data),
            wb_fifo.r_en.eq(self.tx_upd.ready),
            wb_space.eq(wb_fifo.w_rdy),
        ]

        st_fifo = fifo.SyncFIFO(width=Shape.cast(status_layout(cfg)).width,
                                depth=_STATUS_FIFO_DEPTH)
        m.submodules.status_fifo = st_fifo
        st_push = Signal()
        st_data = Signal(status_layout(cfg))
        m.d.comb += [
            st_fifo.w_en.eq(st_push),
            st_fifo.w_data.eq(st_data),
            self.status.valid.eq(st_fifo.r_rdy),
            self.status.payload.eq(st_fifo.r_data),
            st_fifo.r_en.eq(self.status.ready),
        ]
        st_dropped = Signal(16)
        with m.If(st_push & ~st_fifo.w_rdy & (st_dropped != 0xFFFF)):
            m.d.sync += st_dropped.eq(st_dropped + 1)
        n_frames = Signal(32)
        n_aborted = Signal(32)
        n_refused = Signal(32)
        m.d.comb += [
            self.status_dropped.eq(st_dropped),
            self.frames.eq(n_frames),
            self.frames_aborted.eq(n_aborted),
            self.wrs_refused.eq(n_refused),
            self.ip_id_load.ready.eq(1),
        ]

        late_refuse = Signal()
        m.d.comb += late_refuse.eq(pe.first & hit & hit_err)
        ntake = Signal()   # start a packet
        rtake = Signal()   # refuse a WR
        idle_ph = Signal()
        m.d.comb += [
            idle_ph.eq((mode == IDLE) & pe_valid),
            ntake.eq(idle_ph & (pe.refuse == 0) & ~late_refuse),
            rtake.eq(idle_ph & ((pe.refuse != 0) | late_refuse)),
            pe_take.eq(ntake | rtake),
        ]

        # effective current-packet parameters (descriptor on a take, registers otherwise)
        e_sel = Signal(2)
        e_hdr_left = Signal.like(c_hdr_left)
        e_in_left = Signal(11)
        e_out_left = Signal(11)
        e_final = Signal()
        e_first = Signal()
        e_lik = Signal(N)
        e_lok = Signal(N)
        e_beat0 = Signal()
        e_psn = Signal(24)
        e_qp = Signal(qw)
        e_wr_id = Signal(64)
        low_src = Signal(srb * 8)
        hdr_full = Signal(_MAX_HDR * 8)
        patch = Signal(_MAX_HDR * 8)
        take_psn = Signal(24)
        take_csum = Signal(16)
        csum_s = Signal(17)
        csum_m = _fold(m, csum_s, "csum_m")
        m.d.comb += [
            take_psn.eq(Mux(pe.first, Mux(hit, hit_psn, pe.ram_psn), psn + 1)),
            csum_s.eq(ph.csum + ip_id),
            take_csum.eq(Mux(ph_valid, ~csum_m, csum_d) if cfg.low_latency else ~csum_m),
            patch[_OFF_IP_ID * 8:(_OFF_IP_ID + 2) * 8].eq(layouts.to_lanes(ip_id, 2)),
            patch[_OFF_IP_CSUM * 8:(_OFF_IP_CSUM + 2) * 8].eq(layouts.to_lanes(take_csum, 2)),
            patch[_OFF_PSN * 8:(_OFF_PSN + 3) * 8].eq(layouts.to_lanes(take_psn, 3)),
            hdr_full.eq(pe.hdr | patch),
        ]
        with m.If(ntake):
            with m.Switch(pe.sel):
                for c in range(4):
                    with m.Case(c):
                        m.d.comb += e_hdr_left.eq(hb[c])
            m.d.comb += [
                e_sel.eq(pe.sel), e_in_left.eq(pe.in_beats),
                e_out_left.eq(pe.out_beats), e_final.eq(pe.last), e_first.eq(pe.first),
                e_lik.eq(pe.lik), e_lok.eq(pe.lok), e_beat0.eq(1), e_psn.eq(take_psn),
                e_qp.eq(pe.qp), e_wr_id.eq(pe.wr_id), low_src.eq(hdr_full),
            ]
        with m.Else():
            m.d.comb += [
                e_sel.eq(c_sel), e_hdr_left.eq(c_hdr_left), e_in_left.eq(c_in_left),
                e_out_left.eq(c_out_left), e_final.eq(c_final), e_first.eq(c_first),
                e_lik.eq(c_lik), e_lok.eq(c_lok), e_beat0.eq(c_beat0), e_psn.eq(psn),
                e_qp.eq(c_qp), e_wr_id.eq(c_wr_id), low_src.eq(sr),
            ]

        active = Signal()
        is_hdr = Signal()
        want_in = Signal()
        can_emit = Signal()
        emit = Signal()
        consumed = Signal()
        m.d.comb += [
            active.eq(ntake | (mode == BUSY)),
            is_hdr.eq(e_hdr_left != 0),
            want_in.eq(active & ~is_hdr & (e_in_left != 0)),
            can_emit.eq(wb_space),
            self.o.valid.eq(active & can_emit & (~want_in | self.i.valid)),
            emit.eq(self.o.valid & self.o.ready),
            consumed.eq(want_in & emit),
            self.i.ready.eq((want_in & can_emit & self.o.ready) | (mode == DRAIN)),
        ]

        # payload beat: mask the lanes after the packet's last byte (they become pad = 0)
        in_last_beat = Signal()
        cur = Signal(W)
        m.d.comb += in_last_beat.eq(e_in_left == 1)
        with m.If(want_in):
            with m.If(in_last_beat):
                m.d.comb += cur.eq(self.i.payload.data &
                                   Cat(*[e_lik[j].replicate(8) for j in range(N)]))
            with m.Else():
                m.d.comb += cur.eq(self.i.payload.data)

        out_data = Signal(W)
        sr_next = Signal(srb * 8)
        with m.If(is_hdr):
            m.d.comb += [out_data.eq(low_src[:W]), sr_next.eq(low_src[W:])]
        with m.Else():
            with m.Switch(e_sel):
                for c in range(4):
                    with m.Case(c):
                        k = sh[c]
                        m.d.comb += [
                            out_data.eq(Cat(low_src[:8 * k], cur[:8 * (N - k)])),
                            sr_next.eq(cur[8 * (N - k):]),
                        ]

        exp_last = Signal()
        mism = Signal()
        out_last = Signal()
        m.d.comb += [
            exp_last.eq(e_final & in_last_beat),
            mism.eq(want_in & ((self.i.payload.last != exp_last) |
                                (exp_last & (self.i.payload.keep != e_lik)))),
            out_last.eq(e_out_left == 1),
        ]

        m.d.comb += [
            self.o.payload.data.eq(out_data),
            self.o.payload.keep.eq(Mux(out_last & ~mism, e_lok, (1 << N) - 1)),
            self.o.payload.first.eq(e_beat0),
            self.o.payload.last.eq(out_last | mism),
            self.o.payload.abort.eq(mism),
        ]

        wb_push = Signal()
        wb_psn = Signal(24)
        wb_err = Signal()

        # register updates of the current packet
        with m.If(ntake):
            m.d.sync += [
                c_sel.eq(pe.sel), c_final.eq(pe.last), c_first.eq(pe.first), c_lik.eq(pe.lik),
                c_lok.eq(pe.lok), c_qp.eq(pe.qp), c_wr_id.eq(pe.wr_id), psn.eq(take_psn),
                c_tag.eq(pe.tag),
                n_frames.eq(n_frames + 1),
            ]
        # IP ID counter and `id_sum` (its checksum term, each next value computed for the
        # three cases in parallel and chosen late by `ntake`)
        ip_id_inc = Signal(16)
        ip_id_next = Signal(16)
        id_sum_keep = Signal(18)
        id_sum_inc = Signal(18)
        id_sum_load = Signal(18)
        id_sum_next = Signal(18)
        m.d.comb += [
            ip_id_inc.eq(ip_id + 1),
            id_sum_keep.eq(csum_const + src_sum_in + ip_id),
            id_sum_inc.eq(csum_const + src_sum_in + ip_id_inc),
            id_sum_load.eq(csum_const + src_sum_in + self.ip_id_load.payload.value),
        ]
        with m.If(self.ip_id_load.valid):
            m.d.comb += [ip_id_next.eq(self.ip_id_load.payload.value), id_sum_next.eq(id_sum_load)]
        with m.Elif(ntake):
            m.d.comb += [ip_id_next.eq(ip_id_inc), id_sum_next.eq(id_sum_inc)]
        with m.Else():
            m.d.comb += [ip_id_next.eq(ip_id), id_sum_next.eq(id_sum_keep)]
        m.d.sync += ip_id.eq(ip_id_next)
        if cfg.low_latency:
            m.d.sync += id_sum.eq(id_sum_next)

        with m.If(emit):
            m.d.sync += [
                sr.eq(sr_next),
                c_hdr_left.eq(Mux(is_hdr, e_hdr_left - 1, 0)),
                c_in_left.eq(e_in_left - consumed),
                c_out_left.eq(e_out_left - 1),
                c_beat0.eq(0),
            ]
            with m.If(mism):
                m.d.comb += [
                    st_push.eq(1), st_data.wr_id.eq(e_wr_id), st_data.qp.eq(e_qp),
                    st_data.status.eq(_LOC_LEN_ERR),
                    wb_push.eq(~e_first), wb_psn.eq(e_psn), wb_err.eq(1),
                    flush.eq(~e_final), flush_tag.eq(Mux(ntake, pe.tag, c_tag)),
                ]
                m.d.sync += [n_aborted.eq(n_aborted + 1), n_refused.eq(n_refused + 1),
                             mode.eq(Mux(self.i.payload.last, IDLE, DRAIN))]
            with m.Elif(out_last):
                m.d.sync += mode.eq(IDLE)
                with m.If(e_final):
                    m.d.comb += [wb_push.eq(1), wb_psn.eq(e_psn + 1), wb_err.eq(0)]
            with m.Else():
                m.d.sync += mode.eq(BUSY)
        with m.Elif(ntake):
            # descriptor taken but its first beat cannot go out yet
            m.d.sync += [
                sr.eq(hdr_full),
                c_hdr_left.eq(e_hdr_left),
                c_in_left.eq(e_in_left),
                c_out_left.eq(e_out_left),
                c_beat0.eq(1),
                mode.eq(BUSY),
            ]

        with m.If(rtake):
            m.d.comb += [
                st_push.eq(1), st_data.wr_id.eq(pe.wr_id), st_data.qp.eq(pe.qp),
                st_data.status.eq(Mux(pe.refuse != 0, pe.refuse, _LOC_QP_OP_ERR)),
            ]
            m.d.comb += [flush.eq(~pe.last), flush_tag.eq(pe.tag)]
            m.d.sync += n_refused.eq(n_refused + 1)
            with m.If(pe.has_payload):
                m.d.sync += mode.eq(DRAIN)

        with m.If((mode == DRAIN) & self.i.valid & self.i.payload.last):
            m.d.sync += mode.eq(IDLE)

        # write-back and its forwarding CAM
        m.d.comb += [
            wb_fifo.w_en.eq(wb_push), wb.qp.eq(e_qp), wb.psn_we.eq(1), wb.next_psn.eq(wb_psn),
            wb.state_we.eq(wb_err), wb.state.eq(proto.QPState.ERROR),
        ]
        for k in range(_CAM_DEPTH):
            with m.If(self.mgmt_snoop_valid & (cam_qp[k] == self.mgmt_snoop_qp)):
                m.d.sync += cam_v[k].eq(0)
        with m.If(wb_push):
            m.d.sync += [cam_v[0].eq(1), cam_qp[0].eq(e_qp), cam_psn[0].eq(wb_psn),
                         cam_err[0].eq(wb_err)]
            for k in range(1, _CAM_DEPTH):
                m.d.sync += [cam_qp[k].eq(cam_qp[k - 1]), cam_psn[k].eq(cam_psn[k - 1]),
                             cam_err[k].eq(cam_err[k - 1])]
                with m.If(~(self.mgmt_snoop_valid & (cam_qp[k - 1] == self.mgmt_snoop_qp))):
                    m.d.sync += cam_v[k].eq(cam_v[k - 1])
                with m.Else():
                    m.d.sync += cam_v[k].eq(0)
        # the flush overrides the descriptor register and segmenter updates above
        with m.If(flush & (new_ph_tag == flush_tag)):
            m.d.sync += ph_valid.eq(0)
        with m.If(flush & (new_s_tag == flush_tag)):
            m.d.sync += s_valid.eq(0)
        return m
