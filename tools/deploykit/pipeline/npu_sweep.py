"""`deploykit npu-sweep`: Vela's estimate of one model over the Ethos-U configurations a board
could have (MAC count x memory mode x system configuration), to choose an NPU before buying it.

The TOSA graph a delegate hands to Vela depends on the NPU family only (EthosUCompileSpec's
TOSA specification is per family, U55 or U85), so the model is exported once, for the board's
own configuration, through the export cache, and each point of the sweep is one Vela compile of
the delegates' TOSA graphs (`delegate_<i>.tosa` beside the .pte, flows/vela.py). Per point:
Vela's cycles, the latency at the NPU clock of the point's system configuration, MAC
utilisation, SRAM and DRAM traffic per inference, the Vela scratch (the tensor arena) and the
fast scratch of the memory mode, and the memory plan of `deploykit plan` for the board with the
point's MACs and memory mode (memory/plan.py): does it fit the board's memory regions, and how
much of the SRAM behind the NPU's AXI0 port does it take. The Pareto front is taken over the
points that fit: no other fitting point is as fast with as little SRAM.

The plan of a point is made from the exported program with each delegate's blob, scratch and
Vela target swapped for the point's (the program's size changes by the blobs' difference);
everything else of the program is the same at every point.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploykit.util import charts
from deploykit.util.errors import ConfigError, DeployKitError, MemoryPlanError
from deploykit.util.fsutil import write_atomic

if TYPE_CHECKING:
    from deploykit.program.inspect import ProgramInfo
    from deploykit.readers.boards import Board
    from deploykit.readers.npu import NpuConfig

Progress = Callable[[str], None]


@dataclass(frozen=True)
class SweepPoint:
    npu_type: str
    macs: int
    memory_mode: str
    system_config: str

    @property
    def target(self) -> str:
        return f"{self.npu_type}-{self.macs}"

    @property
    def name(self) -> str:
        return f"{self.target} {self.memory_mode} {self.system_config}"


@dataclass
class SweepRow:
    target: str
    macs: int
    memory_mode: str
    system_config: str
    result: str = ""  # "fits", "does not fit", or the failure class of Vela's compile
    reason: str = ""  # why it does not fit or did not compile
    cycles: int | None = None  # Vela's total cycles, all delegates
    npu_cycles: int | None = None  # of them, the NPU array's
    clock_mhz: float | None = None  # the NPU clock of the system configuration
    latency_ms: float | None = None  # cycles at that clock
    network_macs: int | None = None
    mac_utilisation: float | None = None
    sram_mb: float | None = None  # traffic per inference
    dram_mb: float | None = None
    flash_mb: float | None = None  # on- and off-chip flash (a system with flash on AXI1)
    arena: int | None = None  # Vela scratch (tensor arena): the largest delegate's, bytes
    fast_scratch: int | None = None  # the memory mode's SRAM cache of the arena, bytes
    sram_needed: int | None = None  # bytes the plan puts in the SRAM region behind AXI0
    sram_region: str = ""
    sram_capacity: int | None = None
    pareto: bool = False
    chosen: bool = False
    vela_seconds: float | None = None  # wall time of Vela's compiles for this point
    regions: dict[str, list[int]] = field(default_factory=dict)  # region -> [used, capacity]

    @property
    def name(self) -> str:
        return f"{self.target} {self.memory_mode} {self.system_config}"


@dataclass
class SweepResult:
    board: str
    model: str
    rows: list[SweepRow]
    chosen: SweepRow | None
    why_chosen: str
    build_command: str | None
    latency_target_ms: float | None
    export_dir: Path
    files: dict[str, Path] = field(default_factory=dict)


def sweep_points(npu: NpuConfig, macs: list[int] | None = None,
                 memory_modes: list[str] | None = None,
                 system_configs: list[str] | None = None) -> list[SweepPoint]:
    """Every MAC configuration of the board's NPU family x memory mode x system configuration
    of the board file, narrowed by the lists given; a value outside them is a ConfigError."""
    from deploykit.readers.npu import NPU_MACS, check_macs

    chosen_macs = list(NPU_MACS[npu.type]) if not macs else [
        check_macs(npu.type, int(m), "--macs") for m in macs]
    modes = list(npu.memory_modes) if not memory_modes else list(memory_modes)
    for mode in modes:
        if mode not in npu.memory_modes:
            raise ConfigError(
                f"--memory-modes: {mode} is not one of the board's memory modes.",
                f"This board allows: {', '.join(npu.memory_modes)} (npu.vela.memory_modes in "
                "its board file).")
    configs = list(npu.system_configs or (npu.system_config,)) if not system_configs \
        else list(system_configs)
    for config in configs:
        if config not in (npu.system_configs or (npu.system_config,)):
            raise ConfigError(
                f"--system-configs: {config} is not one of the board's system configurations.",
                f"This board lists: {', '.join(npu.system_configs)} (npu.vela.system_configs "
                "in its board file).")
    return [SweepPoint(npu.type, m, mode, config)
            for m in dict.fromkeys(chosen_macs) for mode in dict.fromkeys(modes)
            for config in dict.fromkeys(configs)]


def compile_point(point: SweepPoint, tosa_files: list[Path],
                  model_lines: list[dict[str, str]]) -> tuple[list[dict[str, Any]], str]:
    """Vela on each delegate's TOSA graph for `point`: per delegate {summary, layers,
    scratch_size, blob_size, seconds}; and "" or the error that stopped it."""
    from deploykit.flows.vela import run_vela
    from deploykit.program.inspect import parse_vela_stream

    out = []
    try:
        for tosa, lines in zip(tosa_files, model_lines, strict=True):
            run = run_vela(tosa.read_bytes(), point.target, point.system_config,
                           point.memory_mode, lines)
            stream = parse_vela_stream(run.binary)
            out.append({"summary": run.summary, "layers": run.layers,
                        "scratch_size": (stream.scratch_size or 0) if stream else 0,
                        "blob_size": len(run.binary), "seconds": run.seconds})
    except DeployKitError as exc:
        return out, f"{exc.exit_code.name}: {str(exc).splitlines()[0]}"
    return out, ""


def _compile_all(points: list[SweepPoint], tosa_files: list[Path],
                 model_lines: list[dict[str, str]], jobs: int, progress: Progress
                 ) -> list[tuple[list[dict[str, Any]], str]]:
    if jobs <= 1:
        results = []
        for point in points:
            results.append(compile_point(point, tosa_files, model_lines))
            progress(f"Vela: {point.name}")
        return results
    # Vela is single-threaded and prints to stdout: one process per worker.
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(compile_point, p, tosa_files, model_lines) for p in points]
        results = []
        for point, future in zip(points, futures, strict=True):
            results.append(future.result())
            progress(f"Vela: {point.name}")
    return results


def point_program(info: ProgramInfo, point: SweepPoint,
                  compiled: list[dict[str, Any]]) -> ProgramInfo:
    """The exported program as it would be for `point`: each Ethos-U delegate with the point's
    Vela target, memory mode, scratch and blob size."""
    npu_delegates = [d for d in info.delegates if d.vela is not None]
    by_index = {d.index: c for d, c in zip(npu_delegates, compiled, strict=True)}
    delegates = []
    growth = 0
    for d in info.delegates:
        c = by_index.get(d.index)
        if c is None or d.vela is None:
            delegates.append(d)
            continue
        growth += c["blob_size"] - d.size
        delegates.append(dataclasses.replace(
            d, target=point.target, memory_mode=point.memory_mode,
            system_config=point.system_config, size=c["blob_size"],
            vela=dataclasses.replace(d.vela, scratch_size=c["scratch_size"])))
    return dataclasses.replace(info, delegates=tuple(delegates), size=info.size + growth)


def evaluate(board: Board, info: ProgramInfo, point: SweepPoint,
             compiled: list[dict[str, Any]], error: str) -> SweepRow:
    """One row: Vela's figures summed over the delegates, and the plan check."""
    from deploykit.memory.plan import plan_memory
    from deploykit.readers.npu import memory_mode_layout, with_npu_overrides

    row = SweepRow(point.target, point.macs, point.memory_mode, point.system_config)
    if error:
        row.result, row.reason = error.split(":", 1)[0], error.split(":", 1)[-1].strip()
        return row
    summaries = [c["summary"] for c in compiled]
    if not summaries or any(not isinstance(s.get("total_cycles"), int) for s in summaries):
        row.result, row.reason = "EXPORT", "Vela printed no cycle estimate"
        return row
    row.vela_seconds = round(sum(c["seconds"] for c in compiled), 3)
    row.cycles = sum(s["total_cycles"] for s in summaries)
    row.npu_cycles = sum(int(s.get("npu_cycles", 0)) for s in summaries)
    row.network_macs = sum(int(s.get("network_macs", 0)) for s in summaries)
    row.clock_mhz = float(summaries[0].get("clock_mhz") or 0) or None
    row.latency_ms = row.cycles / (row.clock_mhz * 1e3) if row.clock_mhz else None
    row.mac_utilisation = row.network_macs / (row.cycles * point.macs) if row.cycles else 0.0
    row.sram_mb = round(sum(float(s.get("sram_mb", 0)) for s in summaries), 4)
    row.dram_mb = round(sum(float(s.get("dram_mb", 0)) for s in summaries), 4)
    row.flash_mb = round(sum(float(s.get("off_chip_flash_mb", 0))
                             + float(s.get("on_chip_flash_mb", 0)) for s in summaries), 4)
    row.arena = max(c["scratch_size"] for c in compiled)
    row.fast_scratch = memory_mode_layout(point.memory_mode).fast_scratch
    point_board = with_npu_overrides(board, point.macs, point.memory_mode)
    npu = point_board.npu
    row.sram_region = npu.sram_region if npu else ""
    try:
        plan = plan_memory(point_board, point_program(info, point, compiled))
        row.result = "fits"
    except MemoryPlanError as exc:
        plan = getattr(exc, "plan", None)
        row.result = "does not fit"
        row.reason = str(exc).splitlines()[0]
    if plan is not None:
        row.regions = {r.region: [r.used, r.capacity] for r in plan.regions}
        sram = next((r for r in plan.regions if r.region == row.sram_region), None)
        row.sram_needed = sram.used if sram else 0
        capacity = next((r.size for r in point_board.memory if r.name == row.sram_region), None)
        row.sram_capacity = capacity
    return row


def mark_pareto(rows: list[SweepRow]) -> None:
    """Mark the fitting rows that no other fitting row beats on both latency and SRAM."""
    fitting = [r for r in rows if r.result == "fits" and r.latency_ms is not None]
    for r in fitting:
        r.pareto = not any(
            o is not r and o.latency_ms <= r.latency_ms and (o.sram_needed or 0)
            <= (r.sram_needed or 0) and (o.latency_ms < r.latency_ms
                                         or (o.sram_needed or 0) < (r.sram_needed or 0))
            for o in fitting)


def choose(rows: list[SweepRow], latency_target_ms: float | None,
           default: SweepPoint) -> tuple[SweepRow | None, str]:
    """The point to build: with a latency target, the fitting point that meets it with the
    least SRAM (then the fewest MACs: the smaller NPU); without, the fastest fitting point
    (then the least SRAM). Ties go to the board's own configuration."""
    fitting = [r for r in rows if r.result == "fits" and r.latency_ms is not None]
    if not fitting:
        return None, "no point fits the board's memory: " + (
            "; ".join(sorted({f'{r.name}: {r.reason}' for r in rows if r.reason})[:3])
            or "no point compiled")

    def is_default(r: SweepRow) -> int:
        return 0 if (r.macs, r.memory_mode, r.system_config) == (
            default.macs, default.memory_mode, default.system_config) else 1

    if latency_target_ms is not None:
        meeting = [r for r in fitting if r.latency_ms <= latency_target_ms]
        if not meeting:
            fastest = min(fitting, key=lambda r: r.latency_ms)
            return None, (f"no fitting point meets {latency_target_ms:g} ms; the fastest is "
                          f"{fastest.name} at {fastest.latency_ms:.3f} ms")
        best = min(meeting, key=lambda r: (r.sram_needed or 0, r.macs, is_default(r)))
        return best, (f"meets {latency_target_ms:g} ms with the least SRAM "
                      f"({_kib(best.sram_needed)} KiB in {best.sram_region})")
    best = min(fitting, key=lambda r: (r.latency_ms, r.sram_needed or 0, is_default(r)))
    return best, "the fastest point that fits"


def build_command(board: Board, model: str, row: SweepRow) -> str:
    """The `deploykit build` command of a point; a system configuration other than the board's
    is the board file's to say (npu.vela.system_config), so it is named beside the command."""
    npu = board.npu
    cmd = f"deploykit build --board {board.name} --model {model}"
    if npu is None or row.macs != npu.macs:
        cmd += f" --npu-macs {row.macs}"
    if npu is None or row.memory_mode != npu.memory_mode:
        cmd += f" --npu-memory-mode {row.memory_mode}"
    if npu is not None and row.system_config != npu.system_config:
        cmd += (f"   # with npu.vela.system_config: {row.system_config} in a copy of the "
                f"board file (this one says {npu.system_config})")
    return cmd


def run_sweep(board: Board, model: str, pte: Path, points: list[SweepPoint], jobs: int,
              latency_target_ms: float | None, progress: Progress) -> SweepResult:
    """Vela at every point for the export beside `pte`, with the plan check of each."""
    from deploykit.flows.base import DELEGATE_TOSA_NAME
    from deploykit.program.inspect import inspect_pte

    info = inspect_pte(pte)
    npu_delegates = [d for d in info.delegates if d.vela is not None]
    if not npu_delegates:
        raise ConfigError(f"The export of {model} for {board.name} has no Ethos-U delegate.",
                          "The sweep is of the NPU: use a model the EthosUPartitioner takes.")
    tosa_files = [pte.parent / DELEGATE_TOSA_NAME.format(index=d.index) for d in npu_delegates]
    missing = [p.name for p in tosa_files if not p.is_file()]
    if missing:
        raise ConfigError(f"The export has no TOSA graph for {', '.join(missing)}.",
                          "Export again (deploykit export --board ... --model ...): the "
                          "ethos_u_int8 flow keeps each delegate's TOSA beside the .pte.")
    model_lines = [{layer.name: layer.model_origin for layer in d.vela_estimate.layers
                    if layer.model_origin} if d.vela_estimate else {} for d in npu_delegates]
    progress(f"{len(points)} points, {len(npu_delegates)} delegate(s), {jobs} worker(s)")
    compiled = _compile_all(points, tosa_files, model_lines, jobs, progress)
    rows = [evaluate(board, info, p, c, err) for p, (c, err) in zip(points, compiled,
                                                                      strict=True)]
    mark_pareto(rows)
    npu = board.npu
    default = SweepPoint(npu.type, npu.macs, npu.memory_mode, npu.system_config)
    chosen, why = choose(rows, latency_target_ms, default)
    if chosen is not None:
        chosen.chosen = True
    return SweepResult(board.name, model, rows, chosen, why,
                       build_command(board, model, chosen) if chosen else None,
                       latency_target_ms, pte.parent)


# ---- output ----------------------------------------------------------------------------------

COLUMNS = ("target", "memory mode", "system config", "result", "latency ms", "MHz", "cycles",
           "MAC util", "SRAM MB/inf", "DRAM MB/inf", "flash MB/inf", "arena KiB", "fast KiB",
           "SRAM need KiB", "Pareto", "Vela s")


def _kib(n: int | None) -> str:
    return f"{n / 1024:,.1f}" if n is not None else "-"


def _cells(r: SweepRow) -> list[str]:
    def num(v: float | None, fmt: str) -> str:
        return format(v, fmt) if v is not None else "-"

    return [r.target, r.memory_mode, r.system_config, r.result,
            num(r.latency_ms, ".3f"), num(r.clock_mhz, ".0f"), num(r.cycles, ","),
            f"{r.mac_utilisation:.0%}" if r.mac_utilisation is not None else "-",
            num(r.sram_mb, ".3f"), num(r.dram_mb, ".3f"), num(r.flash_mb, ".3f"),
            _kib(r.arena),
            _kib(r.fast_scratch) if r.fast_scratch else "-",
            _kib(r.sram_needed) + (f" / {_kib(r.sram_capacity)}" if r.sram_capacity else ""),
            ("*" if r.pareto else "") + (" chosen" if r.chosen else ""),
            num(r.vela_seconds, ".2f")]


def table(result: SweepResult) -> str:
    """The terminal table, the rows that did not fit with their reason, and the choice."""
    cells = [list(COLUMNS)] + [_cells(r) for r in result.rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
             for line in cells]
    lines += [f"{r.name}: {r.result}: {r.reason}" for r in result.rows if r.reason]
    lines.append("* Pareto front of the fitting points (latency against the SRAM they need)")
    return "\n".join(lines + _choice_lines(result))


def _choice_lines(result: SweepResult) -> list[str]:
    if result.chosen is None:
        return [f"chosen: none ({result.why_chosen})"]
    r = result.chosen
    return [f"chosen: {r.name}, {r.latency_ms:.3f} ms, {_kib(r.sram_needed)} KiB of "
            f"{r.sram_region} ({result.why_chosen})",
            f"build it: {result.build_command}"]


def markdown(result: SweepResult) -> str:
    lines = [f"# NPU sweep: {result.model} on {result.board}", "",
             "Vela's estimates (a performance model, not a measurement).", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in _cells(r)) + " |"
              for r in result.rows]
    notes = [f"- {r.name}: {r.result}: {r.reason}" for r in result.rows if r.reason]
    lines += [""] + notes if notes else []
    lines += ["", *(f"{line}  " for line in _choice_lines(result))]
    return "\n".join(lines) + "\n"


def to_json(result: SweepResult) -> dict[str, Any]:
    return {"board": result.board, "model": result.model,
            "source": "Vela estimate",
            "latency_target_ms": result.latency_target_ms,
            "columns": [f.name for f in fields(SweepRow)],
            "rows": [asdict(r) for r in result.rows],
            "chosen": asdict(result.chosen) if result.chosen else None,
            "why_chosen": result.why_chosen, "build_command": result.build_command}


def chart(result: SweepResult) -> charts.Chart:
    """Two panels, one bar per point coloured by memory mode, the Pareto points hatched:
    Vela's latency (with the latency target as a line), and the SRAM each point needs (with the
    SRAM region's size as a line). A point that did not compile has its reason instead."""
    rows = result.rows

    def group(r: SweepRow, value: float | None, text: str) -> charts.Group:
        label = f"{r.target} {r.system_config}"
        bar = (charts.Bar(value, r.memory_mode, text, marked=r.pareto) if value is not None
               else charts.Bar(None, r.memory_mode, f"{r.memory_mode}: {r.result}"))
        return charts.Group(label, (bar,))

    latency = tuple(group(r, r.latency_ms, f"{r.latency_ms:.3f} ms" if r.latency_ms else "")
                    for r in rows)
    sram = tuple(group(r, r.sram_needed, f"{_kib(r.sram_needed)} KiB"
                       + ("" if r.result == "fits" else f" ({r.result})"))
                 for r in rows)
    capacity = next((r.sram_capacity for r in rows if r.sram_capacity), None)
    region = next((r.sram_region for r in rows if r.sram_region), "")
    most = max((r.sram_needed or 0 for r in rows), default=0)
    # The region's size as a line only where it is in reach of the bars (a 4 MiB line beside
    # 20 KiB bars would squash them); the panel's title says it anyway.
    goal = capacity if capacity and most * 4 >= capacity else None
    return charts.Chart(
        f"deploykit npu-sweep: {result.model} on {result.board} (Vela estimate)",
        (charts.Panel("estimated latency per inference (lower is better)",
                      "milliseconds at the system configuration's NPU clock", latency,
                      marked="Pareto front", goal=result.latency_target_ms,
                      goal_label="latency target", integers=False, empty="no point"),
         charts.Panel("SRAM the plan needs behind the NPU's AXI0 port"
                      + (f" (region {region}: {_kib(capacity)} KiB)" if capacity else ""),
                      "bytes", sram, marked="Pareto front", goal=goal,
                      goal_label="SRAM region size",
                      empty="no point")),
        tuple(_choice_lines(result)))


def write_outputs(result: SweepResult, out: Path) -> dict[str, Path]:
    """sweep.json, sweep.md and sweep.svg in `out`, each written whole."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "sweep.json", "markdown": out / "sweep.md", "svg": out / "sweep.svg"}
    write_atomic(paths["json"], json.dumps(to_json(result), indent=2) + "\n")
    write_atomic(paths["markdown"], markdown(result))
    charts.write(chart(result), paths["svg"])
    return paths
