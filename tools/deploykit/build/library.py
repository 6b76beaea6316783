"""The build stage of a library component (`deploykit library`, docs/library.md): models
already exported and planned (pipeline/library.py chains those stages) ->

    render the C API of each model (templates/library/) and the union of their operators
    -> build firmware/library/ (the runner's cached runtime, kernel selection, registration
       codegen and exact kernel registry; one registry for all the models)
    -> stage the component: include/, lib/ (every archive, in link order),
       lib/cmake/<package>/, README.md, manifest.json; then rename it into place

Built in `work`:
    work/generated/   board.cmake (the CPU flags) for the toolchain file
    work/sources/     the rendered API sources, each model's .pte, the merged ops.yaml
    work/build/       the CMake build of firmware/library
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from deploykit.build.cmake import cmake_build
from deploykit.build.firmware import toolchain_file
from deploykit.build.render import render_board_files, render_text
from deploykit.memory.plan import MemoryPlan
from deploykit.program.export import ExportResult
from deploykit.readers.boards import Board
from deploykit.readers.npu import npu_board_facts, npu_placement, npu_plan_sizes
from deploykit.readers.pte_reader import load_program, method_plan, read_pte_info
from deploykit.util.errors import BuildError, ConfigError
from deploykit.util.fsutil import write_atomic, write_if_changed
from deploykit.util.paths import data_root
from deploykit.util.version import deploykit_version

Progress = Callable[[str], None]

ARENA_ALIGN = 16  # the arena's parts, as the runner aligns its pools
NPU_ARENA_ALIGN = 32  # the NPU's scratch block: whole data-cache lines, as the runner's
# C names a model may not take: they would collide with the component's shared API
# (dk_npu_init, dk_lib_*, dk_error_name, ...).
RESERVED_NAMES = frozenset({"error_name", "abort_handler", "component_info", "ethos_u", "lib",
                            "dtype", "npu"})
LIBRARY_FILES = ("README.md", "manifest.json")


def c_name(model: str) -> str:
    """The C identifier of a model's API (dk_<name>_init): its file stem, lower case, every
    other character an underscore."""
    name = re.sub(r"[^a-z0-9_]", "_", Path(model).stem.lower())
    return f"m_{name}" if not name or name[0].isdigit() else name


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a model as the C header describes it (memory order)."""

    kind: str  # "input" or "output"
    index: int
    dtype: str  # numpy name: "int8", "float32"
    shape: tuple[int, ...]
    dim_order: tuple[int, ...]
    nbytes: int
    planned: bool  # lives in the planned buffers (else the program reads it in place)
    scale: float | None = None  # int8 with quantization parameters only
    zero_point: int = 0

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def context(self) -> dict[str, Any]:
        quant = None
        if self.scale is not None:
            quant = {"zero_point": self.zero_point, "scale_text": _c_float(self.scale)}
        return {"kind": self.kind, "KIND": self.kind.upper(), "index": self.index,
                "dtype": self.dtype, "shape": list(self.shape),
                "dim_order": list(self.dim_order), "nbytes": self.nbytes,
                "numel": self.numel, "quant": quant,
                "scale_literal": _c_float(self.scale or 0.0),
                "zero_point": self.zero_point if self.scale is not None else 0}


def _c_float(value: float) -> str:
    """A float32 C literal that reads back as exactly the same float32."""
    import numpy as np

    return f"{float(np.float32(value))!r}f"


@dataclass(frozen=True)
class ComponentModel:
    """One model of a component: its export, its memory and its API's name."""

    name: str  # C name: dk_<name>_init
    model: str
    flow: str
    export: ExportResult
    plan: MemoryPlan
    sizes_source: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    # deploykit's own runner of the same model and profile, when built (--fit builds it)
    runner_elf: Path | None = None

    @property
    def planned_total(self) -> int:
        return sum(_aligned(s) for s in self.plan.planned_buffers)

    @property
    def input_buffers(self) -> int:
        return sum(_aligned(t.nbytes) for t in self.inputs if not t.planned)

    @property
    def npu(self) -> bool:
        """Whether the program has Ethos-U delegates (the plan has the NPU's items)."""
        return bool(npu_placement(self.plan))

    @property
    def npu_scratch(self) -> int:
        """Vela's scratch of the largest delegate, from the plan; 0 without delegates."""
        return npu_plan_sizes(self.plan)[0]

    @property
    def npu_arena(self) -> int:
        """The NPU's block: the temp pool and the Vela scratch, one block (ExecuTorch's temp
        allocator, from which EthosUBackend takes the scratch), as the runner's .dk_npu_scratch;
        0 without delegates."""
        return _aligned(self.plan.temp_pool) + self.npu_scratch if self.npu else 0

    @property
    def arena(self) -> int:
        """The CPU's arena: method pool, temp pool (in the NPU's block instead for a model
        with Ethos-U delegates), planned buffers, the inputs read in place."""
        temp = 0 if self.npu else _aligned(self.plan.temp_pool)
        return (_aligned(self.plan.method_pool) + temp + self.planned_total
                + self.input_buffers)

    def npu_context(self) -> dict[str, Any] | None:
        if not self.npu:
            return None
        placement = npu_placement(self.plan)
        return {"scratch": self.npu_scratch, "arena": self.npu_arena, "align": NPU_ARENA_ALIGN,
                "section": f".bss.dk_npu_scratch.{self.name}",
                "scratch_region": placement["npu_scratch"], "model_region": placement["model"]}

    def context(self) -> dict[str, Any]:
        return {
            "name": self.name, "NAME": self.name.upper(), "model": self.model,
            "flow": self.flow, "pte_size": self.export.pte_size,
            "pte_sha256": self.export.pte_sha256,
            "inputs": [t.context() for t in self.inputs],
            "outputs": [t.context() for t in self.outputs],
            "method_pool": self.plan.method_pool, "temp_pool": self.plan.temp_pool,
            "planned_buffers": list(self.plan.planned_buffers),
            "planned_total": self.planned_total, "input_buffers": self.input_buffers,
            "arena": self.arena, "align": ARENA_ALIGN, "sizes_source": self.sizes_source,
            "npu": self.npu_context(),
        }


def _aligned(n: int) -> int:
    return (n + ARENA_ALIGN - 1) // ARENA_ALIGN * ARENA_ALIGN


@dataclass(frozen=True)
class Component:
    """A built component: where it is and what it holds."""

    directory: Path
    name: str
    package: str
    target: str
    board: str
    models: tuple[ComponentModel, ...]
    manifest: dict[str, Any]

    def summary(self) -> str:
        lines = [f"{self.directory}: {self.package} for {self.board}, target {self.target}"]
        for m in self.models:
            if m.npu:
                temp = (f"NPU arena {m.npu_arena:,} B in .bss.dk_npu_scratch.{m.name} (temp "
                        f"{m.plan.temp_pool:,} + Vela scratch {m.npu_scratch:,}; plan: region "
                        f"{npu_placement(m.plan)['npu_scratch']}), ")
                pools = (f"(method {m.plan.method_pool:,}, planned {m.planned_total:,}, inputs "
                         f"{m.input_buffers:,}; {m.sizes_source}), {temp}")
            else:
                pools = (f"(method {m.plan.method_pool:,}, temp {m.plan.temp_pool:,}, planned "
                         f"{m.planned_total:,}, inputs {m.input_buffers:,}; {m.sizes_source}), ")
            lines.append(f"  {m.model} ({m.flow}): include/dk_{m.name}.h, arena {m.arena:,} B "
                         f"{pools}program {m.export.pte_size:,} B")
        npu = self.manifest.get("npu")
        if npu:
            lines.append(f"  NPU {npu['target']} ({npu['memory_mode']}): call dk_npu_init("
                         f"(void *)DK_NPU_BASE /* 0x{npu['base']:08X} */, ...) at start-up and "
                         f"put dk_npu_irq_handler in vector slot 16 + DK_NPU_IRQ ({npu['irq']}) "
                         "of your vector table (include/deploykit.h)")
        lines.append(f"  use it: find_package({self.package} CONFIG REQUIRED PATHS "
                     f"{self.directory} NO_CMAKE_FIND_ROOT_PATH); "
                     f"target_link_libraries(app PRIVATE {self.target})")
        return "\n".join(lines)


def io_specs(result: ExportResult) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """The inputs and outputs of an export as the program holds them: dtype, logical shape,
    memory (dim) order, bytes, whether planned, and the int8 quantization parameters of an
    int8 tensor (int8 model I/O)."""
    data = result.pte_path.read_bytes()
    info = read_pte_info(data)
    plan = method_plan(load_program(data, str(result.pte_path)), "forward",
                       str(result.pte_path))

    def planned(value_index: int) -> bool:
        tensor = plan.values[value_index].val
        return getattr(tensor, "allocation_info", None) is not None

    def specs(kind: str, tensors, indices, quant) -> tuple[TensorSpec, ...]:
        out = []
        for i, (t, v, q) in enumerate(zip(tensors, indices, quant, strict=True)):
            scaled = q is not None and t.dtype == "int8"
            out.append(TensorSpec(kind, i, t.dtype, tuple(t.sizes), tuple(t.dim_order),
                                  t.nbytes, planned(v), q.scale if scaled else None,
                                  q.zero_point if scaled else 0))
        return tuple(out)

    return (specs("input", info.inputs, plan.inputs, result.input_quant),
            specs("output", info.outputs, plan.outputs, result.output_quant))


def merged_ops_yaml(paths: Sequence[Path]) -> str:
    """The union of several gen_oplist operator lists: one runtime, one registration, one
    registry for all the models (each operator once, each kernel variant once)."""
    docs = [yaml.safe_load(p.read_text()) or {} for p in paths]
    merged: dict[str, Any] = dict(docs[0])
    operators: dict[str, Any] = {}
    metadata_: dict[str, list] = {}
    for doc in docs:
        for name, entry in (doc.get("operators") or {}).items():
            entry = dict(entry or {})
            entry.pop("debug_info", None)  # names one model's file: not the union's
            operators.setdefault(name, entry)
        for name, variants in (doc.get("et_kernel_metadata") or {}).items():
            known = metadata_.setdefault(name, [])
            known.extend(v for v in variants if v not in known)
    merged["operators"] = dict(sorted(operators.items()))
    if metadata_ or "et_kernel_metadata" in merged:
        merged["et_kernel_metadata"] = {k: sorted(v, key=str) for k, v in sorted(metadata_.items())}
    return yaml.safe_dump(merged, sort_keys=True)


def component_name(names: Sequence[str], name: str | None) -> str:
    if name is None:
        return "_".join(names)
    cleaned = c_name(name)
    if cleaned != name:
        raise ConfigError(f"The component name {name!r} is not a C identifier.",
                          f"Use --name {cleaned}.")
    return name


def check_names(models: Sequence[str]) -> list[str]:
    """Each model's C name, checked: names never collide with each other or with the
    component's shared API."""
    names = [c_name(m) for m in models]
    seen: dict[str, str] = {}
    for model, name in zip(models, names, strict=True):
        if name in seen:
            raise ConfigError(f"Models {seen[name]!r} and {model!r} both get the C name "
                              f"dk_{name}_*.", "Give each model only once, or rename one "
                              "model file.")
        if name in RESERVED_NAMES:
            raise ConfigError(f"Model {model!r} would be named dk_{name}_*, which the "
                              "component's shared API uses.", "Rename the model file.")
        seen[name] = model
    return names


def _errors_context() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from deploykit.build.error_table import load_entries

    entries = load_entries()
    errors = [{"code": 0, "name": "OK"}] + [{"code": e.code, "name": e.name} for e in entries
                                             if e.code != 0]
    executorch = [{"code": e.code, "meaning": e.meaning,
                   "c_name": re.sub(r"(?<!^)(?=[A-Z])", "_", e.name).upper()}
                  for e in entries if e.source == "executorch" and e.code != 0]
    return errors, executorch


def render_component_sources(models: Sequence[ComponentModel], component: str, board: Board,
                             out_dir: Path, info: str) -> list[Path]:
    """The API sources (include/deploykit.h, include/dk_<name>.h, deploykit.c,
    dk_<name>.cpp, dk_<name>_program.c + <name>.pte) and component.cmake, into `out_dir`.
    Models with Ethos-U delegates add the NPU's part of deploykit.h (npu_context)."""
    errors, executorch_errors = _errors_context()
    common = {"component": component, "board": board.name, "cpu_flags": board.cpu_flags,
              "models": [m.context() for m in models], "npu": npu_context(board, models)}
    files: dict[Path, str | bytes] = {
        out_dir / "include" / "deploykit.h": render_text(
            "library/deploykit.h.j2", {**common, "executorch_errors": executorch_errors}),
        out_dir / "include" / "dk_errors.h":
            (data_root() / "firmware" / "protocol" / "dk_errors.h").read_bytes(),
        out_dir / "deploykit.c": render_text("library/deploykit.c.j2",
                                             {"errors": errors, "info": info}),
        out_dir / "component.cmake": render_text("library/component.cmake.j2", common),
    }
    for m in models:
        ctx = {**common, "m": m.context()}
        files[out_dir / "include" / f"dk_{m.name}.h"] = render_text("library/dk_model.h.j2", ctx)
        files[out_dir / f"dk_{m.name}.cpp"] = render_text("library/dk_model.cpp.j2", ctx)
        files[out_dir / f"dk_{m.name}_program.c"] = render_text("library/dk_model_program.c.j2",
                                                                ctx)
        files[out_dir / f"{m.name}.pte"] = m.export.pte_path.read_bytes()
    for path, text in files.items():
        write_if_changed(path, text)
    return sorted(files)


def _cpu_flag(flags: Sequence[str], prefix: str, default: str) -> str:
    return next((f[len(prefix):] for f in flags if f.startswith(prefix)), default)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stage_component(*, directory: Path, component: str, board: Board,
                    models: Sequence[ComponentModel], sources: Path, archives: Sequence[Path],
                    build_facts: dict[str, str], profile: str, et_commit: str,
                    versions: dict[str, str],
                    fvp_command: Sequence[str] | None = None) -> dict[str, Any]:
    """Write the component into a fresh directory beside `directory`, then rename it into
    place: include/, lib/, lib/cmake/<package>/, README.md, manifest.json. `fvp_command`: how
    an application image runs on the board's FVP (README's NPU section)."""
    package, target = f"deploykit_{component}", f"deploykit::{component}"
    *libraries, libc = archives
    staging = directory.parent / f".{directory.name}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "include").mkdir(parents=True)
    (staging / "lib").mkdir()
    for header in sorted((sources / "include").glob("*.h")):
        shutil.copyfile(header, staging / "include" / header.name)
    names = []
    for archive in (*libraries, libc):
        name = archive.name
        if name in names:
            raise BuildError(f"Two archives of the component are named {name}.",
                             "A firmware/library/CMakeLists.txt defect: report it.")
        names.append(name)
        shutil.copyfile(archive, staging / "lib" / name)
    lto = build_facts.get("lto") == "ON"
    compiler_version = build_facts.get("compiler", "GNU ?").split()[-1]
    aliases = [f"deploykit::{m.name}" for m in models if m.name != component]
    config = {"package": package, "target": target, "board": board.name,
              "cpu_flags": board.cpu_flags, "models": [m.context() for m in models],
              "mcpu": _cpu_flag(board.cpu_flags, "-mcpu=", "(none)"),
              "float_abi": _cpu_flag(board.cpu_flags, "-mfloat-abi=", "soft"),
              "archives": names[:-1], "libc_archive": names[-1], "lto": lto,
              "compiler_version": compiler_version, "aliases": aliases,
              "version": deploykit_version()}
    cmake_dir = staging / "lib" / "cmake" / package
    cmake_dir.mkdir(parents=True)
    write_atomic(cmake_dir / f"{package}Config.cmake", render_text("library/Config.cmake.j2",
                                                                     config))
    write_atomic(cmake_dir / f"{package}ConfigVersion.cmake",
                 render_text("library/ConfigVersion.cmake.j2", config))
    npu = npu_context(board, models)
    manifest = {
        "schema_version": 1,
        "component": component, "package": package, "target": target,
        "aliases": aliases,
        "board": board.name, "cpu": board.cpu["core"], "cpu_flags": board.cpu_flags,
        "float_abi": config["float_abi"],
        "profile": profile,
        "executorch": {"version": versions.get("executorch", "?"), "commit": et_commit},
        "deploykit": deploykit_version(),
        "compiler": build_facts.get("compiler", ""), "lto": lto,
        "et_runtime": build_facts.get("et_runtime", ""),
        "max_kernel_num": int(build_facts.get("max_kernel_num", "0") or 0),
        "models": [{
            "name": m.name, "model": m.model, "flow": m.flow, "header": f"include/dk_{m.name}.h",
            "program_section": f".dk_model.{m.name}", "program_bytes": m.export.pte_size,
            "pte_sha256": m.export.pte_sha256, "operators": list(m.export.op_list),
            "sizes": {"method_pool": m.plan.method_pool, "temp_pool": m.plan.temp_pool,
                      "planned": m.planned_total, "input_buffers": m.input_buffers,
                      "arena": m.arena, "source": m.sizes_source,
                      **({"npu_scratch": m.npu_scratch, "npu_arena": m.npu_arena}
                         if m.npu else {})},
            **({"npu_arena_section": f".bss.dk_npu_scratch.{m.name}",
                "npu_arena_region": npu_placement(m.plan)["npu_scratch"],
                "program_region": npu_placement(m.plan)["model"]} if m.npu else {}),
            "inputs": [t.context() for t in m.inputs],
            "outputs": [t.context() for t in m.outputs],
        } for m in models],
        **({"npu": {k: npu[k] for k in ("target", "type", "macs", "base", "irq",
                                        "secure_enable", "privilege_enable", "security",
                                        "memory_mode", "fast_scratch")}
            | {"regions": {k: r["name"] for k, r in npu["regions"].items()}}}
           if npu else {}),
    }
    readme = render_text("library/README.md.j2", {**config, "manifest": manifest, "npu": npu,
                                                  "fvp_command": shlex.join(fvp_command)
                                                  if fvp_command else "",
                                                  "flows": sorted({m.flow for m in models}),
                                                  "profile": profile,
                                                  "et_commit": et_commit,
                                                  "et_version": versions.get("executorch", "?")})
    write_atomic(staging / "README.md", readme)
    manifest["files"] = {str(p.relative_to(staging)): _sha256(p)
                         for p in sorted(staging.rglob("*")) if p.is_file()}
    write_atomic(staging / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    # Into place: the old component (if any) is moved aside first, then removed.
    old = directory.parent / f".{directory.name}.old"
    shutil.rmtree(old, ignore_errors=True)
    if directory.exists():
        directory.rename(old)
    staging.rename(directory)
    shutil.rmtree(old, ignore_errors=True)
    return manifest


def build_component(board: Board, parts: Sequence[ComponentModel], component: str, out: Path,
                    work: Path, definitions: dict[str, str], *, profile: str, et_commit: str,
                    progress: Progress, fvp_command: Sequence[str] | None = None) -> Component:
    """Render the API of `parts`, build firmware/library/ in `work` with `definitions` (the
    workspace's sources, the runtime cache, the profile's and the flow's options) and stage
    the component in `out`."""
    sources, generated, build_dir = work / "sources", work / "generated", work / "build"
    ops_yaml = sources / "ops.yaml"
    write_if_changed(ops_yaml, merged_ops_yaml([p.export.ops_yaml_path for p in parts]))
    versions = json.loads(parts[0].export.report_path.read_text()).get("versions", {})
    flows = ", ".join(sorted({p.flow for p in parts}))
    info = (f"deploykit library {deploykit_version()}, ExecuTorch "
            f"{versions.get('executorch', '?')} ({et_commit[:12]}), {flows}, profile "
            f"{profile}, {board.name}")
    render_component_sources(parts, component, board, sources, info)
    render_board_files(board, generated)
    progress(f"building component {component} for {board.name}, profile {profile} (the "
             "ExecuTorch runtime is cached per board and options)")
    cmake_build(data_root() / "firmware" / "library", build_dir,
                {"DK_GENERATED_DIR": str(generated.resolve()),
                 "DK_LIBRARY_SOURCES": str(sources.resolve()),
                 "DK_OPS_YAML": str(ops_yaml.resolve()), **definitions},
                toolchain_file(), progress=progress)
    archives = [Path(line) for line in
                (build_dir / "dk-library-archives.txt").read_text().splitlines() if line]
    missing = [str(a) for a in archives if not a.is_file()]
    if missing:
        raise BuildError(f"The component build finished without {', '.join(missing)}.",
                         "Run it again; if it persists, see the build log.",
                         log_path=str(build_dir / "build.log"))
    facts = dict(line.split("=", 1) for line in
                 (build_dir / "dk-library-build.txt").read_text().splitlines() if "=" in line)
    manifest = stage_component(directory=out, component=component, board=board, models=parts,
                               sources=sources, archives=archives, build_facts=facts,
                               profile=profile, et_commit=et_commit, versions=versions,
                               fvp_command=fvp_command)
    return Component(out, component, manifest["package"], manifest["target"], board.name,
                     tuple(parts), manifest)


def _size_text(n: int) -> str:
    if n and n % (1 << 20) == 0:
        return f"{n >> 20} MiB"
    return f"{n >> 10} KiB" if n and n % 1024 == 0 else f"{n:,} B"


AXI_PORTS = {"sram": "AXI0, the NPU's SRAM port", "ext": "AXI1, the NPU's external port"}


def npu_context(board: Board, models: Sequence[ComponentModel]) -> dict[str, Any] | None:
    """What deploykit.h, the README and the manifest say about the board's NPU, or None when no
    model has Ethos-U delegates: the board file's facts (npu_board_facts: the base address in
    the security state the code runs in, the IRQ, ethosu_init's settings) and where the plan put
    the program, the scratch and the fast arena (npu_placement: the Vela memory mode's
    regions), with each region's address, size and NPU port."""
    npu_models = [m for m in models if m.npu]
    if not npu_models or board.npu is None:
        return None
    facts = npu_board_facts(board)
    assert facts is not None
    placement = npu_placement(npu_models[0].plan)
    fast = max(npu_plan_sizes(m.plan)[1] for m in npu_models)
    regions = {}
    for kind in ("model", "npu_scratch", "npu_fast"):
        if kind == "npu_fast" and not fast:
            continue
        region = board.region(placement[kind])
        port = next((p for p, name in (("sram", board.npu.sram_region),
                                       ("ext", board.npu.ext_region)) if name == region.name),
                    None)
        regions[kind] = {"name": region.name, "origin": region.origin, "size": region.size,
                         "size_text": _size_text(region.size),
                         "port": AXI_PORTS.get(port or "", "")}
    return {**facts, "name": facts["type"].replace("ethos-u", "Ethos-U"),
            "NAME": facts["type"].upper().replace("-", "_"),
            "ns_base": board.npu.ns_base, "exception": facts["irq"] + 16,
            "memory_mode": board.npu.memory_mode, "fast_scratch": fast, "regions": regions,
            "models": [m.name for m in npu_models]}
