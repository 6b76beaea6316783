"""The chains behind `deploykit export/plan/build/run`: stage after stage, typed in and out.

Output layout under `out` (default build/<board>/<model>):
    export/     model.pte, ops.yaml, reference.npz, export.json   (export stage)
    plan.json                                                    (plan stage)
    generated/  board and model files (docs/generated-files.md)  (render stage)
    firmware/   CMake build of firmware/ with DK_FIRMWARE=runner (build stage)
    run/        console.bin, qemu.log, result.json               (run + validate)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import numpy as np

from .boards import Board, repo_root
from .errors import BuildError, ConfigError, DeployKitError, EnvironmentProblem, ExitCode
from .export import ExportResult, load_export, memory_order_bytes
from .export import export as export_model
from .firmware_build import PICO_FAMILY, PICO_PROJECTS, Firmware, build_image
from .fsutil import write_atomic
from .input_sets import load_input_sets
from .inspect_pte import ProgramInfo, inspect_pte
from .jsonable import to_jsonable
from .models import load_model, resolve_model_path
from .npu import npu_config
from .plan import MemoryPlan, plan_memory
from .protocol import RunRecords
from .render import ModelSources, render_board_files, render_model_files
from .runners import runner_for_board
from .sources import check_executorch_commit, load_workspace, read_manifest, require_projects
from .validate import Tolerance, Verdict, compare_sets

Progress = Callable[[str], None]


def _export_key(model_path: Path, flow: str, cpu: str, npu: dict | None = None,
                inputs_digest: str = "") -> str:
    """Everything an export depends on: the model file and the Python files beside it (a model
    may import its neighbours, as mobilenet_v2_lrn imports mobilenet_v2), flow, CPU, NPU
    settings (Vela target, system config, memory mode), exporter and versions."""
    h = hashlib.sha256()
    neighbours = sorted(model_path.parent.glob("*.py"))
    for part in (model_path.read_bytes(), *(p.read_bytes() for p in neighbours),
                 flow.encode(), cpu.encode(), inputs_digest.encode(),
                 json.dumps(npu, sort_keys=True).encode(),
                 *((Path(__file__).parent / m).read_bytes() for m in ("export.py", "models.py")),
                 metadata.version("torch").encode(), metadata.version("executorch").encode()):
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


@contextlib.contextmanager
def _native_output_to(log: Path) -> Iterator[None]:
    """Send what native libraries print on fd 1/2 (torch, torchao, cpuinfo) to a log file."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with log.open("wb") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def export_stage(board: Board, model: str, flow: str, out: Path,
                 progress: Progress, *, inputs_dir: Path | None = None) -> ExportResult:
    """Export, or reuse a finished export whose inputs (export-key) are unchanged.

    With `inputs_dir`, the host reference is also computed for every sample there
    (input_sets.py), and the firmware runs them all.
    """
    _name, model_path = resolve_model_path(model, repo_root())
    export_dir = out / "export"
    npu = npu_config(board)
    npu_settings = npu.export_settings() if npu is not None and flow == "ethos_u_int8" else None
    spec = input_sets = None
    if inputs_dir is not None:
        spec = load_model(model, repo_root())
        input_sets = load_input_sets(inputs_dir, spec.example_inputs)
    key = _export_key(model_path, flow, board.cpu["core"], npu_settings,
                      input_sets.digest if input_sets else "")
    key_file = export_dir / "export-key"
    if key_file.exists() and key_file.read_text() == key:
        cached = load_export(export_dir)
        if cached is not None:
            progress(f"export of {cached.model_name} is up to date ({export_dir})")
            return cached
    key_file.unlink(missing_ok=True)
    target = f"{npu_settings['target']} ({npu_settings['memory_mode']})" if npu_settings \
        else board.cpu["core"]
    progress(f"exporting {model} with the {flow} flow for {target} "
             f"(native library output: {export_dir / 'export-native.log'})")
    with _native_output_to(export_dir / "export-native.log"):
        spec = spec or load_model(model, repo_root())
        result = export_model(spec, flow, export_dir, cpu=board.cpu["core"], npu=npu_settings,
                              input_sets=list(input_sets.samples) if input_sets else None)
    if input_sets is not None:
        write_atomic(export_dir / "labels.json", json.dumps(
            {"names": list(input_sets.names), "labels": list(input_sets.labels)}) + "\n")
    write_atomic(key_file, key)
    return result


def describe_export(result: ExportResult) -> str:
    lines = [f"{result.pte_path}: {result.pte_size:,} B, {result.flow}, "
             f"exported in {result.export_seconds:.1f} s",
             f"  operators: {', '.join(result.op_list)}",
             f"  reference: {result.reference_kind}; eager max abs diff "
             f"{result.eager_max_abs_diff:.3g}"]
    lines += [f"  warning: {w}" for w in result.warnings]
    return "\n".join(lines)


@dataclass(frozen=True)
class PlannedModel:
    export: ExportResult
    program: ProgramInfo
    plan: MemoryPlan


def plan_stage(board: Board, model: str, flow: str, out: Path,
               progress: Progress) -> MemoryPlan:
    return _export_and_plan(board, model, flow, out, progress).plan


def _export_and_plan(board: Board, model: str, flow: str, out: Path,
                     progress: Progress, inputs_dir: Path | None = None) -> PlannedModel:
    exported = export_stage(board, model, flow, out, progress, inputs_dir=inputs_dir)
    program = inspect_pte(exported.pte_path)
    plan = plan_memory(board, program)
    write_atomic(out / "plan.json", json.dumps(_plan_json(plan), indent=2) + "\n")
    return PlannedModel(exported, program, plan)


def _plan_json(plan: MemoryPlan) -> dict:
    return {"board": plan.board, "fits": plan.fits, "method_pool": plan.method_pool,
            "temp_pool": plan.temp_pool, "planned_buffers": list(plan.planned_buffers),
            "items": [vars(i) for i in plan.items],
            "regions": [{**vars(r), "headroom": r.headroom} for r in plan.regions]}


@dataclass(frozen=True)
class BuiltModel:
    planned: PlannedModel
    firmware: Firmware

    def summary(self) -> str:
        p = self.planned
        return (f"{describe_export(p.export)}\nmemory plan:\n{p.plan.table()}\n"
                f"{self.firmware.summary()}")


def build_firmware(board: Board, model: str, flow: str, out: Path, workspace: Path | None,
                   progress: Progress, *, inputs_dir: Path | None = None) -> BuiltModel:
    ws = load_workspace(workspace)  # before the slow export: fail fast without sources
    et_commit = check_executorch_commit(ws)
    if board.family == PICO_FAMILY:
        require_projects(ws, PICO_PROJECTS, f"The {board.name} firmware")
    planned = _export_and_plan(board, model, flow, out, progress, inputs_dir)
    if flow == "ethos_u_int8":
        progress(f"memory plan (fits):\n{planned.plan.table(items=True)}")
        _require_ethos_u_sources(board, ws, out)
    exported = planned.export
    generated = out / "generated"
    render_board_files(board, generated)
    input_sets = [[np.frombuffer(memory_order_bytes(a, order), dtype=a.dtype).reshape(a.shape)
                   for a, order in zip(arrays, exported.input_dim_orders, strict=True)]
                  for arrays in exported.input_sets]
    render_model_files(ModelSources(
        pte=exported.pte_path.read_bytes(), input_sets=input_sets,
        expected_outputs=exported.reference_sets[0], plan=planned.plan, et_commit=et_commit,
        build_info=f"flow={flow} cpu={board.cpu['core']}"), generated)
    progress("building the firmware (the ExecuTorch runtime is cached per board and options)")
    definitions = {
        "EXECUTORCH_SOURCE_DIR": str(ws.executorch_dir),
        "DK_CMSIS_NN_DIR": str(ws.path_of("cmsis-nn")),
        "DK_OPS_YAML": str(exported.ops_yaml_path.resolve()),
        # Runtime builds are keyed by sources, CPU flags and options, so every board and model
        # with the same key shares one, wherever its output directory is.
        "DK_ET_RUNTIME_CACHE_DIR": str(ws.root / "runtime-cache"),
    }
    if board.family == PICO_FAMILY:
        # Through the pico-sdk project (firmware/pico/), which takes the SDK (and picotool,
        # when built) from this workspace.
        definitions["DK_WORKSPACE"] = str(ws.root)
    firmware = build_image(board, generated, out / "firmware", "runner", definitions,
                           progress=progress)
    return BuiltModel(planned, firmware)


ETHOS_U_DRIVER = "ethos-u-core-driver"


def _require_ethos_u_sources(board: Board, ws, out: Path) -> None:
    """Stop an NPU firmware build, after export and plan, where it cannot go on."""
    npu = npu_config(board)
    what = f"{npu.target} NPU of {board.name}" if npu else board.name
    if not ws.has(ETHOS_U_DRIVER):
        pin = next(p for p in read_manifest() if p.name == ETHOS_U_DRIVER)
        raise EnvironmentProblem(
            f"Ethos-U core driver sources not available: add {ETHOS_U_DRIVER} to the workspace "
            f"at {ws.root} to build firmware for the {what} (ExecuTorch's EthosUBackend "
            f"links it). The export and memory plan are done: {out / 'export'}, "
            f"{out / 'plan.json'}.",
            f"`deploykit setup --group ethos-u` fetches it (pinned in west.yml: {pin.url} "
            f"at {pin.revision}, the release ExecuTorch v1.4.1 uses). Without access to Arm's "
            f"GitLab, give a local clone: deploykit setup --source "
            f"{ETHOS_U_DRIVER}=PATH@{pin.revision}. CPU-only firmware for this board needs "
            "no driver: --flow cortex_m_int8.")
    raise BuildError(
        f"The workspace has {ETHOS_U_DRIVER}, but deploykit's runner firmware does not yet "
        f"initialise the NPU (base 0x{npu.base:08X}, IRQ {npu.irq}) nor link the "
        "EthosUBackend." if npu else "No NPU section on this board.",
        "Build with --flow cortex_m_int8 for a CPU-only image meanwhile; the export and plan "
        f"in {out} are complete.")


@dataclass
class RunReport:
    board: str
    model: str
    flow: str
    passed: bool
    exit_code: ExitCode
    verdict: Verdict | None
    reference_kind: str
    ticks: int | None = None
    tick_hz: int | None = None
    instructions_estimate: float | None = None
    memory: dict[str, tuple[int, int]] = field(default_factory=dict)
    elf: Path | None = None
    flash_bytes: int = 0
    cause: str = ""
    log: Path | None = None
    device_outputs: list[list[float]] = field(default_factory=list)
    input_sets: SetStatistics | None = None
    # Every decoded record of the run (for the HIL plugin); not part of the JSON report.
    records: RunRecords | None = field(default=None, repr=False, metadata={"json": False})

    def summary(self) -> str:
        lines = [f"{self.model} ({self.flow}) on {self.board}: "
                 f"{'PASS' if self.passed else 'FAIL'}" + (f": {self.cause}" if self.cause
                                                            else "")]
        if self.verdict:
            for o in self.verdict.outputs:
                lines.append(
                    f"  output {o.index} {list(o.shape)}: max abs err {o.max_abs_error:.3g}, "
                    f"mean {o.mean_abs_error:.3g}, cosine {o.cosine_similarity:.6f}"
                    + (f", top-1 {'agrees' if o.top1_agrees else 'DIFFERS'}"
                       if o.top1_agrees is not None else "")
                    + f" (atol {o.tolerance.atol:.3g}) {'ok' if o.passed else 'MISMATCH'}"
                    + (f": {o.problem}" if o.problem else ""))
            lines.append(f"  reference: {self.reference_kind}")
        if self.input_sets and self.input_sets.count > 1:
            lines.append(f"  {self.input_sets.describe()}")
        for i, values in enumerate(self.device_outputs):
            shown = ", ".join(f"{v:.5g}" for v in values[:10])
            lines.append(f"  device output {i}: [{shown}{', ...' if len(values) > 10 else ''}]")
        if self.ticks is not None:
            per = self.input_sets.count if self.input_sets else 1
            lines.append(f"  execute: {self.ticks:,} ticks at {self.tick_hz:,} Hz"
                         + (f" for {per} inferences" if per > 1 else "")
                         + (f" = ~{self.instructions_estimate:,.0f} instructions per inference "
                            "(QEMU icount)"
                            if self.instructions_estimate else ""))
        for name, (used, cap) in sorted(self.memory.items()):
            lines.append(f"  {name:<14} peak {used:>9,} B of {cap:>9,} B")
        if self.elf:
            lines.append(f"  firmware {self.elf} ({self.flash_bytes:,} B flash)")
        return "\n".join(lines)


def run_firmware(board: Board, model: str, flow: str, out: Path, workspace: Path | None,
                 timeout: float, progress: Progress,
                 runner_options: dict | None = None, *,
                 inputs_dir: Path | None = None) -> RunReport:
    built = build_firmware(board, model, flow, out, workspace, progress, inputs_dir=inputs_dir)
    exported = built.planned.export
    runner = runner_for_board(board, **_runner_options(board, runner_options, workspace,
                                                       progress))
    progress(f"running on {runner.kind} ({board.runner.get('machine', board.name)})")
    result = runner.run(built.firmware.elf, out, timeout_s=timeout, check=False)
    outcome = result.outcome()
    records = result.records
    # Output i of input set k arrives as tensor k * outputs + i (docs/protocol.md).
    n_out = len(exported.output_dim_orders)
    device_sets = []
    for k in range(len(exported.input_sets)):
        device = []
        for i, order in enumerate(exported.output_dim_orders):
            t = records.tensors.get(k * n_out + i)
            device.append(None if t is None else _logical(t.data, order))
        device_sets.append(device)
    verdict = compare_sets(device_sets, exported.reference_sets, Tolerance(**exported.tolerance))
    device = device_sets[0]
    sets = _set_statistics(device_sets, exported.reference_sets, out / "export" / "labels.json")
    if not outcome.ok:
        exit_code, cause = outcome.exit_code, outcome.cause
    elif not verdict.passed:
        exit_code, cause = ExitCode.MISMATCH, "device outputs differ from the host's"
    else:
        exit_code, cause = ExitCode.OK, ""
    timing = records.timing
    report = RunReport(
        board=board.name, model=exported.model_name, flow=flow, passed=exit_code == ExitCode.OK,
        exit_code=exit_code, verdict=verdict, reference_kind=exported.reference_kind,
        ticks=timing.ticks if timing else None, tick_hz=timing.tick_hz if timing else None,
        instructions_estimate=result.instructions_per_iteration_estimate,
        input_sets=sets,
        memory=dict(records.memory.entries) if records.memory else {},
        elf=built.firmware.elf, flash_bytes=built.firmware.sizes.flash_total, cause=cause,
        log=result.console_log,
        device_outputs=[d.ravel().tolist() if d is not None else [] for d in device],
        records=records)
    write_atomic(out / "run" / "result.json", json.dumps(_report_json(report), indent=2) + "\n")
    return report


def _runner_options(board: Board, options: dict | None, workspace: Path | None,
                    progress: Progress) -> dict:
    """--port/--probe (and the workspace, to build picotool from) for runners of physical
    boards; simulators take none."""
    from .runners import RUNNERS

    opts = {k: v for k, v in (options or {}).items() if v is not None}
    if getattr(RUNNERS.get(board.runner.get("kind")), "needs_board", False):
        opts.setdefault("progress", progress)
        with contextlib.suppress(DeployKitError):
            opts.setdefault("workspace", load_workspace(workspace))
    elif opts:
        raise ConfigError(f"--port/--probe select a physical board; {board.name} runs on "
                          f"{board.runner.get('kind')}.", "Leave them out for this board.")
    return opts


@dataclass(frozen=True)
class SetStatistics:
    """Aggregates over the input sets of one run (`deploykit run --inputs DIR`)."""

    count: int
    top1_agreement: float | None  # fraction of sets whose device top-1 equals the host's
    accuracy_device: float | None  # device top-1 vs labels.json, when labels were given
    accuracy_host: float | None
    labelled: int = 0

    def describe(self) -> str:
        parts = [f"{self.count} input sets"]
        if self.top1_agreement is not None:
            parts.append(f"device/host top-1 agreement {self.top1_agreement:.1%}")
        if self.accuracy_device is not None:
            parts.append(f"accuracy on {self.labelled} labels: device "
                         f"{self.accuracy_device:.1%}, host {self.accuracy_host:.1%}")
        return ", ".join(parts)


def _set_statistics(device_sets: list[list[np.ndarray | None]],
                    host_sets: list[list[np.ndarray]], labels_file: Path) -> SetStatistics:
    """Top-1 agreement and label accuracy on output 0, for classifier-shaped outputs."""
    pairs = [(d[0], h[0]) for d, h in zip(device_sets, host_sets, strict=True)
             if d and d[0] is not None and h[0].ndim >= 1 and h[0].shape[-1] > 1]
    if not pairs:
        return SetStatistics(len(device_sets), None, None, None)
    device_top = [int(np.asarray(d).reshape(-1, d.shape[-1])[0].argmax()) for d, _ in pairs]
    host_top = [int(np.asarray(h).reshape(-1, h.shape[-1])[0].argmax()) for _, h in pairs]
    agree = sum(a == b for a, b in zip(device_top, host_top, strict=True)) / len(pairs)
    labels: list[int | None] = []
    if labels_file.exists():
        labels = json.loads(labels_file.read_text())["labels"]
    known = [(i, lab) for i, lab in enumerate(labels) if lab is not None and i < len(pairs)]
    if not known:
        return SetStatistics(len(device_sets), agree, None, None)
    acc_dev = sum(device_top[i] == lab for i, lab in known) / len(known)
    acc_host = sum(host_top[i] == lab for i, lab in known) / len(known)
    return SetStatistics(len(device_sets), agree, acc_dev, acc_host, len(known))


def _logical(data: np.ndarray, dim_order: list[int]) -> np.ndarray:
    """Device bytes are in the tensor's memory order; bring them back to logical order."""
    if list(dim_order) == sorted(dim_order):
        return data
    physical_shape = [data.shape[d] for d in dim_order]
    return data.reshape(physical_shape).transpose(np.argsort(dim_order))


def _report_json(report: RunReport) -> dict:
    return to_jsonable(report)

