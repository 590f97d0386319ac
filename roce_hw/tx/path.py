# SPDX-License-Identifier: BSD-2-Clause
"""The RoCEv2 TX datapath: work requests and payload bytes in, segmented RoCEv2 Ethernet frames
out; it reads and writes the QP table through ports (the table itself is the control plane's,
:class:`roce_hw.ctrl.qp_table.QPStateTable`; :class:`roce_hw.engine.TxEngine` joins the two)."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import proto
from ..config import check_config
from ..lib.header import HeaderInserter
from ..lib.icrc import ICRCInserter
from ..lib.stream import PacketSignature, frame_layout
from ..layouts import QPReadSignature, qp_index_width, sending_layout, tx_upd_layout
from ..verbs import resume_layout, status_layout, wr_layout
from .builder import ICRC_VARIANT, PacketBuilder
from .commit import TX_VARIANTS, Commit
from .cutter import PayloadCutter
from .psn import PsnForward
from .segmenter import Segmenter

__all__ = ["TxPath"]


class TxPath(wiring.Component):
    """RoCEv2 requester TX datapath: work requests -> segmented RC frames with iCRC.

    The engine is a chain of blocks joined by streams (``roce_hw/tx/``):

    * :class:`~roce_hw.tx.segmenter.Segmenter`: reads the QP context from the
      QP table (``qp_rd``), checks the request and splits the message by the
      QP's PMTU into FIRST/MIDDLE/LAST/ONLY packet descriptors (PROTOCOL.md §5.7, exactly as
      :func:`roce_hw.model.segment.segment_message`); also resumes a message part-way
      (``resume``). PSNs come from the table, newest write-back first
      (:class:`~roce_hw.tx.psn.PsnForward`).
    * :class:`~roce_hw.tx.commit.Commit`: the in-order point where a descriptor becomes a
      header (IPv4 identification, the QP's next-PSN write-back, refusal reports, what a length
      mismatch undoes).
    * :class:`~roce_hw.tx.cutter.PayloadCutter`: cuts the work request's payload packet into
      the packets' payloads, pads them, checks the length.
    * :class:`~roce_hw.tx.builder.PacketBuilder`: :class:`~roce_hw.lib.header.HeaderInserter`
      (Ethernet / IPv4 / UDP / BTH / [RETH] / [ImmDt] + payload), then the
      :class:`~roce_hw.lib.icrc.ICRCInserter`, then the IPv4 header checksum. Frames carry no
      FCS.

    Header fields. Ethernet: dst = QP ``remote_mac``, src = ``local_mac``, type 0x0800.
    IPv4: version 4, IHL 5, DSCP/ECN from the QP, total length, identification = the IP ID
    counter, DF=1, TTL = ``config.ttl``, protocol 17, header checksum, src = ``local_ip``, dst =
    QP ``remote_ip``. UDP: sport = QP ``udp_sport``, dport 4791, length, checksum 0. BTH: opcode,
    SE (last packet of a solicited SEND*/WRITE_WITH_IMM), MigReq and P_Key from the QP, PadCnt,
    TVer 0, DestQP = QP ``remote_qpn``, AckReq (last packet of every message, and packet ``i``
    of a message when ``(i + 1) % config.ack_req_every == 0``), PSN. RETH on WRITE FIRST/ONLY
    (``remote_addr``, ``r_key``, total ``length``); ImmDt on LAST/ONLY of the ``*_WITH_IMM``
    operations.

    PSN. The first packet of a message gets the QP's ``next_psn``; packets are numbered
    consecutively modulo 2**24, and when the message is complete the engine writes
    ``next_psn`` = last PSN + 1 back to the table (``tx_upd``). Messages of several QPs
    interleave at message boundaries in WR order; consecutive WRs of the same QP continue the
    PSN sequence without waiting for the write-back (the engine forwards its own recent
    write-backs).

    IP ID. A 16-bit counter, ``config.ip_id_start`` after reset or the value last loaded on
    ``ip_id_load``; every frame put on ``o`` (aborted ones included) carries the current value
    and increments it by one (mod 2**16). Refused WRs use no ID.

    Refused work requests. A WR is refused -- nothing is sent, its payload packet (if
    ``length`` > 0) is drained from ``i``, one report goes to ``status``, the QP table is not
    changed and the next WR is unaffected -- when:

    * ``qp`` >= ``n_qp``, the QP is not in RTS, its PMTU code is not 1..5, or ``opcode`` is
      not one of the four supported (:attr:`WcStatus.LOC_QP_OP_ERR`);
    * ``length`` > 2**31 (:attr:`WcStatus.LOC_LEN_ERR`).

    Length mismatch. If the payload packet ends before ``length`` bytes, or has no ``last``
    at byte ``length`` (or its last beat's ``keep`` disagrees), the frame in flight is ended at
    once with ``last=1, abort=1`` (the MAC must drop it), the rest of the message is not sent,
    the rest of the payload packet is drained, and the WR is reported
    :attr:`WcStatus.LOC_LEN_ERR`. If the mismatch shows up in the message's first packet,
    nothing valid was sent and the QP (PSN, state) is unchanged. If earlier packets of the
    message already went out, the QP is moved to ERROR (``state`` = 6) and its ``next_psn``
    is set to the PSN of the aborted packet; later WRs for it are refused (LOC_QP_OP_ERR) until
    the QP is set up again through ``qp_mgmt_req``. (A payload packet sent for a WR of length
    0 cannot be told apart from the next WR's payload; it is taken as that.)

    QP table. The QP rows are read on ``qp_rd`` (one-cycle read port) and the write-backs
    leave on ``qp_upd``; ``mgmt_write`` tells of every management write into the table (the
    PSN forwarding then forgets what it knew of that QP). A WR transferred after a management
    write's response has been received sees the write. Rewriting a QP while WRs for it are in
    the datapath is a race (it may write its ``next_psn``/``state`` back afterwards).

    Latency and throughput. WR transferred in cycle 0 -> first beat valid on ``o`` in cycle
    :attr:`latency` (engine idle, payload valid): 8 at every width (64 to 1024
    bits), for every opcode; measured by ``tests/test_tx_engine.py`` and
    ``python -m bench.throughput``.
    One beat per cycle; the first beat of a frame may follow the last beat of the previous
    frame in the next cycle (also across WRs and QPs) as long as frames are at least two beats
    long (a frame of one beat, possible at 1024 bits for a message of under 50 bytes, is
    followed by one idle cycle); a frame is ``ceil(bytes / (W/8))`` beats long (header merged
    with the payload, no filler beat). If ``i`` idles in the middle
    of a packet, the frame has idle cycles (``o.valid`` low between its beats): a MAC that
    cannot underrun needs a frame FIFO in front of it.

    Backpressure: ``o`` may be stalled at any time; ``wr`` and ``i`` are then stalled too.
    ``status`` is a 4-entry FIFO: if it is full when a report is due, the report is dropped and
    counted in ``status_dropped`` (the engine never waits for ``status``).

    Parameters
    ----------
    config : EngineConfig
        ``data_width``, ``n_qp``, ``ack_req_every``, ``ttl``, ``ip_id_start``.

    Members
    -------
    wr : ``In(stream.Signature(wr_layout(config)))``
        Work requests, one transfer each.
    resume : ``In(stream.Signature(resume_layout(config)))``
        Resume requests (go-back-N restarts of a message at a packet, PROTOCOL.md §5.10; see
        :func:`roce_hw.verbs.resume_layout`); taken before ``wr``. The payload packets on ``i``
        follow the order in which requests of both kinds are taken. A resume request uses the
        PSNs it names and does not move the QP's next PSN.
    i : ``In(PacketSignature(data_width))``
        Payload: for each WR with ``length`` > 0 exactly one packet of ``length`` bytes, in WR
        order; nothing for ``length`` == 0. Lanes beyond ``keep`` are ignored.
    o : ``Out(stream.Signature(frame_layout(data_width)))``
        Complete Ethernet frames (iCRC appended, no FCS), ``abort`` on the last beat of a frame
        the MAC must discard.
    status : ``Out(stream.Signature(status_layout(config)))``
        One report ``{wr_id, qp, status}`` per refused WR (only errors are reported).
    qp_rd : ``Out(QPReadSignature(idx_width))``
        Read port of the QP table (the table's ``tx_rd``).
    qp_upd : ``Out(stream.Signature(tx_upd_layout(n_qp)))``
        Write-backs of ``next_psn`` and ``state`` (the table's ``tx_upd``; always taken).
    mgmt_write : ``In(stream.Signature(StructLayout({"qp": idx_width})))``
        One transfer per management write into the table, for the QP written (a monitor:
        ``ready`` is ignored, the transfer is ``valid`` alone).
    sending : ``Out(sending_layout(n_qp))``
        The new message being sent (:func:`~roce_hw.layouts.sending_layout`), for the ACK
        handler's window check: PSNs beyond the QP table's ``next_psn`` already sent.
    local_mac : ``In(48)``
        Source MAC (``0x020000000001`` is 02:00:00:00:00:01); static.
    local_ip : ``In(32)``
        Source IPv4 address; static.
    ip_id_load : ``In(stream.Signature(StructLayout({"value": 16})))``
        Loads the IP ID counter with ``value`` (always ready): the next frame started after
        the transfer carries ``value``.
    frames : ``Out(32)``
        Frames started on ``o`` (wrapping count, aborted ones included).
    frames_aborted : ``Out(32)``
        Frames ended with ``abort`` (wrapping count).
    wrs_refused : ``Out(32)``
        Refused WRs, length mismatches included (wrapping count).
    status_dropped : ``Out(16)``
        Status reports dropped because ``status`` was full (saturating). The four counters
        change one or two cycles after their events (counted from registered events).

    Raises
    ------
    TypeError
        If ``config`` is not an :class:`~roce_hw.config.EngineConfig`.
    """

    def __init__(self, config):
        self._config = check_config(config)
        w = config.data_width
        super().__init__({
            "wr": In(stream.Signature(wr_layout(config))),
            "resume": In(stream.Signature(resume_layout(config))),
            "i": In(PacketSignature(w)),
            "o": Out(stream.Signature(frame_layout(w))),
            "status": Out(stream.Signature(status_layout(config))),
            "qp_rd": Out(QPReadSignature(qp_index_width(config.n_qp))),
            "qp_upd": Out(stream.Signature(tx_upd_layout(config.n_qp))),
            "mgmt_write": In(stream.Signature(
                data.StructLayout({"qp": qp_index_width(config.n_qp)}))),
            "sending": Out(sending_layout(config.n_qp)),
            "local_mac": In(48),
            "local_ip": In(32),
            "ip_id_load": In(stream.Signature(data.StructLayout({"value": 16}))),
            "frames": Out(32),
            "frames_aborted": Out(32),
            "wrs_refused": Out(32),
            "status_dropped": Out(16),
        })

    @property
    def latency(self):
        """Cycles from a WR transfer (engine idle, payload valid, ``o`` ready) to the first beat
        of its first frame on ``o``."""
        # WR -> descriptor on the segmenter's output (2 cycles; 3 where the payload does not set
        # the latency: the PSN look-up with a registered key) -> committed there; the header
        # inserter has the header's first beat out HeaderInserter.latency (2) cycles later. A
        # frame whose first beat holds payload bytes (the header is shorter than a beat) has its
        # payload there as early: the cutter passes a packet's first beat in its command's cycle
        # (see payload_first_for), then 1 cycle in the header inserter. The iCRC inserter (fixed
        # variant: no zeroing register) adds its latency + 1.
        first = 2 + (not self.payload_first_for(self._config)) + HeaderInserter.latency
        return first + ICRCInserter.latency_for(self._config.data_width,
                                                variant=ICRC_VARIANT) + 1

    @staticmethod
    def payload_first_for(config):
        """Some frames' first beat holds payload bytes (the shortest header is shorter than a
        beat): the cutter then passes a packet's first beat in its command's cycle, so the
        payload meets the header in the header inserter as early as a header beat would.
        Otherwise (64, 128 and 256 bits) the PSN look-up has a registered key (one cycle
        more, which the header's first beats leave free). ``config`` is an
        :class:`EngineConfig`."""
        min_header = proto.ETH.size + proto.IPV4.size + proto.UDP.size + proto.BTH.size
        return min_header < config.data_bytes

    @property
    def config(self):
        """The :class:`~roce_hw.config.EngineConfig` of this engine."""
        return self._config

    def elaborate(self, platform):
        cfg = self._config
        m = Module()
        early = self.payload_first_for(cfg)
        # (where the payload does not set the latency, the PSN look-up takes a cycle more for
        # a registered key: ECP5 timing; the latency is then 8 at every width)
        m.submodules.psn_fwd = fwd = PsnForward(cfg.n_qp, registered_key=not early)
        m.submodules.segmenter = seg = Segmenter(cfg, fwd_registered=not early)
        m.submodules.commit = com = Commit(cfg, early_check=early)
        m.submodules.cutter = cut = PayloadCutter(cfg.data_width, early=early)
        m.submodules.builder = bld = PacketBuilder(cfg.data_width, TX_VARIANTS)

        # the PSN forwarding learns of a management write a cycle later, from registers: the
        # table's request handshake then drives no logic outside the table (ECP5: the placer
        # put it up to 2.8 ns of routing away from the table's arbitration). A WR transferred
        # after the write's response (2 cycles after the write at the earliest) still finds
        # the write's QP forgotten there.
        snoop_valid = Signal(name="mgmt_snoop_valid")
        snoop_qp = Signal.like(self.mgmt_write.payload.qp, name="mgmt_snoop_qp")
        m.d.sync += [snoop_valid.eq(self.mgmt_write.valid),
                     snoop_qp.eq(self.mgmt_write.payload.qp)]
        m.d.comb += [fwd.snoop_valid.eq(snoop_valid), fwd.snoop_qp.eq(snoop_qp)]
        # requests -> segmenter -> commit -> (cutter, builder)
        wiring.connect(m, wiring.flipped(self.wr), seg.wr)
        wiring.connect(m, wiring.flipped(self.resume), seg.resume)
        wiring.connect(m, seg.qp_rd, wiring.flipped(self.qp_rd))
        wiring.connect(m, seg.o, com.i)
        wiring.connect(m, com.tx_upd, wiring.flipped(self.qp_upd))
        wiring.connect(m, seg.fwd, fwd.q)
        wiring.connect(m, com.flush, seg.flush)
        # (the write-backs to the PSN forwarding and to the segmenter)
        wiring.connect(m, com.wb, fwd.wb, seg.wb)
        wiring.connect(m, com.cut, cut.cmd)
        wiring.connect(m, cut.done, com.done)
        wiring.connect(m, wiring.flipped(self.i), cut.i)
        wiring.connect(m, com.hdr, bld.hdr)
        wiring.connect(m, cut.o, bld.i)
        wiring.connect(m, bld.o, wiring.flipped(self.o))

        wiring.connect(m, com.status, wiring.flipped(self.status))
        wiring.connect(m, wiring.flipped(self.ip_id_load), com.ip_id_load)
        m.d.comb += [
            com.local_mac.eq(self.local_mac),
            com.local_ip.eq(self.local_ip),
            self.sending.eq(com.sending),
            self.frames.eq(com.frames),
            self.frames_aborted.eq(com.frames_aborted),
            self.wrs_refused.eq(com.wrs_refused),
            self.status_dropped.eq(com.status_dropped),
        ]
        return m
