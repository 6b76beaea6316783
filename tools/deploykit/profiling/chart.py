"""The SVG bar chart of a profile: one bar per operator, largest first, with its share."""

from __future__ import annotations

from html import escape
from pathlib import Path

from deploykit.readers.trace import Profile
from deploykit.util.fsutil import write_atomic

_KERNEL_COLOURS = {"portable": "#4e79a7", "cortex_m": "#f28e2b", "delegate": "#59a14f"}


def profile_svg(profile: Profile, title: str) -> str:
    bar_h, gap, label_w, bar_w, top = 18, 6, 330, 420, 40
    rows = profile.rows
    height = top + len(rows) * (bar_h + gap) + 30
    width = label_w + bar_w + 200
    largest = max((r.ticks for r in rows), default=1.0) or 1.0
    total = profile.total_ticks or 1.0
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="monospace" font-size="12">',
        f'<text x="10" y="20" font-size="14">{escape(title)}</text>',
    ]
    for i, r in enumerate(rows):
        y = top + i * (bar_h + gap)
        w = max(1.0, bar_w * r.ticks / largest)
        colour = _KERNEL_COLOURS.get(r.kernel, "#9c9c9c")
        out.append(
            f'<text x="{label_w - 8}" y="{y + 13}" text-anchor="end">'
            f"{escape(r.operator)} ({escape(r.kernel)})</text>"
        )
        out.append(
            f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h}" '
            f'fill="{colour}"><title>{escape(r.operator)}: '
            f"{profile.value(r.ticks):,.0f} {profile.unit}</title></rect>"
        )
        out.append(
            f'<text x="{label_w + w + 6:.1f}" y="{y + 13}">'
            f"{profile.value(r.ticks):,.0f} {profile.unit} "
            f"({100 * r.ticks / total:.1f}%)</text>"
        )
    y = top + len(rows) * (bar_h + gap) + 18
    out.append(
        f'<text x="10" y="{y}">execute() total: {profile.value(profile.total_ticks):,.0f} '
        f"{profile.unit} over {profile.iterations} run(s)</text>"
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_svg(profile: Profile, title: str, path: Path) -> Path:
    write_atomic(path, profile_svg(profile, title))
    return path
