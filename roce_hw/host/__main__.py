# SPDX-License-Identifier: BSD-2-Clause
"""``python -m roce_hw.host`` (console script ``roce-host``): talk to the engine's UDP
connection manager (PROTOCOL.md §7).

Sub-commands (each takes ``--engine-ip``, required, and the common options below)::

    open   --qpn Q [--psn P] [--rkey K] [--addr A] [--engine-psn E] [--engine-qpn N]
    rts    --engine-qpn N --qpn Q [--psn P] [--rkey K] [--addr A] [--engine-psn E]
    close  --engine-qpn N [--qpn Q]
    start  --engine-qpn N [--length L] [--count C] [--period T] [--write | --send] [--imm]
    stop   --engine-qpn N
    info   --engine-qpn N
    verbs  DEVICE [--length L] [--count C] [--period T] [--write | --send] [--imm] [--wait]
           [--no-check] [--close] [--reopen] [--pmtu B] [--gid-index I] [--port P]
           [--data-timeout S] [--seed S]

``--verbs DEVICE`` anywhere on the line is the same as the sub-command ``verbs DEVICE``.

Common options: ``--engine-port`` (0x4321), ``--local-ip`` (our IP, sent as ``loc_ip`` and bound;
default: the address the kernel routes the engine's IP from), ``--bind`` (bind address, default
the local IP), ``--reply-port`` (0x4322; 0 = any free port), ``--timeout`` (seconds per attempt,
1), ``--retries`` (sends in all, 3), ``--json`` (print the decoded reply, or the verbs summary,
as JSON). Numbers may be decimal or 0x-hex.

Exit status: 0 ACK (verbs: every byte right); 1 NAK, NO_QP or ERROR (verbs: also a data
mismatch); 2 usage error, no reply after the retries, or a set-up failure (an ``error:`` line on
standard error, no traceback).
"""

import argparse
import json
import random
import sys

from .. import proto
from ..proto import CmAck, QPState
from . import datagram as dg

__all__ = ["main", "build_parser"]

EXIT_OK, EXIT_REFUSED, EXIT_ERROR = 0, 1, 2


def _int(text):
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    return value


def _positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not positive")
    return value


def _attempts(text):
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("at least 1 attempt")
    return value


def _ip(text):
    try:
        return dg.ip_str(dg.ip_int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an IPv4 address") from None


def _port(text):
    value = _int(text)
    if value > 0xFFFF:
        raise argparse.ArgumentTypeError(f"{text!r} is not a UDP port")
    return value


def build_parser():
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("connection")
    g.add_argument("--engine-ip", "-e", type=_ip, required=True, help="the engine's IPv4 address")
    g.add_argument("--engine-port", type=_port, default=proto.CM_UDP_PORT,
                   help="the engine's CM port (default 0x4321)")
    g.add_argument("--local-ip", type=_ip, default=None,
                   help="our IPv4 address, sent as loc_ip (default: the one routed to the engine)")
    g.add_argument("--bind", type=_ip, default=None,
                   help="address to bind the socket to (default: the local IP)")
    g.add_argument("--reply-port", type=_port, default=proto.CM_REPLY_UDP_PORT,
                   help="UDP port for the reply (default 0x4322; 0: any free port)")
    g.add_argument("--timeout", type=_positive_float, default=1.0,
                   help="seconds to wait for a reply per attempt (default 1)")
    g.add_argument("--retries", type=_attempts, default=3,
                   help="sends in all before giving up (default 3)")
    g.add_argument("--json", action="store_true", help="print the result as JSON")

    p = argparse.ArgumentParser(
        prog="roce-host",
        description="Open, move to RTS, close and query the engine's QPs and start its "
                    "traffic generator over the UDP connection manager (PROTOCOL.md 7); "
                    "'verbs DEVICE' (or --verbs DEVICE) connects a real RC QP with pyverbs "
                    "and checks the generator's data.",
        epilog="exit status: 0 ACK, 1 NAK/NO_QP/ERROR or bad data, 2 usage error, no reply "
               "or set-up failure")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def ours(sp, required_qpn):
        sp.add_argument("--qpn", type=_int, required=required_qpn, default=0,
                        help="our QP number (loc_qpn)")
        sp.add_argument("--psn", type=_int, default=0, help="our start PSN (loc_psn)")
        sp.add_argument("--rkey", type=_int, default=0, help="our R_Key (loc_r_key)")
        sp.add_argument("--addr", type=_int, default=0,
                        help="our base virtual address (loc_base_addr)")
        sp.add_argument("--engine-psn", type=_int, default=0,
                        help="the engine's start (send) PSN (rem_psn)")

    def generator(sp):
        sp.add_argument("--length", type=_int, default=1024, help="bytes per message (1024)")
        sp.add_argument("--count", type=_int, default=1, help="number of messages (1)")
        sp.add_argument("--period", type=_int, default=0,
                        help="clock cycles between messages (0: back to back)")
        kind = sp.add_mutually_exclusive_group()
        kind.add_argument("--write", dest="write", action="store_true", default=True,
                          help="RDMA WRITE (the default)")
        kind.add_argument("--send", dest="write", action="store_false", help="SEND")
        sp.add_argument("--imm", action="store_true", help="with immediate data (= message number)")

    sp = sub.add_parser("open", parents=[common], help="OPEN_QP: connect our QP to an engine QP")
    ours(sp, True)
    sp.add_argument("--engine-qpn", type=_int, default=0,
                    help="ask for this engine QPN (rem_qpn; default 0: the engine chooses)")
    sp = sub.add_parser("rts", parents=[common], help="MODIFY_QP_RTS of an engine QP")
    sp.add_argument("--engine-qpn", type=_int, required=True, help="the engine's QPN (rem_qpn)")
    ours(sp, True)
    sp = sub.add_parser("close", parents=[common], help="CLOSE_QP: free an engine QP")
    sp.add_argument("--engine-qpn", type=_int, required=True, help="the engine's QPN (rem_qpn)")
    sp.add_argument("--qpn", type=_int, default=0, help="our QP number (loc_qpn)")
    sp = sub.add_parser("start", parents=[common], help="start the engine's traffic generator")
    sp.add_argument("--engine-qpn", type=_int, required=True, help="the engine's QPN (rem_qpn)")
    sp.add_argument("--qpn", type=_int, default=0, help="our QP number (loc_qpn)")
    generator(sp)
    sp = sub.add_parser("stop", parents=[common], help="stop the engine's traffic generator")
    sp.add_argument("--engine-qpn", type=_int, required=True, help="the engine's QPN (rem_qpn)")
    sp.add_argument("--qpn", type=_int, default=0, help="our QP number (loc_qpn)")
    sp = sub.add_parser("info", parents=[common], help="FETCH_QP_INFO: read an engine QP")
    sp.add_argument("--engine-qpn", type=_int, required=True, help="the engine's QPN (rem_qpn)")
    sp.add_argument("--qpn", type=_int, default=0, help="our QP number (loc_qpn)")

    sp = sub.add_parser("verbs", parents=[common],
                        help="connect a real RC QP (pyverbs) and check the generator's data")
    sp.add_argument("device", help="RDMA device, e.g. rxe0")
    sp.add_argument("--port", type=_int, default=1, help="device port (1)")
    sp.add_argument("--gid-index", type=_int, default=None,
                    help="source GID index (default: the RoCE v2 GID of the local IP)")
    sp.add_argument("--pmtu", type=_int, default=1024,
                    help="our QP's path MTU in bytes (1024; the engine's CM PMTU)")
    sp.add_argument("--engine-qpn", type=_int, default=0,
                    help="ask OPEN for this engine QPN (default 0: the engine chooses)")
    generator(sp)
    sp.add_argument("--wait", action="store_true",
                    help="do not start the generator; wait for the traffic")
    sp.add_argument("--no-check", dest="check", action="store_false",
                    help="do not compare the data with the generator pattern")
    sp.add_argument("--close", action="store_true", help="CLOSE_QP at the end")
    sp.add_argument("--reopen", action="store_true",
                    help="then close, reopen with new PSNs and check the traffic again")
    sp.add_argument("--data-timeout", type=_positive_float, default=30.0,
                    help="seconds to wait for the traffic of a round (30)")
    sp.add_argument("--seed", type=_int, default=None, help="seed of the random start PSNs")
    return p


def _verbs_alias(argv):
    """``--verbs DEVICE`` (or ``--verbs=DEVICE``) anywhere -> ``verbs DEVICE`` first."""
    out, device = [], None
    it = iter(argv)
    for a in it:
        if a == "--verbs":
            device = next(it, None)
            if device is None:
                out.append(a)          # let argparse complain
        elif a.startswith("--verbs="):
            device = a.split("=", 1)[1]
        else:
            out.append(a)
    return ["verbs", device, *out] if device is not None else out


def _print_reply(args, reply, client):
    code = reply["ack_type"]
    d = dg.decode(reply)
    d["attempts"] = client.last_attempts
    d["strays"] = client.strays
    if args.command == "info" and code == CmAck.ACK:
        d["state"] = _state_name(reply["loc_r_key"])
    if args.json:
        print(json.dumps(d, sort_keys=True))
    else:
        print(f"{args.command}: {d['ack']} from {client.engine_ip}:{client.engine_port} "
              f"(attempt {client.last_attempts})")
        for line in dg.format_reply(reply):
            print("  " + line)
        if "state" in d:
            print(f"  state: {d['state']} (loc_r_key)")
    return EXIT_OK if code == CmAck.ACK and reply["ack_valid"] else EXIT_REFUSED


def _state_name(code):
    try:
        return QPState(code).name
    except ValueError:
        return f"STATE_{code}"


def _request(args, client):
    c = args.command
    if c == "open":
        return client.open(args.qpn, psn=args.psn, r_key=args.rkey, base_addr=args.addr,
                           engine_psn=args.engine_psn, engine_qpn=args.engine_qpn)
    if c == "rts":
        return client.modify_rts(args.engine_qpn, args.qpn, psn=args.psn, r_key=args.rkey,
                                 base_addr=args.addr, engine_psn=args.engine_psn)
    if c == "close":
        return client.close_qp(args.engine_qpn, qpn=args.qpn)
    if c == "info":
        return client.info(args.engine_qpn, qpn=args.qpn)
    if c == "start":
        return client.start(args.engine_qpn, length=args.length, count=args.count,
                            period=args.period, write=args.write, imm=args.imm, qpn=args.qpn)
    if c == "stop":
        return client.stop(args.engine_qpn, qpn=args.qpn)
    raise AssertionError(c)


def _verbs(args, client, backend_factory):
    from . import verbs
    from .client import NoReply
    traffic = verbs.Traffic(length=args.length, count=args.count, period=args.period,
                            write=args.write, imm=args.imm)
    backend = backend_factory(args.device, args.port)
    try:
        session = verbs.VerbsSession(
            backend, client, traffic, pmtu=args.pmtu, gid_index=args.gid_index,
            engine_qpn=args.engine_qpn, start=not args.wait, check=args.check,
            data_timeout=args.data_timeout, rng=random.Random(args.seed),
            log=(lambda m: None) if args.json else (lambda m: print(f"  .. {m}", flush=True)))
        result = session.run(close=args.close, reopen=args.reopen)
    except (NoReply, verbs.VerbsError):
        raise
    except Exception as exc:           # pyverbs reports failed verbs calls as exceptions
        raise verbs.VerbsError(f"{type(exc).__name__}: {exc}") from None
    finally:
        close = getattr(backend, "close", None)
        if close is not None:
            close()
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for line in verbs.format_summary(result):
            print(line)
    return EXIT_OK if result["ok"] else EXIT_REFUSED


def main(argv=None, *, backend_factory=None):
    """Run the tool; returns the exit status. ``backend_factory(device, port)`` replaces
    :class:`roce_hw.host.verbs.PyverbsBackend` (tests)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(_verbs_alias(argv))
    except SystemExit as exc:          # argparse printed the usage error
        return EXIT_ERROR if exc.code else EXIT_OK
    from .client import CmClient, NoReply
    from . import verbs
    try:
        client = CmClient(args.engine_ip, local_ip=args.local_ip, bind_ip=args.bind,
                          reply_port=args.reply_port, engine_port=args.engine_port,
                          timeout=args.timeout, attempts=args.retries)
    except OSError as exc:
        print(f"error: cannot set up the UDP socket: {exc}", file=sys.stderr)
        return EXIT_ERROR
    try:
        if args.command == "verbs":
            return _verbs(args, client, backend_factory or verbs.PyverbsBackend)
        return _print_reply(args, _request(args, client), client)
    except NoReply as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except verbs.VerbsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
