"""The Python API: one function per pipeline stage, and the chains the CLI offers.

    export → inspect → plan → render → build → run → validate

Each stage is its own module with typed inputs and outputs; this module wires them together
with the conventions every command shares (output directories, board defaults, progress).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from deploykit.families import family_of
from deploykit.program.inspect import ProgramInfo, inspect_pte
from deploykit.readers.boards import Board, available_boards, board_origin, load_board
from deploykit.readers.sources import SourceOverride, Workspace
from deploykit.util.errors import ConfigError, DeployKitError  # noqa: F401 (users catch these)
from deploykit.util.locks import out_lock

if TYPE_CHECKING:
    from deploykit.pipeline.project import Choices
    from deploykit.pipeline.target import Target
    from deploykit.pipeline.validation import Device
    from deploykit.profiling.explore import ExploreSession
    from deploykit.readers.project_file import ProjectFile
    from deploykit.run.accuracy import ValidationReport
    from deploykit.util.tool_env import ToolEnv

    # A project file: a path (or one read), False for none, None to find deploykit.toml (or
    # pyproject.toml's [tool.deploykit]) from the current directory upwards (docs/project.md).
    ProjectChoice = Path | str | bool | ProjectFile | None

Progress = Callable[[str], None]


def _quiet(_message: str) -> None:
    pass


def boards() -> list[Board]:
    return [load_board(name) for name in available_boards()]


def boards_and_errors() -> tuple[list[Board], list[ConfigError]]:
    """Every board on the search path that loads, and the errors of those that do not."""
    from deploykit.pipeline.target import check_board_flows

    loaded, errors = [], []
    for name in available_boards():
        try:
            board = load_board(name)
            check_board_flows(board)
            loaded.append(board)
        except ConfigError as exc:
            errors.append(exc)
    return loaded, errors


def describe_board(board: Board) -> str:
    lines = [f"{board.name}: {board.description}",
             f"  from {board_origin(board)} ({board.path})",
             f"  cpu {board.cpu['core']} ({' '.join(board.cpu_flags)}), family "
             f"{board.family}, runner {board.runner['kind']}, flows "
             f"{', '.join(board.export['allowed'])}"]
    npu = board.npu
    if npu is not None:
        lines.append(f"  npu {npu.target} at 0x{npu.base:08X} irq {npu.irq}, Vela "
                     f"{npu.system_config} / {npu.memory_mode} (modes: "
                     f"{', '.join(npu.memory_modes)}; system configs: "
                     f"{', '.join(npu.system_configs)}), AXI0 {npu.sram_region}, AXI1 "
                     f"{npu.ext_region}")
    if board.cpu.get("note"):
        lines.append(f"  note: {board.cpu['note']}")
    for r in board.memory:
        placed = [k for k, v in board.placement.items() if v == r.name]
        if npu is not None and r.name == npu.sram_region:
            placed.append("NPU SRAM (AXI0)")
        lines.append(f"  {r.name:<8} 0x{r.origin:08X} {r.size // 1024:>8} KiB  "
                     f"{', '.join(placed) or '-'}")
    return "\n".join(lines)


def doctor(workspace: Path | None = None):
    from deploykit.readers.doctor import run_checks

    return run_checks(workspace)


def setup(workspace: Path | None = None, sources: list[str] | None = None,
          progress: Progress = _quiet, groups: list[str] | None = None,
          forget: list[str] | None = None) -> Workspace:
    """Fetch the pinned sources; `sources` (NAME=PATH[@REV]) are remembered by the workspace
    and used again by later calls until replaced or named in `forget`."""
    from deploykit.readers import sources as src

    overrides = [SourceOverride.parse(s) for s in sources or []]
    return src.setup(workspace, overrides, progress, groups=groups, forget=forget)


def inspect(pte: Path) -> ProgramInfo:
    return inspect_pte(pte)


def explore(pte: Path, port: int | None = None, open_browser: bool = True, *,
            tosa: bool = False, node_data: Sequence[Path] = (), profile: Path | None = None,
            intermediates: Path | None = None, auto_data: bool = True,
            wheels: Path | None = None, progress: Callable[[str], None] | None = None,
            on_ready: Callable[[ExploreSession], None] | None = None) -> ExploreSession:
    """Serve `pte` (or, `tosa`, its delegates' TOSA graphs) in Google's Model Explorer, run
    from its own tool environment (created on first use), until Ctrl-C. `on_ready` is told
    the URL once the server answers. `profile` (profile.json) and `intermediates`
    (intermediates.json) overlay per-instruction time and error; with `auto_data` they are
    taken from the model's out directory when the .pte is <out>/export/*.pte."""
    from deploykit.profiling.explore import explore as run

    return run(pte, port=port, open_browser=open_browser, tosa=tosa, node_data=node_data,
               profile=profile, intermediates=intermediates, auto_data=auto_data,
               wheels=wheels, progress=progress, on_ready=on_ready)


def explore_setup(wheels: Path | None = None,
                  progress: Callable[[str], None] | None = None) -> ToolEnv:
    """Create Model Explorer's tool environment if there is none (deploykit.util.tool_env)."""
    from deploykit.util.tool_env import ensure

    return ensure(wheels=wheels, progress=progress)


def describe_program(info: ProgramInfo) -> str:
    lines = [f"{info.path}: {info.size:,} B, method '{info.method}'"]
    if info.segments:
        lines.append("  segments (execution order):")
        for n, seg in enumerate(info.segments, 1):
            lines += _describe_segment(n, seg, info)
        fallback = info.cpu_fallback_ops
        lines.append("  CPU fallback ops: " + (", ".join(fallback) if fallback else
                                               "none (a portable program: every kernel is the "
                                               "flow's own)" if info.costs and
                                               not info.costs.has_target_kernels else
                                               "none (all in the flow's target kernels)"))
        lines += [f"    {island.describe()}" for island in info.islands]
    lines += _describe_costs(info)
    scratch = [d for d in info.delegates if d.scratch_size is not None]
    if scratch:
        lines.append("  Vela scratch: " + ", ".join(f"delegate {d.index} {d.scratch_size:,} B"
                                                    for d in scratch)
                     + f" (largest {info.max_scratch:,} B)")
    lines += [
             f"  operators ({len(info.operators)}): {', '.join(info.operators) or '-'}",
             f"  delegates ({len(info.delegates)}): "
             + (", ".join(f"{d.backend} {d.size:,} B" for d in info.delegates) or "-"),
             f"  planned buffers: {', '.join(f'{s:,} B' for s in info.planned_buffers) or '-'}",
             f"  constant data: {info.constant_bytes:,} B",
             f"  values {info.num_values}, instructions {info.num_instructions}"
             + (f"; Method::load takes {info.method_load.method_bytes:,} B of the method "
                f"pool and {info.method_load.temp_bytes:,} B of the temp pool (modelled, "
                "docs/memory.md)" if info.method_load else ""),
             "  inputs: " + ", ".join(f"{t.dtype_name} {list(t.sizes)}" for t in info.inputs),
             "  outputs: " + ", ".join(f"{t.dtype_name} {list(t.sizes)}"
                                      for t in info.outputs)]
    if info.delegates:
        source = info.partition_source or "unknown (no export.json for this .pte beside it)"
        lines.append(f"  delegate blobs: {info.delegate_bytes:,} B; ops inside delegates from: "
                     f"{source}")
    return "\n".join(lines)


def _describe_costs(info: ProgramInfo) -> list[str]:
    if info.costs is None:
        return []
    macs = info.macs
    lines = ["  MACs per inference: " + (f"{macs:,}" if macs is not None else
                                         f"{info.costs.macs:,} on the CPU (the NPU's are "
                                         "unknown without the export report)")]
    bound = info.costs.activation_lower_bound
    if bound:
        lines.append(f"  activation memory: planned {info.planned_total:,} B, lower bound "
                     f"{bound:,} B (live at {info.costs.lower_bound_at}), "
                     f"{info.planned_total / bound:.2f}x")
    from deploykit.pipeline.chains import patches_notes

    lines += [f"  {line}" for line in patches_notes(info)]
    return lines


def program_json(info: ProgramInfo) -> dict:
    """`deploykit inspect --json`: ProgramInfo, plus `segments` in execution order with each
    delegate's facts inline, the CPU ops and the largest Vela scratch."""
    from deploykit.util.jsonable import to_jsonable

    out = to_jsonable(info)
    segments = []
    for seg in info.segments:
        if seg.kind == "cpu":
            segments.append({"kind": "cpu", "ops": list(seg.ops)})
            continue
        d = info.delegates[seg.delegate]
        segments.append({"kind": "delegate", "delegate": d.index, "backend": d.backend,
                         "target": d.target, "system_config": d.system_config,
                         "memory_mode": d.memory_mode, "size": d.size,
                         "scratch_size": d.scratch_size,
                         "ops": list(d.ops) if d.ops is not None else None,
                         "op_counts": d.ops,
                         "npu_estimate": None if d.vela_estimate is None else {
                             **to_jsonable(d.vela_estimate), "source": "Vela estimate",
                             "mac_utilisation": d.vela_estimate.mac_utilisation}})
    out.update(segments=segments, cpu_ops=list(info.cpu_ops),
               cpu_fallback_ops=list(info.cpu_fallback_ops), max_scratch=info.max_scratch,
               planned_total=info.planned_total, macs=info.macs,
               float_islands=[to_jsonable(i) for i in info.islands])
    return out


# The NPU operators `inspect` lists per delegate, the most cycles first.
TOP_NPU_LAYERS = 5


def _describe_segment(n: int, seg, info: ProgramInfo) -> list[str]:
    if seg.kind == "cpu":
        return [f"    {n}. cpu       {', '.join(seg.ops)}"]
    d = info.delegates[seg.delegate]
    where = ", ".join(x for x in (d.target, d.system_config, d.memory_mode) if x)
    head = f"    {n}. {d.backend} (delegate {d.index}{', ' + where if where else ''}): {d.size:,} B"
    if d.vela is not None:
        head += (f" (commands {d.vela.cmd_bytes:,} B, weights {d.vela.weight_bytes:,} B), "
                 f"scratch {d.scratch_size:,} B")
    lines = [head]
    if d.ops is not None:
        ops = ", ".join(f"{op} x{count}" if count > 1 else op for op, count in d.ops.items())
        lines.append(f"         ops ({sum(d.ops.values())}): {ops or '-'}")
    else:
        lines.append("         ops: unknown (the Vela stream holds no op names)")
    if d.vela_estimate is not None:
        estimate = d.vela_estimate
        lines.append(f"         {estimate.describe()}")
        top = estimate.top_layers(TOP_NPU_LAYERS)
        if top:
            lines.append(f"         top {len(top)} of {len(estimate.layers)} NPU operators "
                         "(Vela estimate; --json has all):")
            lines += [f"           {layer.describe(estimate.total_cycles, estimate.clock_mhz)}"
                      for layer in top]
    return lines


def default_out(board: str, model: str) -> Path:
    return Path("build") / Path(board).stem / Path(model).stem


def target(board: str | Path | Board, *, flow: str | None = None, profile: str | None = None,
           strict: bool = False, patches: str | None = None, npu_macs: int | None = None,
           npu_memory_mode: str | None = None, runner_options: dict | None = None) -> Target:
    """What a command builds for, resolved and checked once (pipeline/target.py): the board as
    compiled, its family, the flow, the build profile, the NPU settings and the runner."""
    from deploykit.pipeline.target import resolve_target

    return resolve_target(board, flow=flow, profile=profile, strict=strict, patches=patches,
                          npu_macs=npu_macs,
                          npu_memory_mode=npu_memory_mode, runner_options=runner_options)


@dataclass(frozen=True)
class Command:
    """One command's settings (the arguments over the project file) and the Target they
    resolve to; `model` is None for a command without one."""

    choices: Choices
    target: Target
    model: str | None

    def out(self, out: Path | None) -> Path:
        if out is not None:
            return Path(out)
        return default_out(self.target.name, self.model or "model")

    def tolerance(self):
        """The device-vs-host tolerance chosen (--atol/--rtol or the project file), or None."""
        from deploykit.run.validate import Tolerance

        atol, rtol = self.choices.tolerance()
        if atol is None and rtol is None:
            return None
        return Tolerance(atol=atol or 0.0, rtol=rtol or 0.0)


def command(board: str | Path | None = None, model: str | None = None, *,
            project: ProjectChoice = None, needs_model: bool = True, runs: bool = False,
            **given) -> Command:
    """Resolve a command's settings and its Target once: the arguments (`given`: flow, profile,
    strict, patches, npu_macs, npu_memory_mode, fit, inputs, expect, atol, rtol, timeout and the
    runner options; None where not given) over the project file (pipeline/project.py). `runs`: the
    command runs the board, so the runner options apply."""
    from deploykit.pipeline.project import (
        choose,
        load_project,
        no_board_error,
        no_model_error,
        runner_flags,
    )
    from deploykit.pipeline.target import resolve_target
    from deploykit.program.imported import is_program_file as is_program

    if not runs:  # a command that does not run takes no runner options, from the file either
        given = {k: v for k, v in given.items() if k not in runner_flags()}
    choices = choose({"board": board, "model": model, **given}, load_project(project))
    if not runs:
        choices = dataclasses.replace(choices, settings={
            k: v for k, v in choices.settings.items() if k not in runner_flags()})
    if choices.board is None:
        raise no_board_error(choices.project)
    if needs_model and choices.model is None:
        raise no_model_error(str(choices.board), choices.project)
    model_value = choices.model
    resolved = resolve_target(
        choices.board, flow=choices.value("flow"), profile=choices.value("profile"),
        strict=bool(choices.value("strict")), patches=choices.value("patches"),
        npu_macs=choices.value("npu_macs"),
        npu_memory_mode=choices.value("npu_memory_mode"),
        runner_options=choices.runner_options() if runs else None,
        origins=choices.origins(),
        program=Path(model_value) if is_program(model_value) else None,
        expect=choices.value("expect") if is_program(model_value) else None)
    if choices.value("expect") is not None and not is_program(model_value):
        raise ConfigError(f"--expect {choices.value('expect')}: expected outputs are for a "
                          ".pte given as the model.",
                          "A model file's reference is computed from the model itself.")
    return Command(choices, resolved, model_value)


def init(directory: Path | None = None):
    """`deploykit init`: deploykit.toml, model.py and tests/test_on_board.py in `directory`
    (default: the current one); refuses to overwrite any of them (pipeline/scaffold.py)."""
    from deploykit.pipeline.scaffold import init_project

    return init_project(directory)


def chosen(board: str | Path | None = None, model: str | None = None, *,
           project: ProjectChoice = None) -> Choices:
    """The board and model the arguments and the project file choose, without resolving a
    Target (commands that take only a board: selftest, flash, monitor)."""
    from deploykit.pipeline.project import choose, load_project

    return choose({"board": board, "model": model}, load_project(project))


def config(board: str | Path | None = None, model: str | None = None, *,
           project: ProjectChoice = None, **given) -> tuple[Choices, list]:
    """`deploykit config`: every setting of a command on `board` as it resolves, with where
    it came from (the command line, the project file's line, the board file, a default).
    Without a board (none given, none in the project file), the project file's settings."""
    from deploykit.pipeline.project import choose, load_project, resolved_settings

    choices = choose({"board": board, "model": model, **given}, load_project(project))
    if choices.board is None:
        return choices, resolved_settings(choices, None)
    resolved = command(board, model, project=choices.project or False, needs_model=False,
                       runs=True, **given)
    return resolved.choices, resolved_settings(resolved.choices, resolved.target)


def describe_config(choices: Choices, rows: list) -> str:
    from deploykit.pipeline.project import describe_settings

    return describe_settings(choices, rows)


def export(board: str | None = None, model: str | None = None, flow: str | None = None,
           out: Path | None = None, progress: Progress = _quiet, npu_macs: int | None = None,
           npu_memory_mode: str | None = None, profile: str | None = None,
           strict: bool | None = None,
           patches: str | None = None, *, project: ProjectChoice = None):
    """`patches`: "auto", "off" or a grid "NxM": the first stage of an image model runs in
    tiles (flows/patches.py, docs/memory.md). `strict`: an operator the int8 lowering cannot
    take is an error, instead of being kept
    in float (automatic mixed precision of the cortex_m flow); and a program that still has an
    island outside the flow's target kernels (program/costs.py) is refused, listing them
    (int8 layout copies alone are no such island: they compute nothing). `board`, `model` and
    the settings not given come from the project file (`project`, docs/project.md)."""
    from deploykit.pipeline.chains import export_stage

    cmd = command(board, model, project=project, flow=flow, profile=profile, strict=strict,
                  patches=patches,
                  npu_macs=npu_macs, npu_memory_mode=npu_memory_mode)
    out = cmd.out(out)
    with out_lock(out):
        result = export_stage(cmd.target, cmd.model, out, progress)
        if cmd.target.profile.strict:
            _refuse_fallbacks(result)
    return result


def _strict_export(resolved: Target, model: str, out: Path, progress: Progress) -> None:
    """--strict before a build: export (the build reuses it) and refuse its islands."""
    from deploykit.pipeline.chains import export_stage

    _refuse_fallbacks(export_stage(resolved, model, out, progress))


def _refuse_fallbacks(result) -> None:
    from deploykit.program.costs import refuse_fallbacks

    refuse_fallbacks(result.pte_path, inspect_pte(result.pte_path).islands)


def describe_export(result) -> str:
    from deploykit.pipeline.chains import describe_export as describe

    return describe(result)


def plan(board: str | None = None, model: str | None = None, flow: str | None = None,
         out: Path | None = None, workspace: Path | None = None, progress: Progress = _quiet,
         npu_macs: int | None = None, npu_memory_mode: str | None = None,
         profile: str | None = None, pte: Path | None = None, strict: bool | None = None,
         patches: str | None = None, *,
         project: ProjectChoice = None):
    """The memory plan of `model` (exported first) or of an existing `.pte` on `board`; raises
    MemoryPlanError, naming the region, when it does not fit. Written to <out>/plan.json."""
    from deploykit.pipeline.chains import plan_pte, plan_stage

    if model is not None and pte is not None:
        raise ConfigError("Plan a model or a .pte, one of them.",
                          "Give --model NAME (exported first) or --pte FILE.pte.")
    cmd = command(board, model, project=project, needs_model=pte is None, flow=flow,
                  profile=profile, strict=strict, patches=patches, npu_macs=npu_macs,
                  npu_memory_mode=npu_memory_mode)
    if pte is not None:
        return plan_pte(cmd.target, Path(pte), out, progress)
    out = cmd.out(out)
    with out_lock(out):
        return plan_stage(cmd.target, cmd.model, out, progress)


def build(board: str | None = None, model: str | None = None, flow: str | None = None,
          out: Path | None = None, workspace: Path | None = None, progress: Progress = _quiet,
          npu_macs: int | None = None, npu_memory_mode: str | None = None,
          profile: str | None = None, fit: bool | None = None, strict: bool | None = None,
          patches: str | None = None, *,
          project: ProjectChoice = None):
    """`profile`: a build profile name (deploykit.pipeline.profiles; default: the board file's
    `profile:`, else size). `fit`: measure the model on the board's runner first when no
    measurement is stored (<out>/fit.json), then link pools and stack at peak + margin.
    `strict`: as for export, checked before the build."""
    from deploykit.pipeline.chains import build_firmware

    cmd = command(board, model, project=project, flow=flow, profile=profile, strict=strict,
                  patches=patches,
                  npu_macs=npu_macs, npu_memory_mode=npu_memory_mode, fit=fit)
    out = cmd.out(out)
    with out_lock(out):
        if cmd.target.profile.strict:  # the build reuses this export
            _strict_export(cmd.target, cmd.model, out, progress)
        return build_firmware(cmd.target, cmd.model, out, workspace, progress,
                              fit=bool(cmd.choices.value("fit")))


def run(board: str | None = None, model: str | None = None, flow: str | None = None,
        out: Path | None = None, workspace: Path | None = None, timeout: float | None = None,
        progress: Progress = _quiet, npu_macs: int | None = None,
        npu_memory_mode: str | None = None, runner_options: dict | None = None,
        inputs: Path | None = None, profile: str | None = None, fit: bool | None = None,
        atol: float | None = None, rtol: float | None = None, strict: bool | None = None,
        patches: str | None = None, *,
        expect: Path | None = None, no_compare: bool = False,
        project: ProjectChoice = None):
    """Build, run on the board's runner, compare with the host. For a .pte as the model,
    `expect`: its expected outputs (an .npz), when it cannot run on the host; `no_compare`: a
    run with nothing to compare with passes (otherwise it exits NOT_COMPARED). `inputs`: a
    directory of samples (program/input_sets.py) run in one firmware run instead of the
    example inputs. `fit`: as for build. `atol`/`rtol` override the model's tolerance.
    `runner_options`: options the board's runner declares (e.g. the Pico runner's port and
    probe; runners.runner_options)."""
    from deploykit.pipeline.chains import run_firmware

    cmd = command(board, model, project=project, runs=True, flow=flow, profile=profile,
                  strict=strict, patches=patches, npu_macs=npu_macs,
                  npu_memory_mode=npu_memory_mode, fit=fit,
                  inputs=inputs, atol=atol, rtol=rtol, timeout=timeout, expect=expect,
                  **(runner_options or {}))
    out = cmd.out(out)
    with out_lock(out):
        if cmd.target.profile.strict:  # the build reuses this export
            _strict_export(cmd.target, cmd.model, out, progress)
        return run_firmware(cmd.target, cmd.model, out, workspace, _timeout(cmd), progress,
                            inputs_dir=cmd.choices.value("inputs"),
                            fit=bool(cmd.choices.value("fit")), tolerance=cmd.tolerance(),
                            no_compare=no_compare)


def validate(board: str | None = None, model: str | None = None, dataset: str | None = None,
             flow: str | None = None, out: Path | None = None, progress: Progress = _quiet,
             profile: str | None = None, npu_macs: int | None = None,
             npu_memory_mode: str | None = None, strict: bool | None = None,
             patches: str | None = None, *,
             inputs: Path | None = None, limit: int | None = None,
             calibration: str = "model", max_accuracy_drop: float = 1.0,
             device: Device | None = None, on_board: bool = False,
             workspace: Path | None = None, timeout: float | None = None,
             runner_options: dict | None = None, project: ProjectChoice = None
             ) -> ValidationReport:
    """Score `model` over a split of a data set (pipeline/validation.py, docs/validation.md):
    fp32 on the host, the flow's host program calibrated on the model's calibration inputs
    and (int8 flows) on the example input alone, and the device. `dataset`: NAME[:SPLIT]
    (default digits:test), a directory of samples or a data set file; `inputs`: a directory
    of samples with labels.json instead (as for run). `limit`: the first N samples.
    `calibration`: the device program's ("model" or "example"). `max_accuracy_drop`: the
    points of top-1 the int8 program may lose against fp32 before the validation fails.

    The device: `device`, a callable taking one sample's inputs and returning its outputs
    (pipeline.validation.Device; a DeployKitError from it stops the validation there and
    fails it), or `on_board`: the board's own session (pipeline.validation.device_session);
    neither: host only. Writes <out>/validate/validation.json and confusion.svg."""
    from contextlib import nullcontext

    from deploykit.pipeline.validation import device_session, validate_model

    if inputs is not None and dataset is not None:
        raise ConfigError(f"Both --dataset {dataset} and --inputs {inputs} given.",
                          "Give one data set: --inputs DIR is the same as --dataset DIR.")
    if device is not None and on_board:
        raise ConfigError("A device callable and the board's session both given.",
                          "Pass `device` or `on_board=True`, not both.")
    chosen = str(inputs) if inputs is not None else dataset or "digits:test"
    cmd = command(board, model, project=project, runs=on_board, flow=flow, profile=profile,
                  strict=strict, patches=patches, npu_macs=npu_macs,
                  npu_memory_mode=npu_memory_mode, timeout=timeout, **(runner_options or {}))
    out = cmd.out(out)

    def board_session(program):
        return device_session(cmd.target, cmd.model, out, program, workspace, _timeout(cmd),
                              progress, calibration=calibration)

    def given(_program):
        return nullcontext(device)

    with out_lock(out):
        return validate_model(cmd.target, cmd.model, chosen, out, progress,
                              session=board_session if on_board else
                              given if device is not None else None,
                              limit=limit, calibration=calibration,
                              max_accuracy_drop=max_accuracy_drop)


def stream(board: str | None = None, model: str | None = None, flow: str | None = None,
           out: Path | None = None, workspace: Path | None = None,
           timeout: float | None = None, progress: Progress = _quiet,
           npu_macs: int | None = None, npu_memory_mode: str | None = None,
           runner_options: dict | None = None, profile: str | None = None,
           fit: bool | None = None, strict: bool | None = None, *,
           inputs: Path | None = None, atol: float | None = None, rtol: float | None = None,
           sample_timeout: float | None = None, project: ProjectChoice = None):
    """Samples streamed to the device (issue #28; pipeline/stream.py): serve firmware for
    `model` on `board`, built through the usual build path (export, plan, build, in `out`),
    started on the board's runner, with a session over its link, returned started. Use it as a
    context manager:

        with api.stream("qemu-an547", "tiny_cnn") as session:
            outputs = session.infer([x])      # one array per model input
        summary = session.close()             # timing, memory (close() again returns it)

    `infer` returns the outputs as `run` decodes them (logical order, the host's dtype).
    `session.reference` holds samples with the host's outputs for each and run's comparison
    (`reference.check(k, outputs)`): the model's example inputs, or the samples of `inputs` (a
    directory, as for run --inputs; serve firmware embeds none of them), compared with the
    model's tolerance or `atol`/`rtol`. `timeout`: the build's measurement run and the
    firmware's start; `sample_timeout`: each sample (default 30 s). The output directory is
    locked while the firmware is built, not while the session runs (the runner has loaded the
    image by then). `fit`, `strict` and the other settings: as for run."""
    from deploykit.pipeline.stream import open_stream
    from deploykit.run.stream import DEFAULT_SAMPLE_TIMEOUT_S

    cmd = command(board, model, project=project, runs=True, flow=flow, profile=profile,
                  strict=strict, npu_macs=npu_macs, npu_memory_mode=npu_memory_mode, fit=fit,
                  inputs=inputs, atol=atol, rtol=rtol, timeout=timeout,
                  **(runner_options or {}))
    out = cmd.out(out)
    with out_lock(out):
        if cmd.target.profile.strict:  # the build reuses this export
            _strict_export(cmd.target, cmd.model, out, progress)
        return open_stream(cmd.target, cmd.model, out, workspace, progress,
                           inputs_dir=cmd.choices.value("inputs"),
                           fit=bool(cmd.choices.value("fit")), timeout=_timeout(cmd),
                           sample_timeout=sample_timeout or DEFAULT_SAMPLE_TIMEOUT_S,
                           tolerance=cmd.tolerance())


def _timeout(cmd: Command) -> float:
    from deploykit.pipeline.project import DEFAULT_TIMEOUT_S

    return float(cmd.choices.value("timeout", DEFAULT_TIMEOUT_S))


def library(board: str | None = None, models: Sequence[str] | None = None,
            out: Path | None = None, flow: str | None = None, workspace: Path | None = None,
            progress: Progress = _quiet, profile: str | None = None, fit: bool | None = None,
            name: str | None = None, timeout: float | None = None, work: Path | None = None,
            npu_macs: int | None = None, npu_memory_mode: str | None = None,
            *, project: ProjectChoice = None):
    """A self-contained component of `models` for another CMake project, in `out`
    (pipeline/library.py, docs/library.md): one C API per model, one runtime with the union of
    their kernels (and, for ethos_u_int8, EthosUBackend and Arm's Ethos-U driver). Each model
    is exported (and, with `fit`, measured) in build/<board>/<model>, and the component built
    in build/<board>/library-<name>; `work`: both in that directory instead. Without
    `models`, the project file's model. `npu_macs`, `npu_memory_mode`: as for export."""
    from deploykit.pipeline.library import build_library
    from deploykit.program.imported import check_for_board, is_program_file, read_program

    if out is None:
        raise ConfigError("A library needs its output directory.", "Give --out DIR.")

    models = list(models or [])
    cmd = command(board, models[0] if models else None, project=project, flow=flow,
                  profile=profile, fit=fit, timeout=timeout, npu_macs=npu_macs,
                  npu_memory_mode=npu_memory_mode)
    models = models or [cmd.model]
    programs = {}  # each .pte model, read and checked here: its flow must be the component's
    for model in models:
        if not is_program_file(model):
            continue
        program = cmd.target.program if model == cmd.model else read_program(Path(model))
        if program is None:
            continue
        check_for_board(program, cmd.target.board)
        if program.flow != cmd.target.flow.name:
            raise ConfigError(f"The program {program.path} is {program.flow} "
                              f"({program.reason}); the component is {cmd.target.flow.name}.",
                              "A component's models share one runtime: give models of one "
                              "flow.")
        programs[model] = program
    return build_library(cmd.target, models, Path(out), workspace, progress,
                         fit=bool(cmd.choices.value("fit")), name=name, timeout=_timeout(cmd),
                         work=Path(work) if work is not None else None, programs=programs)


def profile(board: str | None = None, model: str | None = None, flow: str | None = None,
            out: Path | None = None, workspace: Path | None = None,
            timeout: float | None = None, progress: Progress = _quiet,
            npu_macs: int | None = None, npu_memory_mode: str | None = None,
            runner_options: dict | None = None, profile: str | None = None,
            fit: bool | None = None, strict: bool | None = None, patches: str | None = None, *,
            project: ProjectChoice = None):
    """Per-operator profile of `model` on `board` (profiling/stage.py, docs/profiling.md):
    builds profiling firmware and the plain one, runs both, writes <out>/profile/. `strict`:
    as for export."""
    from deploykit.profiling.stage import profile_model

    cmd = command(board, model, project=project, runs=True, flow=flow, profile=profile,
                  strict=strict, patches=patches, npu_macs=npu_macs,
                  npu_memory_mode=npu_memory_mode, fit=fit,
                  timeout=timeout, **(runner_options or {}))
    out = cmd.out(out)
    with out_lock(out):
        return profile_model(cmd.target, cmd.model, out, workspace, _timeout(cmd), progress,
                             fit=bool(cmd.choices.value("fit")))


def debug_intermediates(board: str | None = None, model: str | None = None,
                        flow: str | None = None, out: Path | None = None,
                        workspace: Path | None = None, timeout: float | None = None,
                        progress: Progress = _quiet, npu_macs: int | None = None,
                        npu_memory_mode: str | None = None, runner_options: dict | None = None,
                        profile: str | None = None, fit: bool | None = None,
                        atol: float | None = None, rtol: float | None = None,
                        strict: bool | None = None,
                        patches: str | None = None, *, project: ProjectChoice = None):
    """Every operator's device output against the host's, in execution order (`deploykit run
    --debug-intermediates`; profiling/stage.py, docs/profiling.md)."""
    from deploykit.profiling.stage import debug_intermediates as debug

    cmd = command(board, model, project=project, runs=True, flow=flow, profile=profile,
                  strict=strict, patches=patches, npu_macs=npu_macs,
                  npu_memory_mode=npu_memory_mode, fit=fit,
                  atol=atol, rtol=rtol, timeout=timeout, **(runner_options or {}))
    out = cmd.out(out)
    atol, rtol = cmd.choices.tolerance()
    with out_lock(out):
        return debug(cmd.target, cmd.model, out, workspace, _timeout(cmd), progress,
                     fit=bool(cmd.choices.value("fit")), atol=atol, rtol=rtol)


def flash(board: str, *, model: str | None = None, image: Path | None = None,
          out: Path | None = None, port: str | None = None, probe: str | None = None,
          workspace: Path | None = None, progress: Progress = _quiet):
    """Flash a built firmware (`--model`: the runner `deploykit build` made; `--image`: a .uf2
    or .elf) with the first of the board's flashers that sees exactly one board."""
    from contextlib import suppress

    from deploykit.readers.sources import load_workspace
    from deploykit.run.flashers import FlashImage
    from deploykit.run.flashers import flash as do_flash

    b = load_board(board)
    if image is not None:
        image = Path(image)
        elf, uf2 = image.with_suffix(".elf"), image.with_suffix(".uf2")
        uf2_family = family_of(b).uf2_family(b)
        if image.suffix == ".elf" and not uf2.exists() and uf2_family:
            from deploykit.readers.uf2 import write_uf2

            write_uf2(elf, uf2, family=uf2_family)
    elif model is not None:
        fw = (out or default_out(board, model)) / "firmware"
        elf, uf2 = fw / "dk_runner.elf", fw / "dk_runner.uf2"
        if not elf.exists():
            raise ConfigError(f"No firmware built for {model} on {board}: {elf} is missing.",
                              f"Build it first: deploykit build --board {board} --model {model}")
    else:
        raise ConfigError("Nothing to flash.", "Give --model M (after `deploykit build`) or "
                          "--image FILE.uf2|FILE.elf.")
    ws = None
    with suppress(DeployKitError):
        ws = load_workspace(workspace)  # to build picotool from when it is missing
    return do_flash(b, FlashImage(elf, uf2), port=port, probe=probe, progress=progress,
                    workspace=ws)


def monitor(board: str, *, port: str | None = None, timeout: float = 60.0,
            out: Path | None = None, progress: Progress = _quiet):
    """Find the board's serial port (USB VID/PID, or --port) and decode one run's results."""
    from deploykit.run.runners.serial_port import MonitorReport, read_board

    b = load_board(board)
    run_dir = (out or default_out(board, "monitor")) / "run"
    result = read_board(b, run_dir, timeout_s=timeout, port=port, progress=progress)
    return MonitorReport.from_result(b.name, result)


def selftest(board: str, out: Path | None = None, workspace: Path | None = None,
             timeout: float = 30.0, progress: Progress = _quiet, variant: str = "ok"):
    """Board support + protocol check without ExecuTorch; `variant` "fault", "stack-overflow",
    "error" or "hang" makes the firmware fail on purpose and checks the host classifies it so
    (a hang: timed out, and on QEMU located in dk_selftest_hang_site)."""
    from deploykit.run.selftest import run_selftest

    b = load_board(board)
    out = out or default_out(board, f"selftest-{variant}")
    with out_lock(out):
        return run_selftest(b, out, timeout, progress, variant)


def farm_status(coordinator: str | None = None):
    """The places of a labgrid coordinator (`--coordinator` or LG_COORDINATOR): board kind,
    holder, and the outcome of deploykit's last run there (docs/farm.md)."""
    from deploykit.run.farm.session import FarmSession

    with FarmSession(coordinator) as session:
        return session.address, session.places()


def describe_places(address: str, places) -> str:
    lines = [f"labgrid coordinator {address}: {len(places)} place(s)",
             f"  {'place':<24} {'board':<12} {'holder':<24} last result"]
    for p in places:
        lines.append(f"  {p.name:<24} {p.board or '-':<12} {p.holder or 'free':<24} "
                     f"{p.last_result or '-'}")
    return "\n".join(lines)


def farm_exporter_config(board: str, serial: str, *, group: str | None = None,
                         probe: str | None = None, out: Path | None = None):
    """The labgrid exporter configuration of one board, from its board file; written to `out`
    (atomically) when given."""
    from deploykit.run.farm.exporter_config import exporter_config
    from deploykit.util.fsutil import write_atomic

    cfg = exporter_config(load_board(board), serial, group=group, probe=probe)
    if out is not None:
        write_atomic(Path(out), cfg.text)
    return cfg


def matrix(boards: list[str] | None = None, models: list[str] | None = None,
           flows: list[str] | None = None, profiles: list[str] | None = None,
           out: Path | None = None, workspace: Path | None = None, jobs: int = 1,
           progress: Progress = _quiet, patches: list[str] | None = None):
    """Build, and run where the board's runner is available, every board x model x flow x
    profile x patches setting the filter selects (None: every board, every model, each
    board's allowed flows, the speed profile, each board file's own patches setting); writes
    matrix.json, matrix.md and matrix.svg to `out` (default build/matrix). Returns the rows
    (matrix.MatrixRow), one per combination."""
    from deploykit.flows.patches import parse_patches
    from deploykit.pipeline.matrix import combinations, run_matrix, write_outputs
    from deploykit.pipeline.profiles import PROFILES
    from deploykit.program.imported import is_program_file
    from deploykit.program.models import list_models, resolve_model_path
    from deploykit.readers.boards import repo_root

    for name in profiles or []:
        if name not in PROFILES:
            raise ConfigError(f"Unknown profile '{name}'.", f"Use one of: {', '.join(PROFILES)}.")
    if jobs < 1:
        raise ConfigError(f"-j {jobs}: the number of workers must be at least 1.",
                          "Give -j 1 or more (each worker is one process).")
    out = Path(out or Path("build") / "matrix")
    settings: list[str | None] = [None]
    if patches:
        for setting in patches:
            parse_patches(setting)  # a bad setting fails here, before any build
        settings = [s.strip().lower() for s in dict.fromkeys(patches)]
    combos = combinations(boards or available_boards(),
                          models or list_models(repo_root()), flows, profiles or ["speed"],
                          settings)
    for name in {c.model for c in combos}:
        if not is_program_file(name):  # a .pte was read by combinations()
            resolve_model_path(name, repo_root())  # an unknown model fails here, not later
    rows = run_matrix(combos, out, workspace, jobs, progress)
    write_outputs(rows, out)
    return rows


def npu_sweep(board: str | None = None, model: str | None = None, *,
              macs: Sequence[int] | None = None, memory_modes: Sequence[str] | None = None,
              system_configs: Sequence[str] | None = None, jobs: int = 1,
              latency_target_ms: float | None = None, out: Path | None = None,
              progress: Progress = _quiet, project: ProjectChoice = None):
    """Vela's estimate of `model` at every Ethos-U configuration the board could have: each MAC
    count of its NPU family x each memory mode x each system configuration its board file
    lists (`macs`, `memory_modes`, `system_configs` narrow them), `jobs` Vela compiles at
    once, each point checked against the board's memory (the plan). The model is exported
    once (the ethos_u_int8 flow, through the export cache in `out`, default
    build/<board>/<model>); the table goes to <out>/npu-sweep/sweep.{json,md,svg}. Returns the
    pipeline.npu_sweep.SweepResult: the rows, the Pareto front, the chosen point (the fastest
    that fits, or with `latency_target_ms` the one meeting it with the least SRAM) and the
    command that builds it."""
    from deploykit.pipeline.chains import export_stage
    from deploykit.pipeline.npu_sweep import run_sweep, sweep_points, write_outputs

    if jobs < 1:
        raise ConfigError(f"-j {jobs}: the number of workers must be at least 1.",
                          "Give -j 1 or more (each worker is one process).")
    if latency_target_ms is not None and latency_target_ms <= 0:
        raise ConfigError(f"--latency-target {latency_target_ms:g} ms is not a latency.",
                          "Give the time one inference may take, in milliseconds, above 0.")
    cmd = command(board, model, project=project, flow="ethos_u_int8")
    npu = cmd.target.board.npu
    if npu is None:
        raise ConfigError(f"Board {cmd.target.board.name} has no NPU to sweep.",
                          "Use a board with an `npu:` section (corstone-300, corstone-320).")
    points = sweep_points(npu, list(macs or []), list(memory_modes or []),
                          list(system_configs or []))
    out = cmd.out(out)
    with out_lock(out):
        exported = export_stage(cmd.target, cmd.model, out, progress)
        result = run_sweep(cmd.target.board, str(cmd.model), exported.pte_path, points, jobs,
                           latency_target_ms, progress)
        result.files = write_outputs(result, out / "npu-sweep")
    return result
