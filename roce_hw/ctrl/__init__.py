# SPDX-License-Identifier: BSD-2-Clause
"""The control plane: the QP table (:mod:`~roce_hw.ctrl.qp_table`), the UDP connection manager
(:mod:`~roce_hw.ctrl.cm`) and its reply frames with ARP's (:mod:`~roce_hw.ctrl.reply`), the
on-chip traffic generator (:mod:`~roce_hw.ctrl.generator`) and the work-request multiplexer
(:mod:`~roce_hw.ctrl.wrmux`). The retransmission scheduler, its timers and the completion queue
join them with the reliability layer.

The control plane drives the datapaths (:mod:`roce_hw.tx`, :mod:`roce_hw.rx`) through their
streams; the datapaths never import it."""
