# SPDX-License-Identifier: BSD-2-Clause
"""Segmenter: work requests and resume requests + QP rows -> one packet descriptor per packet."""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..config import check_config
from ..layouts import QPReadSignature, qp_index_width
from ..verbs import resume_layout, wr_layout
from .psn import PsnLookupSignature, WriteBackSignature
from .seg_accept import RequestAccept
from .seg_common import desc_layout, flush_signature, header_bytes
from .seg_emit import DescriptorEmitter
from .seg_resume import ResumePrep

__all__ = ["desc_layout", "header_bytes", "Segmenter"]


class Segmenter(wiring.Component):
    """Work requests (and resume requests) + the QP table -> a stream of packet descriptors.

    A request is accepted from ``resume`` (priority) or ``wr``, its QP row read, checked, and
    split into packets by the QP's PMTU exactly as :func:`roce_hw.model.segment.segment_message`
    does (FIRST/MIDDLE/LAST/ONLY, RETH on a WRITE's first packet, ImmDt on the last, SE, PadCnt,
    AckReq on the last packet and every ``ack_req_every`` packets). A resume request
    (:func:`roce_hw.verbs.resume_layout`) restarts a message at packet ``start_packet`` with
    PSN ``start_psn``: the rest goes out as MIDDLE/LAST without a RETH, as rxe resends it; the
    AckReq count restarts there.

    PSN. A new message's first packet takes the QP's ``next_psn``, newest write-back first
    (``fwd``, a :class:`~roce_hw.tx.psn.PsnForward` looked up while the request waits, and
    ``wb``, also while the descriptor waits on ``o``); its other packets count on from it. A QP
    the write-backs moved to ERROR refuses new messages. ``flush`` drops the rest of the message
    with that tag (the packet builder gave it up). The segmenter writes nothing back.

    Refusals (one descriptor, ``refuse`` != 0, ``last`` = 1): QP index >= ``n_qp``, QP not in RTS
    (or in ERROR by a write-back), PMTU code not 1..5, opcode not one of the four, a resume whose
    ``start_packet`` is not a packet of the message (``LOC_QP_OP_ERR``); ``length`` > 2**31
    (``LOC_LEN_ERR``).

    Structure: three components joined by typed interfaces (:mod:`roce_hw.tx.seg_common`):
    :class:`~roce_hw.tx.seg_accept.RequestAccept` (request + QP row -> a
    :func:`~roce_hw.tx.seg_common.request_layout` record on a stream),
    :class:`~roce_hw.tx.seg_resume.ResumePrep` (a resume's rest and precomputes, on the
    accept stage's :class:`~roce_hw.tx.seg_common.ResumePrepSignature` port) and
    :class:`~roce_hw.tx.seg_emit.DescriptorEmitter` (request record -> packet descriptors).
    The write-backs go to the accept stage and the emitter.

    Timing. A message is kept as ``q`` (full PMTU packets left, the one on ``o`` included) and
    ``r`` (bytes of a last, partial packet): per packet only ``q`` counts down and the next
    descriptor is chosen from flags (``q`` == 1, 2, 3) kept one step ahead, so no byte count is
    ever subtracted. Lengths of a last packet are one 11-bit adder (every header size is a
    multiple of 4). A resume's rest (``length - start_packet * PMTU``) is subtracted 12 bits
    per cycle.

    Latency: a work request transferred in cycle 0 has its first descriptor valid on ``o`` in
    cycle 2, or 3 with ``fwd_registered`` (a resume request in cycle 11). Throughput: a
    message's next descriptor is on ``o`` two cycles after the one before it left (packets with
    payload are at least two beats, and the commit waits for a packet's payload anyway); a
    message's first descriptor comes the cycle after the last one of the message before left
    ``o``. ``o`` comes from registers; ``wr``/``resume`` wait while the accept register is full.

    Parameters
    ----------
    config : EngineConfig
    fwd_registered : bool
        The :class:`~roce_hw.tx.psn.PsnForward` answers a cycle after the key
        (``registered_key``): a work request then waits one cycle more for its look-up.

    Members
    -------
    wr : ``In(stream.Signature(wr_layout(config)))``
    resume : ``In(stream.Signature(resume_layout(config)))``
    qp_rd : ``Out(QPReadSignature(idx_width))``
    o : ``Out(stream.Signature(desc_layout(config)))``
    fwd : ``Out(PsnLookupSignature(idx_width))``
        Look-up port of the :class:`~roce_hw.tx.psn.PsnForward`.
    wb : ``In(WriteBackSignature(idx_width))``
        The write-backs (for a request waiting to be loaded, and to refresh a first descriptor
        waiting on ``o``).
    flush : ``In(flush_signature())``
        Drop the rest of the message with this tag.
    """

    def __init__(self, config, *, fwd_registered=False):
        self._config = check_config(config)
        self._fwd_registered = bool(fwd_registered)
        qw = qp_index_width(config.n_qp)
        super().__init__({
            "wr": In(stream.Signature(wr_layout(config))),
            "resume": In(stream.Signature(resume_layout(config))),
            "qp_rd": Out(QPReadSignature(qw)),
            "o": Out(stream.Signature(desc_layout(config))),
            "fwd": Out(PsnLookupSignature(qw)),
            "wb": In(WriteBackSignature(qw)),
            "flush": In(flush_signature()),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        m.submodules.accept = acc = RequestAccept(cfg, fwd_registered=self._fwd_registered)
        m.submodules.resume = prep = ResumePrep(cfg)
        m.submodules.emit = emit = DescriptorEmitter(cfg, fwd_registered=self._fwd_registered)
        wiring.connect(m, wiring.flipped(self.wr), acc.wr)
        wiring.connect(m, wiring.flipped(self.resume), acc.resume)
        wiring.connect(m, acc.qp_rd, wiring.flipped(self.qp_rd))
        wiring.connect(m, acc.fwd, wiring.flipped(self.fwd))
        wiring.connect(m, acc.prep, prep.req)
        wiring.connect(m, acc.o, emit.i)
        wiring.connect(m, wiring.flipped(self.wb), acc.wb, emit.wb)
        wiring.connect(m, wiring.flipped(self.flush), emit.flush)
        wiring.connect(m, emit.o, wiring.flipped(self.o))
        return m
