"""The build's footprint report: flash by component, RAM blocks against their peaks.

`deploykit build` ends with this table and writes it as `<out>/footprint.json` and as a bar chart
`<out>/footprint.svg` (util/charts.py: the same footprint gives the same bytes). Flash is the image
by component (readers/sizes.py: runtime core, each kernel library, model data, runner, ...). RAM is
each reserved block (method pool, temp pool, planned buffers, stack, heap) with its size and
its peak, and the rest of the static RAM (.data/.bss) by component. Peaks come from a
measurement on the target (fit.json, or the run's memory record) or, before one exists, from
the plan's estimates (labelled so).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from deploykit.readers.sizes import SizeReport
from deploykit.util import charts
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
        return charts.render(chart(self))

    def write(self, out: Path) -> tuple[Path, Path]:
        import json

        svg, js = out / "footprint.svg", out / "footprint.json"
        charts.write(chart(self), svg)
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


# ---- chart -----------------------------------------------------------------------------------

CODE, DATA = "code", "model data and inputs"
# Flash components that are data, not code (readers/sizes.py names them).
DATA_COMPONENTS = ("model data", "model inputs")


def chart(fp: Footprint) -> charts.Chart:
    """Flash by component; RAM by block, linked size against peak; .data/.bss by component."""
    total = fp.flash_total or 1
    flash = charts.Panel(
        f"flash: {fp.flash_total:,} B", "bytes",
        tuple(charts.Group(name, (charts.Bar(
            size, DATA if name in DATA_COMPONENTS else CODE,
            f"{size:,} ({100 * size / total:.1f}%)"),)) for name, size in fp.flash),
        colours=((CODE, charts.PALETTE[0]), (DATA, charts.PALETTE[5])))
    need = fp.need
    ram_groups = []
    for b in fp.ram:
        if b.name == STATIC_LABEL:  # needed as linked: its peak is its size
            text = f"{b.size:,}"
        elif b.peak is None:
            text = f"{b.size:,} (peak not known)"
        else:
            text = f"{b.size:,} (peak {b.peak:,}" + (f", {100 * b.use:.0f}%)" if b.use is not None
                                                      else ")")
        ram_groups.append(charts.Group(b.name, (charts.Bar(b.size, "", text, inner=b.peak),)))
    ram = charts.Panel(
        f"RAM: {fp.ram_total:,} B linked"
        + (f", {need:,} B needed ({fp.ram_total / need:.2f}x)" if need else ""),
        "bytes", tuple(ram_groups), colours=(("", charts.PALETTE[0]),),
        outer="linked size", inner="peak" + (f" ({fp.peak_source})" if fp.peak_source else ""))
    panels = [flash, ram]
    if fp.static_by_component:
        panels.append(charts.Panel(
            f"{STATIC_LABEL} by component", "bytes",
            tuple(charts.Group(n, (charts.Bar(v, "", f"{v:,}"),))
                  for n, v in fp.static_by_component),
            colours=(("", charts.PALETTE[4]),)))
    return charts.Chart(fp.title, tuple(panels), fp.notes)
