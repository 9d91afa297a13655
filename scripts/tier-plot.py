#!/usr/bin/env python3
"""Draws the memory-tiering benchmark (scripts/bench-tier.sh) as an SVG: throughput
normalized to all-DRAM against the DRAM the region actually used (a fraction of the working
set), one line per system, each point labelled with its configured share.

usage: scripts/tier-plot.py RAW.txt [RAW2.txt ...] OUT.svg

Each RAW file holds one run's "TIERZIPF key=value ..." lines (crates/tier/benches/tier_zipf/),
in the order run; with several runs, every point is drawn and the lines join the means.
DRAM used: the tier's resident pages plus its compressed store; the kernel's resident region
plus the zswap pool (cgroup v1 does not charge it to the cgroup). Standard library only."""

import math
import sys

import plotframe

COLORS = {"tier": "#1f77b4", "tier-eq": "#17becf", "kernel": "#d62728", "kernel-anon": "#ff7f0e"}
LABELS = {
    "tier": "densevm-tier, budget = share (LZ4 store counted in it)",
    "tier-eq": "densevm-tier, budget = DRAM the kernel used",
    "kernel": "kernel: cgroup v1 limit = share, zswap (pool not charged)",
    "kernel-anon": "kernel, anonymous memory",
}


def dram_used(r: dict) -> float:
    g = lambda k: float(r.get(k, 0))  # noqa: E731
    m = r["mode"]
    if m.startswith("tier"):
        return g("tier_resident") + g("tier_compressed_bytes")
    if m == "kernel":
        return (g("rss_shmem_kib") + g("zswap_pool_kib")) * 1024
    if m == "kernel-anon":
        return (g("rss_kib") + g("zswap_pool_kib")) * 1024
    return g("rss_shmem_kib") * 1024


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    # (mode, share) -> [(DRAM used / working set, normalized ops/s)], over all runs.
    points: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for path in sys.argv[1:-1]:
        rows = []
        for line in open(path, encoding="utf-8"):
            if line.startswith("TIERZIPF "):
                rows.append(dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv))
        if not any(r["mode"] == "dram" for r in rows):
            print("no all-DRAM result in " + path, file=sys.stderr)
            return 1

        def baseline(i: int) -> float:
            """The mean of the all-DRAM runs just before and after row i (the host's load
            drifts)."""
            near = [
                next((float(r["ops_s"]) for r in rng if r["mode"] == "dram"), None)
                for rng in (reversed(rows[: i + 1]), rows[i:])
            ]
            near = [v for v in near if v is not None]
            return sum(near) / len(near)

        for i, r in enumerate(rows):
            if r["mode"] == "dram" or "failed" in r:
                continue
            ws = float(r["size_mib"]) * 2**20
            points.setdefault((r["mode"], r["share"]), []).append(
                (dram_used(r) / ws, float(r["ops_s"]) / baseline(i))
            )
    series: dict[str, list[tuple[float, float, str, list[tuple[float, float]]]]] = {}
    for (mode, share), pts in points.items():
        label = "1/" + share if mode != "tier-eq" else "=k 1/" + share
        mx = sum(a for a, _ in pts) / len(pts)
        my = sum(b for _, b in pts) / len(pts)
        series.setdefault(mode, []).append((mx, my, label, pts))
    left, top, ph = plotframe.LEFT, plotframe.TOP, plotframe.PH
    x = plotframe.x
    # Log scale: the tiered points sit at a few percent, the all-DRAM ones at ~100 %.
    lo, hi = 0.01, 3.0

    def y(v: float) -> float:
        v = min(max(v, lo), hi)
        return top + ph * (1 - math.log(v / lo) / math.log(hi / lo))

    out = plotframe.frame(
        y,
        "Zipfian (θ = 0.99) key-value store, 95% reads: throughput against DRAM used",
        "DRAM used by the region / working set (at the end of the measured window)",
        "ops/s, % of all-DRAM (runs before and after; log scale)",
        [(pct / 100, f"{pct}%") for pct in (1, 2, 5, 10, 20, 50, 100, 200)],
    )
    order = ["tier", "tier-eq", "kernel", "kernel-anon"]
    names = sorted(series, key=lambda m: order.index(m) if m in order else 9)
    for k, mode in enumerate(names):
        pts = sorted(series[mode])
        color = COLORS.get(mode, "#2ca02c")
        path = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b, _, _ in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for a, b, label, runs in pts:
            for ra, rb in runs:
                out.append(
                    f'<circle cx="{x(ra):.1f}" cy="{y(rb):.1f}" r="3" fill="none" '
                    f'stroke="{color}"/>'
                )
            out.append(f'<circle cx="{x(a):.1f}" cy="{y(b):.1f}" r="3.5" fill="{color}"/>')
            out.append(
                f'<text x="{x(a) + 5:.1f}" y="{y(b) - 6:.1f}" font-size="10" fill="{color}">'
                f"{label}</text>"
            )
        ly = top + 18 + 18 * k
        out.append(
            f'<line x1="{left + 10}" y1="{ly - 4}" x2="{left + 30}" y2="{ly - 4}" '
            f'stroke="{color}" stroke-width="2"/>'
        )
        out.append(f'<text x="{left + 35}" y="{ly}">{LABELS.get(mode, mode)}</text>')
    out.append("</svg>")
    with open(sys.argv[-1], "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
