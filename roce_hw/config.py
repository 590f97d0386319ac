# SPDX-License-Identifier: BSD-2-Clause
"""Build-time configuration: one frozen object that every block derives its sizes from."""

from dataclasses import dataclass

__all__ = ["DATA_WIDTHS", "MAX_N_QP", "MAX_RX_QUEUE", "DEFAULT_CLOCK_HZ", "MIN_CLOCK_HZ",
           "MAX_CLOCK_HZ", "check_data_width", "check_n_qp",
           "check_config", "EngineConfig"]

#: The datapath widths the generator supports, in bits.
DATA_WIDTHS = (64, 128, 256, 512, 1024)
#: The most queue pairs a QP table holds.
MAX_N_QP = 16384
#: The most entries of one of the RX front end's item queues.
MAX_RX_QUEUE = 4096
#: The engine clock assumed per data width when :attr:`EngineConfig.clock_hz` is None: the
#: 10G MACs' 156.25 MHz at 64 bits, the 100G CMAC's 322.265625 MHz at the wider ones.
DEFAULT_CLOCK_HZ = {64: 156_250_000, 128: 322_265_625, 256: 322_265_625, 512: 322_265_625,
                    1024: 322_265_625}
#: Bounds of :attr:`EngineConfig.clock_hz`.
MIN_CLOCK_HZ, MAX_CLOCK_HZ = 1_000_000, 1_000_000_000


def check_data_width(data_width):
    """Return ``data_width`` if it is supported, else raise ``ValueError`` naming the valid ones."""
    if isinstance(data_width, bool) or not isinstance(data_width, int):
        raise TypeError(f"data width must be an integer number of bits, not {data_width!r}")
    if data_width not in DATA_WIDTHS:
        raise ValueError(f"data width {data_width} is not supported; choose one of "
                         + ", ".join(str(w) for w in DATA_WIDTHS) + " bits")
    return data_width


def check_n_qp(n_qp):
    """Return ``n_qp``, a number of queue pairs; raise ``ValueError`` unless it is an integer
    from 1 to :data:`MAX_N_QP`."""
    if isinstance(n_qp, bool) or not isinstance(n_qp, int) or not 1 <= n_qp <= MAX_N_QP:
        raise ValueError(f"n_qp must be an integer from 1 to {MAX_N_QP}, not {n_qp!r}")
    return n_qp


@dataclass(frozen=True)
class EngineConfig:
    """Parameters of a RoCEv2 TX engine build.

    Parameters
    ----------
    data_width : int
        Bus width in bits, one of :data:`DATA_WIDTHS`.
    n_qp : int
        Number of queue pairs in the QP/PSN state RAM (1 to 16384).
    ack_req_every : int
        AckReq is set on the last packet of every message and at least every this many packets
        of a long message (rxe uses 64+2; 1 to 2**16).
    ttl : int
        IPv4 TTL of every transmitted frame (1 to 255; Linux and the golden captures use 64).
    ip_id_start : int
        Value of the IPv4 identification counter after reset (0 to 65535); the TX engine puts
        it in its first frame and adds 1 per frame (see :class:`roce_hw.engine.TxEngine`).
    rx_other : bool
        Received frames that are not for the engine (not RoCEv2/CM/ARP addressed to it) leave
        on the ``rx_other`` stream for the user's own network stack (True) or are dropped and
        counted (False).
    cm_pmtu : int
        PMTU code (:class:`roce_hw.proto.Pmtu`, 1..5 = 256..4096 bytes) of the QPs the
        connection manager opens; 3 (1024 bytes) suits a 1500-byte Ethernet MTU.
    rx_arp_depth, rx_cm_depth, rx_roce_depth : int
        Entries (2 to :data:`MAX_RX_QUEUE`) of the RX front end's queues of ARP requests, CM
        datagrams and RoCEv2 packet headers (:class:`roce_hw.rx.frontend.RxFrontEnd`): a burst
        of that many items is held while the consumer is busy; an item that finds its queue full
        is dropped and counted. 32 each by default: sixteen hosts connecting at once (an ARP
        request, OPEN_QP and MODIFY_QP_RTS each) at line rate. Cost: ``depth - 1`` rows of RAM
        of 80 / 624 / 193 bits plus an output register; up to 33 entries fit the 32-deep LUT
        RAM that 4 entries already take (the costs of other depths are in
        :class:`~roce_hw.rx.frontend.RxFrontEnd`'s docstring).
    clock_hz : int or None
        Frequency of the engine's clock in Hz (1 MHz to 1 GHz), from which the retransmission
        timers count time (local ACK timeout, RNR waits). None (the default) takes the clock
        of the width's usual MAC: :data:`DEFAULT_CLOCK_HZ` (156.25 MHz at 64 bits, the 10G
        MACs; 322.265625 MHz at the wider ones, the 100G CMAC's). A timer is never early
        whatever the value; a clock faster than declared makes it early in real time, so
        declare the real one (a board build declares its own).
    """
    data_width: int = 512
    n_qp: int = 16
    ack_req_every: int = 64
    ttl: int = 64
    ip_id_start: int = 0
    rx_other: bool = True
    cm_pmtu: int = 3
    rx_arp_depth: int = 32
    rx_cm_depth: int = 32
    rx_roce_depth: int = 32
    clock_hz: int = None

    def __post_init__(self):
        check_data_width(self.data_width)
        check_n_qp(self.n_qp)
        if isinstance(self.ack_req_every, bool) or not isinstance(self.ack_req_every, int) or \
                not 1 <= self.ack_req_every <= 1 << 16:
            raise ValueError(f"ack_req_every must be an integer from 1 to 65536, "
                             f"not {self.ack_req_every!r}")
        if isinstance(self.ttl, bool) or not isinstance(self.ttl, int) or \
                not 1 <= self.ttl <= 255:
            raise ValueError(f"ttl must be an integer from 1 to 255, not {self.ttl!r}")
        if isinstance(self.ip_id_start, bool) or not isinstance(self.ip_id_start, int) or \
                not 0 <= self.ip_id_start <= 0xFFFF:
            raise ValueError(f"ip_id_start must be an integer from 0 to 65535, "
                             f"not {self.ip_id_start!r}")
        if not isinstance(self.rx_other, bool):
            raise ValueError(f"rx_other must be True or False, not {self.rx_other!r}")
        if isinstance(self.cm_pmtu, bool) or not isinstance(self.cm_pmtu, int) or \
                not 1 <= self.cm_pmtu <= 5:
            raise ValueError(f"cm_pmtu must be a PMTU code from 1 (256 bytes) to 5 (4096 bytes), "
                             f"not {self.cm_pmtu!r}")
        if self.clock_hz is not None and (
                isinstance(self.clock_hz, bool) or not isinstance(self.clock_hz, int)
                or not MIN_CLOCK_HZ <= self.clock_hz <= MAX_CLOCK_HZ):
            raise ValueError(f"clock_hz must be an integer number of Hz from {MIN_CLOCK_HZ} "
                             f"to {MAX_CLOCK_HZ} (or None), not {self.clock_hz!r}")
        for name in ("rx_arp_depth", "rx_cm_depth", "rx_roce_depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or \
                    not 2 <= value <= MAX_RX_QUEUE:
                raise ValueError(f"{name} must be an integer from 2 to {MAX_RX_QUEUE}, "
                                 f"not {value!r}")

    @property
    def timer_clock_hz(self):
        """The clock the timers count: :attr:`clock_hz`, or the width's default."""
        if self.clock_hz is not None:
            return self.clock_hz
        return DEFAULT_CLOCK_HZ[self.data_width]

    @property
    def data_bytes(self):
        """Bytes per bus beat."""
        return self.data_width // 8


def check_config(config):
    """Return ``config`` if it is an :class:`EngineConfig`, else raise ``TypeError``."""
    if not isinstance(config, EngineConfig):
        raise TypeError(f"expected an EngineConfig, not {config!r}")
    return config
