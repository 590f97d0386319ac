# SPDX-License-Identifier: BSD-2-Clause
"""A seeded lossy network between a requester and its peer: drop, duplicate, reorder, corrupt and
delay frames, at random and on purpose (issue 35).

One :class:`LossyLink` carries one direction; :class:`LossyNetwork` holds the two directions of
a connection (``fwd``: requester -> peer, ``rev``: peer -> requester), each with its own
``random.Random``. Time is in clock cycles: a frame put in at cycle ``t`` comes out at
``t + delay`` (plus a random extra delay when one is drawn); frames that come out in the same
cycle keep the order they were put in. The link does not serialise: the sender's port does that
(a frame is put in at the cycle of its last beat).

What happens to one frame put in, in this order (each step draws from the link's generator only
when its probability is above 0, so a run is a pure function of the seed, the parameters and the
frames put in):

1. **targeted drop**: the frame is dropped if it is the ``n``-th (0-based, counted over every
   frame of that class put into this link) data packet, ACK, NAK or retransmission named in
   ``drop_data``/``drop_ack``/``drop_nak``/``drop_retx`` (see :func:`frame_class`);
2. **drop** with probability ``drop`` (``qp_drop`` overrides it per BTH destination QP, e.g.
   ``{0x11: 1.0}`` loses everything sent to QP 0x11);
3. **corrupt** with probability ``corrupt``: one byte between BTH byte 5 and the end of the
   iCRC is XORed with a non-zero value. That region is covered by the iCRC and not masked, and
   CRC-32 detects every error confined to 32 bits, so the receiver's iCRC check must fail and
   the receiver must drop the frame (an FCS would catch any byte; the iCRC is the check both
   the engine and :class:`sim.peer.ResponderModel` run). Frames too short to hold a BTH are
   corrupted in their last byte;
4. **duplicate** with probability ``dup``: a second copy follows the first (same exit cycle,
   or its own extra delay);
5. **reorder** with probability ``reorder``: the frame is held back until 1..``reorder_depth``
   (uniform) later frames have been put in, and comes out right after the last of them, or after
   ``max_hold`` cycles if they do not come;
6. **extra delay** with probability ``delay_p``: 1..``delay_max`` (uniform) cycles more.

Counters (:attr:`LossyLink.counts`): ``frames_in``, ``frames_out``, ``dropped``,
``targeted_dropped``, ``corrupted``, ``duplicated``, ``reordered``, ``delayed``, and ``in_<class>``
per frame class.
"""

import heapq
import random
from collections import Counter, namedtuple

from roce_hw import proto

__all__ = ["FRAME_CLASSES", "FrameInfo", "frame_class", "LossyLink", "LossyNetwork"]

#: What :func:`frame_class` can return.
FRAME_CLASSES = ("data", "ack", "nak", "cnp", "other")

_ACK = int(proto.Opcode.RC_ACKNOWLEDGE)
_CNP = int(proto.Opcode.CNP)
_AETH_SYN_BYTE = proto.BTH.size               # syndrome: first byte after the BTH


def _roce_offsets(frame):
    """``(bth offset, end of the iCRC)`` of a RoCEv2 frame, or ``None``."""
    try:
        ethertype, _, off = proto.split_l2(frame)
    except ValueError:
        return None
    if ethertype == proto.ETHERTYPE_IPV4:
        if len(frame) < off + proto.IPV4.size:
            return None
        ip = proto.IPV4.unpack(frame, off)
        if ip["protocol"] != proto.IP_PROTO_UDP:
            return None
        udp = off + ip["ihl"] * 4
    elif ethertype == proto.ETHERTYPE_IPV6:
        if len(frame) < off + proto.IPV6.size:
            return None
        udp = off + proto.IPV6.size
    else:
        return None
    if len(frame) < udp + proto.UDP.size + proto.BTH.size:
        return None
    hdr = proto.UDP.unpack(frame, udp)
    if hdr["dst_port"] != proto.ROCEV2_UDP_PORT:
        return None
    return udp + proto.UDP.size, min(len(frame), udp + hdr["length"])


#: What :func:`frame_class` tells of a frame: its class (:data:`FRAME_CLASSES`), the BTH
#: destination QP and PSN (``None`` without a BTH) and the AETH syndrome of an ACKNOWLEDGE
#: (else ``None``).
FrameInfo = namedtuple("FrameInfo", "cls dest_qp psn syndrome")


def frame_class(frame):
    """The :data:`FrameInfo` of a frame: class ``"data"`` for an RC/UC request packet (opcode
    below 0x0D of its transport), ``"ack"`` for an ACKNOWLEDGE whose AETH says ACK, ``"nak"``
    for one that says RNR NAK or NAK, ``"cnp"`` for opcode 0x81, ``"other"`` for anything
    else."""
    where = _roce_offsets(frame)
    if where is None:
        return FrameInfo("other", None, None, None)
    bo, _ = where
    bth = proto.BTH.unpack(frame, bo)
    op, qp, psn = bth["opcode"], bth["dest_qp"], bth["psn"]
    if op == _CNP:
        return FrameInfo("cnp", qp, psn, None)
    if op >> 5 in (int(proto.Transport.RC) >> 5, int(proto.Transport.UC) >> 5) and \
            (op & 0x1F) <= 0x0C:
        return FrameInfo("data", qp, psn, None)
    if op == _ACK and len(frame) > bo + _AETH_SYN_BYTE:
        syn = frame[bo + _AETH_SYN_BYTE]
        kind, _ = proto.aeth_decode(syn)
        return FrameInfo("ack" if kind == proto.AethType.ACK else "nak", qp, psn, syn)
    return FrameInfo("other", qp, psn, None)


def _probability(name, p):
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{name} = {p!r} is not a probability in [0, 1]")
    return float(p)


def _cycles(name, n, minimum=0):
    if isinstance(n, bool) or not isinstance(n, int) or n < minimum:
        raise ValueError(f"{name} = {n!r} must be an integer >= {minimum}")
    return n


def _indices(name, values):
    out = frozenset(values or ())
    for v in out:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name}: {v!r} is not a frame index >= 0")
    return out


class LossyLink:
    """One direction of a seeded lossy network (see the module docstring).

    Parameters
    ----------
    seed : int or str
        Seed of this link's ``random.Random``.
    delay : int
        Base delay in cycles (>= 1: a frame never comes out in the cycle it went in).
    drop, dup, reorder, corrupt, delay_p : float
        Probabilities in [0, 1] of each fault, per frame.
    delay_max : int
        Largest extra delay in cycles (>= 1 when ``delay_p`` > 0).
    reorder_depth : int
        A held-back frame waits for 1..``reorder_depth`` later frames (>= 1).
    max_hold : int
        Cycles after which a held-back frame comes out even if no later frame came
        (default ``4 * delay``).
    qp_drop : dict, optional
        ``{BTH destination QP: drop probability}``, overriding ``drop`` for those QPs.
    drop_data, drop_ack, drop_nak, drop_retx : iterable of int
        0-based indices, within their class, of frames to drop on purpose. A retransmission is
        a data packet whose (destination QP, PSN) already went into this link once; it is also
        a data packet (``drop_data`` counts it too).

    Raises
    ------
    ValueError
        A probability outside [0, 1], a negative or non-integer count, a base delay below 1.
    """

    def __init__(self, *, seed=0, delay=100, drop=0.0, dup=0.0, reorder=0.0, corrupt=0.0,
                 delay_p=0.0, delay_max=0, reorder_depth=1, max_hold=None, qp_drop=None,
                 drop_data=(), drop_ack=(), drop_nak=(), drop_retx=()):
        self.delay = _cycles("delay", delay, 1)
        self.drop = _probability("drop", drop)
        self.dup = _probability("dup", dup)
        self.reorder = _probability("reorder", reorder)
        self.corrupt = _probability("corrupt", corrupt)
        self.delay_p = _probability("delay_p", delay_p)
        self.delay_max = _cycles("delay_max", delay_max, 1 if self.delay_p else 0)
        self.reorder_depth = _cycles("reorder_depth", reorder_depth, 1)
        self.max_hold = _cycles("max_hold", 4 * self.delay if max_hold is None else max_hold, 1)
        self.qp_drop = {}
        for qp, p in (qp_drop or {}).items():
            self.qp_drop[int(qp)] = _probability(f"qp_drop[{qp:#x}]", p)
        self.targets = {"data": _indices("drop_data", drop_data),
                        "ack": _indices("drop_ack", drop_ack),
                        "nak": _indices("drop_nak", drop_nak),
                        "retx": _indices("drop_retx", drop_retx)}
        self.rng = random.Random(seed)
        self.counts = Counter()
        self._seen = set()          # (dest QP, PSN) of the data packets put in
        self._queue = []            # heap of (cycle out, sequence, frame)
        self._held = []             # [frames still to wait for, deadline cycle, frame]
        self._seq = 0

    # -- putting frames in ---------------------------------------------------------------------
    def put(self, frame, cycle):
        """Put ``frame`` (bytes) into the link at ``cycle``."""
        frame = bytes(frame)
        cycle = int(cycle)
        self.counts["frames_in"] += 1
        cls, qp, psn, _ = frame_class(frame)
        self.counts[f"in_{cls}"] += 1
        retx = False
        if cls == "data":
            retx = (qp, psn) in self._seen
            self._seen.add((qp, psn))
            if retx:
                self.counts["in_retx"] += 1
        if self._targeted(cls, retx):
            self.counts["targeted_dropped"] += 1
            self._release_held(cycle + self.delay)
            return
        p_drop = self.qp_drop.get(qp, self.drop) if qp is not None else self.drop
        if p_drop and self.rng.random() < p_drop:
            self.counts["dropped"] += 1
            self._release_held(cycle + self.delay)
            return
        if self.corrupt and self.rng.random() < self.corrupt:
            frame = self._corrupted(frame)
            self.counts["corrupted"] += 1
        copies = 1
        if self.dup and self.rng.random() < self.dup:
            copies = 2
            self.counts["duplicated"] += 1
        for _ in range(copies):
            out = cycle + self.delay
            if self.delay_p and self.rng.random() < self.delay_p:
                out += self.rng.randint(1, self.delay_max)
                self.counts["delayed"] += 1
            if self.reorder and self.rng.random() < self.reorder:
                self.counts["reordered"] += 1
                self._release_held(out)
                self._held.append([self.rng.randint(1, self.reorder_depth),
                                   out + self.max_hold, frame, out])
                continue
            self._push(out, frame)
            self._release_held(out)

    def _targeted(self, cls, retx):
        n = self.counts[f"in_{cls}"] - 1
        if cls in ("data", "ack", "nak") and n in self.targets[cls]:
            return True
        return retx and self.counts["in_retx"] - 1 in self.targets["retx"]

    def _corrupted(self, frame):
        b = bytearray(frame)
        where = _roce_offsets(frame)
        if where is None or where[1] <= where[0] + 5:
            k = len(b) - 1
        else:
            k = self.rng.randrange(where[0] + 5, where[1])
        b[k] ^= self.rng.randint(1, 255)
        return bytes(b)

    def _push(self, cycle, frame):
        heapq.heappush(self._queue, (cycle, self._seq, frame))
        self._seq += 1

    def _release_held(self, after):
        """A frame went in (or was lost) with exit cycle ``after``: held frames waiting for it
        count it; those done come out just after it."""
        keep = []
        for h in self._held:
            h[0] -= 1
            if h[0] <= 0:
                self._push(max(after, h[3]), h[2])
            else:
                keep.append(h)
        self._held = keep

    # -- taking frames out ---------------------------------------------------------------------
    def _expire(self, cycle):
        keep = []
        for h in self._held:
            if h[1] <= cycle:
                self._push(h[1], h[2])
            else:
                keep.append(h)
        self._held = keep

    def next_time(self):
        """Cycle of the next frame to come out (``None`` if the link is empty)."""
        times = [h[1] for h in self._held]
        if self._queue:
            times.append(self._queue[0][0])
        return min(times) if times else None

    def pop(self, cycle):
        """Frames that come out at or before ``cycle``: ``[(cycle out, frame)]`` in order."""
        self._expire(cycle)
        out = []
        while self._queue and self._queue[0][0] <= cycle:
            t, _, f = heapq.heappop(self._queue)
            out.append((t, f))
        self.counts["frames_out"] += len(out)
        return out

    def __len__(self):
        """Frames inside the link (held back ones included)."""
        return len(self._queue) + len(self._held)


class LossyNetwork:
    """Both directions of a connection: ``fwd`` (requester -> peer) and ``rev`` (peer ->
    requester), two :class:`LossyLink` with seeds derived from ``seed`` (``"<seed>:fwd"``,
    ``"<seed>:rev"``). ``common`` keyword arguments go to both, ``fwd``/``rev`` (dicts) to one
    direction on top of them."""

    def __init__(self, seed=0, *, fwd=None, rev=None, **common):
        self.fwd = LossyLink(seed=f"{seed}:fwd", **{**common, **(fwd or {})})
        self.rev = LossyLink(seed=f"{seed}:rev", **{**common, **(rev or {})})

    @property
    def counts(self):
        """``{"fwd": Counter, "rev": Counter}``."""
        return {"fwd": self.fwd.counts, "rev": self.rev.counts}
