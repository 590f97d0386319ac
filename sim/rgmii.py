# SPDX-License-Identifier: BSD-2-Clause
"""A model of the RGMII wires for simulation: what the MAC sends is captured byte by byte and
decoded here (preamble, SFD, FCS against ``zlib.crc32``), and frames are driven into the MAC's
receive side, right or deliberately wrong.

The wires are the DDR cells' fabric side of :class:`roce_hw.mac.rgmii.RgmiiPhy` without pads
(``ddr_tx``/``ddr_rx``): per clock cycle 4 data wires and the control wire at the rising and at
the falling edge. The encoding is RGMII's own (written here from the RGMII 2.0 specification,
not taken from the hardware): bits 3:0 of a byte on the rising edge, 7:4 on the falling; the
control wire is EN (DV) on the rising edge and EN xor ER on the falling."""

import zlib
from collections import deque
from dataclasses import dataclass, field

__all__ = ["PREAMBLE", "fcs_of", "wire_frame", "WireFrame", "decode", "RgmiiLink"]

#: Preamble and start frame delimiter as they go on the wire (IEEE 802.3 clause 4.2.5).
PREAMBLE = bytes([0x55] * 7 + [0xD5])


def fcs_of(frame):
    """The 4 FCS bytes of ``frame``: ``zlib.crc32``, least significant byte first."""
    return zlib.crc32(frame).to_bytes(4, "little")


def wire_frame(frame, *, fcs=None, preamble=PREAMBLE, errors=()):
    """The bytes of ``frame`` as sent on the wire: ``preamble`` (SFD included), the frame, and
    ``fcs`` (default: the right one). ``errors``: positions (in the returned bytes) that carry
    RX_ER. Returns a :class:`WireFrame`."""
    raw = bytes(preamble) + bytes(frame) + (fcs_of(frame) if fcs is None else bytes(fcs))
    return WireFrame(raw, set(errors))


@dataclass
class WireFrame:
    """One burst of the control wire high: ``raw`` bytes (preamble included) and the positions
    with ER set. ``start``/``end``: the cycles of its first and last byte (captured frames)."""
    raw: bytes
    errors: set = field(default_factory=set)
    start: int = 0
    end: int = 0


def decode(wf):
    """``(frame, ok)`` of a captured :class:`WireFrame`: the frame without preamble and FCS,
    and whether the preamble, the SFD and the FCS are right and no byte carried ER."""
    raw = wf.raw
    if len(raw) < len(PREAMBLE) + 4:
        return b"", False
    frame, fcs = raw[len(PREAMBLE):-4], raw[-4:]
    ok = raw[:len(PREAMBLE)] == PREAMBLE and fcs == fcs_of(frame) and not wf.errors
    return frame, ok


class RgmiiLink:
    """The wires of one RGMII PHY in simulation.

    ``monitor_tx`` (a process of ``tx_domain``) captures every burst the MAC sends into
    :attr:`sent` (a list of :class:`WireFrame` with their cycles); with ``loopback`` each one is
    also queued for the receive side, as a cable to a PHY that loops back would. ``drive_rx``
    (a process of ``rx_domain``) sends the queued :class:`WireFrame` s (:meth:`send`), each
    followed by ``gap`` idle cycles, and keeps the wires idle when nothing is queued.
    """

    def __init__(self, ddr_tx, ddr_rx, *, tx_domain="sync", rx_domain="eth_rx", loopback=False,
                 gap=12):
        self._tx, self._rx = ddr_tx, ddr_rx
        self._tx_domain, self._rx_domain = tx_domain, rx_domain
        self._loopback = loopback
        self._gap = gap
        self.sent = []
        self.queue = deque()
        self.cycle = 0
        self.rx_idle = True     # nothing queued or being sent

    def send(self, wf):
        """Queue a :class:`WireFrame` (or raw frame bytes: sent with a right FCS)."""
        self.queue.append(wf if isinstance(wf, WireFrame) else wire_frame(wf))
        self.rx_idle = False

    async def monitor_tx(self, ctx):
        cur = None
        async for _, _, value in ctx.tick(self._tx_domain).sample(self._tx):
            self.cycle += 1
            data, ctl = int(value.data), int(value.ctl)
            en = ctl & 1
            er = (ctl ^ (ctl >> 1)) & 1
            if en:
                if cur is None:
                    cur = (bytearray(), set(), self.cycle)
                if er:
                    cur[1].add(len(cur[0]))
                cur[0].append(data)
            elif cur is not None:
                wf = WireFrame(bytes(cur[0]), cur[1], cur[2], self.cycle - 1)
                self.sent.append(wf)
                if self._loopback:
                    self.send(WireFrame(wf.raw, set(wf.errors)))
                cur = None

    async def drive_rx(self, ctx):
        idle = 0
        while True:
            if self.queue and idle >= self._gap:
                wf = self.queue.popleft()
                for k, byte in enumerate(wf.raw):
                    er = 1 if k in wf.errors else 0
                    ctx.set(self._rx.data, byte)
                    ctx.set(self._rx.ctl, 1 | ((1 ^ er) << 1))
                    await ctx.tick(self._rx_domain)
                ctx.set(self._rx.ctl, 0)
                idle = 0
            else:
                self.rx_idle = not self.queue
                await ctx.tick(self._rx_domain)
                idle += 1
