# SPDX-License-Identifier: BSD-2-Clause
"""The ACK handler: received ACKs, NAKs and CNPs checked against the QP table, acted on in order
at one packet per cycle."""

from amaranth import *
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import proto
from ..config import check_config
from ..layouts import (QPReadSignature, ack_event_layout, qp_index_width, sending_layout,
                       una_upd_layout)
from ..lib.arith import event_counter, not_before_parts
from ..rx.items import roce_rx_layout

__all__ = ["ack_counters_layout", "AckHandler"]

_PSN_MSB = proto.PSN_BITS - 1


def ack_counters_layout():
    """The ACK handler's 32-bit wrapping counters, one per name of
    :data:`roce_hw.proto.ACK_COUNTERS`."""
    return data.StructLayout({name: 32 for name in proto.ACK_COUNTERS})


def _verdict_layout():
    # one bit per counter but ack_items: exactly one set per packet
    return data.StructLayout({name: 1 for name in proto.ACK_COUNTERS[1:]})


class AckHandler(wiring.Component):
    """Checks every received RoCEv2 packet (iCRC already good: the RX front end's ``roce``
    items) as an ACK, NAK or CNP of one of our QPs, advances the QP's oldest unacknowledged
    PSN (``una_psn``) and reports what is to be done (``ev``).

    Rules, in order (the model is :class:`roce_hw.model.ack.AckModel`; every packet is counted in
    exactly one of :data:`roce_hw.proto.ACK_COUNTERS`): a packet that is not an RC ACKNOWLEDGE
    of BTH + AETH only, nor a CNP (0x81), is ``not_ack``; an AETH syndrome with bit 7 set, of
    the reserved type 10, or a NAK code above 3 is ``bad_syndrome``; then the destination QP
    must be a local QP (``unknown_qp``) in RTS (``qp_not_open``), the source IP its
    ``remote_ip`` (``bad_src``) and the P_Key its ``p_key`` (low 15 bits; ``bad_pkey``). A CNP
    that passes is counted (``cnps``) and reported. For an ACK or NAK with PSN ``p``, with
    ``una`` the QP's oldest unacknowledged PSN and ``sent`` the PSN after the last one sent
    (PSN order modulo 2**24, half window: PROTOCOL.md §5.6):

    * ``p`` before ``una``: ``acks_stale`` / ``naks_stale``, nothing changes (a duplicate or
      old ACK);
    * ``p`` at or after ``sent``: ``psn_unsent``, dropped (a PSN never sent: forged);
    * else an ACK sets ``una`` = ``p`` + 1 (``acks``: a coalesced ACK retires every packet up
      to ``p``); a NAK sets ``una`` = ``p``: it acknowledges everything before ``p`` (rxe
      ``rxe_comp.c`` and rdmavt do so for every NAK): ``naks_seq`` (PSN-sequence error: go back
      to ``p``), ``rnr_naks`` (send ``p`` again after the RNR wait), ``naks_fatal``. Each is
      reported on ``ev``.

    ``sent`` is the QP table's ``next_psn``, or ``sending.psn_next`` while the TX path is in
    the middle of a new message of that QP. Packets are handled strictly in order: an ACK sees
    the ``una`` that every earlier packet left (the handler forwards its own writes).

    Latency: a packet taken from ``i`` in cycle t writes ``una_upd`` in cycle t + 3
    (:attr:`latency`), its counters show it from t + 4 and its event is valid on ``ev`` in
    cycle t + 3 + :attr:`ev_latency` (FIFO empty; measured by ``tests/test_ack.py``).
    Throughput: one packet per cycle (the RX front end can deliver one ACK per cycle at 512
    bits and more).
    Backpressure: ``i`` waits while ``una_upd`` is not ready (at most one cycle per management
    write into the QP table) or the ``ev`` FIFO (``ev_depth`` events) is full; the front end's
    queue holds the packets meanwhile.
    Management writes: a packet of a QP whose row is being written (``mgmt_write``) while it is
    in the handler is counted ``qp_not_open`` and does nothing, so the new row's ``una_psn``
    is never overwritten from the old connection's ACKs.

    Parameters
    ----------
    config : EngineConfig
        ``n_qp``.
    ev_depth : int
        Events the output FIFO holds.

    Members
    -------
    i : ``In(stream.Signature(roce_rx_layout()))``
        Received RoCEv2 packets (the RX front end's ``roce``).
    qp_rd : ``Out(QPReadSignature(idx_width))``
        The QP table's ``ack_rd``.
    una_upd : ``Out(stream.Signature(una_upd_layout(n_qp)))``
        ``una_psn`` write-backs to the QP table.
    sending : ``In(sending_layout(n_qp))``
        The TX path's message in progress.
    mgmt_write : ``In(stream.Signature(StructLayout({"qp": idx_width})))``
        One transfer (``valid`` alone) per management write into the QP table.
    ev : ``Out(stream.Signature(ack_event_layout(n_qp)))``
        What to do: ACK (retire up to ``psn``), NAK_SEQ (retire before ``psn``, go back to it),
        RNR, FATAL, CNP (see :func:`~roce_hw.layouts.ack_event_layout`).
    counters : ``Out(ack_counters_layout())``
    """

    def __init__(self, config, *, ev_depth=16):
        self._config = cfg = check_config(config)
        if isinstance(ev_depth, bool) or not isinstance(ev_depth, int) or ev_depth < 2:
            raise ValueError(f"ev_depth must be an integer of at least 2, not {ev_depth!r}")
        self._ev_depth = ev_depth
        qw = qp_index_width(cfg.n_qp)
        super().__init__({
            "i": In(stream.Signature(roce_rx_layout())),
            "qp_rd": Out(QPReadSignature(qw)),
            "una_upd": Out(stream.Signature(una_upd_layout(cfg.n_qp))),
            "sending": In(sending_layout(cfg.n_qp)),
            "mgmt_write": In(stream.Signature(data.StructLayout({"qp": qw}))),
            "ev": Out(stream.Signature(ack_event_layout(cfg.n_qp))),
            "counters": Out(ack_counters_layout()),
        })

    #: Cycles from a packet taken on ``i`` to its ``una_upd`` write (its counters show it a
    #: cycle later).
    latency = 3
    #: Cycles more to its event on ``ev`` (through the event FIFO, empty: it is written in the
    #: ``una_upd`` cycle and read out of its buffered output two cycles later).
    ev_latency = 2

    def elaborate(self, platform):
        cfg = self._config
        m = Module()
        qw = qp_index_width(cfg.n_qp)
        n_qp = cfg.n_qp
        base = proto.LOCAL_QPN_BASE
        ev_layout = ack_event_layout(n_qp)
        m.submodules.ev_fifo = ev_fifo = fifo.SyncFIFOBuffered(
            width=Shape.cast(ev_layout).width, depth=self._ev_depth)
        wiring.connect(m, ev_fifo.r_stream, wiring.flipped(self.ev))

        # Stage registers. Every stage moves on `adv`, so the forwarding below counts stages,
        # not cycles: an item's table read (stage 0) sees the writes of every item four or more
        # ahead of it; the two before those are compared with in stage 1 (their una in stages 3
        # and 4), and so is the one just ahead (its PSN, in stage 2: the una it may write), the
        # choice among the comparisons being made in stage 2. No carry chain follows another.
        def stage(name, fields):
            return {k: Signal(w, name=f"{name}_{k}") for k, w in fields.items()}

        s1 = stage("s1", {"valid": 1, "qp": qw, "in_range": 1, "open_hit": 1, "snd_psn": 24,
                          "hit_a": 1, "hit_b": 1, "same_prev": 1, "kill": 1})
        s1_item = Signal(roce_rx_layout(), name="s1_item")
        s2 = stage("s2", {"valid": 1, "qp": qw, "kill": 1, "psn": 24, "psn1_lo": 12,
                          "psn1_hi": 12, "psn_lo_ones": 1, "kind": 3,
                          "code": 5, "msn": 24, "q_ack": 1, "q_nak_seq": 1, "q_nak": 1,
                          "q_rnr": 1, "q_fatal": 1, "q_cnp": 1,
                          # the una this item is compared with: the item ahead's (prev), else
                          # stage 3's (a), else stage 4's (b), else the table's
                          "use_prev": 1, "use_a": 1, "use_b": 1})
        # the comparisons' pieces (lib.arith.not_before_parts), combined in stage 2
        cmp_names = ("prev_ack", "prev_nak", "a", "b", "row", "sent")
        s2_cmp = {k: [Signal(name=f"s2_{k}_{j}") for j in ("borrow", "hi0", "hi1")]
                  for k in cmp_names}
        s2_drop = Signal(_verdict_layout(), name="s2_drop")   # reasons known before stage 2
        s3 = stage("s3", {"valid": 1, "qp": qw, "kill": 1, "we": 1, "we_ack": 1, "una": 24,
                          "ev": 1, "kind": 3, "psn": 24, "code": 5, "msn": 24, "acted": 1})
        s3_v = Signal(_verdict_layout(), name="s3_verdict")
        s4 = stage("s4", {"we": 1, "qp": qw, "una": 24})

        # ------------------------------------------------------------ flow
        adv = Signal()
        m.d.comb += [
            adv.eq(~s3["valid"] |
                   ((~s3["we"] | self.una_upd.ready) & (~s3["ev"] | ev_fifo.w_rdy))),
            self.i.ready.eq(adv),
        ]
        # A management write's row lands in the table the cycle after its transfer, the cycle
        # its registered copy `mw_d` is here. An item read before then, or in the handler then,
        # is killed: it must not act on, or write over, the new row. The kill flags are
        # registers (a stage-3 item's write waits in the landing cycle: the table's una_upd is
        # not ready then), so the management handshake drives no logic here.
        mw = self.mgmt_write
        mw_d = stage("mw_d", {"valid": 1, "qp": qw})
        m.d.sync += [mw_d["valid"].eq(mw.valid), mw_d["qp"].eq(mw.payload.qp)]

        def kill_next(st, name):
            k = Signal(name=f"{name}_kill_next")
            m.d.comb += k.eq(st["kill"] | (mw_d["valid"] & (mw_d["qp"] == st["qp"])))
            with m.If(~adv):
                m.d.sync += st["kill"].eq(k)
            return k

        k1, k2, k3 = kill_next(s1, "s1"), kill_next(s2, "s2"), kill_next(s3, "s3")
        we3 = Signal(name="s3_we_live")         # stage 3 writes una (forwarded from there)
        m.d.comb += we3.eq(s3["valid"] & s3["we"] & ~s3["kill"])

        # ------------------------------------------------------------ stage 0: take, read
        p = self.i.payload
        dqp = p.bth.dest_qp
        idx = Signal(qw, name="s0_qp")
        m.d.comb += [
            idx.eq((dqp - base)[:qw]),
            self.qp_rd.addr.eq(idx),
            self.qp_rd.en.eq(adv),
        ]
        with m.If(adv):
            m.d.sync += [
                s1["valid"].eq(self.i.valid),
                s1_item.eq(p),
                s1["qp"].eq(idx),
                s1["in_range"].eq((dqp >= base) & (dqp < base + n_qp)),
                s1["open_hit"].eq(self.sending.open & (self.sending.qp == idx)),
                s1["snd_psn"].eq(self.sending.psn_next),
                # (which stage holds the items the forwarding will need, a stage from now)
                s1["hit_a"].eq(s2["valid"] & (s2["qp"] == idx)),
                s1["hit_b"].eq(s3["valid"] & (s3["qp"] == idx)),
                s1["same_prev"].eq(s1["valid"] & (s1["qp"] == idx)),
                s1["kill"].eq(mw_d["valid"] & (mw_d["qp"] == idx)),
            ]

        # ------------------------------------------------------------ stage 1: checks
        row = self.qp_rd.data
        it = s1_item
        psn = it.bth.psn
        syn = it.aeth.syndrome
        typ = syn[5:7]
        is_ack = Signal()
        is_cnp = Signal()
        reserved = Signal()
        m.d.comb += [
            is_ack.eq((it.bth.opcode == proto.Opcode.RC_ACKNOWLEDGE) & it.bth_aeth_only),
            is_cnp.eq(it.bth.opcode == proto.Opcode.CNP),
            reserved.eq(syn[7] | (typ == proto.AethType.RESERVED) |
                        ((typ == proto.AethType.NAK) &
                         (syn[:5] > proto.NakCode.REMOTE_OPERATIONAL_ERROR))),
        ]
        good = {}
        for name, cond in (("state", row.state == proto.QPState.RTS),
                           ("src", it.src_ip == row.remote_ip),
                           ("pkey", it.bth.p_key[:15] == row.p_key[:15])):
            good[name] = Signal(name=f"s1_{name}_ok")
            m.d.comb += good[name].eq(cond)
        sent = Signal(24, name="s1_sent")
        m.d.comb += sent.eq(Mux(s1["open_hit"], s1["snd_psn"], row.next_psn))
        # psn <= sent - 1 (half window) is "psn is not sent or after it"; the item ahead (now
        # in stage 2) writes una = its PSN + 1 (an ACK) or its PSN (a NAK): this one is at or
        # after that when it is after / at or after that PSN
        cmp = {"prev_ack": (s2["psn"], psn), "prev_nak": (psn, s2["psn"]),
               "a": (psn, s3["una"]), "b": (psn, s4["una"]), "row": (psn, row.una_psn),
               "sent": (psn, sent)}
        cmp_parts = {k: not_before_parts(m, x, y, f"cmp_{k}") for k, (x, y) in cmp.items()}
        ack = is_ack & ~reserved
        drop = Signal(_verdict_layout(), name="s1_drop")
        qual = Signal(name="s1_qual")
        checked = Signal(name="s1_checked")         # an ACK/NAK/CNP of a local QP
        m.d.comb += [
            checked.eq((ack | is_cnp) & s1["in_range"]),
            drop.not_ack.eq(~is_ack & ~is_cnp),
            drop.bad_syndrome.eq(is_ack & reserved),
            drop.unknown_qp.eq((ack | is_cnp) & ~s1["in_range"]),
            drop.qp_not_open.eq(checked & (~good["state"] | s1["kill"])),
            drop.bad_src.eq(checked & good["state"] & ~s1["kill"] & ~good["src"]),
            drop.bad_pkey.eq(checked & good["state"] & ~s1["kill"] & good["src"] &
                             ~good["pkey"]),
            qual.eq(s1["in_range"] & good["state"] & ~s1["kill"] & good["src"] &
                    good["pkey"]),
        ]
        kind = Signal(3, name="s1_kind")
        with m.If(is_cnp):
            m.d.comb += kind.eq(proto.AckKind.CNP)
        with m.Elif(typ == proto.AethType.ACK):
            m.d.comb += kind.eq(proto.AckKind.ACK)
        with m.Elif(typ == proto.AethType.RNR_NAK):
            m.d.comb += kind.eq(proto.AckKind.RNR)
        with m.Elif(syn[:5] == proto.NakCode.PSN_SEQUENCE_ERROR):
            m.d.comb += kind.eq(proto.AckKind.NAK_SEQ)
        with m.Else():
            m.d.comb += kind.eq(proto.AckKind.FATAL)
        q = qual & ack
        with m.If(adv):
            m.d.sync += [
                s2["valid"].eq(s1["valid"]),
                s2["qp"].eq(s1["qp"]),
                s2["kill"].eq(k1),
                s2["psn"].eq(psn),
                # psn + 1 in two pieces (the high one chosen in stage 2)
                s2["psn1_lo"].eq(psn[:12] + 1),
                s2["psn1_hi"].eq(psn[12:] + 1),
                s2["psn_lo_ones"].eq(psn[:12].all()),
                s2["kind"].eq(kind),
                # (a CNP has no AETH: its event carries zeros)
                s2["code"].eq(Mux(is_cnp, 0, syn[:5])),
                s2["msn"].eq(Mux(is_cnp, 0, it.aeth.msn)),
                s2["q_ack"].eq(q & (kind == proto.AckKind.ACK)),
                s2["q_nak_seq"].eq(q & (kind == proto.AckKind.NAK_SEQ)),
                s2["q_nak"].eq(q & (kind != proto.AckKind.ACK)),
                s2["q_rnr"].eq(q & (kind == proto.AckKind.RNR)),
                s2["q_fatal"].eq(q & (kind == proto.AckKind.FATAL)),
                s2["q_cnp"].eq(qual & is_cnp),
                s2["use_prev"].eq(s1["same_prev"]),
                s2["use_a"].eq(s1["hit_a"] & we3),
                s2["use_b"].eq(s1["hit_b"] & s4["we"]),
                s2_drop.eq(drop),
            ]
            for k in cmp_names:
                m.d.sync += [reg.eq(part) for reg, part in zip(s2_cmp[k], cmp_parts[k])]

        # ------------------------------------------------------------ stage 2: decide
        nb = {}
        for k in cmp_names:
            borrow, hi0, hi1 = s2_cmp[k]
            nb[k] = Signal(name=f"s2_nb_{k}")       # first operand is the second or after it
            m.d.comb += nb[k].eq(~Mux(borrow, hi1, hi0))
        below_sent = ~nb["sent"]
        ge = Signal(name="s2_ge")                  # psn is the QP's una or after it
        with m.If(s2["use_prev"] & we3):
            m.d.comb += ge.eq(Mux(s3["we_ack"], ~nb["prev_ack"], nb["prev_nak"]))
        with m.Elif(s2["use_a"]):
            m.d.comb += ge.eq(nb["a"])
        with m.Elif(s2["use_b"]):
            m.d.comb += ge.eq(nb["b"])
        with m.Else():
            m.d.comb += ge.eq(nb["row"])
        live = Signal(name="s2_live")
        m.d.comb += live.eq(s2["valid"] & ~s2["kill"])
        v = Signal(_verdict_layout(), name="s2_verdict")
        window = s2["q_ack"] | s2["q_nak"]
        in_window = live & ge & below_sent
        m.d.comb += [
            v.eq(s2_drop),
            v.qp_not_open.eq(s2_drop.qp_not_open | (s2["kill"] & (window | s2["q_cnp"]))),
            v.acks.eq(in_window & s2["q_ack"]),
            v.naks_seq.eq(in_window & s2["q_nak_seq"]),
            v.rnr_naks.eq(in_window & s2["q_rnr"]),
            v.naks_fatal.eq(in_window & s2["q_fatal"]),
            v.cnps.eq(live & s2["q_cnp"]),
            v.acks_stale.eq(live & s2["q_ack"] & ~ge),
            v.naks_stale.eq(live & s2["q_nak"] & ~ge),
            v.psn_unsent.eq(live & window & ge & ~below_sent),
        ]
        with m.If(adv):
            m.d.sync += [
                s3["valid"].eq(s2["valid"]),
                s3["qp"].eq(s2["qp"]),
                s3["kill"].eq(k2),
                # (a NAK at una rewrites the same una: harmless)
                s3["we"].eq(in_window & window),
                s3["we_ack"].eq(s2["q_ack"]),
                s3["una"].eq(Mux(s2["q_ack"],
                                 Cat(s2["psn1_lo"], Mux(s2["psn_lo_ones"], s2["psn1_hi"],
                                                        s2["psn"][12:])),
                                 s2["psn"])),
                s3["ev"].eq((in_window & window) | (live & s2["q_cnp"])),
                s3["acted"].eq(live & (window | s2["q_cnp"])),
                s3["kind"].eq(s2["kind"]),
                s3["psn"].eq(s2["psn"]),
                s3["code"].eq(s2["code"]),
                s3["msn"].eq(s2["msn"]),
                s3_v.eq(v),
                s4["we"].eq(we3),
                s4["qp"].eq(s3["qp"]),
                s4["una"].eq(s3["una"]),
            ]

        # ------------------------------------------------------------ stage 3: act, count
        ev = Signal(ev_layout)
        m.d.comb += [
            self.una_upd.valid.eq(we3 & (~s3["ev"] | ev_fifo.w_rdy)),
            ev_fifo.w_en.eq(s3["valid"] & s3["ev"] & ~s3["kill"] &
                            (~s3["we"] | self.una_upd.ready)),
            self.una_upd.payload.qp.eq(s3["qp"]),
            self.una_upd.payload.una_psn.eq(s3["una"]),
            ev.qp.eq(s3["qp"]), ev.kind.eq(s3["kind"]), ev.psn.eq(s3["psn"]),
            ev.code.eq(s3["code"]), ev.msn.eq(s3["msn"]),
            ev_fifo.w_data.eq(ev),
        ]
        # (an item killed after its decision is counted as one of a QP not open)
        done = Signal(name="s3_done")
        moved = Signal(name="s3_killed")
        m.d.comb += [done.eq(s3["valid"] & adv), moved.eq(s3["kill"] & s3["acted"])]
        m.d.comb += self.counters.ack_items.eq(event_counter(m, 32, done, "n_ack_items"))
        for name in proto.ACK_COUNTERS[1:]:
            hit = moved if name == "qp_not_open" else 0
            m.d.comb += getattr(self.counters, name).eq(
                event_counter(m, 32, done & ((s3_v[name] & ~moved) | hit), f"n_{name}"))
        return m
