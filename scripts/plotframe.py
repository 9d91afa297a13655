"""The frame the tiering plots share (scripts/tier-plot.py, scripts/redis-tier-plot.py): an
SVG of 760 x 460 with its title, the x axis 0-1.2 (DRAM used / working set), the y axis
with the caller's ticks and scale, axis labels and the 90 % goal line. Standard library
only."""

WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 760, 460, 70, 20, 40, 60
PW, PH = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM


def x(v: float) -> float:
    """Where DRAM share v (0-1.2) goes across."""
    return LEFT + PW * v / 1.2


def frame(y, title: str, xlabel: str, ylabel: str, yticks) -> list[str]:
    """The SVG's opening lines: background, title, grid, labels and the goal line. `y`
    maps a throughput fraction to the page; `yticks` is (value, label) pairs."""
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
    ]
    for i in range(0, 13, 2):
        v = i / 10
        out.append(f'<line x1="{x(v)}" y1="{TOP}" x2="{x(v)}" y2="{TOP + PH}" stroke="#eee"/>')
        out.append(f'<text x="{x(v)}" y="{TOP + PH + 16}" text-anchor="middle">{v:.1f}</text>')
    for v, label in yticks:
        out.append(f'<line x1="{LEFT}" y1="{y(v)}" x2="{LEFT + PW}" y2="{y(v)}" stroke="#eee"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y(v) + 4}" text-anchor="end">{label}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{PW}" height="{PH}" fill="none" stroke="#333"/>')
    out.append(
        f'<text x="{LEFT + PW / 2}" y="{HEIGHT - 20}" text-anchor="middle">{xlabel}</text>'
    )
    out.append(
        f'<text transform="translate(18,{TOP + PH / 2}) rotate(-90)" text-anchor="middle">'
        f"{ylabel}</text>"
    )
    out.append(
        f'<line x1="{LEFT}" y1="{y(0.9)}" x2="{LEFT + PW}" y2="{y(0.9)}" stroke="#555" '
        'stroke-dasharray="6,4"/>'
    )
    out.append(f'<text x="{LEFT + 6}" y="{y(0.9) - 5}" fill="#555">goal at 1/3: 90%</text>')
    return out
