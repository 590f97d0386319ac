# SPDX-License-Identifier: BSD-2-Clause
"""The lossy-network options of the CLI tools (``sim.traffic``, ``sim.rxe``) and the reliability
fields of their JSON output (issue 35).

:func:`add_arguments` adds the options to a parser, :func:`network_options` checks them and
turns them into :class:`sim.lossy.LossyNetwork` keyword arguments (``None`` when no option was
given: the tool then runs exactly as without this module), :func:`network_fields` and
:func:`reliability_fields` give the JSON sections, :func:`delivery_line` the summary line.

Options (probabilities per frame, applied in both directions, each direction with its own
generator seeded from ``--net-seed``):

==========================  ==============================================================
``--loss P``                drop
``--dup P``                 duplicate (the copy follows the frame)
``--reorder P``             hold a frame back behind 1..``--reorder-depth`` later frames
``--corrupt P``             flip bits of one byte the iCRC covers (the receiver must drop it)
``--delay P``               add 1..``--delay-max`` cycles to a frame's delay
``--latency CYCLES``        one-way delay of every frame
``--drop-data LIST``        drop these data packets (0-based, engine -> peer)
``--drop-retx LIST``        drop these retransmitted data packets (engine -> peer)
``--drop-ack LIST``         drop these ACKs (peer -> engine)
``--drop-nak LIST``         drop these NAKs (peer -> engine)
==========================  ==============================================================

What the engine does not have yet (docs/reliability.md): it sends every packet once and makes
no completions; its ACK handler counts what it receives. :data:`NOT_BUILT` says so in the JSON;
the fields for the parts not built are 0 (``retransmitted`` is measured on the wire all the
same: a data packet whose QP and PSN went out before).
"""

from roce_hw import proto

__all__ = ["PROBABILITIES", "TARGETS", "NOT_BUILT", "add_arguments", "network_options",
           "network_fields", "reliability_fields", "delivery_line"]

#: Probability options: (option, LossyLink keyword, help).
PROBABILITIES = (
    ("--loss", "drop", "probability that a frame is dropped"),
    ("--dup", "dup", "probability that a frame is duplicated"),
    ("--reorder", "reorder", "probability that a frame is held back behind later frames "
                             "(1 to --reorder-depth of them)"),
    ("--corrupt", "corrupt", "probability that a frame is corrupted (one byte under the iCRC: "
                             "the receiver must drop it)"),
    ("--delay", "delay_p", "probability that a frame is delayed 1 to --delay-max cycles more"),
)

#: Targeted drops: (option, LossyLink keyword, direction, what).
TARGETS = (
    ("--drop-data", "drop_data", "fwd", "data packets (engine -> peer; retransmissions count)"),
    ("--drop-retx", "drop_retx", "fwd", "retransmitted data packets (engine -> peer)"),
    ("--drop-ack", "drop_ack", "rev", "ACKs (peer -> engine)"),
    ("--drop-nak", "drop_nak", "rev", "NAKs (peer -> engine)"),
)

#: What the JSON's ``reliability.not_built`` says while the engine has no retransmission.
NOT_BUILT = ("the engine does not retransmit, has no ACK timer, no RNR wait and no completion "
             "queue yet (docs/reliability.md): a lost packet is not recovered; retransmitted, "
             "timeouts and rnr_waits are 0 and completions_by_status holds only the refused WRs "
             "of the status stream")

_ACK_PREFIX = "ack_"


def add_arguments(parser, *, latency=100):
    """Add the options of the module docstring to ``parser`` (an argument group)."""
    g = parser.add_argument_group(
        "lossy network", "a seeded lossy network between the engine and its peer, both "
                         "directions (any of these options puts it in the path)")
    for opt, _, text in PROBABILITIES:
        g.add_argument(opt, metavar="P", default=None,
                       help=f"{text}, each direction, in [0, 1] (default: 0)")
    g.add_argument("--latency", metavar="CYCLES", type=int, default=None,
                   help=f"one-way network delay in cycles, >= 1 (default: {latency})")
    g.add_argument("--delay-max", metavar="CYCLES", type=int, default=None,
                   help="largest extra delay of --delay in cycles, >= 1 (default: 4 x "
                        "--latency)")
    g.add_argument("--reorder-depth", metavar="N", type=int, default=None,
                   help="a frame held back by --reorder waits for 1 to N later frames, >= 1 "
                        "(default: 3)")
    g.add_argument("--net-seed", metavar="S", type=int, default=None,
                   help="seed of the network's random choices (default: --seed)")
    for opt, _, _, what in TARGETS:
        g.add_argument(opt, metavar="N,N...", default=None,
                       help=f"drop these {what}: 0-based indices in their class, "
                            "comma-separated (default: none)")
    parser.set_defaults(_net_latency=latency)


def _probability(opt, text):
    try:
        p = float(text)
    except ValueError:
        raise ValueError(f"{opt} {text!r} is not a number") from None
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{opt} {text} is not a probability in [0, 1]")
    return p


def _indices(opt, text):
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit():
            raise ValueError(f"{opt} {text!r}: {part!r} is not a frame index >= 0")
        out.append(int(part))
    if not out:
        raise ValueError(f"{opt} {text!r} names no frame")
    return out


def network_options(args, *, seed):
    """The :class:`sim.lossy.LossyNetwork` keyword arguments of the parsed options, or ``None``
    when none of them was given. ``seed`` is the default of ``--net-seed``.

    Raises
    ------
    ValueError
        A probability outside [0, 1] or not a number, a latency, maximum delay or reorder
        depth below 1, a bad index list; the message names the option.
    """
    given = {opt: getattr(args, opt[2:].replace("-", "_")) for opt, *_ in
             PROBABILITIES + TARGETS}
    extra = {opt: getattr(args, opt[2:].replace("-", "_")) for opt in
             ("--latency", "--delay-max", "--reorder-depth", "--net-seed")}
    if all(v is None for v in (*given.values(), *extra.values())):
        return None
    kw = {"seed": seed if extra["--net-seed"] is None else extra["--net-seed"]}
    for opt, key, _ in PROBABILITIES:
        if given[opt] is not None:
            kw[key] = _probability(opt, given[opt])
    latency = args._net_latency if extra["--latency"] is None else extra["--latency"]
    for opt, value in (("--latency", latency), ("--delay-max", extra["--delay-max"]),
                       ("--reorder-depth", extra["--reorder-depth"])):
        if value is not None and value < 1:
            raise ValueError(f"{opt} {value} must be >= 1")
    kw["delay"] = latency
    kw["delay_max"] = extra["--delay-max"] or 4 * latency
    kw["reorder_depth"] = extra["--reorder-depth"] or 3
    for opt, key, direction, _ in TARGETS:
        if given[opt] is not None:
            kw.setdefault(direction, {})[key] = _indices(opt, given[opt])
    return kw


#: The per-direction counts of the JSON (:attr:`sim.lossy.LossyLink.counts`).
_LINK_COUNTS = ("frames_in", "frames_out", "dropped", "targeted_dropped", "duplicated",
                "reordered", "corrupted", "delayed")


def network_fields(network, options):
    """The JSON ``network`` section: the options (``options``, from :func:`network_options`)
    and, per direction (``fwd``: engine -> peer, ``rev``: peer -> engine), the frames put in and
    taken out and what the network did to them."""
    out = {"options": dict(options)}
    for d in ("fwd", "rev"):
        counts = network.counts[d]
        out[d] = {k: int(counts.get(k, 0)) for k in _LINK_COUNTS}
    return out


def reliability_fields(counters, *, retransmitted, by_status, naks_sent=None):
    """The JSON ``reliability`` section for the hardware engine.

    ``counters``: the engine's counters (``None`` for a top without a receive path);
    ``retransmitted``: data packets seen on the wire whose QP and PSN went out before;
    ``by_status``: completions by status name; ``naks_sent``: NAKs the peer sent, by kind.
    ``timeouts`` and ``rnr_waits`` are 0: the engine has no timer yet (:data:`NOT_BUILT`)."""
    ack = None
    if counters is not None:
        ack = {name: int(counters.get(_ACK_PREFIX + name, 0)) for name in proto.ACK_COUNTERS}
    return {
        "retransmitted": int(retransmitted),
        "acks_received": None if ack is None else ack["acks"],
        "naks_received": None if ack is None else {
            "seq": ack["naks_seq"], "rnr": ack["rnr_naks"], "fatal": ack["naks_fatal"]},
        "stale_received": None if ack is None else {
            "acks": ack["acks_stale"], "naks": ack["naks_stale"]},
        "ack_counters": ack,
        "rx_icrc_dropped": None if counters is None else int(counters.get("rx_icrc", 0)),
        "naks_sent_by_peer": dict(naks_sent or {}),
        "timeouts": 0,
        "rnr_waits": 0,
        "completions_by_status": dict(by_status),
        "not_built": NOT_BUILT,
    }


def delivery_line(delivered, messages, ok, *, lost_reason=True):
    """The summary line of the delivery verdict."""
    if ok:
        return (f"delivery: PASS, {delivered} of {messages} messages arrived exactly once, in "
                f"order, byte-identical")
    why = " (the engine does not retransmit yet: docs/reliability.md)" if lost_reason else ""
    return (f"delivery: FAIL, {delivered} of {messages} messages arrived exactly once, in "
            f"order, byte-identical; {messages - delivered} not{why}")
