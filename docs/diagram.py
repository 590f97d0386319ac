#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-2-Clause
"""Draw the whole engine's block diagram: ``python docs/diagram.py`` writes ``docs/engine.svg``.

Plain Python, no dependency: the SVG text is a function of this file alone, so
``tests/test_readme.py`` can check that the committed picture is this script's output. Boxes
are coloured by the package that holds the block (``rx/``, ``ctrl/``, ``tx/``, ``lib/``).
"""

import sys
from pathlib import Path
from xml.sax.saxutils import escape

__all__ = ["svg", "main"]

WIDTH, HEIGHT = 1130, 580
FONT = "DejaVu Sans, Arial, Helvetica, sans-serif"

#: fill, stroke per package
COLOURS = {
    "rx": ("#e3f2e1", "#3c7a34"),
    "ctrl": ("#fdebd3", "#b3661a"),
    "tx": ("#dde8f7", "#2f5d9e"),
    "lib": ("#ececec", "#666666"),
    "ext": ("#ffffff", "#333333"),
}


class _Svg:
    def __init__(self):
        self.parts = []

    def add(self, text):
        self.parts.append(text)

    def text(self, x, y, s, *, size=12, anchor="middle", weight="normal", colour="#222222",
             style="normal"):
        self.add(f'<text x="{x}" y="{y}" font-size="{size}" text-anchor="{anchor}" '
                 f'font-weight="{weight}" font-style="{style}" fill="{colour}">'
                 f'{escape(s)}</text>')

    def box(self, x0, y0, x1, y1, kind, title, lines=(), *, dashed=False, title_at=None):
        fill, stroke = COLOURS[kind]
        dash = ' stroke-dasharray="5,3"' if dashed else ""
        self.add(f'<rect x="{x0}" y="{y0}" width="{x1 - x0}" height="{y1 - y0}" rx="6" '
                 f'fill="{fill}" stroke="{stroke}" stroke-width="1.5"{dash}/>')
        cx = (x0 + x1) // 2
        n = 1 + len(lines)
        top = title_at if title_at is not None else (y0 + y1) // 2 - 7 * (n - 1) + 4
        self.text(cx, top, title, size=13, weight="bold")
        for i, line in enumerate(lines):
            self.text(cx, top + 15 * (i + 1), line, size=10.5, colour="#333333")

    def line(self, points, *, start=False, end=True, colour="#333333", bridge=None):
        """A polyline with arrow heads; ``bridge`` = (x, y) of a crossing to hop over (on a
        horizontal segment)."""
        d = f"M {points[0][0]} {points[0][1]}"
        for (xa, ya), (xb, yb) in zip(points, points[1:]):
            if bridge and ya == yb == bridge[1] and min(xa, xb) < bridge[0] < max(xa, xb):
                bx, by = bridge
                s = 1 if xb > xa else -1
                d += f" L {bx - 6 * s} {by} A 6 6 0 0 {1 if s > 0 else 0} {bx + 6 * s} {by}"
            d += f" L {xb} {yb}"
        marks = ""
        if end:
            marks += ' marker-end="url(#arrow)"'
        if start:
            marks += ' marker-start="url(#arrow-start)"'
        self.add(f'<path d="{d}" fill="none" stroke="{colour}" stroke-width="1.6"{marks}/>')


def svg():
    """The diagram as SVG text."""
    s = _Svg()
    s.add(f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
          f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="{FONT}">')
    s.add('<defs>'
          '<marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
          'markerHeight="7" orient="auto"><path d="M 0 0 L 10 5 L 0 10 z" fill="#333333"/>'
          '</marker>'
          '<marker id="arrow-start" viewBox="0 0 10 10" refX="1" refY="5" markerWidth="7" '
          'markerHeight="7" orient="auto"><path d="M 10 0 L 0 5 L 10 10 z" fill="#333333"/>'
          '</marker></defs>')
    s.add(f'<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>')
    s.text(WIDTH // 2, 20, "roce_engine (build.py --top engine): RoceEngine, one clock", size=14,
           weight="bold")

    # the two sides
    s.box(10, 34, 100, 534, "ext", "", ())
    s.text(55, 290, "MAC", size=16, weight="bold")
    s.text(55, 306, "(no FCS)", size=10)
    s.text(55, 62, "RX", size=12, weight="bold")
    s.text(55, 516, "TX", size=12, weight="bold")
    s.box(1000, 34, 1120, 534, "ext", "", ())
    s.text(1060, 290, "user logic", size=15, weight="bold")

    def port(x, y, names, anchor="start"):
        for i, name in enumerate(names):
            s.text(x, y + 13 * i, name, size=10, anchor=anchor, colour="#1a1a1a")

    # receive side
    s.box(140, 44, 340, 134, "rx", "RX front end",
          ["MAC, IPv4, UDP checks; iCRC", "ARP | CM | RoCEv2 | other"])
    s.line([(100, 89), (140, 89)])
    port(96, 83, ["s_axis_rx"], anchor="end")
    s.line([(340, 59), (1000, 59)])
    port(1005, 63, ["m_axis_rx_other"])
    s.line([(340, 89), (385, 89)])
    s.text(390, 93, "RoCEv2 frames (ACKs): iCRC checked, counted; acted on: later",
           size=10.5, anchor="start", colour="#555555", style="italic")

    # control plane
    s.box(390, 154, 570, 214, "ctrl", "CM responder", ["OPEN, RTS, CLOSE, INFO, txmeta"])
    s.line([(340, 119), (480, 119), (480, 154)])
    s.text(410, 114, "CM datagram", size=10.5)
    s.box(620, 154, 780, 214, "lib", "mgmt arbiter", ["round robin"])
    s.line([(570, 184), (620, 184)], start=True)
    s.line([(780, 184), (1000, 184)], start=True)
    port(1005, 180, ["s_qp_mgmt_req", "m_qp_mgmt_rsp"])
    s.box(620, 274, 780, 334, "ctrl", "QP table", ["1 to 16384 QPs, RAM"])
    s.line([(700, 214), (700, 274)], start=True)
    s.box(390, 274, 570, 334, "ctrl", "traffic generator", ["WRs + payload"])
    s.line([(480, 214), (480, 274)])
    s.text(486, 248, "start / stop", size=10.5, anchor="start")
    s.box(140, 274, 340, 334, "ctrl", "reply builder", ["ARP and CM reply frames"])
    s.line([(200, 134), (200, 274)])
    s.text(206, 204, "ARP request", size=10.5, anchor="start")
    s.line([(390, 199), (300, 199), (300, 274)])
    s.text(345, 193, "reply", size=10.5)
    s.box(830, 374, 960, 424, "ctrl", "WR mux", ["round robin per WR"])
    s.line([(480, 334), (480, 399), (830, 399)], bridge=(765, 399))
    s.line([(1000, 399), (960, 399)])
    port(1005, 389, ["s_wr", "s_resume", "s_axis_payload"])

    # transmit side
    s.box(390, 444, 960, 534, "tx", "TX datapath", title_at=460)
    s.line([(765, 334), (765, 474)], start=True)
    s.text(771, 436, "read, write-back", size=10.5, anchor="start")
    s.line([(895, 424), (895, 474)])
    subs = [(845, 950, "segmenter"), (745, 825, "commit"), (600, 725, "payload cutter"),
            (400, 580, "packet builder")]
    for x0, x1, name in subs:
        s.box(x0, 474, x1, 524, "tx", name, title_at=503)
    s.text(490, 518, "headers, iCRC, IPv4 sum", size=9.5, colour="#333333")
    for (x0, _, _), (_, x1, _) in zip(subs, subs[1:]):
        s.line([(x0, 499), (x1, 499)])
    s.line([(960, 509), (1000, 509)])
    port(1005, 513, ["m_status"])
    s.box(140, 464, 340, 524, "lib", "frame arbiter", ["round robin per frame"])
    s.line([(400, 494), (340, 494)])
    s.line([(240, 334), (240, 464)])
    s.text(246, 404, "reply frames", size=10.5, anchor="start")
    s.line([(140, 494), (100, 494)])
    port(96, 488, ["m_axis_tx"], anchor="end")

    # legend
    y = 560
    x = 140
    for kind, label in (("rx", "roce_hw/rx"), ("ctrl", "roce_hw/ctrl"), ("tx", "roce_hw/tx"),
                        ("lib", "roce_hw/lib")):
        fill, stroke = COLOURS[kind]
        s.add(f'<rect x="{x}" y="{y - 11}" width="22" height="14" rx="3" fill="{fill}" '
              f'stroke="{stroke}" stroke-width="1.5"/>')
        s.text(x + 28, y, label, size=11, anchor="start")
        x += 130
    s.text(x + 10, y, "arrows: valid/ready streams; counters_* from every block; "
           "local_mac, local_ip to all", size=10.5, anchor="start", colour="#555555")
    s.add("</svg>")
    return "\n".join(s.parts) + "\n"


def main(argv=None):
    out = Path(__file__).with_name("engine.svg")
    out.write_text(svg())
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
