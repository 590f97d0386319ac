# SPDX-License-Identifier: BSD-2-Clause
"""Run Ethernet frames through the hardware :class:`~roce_hw.lib.icrc.ICRCChecker` in the Amaranth
simulator and return its per-frame verdicts (used by ``python -m sim.analyze --hw``)."""

from roce_hw.config import check_data_width
from roce_hw.lib.icrc import ICRCChecker

from .harness import run_simulation
from .stream import send_packet, stream_get

__all__ = ["check_frames"]


def check_frames(frames, width=512):
    """iCRC verdict of the simulated hardware checker for each frame, in order.

    Parameters
    ----------
    frames : list of bytes
        Whole Ethernet frames (anything after the UDP-length-bounded packet, e.g. an FCS, is
        ignored by the checker). Empty frames are not valid bus packets and are reported bad
        without being simulated.
    width : int
        Data width of the simulated checker (64, 128, 256, 512 or 1024).

    Returns
    -------
    list of bool
        ``True`` where the checker reported a good iCRC.

    Raises
    ------
    ValueError
        For an unsupported ``width``.
    TimeoutError
        If the simulated checker did not produce one result per frame in time (a hardware bug).
    """
    check_data_width(width)
    frames = [bytes(f) for f in frames]
    sent = [f for f in frames if f]
    results = []
    if sent:
        dut = ICRCChecker(width)
        nbytes = width // 8

        async def producer(ctx):
            for f in sent:
                await send_packet(ctx, dut.i, f, width, garbage=False)

        async def consumer(ctx):
            for _ in sent:
                results.append(bool((await stream_get(ctx, dut.o)).good))

        cycles = sum(-(-len(f) // nbytes) for f in sent) + dut.latency + 16
        run_simulation(dut, [producer, consumer], cycles=cycles, vcd_name="icrc_hw")
    it = iter(results)
    return [next(it) if f else False for f in frames]
