# SPDX-License-Identifier: BSD-2-Clause
"""Golden model of the RX front end (:class:`roce_hw.rx.frontend.RxFrontEnd`): what becomes of
one received Ethernet frame.

Pure Python (no Amaranth import), built on :mod:`roce_hw.proto` (every header is decoded with its
:class:`~roce_hw.proto.Header`), :func:`roce_hw.model.packet.ipv4_checksum`'s one's-complement sum
and :func:`roce_hw.model.icrc.frame_icrc_ok`.

:func:`classify` returns ``(kind, reason, fields)``. ``kind`` is one of :data:`KINDS`:
``"arp"``, ``"cm"``, ``"roce"`` (the frame goes to that stream of the front end, unless its queue
is full), ``"other"`` (not for the engine: it leaves on ``other``, or is dropped when there is no
``other`` stream or no room) or ``"drop"`` (for the engine but malformed). ``reason`` is the
counter of :data:`RX_COUNTERS` the frame is counted in when it is not dropped for lack of room
(``kind`` itself for the first four kinds), one of :data:`roce_hw.proto.RX_VERDICTS`. The
rules, in order -- the first that applies decides:

1. the MAC flagged the frame bad (``abort`` on its last beat): drop, ``mac_bad``;
2. shorter than an Ethernet header (14 bytes): drop, ``runt``;
3. EtherType ARP: ``arp`` if the destination MAC is ours or broadcast, the frame holds the whole
   28-byte ARP packet, ``htype`` 1, ``ptype`` 0x0800, ``hlen`` 6, ``plen`` 4, ``oper`` REQUEST
   and ``tpa`` = our IP; any other ARP frame (replies, requests for other addresses, malformed
   or truncated ones) is ``other`` -- the user's network stack may want it;
4. destination MAC not ours (broadcast and multicast included), or EtherType not IPv4: ``other``;
5. a frame to our MAC with EtherType IPv4 is the engine's to judge, and a malformed one is
   dropped, never passed on: shorter than 14 + 20 bytes (``runt``); version not 4 or IHL not 5,
   i.e. options (``ip_header``); MF set or a fragment offset (``ip_fragment``); bad header
   checksum (``ip_checksum``, RFC 1071: the one's-complement sum of the 10 header words is
   0xFFFF); total length below 20 or not the frame's (frame bytes - 14 = total length, or a
   60-byte frame whose total length is below 46: Ethernet padding) (``ip_length``);
6. destination IP not ours, or protocol not UDP: ``other``;
7. UDP length not total length - 20, or below 8: drop, ``udp_length``;
8. UDP destination port 4791: UDP length below 8 + 12 + 4 (no room for a BTH and an iCRC):
   drop, ``roce_length``; frame longer than :data:`ICRC_MAX_FRAME_BYTES` or bad iCRC: drop,
   ``icrc``; else ``roce``;
9. UDP destination port 0x4321: UDP length not 8 + 64: drop, ``cm_length``; else ``cm``;
10. any other UDP port: ``other``.

``fields`` (``None`` unless ``kind`` is ``arp``/``cm``/``roce``) holds what the stream carries,
keyed as the hardware layouts: ``arp`` ``{sha, spa}``; ``cm`` ``{src_mac, src_ip, src_port,
udp_checksum, dgram}`` (``dgram`` a :data:`proto.CM_DATAGRAM` field dict); ``roce`` ``{src_ip, src_port,
udp_length, bth_aeth_only, bth, aeth}`` where ``aeth`` is the 4 bytes after the BTH decoded as
an AETH (meaningful only for opcodes that carry one) and ``bth_aeth_only`` is 1 when the packet
is exactly BTH + AETH + iCRC (UDP length 8 + 12 + 4 + 4).
"""

import struct
from collections import namedtuple

from .. import proto
from .icrc import frame_icrc_ok

__all__ = ["KINDS", "RX_COUNTERS", "OUTCOMES", "ICRC_MAX_FRAME_BYTES", "BROADCAST_MAC",
           "RxResult", "classify", "ipv4_header_ok", "RxCounterModel"]

#: What can become of a frame.
KINDS = ("arp", "cm", "roce", "other", "drop")

#: The outcome counters (declared in :mod:`roce_hw.proto`).
RX_COUNTERS = proto.RX_COUNTERS

#: The counters a frame can end in (all but ``rx_frames``).
OUTCOMES = RX_COUNTERS[1:]

#: Frames longer than this have a bad iCRC for the hardware checker
#: (:data:`roce_hw.lib.icrc.MAX_FRAME_BYTES`; the tests check the two agree).
ICRC_MAX_FRAME_BYTES = 16384

BROADCAST_MAC = proto.BROADCAST_MAC

_ETH_HLEN = proto.ETH.size
_IP_OFF = _ETH_HLEN
_UDP_OFF = _IP_OFF + proto.IPV4.size
_L4_OFF = _UDP_OFF + proto.UDP.size
_MIN_FRAME = proto.ETH_MIN_FRAME   # shorter IP packets arrive padded to it
_ROCE_MIN_UDP = proto.UDP.size + proto.BTH.size + proto.ICRC_BYTES
_ACK_UDP = _ROCE_MIN_UDP + proto.AETH.size
_CM_UDP = proto.UDP.size + proto.CM_DATAGRAM_BYTES

RxResult = namedtuple("RxResult", "kind reason fields")


def ipv4_header_ok(header):
    """RFC 1071 check of a 20-byte IPv4 header (checksum field included): the one's-complement
    sum of its ten 16-bit words is 0xFFFF."""
    if len(header) != proto.IPV4.size:
        raise ValueError(f"an IPv4 header without options is 20 bytes, not {len(header)}")
    total = sum(struct.unpack("!10H", bytes(header)))
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    return total == 0xFFFF


def _drop(reason):
    return RxResult("drop", reason, None)


_OTHER = RxResult("other", "other", None)


def classify(frame, *, bad=False, local_mac, local_ip):
    """What the RX front end does with ``frame`` (Ethernet header .. end, no FCS); see the module
    docstring. ``bad`` is the MAC's bad-frame flag; ``local_mac``/``local_ip`` are integers
    (``0x020000000001`` is 02:00:00:00:00:01). Returns an :data:`RxResult`."""
    frame = bytes(frame)
    size = len(frame)
    if bad:
        return _drop("mac_bad")
    if size < _ETH_HLEN:
        return _drop("runt")
    eth = proto.ETH.unpack(frame)
    if eth["ethertype"] == proto.ETHERTYPE_ARP:
        if eth["dst"] in (local_mac, BROADCAST_MAC) and size >= _ETH_HLEN + proto.ARP.size:
            arp = proto.ARP.unpack(frame, _ETH_HLEN)
            if all(arp[k] == v for k, v in proto.ARP_FIXED.items()) and \
                    arp["oper"] == proto.ArpOper.REQUEST and arp["tpa"] == local_ip:
                return RxResult("arp", "arp", {"sha": arp["sha"], "spa": arp["spa"]})
        return _OTHER
    if eth["dst"] != local_mac or eth["ethertype"] != proto.ETHERTYPE_IPV4:
        return _OTHER
    if size < _UDP_OFF:
        return _drop("runt")
    ip = proto.IPV4.unpack(frame, _IP_OFF)
    if (ip["version"], ip["ihl"]) != (proto.IPV4_FIXED["version"], proto.IPV4_FIXED["ihl"]):
        return _drop("ip_header")
    if (ip["flag_mf"], ip["frag_offset"]) != (proto.IPV4_FIXED["flag_mf"],
                                              proto.IPV4_FIXED["frag_offset"]):
        return _drop("ip_fragment")
    if not ipv4_header_ok(frame[_IP_OFF:_UDP_OFF]):
        return _drop("ip_checksum")
    total = ip["total_length"]
    if total < proto.IPV4.size or not (size - _ETH_HLEN == total or
                                       (size == _MIN_FRAME and total < _MIN_FRAME - _ETH_HLEN)):
        return _drop("ip_length")
    if ip["dst"] != local_ip or ip["protocol"] != proto.IP_PROTO_UDP:
        return _OTHER
    if total < proto.IPV4.size + proto.UDP.size:
        return _drop("udp_length")          # no room for a UDP header in the IP packet
    udp = proto.UDP.unpack(frame, _UDP_OFF)
    if udp["length"] != total - proto.IPV4.size:
        return _drop("udp_length")
    if udp["dst_port"] == proto.ROCEV2_UDP_PORT:
        if udp["length"] < _ROCE_MIN_UDP:
            return _drop("roce_length")
        if size > ICRC_MAX_FRAME_BYTES or not frame_icrc_ok(frame):
            return _drop("icrc")
        return RxResult("roce", "roce", {
            "src_ip": ip["src"], "src_port": udp["src_port"], "udp_length": udp["length"],
            "bth_aeth_only": int(udp["length"] == _ACK_UDP),
            "bth": proto.BTH.unpack(frame, _L4_OFF),
            "aeth": proto.AETH.unpack(frame, _L4_OFF + proto.BTH.size)})
    if udp["dst_port"] == proto.CM_UDP_PORT:
        if udp["length"] != _CM_UDP:
            return _drop("cm_length")
        return RxResult("cm", "cm", {
            "src_mac": eth["src"], "src_ip": ip["src"], "src_port": udp["src_port"],
            "udp_checksum": udp["checksum"], "dgram": proto.CM_DATAGRAM.unpack(frame, _L4_OFF)})
    return _OTHER


class RxCounterModel:
    """The front end's counters for a sequence of frames, given what happened to the queues.

    ``add(result, taken)``: ``result`` from :func:`classify`; ``taken`` says whether a frame of
    kind ``arp``/``cm``/``roce``/``other`` got into its queue or FIFO (ignored for drops).
    :attr:`counts` maps every name of :data:`RX_COUNTERS` to its value (wrapping at 2**32).
    """

    def __init__(self):
        self.counts = dict.fromkeys(RX_COUNTERS, 0)

    def add(self, result, taken=True):
        kind, reason, _ = result
        if kind == "drop":
            name = reason
        elif kind == "other":
            name = "other" if taken else "other_dropped"
        else:
            name = kind if taken else f"{kind}_full"
        for key in ("rx_frames", name):
            self.counts[key] = (self.counts[key] + 1) & 0xFFFFFFFF
        return name
