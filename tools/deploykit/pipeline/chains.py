"""The chains behind `deploykit export/plan/build/run`: stage after stage, typed in and out.

Output layout under `out` (default build/<board>/<model>):
    export/     model.pte, ops.yaml, reference.npz, export.json   (export stage)
    plan.json                                                    (plan stage)
    generated/  board and model files (docs/generated-files.md)  (render stage)
    firmware/   CMake build of firmware/ with DK_FIRMWARE=runner (build stage)
    footprint.json, footprint.svg  flash by component, RAM vs peaks (build, run)
    fit.json    measured peaks and fitted sizes, by .pte + runtime key (build --fit)
    fit/run/    the measurement run's logs                         (build --fit)
    run/        console.bin, qemu.log, result.json               (run + validate)
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import numpy as np

from deploykit.build.firmware import Firmware
from deploykit.build.render import ModelSources, render_board_files, render_model_files
from deploykit.flows.base import ExportTarget, Flow
from deploykit.flows.patches import describe as describe_patches
from deploykit.memory import fit as fitting
from deploykit.memory.plan import MemoryPlan, Sizing, plan_memory
from deploykit.pipeline.target import Target
from deploykit.program.datasets import Dataset
from deploykit.program.export import REPORT_NAME, ExportResult, load_export, memory_order_bytes
from deploykit.program.export import export as export_model
from deploykit.program.imported import (
    NO_REFERENCE,
    deterministic_inputs,
    import_key,
    import_program,
)
from deploykit.program.input_sets import InputSets, load_input_sets
from deploykit.program.inspect import ProgramInfo, inspect_pte
from deploykit.program.models import ModelSpec, load_model, resolve_model_path
from deploykit.readers.boards import Board, repo_root
from deploykit.readers.cmsis_nn_kernels import kernel_definitions
from deploykit.readers.execute_failure import LocatedFailure
from deploykit.readers.footprint import Footprint, footprint
from deploykit.readers.protocol import RunRecords
from deploykit.readers.protocol.outcome import pool_too_small
from deploykit.readers.pte_reader import in_place_definition
from deploykit.readers.sources import check_executorch_commit, load_workspace, require_projects
from deploykit.run.proxy import MeasureTarget, measure_target, measurement_dirs
from deploykit.run.report import (
    RunReport,
    as_host_dtype,
    int8_rewrite_notes,
    logical_order,
    memory_advice,
    npu_calls_of,
    report_json,
    set_statistics,
)
from deploykit.run.runners.base import RunResult
from deploykit.run.validate import Tolerance, compare_sets
from deploykit.util.errors import ConfigError, DeployKitError, ExitCode, MemoryPlanError
from deploykit.util.fsutil import write_atomic
from deploykit.util.version import deploykit_version

Progress = Callable[[str], None]


def _export_key(model_path: Path, flow: Flow, cpu: str, settings: dict | None = None,
                inputs_digest: str = "", options: str = "") -> str:
    """Everything an export depends on: the model file and the Python files beside it (a model
    may import its neighbours, as mobilenet_v2_lrn imports mobilenet_v2), the flow and its
    target settings (for the Ethos-U flow: Vela target, system config, memory mode), CPU,
    the exporter's code (the export stage, the built-in flows and the flow's own module, which
    may come from another package, the operator coverage check, the instruction sources) and
    the versions of torch, ExecuTorch and deploykit (another deploykit sharing the output
    directory exports anew)."""
    package = Path(__file__).parents[1]
    # datasets.py: a model file may take its inputs from a built-in data set (digits_cnn).
    exporter = {package / "program" / "export.py", package / "program" / "models.py",
                package / "program" / "datasets.py", package / "readers" / "pte_reader.py",
                package / "readers" / "op_coverage.py",
                package / "readers" / "execute_failure.py",
                *(package / "flows").glob("*.py"), Path(inspect.getfile(type(flow)))}
    h = hashlib.sha256()
    neighbours = sorted(model_path.parent.glob("*.py"))
    for part in (model_path.read_bytes(), *(p.read_bytes() for p in neighbours),
                 flow.name.encode(), cpu.encode(), inputs_digest.encode(), options.encode(),
                 json.dumps(settings, sort_keys=True).encode(),
                 *(p.read_bytes() for p in sorted(exporter)),
                 metadata.version("torch").encode(), metadata.version("executorch").encode(),
                 deploykit_version().encode()):
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


def _finished_export(export_dir: Path, key: str) -> ExportResult | None:
    """The export in `export_dir` when it was made for `key` and is whole; otherwise None, and
    its key is removed, so that an export interrupted from now on is never taken as done."""
    key_file = export_dir / "export-key"
    if key_file.exists() and key_file.read_text() == key:
        cached = load_export(export_dir)
        if cached is not None:
            return cached
    key_file.unlink(missing_ok=True)
    return None


def export_stage(target: Target, model: str, out: Path, progress: Progress, *,
                 inputs_dir: Path | None = None, samples: InputSets | Dataset | None = None,
                 calibration: str | None = None, spec: ModelSpec | None = None
                 ) -> ExportResult:
    """Export, or reuse a finished export whose inputs (export-key) are unchanged.

    With `inputs_dir`, the host reference is also computed for every sample there
    (program/input_sets.py), and the firmware runs them all; `samples`: the same for samples
    loaded already (a data set's split, checked against the model). `calibration`: what an
    int8 flow calibrates on (ExportOptions.calibration; default the model's calibration
    inputs). `spec`: the model, loaded already.
    """
    if target.program is not None:
        return import_stage(target, out, progress, inputs_dir=inputs_dir)
    _name, model_path = resolve_model_path(model, repo_root())
    export_dir = out / "export"
    board, flow_impl = target.board, target.flow
    settings = flow_impl.target_settings(board)
    options = target.profile.export_options()
    if calibration is not None:
        options = dataclasses.replace(options, calibration=calibration)
    input_sets = samples
    if inputs_dir is not None:
        spec = spec or load_model(model, repo_root())
        input_sets = load_input_sets(inputs_dir, spec.example_inputs)
    key = _export_key(model_path, flow_impl, board.cpu["core"], settings,
                      input_sets.digest if input_sets else "", options.key())
    key_file = export_dir / "export-key"
    cached = _finished_export(export_dir, key)
    if cached is not None:
        progress(f"export of {cached.model_name} is up to date ({export_dir})")
        return cached
    described = flow_impl.target_description(ExportTarget(board.cpu["core"], settings))
    progress(f"exporting {model} with the {flow_impl.name} flow for {described} "
             f"(native library output: {export_dir / 'export-native.log'})")
    created = not export_dir.exists()
    native_log = export_dir / "export-native.log"
    try:
        with _native_output_to(native_log):
            spec = spec or load_model(model, repo_root())
    except DeployKitError:
        # A model file that cannot be loaded leaves nothing behind (the export never began).
        native_log.unlink(missing_ok=True)
        if created:
            shutil.rmtree(export_dir, ignore_errors=True)
        raise
    with _native_output_to(native_log):
        result = export_model(spec, flow_impl, export_dir, cpu=board.cpu["core"],
                              settings=settings,
                              input_sets=list(input_sets.samples) if input_sets else None,
                              options=options, on_step=getattr(progress, "step", None))
    if input_sets is not None:
        write_atomic(export_dir / "labels.json", json.dumps(
            {"names": list(input_sets.names), "labels": list(input_sets.labels)}) + "\n")
    write_atomic(key_file, key)
    return result


def import_stage(target: Target, out: Path, progress: Progress, *,
                 inputs_dir: Path | None = None) -> ExportResult:
    """The export stage of a .pte given as the model (program/imported.py): nothing lowered,
    the program's own operators, its host reference (or --expect's outputs, or none); reused
    while its inputs (import-key) are unchanged."""
    program = target.program
    assert program is not None
    export_dir = out / "export"
    board, flow_impl = target.board, target.flow
    settings = flow_impl.target_settings(board)
    input_sets = None
    if inputs_dir is not None:
        import torch

        examples = tuple(torch.from_numpy(a) for a in deterministic_inputs(program.info))
        input_sets = load_input_sets(inputs_dir, examples)
    key = "import " + import_key(program, flow_impl, board.cpu["core"], settings,
                                 input_sets.digest if input_sets else "")
    key_file = export_dir / "export-key"
    cached = _finished_export(export_dir, key)
    if cached is not None:
        progress(f"the program {program.path.name} is imported ({export_dir})")
        return cached
    progress(f"importing {program.path} ({program.reason}) for the {flow_impl.name} runtime")
    samples = ([[t.numpy() for t in sample] for sample in input_sets.samples]
               if input_sets else None)
    result = import_program(program, flow_impl, export_dir, board.cpu["core"], samples,
                            on_step=getattr(progress, "step", None))
    if input_sets is not None:
        write_atomic(export_dir / "labels.json", json.dumps(
            {"names": list(input_sets.names), "labels": list(input_sets.labels)}) + "\n")
    write_atomic(key_file, key)
    return result


def _mixed_precision(result: ExportResult) -> dict:
    """export.json's `mixed_precision` (an int8 flow's), {} where there is none."""
    try:
        return json.loads(result.report_path.read_text()).get("mixed_precision", {})
    except (OSError, ValueError):
        return {}


def patches_notes(program: ProgramInfo) -> list[str]:
    """What --patches did to the program, from the export report beside it (when it was
    written for this very .pte): the grid, the MACs, the planned activations against the
    lower bound without patches (flows/patches.py)."""
    try:
        report = json.loads((program.path.parent / REPORT_NAME).read_text())
    except (OSError, ValueError):
        return []
    if report.get("pte", {}).get("sha256") != program.sha256:
        return []
    patches = report.get("patches")
    bound = program.costs.activation_lower_bound if program.costs else None
    return describe_patches(patches or {}, program.planned_total, bound)


def instruction_sources(exported: ExportResult) -> dict[int, str]:
    """export.json's instruction index -> model line ({} for an export without them: an
    imported program, or one made before deploykit wrote them)."""
    try:
        sources = json.loads(exported.report_path.read_text()).get("instruction_sources", {})
    except (OSError, ValueError):
        return {}
    return {int(k): v for k, v in sources.items()}


def locate_execute_failure(result: RunResult, exported: ExportResult) -> LocatedFailure | None:
    """Place a run's failed execute() in the exported program and the model (the run's
    outcome then names the instruction, operator, model line and the kernel's message)."""
    if not result.records.execute_errors:
        return None
    return result.locate_execute_failure(exported.pte_path.read_bytes(),
                                         instruction_sources(exported))


def _reference_fallback(result: ExportResult) -> str:
    """Why the host reference is not the flow's own where a flow fell back (the cortex_m
    flow's integer reference of the lowered graph, when it did not run, to the PT2E model):
    export.json's record of the failed check, "" where nothing fell back."""
    try:
        reference = json.loads(result.report_path.read_text()).get("reference", {})
    except (OSError, ValueError):
        return ""
    check = reference.get("cortex_m_dialect_check") or {}
    if check and not check.get("ran", True) and check.get("error"):
        return (f"the cortex_m integer reference of the lowered graph did not run on the host "
                f"({check['error']}), so the device is compared with the PT2E quantized model")
    return ""


def describe_export(result: ExportResult) -> str:
    if result.imported:
        return "\n".join([
            f"{result.pte_path}: {result.pte_size:,} B, {result.flow}: the program "
            f"{result.imported['source']} as it is ({result.imported['reason']})",
            f"  operators: {', '.join(result.op_list) or '-'}",
            f"  reference: {result.reference_kind}"
            + ("; nothing to compare the device's outputs with (--expect FILE.npz gives the "
               "expected outputs)" if result.reference_kind == NO_REFERENCE else "")])
    lines = [f"{result.pte_path}: {result.pte_size:,} B, {result.flow}, "
             f"exported in {result.export_seconds:.1f} s",
             f"  operators: {', '.join(result.op_list)}",
             f"  reference: {result.reference_kind}; eager max abs diff "
             f"{result.eager_max_abs_diff:.3g}"]
    lines += [f"  {line}" for line in int8_rewrite_notes(_mixed_precision(result))]
    lines += [f"  {line}" for line in patches_notes(inspect_pte(result.pte_path))]
    lines += [f"  warning: {w}" for w in result.warnings]
    return "\n".join(lines)


@dataclass(frozen=True)
class PlannedModel:
    export: ExportResult
    program: ProgramInfo
    plan: MemoryPlan
    # The measurement this plan is sized from (fit.json), and the key it is stored under.
    fit: fitting.FitRecord | None = None
    fit_key: str = ""
    fit_options: dict = field(default_factory=dict)


def plan_stage(target: Target, model: str, out: Path, progress: Progress) -> MemoryPlan:
    return _export_and_plan(target, model, out, progress).plan


def plan_pte(target: Target, pte: Path, out: Path | None, progress: Progress) -> MemoryPlan:
    """The memory plan of an existing `.pte`. `out` defaults to the build directory the .pte
    is in (<out>/export/model.pte), else build/<board>/<pte name>; a measurement stored there
    (fit.json) sizes the pools."""
    if out is None:
        out = (pte.parent.parent if pte.parent.name == "export"
               else Path("build") / target.name / pte.stem)
    program = inspect_pte(pte)
    options = fitting.fit_options(program, target, target.cmake_definitions())
    record = _stored_fit(out, program, fitting.fit_key(options), progress)
    return _plan_written(out, target, program, record)


def _stored_fit(out: Path, program: ProgramInfo, key: str,
                progress: Progress) -> fitting.FitRecord | None:
    """The measurement of this .pte on this runtime in <out>/fit.json, saying so; or None,
    saying when one exists for another runtime or firmware source (not used)."""
    record = fitting.load_fit(out, key, warn=lambda problem: progress(f"warning: {problem}"))
    if record is not None:
        progress(f"pools, stack and heap from the measurement in {out / fitting.FIT_FILE}")
    elif fitting.stale_fits(out, program.sha256, key):
        progress(f"{out / fitting.FIT_FILE} has a measurement of this .pte for another runtime "
                 "or firmware source; not used (estimates instead): --fit measures again")
    return record


def _export_and_plan(target: Target, model: str, out: Path, progress: Progress,
                     inputs_dir: Path | None = None,
                     calibration: str | None = None) -> PlannedModel:
    exported = export_stage(target, model, out, progress, inputs_dir=inputs_dir,
                            calibration=calibration)
    program = inspect_pte(exported.pte_path)
    # A measurement of this .pte on this runtime (deploykit build --fit) sizes the pools,
    # stack and heap exactly; without one the plan estimates them (docs/memory.md).
    options = fitting.fit_options(program, target, target.cmake_definitions())
    key = fitting.fit_key(options)
    record = (_stored_fit(out, program, key, progress) if target.profile.memory != "fixed"
              else None)
    plan = _plan_written(out, target, program, record)
    return PlannedModel(exported, program, plan, record, key, options)


def _plan_written(out: Path, target: Target, program: ProgramInfo,
                  record: fitting.FitRecord | None) -> MemoryPlan:
    """Plan (the reference profile: upstream's fixed, generous pools; else estimated, or
    measured when `record` is given) and write <out>/plan.json, also when it does not fit."""
    board, profile = target.board, target.profile
    try:
        if profile.memory == "fixed":
            plan = plan_memory(board, profile.fixed_program(program),
                               method_pool=profile.fixed_method_pool,
                               temp_pool=profile.fixed_temp_pool)
        else:
            plan = plan_memory(board, program, sizing=record.sizing() if record else None)
    except MemoryPlanError as exc:
        failed = getattr(exc, "plan", None)
        if failed is not None:
            write_atomic(out / "plan.json", json.dumps(failed.to_json(), indent=2) + "\n")
        raise
    plan.notes.extend(patches_notes(program))
    write_atomic(out / "plan.json", json.dumps(plan.to_json(), indent=2) + "\n")
    return plan


def _plan_json(plan: MemoryPlan) -> dict:
    return plan.to_json()


@dataclass(frozen=True)
class BuiltModel:
    planned: PlannedModel
    firmware: Firmware
    footprint: Footprint | None = None

    def summary(self) -> str:
        p = self.planned
        estimates = "".join(f"\n  delegate {d.index}: {d.vela_estimate.describe()}"
                            for d in p.program.delegates if d.vela_estimate is not None)
        text = (f"{describe_export(p.export)}{estimates}\nmemory plan:\n{p.plan.table()}\n"
                f"{self.firmware.summary(sizes=self.footprint is None)}")
        if self.footprint is not None:
            text += f"\n{self.footprint.table()}"
        return text


def build_firmware(target: Target, model: str, out: Path, workspace: Path | None,
                   progress: Progress, *, inputs_dir: Path | None = None, fit: bool = False,
                   timeout: float = 120.0, variant: FirmwareVariant | None = None,
                   calibration: str | None = None) -> BuiltModel:
    """Export, plan, render, build. With `fit`, a model without a stored measurement is first
    built with generous pools and run once on the board's runner; the pools, stack and heap
    are then linked at the measured peaks plus margin (memory/fit.py, docs/memory.md). `variant`: a
    firmware built with extra definitions into its own directory (profiling firmware,
    profiling/stage.py); the measurement, if any, is the plain firmware's. `calibration`: as
    for export_stage."""
    ws = load_workspace(workspace)  # before the slow export: fail fast without sources
    et_commit = check_executorch_commit(ws)
    board, family, flow_impl, profile = target.board, target.family, target.flow, target.profile
    if family.projects:
        require_projects(ws, list(family.projects), f"The {board.name} firmware")
    planned = _export_and_plan(target, model, out, progress, inputs_dir, calibration)
    if flow_impl.needs_npu:
        progress(f"memory plan (fits):\n{planned.plan.table(items=True)}")
    flow_definitions = flow_impl.firmware_definitions(board, ws, out, planned.plan)
    exported = planned.export
    generated = out / "generated"
    input_sets = [[np.frombuffer(memory_order_bytes(a, order), dtype=a.dtype).reshape(a.shape)
                   for a, order in zip(arrays, exported.input_dim_orders, strict=True)]
                  for arrays in exported.input_sets]
    definitions = {
        "EXECUTORCH_SOURCE_DIR": str(ws.executorch_dir),
        "DK_CMSIS_NN_DIR": str(ws.path_of("cmsis-nn")),
        "DK_OPS_YAML": str(exported.ops_yaml_path.resolve()),
        # Runtime builds are keyed by sources, CPU flags and options, so every board and model
        # with the same key shares one, wherever its output directory is.
        "DK_ET_RUNTIME_CACHE_DIR": str(ws.root / "runtime-cache"),
        "DK_ET_COMMIT": et_commit,
        **({"DK_FLATC": flatc} if (flatc := wheel_flatc(ws.executorch_dir)) else {}),
        **target.cmake_definitions(),
        **family.build_definitions(board, ws),
        **flow_definitions,
        **in_place_definition([exported.pte_path]),
        **kernel_definitions([exported.pte_path], mve=bool(board.cpu.get("mve")),
                             dsp=bool(board.cpu.get("dsp"))),
        **(variant.definitions if variant else {}),
    }

    def compile_with(plan: MemoryPlan, measure: MeasureTarget | None = None) -> Firmware:
        """Render the generated files for `plan` (pool sizes; a fitted stack and heap override
        the board file's) and build; for `measure`'s board when measuring on a proxy (its own
        family and directories, the same runtime options)."""
        build_board, build_family, defs = board, family, definitions
        gen_dir, build_dir = generated, out / (variant.directory if variant else "firmware")
        if measure is not None and measure.proxy is not None and target.proxy is not None:
            build_board, build_family = measure.board, target.proxy.family
            gen_dir, build_dir = measurement_dirs(out, measure)
            defs = {k: v for k, v in definitions.items()
                    if k not in family.build_definitions(board, ws)}
            defs.update(build_family.build_definitions(build_board, ws))
        sized = _sized_board(build_board, plan)
        where = planned.fit.source if planned.fit is not None and measure is None else ""
        render_board_files(sized, gen_dir, _stack_heap_source(build_board, plan, where),
                           plan=plan)
        render_model_files(ModelSources(
            pte=variant.pte if variant and variant.pte else exported.pte_path.read_bytes(),
            input_sets=input_sets,
            expected_outputs=exported.reference_sets[0], plan=plan, et_commit=et_commit,
            build_info=f"flow={flow_impl.name} cpu={board.cpu['core']} profile={profile.name}"),
            gen_dir)
        return build_family.build_image(sized, gen_dir, build_dir, "runner", defs,
                                        progress=progress)

    if fit and profile.memory != "fixed" and (planned.fit is None
                                              or _remeasure_on_board(target, planned.fit)):
        planned = _measure(target, out, planned, compile_with, workspace, timeout, progress)
    progress(f"building the firmware, profile {profile.name} (the ExecuTorch runtime is cached "
             "per board and options)")
    firmware = compile_with(planned.plan)
    fp = _footprint_of(firmware, planned, model)
    if variant is None:  # footprint.json describes the plain firmware
        fp.write(out)
    return BuiltModel(planned, firmware, fp)


@dataclass(frozen=True)
class FirmwareVariant:
    """A firmware built with extra CMake definitions into `<out>/<directory>`; `pte`: another
    program with the export's operators and memory plan to embed instead of the export's (a
    deliberately changed program whose operator outputs are compared with the export's)."""

    directory: str
    definitions: dict[str, str]
    pte: bytes | None = None


def _sized_board(board: Board, plan: MemoryPlan) -> Board:
    """The board with the plan's stack and heap (a per-build override of its defaults)."""
    if plan.stack_size is None and plan.heap_size is None:
        return board
    return dataclasses.replace(
        board, stack_size=plan.stack_size if plan.stack_size is not None else board.stack_size,
        heap_size=plan.heap_size if plan.heap_size is not None else board.heap_size)


def _stack_heap_source(board: Board, plan: MemoryPlan, where: str = "") -> str:
    if plan.stack_size is None and plan.heap_size is None:
        return f"the board file {board.path.name}"
    p = plan.peaks
    return (f"deploykit build --fit, {where or 'measured'}: stack peak {p.get('stack', 0):,} "
            f"B, heap peak {p.get('heap', 0):,} B, plus margin (memory/fit.py); board file "
            f"defaults {board.stack_size:,} / {board.heap_size:,} B")


def _remeasure_on_board(target: Target, record: fitting.FitRecord) -> bool:
    """--fit with a stored proxy measurement measures again when the board itself is there."""
    if not record.measured_on or target.name in record.measured_on.split(" (")[0]:
        return False
    from deploykit.util.errors import EnvironmentProblem

    try:
        target.runner.from_board(target.board, **target.runner_options).check_environment()
    except (EnvironmentProblem, ConfigError):
        return False
    return True


def _measure(target: Target, out: Path, planned: PlannedModel,
             compile_with: Callable[[MemoryPlan, MeasureTarget | None], Firmware],
             workspace: Path | None, timeout: float, progress: Progress) -> PlannedModel:
    """Build with generous pools, run once (on the board, or on its proxy when it is not
    attached: run/proxy.py), store the peaks (fit.json), re-plan from them."""
    program, board = planned.program, target.board
    pools = board.placement["pools"]
    headroom = next((r.headroom for r in planned.plan.regions if r.region == pools), 0)
    where = measure_target(target, target.runner_kwargs(workspace, progress), progress)
    runner, run_board = where.runner, where.board
    run_out = out / "fit" / "proxy" if where.proxy else out / "fit"

    def build_and_run(sizing: Sizing) -> fitting.MeasureAttempt:
        firmware = compile_with(plan_memory(run_board, program, sizing=sizing), where)
        progress(f"running on {runner.kind} ({run_board.name}) to measure "
                 f"({run_out / 'run'})")
        result = runner.run(firmware.elf, run_out, timeout_s=timeout, check=False)
        locate_execute_failure(result, planned.export)
        records = result.records
        memory = dict(records.memory.entries) if records.memory else {}
        hello = records.hello.fields if records.hello else None
        outcome = result.outcome()
        if outcome.ok and planned.export.reference_kind == NO_REFERENCE:
            return fitting.MeasureAttempt(memory, hello, parity="outputs not compared (no "
                                          "reference for this program)")
        if outcome.ok:
            # The measurement run is a parity check too (on a proxy, the only one before the
            # board): its outputs must match the host's.
            exported = planned.export
            verdict = compare_sets(_device_sets(records, exported), exported.reference_sets,
                                   Tolerance(**exported.tolerance))
            if not verdict.passed:
                return fitting.MeasureAttempt(memory, hello, "its outputs differ from the host "
                                              f"reference (max abs err "
                                              f"{verdict.max_abs_error:.3g})")
            parity = (f"outputs match the host reference on {run_board.name} (max abs err "
                      f"{verdict.max_abs_error:.3g})")
            progress(parity)
            return fitting.MeasureAttempt(memory, hello, parity=parity)
        return fitting.MeasureAttempt(memory, hello, outcome.cause, pool_too_small(records))

    record = fitting.measure(board, program, target.flow.name, planned.fit_key,
                             planned.fit_options,
                             fitting.measurement_sizing(board, program, headroom),
                             build_and_run, progress, run_board=run_board,
                             measured_on=where.where, extra_stack=where.extra_stack)
    path = fitting.save_fit(out, record)
    progress(f"{record.source}: peaks {record.peaks}; fitted {record.fitted} "
             f"(stored in {path})")
    plan = plan_memory(board, program, sizing=record.sizing())
    write_atomic(out / "plan.json", json.dumps(plan.to_json(), indent=2) + "\n")
    return dataclasses.replace(planned, plan=plan, fit=record)


def _device_sets(records: RunRecords, exported: ExportResult) -> list[list[np.ndarray | None]]:
    """The device's outputs per input set, as the host's arrays (output i of input set k
    arrives as tensor k * outputs + i, docs/protocol.md)."""
    n_out = len(exported.output_dim_orders)
    device_sets = []
    for k in range(len(exported.input_sets)):
        device = []
        for i, order in enumerate(exported.output_dim_orders):
            t = records.tensors.get(k * n_out + i)
            device.append(None if t is None else as_host_dtype(
                logical_order(t.data, order), exported.output_quant[i]))
        device_sets.append(device)
    return device_sets


def _footprint_of(firmware: Firmware, planned: PlannedModel, model: str,
                  memory: dict[str, tuple[int, int]] | None = None) -> Footprint:
    """Flash by component and RAM blocks against their peaks: the run's (`memory`), else the
    stored measurement, else the plan's estimates (method and temp modelled, planned exact)."""
    title = f"footprint: {Path(model).stem} on {firmware.board} ({firmware.elf.name})"
    if memory:
        peaks, source = {k: u for k, (u, _c) in memory.items()}, "measured on the target (run)"
    elif planned.fit is not None:
        peaks, source = dict(planned.fit.peaks), f"{planned.fit.source} (fit.json)"
    else:
        load = planned.program.method_load
        peaks = {"planned_pool": sum(planned.program.planned_buffers)}
        if load is not None:
            peaks.update(method_pool=load.method_bytes, temp_pool=load.temp_bytes)
        if planned.program.delegates and planned.program.max_scratch:
            peaks["npu_scratch"] = planned.program.max_scratch  # Vela's, exact
        source = ("estimated from the .pte; stack and heap unknown until measured "
                  "(deploykit build --fit)")
    return footprint(firmware.sizes, title, peaks, source)


def wheel_flatc(executorch_dir: Path) -> str | None:
    """The executorch wheel's flatc, when it is the version of the source tree's flatbuffers:
    the runtime build then needs no host flatc of its own (about a minute on 2 cores, the
    larger part of a cold runtime build)."""
    import re
    import subprocess

    try:
        import executorch.data.bin as bin_dir
    except ImportError:
        return None
    flatc = Path(next(iter(bin_dir.__path__))) / "flatc"
    base = executorch_dir / "third-party/flatbuffers/include/flatbuffers/base.h"
    if not flatc.is_file() or not base.is_file():
        return None
    parts = dict(re.findall(r"#define FLATBUFFERS_VERSION_(MAJOR|MINOR|REVISION) (\d+)",
                            base.read_text()))
    tree = ".".join(parts.get(k, "?") for k in ("MAJOR", "MINOR", "REVISION"))
    try:
        out = subprocess.run([str(flatc), "--version"], capture_output=True, text=True,
                             timeout=10, check=False).stdout
    except OSError:
        return None
    return str(flatc) if out.split()[-1:] == [tree] else None


def run_firmware(target: Target, model: str, out: Path, workspace: Path | None,
                 timeout: float, progress: Progress, *, inputs_dir: Path | None = None,
                 fit: bool = False, tolerance: Tolerance | None = None,
                 no_compare: bool = False) -> RunReport:
    """`tolerance` overrides the model's (its TOLERANCE, or the flow's default). A program
    with no reference (an NPU program without --expect) is run and its outputs printed; the
    run fails NOT_COMPARED unless `no_compare` says that is what is wanted."""
    built = build_firmware(target, model, out, workspace, progress, inputs_dir=inputs_dir,
                           fit=fit, timeout=timeout)
    exported = built.planned.export
    board = target.board
    runner = target.make_runner(workspace, progress)
    progress(f"running on {runner.kind} ({board.runner.get('machine', board.name)})")
    result = runner.run(built.firmware.elf, out, timeout_s=timeout, check=False)
    located = locate_execute_failure(result, exported)
    outcome = result.outcome()
    records = result.records
    device_sets = _device_sets(records, exported)
    compared = exported.reference_kind != NO_REFERENCE
    verdict = compare_sets(device_sets, exported.reference_sets,
                           tolerance or Tolerance(**exported.tolerance)) if compared else None
    device = device_sets[0]
    sets = set_statistics(device_sets, exported.reference_sets,
                          out / "export" / "labels.json") if compared else None
    # Every run reports its peaks: one above its pool fails (the device refuses the allocation
    # itself, done status 3); a pool more than 25% above its peak is a warning (memory/fit.py).
    memory = dict(records.memory.entries) if records.memory else {}
    failures, oversized = fitting.check_peaks(memory)
    warnings = _fit_warnings(built.planned, records)
    if not outcome.ok:
        exit_code, cause = outcome.exit_code, outcome.cause
        if pool_too_small(records) in fitting.MEASURED_POOLS:
            cause += (" The pools were " + ("measured (fit.json)" if built.planned.fit
                                            else "estimated") + "; deploykit run --fit "
                      "measures the model with generous pools and links it at peak + margin.")
        elif outcome.hint:
            cause += " " + outcome.hint
    elif failures:
        exit_code, cause = ExitCode.MEMORY, "; ".join(failures)
    elif verdict is None:
        exit_code, cause = (ExitCode.OK, "") if no_compare else (
            ExitCode.NOT_COMPARED, "the run ended well, but there was nothing to compare its "
            "outputs with (printed below): the program cannot run on the host. Give its "
            "expected outputs with --expect FILE.npz, or pass --no-compare to accept a run "
            "without a comparison")
    elif not verdict.passed:
        exit_code, cause = ExitCode.MISMATCH, "device outputs differ from the host's"
    else:
        exit_code, cause = ExitCode.OK, ""
    if memory:
        _footprint_of(built.firmware, built.planned, model, memory).write(out)
    timing = records.timing
    report = RunReport(
        board=board.name, model=exported.model_name, flow=target.flow.name,
        passed=exit_code == ExitCode.OK,
        exit_code=exit_code, verdict=verdict, reference_kind=exported.reference_kind,
        reference_fallback=_reference_fallback(exported),
        ticks=timing.ticks if timing else None, tick_hz=timing.tick_hz if timing else None,
        timing_emulated_by=result.emulated_by,
        instructions_estimate=result.instructions_per_iteration_estimate,
        input_sets=sets, npu_calls=npu_calls_of(records, built.planned.program),
        memory=memory, warnings=warnings, oversized_pools=oversized,
        memory_advice=memory_advice(memory, oversized),
        mixed_precision=_mixed_precision(exported),
        execute_failure=dataclasses.asdict(located) if located else None,
        elf=built.firmware.elf, flash_bytes=built.firmware.sizes.flash_total, cause=cause,
        log=result.console_log,
        device_outputs=[d.ravel().tolist() if d is not None else [] for d in device],
        records=records)
    write_atomic(out / "run" / "result.json",
                 json.dumps(report_json(report), indent=2, allow_nan=False) + "\n")
    return report


def _fit_warnings(planned: PlannedModel, records: RunRecords) -> list[str]:
    """A fitted firmware whose runtime differs from the measured one: the sizes may be stale."""
    record, hello = planned.fit, records.hello
    if record is None or hello is None or not record.et_runtime:
        return []
    now = hello.fields.get("et_runtime", "")
    if now and now != record.et_runtime:
        return [f"the pools were measured on runtime {record.et_runtime}, this firmware runs "
                f"{now}: delete {FIT_FILE_NAME} or run with --fit again if a peak moved"]
    return []


FIT_FILE_NAME = fitting.FIT_FILE
