# SPDX-License-Identifier: BSD-2-Clause
"""RoCEv2 capture analyzer: per-frame decode, iCRC validation, PSN/flow statistics.

Usage (from the repository root)::

    python -m sim.analyze CAPTURE [--json OUT] [--plot OUT.png] [--hw [--width W]] [--quiet]

Captures: pcap (microsecond or nanosecond time stamps) and pcapng (tshark, dumpcap, ibdump), of
Ethernet or of the Linux cooked link types SLL and SLL2 that ``tcpdump -i any`` writes (see
:mod:`sim.pcap`). For every RoCEv2 frame (UDP destination port 4791; optional 802.1Q tag, IPv4
or IPv6) one line: frame number, time since the first frame (to the nanosecond for captures with
nanosecond time stamps), source and destination, opcode, dest QP,
PSN, AckReq, RETH (VA, R_Key, length), ImmDt, decoded AETH (ACK/RNR/NAK, code, MSN), payload
length, PadCnt and iCRC good/bad. Then a summary: frames per opcode; per flow (source, destination,
dest QP and, for UD, source QP) the PSN gaps, duplicates, retransmissions and out-of-order
packets of its requests; ACK/NAK counts; iCRC failures; a histogram of inter-packet gaps per
flow (``--plot`` draws it with matplotlib). Non-RoCEv2 frames are skipped and counted.

tshark shows the iCRC but never validates it; a wrong iCRC is the classic reason a NIC silently
drops an FPGA's packets. This tool validates it with the golden model (:mod:`roce_hw.model`) and,
with ``--hw``, also with the hardware iCRC checker simulated at ``--width`` bits
(``sim.icrc_hw.check_frames``), which then has to agree with the model on every frame.

The last line on stdout is ``N passed, N failed`` counting iCRC checks. Exit status: 0 all good,
1 if any iCRC failed (or the hardware disagreed with the model), 2 if the capture is unreadable,
truncated or corrupt, or an option cannot be honoured: a clear ``error:`` message on stderr, never
a traceback. A capture truncated after some whole packets is still reported on (those packets)
before the error and status 2.

PSN rules (PROTOCOL.md §5.6): a request packet whose PSN is ahead of the flow's next expected PSN
opens a *gap* (the skipped PSNs are counted as missing); one behind it is a *duplicate* when an
identical packet (same IP packet bytes) was seen before, a *retransmission* when the PSN was sent
before with different bytes (e.g. a new IP ID after go-back-N), and *out of order* when it fills
an earlier gap. A READ REQUEST of L bytes consumes between 1 and ceil(L / 256) PSNs (the PMTU is
not on the wire), so the next PSN anywhere in that range is in order.
"""

import argparse
import hashlib
import ipaddress
import json
import math
import os
import statistics
import sys
from collections import Counter

from roce_hw import proto
from roce_hw.proto import Opcode, Transport
from roce_hw.model.icrc import frame_icrc_ok, frame_l3
from roce_hw.model.packet import parse_frame
from roce_hw.model.psn import psn_add, psn_diff
from sim.pcap import CaptureError, read_capture

__all__ = ["analyze", "main", "IPG_BINS_US", "format_frame", "HardwareCheckError"]

#: Upper edges of the inter-packet-gap histogram bins, in microseconds (the last bin is open).
IPG_BINS_US = (1, 10, 100, 1_000, 10_000, 100_000, 1_000_000)
_IPG_LABELS = ("<1us", "1-10us", "10-100us", "100us-1ms", "1-10ms", "10-100ms", "100ms-1s", ">=1s")

_REQUEST_OPS = {op for op in Opcode if op.transport in (Transport.RC, Transport.UC, Transport.UD)
                and not op.short_name.startswith(("RDMA_READ_RESPONSE", "ACKNOWLEDGE",
                                                  "ATOMIC_ACKNOWLEDGE"))}


def _ip_str(value, version):
    if version == 4:
        return str(ipaddress.IPv4Address(value))
    return str(ipaddress.IPv6Address(value))


def _aeth_str(aeth):
    kind, code = proto.aeth_decode(aeth["syndrome"])
    if kind == proto.AethType.ACK:
        what = "ACK credits=" + ("unlimited" if code == proto.AETH_ACK_UNLIMITED
                                 else str(proto.CREDIT_TABLE[code]))
    elif kind == proto.AethType.RNR_NAK:
        what = f"RNR-NAK timer={code}({proto.RNR_TIMER_US[code] / 1000:g}ms)"
    elif kind == proto.AethType.NAK:
        try:
            what = "NAK " + proto.NakCode(code).name
        except ValueError:
            what = f"NAK code={code}"
    else:
        what = f"reserved code={code}"
    return f"AETH({what} msn={aeth['msn']})"


def _ipg_bin(us):
    for i, edge in enumerate(IPG_BINS_US):
        if us < edge:
            return i
    return len(IPG_BINS_US)


class _Flow:
    """PSN bookkeeping of one direction of one QP."""

    def __init__(self, key):
        self.key = key
        self.frames = 0
        self.requests = 0
        self.responses = 0
        self.next_psn = None      # next expected request PSN
        self.slack = 0            # extra PSNs a READ may have consumed
        self.first_psn = None
        self.last_psn = None
        self.seen = {}            # psn -> digest of the IP packet bytes last sent with it
        self.missing = set()
        self.gaps = 0
        self.missing_psns = 0
        self.duplicates = 0
        self.retransmissions = 0
        self.out_of_order = 0
        self.acks = 0
        self.naks = Counter()
        self.cnps = 0
        self.times = []

    def request(self, rf, l3):
        psn = rf.psn
        l3 = hashlib.blake2b(l3, digest_size=16).digest()
        self.requests += 1
        if self.first_psn is None:
            self.first_psn = psn
        verdict = "ok"
        if self.next_psn is not None:
            d = psn_diff(psn, self.next_psn)
            if 0 <= d <= self.slack:
                pass                                   # in order (within a READ's PSN range)
            elif d > 0:
                self.gaps += 1
                n = d - self.slack
                self.missing_psns += n
                for k in range(min(n, 1 << 16)):
                    self.missing.add(psn_add(self.next_psn, self.slack + k))
                verdict = f"gap({n} missing)"
            elif psn in self.missing:
                self.missing.discard(psn)
                self.missing_psns -= 1
                self.out_of_order += 1
                verdict = "out-of-order"
            elif psn in self.seen and self.seen[psn] == l3:
                self.duplicates += 1
                verdict = "duplicate"
            else:
                self.retransmissions += 1
                verdict = "retransmission"
        self.seen[psn] = l3
        if verdict == "ok" or verdict.startswith("gap"):
            # the high-water mark moves on; a READ REQUEST of L bytes may consume up to
            # ceil(L / 256) PSNs (PMTU 256 is the smallest), so allow that much slack
            self.next_psn = psn_add(psn, 1)
            self.slack = 0
            if rf.opcode == Opcode.RC_RDMA_READ_REQUEST and rf.reth is not None:
                self.slack = max(0, math.ceil(rf.reth["dma_length"] / 256) - 1)
        self.last_psn = psn
        return verdict

    def summary(self):
        gaps_us = [(b - a) * 1e6 for a, b in zip(self.times, self.times[1:])]
        hist = [0] * (len(IPG_BINS_US) + 1)
        for g in gaps_us:
            hist[_ipg_bin(g)] += 1
        src, dst, qp, src_qp = self.key
        out = {
            "src": src, "dst": dst, "dest_qp": qp, "src_qp": src_qp,
            "frames": self.frames, "requests": self.requests, "responses": self.responses,
            "first_psn": self.first_psn, "last_psn": self.last_psn,
            "psn_gaps": self.gaps, "missing_psns": self.missing_psns,
            "duplicates": self.duplicates, "retransmissions": self.retransmissions,
            "out_of_order": self.out_of_order, "acks": self.acks, "naks": dict(self.naks),
            "cnps": self.cnps,
            "ipg_hist": {"bins_us": list(IPG_BINS_US), "labels": list(_IPG_LABELS),
                         "counts": hist},
            "ipg_us": None,
        }
        if gaps_us:
            out["ipg_us"] = {"min": min(gaps_us), "median": statistics.median(gaps_us),
                             "mean": statistics.fmean(gaps_us), "max": max(gaps_us)}
        out["_gaps_us"] = gaps_us
        return out


def format_frame(rec):
    """One text line for a per-frame record produced by :func:`analyze`."""
    digits = rec.get("t_digits", 6)
    head = f"{rec['n']:6d} {rec['t']:{digits + 6}.{digits}f} {rec['src']} -> {rec['dst']}"
    if rec.get("error"):
        return f"{head} MALFORMED ({rec['error']}) icrc={rec['icrc']}"
    parts = [head, rec["opcode"], f"qp={rec['dest_qp']:#08x}", f"psn={rec['psn']}",
             f"A={rec['ack_req']}"]
    if rec.get("se"):
        parts.append("SE=1")
    if rec.get("reth"):
        r = rec["reth"]
        parts.append(f"RETH(va={r['va']:#x} rkey={r['r_key']:#x} len={r['dma_length']})")
    if rec.get("imm") is not None:
        parts.append(f"ImmDt={rec['imm']:#010x}")
    if rec.get("aeth"):
        parts.append(rec["aeth_text"])
    if rec.get("deth"):
        d = rec["deth"]
        parts.append(f"DETH(qkey={d['q_key']:#x} srcqp={d['src_qp']:#x})")
    parts.append(f"len={rec['payload_len']} pad={rec['pad']} icrc={rec['icrc']}")
    if rec.get("psn_note", "ok") != "ok":
        parts.append(f"[{rec['psn_note']}]")
    return " ".join(parts)


def _l3_offset(frame):
    """``(offset, ip_version)`` of the IP header after Ethernet [+ one 802.1Q tag], or
    ``(None, None)`` when the frame carries neither IPv4 nor IPv6."""
    if len(frame) < 14:
        return None, None
    off = 12
    et = int.from_bytes(frame[off:off + 2], "big")
    off += 2
    if et == proto.ETHERTYPE_VLAN:
        if len(frame) < off + 4:
            return None, None
        et = int.from_bytes(frame[off + 2:off + 4], "big")
        off += 4
    if et == proto.ETHERTYPE_IPV4:
        return off, 4
    if et == proto.ETHERTYPE_IPV6:
        return off, 6
    return None, None


def _l2_l3_addresses(frame):
    """Source/destination strings for a frame the model could not parse."""
    off, version = _l3_offset(frame)
    if version == 4 and len(frame) >= off + 20:
        return (_ip_str(int.from_bytes(frame[off + 12:off + 16], "big"), 4),
                _ip_str(int.from_bytes(frame[off + 16:off + 20], "big"), 4))
    if version == 6 and len(frame) >= off + 40:
        return (_ip_str(int.from_bytes(frame[off + 8:off + 24], "big"), 6),
                _ip_str(int.from_bytes(frame[off + 24:off + 40], "big"), 6))
    return "?", "?"


def _is_rocev2(frame):
    """UDP destination port 4791 over IPv4/IPv6 (with or without one VLAN tag)."""
    off, version = _l3_offset(frame)
    if version == 4:
        if len(frame) < off + 20 or frame[off] >> 4 != 4 or frame[off + 9] != proto.IP_PROTO_UDP:
            return False
        if int.from_bytes(frame[off + 6:off + 8], "big") & 0x1FFF:
            return False              # a non-first fragment carries no UDP header
        off += (frame[off] & 0x0F) * 4
    elif version == 6:
        if len(frame) < off + 40 or frame[off + 6] != proto.IP_PROTO_UDP:
            return False
        off += 40
    else:
        return False
    return len(frame) >= off + 4 and \
        int.from_bytes(frame[off + 2:off + 4], "big") == proto.ROCEV2_UDP_PORT


class HardwareCheckError(Exception):
    """The simulated hardware checker (``--hw``) failed to give one verdict per frame."""


def analyze(packets, *, hw_width=None):
    """Analyze a list of :class:`sim.pcap.Packet`; returns a JSON-serialisable report dict.

    With ``hw_width`` the RoCEv2 frames whose iCRC could be checked (each cut at the end of its
    UDP-length-bounded packet) are also checked by ``sim.icrc_hw.check_frames(frames,
    hw_width)``; raises ``ImportError`` if that module is missing and
    :class:`HardwareCheckError` if it fails.
    """
    t0 = packets[0].time if packets else 0.0
    t0_ns = packets[0].time_ns if packets else None
    # nanosecond captures (simulated traffic: frames a few ns apart) get nanosecond times
    digits = 9 if any(getattr(p, "resolution", 1e-6) < 1e-6 for p in packets) else 6
    records, flows = [], {}
    opcodes = Counter()
    non_roce = 0
    malformed = 0
    snapped = 0
    checked = []            # (record, frame bytes up to the iCRC end) of checkable frames
    for n, pkt in enumerate(packets, 1):
        frame = bytes(pkt.data)
        if not _is_rocev2(frame):
            non_roce += 1
            continue
        if pkt.time_ns is not None and t0_ns is not None:
            rel = (pkt.time_ns - t0_ns) / 1e9          # exact: no epoch-sized float in between
        else:
            rel = pkt.time - t0
        rec = {"n": n, "t": rel, "t_digits": digits, "time": pkt.time,
               "frame_len": len(frame), "wire_len": pkt.wire_len}
        try:
            rf = parse_frame(frame)
        except ValueError as e:
            malformed += 1
            rec["src"], rec["dst"] = _l2_l3_addresses(frame)
            rec["error"] = str(e)
            if pkt.wire_len > len(frame):
                rec["error"] += f" (captured {len(frame)} of {pkt.wire_len} bytes)"
            try:
                start, end = frame_l3(frame)
                rec["icrc"] = "good" if frame_icrc_ok(frame) else "bad"
                checked.append((rec, frame[:end]))
            except ValueError:       # frame_l3 raises ValueError for any unusable frame
                rec["icrc"] = "unchecked"
                if pkt.wire_len > len(frame):
                    snapped += 1
            records.append(rec)
            continue
        src = _ip_str(rf.ip["src"], rf.ip_version)
        dst = _ip_str(rf.ip["dst"], rf.ip_version)
        op = rf.opcode
        opcodes[op.name] += 1
        rec.update({
            "src": src, "dst": dst, "ip_version": rf.ip_version,
            "vlan": None if rf.vlan is None else rf.vlan["vid"],
            "opcode": op.name, "opcode_value": int(op), "dest_qp": rf.dest_qp, "psn": rf.psn,
            "ack_req": rf.bth["ack_req"], "se": rf.bth["se"], "migreq": rf.bth["migreq"],
            "becn": rf.bth["becn"], "fecn": rf.bth["fecn"],
            "reth": rf.reth, "imm": rf.imm, "aeth": rf.aeth, "deth": rf.deth,
            "payload_len": len(rf.payload), "pad": rf.pad,
            "icrc": "good" if rf.icrc_ok else "bad", "icrc_wire": rf.icrc.hex(),
        })
        if rf.aeth is not None:
            rec["aeth_text"] = _aeth_str(rf.aeth)
        src_qp = rf.deth["src_qp"] if rf.deth is not None else None
        key = (src, dst, rf.dest_qp, src_qp)
        flow = flows.get(key)
        if flow is None:
            flow = flows[key] = _Flow(key)
        flow.frames += 1
        flow.times.append(pkt.time)
        start, end = frame_l3(frame)
        if op == Opcode.CNP:
            flow.cnps += 1
        elif op in _REQUEST_OPS:
            # duplicates are recognised on the IP packet bytes (IP ID included)
            rec["psn_note"] = flow.request(rf, frame[start:end])
        else:
            flow.responses += 1
            if rf.aeth is not None:
                kind, code = proto.aeth_decode(rf.aeth["syndrome"])
                if kind == proto.AethType.ACK:
                    # READ responses carry an ACK-type AETH too; count only real ACKs
                    if op in (Opcode.RC_ACKNOWLEDGE, Opcode.RC_ATOMIC_ACKNOWLEDGE):
                        flow.acks += 1
                elif kind == proto.AethType.NAK:
                    try:
                        flow.naks[proto.NakCode(code).name] += 1
                    except ValueError:
                        flow.naks[f"code{code}"] += 1
                elif kind == proto.AethType.RNR_NAK:
                    flow.naks["RNR"] += 1
        checked.append((rec, frame[:end]))
        records.append(rec)

    hw = None
    if hw_width is not None:
        from sim import icrc_hw        # written by the hardware side; imported lazily
        frames = [f for _, f in checked]
        try:
            results = list(icrc_hw.check_frames(frames, hw_width)) if frames else []
        except Exception as e:     # report any failure of the simulated checker, no traceback
            raise HardwareCheckError(f"hardware check failed: {type(e).__name__}: {e}") from e
        if len(results) != len(frames):
            raise HardwareCheckError(f"sim.icrc_hw.check_frames returned {len(results)} "
                                     f"results for {len(frames)} frames")
        disagree = []
        for (rec, _), ok in zip(checked, results):
            rec["icrc_hw"] = "good" if ok else "bad"
            if (rec["icrc"] == "good") != bool(ok):
                disagree.append(rec["n"])
        hw = {"width": hw_width, "frames": len(frames),
              "good": sum(1 for r in results if r), "disagree_with_model": disagree}

    passed = failed = 0
    failures = []
    for rec, _ in checked:
        ok = rec["icrc"] == "good"
        if hw is not None:
            ok = ok and rec["icrc_hw"] == "good"
        if ok:
            passed += 1
        else:
            failed += 1
            failures.append(rec["n"])
    flow_list = [f.summary() for f in flows.values()]
    return {
        "frames_total": len(packets),
        "roce_frames": len(records),
        "non_roce_frames": non_roce,
        "malformed_roce_frames": malformed,
        "icrc": {"passed": passed, "failed": failed,
                 "unchecked": len(records) - len(checked), "snapped": snapped,
                 "failed_frames": failures},
        "opcodes": dict(sorted(opcodes.items())),
        "flows": flow_list,
        "hw": hw,
        "packets": records,
    }


def _print_report(rep, out, *, quiet=False):
    w = out.write
    if not quiet:
        for rec in rep["packets"]:
            w(format_frame(rec) + "\n")
        w("\n")
    w(f"Frames: {rep['frames_total']} total, {rep['roce_frames']} RoCEv2, "
      f"{rep['non_roce_frames']} non-RoCE skipped, {rep['malformed_roce_frames']} malformed\n")
    w("Frames per opcode:\n")
    for name, count in sorted(rep["opcodes"].items(), key=lambda kv: (-kv[1], kv[0])):
        w(f"  {name:40s} {count}\n")
    w("Flows (per QP and direction):\n")
    for f in rep["flows"]:
        qp = f"qp={f['dest_qp']:#08x}" + (f" srcqp={f['src_qp']:#x}" if f["src_qp"] is not None
                                          else "")
        w(f"  {f['src']} -> {f['dst']} {qp}: {f['frames']} frames, {f['requests']} requests"
          f" (PSN {f['first_psn']}..{f['last_psn']}), {f['responses']} responses\n"
          if f["requests"] else
          f"  {f['src']} -> {f['dst']} {qp}: {f['frames']} frames, {f['responses']} responses\n")
        w(f"    PSN gaps {f['psn_gaps']} ({f['missing_psns']} missing), duplicates "
          f"{f['duplicates']}, retransmissions {f['retransmissions']}, out of order "
          f"{f['out_of_order']}; ACKs {f['acks']}, NAKs {sum(f['naks'].values())}"
          + (f" {f['naks']}" if f["naks"] else "") + (f", CNPs {f['cnps']}" if f["cnps"] else "")
          + "\n")
        if f["ipg_us"]:
            s = f["ipg_us"]
            w(f"    inter-packet gap us: min {s['min']:.3f} median {s['median']:.3f} "
              f"mean {s['mean']:.3f} max {s['max']:.3f}\n")
            counts = f["ipg_hist"]["counts"]
            peak = max(counts) or 1
            for label, c in zip(_IPG_LABELS, counts):
                if c:
                    w(f"      {label:>10s} {c:6d} {'#' * max(1, round(30 * c / peak))}\n")
    ic = rep["icrc"]
    if rep["hw"] is not None:
        h = rep["hw"]
        w(f"Hardware iCRC check (width {h['width']}): {h['good']} of {h['frames']} good, "
          f"{len(h['disagree_with_model'])} disagree with the model"
          + (f" (frames {h['disagree_with_model'][:20]})" if h["disagree_with_model"] else "")
          + "\n")
    if ic["unchecked"]:
        w(f"iCRC not checkable: {ic['unchecked']} frame(s) (malformed or snapped)\n")
    if ic["failed"]:
        shown = ", ".join(map(str, ic["failed_frames"][:20]))
        more = " ..." if len(ic["failed_frames"]) > 20 else ""
        w(f"iCRC failures: {ic['failed']} (frames {shown}{more})\n")
    else:
        w("iCRC failures: 0\n")
    w(f"{ic['passed']} passed, {ic['failed']} failed\n")


def _plot(rep, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit(_fail("--plot needs matplotlib, which is not installed "
                               "(pip install matplotlib)"))
    flows = [f for f in rep["flows"] if f["_gaps_us"]]
    fig, ax = plt.subplots(figsize=(9, 5))
    lo = min((min(f["_gaps_us"]) for f in flows), default=1.0)
    hi = max((max(f["_gaps_us"]) for f in flows), default=10.0)
    lo = max(lo, 1e-3)
    hi = max(hi, lo * 10)
    edges = [lo * (hi / lo) ** (i / 40) for i in range(41)]
    for f in flows:
        label = f"{f['src']}->{f['dst']} qp {f['dest_qp']:#x}"
        ax.hist([max(g, lo) for g in f["_gaps_us"]], bins=edges, histtype="step", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("inter-packet gap (µs)")
    ax.set_ylabel("packets")
    ax.set_title("RoCEv2 inter-packet gaps per flow")
    if flows:
        ax.legend(fontsize="small")
    fig.tight_layout()
    try:
        fig.savefig(path)
    except OSError as e:
        raise SystemExit(_fail(f"cannot write {path}: {e.strerror or e}"))
    finally:
        plt.close(fig)


def _fail(msg):
    sys.stderr.write(f"error: {msg}\n")
    return 2


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m sim.analyze",
        description="Decode a RoCEv2 capture, validate every iCRC and summarise PSNs and gaps.")
    ap.add_argument("capture", help="pcap or pcapng file (Ethernet, Linux cooked SLL or SLL2)")
    ap.add_argument("--json", metavar="OUT", help="also write the full report as JSON")
    ap.add_argument("--plot", metavar="OUT.png", help="draw the inter-packet-gap histograms")
    ap.add_argument("--hw", action="store_true",
                    help="also check every iCRC with the simulated hardware checker")
    ap.add_argument("--width", type=int, default=None,
                    help="datapath width in bits for --hw (default 512)")
    ap.add_argument("-q", "--quiet", action="store_true", help="summary only, no per-frame lines")
    args = ap.parse_args(argv)

    capture_error = None
    try:
        packets = read_capture(args.capture)
    except CaptureError as e:
        if not e.packets:
            return _fail(str(e))
        # a truncated capture: report on the readable part, then fail with status 2
        packets, capture_error = e.packets, e
    hw_width = None
    if args.hw:
        try:
            from sim import icrc_hw  # noqa: F401  (fail early, before reading every frame)
        except ImportError as e:
            return _fail(f"--hw needs sim/icrc_hw.py (the hardware iCRC checker), which could "
                         f"not be imported: {e}")
        hw_width = 512 if args.width is None else args.width
    elif args.width is not None:
        return _fail("--width only applies together with --hw")
    try:
        rep = analyze(packets, hw_width=hw_width)
    except HardwareCheckError as e:     # e.g. an unsupported --width
        return _fail(str(e))
    try:
        _print_report(rep, sys.stdout, quiet=args.quiet)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away (``... | head``): stop printing, no traceback; the JSON, the plot
        # and the exit status still follow
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    if args.json:
        clean = dict(rep)
        clean["flows"] = [{k: v for k, v in f.items() if not k.startswith("_")}
                          for f in rep["flows"]]
        clean["file"] = args.capture
        try:
            with open(args.json, "w") as fh:
                json.dump(clean, fh, indent=1)
        except OSError as e:
            return _fail(f"cannot write {args.json}: {e.strerror or e}")
    if args.plot:
        try:
            _plot(rep, args.plot)
        except SystemExit as e:
            return e.code
    if capture_error is not None:
        return _fail(f"{capture_error} (only the {len(packets)} packets before it were analyzed)")
    return 1 if rep["icrc"]["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
