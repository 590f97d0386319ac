# SPDX-License-Identifier: BSD-2-Clause
"""Commit: the in-order point of the TX path where a packet descriptor becomes a frame header."""

from amaranth import *
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import proto
from ..config import check_config
from ..lib.arith import event_counter
from ..lib.header import inserter_hdr_layout
from ..lib.ipv4 import IPv4Identification
from ..layouts import qp_index_width, sending_layout, tx_upd_layout
from ..verbs import WcStatus, status_layout
from .cutter import cut_layout
from .psn import WriteBackSignature
from .seg_common import desc_layout, flush_signature

__all__ = ["TX_VARIANTS", "hdr_layout", "Commit"]

#: Header variants of the TX path, indexed by ``(reth << 1) | imm``.
TX_VARIANTS = (
    (proto.ETH, proto.IPV4, proto.UDP, proto.BTH),
    (proto.ETH, proto.IPV4, proto.UDP, proto.BTH, proto.IMMDT),
    (proto.ETH, proto.IPV4, proto.UDP, proto.BTH, proto.RETH),
    (proto.ETH, proto.IPV4, proto.UDP, proto.BTH, proto.RETH, proto.IMMDT),
)

_STATUS_FIFO_DEPTH = 4


def hdr_layout():
    """The header stream to the packet builder: the
    :class:`~roce_hw.lib.header.HeaderInserter`'s ``hdr`` for :data:`TX_VARIANTS`."""
    return inserter_hdr_layout(TX_VARIANTS)


class Commit(wiring.Component):
    """Takes packet descriptors in order and commits each: a header to the packet builder, a
    command to the payload cutter, the IPv4 identification, the write-back of the QP's next PSN
    at a message's end, and the reports of refused work requests.

    Ordering. A packet is committed only when the payload of the packet before it has been
    checked (``done``), so the fate of every earlier packet is known: after a length mismatch the
    rest of that message is flushed (``flush``, from the segmenter) and never committed, and
    the QP's PSN/state is put right before a later message of the QP is committed:

    * mismatch in the first packet of a new message: nothing valid was sent; a write-back already
      made for it (a one-packet message) is undone (``next_psn`` = its PSN);
    * mismatch in a later packet (or in a resumed message): the QP goes to ERROR with ``next_psn``
      = the aborted packet's PSN.

    A write-back (``wb``, and the same on ``tx_upd``) is made when a new message's last packet is
    committed (``next_psn`` = its PSN + 1) or when a mismatch needs one; no descriptor is committed
    in the cycle after a write-back or a flush, so the segmenter's refresh of a waiting descriptor
    has landed.

    Throughput: one packet per cycle while packets have no payload; after a packet with payload,
    the next one in the cycle its payload check comes back (one cycle after its last beat passed
    the cutter). Latency: a descriptor is committed in the cycle it is presented when nothing
    holds it; ``hdr``/``cut`` are driven from it combinationally.

    Parameters
    ----------
    config : EngineConfig
    early_check : bool
        The payload check (``done``) of a packet may come in the cycle after its commit (a
        :class:`~roce_hw.tx.cutter.PayloadCutter` with ``early``); by default it comes at least
        two cycles after.

    Members
    -------
    i : ``In(stream.Signature(desc_layout(config)))``
    hdr : ``Out(stream.Signature(hdr_layout()))``
    cut : ``Out(stream.Signature(cut_layout(W)))``
    done : ``In(stream.Signature(StructLayout({"mism": 1}), always_ready=True))``
    wb : ``Out(WriteBackSignature(idx_width))``
    flush : ``Out(flush_signature())``
    tx_upd : ``Out(stream.Signature(tx_upd_layout(n_qp)))``
    status : ``Out(stream.Signature(status_layout(config)))``
    sending : ``Out(sending_layout(n_qp))``
        The new message being sent, for the ACK handler (:func:`~roce_hw.layouts.sending_layout`);
        registered, from the cycle after a packet's commit (two after, without ``early_check``).
    local_mac, local_ip : ``In``
    ip_id_load : ``In(stream.Signature(StructLayout({"value": 16})))``
    frames, frames_aborted, wrs_refused, status_dropped : ``Out``
        As in :class:`roce_hw.engine.TxEngine`.
    """

    def __init__(self, config, *, early_check=False):
        self._config = check_config(config)
        self._early_check = bool(early_check)
        qw = qp_index_width(config.n_qp)
        super().__init__({
            "i": In(stream.Signature(desc_layout(config))),
            "hdr": Out(stream.Signature(hdr_layout())),
            "cut": Out(stream.Signature(cut_layout(config.data_width))),
            "done": In(stream.Signature(data.StructLayout({"mism": 1}), always_ready=True)),
            "wb": Out(WriteBackSignature(qw)),
            "flush": Out(flush_signature()),
            "tx_upd": Out(stream.Signature(tx_upd_layout(config.n_qp))),
            "status": Out(stream.Signature(status_layout(config))),
            "sending": Out(sending_layout(config.n_qp)),
            "local_mac": In(48), "local_ip": In(32),
            "ip_id_load": In(stream.Signature(data.StructLayout({"value": 16}))),
            "frames": Out(32), "frames_aborted": Out(32), "wrs_refused": Out(32),
            "status_dropped": Out(16),
        })

    def elaborate(self, platform):
        cfg = self._config
        m = Module()
        d = self.i.payload

        # ---------------------------------------------------------------- gating
        awaiting = Signal()       # a committed packet's payload is not checked yet
        hold = Signal()           # a write-back or flush is made this cycle
        mism_now = Signal()
        ok_now = Signal()
        m.d.comb += [mism_now.eq(self.done.valid & self.done.payload.mism),
                     ok_now.eq(self.done.valid & ~self.done.payload.mism)]
        can = Signal()
        m.d.comb += can.eq(self.i.valid & ~hold & ~mism_now & (~awaiting | ok_now))
        refused = Signal()
        has_pay = Signal()
        need_cut = Signal()
        m.d.comb += [
            refused.eq(d.refused),
            has_pay.eq(d.has_pay),
            need_cut.eq(Mux(refused, d.has_payload, has_pay)),
            self.hdr.valid.eq(can & ~refused & (~need_cut | self.cut.ready)),
            self.cut.valid.eq(can & need_cut & (refused | self.hdr.ready)),
        ]
        take = Signal()
        m.d.comb += [
            take.eq(can & (refused | self.hdr.ready) & (~need_cut | self.cut.ready)),
            self.i.ready.eq(take),
        ]

        # ---------------------------------------------------------------- header
        m.submodules.ip_id = ip_id = IPv4Identification(cfg.ip_id_start)
        m.d.comb += ip_id.inc.eq(self.hdr.valid & self.hdr.ready)
        # (always ready: the counter's load is an always-ready stream)
        wiring.connect(m, wiring.flipped(self.ip_id_load), ip_id.load)
        f = self.hdr.payload.fields
        m.d.comb += [
            self.hdr.payload.variant.eq(Cat(d.imm, d.reth)),
            self.hdr.payload.payload.eq(has_pay),
            f.eth.dst.eq(d.remote_mac), f.eth.src.eq(self.local_mac),
            f.eth.ethertype.eq(proto.ETHERTYPE_IPV4),
            f.ipv4.version.eq(4), f.ipv4.ihl.eq(proto.IPV4.size // 4),
            f.ipv4.dscp.eq(d.dscp), f.ipv4.ecn.eq(d.ecn),
            f.ipv4.total_length.eq(d.tot_len), f.ipv4.identification.eq(ip_id.value),
            f.ipv4.flag_df.eq(1), f.ipv4.ttl.eq(cfg.ttl), f.ipv4.protocol.eq(proto.IP_PROTO_UDP),
            f.ipv4.src.eq(self.local_ip), f.ipv4.dst.eq(d.remote_ip),
            f.udp.src_port.eq(d.udp_sport), f.udp.dst_port.eq(proto.ROCEV2_UDP_PORT),
            f.udp.length.eq(d.udp_len),
            f.bth.eq(d.bth),
            f.reth.va.eq(d.va), f.reth.r_key.eq(d.r_key), f.reth.dma_length.eq(d.dma_length),
            f.immdt.imm.eq(d.imm_data),
        ]

        # ---------------------------------------------------------------- cutter command
        m.d.comb += [
            self.cut.payload.beats.eq(d.beats),
            self.cut.payload.pk.eq(d.pk),
            self.cut.payload.lik.eq(d.lik),
            self.cut.payload.pkc.eq(d.pkc),
            self.cut.payload.last_msg.eq(d.last),
            self.cut.payload.drain.eq(refused),
        ]

        # ---------------------------------------------------------------- the packet in flight
        qw = len(d.qp)
        fl = {"qp": Signal(qw, name="fl_qp"), "psn": Signal(proto.PSN_BITS, name="fl_psn"),
              "wr_id": Signal(64, name="fl_wr_id"), "tag": Signal(name="fl_tag"),
              "last": Signal(name="fl_last"), "new": Signal(name="fl_new"),
              "lead": Signal(name="fl_lead"), "open": Signal(name="fl_open"),
              "psn_next": Signal(proto.PSN_BITS, name="fl_psn_next")}
        open_msg = Signal()       # a message has packets committed and more to come
        with m.If(take & ~refused):
            m.d.sync += [fl["lead"].eq(~open_msg), open_msg.eq(~d.last), awaiting.eq(has_pay)]
        with m.Elif(self.done.valid):
            m.d.sync += awaiting.eq(0)
        # The wide part a cycle later, from a copy of the descriptor made in every cycle: its
        # enable is then a register, not the late `take` (ECP5 timing). The packet's check
        # (`done`) comes at least two cycles after its commit (cutter command and output
        # registers), so it never reads the copy before it is there. With `early_check` (the
        # cutter passes a packet's first beat in its command's cycle) the check may come in the
        # next cycle: the registers then load at the commit.
        src = {"qp": d.qp, "psn": d.bth.psn, "wr_id": d.wr_id, "tag": d.tag, "last": d.last,
               "new": d.first & d.last, "open": ~d.last & ~d.resumed, "psn_next": d.psn_next}
        if self._early_check:
            with m.If(take & ~refused):
                m.d.sync += [fl[k].eq(v) for k, v in src.items()]
        else:
            dly = {k: Signal.like(fl[k], name=f"dl_{k}") for k in src}
            dly_go = Signal()
            m.d.sync += [dly[k].eq(v) for k, v in src.items()] + [dly_go.eq(take & ~refused)]
            with m.If(dly_go):
                m.d.sync += [fl[k].eq(dly[k]) for k in dly]

        m.d.comb += [self.sending.open.eq(fl["open"]), self.sending.qp.eq(fl["qp"]),
                     self.sending.psn_next.eq(fl["psn_next"])]

        # ---------------------------------------------------------------- write-backs, flush
        wb_valid = Signal()
        wb_qp = Signal(qw)
        wb_psn = Signal(proto.PSN_BITS)
        wb_err = Signal()
        psn_inc = d.psn_next
        m.d.sync += [wb_valid.eq(0), self.flush.valid.eq(0)]
        # (the data registers load in every cycle, chosen by mism_now alone, which excludes
        # `take`; wb_valid says whether they hold a write-back)
        wb_qp_next = Signal(qw)
        m.d.comb += wb_qp_next.eq(Mux(mism_now, fl["qp"], d.qp))
        m.d.sync += wb_qp.eq(wb_qp_next)
        with m.If(mism_now):
            m.d.sync += [wb_psn.eq(fl["psn"]), wb_err.eq(~fl["lead"])]
        with m.Else():
            m.d.sync += [wb_psn.eq(psn_inc), wb_err.eq(0)]
        wb_done = Signal()      # a message's last packet committed: write its next PSN back
        wb_mism = Signal()      # a mismatch to write back (the message's PSN, or ERROR)
        flush_mism = Signal()   # a mismatch that flushes the rest of its message
        m.d.comb += [wb_done.eq(take & ~refused & d.last & ~d.resumed),
                     wb_mism.eq(mism_now & (~fl["lead"] | fl["new"])),
                     flush_mism.eq(mism_now & ~fl["last"])]
        with m.If(wb_done | wb_mism):
            m.d.sync += wb_valid.eq(1)
        with m.If(flush_mism):
            m.d.sync += [self.flush.valid.eq(1), self.flush.tag.eq(fl["tag"]), open_msg.eq(0)]
        # `hold` is a register of its own (the next values of both), one input of `can`
        # instead of two (ECP5 timing: `can` reaches the header inserter's load)
        m.d.sync += hold.eq(wb_done | wb_mism | flush_mism)
        m.d.comb += [
            self.wb.valid.eq(wb_valid), self.wb.qp.eq(wb_qp), self.wb.psn.eq(wb_psn),
            self.wb.err.eq(wb_err), self.wb.qp_next.eq(wb_qp_next),
        ]
        upd = tx_upd_layout(cfg.n_qp)
        m.submodules.upd_fifo = upd_fifo = fifo.SyncFIFOBuffered(width=Shape.cast(upd).width,
                                                                 depth=4)
        upd_w = Signal(upd)
        m.d.comb += [
            upd_w.qp.eq(wb_qp), upd_w.psn_we.eq(1), upd_w.next_psn.eq(wb_psn),
            upd_w.state_we.eq(wb_err), upd_w.state.eq(proto.QPState.ERROR),
            upd_fifo.w_data.eq(upd_w), upd_fifo.w_en.eq(wb_valid),
        ]
        wiring.connect(m, upd_fifo.r_stream, wiring.flipped(self.tx_upd))

        # ---------------------------------------------------------------- status, counters
        st = status_layout(cfg)
        m.submodules.status_fifo = st_fifo = fifo.SyncFIFOBuffered(
            width=Shape.cast(st).width, depth=_STATUS_FIFO_DEPTH)
        # (a report goes into the FIFO the cycle after its event, from registers)
        st_push = Signal()
        st_data = Signal(st)
        # (the data register loads in every cycle, chosen by mism_now alone: the late `take`
        # only reaches st_push, not the enable of ~90 flip-flops)
        m.d.sync += st_push.eq(mism_now | (take & refused))
        with m.If(mism_now):
            m.d.sync += [st_data.wr_id.eq(fl["wr_id"]), st_data.qp.eq(fl["qp"]),
                         st_data.status.eq(WcStatus.LOC_LEN_ERR)]
        with m.Else():
            m.d.sync += [st_data.wr_id.eq(d.wr_id), st_data.qp.eq(d.qp),
                         st_data.status.eq(d.refuse)]
        frame_ev = Signal()
        m.d.sync += frame_ev.eq(self.hdr.valid & self.hdr.ready)
        m.d.comb += [st_fifo.w_en.eq(st_push), st_fifo.w_data.eq(st_data)]
        wiring.connect(m, st_fifo.r_stream, wiring.flipped(self.status))
        m.d.comb += [
            # (counted from registered events, a cycle late: the counters' enables are not
            # the late `take`)
            self.frames.eq(event_counter(m, 32, frame_ev, "n_frames")),
            self.frames_aborted.eq(event_counter(m, 32, mism_now, "n_aborted")),
            self.wrs_refused.eq(event_counter(m, 32, st_push, "n_refused")),
            self.status_dropped.eq(event_counter(m, 16, st_push & ~st_fifo.w_rdy, "n_dropped",
                                                 saturate=True)),
        ]
        return m
