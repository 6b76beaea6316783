"""The build's footprint report: flash by component, RAM blocks against their peaks.

`deploykit build` ends with this table and writes it as `<out>/footprint.json` and as a bar chart
`<out>/footprint.svg` (hand-written SVG: deterministic, no plotting library). Flash is the image
by component (readers/sizes.py: runtime core, each kernel library, model data, runner, ...). RAM is
each reserved block (method pool, temp pool, planned buffers, stack, heap) with its size and
its peak, and the rest of the static RAM (.data/.bss) by component. Peaks come from a
measurement on the target (fit.json, or the run's memory record) or, before one exists, from
the plan's estimates (labelled so).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape
from pathlib import Path

from deploykit.readers.sizes import SizeReport
from deploykit.util.fsutil import write_if_changed

# RAM block label -> the memory record's name for its peak.
BLOCKS = (("method pool", "method_pool"), ("temp pool", "temp_pool"),
          ("planned buffers", "planned_pool"), ("stack", "stack"), ("heap", "heap"))
# Ethos-U firmware: the temp pool and the Vela scratch are one block (EthosUBackend takes the
# scratch from the temp allocator), whose peak is the two peaks the runner reports; the fast
# arena is the memory mode's size, all of it the NPU's (its peak is not measurable: its size).
NPU_SCRATCH_BLOCK, NPU_SCRATCH_PEAKS = "temp pool + Ethos-U scratch", ("temp_pool", "npu_scratch")
NPU_FAST_BLOCK = "Ethos-U fast arena"
STATIC_LABEL = ".data/.bss"


@dataclass(frozen=True)
class RamBlock:
    name: str
    size: int
    peak: int | None = None  # None: not known

    @property
    def use(self) -> float | None:
        if self.peak is None or self.size == 0:
            return None
        return self.peak / self.size


@dataclass(frozen=True)
class Footprint:
    title: str
    flash: tuple[tuple[str, int], ...]
    ram: tuple[RamBlock, ...]  # the reserved blocks, then .data/.bss
    static_by_component: tuple[tuple[str, int], ...]
    peak_source: str  # "measured on the target", "estimated (no measurement yet)", ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def flash_total(self) -> int:
        return sum(v for _, v in self.flash)

    @property
    def ram_total(self) -> int:
        return sum(b.size for b in self.ram)

    @property
    def need(self) -> int | None:
        """The measured need of the reserved blocks (their peaks) plus the static data."""
        if any(b.peak is None for b in self.ram):
            return None
        return sum(b.peak or 0 for b in self.ram)

    def table(self) -> str:
        w = max([30, *(len(n) + 1 for n, _ in self.flash), *(len(b.name) + 1 for b in self.ram)])
        lines = [self.title, f"  {'flash':<{w}}{'bytes':>11}{'share':>8}"]
        total = self.flash_total or 1
        for name, size in self.flash:
            lines.append(f"  {name:<{w}}{size:>11,}{100 * size / total:>7.1f}%")
        lines.append(f"  {'total':<{w}}{self.flash_total:>11,}")
        lines.append(f"  {'RAM':<{w}}{'size':>11}{'peak':>11}{'use':>7}")
        for b in self.ram:
            peak = f"{b.peak:>11,}" if b.peak is not None else f"{'?':>11}"
            use = f"{100 * b.use:>6.0f}%" if b.use is not None else f"{'':>7}"
            lines.append(f"  {b.name:<{w}}{b.size:>11,}{peak}{use}")
        need = self.need
        lines.append(f"  {'total':<{w}}{self.ram_total:>11,}"
                     + (f"{need:>11,}  ({self.ram_total / need:.2f}x the need)" if need
                        else ""))
        if self.static_by_component:
            lines.append(f"  {STATIC_LABEL} by component: " + ", ".join(
                f"{n} {v:,}" for n, v in self.static_by_component))
        if self.peak_source:
            lines.append(f"  peaks: {self.peak_source}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"title": self.title, "flash": dict(self.flash),
                "flash_total": self.flash_total,
                "ram": [{"name": b.name, "size": b.size, "peak": b.peak} for b in self.ram],
                "ram_total": self.ram_total, "need": self.need,
                "static_by_component": dict(self.static_by_component),
                "peak_source": self.peak_source, "notes": list(self.notes)}

    def svg(self) -> str:
        return _svg(self)

    def write(self, out: Path) -> tuple[Path, Path]:
        import json

        svg, js = out / "footprint.svg", out / "footprint.json"
        write_if_changed(svg, self.svg())
        write_if_changed(js, json.dumps(self.to_json(), indent=2) + "\n")
        return svg, js


def footprint(sizes: SizeReport, title: str, peaks: dict[str, int] | None = None,
              peak_source: str = "") -> Footprint:
    """The footprint of a linked image (`sizes`), with the peaks of its RAM blocks."""
    peaks = peaks or {}
    flash = tuple(sorted(sizes.flash_by_component.items(), key=lambda kv: (-kv[1], kv[0])))
    ram_by = dict(sizes.ram_by_component)
    blocks = []
    for label, key in BLOCKS:
        size = ram_by.pop(label, 0)
        if label == "stack":
            size = size or sizes.stack
        if label == "heap":
            size = size or sizes.heap
        blocks.append(RamBlock(label, size, peaks.get(key)))
        if label == "temp pool" and NPU_SCRATCH_BLOCK in ram_by:
            if size == 0:
                blocks.pop()  # the temp pool is inside the NPU block
            both = [peaks.get(k) for k in NPU_SCRATCH_PEAKS]
            blocks.append(RamBlock(NPU_SCRATCH_BLOCK, ram_by.pop(NPU_SCRATCH_BLOCK),
                                   None if None in both else sum(both)))
            if NPU_FAST_BLOCK in ram_by:
                fast = ram_by.pop(NPU_FAST_BLOCK)
                blocks.append(RamBlock(NPU_FAST_BLOCK, fast, fast))
    if "pools" in ram_by:  # no pool symbols (an ELF without them): one block
        blocks.append(RamBlock("pools", ram_by.pop("pools")))
    static = tuple(sorted(ram_by.items(), key=lambda kv: (-kv[1], kv[0])))
    static_total = sum(v for _, v in static)
    # .data/.bss is needed as linked: its "peak" is its size.
    blocks.append(RamBlock(STATIC_LABEL, static_total, static_total))
    notes = ()
    if sizes.lto:
        notes = ("LTO build: code inlined across libraries is counted where it ended up (main "
                 "holds the runner and the kernel and runtime code inlined into it)",)
    return Footprint(title, flash, tuple(blocks), static, peak_source, notes)


# ---- SVG ------------------------------------------------------------------------------------

_W = 760
_LABEL_W = 210
_BAR_W = 400
_ROW = 20
_PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
            "#ff9da7", "#9c755f", "#bab0ac")


def _svg(fp: Footprint) -> str:
    rows: list[str] = []
    y = 30

    def text(x: float, yy: float, s: str, anchor: str = "start", weight: str = "normal",
             size: int = 12) -> str:
        return (f'<text x="{x:.1f}" y="{yy:.1f}" text-anchor="{anchor}" font-size="{size}" '
                f'font-weight="{weight}">{escape(s)}</text>')

    rows.append(text(10, 18, fp.title, weight="bold", size=14))
    # Flash: one bar per component, scaled to the largest.
    y += 6
    rows.append(text(10, y, f"Flash: {fp.flash_total:,} B", weight="bold"))
    y += 8
    biggest = max((v for _, v in fp.flash), default=1) or 1
    for i, (name, size) in enumerate(fp.flash):
        w = _BAR_W * size / biggest
        rows.append(text(10, y + 14, name))
        rows.append(f'<rect x="{_LABEL_W}" y="{y + 3}" width="{w:.1f}" height="{_ROW - 6}" '
                    f'fill="{_PALETTE[i % len(_PALETTE)]}"/>')
        rows.append(text(_LABEL_W + w + 6, y + 14, f"{size:,}"))
        y += _ROW
    # RAM: each block's size (light), its peak (dark) on top.
    y += 18
    need = fp.need
    rows.append(text(10, y, f"RAM: {fp.ram_total:,} B linked"
                     + (f", {need:,} B needed ({fp.ram_total / need:.2f}x)" if need else ""),
                     weight="bold"))
    y += 8
    biggest = max((max(b.size, b.peak or 0) for b in fp.ram), default=1) or 1
    for b in fp.ram:
        w = _BAR_W * b.size / biggest
        rows.append(text(10, y + 14, b.name))
        rows.append(f'<rect x="{_LABEL_W}" y="{y + 3}" width="{w:.1f}" height="{_ROW - 6}" '
                    f'fill="#c6dbef" stroke="#4e79a7" stroke-width="0.5"/>')
        if b.peak is not None:
            pw = _BAR_W * b.peak / biggest
            rows.append(f'<rect x="{_LABEL_W}" y="{y + 6}" width="{pw:.1f}" '
                        f'height="{_ROW - 12}" fill="#08519c"/>')
        label = f"{b.size:,}" + (f" (peak {b.peak:,})" if b.peak is not None
                                 and b.name != STATIC_LABEL else "")
        rows.append(text(_LABEL_W + max(w, _BAR_W * (b.peak or 0) / biggest) + 6, y + 14,
                         label))
        y += _ROW
    y += 10
    rows.append(f'<rect x="{_LABEL_W}" y="{y}" width="14" height="10" fill="#c6dbef" '
                f'stroke="#4e79a7" stroke-width="0.5"/>')
    rows.append(text(_LABEL_W + 20, y + 9, "linked size", size=11))
    rows.append(f'<rect x="{_LABEL_W + 110}" y="{y}" width="14" height="10" fill="#08519c"/>')
    rows.append(text(_LABEL_W + 130, y + 9, "peak" + (f": {fp.peak_source}" if fp.peak_source
                                                     else ""), size=11))
    height = y + 24
    body = "\n  ".join(rows)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" '
            f'viewBox="0 0 {_W} {height}" font-family="sans-serif">\n'
            f'  <rect width="{_W}" height="{height}" fill="white"/>\n  {body}\n</svg>\n')
