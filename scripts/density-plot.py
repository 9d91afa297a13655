#!/usr/bin/env python3
"""Draws the density benchmark (lab/bench/density.sh) as an SVG: L1's MemAvailable against
the number of VMs started, one line per VMM, and the floor.

usage: scripts/density-plot.py RESULTS.txt OUT.svg [FLOOR_MIB]

RESULTS.txt holds the benchmark's output; only its "DENSITY vmm n avail_mib pss_mib" lines
and its "# density: ... MemTotal N MiB, MemAvailable M MiB ..." header are read. Standard
library only (no matplotlib on the lab host)."""

import re
import sys

COLORS = {"qemu": "#d62728", "densevm": "#1f77b4"}
LABELS = {
    "qemu": "QEMU 7.2, free-page-reporting=on",
    "densevm": "densevm fleet (snapshot clones, balloon, free page reporting)",
}


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    text = open(sys.argv[1], encoding="utf-8").read()
    floor = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    series: dict[str, list[tuple[int, int]]] = {}
    for m in re.finditer(r"^DENSITY (\w+) (\d+) (\d+) (\d+)$", text, re.M):
        series.setdefault(m[1], []).append((int(m[2]), int(m[3])))
    start = re.search(r"MemAvailable (\d+) MiB", text)
    if not series:
        print("no DENSITY lines in " + sys.argv[1], file=sys.stderr)
        return 1
    start_avail = int(start[1]) if start else max(a for s in series.values() for _, a in s)
    for s in series.values():
        if s[0][0] != 0:
            s.insert(0, (0, start_avail))
    max_n = max(n for s in series.values() for n, _ in s)
    max_a = max(a for s in series.values() for _, a in s)
    width, height, left, right, top, bottom = 720, 420, 70, 20, 40, 60
    pw, ph = width - left - right, height - top - bottom
    x_max = max(5, ((max_n + 4) // 5) * 5)
    y_max = ((max_a + 199) // 200) * 200

    def x(n: float) -> float:
        return left + pw * n / x_max

    def y(a: float) -> float:
        return top + ph * (1 - a / y_max)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">'
        "L1 MemAvailable against idle 256 MiB VMs started (nested lab)</text>",
    ]
    for i in range(0, x_max + 1, max(1, x_max // 10)):
        out.append(f'<line x1="{x(i)}" y1="{top}" x2="{x(i)}" y2="{top + ph}" stroke="#eee"/>')
        out.append(f'<text x="{x(i)}" y="{top + ph + 16}" text-anchor="middle">{i}</text>')
    for a in range(0, y_max + 1, 200):
        out.append(f'<line x1="{left}" y1="{y(a)}" x2="{left + pw}" y2="{y(a)}" stroke="#eee"/>')
        out.append(f'<text x="{left - 6}" y="{y(a) + 4}" text-anchor="end">{a}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>')
    out.append(
        f'<text x="{left + pw / 2}" y="{height - 20}" text-anchor="middle">VMs started</text>'
    )
    out.append(
        f'<text transform="translate(18,{top + ph / 2}) rotate(-90)" text-anchor="middle">'
        "MemAvailable (MiB)</text>"
    )
    out.append(
        f'<line x1="{left}" y1="{y(floor)}" x2="{left + pw}" y2="{y(floor)}" stroke="#555" '
        'stroke-dasharray="6,4"/>'
    )
    out.append(
        f'<text x="{left + pw - 4}" y="{y(floor) - 5}" text-anchor="end" fill="#555">'
        f"floor {floor} MiB</text>"
    )
    for k, (vmm, pts) in enumerate(sorted(series.items())):
        color = COLORS.get(vmm, "#2ca02c")
        path = " ".join(f"{x(n):.1f},{y(a):.1f}" for n, a in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for n, a in pts:
            out.append(f'<circle cx="{x(n):.1f}" cy="{y(a):.1f}" r="3" fill="{color}"/>')
        ly = top + 16 + 18 * k
        out.append(
            f'<line x1="{left + pw - 330}" y1="{ly - 4}" x2="{left + pw - 310}" y2="{ly - 4}" '
            f'stroke="{color}" stroke-width="2"/>'
        )
        out.append(f'<text x="{left + pw - 305}" y="{ly}">{LABELS.get(vmm, vmm)}</text>')
    out.append("</svg>")
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
