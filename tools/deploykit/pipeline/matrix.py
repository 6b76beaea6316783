"""The board x model x flow x profile (x patches) matrix: build every combination a filter
selects, run it where the board's runner is available here, and tabulate what a user chooses a
board by.

Each row: the result (PASS, or the failure class: MEMORY when the plan does not fit, BUILD,
MISMATCH, ...; BUILT when the firmware was built but no runner is available here), the tiles
of the first layers the export made (`--patches`, flows/patches.py), flash and
RAM as linked, the RAM the run needed (static data + measured pool, stack and heap peaks),
instructions per inference (QEMU icount), MACs (inspect), instructions per MAC, the NPU
segments with Vela's cycle estimate, the CPU-fallback operators and float islands, and the
planned activation memory against its lower bound. A combination that cannot work is a row
with the reason, never a crash of the matrix.

Combinations run in worker processes (`jobs`); each process owns its torch, export and build
state. The combinations of one board, flow and profile share one runtime build, so they go to
the same worker one after the other: two workers never build the same runtime at once.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, fields
from multiprocessing import get_context
from pathlib import Path

from deploykit.util import charts
from deploykit.util.errors import ConfigError, DeployKitError
from deploykit.util.fsutil import write_atomic

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Combination:
    board: str
    model: str
    flow: str
    profile: str
    patches: str | None = None  # a --patches setting; None: the board file's own

    @property
    def name(self) -> str:
        return _name(self)


def _name(c: Combination | MatrixRow) -> str:
    return f"{c.board}/{c.model}/{c.flow}/{c.profile}" + \
        (f"/patches={c.patches}" if c.patches is not None else "")


@dataclass
class MatrixRow:
    board: str
    model: str
    flow: str
    profile: str
    patches: str | None = None  # the --patches setting given; None: the board file's own
    result: str = ""  # PASS, BUILT (no runner here), or the failure class (ExitCode name)
    reason: str = ""  # why it did not pass, or why it was not run
    flash: int | None = None  # bytes of the firmware image
    ram_linked: int | None = None  # RAM of the linked firmware (static data, pools, stack, heap)
    ram_need: int | None = None  # static data + measured peaks of the pools, stack and heap
    instructions: float | None = None  # per inference, inside execute() (QEMU icount)
    macs: int | None = None
    npu_segments: int = 0
    npu_estimate_cycles: int | None = None  # Vela's, summed over the delegates
    fallback_ops: list[str] = field(default_factory=list)
    float_islands: list[str] = field(default_factory=list)
    activation_planned: int | None = None
    activation_lower_bound: int | None = None
    # What the export tiled ("1x6 up to relu_7, carried"), "off", or why `auto` did not.
    tiles: str = ""
    seconds: float = 0.0

    @property
    def name(self) -> str:
        return _name(self)

    @property
    def instructions_per_mac(self) -> float | None:
        if self.instructions and self.macs:
            return self.instructions / self.macs
        return None


def combinations(
    boards: Iterable[str],
    models: Iterable[str],
    flows: Iterable[str] | None,
    profiles: Iterable[str],
    patches: Iterable[str | None] = (None,),
) -> list[Combination]:
    """Every board x model x flow x profile x patches setting; `flows` None means each board's
    allowed flows. A flow a board does not allow is left out for that board (not an error), and
    so is a patches setting other than off for a flow that cannot tile (the Ethos-U and XNNPACK
    flows) or a compiled model (.pte). A .pte model has one flow, its own
    (program/imported.py), on every board: where the board cannot run it, its row says why."""
    from deploykit.flows import get_flow
    from deploykit.flows.patches import OFF
    from deploykit.program.imported import is_program_file, read_program
    from deploykit.readers.boards import load_board

    settings = list(patches)

    def tiles_with(flow: str, model: str) -> list[str | None]:
        if is_program_file(model) or get_flow(flow).patches_refusal:
            return [s for s in settings if s in (None, OFF)]
        return settings

    out = []
    wanted = list(flows) if flows is not None else None
    program_flows = {m: read_program(Path(m)).flow for m in models if is_program_file(m)}
    for board in boards:
        allowed = load_board(board).export["allowed"]
        chosen = [f for f in (wanted or allowed) if f in allowed]
        for m in models:
            own = program_flows.get(m)
            for f in ([own] if own and (wanted is None or own in wanted) else
                      [] if own else chosen):
                out += [Combination(board, m, f, p, s) for p in profiles
                        for s in tiles_with(f, m)]
    if not out:
        raise ConfigError(
            "The filter selects no combination.",
            "Check --flows against each board's allowed flows (deploykit boards); --patches "
            "other than off takes the cortex_m_int8 or portable_fp32 flow.",
        )
    return out


def run_matrix(
    combos: list[Combination],
    out: Path,
    workspace: Path | None = None,
    jobs: int = 1,
    progress: Progress = lambda _m: None,
) -> list[MatrixRow]:
    """Build and run every combination under `out/<board>/<model>-<flow>-<profile>/` (with
    `-patches-<setting>` when one is given); rows in the order of `combos`."""
    groups: dict[tuple[str, str, str], list[Combination]] = {}
    for c in combos:
        groups.setdefault((c.board, c.flow, c.profile), []).append(c)
    rows: dict[Combination, MatrixRow] = {}
    # Each worker's builds share the cores: jobs x build jobs stays at the core count.
    build_jobs = str(max(1, (os.cpu_count() or 1) // max(1, jobs)))
    with ProcessPoolExecutor(
        max_workers=max(1, jobs),
        mp_context=get_context("spawn"),
        initializer=_limit_build_jobs,
        initargs=(build_jobs,),
    ) as pool:
        futures = {
            pool.submit(_run_group, group, out, workspace): key for key, group in groups.items()
        }
        progress(f"{len(combos)} combinations in {len(groups)} groups, {jobs} worker(s)")
        for future in as_completed(futures):
            for row in future.result():
                c = Combination(row.board, row.model, row.flow, row.profile, row.patches)
                rows[c] = row
                progress(
                    f"{c.name}: {row.result}"
                    + (f" ({row.reason.splitlines()[0][:100]})" if row.reason else "")
                )
    return [rows[c] for c in combos]


def _limit_build_jobs(build_jobs: str) -> None:
    os.environ.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", build_jobs)


def _run_group(group: list[Combination], out: Path, workspace: Path | None) -> list[MatrixRow]:
    return [run_one(c, out / c.board / _folder(c), workspace) for c in group]


def _folder(c: Combination) -> str:
    return f"{Path(c.model).stem}-{c.flow}-{c.profile}" + \
        (f"-patches-{c.patches}" if c.patches is not None else "")


def run_one(c: Combination, out: Path, workspace: Path | None) -> MatrixRow:
    """One combination: export and inspect, then build, then run where a runner exists."""
    from deploykit.pipeline.chains import build_firmware, export_stage, run_firmware
    from deploykit.pipeline.target import resolve_target
    from deploykit.program.imported import is_program_file
    from deploykit.program.inspect import inspect_pte
    from deploykit.readers.sizes import size_report
    from deploykit.util.errors import EnvironmentProblem

    row = MatrixRow(c.board, c.model, c.flow, c.profile, c.patches)
    start = time.monotonic()

    def quiet(_message: str) -> None:
        pass

    try:
        target = resolve_target(c.board, flow=c.flow, profile=c.profile, patches=c.patches,
                                program=Path(c.model) if is_program_file(c.model) else None)
        exported = export_stage(target, c.model, out, quiet)
        _program_facts(row, inspect_pte(exported.pte_path))
        row.tiles = _tiles(json.loads(exported.report_path.read_text()).get("patches"))
        try:
            target.runner.from_board(target.board).check_environment()
            runnable, why_not = True, ""
        except EnvironmentProblem as e:
            runnable, why_not = False, str(e).splitlines()[0]
        if runnable:
            report = run_firmware(target, c.model, out, workspace, 120.0, quiet)
            row.result = "PASS" if report.passed else report.exit_code.name
            row.reason = report.cause
            row.instructions = report.instructions_estimate
            elf = report.elf
            static = 0
            if elf is not None and elf.exists():
                sizes = size_report(elf.with_suffix(".map"), elf)
                row.flash, row.ram_linked = sizes.flash_total, sizes.ram_total
                static = sizes.static_data
            if report.memory:
                row.ram_need = static + sum(used for used, _cap in report.memory.values())
        else:
            built = build_firmware(target, c.model, out, workspace, quiet)
            sizes = built.firmware.sizes
            row.flash, row.ram_linked = sizes.flash_total, sizes.ram_total
            row.result, row.reason = "BUILT", f"not run: {why_not}"
    except DeployKitError as e:
        row.result, row.reason = e.exit_code.name, str(e)
    except Exception as e:  # a bug in one combination must not lose the other rows
        row.result, row.reason = "ERROR", f"{type(e).__name__}: {e}"
    row.seconds = round(time.monotonic() - start, 1)
    return row


def _tiles(report: dict | None) -> str:
    """The export report's `patches` (flows/patches.py, Tiler) in a few words."""
    if not report or report.get("setting", "off") == "off":
        return "off"
    if not report.get("grid"):
        return str(report.get("reason") or "left unpatched")
    overlap = str(report.get("overlap", "")).split(":")[0]
    return f"{report['grid']} up to {report['split']}" + (f", {overlap}" if overlap else "")


def _program_facts(row: MatrixRow, info) -> None:
    row.macs = info.macs
    row.fallback_ops = list(info.cpu_fallback_ops)
    row.float_islands = [i.describe() for i in info.islands if i.is_float]
    row.npu_segments = len(info.delegates)
    cycles = [d.vela_estimate.total_cycles for d in info.delegates if d.vela_estimate]
    row.npu_estimate_cycles = sum(cycles) if cycles else None
    row.activation_planned = info.planned_total
    if info.costs is not None:
        row.activation_lower_bound = info.costs.activation_lower_bound


# ---- output ----------------------------------------------------------------------------------

COLUMNS = (
    "board",
    "model",
    "flow",
    "profile",
    "patches",
    "result",
    "flash KiB",
    "RAM KiB",
    "need KiB",
    "instructions",
    "MACs",
    "instr/MAC",
    "act./bound",
    "NPU (Vela cycles)",
    "CPU fallbacks",
)


def _kib(n: int | None) -> str:
    return f"{n / 1024:.1f}" if n else "-"


def _cells(r: MatrixRow) -> list[str]:
    ipm = r.instructions_per_mac
    bound = (
        f"{r.activation_planned / r.activation_lower_bound:.2f}"
        if r.activation_planned and r.activation_lower_bound
        else "-"
    )
    npu = (
        f"{r.npu_segments} ({r.npu_estimate_cycles:,})"
        if r.npu_estimate_cycles
        else str(r.npu_segments)
        if r.npu_segments
        else "-"
    )
    fallbacks = ", ".join(r.fallback_ops) or "none"
    return [
        r.board,
        r.model,
        r.flow,
        r.profile,
        r.tiles if len(r.tiles) <= 40 else r.tiles[:39] + "…",
        r.result,
        _kib(r.flash),
        _kib(r.ram_linked),
        _kib(r.ram_need),
        f"{r.instructions:,.0f}" if r.instructions else "-",
        f"{r.macs:,}" if r.macs else "-",
        f"{ipm:.2f}" if ipm else "-",
        bound,
        npu,
        fallbacks,
    ]


def table(rows: list[MatrixRow]) -> str:
    """The terminal table, then one line per row that did not pass, with its reason."""
    cells = [list(COLUMNS)] + [_cells(r) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells
    ]
    lines += [
        f"{r.name}: {r.result}: {r.reason.splitlines()[0] if r.reason else ''}"
        for r in rows
        if r.result != "PASS"
    ]
    return "\n".join(lines)


def markdown(rows: list[MatrixRow]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in _cells(r)) + " |" for r in rows]
    notes = [
        f"- {r.name}: {r.result}: {r.reason.splitlines()[0] if r.reason else ''}"
        for r in rows
        if r.result != "PASS"
    ]
    notes += [
        f"- {r.name}: {island}"
        for r in rows
        for island in r.float_islands
    ]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def to_json(rows: list[MatrixRow]) -> dict:
    return {
        "columns": [f.name for f in fields(MatrixRow)] + ["instructions_per_mac"],
        "rows": [{**asdict(r), "instructions_per_mac": r.instructions_per_mac} for r in rows],
    }


# The fields a series of the chart is named by, in this order: those that differ between rows.
SERIES_FIELDS = ("board", "flow", "profile", "patches")


def chart(rows: list[MatrixRow]) -> charts.Chart:
    """Grouped bars per model, one bar per board, flow and profile (a series, in the legend):
    instructions per MAC, and RAM linked against the measured need. A combination that did
    not run has its result written instead of a bar. No times: the same results give the same
    file."""
    def field_text(r: MatrixRow, f: str) -> str:
        value = getattr(r, f)
        if f == "patches":
            return f"patches {value}" if value is not None else "board's patches"
        return value

    varying = [f for f in SERIES_FIELDS if len({getattr(r, f) for r in rows}) > 1]
    fixed = [field_text(rows[0], f) for f in SERIES_FIELDS
             if f not in varying and (f != "patches" or rows[0].patches is not None)] \
        if rows else []

    def series(r: MatrixRow) -> str:
        return " ".join(field_text(r, f) for f in varying) or "all"

    models = list(dict.fromkeys(r.model for r in rows))
    order = list(dict.fromkeys(series(r) for r in rows))
    by_model = {m: sorted((r for r in rows if r.model == m), key=lambda r: order.index(series(r)))
                for m in models}

    def missing(r: MatrixRow) -> charts.Bar:
        # No bar to colour: the text names the series, and why there is no value.
        why = {"": "not run", "PASS": "not measured", "BUILT": "built, not run here"}
        return charts.Bar(None, series(r), f"{series(r)}: {why.get(r.result, r.result)}")

    per_mac = tuple(charts.Group(m, tuple(
        charts.Bar(r.instructions_per_mac, series(r), f"{r.instructions_per_mac:.2f}")
        if r.instructions_per_mac else missing(r) for r in by_model[m])) for m in models)
    ram = tuple(charts.Group(m, tuple(
        charts.Bar(r.ram_linked, series(r), f"{r.ram_linked:,}"
                   + (f" (need {r.ram_need:,})" if r.ram_need else ""), inner=r.ram_need)
        if r.ram_linked else missing(r) for r in by_model[m])) for m in models)
    return charts.Chart(
        "deploykit matrix" + (f": {', '.join(fixed)}" if fixed else ""),
        (charts.Panel("instructions per MAC (lower is better)",
                      "instructions per MAC (QEMU icount, inside execute())", per_mac,
                      integers=False, empty="no combination"),
         charts.Panel("RAM: linked against the measured need", "bytes", ram,
                      outer="linked", inner="needed (static data + measured peaks)",
                      empty="no combination")))


def svg(rows: list[MatrixRow]) -> str:
    return charts.render(chart(rows))


def write_outputs(rows: list[MatrixRow], out: Path) -> dict[str, Path]:
    """matrix.json, matrix.md and matrix.svg in `out`, each written whole (temp + rename)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "matrix.json", "markdown": out / "matrix.md", "svg": out / "matrix.svg"}
    write_atomic(paths["json"], json.dumps(to_json(rows), indent=2) + "\n")
    write_atomic(paths["markdown"], markdown(rows))
    charts.write(chart(rows), paths["svg"])
    return paths
