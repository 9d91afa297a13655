#!/usr/bin/env python3
"""Draws the nested lab's Redis tiering benchmark (lab/bench/redis-tier.sh) as an SVG:
throughput as a fraction of the same mode's all-DRAM windows against the DRAM the guest's
RAM used (a fraction of the working set), one line per mode, points labelled with their
configured share; the kernel's points carry a dashed span from its DRAM counted low
(memory.current + zram - the cgroup's other charge after the load) to high (resident guest
RAM + all of zram, or of zswap's pool).

usage: scripts/redis-tier-plot.py OUTPUT.txt [OUTPUT2.txt ...] OUT.svg

Each OUTPUT holds one run's "REDISTIER-WS ..." and "REDISTIER mode=... " lines (the
bench's output, build/lab/redis-tier.txt). With several runs every point is drawn and the
lines join the means. Standard library only."""

import sys

import plotframe

COLORS = {
    "tier": "#1f77b4",
    "tier-alt": "#9467bd",
    "tier-eq": "#17becf",
    "tier-eq-hi": "#2ca02c",
    "kernel": "#d62728",
    "kernel-zswap": "#ff7f0e",
}
LABELS = {
    "tier": "densevm tier, budget = share x WS (LZ4 store counted)",
    "tier-alt": "densevm tier, another build (BENCH_REDIS_ALT)",
    "tier-eq": "densevm tier, budget = the kernel's DRAM (low count)",
    "tier-eq-hi": "densevm tier, budget = the kernel's DRAM (high count)",
    "kernel": "L1 kernel: memory.high + zram (dashed: its DRAM counted low to high)",
    "kernel-zswap": "L1 kernel: memory.high + zswap + swap file (dashed: low to high)",
}
# The mode's pool of compressed pages, in the raw lines: what its DRAM counted high adds.
POOL = {"kernel": "zram_kib", "kernel-zswap": "zswap_kib"}


def runs(path: str) -> list[dict]:
    rows, ws = [], None
    for line in open(path, encoding="utf-8"):
        words = line.split()
        if not words:
            continue
        kv = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        if words[0] == "REDISTIER-WS":
            ws = float(kv["ws_kib"])
        elif words[0] == "REDISTIER":
            kv["ws"] = ws
            rows.append(kv)
    return rows


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    points: dict[tuple[str, str], list[tuple[float, float]]] = {}
    # The kernel's DRAM counted low (the cgroup's other charge all subtracted) to high
    # (resident guest RAM + all of zram), at its throughput.
    spans: list[tuple[str, float, float, float]] = []
    for path in sys.argv[1:-1]:
        rows = runs(path)
        if not rows or rows[0]["ws"] is None:
            print("no REDISTIER results in " + path, file=sys.stderr)
            return 1
        for mode in {r["mode"] for r in rows}:
            mine = [r for r in rows if r["mode"] == mode]
            full = [float(r["ops_per_s"]) for r in mine if r["share"] == "1/1"]
            if not full:
                print(f"no all-DRAM window for {mode} in {path}", file=sys.stderr)
                return 1
            base = sum(full) / len(full)
            for r in mine:
                if r["share"] == "1/1":
                    continue
                norm = float(r["ops_per_s"]) / base
                points.setdefault((mode, r["share"]), []).append(
                    (float(r["dram_kib"]) / r["ws"], norm)
                )
                pool = POOL.get(mode)
                if pool and "guest_ram_rss_kib" in r and pool in r:
                    hi = (float(r["guest_ram_rss_kib"]) + float(r[pool])) / r["ws"]
                    spans.append((mode, float(r["dram_kib"]) / r["ws"], hi, norm))
    left, top, ph = plotframe.LEFT, plotframe.TOP, plotframe.PH
    x = plotframe.x
    y = lambda v: top + ph * (1 - min(max(v, 0), 1.2) / 1.2)  # noqa: E731
    out = plotframe.frame(
        y,
        "Redis in a Debian L2 guest (nested lab), zipfian YCSB-B: throughput against DRAM",
        "DRAM holding guest RAM / working set (end of the measured window)",
        "ops/s, % of the same mode's all-DRAM windows",
        [(i / 10, f"{i * 10}%") for i in range(0, 13, 2)],
    )
    for mode, lo, hi, v in spans:
        out.append(
            f'<line x1="{x(lo):.1f}" y1="{y(v):.1f}" x2="{x(hi):.1f}" y2="{y(v):.1f}" '
            f'stroke="{COLORS[mode]}" stroke-width="1" stroke-dasharray="3,2"/>'
        )
    shown = [m for m in COLORS if any(k == m for k, _ in points)]
    ly = top + ph - 18 * len(shown) - 16
    for mode in shown:
        pts = sorted(
            (
                (sum(a for a, _ in p) / len(p), sum(b for _, b in p) / len(p), share, p)
                for (m, share), p in points.items()
                if m == mode
            ),
            key=lambda t: t[0],
        )
        if not pts:
            continue
        c = COLORS[mode]
        path = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b, _, _ in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"/>')
        for a, b, share, raw in pts:
            for ra, rb in raw:
                out.append(f'<circle cx="{x(ra):.1f}" cy="{y(rb):.1f}" r="4" fill="none" stroke="{c}"/>')
            out.append(f'<circle cx="{x(a):.1f}" cy="{y(b):.1f}" r="3" fill="{c}"/>')
            out.append(f'<text x="{x(a) + 6:.1f}" y="{y(b) - 6:.1f}" fill="{c}">{share}</text>')
        out.append(f'<line x1="{left + 300}" y1="{ly}" x2="{left + 325}" y2="{ly}" stroke="{c}" stroke-width="2"/>')
        out.append(f'<text x="{left + 330}" y="{ly + 4}">{LABELS[mode]}</text>')
        ly += 18
    out.append("</svg>")
    with open(sys.argv[-1], "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
