# SPDX-License-Identifier: BSD-2-Clause
"""Segmentation of a work request into its RC/UC packet sequence (PROTOCOL.md §5.7; rxe_req.c).

Rules (Linux rxe ``next_opcode_rc``/``init_req_packet``, verified on the golden captures):

* ``fits = resid <= pmtu``. After a FIRST or MIDDLE the next packet is LAST when the rest fits,
  else MIDDLE; otherwise (start of a message) ONLY when it fits, else FIRST. FIRST and MIDDLE carry
  exactly ``pmtu`` bytes, LAST carries 1..pmtu bytes, and a zero-length message is one ONLY packet
  with no payload.
* RETH on RDMA WRITE FIRST/ONLY only, with the message's start VA and its **total** length.
* ImmDt on the LAST/ONLY packet of a ``*_WITH_IMM`` message.
* SE only on the last packet, only when ``solicited`` and the operation is a SEND (with or
  without immediate) or an RDMA WRITE with immediate (rxe ``init_req_packet``).
* AckReq (RC only): set on the last packet of every message, and on packet index ``i``
  (0-based within the message) whenever ``(i + 1) % ack_req_every == 0``, so that no more than
  ``ack_req_every`` packets ever go out without an ACK request (rxe's ``RXE_MAX_PKT_PER_ACK``
  is 64). UC packets never request an ACK (there are none on UC; rxe sends A=0, as the golden
  ``pingpong_uc.pcap`` shows).
* PSNs are consecutive from ``start_psn`` modulo 2**24. PadCnt = ``(-len(payload)) & 3``.
"""

from dataclasses import dataclass

from ..proto import Opcode, PMTU_BYTES, PSN_MASK, Transport, WR_OPCODE_SEQUENCE, WrOpcode

__all__ = ["PacketSpec", "segment_message", "message_opcodes", "packet_count"]

_VALID_PMTU = tuple(sorted(PMTU_BYTES.values()))

_SEQ = WR_OPCODE_SEQUENCE


@dataclass(frozen=True)
class PacketSpec:
    """One packet of a segmented message (transport headers and payload, no addressing).

    Attributes
    ----------
    opcode : proto.Opcode
        ``RC_*`` or ``UC_*`` opcode.
    psn : int
        24-bit PSN.
    ack_req : bool
        BTH AckReq bit.
    se : bool
        BTH SE (solicited event) bit.
    payload : bytes
        This packet's payload bytes, without pad.
    reth : dict or None
        ``{"va", "r_key", "dma_length"}`` on RDMA WRITE FIRST/ONLY, else ``None``.
    imm : int or None
        ImmDt value on the LAST/ONLY packet of a with-immediate message, else ``None``.
    """
    opcode: Opcode
    psn: int
    ack_req: bool
    se: bool
    payload: bytes
    reth: dict | None = None
    imm: int | None = None

    @property
    def pad(self) -> int:
        """PadCnt: number of zero pad bytes after the payload, ``(-len(payload)) & 3``."""
        return (-len(self.payload)) & 3

    def __hash__(self):
        reth = None if self.reth is None else tuple(sorted(self.reth.items()))
        return hash((self.opcode, self.psn, self.ack_req, self.se, self.payload, reth, self.imm))


def _check_pmtu(pmtu):
    if pmtu not in _VALID_PMTU:
        raise ValueError(f"pmtu = {pmtu!r} bytes is not one of {', '.join(map(str, _VALID_PMTU))}")
    return int(pmtu)


def _check_wr(wr_opcode):
    try:
        wr = WrOpcode(wr_opcode)
    except ValueError:
        raise ValueError(f"work request opcode {wr_opcode!r} is not one of "
                         f"{', '.join(w.name for w in _SEQ)}") from None
    if wr not in _SEQ:
        raise ValueError(f"work request opcode {wr.name} is not supported (only "
                         f"{', '.join(w.name for w in _SEQ)}; RDMA READ is not a TX operation "
                         f"of this model)")
    return wr


def _check_transport(transport):
    try:
        t = Transport(transport)
    except ValueError:
        t = None
    if t not in (Transport.RC, Transport.UC):
        raise ValueError(f"transport {transport!r} is not RC or UC")
    return t


def packet_count(length, pmtu):
    """Number of packets of a ``length``-byte message at ``pmtu`` (1 for a 0-byte message)."""
    pmtu = _check_pmtu(pmtu)
    if length < 0:
        raise ValueError(f"message length {length} is negative")
    return max(1, -(-int(length) // pmtu))


def message_opcodes(wr_opcode, length, pmtu, transport=Transport.RC):
    """The opcode sequence of a message, by rxe's ``next_opcode`` rule."""
    wr = _check_wr(wr_opcode)
    t = _check_transport(transport)
    first, middle, last, only = _SEQ[wr]
    n = packet_count(length, pmtu)
    if n == 1:
        lows = [only]
    else:
        lows = [first] + [middle] * (n - 2) + [last]
    return [Opcode(int(t) | low) for low in lows]


def segment_message(wr_opcode, payload, *, pmtu, start_psn, remote_addr=0, r_key=0, imm=0,
                    solicited=False, ack_req_every=64, transport=Transport.RC, start_packet=0):
    """Split one work request into its packets.

    With ``start_packet`` = ``j`` > 0 the message is *resumed* (go-back-N, PROTOCOL.md §5.10):
    only packets ``j`` .. end are returned, as rxe's ``retry_first_write_send`` sends them:
    the opcodes the full message has at those positions (MIDDLE/LAST, never a new RETH), the
    payload from byte ``j * pmtu`` on, and PSNs consecutive from ``start_psn`` (the PSN of
    packet ``j``). The AckReq count restarts at the resume point: packet ``i`` requests an
    ACK when it is the last or when ``(i - j + 1) % ack_req_every == 0``.

    Parameters
    ----------
    wr_opcode : proto.WrOpcode
        ``SEND``, ``SEND_WITH_IMM``, ``RDMA_WRITE`` or ``RDMA_WRITE_WITH_IMM``.
    payload : bytes
        The whole message (any length, including 0).
    pmtu : int
        Path MTU in payload bytes: 256, 512, 1024, 2048 or 4096.
    start_psn : int
        PSN of the first packet returned (24 bits).
    remote_addr, r_key : int
        RETH VA (64 bits) and R_Key (32 bits) for RDMA WRITEs.
    imm : int
        Immediate data (32 bits) for the ``*_WITH_IMM`` operations.
    solicited : bool
        Request a solicited event (SE on the last packet of SEND*/WRITE_WITH_IMM).
    ack_req_every : int
        Also set AckReq on packet ``i`` when ``(i + 1) % ack_req_every == 0`` (RC only; >= 1).
    transport : proto.Transport
        ``RC`` or ``UC``.
    start_packet : int
        Index of the first packet to return (0: the whole message; see above).

    Returns
    -------
    list of PacketSpec

    Raises
    ------
    ValueError
        Unsupported operation (RDMA_READ or unknown), bad PMTU, PSN, transport, key, address,
        immediate or ``ack_req_every``; a message longer than 2**31 bytes; ``start_packet``
        not below the message's packet count.
    """
    wr = _check_wr(wr_opcode)
    t = _check_transport(transport)
    pmtu = _check_pmtu(pmtu)
    payload = bytes(payload)
    if not 0 <= int(start_psn) <= PSN_MASK:
        raise ValueError(f"start_psn = {start_psn} is not a 24-bit PSN")
    if not 0 <= int(remote_addr) < 1 << 64:
        raise ValueError(f"remote_addr = {remote_addr} does not fit in 64 bits")
    if not 0 <= int(r_key) < 1 << 32:
        raise ValueError(f"r_key = {r_key} does not fit in 32 bits")
    if not 0 <= int(imm) < 1 << 32:
        raise ValueError(f"imm = {imm} does not fit in 32 bits")
    if int(ack_req_every) < 1:
        raise ValueError(f"ack_req_every = {ack_req_every} must be >= 1")
    if len(payload) > 1 << 31:
        raise ValueError(f"message of {len(payload)} bytes exceeds 2**31 bytes")

    is_write = wr in (WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM)
    has_imm = wr in (WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE_WITH_IMM)
    se_capable = wr != WrOpcode.RDMA_WRITE
    opcodes = message_opcodes(wr, len(payload), pmtu, t)
    n = len(opcodes)
    if isinstance(start_packet, bool) or not isinstance(start_packet, int) or \
            not 0 <= start_packet < n:
        raise ValueError(f"start_packet = {start_packet!r} is not a packet index of this "
                         f"{n}-packet message")
    out = []
    for i, op in enumerate(opcodes):
        if i < start_packet:
            continue
        last = i == n - 1
        chunk = payload[i * pmtu:(i + 1) * pmtu]
        reth = None
        if is_write and i == 0:
            reth = {"va": int(remote_addr), "r_key": int(r_key), "dma_length": len(payload)}
        if t == Transport.RC:
            ack = last or (i - start_packet + 1) % int(ack_req_every) == 0
        else:
            ack = False
        out.append(PacketSpec(
            opcode=op,
            psn=(int(start_psn) + i - start_packet) & PSN_MASK,
            ack_req=bool(ack),
            se=bool(last and solicited and se_capable),
            payload=chunk,
            reth=reth,
            imm=int(imm) if (has_imm and last) else None,
        ))
    return out
