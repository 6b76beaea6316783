"""An ExecuTorch program made elsewhere (a `.pte`) as the model: what it needs, checked against
the board before anything is compiled, and its export directory.

A `.pte` already is what the export stage makes, so nothing is lowered. Instead:

- `read_program` reads it once: that the pinned runtime can load its format (the flatbuffer's
  file identifier, `ET12` for ExecuTorch 1.4.1), and which runtime it needs, which decides the
  flow: an EthosUBackend delegate -> ethos_u_int8 (with the Vela target, MAC count and memory
  mode it was compiled for); an XnnpackBackend delegate -> an xnnpack flow; `cortex_m::`
  operators -> cortex_m_int8; else portable_fp32. Another delegate is refused.
- `check_for_board` refuses a program the board cannot run, naming both sides: an NPU program
  for another NPU, CMSIS-NN operators on a Cortex-A core, XNNPACK on a microcontroller.
- `import_program` writes the export directory the later stages read (model.pte, ops.yaml,
  reference.npz, export.json; program/export.py): the operators and their kernel coverage come
  from the program itself; the inputs from `--inputs`, else deterministic real-valued data of
  the program's shapes and dtypes; the reference from `--expect FILE.npz`, else the program
  run on the host (the ExecuTorch pybindings where they have its kernels, as the flows do;
  else its operators' torch implementations, program/pte_interpreter.py), else none: a program
  with an NPU delegate and no expected outputs is run but not compared (NO_REFERENCE).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploykit.program.export import (
    OPS_YAML_NAME,
    PTE_NAME,
    REFERENCE_NAME,
    REPORT_NAME,
    REPORT_SCHEMA_VERSION,
    ExportResult,
    gen_oplist_yaml,
    load_export,
    ops_from_yaml,
    remove_outputs,
)
from deploykit.program.inspect import ProgramInfo, inspect_pte
from deploykit.readers.npu import ETHOS_U_BACKEND, parse_target
from deploykit.readers.op_coverage import check_coverage
from deploykit.readers.pte_reader import load_program, method_plan, operator_names
from deploykit.util.errors import ConfigError
from deploykit.util.fsutil import write_atomic
from deploykit.util.isolated import run_isolated
from deploykit.util.version import deploykit_version

if TYPE_CHECKING:
    import numpy as np

    from deploykit.flows.base import Flow, QuantParams
    from deploykit.readers.boards import Board

PROGRAM_SUFFIX = ".pte"
XNNPACK_BACKEND = "XnnpackBackend"
# The reference kinds of an imported program (export.json's reference.kind).
PYBINDINGS_REFERENCE = "executorch-pybindings"
INTERPRETER_REFERENCE = "host run of the program's operators (torch; cortex_m: their Python " \
    "reference, modelled on CMSIS-NN)"
EXPECTED_REFERENCE = "expected outputs"
NO_REFERENCE = "none"


@dataclass(frozen=True)
class ForeignProgram:
    """A `.pte` given as the model, read once: which flow's runtime runs it and why, and the
    NPU it was compiled for. `expect`: the expected outputs given with it (--expect)."""

    path: Path
    info: ProgramInfo
    flow: str
    reason: str  # what in the program chose the flow
    npu_target: str | None = None  # Vela's accelerator config, e.g. "ethos-u85-256"
    npu_memory_mode: str | None = None
    npu_system_config: str | None = None
    expect: Path | None = None

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def delegates_npu(self) -> bool:
        return self.npu_target is not None

    @property
    def npu_type(self) -> str | None:
        return parse_target(self.npu_target)[0] if self.npu_target else None

    @property
    def npu_macs(self) -> int | None:
        return parse_target(self.npu_target)[1] if self.npu_target else None


def is_program_file(model: str | Path | None) -> bool:
    return model is not None and str(model).endswith(PROGRAM_SUFFIX)


def runtime_identifier() -> bytes:
    """The file identifier of the programs the pinned runtime loads (program.fbs's)."""
    from importlib import resources

    try:
        schema = resources.files("executorch.exir._serialize").joinpath("program.fbs")
        found = re.search(rb'file_identifier\s+"([^"]{4})"', schema.read_bytes())
    except (OSError, ModuleNotFoundError):
        found = None
    return found.group(1) if found else b"ET12"


def check_format(data: bytes, path: Path) -> None:
    """The pinned runtime can load a program of this format (before anything else reads it)."""
    import executorch.version as etv

    version = getattr(etv, "__version__", "?")
    wanted = runtime_identifier()
    found = data[4:8]
    if len(data) < 8 or not found.startswith(b"ET"):
        raise ConfigError(f"{path} is not an ExecuTorch program: it has no ExecuTorch file "
                          f"identifier (found {found!r}; a program has {wanted.decode()}).",
                          "Give a .pte made by ExecuTorch's to_executorch() (or a model file).")
    if found != wanted:
        raise ConfigError(
            f"{path} is an ExecuTorch program of format {found.decode(errors='replace')}; the "
            f"pinned runtime (ExecuTorch {version}) loads format {wanted.decode()} only.",
            f"Export it again with ExecuTorch {version} (the version deploykit builds the "
            "runtime from), or give the model's Python file instead.")


def read_program(path: Path, expect: Path | None = None) -> ForeignProgram:
    """Read a `.pte` given as the model (module docstring)."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise ConfigError(f"Program {path} does not exist.",
                          "Check the path of the .pte (or give a model name or Python file).")
    check_format(path.read_bytes(), path)
    info = inspect_pte(path)
    backends = sorted({d.backend for d in info.delegates})
    unknown = [b for b in backends if b not in (ETHOS_U_BACKEND, XNNPACK_BACKEND)]
    if unknown:
        raise ConfigError(f"{path} calls the {', '.join(unknown)} delegate, which no runtime "
                          "deploykit builds has.",
                          f"deploykit's runtimes have {ETHOS_U_BACKEND} (Ethos-U boards) and "
                          f"{XNNPACK_BACKEND} (Cortex-A boards); lower the model for one of "
                          "them, or without a partitioner.")
    if len(backends) > 1:
        raise ConfigError(f"{path} calls both {' and '.join(backends)}.",
                          "A board's runtime has one of them: lower the model for one.")
    if expect is not None and not Path(expect).is_file():
        raise ConfigError(f"--expect {expect}: no such file.",
                          "Give an .npz of the expected outputs (output_0, output_1, ...).")
    expect = Path(expect).resolve() if expect is not None else None
    if backends == [ETHOS_U_BACKEND]:
        targets = sorted({d.target for d in info.delegates if d.target})
        modes = sorted({d.memory_mode for d in info.delegates if d.memory_mode})
        configs = sorted({d.system_config for d in info.delegates if d.system_config})
        if len(targets) != 1:
            raise ConfigError(f"{path}: its Ethos-U delegates name "
                              f"{', '.join(targets) or 'no'} Vela target.",
                              "Compile every delegate of the program for one NPU.")
        return ForeignProgram(path, info, "ethos_u_int8",
                              f"an {ETHOS_U_BACKEND} delegate compiled by Vela for "
                              f"{targets[0]}", targets[0], modes[0] if modes else None,
                              configs[0] if configs else None, expect)
    if backends == [XNNPACK_BACKEND]:
        quantized = any(op.startswith("quantized_decomposed::") for op in info.operators) or \
            any(q is not None for q in output_quant(path))
        return ForeignProgram(path, info, "xnnpack_int8" if quantized else "xnnpack_fp32",
                              f"an {XNNPACK_BACKEND} delegate", expect=expect)
    cortex_m = [op for op in info.operators if op.startswith("cortex_m::")]
    if cortex_m:
        return ForeignProgram(path, info, "cortex_m_int8",
                              f"cortex_m:: operators (CMSIS-NN): {', '.join(cortex_m)}",
                              expect=expect)
    return ForeignProgram(path, info, "portable_fp32", "portable operators only",
                          expect=expect)


def check_for_board(program: ForeignProgram, board: Board) -> None:
    """Refuse a program `board` cannot run, naming both sides (before anything is compiled)."""
    core = board.cpu.get("core", "?")
    npu = board.npu
    if program.npu_target is not None:
        if npu is None:
            raise ConfigError(f"{program.path} has {program.reason}; board {board.name} has "
                              f"no NPU (a {core}).",
                              "Run it on a board with that NPU (deploykit boards), or give the "
                              "model compiled without the Ethos-U partitioner.")
        if npu.type != program.npu_type:
            raise ConfigError(f"{program.path} has {program.reason}; board {board.name} has "
                              f"an {npu.target} NPU.",
                              f"Run it on a board with an {program.npu_type} "
                              "(deploykit boards lists the NPU of each), or compile the model "
                              f"for {npu.target}.")
    allowed = board.export["allowed"]
    if program.flow in allowed:
        return
    if program.flow == "cortex_m_int8":
        raise ConfigError(f"{program.path} has {program.reason}, kernels for Cortex-M cores; "
                          f"board {board.name} is a {core}, whose runtime has none (its flows: "
                          f"{', '.join(allowed)}).",
                          "Run it on a Cortex-M board, or lower the model without the Cortex-M "
                          "passes (portable operators), or for XNNPACK.")
    if program.flow.startswith("xnnpack"):
        raise ConfigError(f"{program.path} has {program.reason}, which deploykit builds for "
                          f"Cortex-A Linux boards; board {board.name} is a {core} (its flows: "
                          f"{', '.join(allowed)}).",
                          "Run it on a Cortex-A board (rpi5, rpi4), or lower the model without "
                          "the XNNPACK partitioner.")
    raise ConfigError(f"{program.path} needs the {program.flow} runtime ({program.reason}); "
                      f"board {board.name} allows {', '.join(allowed)}.",
                      "Run it on a board that allows that flow (deploykit boards).")


# ---- the export directory of an imported program ------------------------------------------


# The largest input deploykit makes up (a program's inputs of more elements are given).
MAX_GENERATED_ELEMENTS = 1 << 25


def deterministic_inputs(program: ProgramInfo) -> list[np.ndarray]:
    """Real-valued data of the program's input shapes and dtypes, the same on every call: a
    smooth pattern in [-1, 1] (scaled to an integer type's range)."""
    import numpy as np

    arrays = []
    for k, tensor in enumerate(program.inputs):
        shape = tuple(int(s) for s in tensor.sizes)
        n = math.prod(shape)
        if n > MAX_GENERATED_ELEMENTS:
            raise ConfigError(f"Input {k} of {program.path} has {n:,} elements; deploykit "
                              f"makes inputs of up to {MAX_GENERATED_ELEMENTS:,}.",
                              "Give the inputs with --inputs DIR.")
        try:
            dtype = np.dtype(tensor.dtype_name) if tensor.dtype_name != "bfloat16" else None
        except TypeError:  # a scalar type numpy has no name for
            dtype = np.dtype(object)
        if dtype is None:
            raise ConfigError(f"Input {k} of {program.path} is bfloat16.",
                              "Give the inputs with --inputs DIR.")
        i = np.arange(n, dtype=np.float64)
        wave = 0.9 * np.sin(0.37 * i + 0.61 * k) * np.cos(0.011 * i)
        if dtype.kind == "f":
            data = wave.astype(dtype)
        elif dtype.kind == "b":
            data = wave > 0
        elif dtype.kind in "iu":
            info = np.iinfo(dtype)
            low, high = max(info.min, -128), min(info.max, 127)
            data = np.round(low + (wave + 1) / 2 * (high - low)).astype(dtype)
        else:
            raise ConfigError(f"Input {k} of {program.path} is {tensor.dtype_name}.",
                              "Give the inputs with --inputs DIR.")
        arrays.append(data.reshape(shape))
    return arrays


def _placeholder(program: ForeignProgram, k: int, tensor: Any) -> np.ndarray:
    """Zeros in the shape of output `k`, where there is no reference to compare with."""
    import numpy as np

    n = math.prod(int(s) for s in tensor.sizes)
    try:
        dtype = np.dtype(tensor.dtype_name)
    except TypeError:
        dtype = None
    if dtype is None or n > MAX_GENERATED_ELEMENTS:
        raise ConfigError(f"Output {k} of {program.path} is {tensor.dtype_name} "
                          f"{list(tensor.sizes)}, which deploykit cannot hold on the host.",
                          "The file is damaged, or not a program for this ExecuTorch: export "
                          "it again.")
    return np.zeros(tuple(int(s) for s in tensor.sizes), dtype=dtype)


def output_quant(path: Path) -> list[QuantParams | None]:
    """Each output's quantization when the program ends in a dequantize of constant
    parameters (its int8 step sets the default tolerance), else None."""
    return _io_quant(path, "outputs")


def input_quant(path: Path) -> list[QuantParams | None]:
    """Each input's quantization when the program starts with a quantize of it."""
    return _io_quant(path, "inputs")


def _io_quant(path: Path, which: str) -> list[QuantParams | None]:
    from deploykit.flows.base import QuantParams

    data = Path(path).read_bytes()
    plan = method_plan(load_program(data, str(path)), "forward", str(path))
    names = operator_names(plan)
    wanted = "dequantize_per_tensor" if which == "outputs" else "quantize_per_tensor"
    found: dict[int, QuantParams] = {}
    for chain in plan.chains:
        for instr in chain.instructions:
            call = instr.instr_args
            if type(call).__name__ != "KernelCall":
                continue
            op = names[call.op_index].split("::")[-1].split(".")[0]
            if op != wanted or len(call.args) < 6:
                continue
            tensor, scale, zero, qmin, qmax = call.args[:5]
            key = call.args[6] if which == "outputs" and len(call.args) > 6 else tensor
            vals = [plan.values[i].val for i in (scale, zero, qmin, qmax)]
            try:
                params = QuantParams(float(vals[0].double_val), int(vals[1].int_val),
                                     int(vals[2].int_val), int(vals[3].int_val), "int8")
            except (AttributeError, TypeError, ValueError):
                continue
            found.setdefault(key, params)
    indices = plan.outputs if which == "outputs" else plan.inputs
    return [found.get(i) for i in indices]


def host_reference(program: ForeignProgram) -> tuple[str, Any] | None:
    """How the program runs on the host, and a function of its input sets to their outputs:
    the ExecuTorch pybindings when they have its kernels and delegates, else its operators'
    torch implementations when it has no delegate, else None. The function runs in a child
    process (util/isolated.py): a damaged program can make either crash or loop."""
    from deploykit.program import pte_interpreter

    data = program.path.read_bytes()
    _check_host_memory(program)
    hint = "The file is damaged, or not a program for this ExecuTorch: export it again."
    if _pybindings_run(program.info):
        def on_pybindings(sets: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
            import torch
            from executorch.runtime import Runtime

            # The runtime reads the program in place: `data` and `loaded` live as long as the
            # method (a freed buffer under a delegate crashes the process).
            try:
                loaded = Runtime.get().load_program(data)
                method = loaded.load_method("forward")
            except RuntimeError as exc:  # the runtime's Error code, as the pybindings raise it
                raise ConfigError(f"The ExecuTorch runtime does not load {program.path}: "
                                  f"{exc}.", hint) from exc
            except MemoryError as exc:  # std::bad_alloc: the memory the program plans
                raise ConfigError(f"The host cannot allocate the memory {program.path} plans "
                                  f"({program.info.planned_total:,} B).", hint) from exc
            outputs = []
            for xs in sets:
                try:
                    out = method.execute([torch.from_numpy(x.copy()) for x in xs])
                except RuntimeError as exc:
                    raise ConfigError(f"{program.path} fails on the host's ExecuTorch "
                                      f"runtime: {exc}.", hint) from exc
                outputs.append([t.detach().numpy().copy() for t in out
                                if isinstance(t, torch.Tensor)])
            return outputs

        return PYBINDINGS_REFERENCE, _isolated(program, on_pybindings, hint)
    if pte_interpreter.why_not_interpretable(data, str(program.path)) is None:
        def on_torch(sets: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
            return [pte_interpreter.run_program(data, xs, str(program.path)) for xs in sets]

        return INTERPRETER_REFERENCE, _isolated(program, on_torch, hint)
    return None


# Host time ExecuTorch's operator lister may take (it reads the program once).
LIST_TIMEOUT_S = 60.0
# Host time a reference may take: a floor, and a generous rate for the MACs of its CPU
# kernels (the portable kernels run a few hundred MMAC/s on a host; this allows 20 MMAC/s).
REFERENCE_FLOOR_S = 5.0
REFERENCE_MACS_PER_S = 2e7


def _isolated(program: ForeignProgram, compute: Any, hint: str) -> Any:
    macs = program.info.costs.macs if program.info.costs is not None else 0

    def run(sets: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
        budget = REFERENCE_FLOOR_S + len(sets) * macs / REFERENCE_MACS_PER_S
        return run_isolated(lambda: compute(sets), budget,
                            f"The host reference of {program.path}", hint)

    return run


def _check_host_memory(program: ForeignProgram) -> None:
    """A program that plans more memory than the host has is refused before the host's
    runtime tries to allocate it (a damaged program can plan terabytes)."""
    import os

    planned = program.info.planned_total
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if planned > physical:
        raise ConfigError(f"{program.path} plans {planned:,} B of memory, more than this "
                          f"host's {physical:,} B: it cannot run here.",
                          "If the file is damaged, export it again; else give the expected "
                          "outputs with --expect FILE.npz.")


def _pybindings_run(info: ProgramInfo) -> bool:
    from executorch.extension.pybindings import portable_lib

    kernels = set(portable_lib._get_operator_names())
    backends = set(portable_lib._get_registered_backend_names())
    return set(info.operators) <= kernels and {d.backend for d in info.delegates} <= backends


def expected_outputs(program: ForeignProgram) -> list[np.ndarray]:
    """The outputs of --expect FILE.npz (output_0, output_1, ...; or arr_0, ...), checked
    against the program's outputs (count, shape; cast to the output's dtype)."""
    import numpy as np

    assert program.expect is not None
    try:
        with np.load(program.expect) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--expect {program.expect}: not a readable .npz ({exc}).",
                          "Save it with numpy.savez(path, output_0=..., ...).") from exc
    n = len(program.info.outputs)
    keys = [f"output_{i}" for i in range(n)]
    if not all(k in arrays for k in keys):
        keys = [f"arr_{i}" for i in range(n)]
    if not all(k in arrays for k in keys):
        raise ConfigError(f"--expect {program.expect} holds {', '.join(sorted(arrays)) or '-'}; "
                          f"{program.path.name} has {n} output(s).",
                          "Name them output_0, output_1, ... (numpy.savez(path, output_0=a)).")
    out = []
    for i, (key, tensor) in enumerate(zip(keys, program.info.outputs, strict=True)):
        array = arrays[key]
        if tuple(array.shape) != tuple(tensor.sizes):
            raise ConfigError(f"--expect {program.expect}: {key} is {list(array.shape)}; output "
                              f"{i} of {program.path.name} is {list(tensor.sizes)}.",
                              "Give the outputs of this program, in its shapes.")
        out.append(np.ascontiguousarray(array.astype(tensor.dtype_name)))
    return out


def import_key(program: ForeignProgram, flow: Flow, cpu: str, settings: dict | None,
               inputs_digest: str) -> str:
    """Everything an import depends on: the program, the expected outputs, the flow and target,
    the inputs, this importer's code and deploykit's version."""
    package = Path(__file__).parents[1]
    code = [package / "program" / n for n in ("imported.py", "pte_interpreter.py", "export.py")]
    h = hashlib.sha256()
    for part in (program.path.read_bytes(),
                 program.expect.read_bytes() if program.expect else b"", flow.name.encode(),
                 cpu.encode(), json.dumps(settings, sort_keys=True).encode(),
                 inputs_digest.encode(), deploykit_version().encode(),
                 *(p.read_bytes() for p in code)):
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


def import_program(program: ForeignProgram, flow: Flow, out_dir: Path, cpu: str,
                   input_sets: list[list[np.ndarray]] | None = None,
                   on_step: Any = None) -> ExportResult:
    """Write the export directory of `program` (module docstring) and return its
    ExportResult. `input_sets`: the samples of --inputs (each a list of arrays in the
    program's dtypes), else the deterministic inputs alone."""
    import tempfile

    import numpy as np


    started = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = (REPORT_NAME, PTE_NAME, OPS_YAML_NAME, REFERENCE_NAME)
    remove_outputs(out_dir, names)
    data = program.path.read_bytes()

    def step(name: str) -> None:
        if on_step is not None:
            on_step(name)

    step("gen_oplist")
    with tempfile.TemporaryDirectory(prefix="dk-oplist-") as tmp:
        # ExecuTorch's operator lister reads the program in native code that trusts it: a
        # damaged one can crash it, so it runs in a child (util/isolated.py).
        ops_yaml = run_isolated(lambda: gen_oplist_yaml(data, Path(tmp)), LIST_TIMEOUT_S,
                                f"Listing the operators of {program.path}",
                                "The file is damaged, or not a program for this ExecuTorch: "
                                "export it again.")

    op_list = ops_from_yaml(ops_yaml)
    step("operator coverage")
    check_coverage(op_list, None, program.name, program.path, flow.name)

    inputs = deterministic_inputs(program.info)
    sets = input_sets or [inputs]
    if input_sets:
        inputs = input_sets[0]
    if program.expect is not None:
        if input_sets and len(input_sets) > 1:
            raise ConfigError("--expect gives the outputs of one input, --inputs gives "
                              f"{len(input_sets)}.",
                              "Give one of them (or the outputs of each sample in its file).")
        step("expected outputs")
        kind, references = f"{EXPECTED_REFERENCE} ({program.expect})", [expected_outputs(program)]
    else:
        step("host reference")
        host = host_reference(program)
        if host is None:
            kind = NO_REFERENCE
            references = [[_placeholder(program, k, t) for k, t in
                           enumerate(program.info.outputs)] for _ in sets]
        else:
            kind, run = host
            references = run([list(xs) for xs in sets])
    outputs_quant = output_quant(program.path)
    inputs_quant = input_quant(program.path)
    tolerance = flow.default_tolerance(outputs_quant)
    seconds = round(time.perf_counter() - started, 3)
    info = program.info
    pte_sha = hashlib.sha256(data).hexdigest()
    plan = method_plan(load_program(data, str(program.path)), "forward", str(program.path))
    dim_orders_in = [[int(d) for d in plan.values[i].val.dim_order] for i in plan.inputs]
    dim_orders_out = [[int(d) for d in plan.values[i].val.dim_order] for i in plan.outputs]
    kernel_calls: dict[str, int] = {}
    for seg in info.segments:
        for op in (seg.ops if seg.kind == "cpu" else ()):
            kernel_calls[op] = kernel_calls.get(op, 0) + 1

    def entries(prefix: str, arrays: list[np.ndarray], orders: list[list[int]],
                quant: list[QuantParams | None]) -> list[dict[str, Any]]:
        return [{"name": f"{prefix}_{i}", "shape": list(a.shape), "dtype": str(a.dtype),
                 "pte_dtype": str(a.dtype), "dim_order": order, "nbytes": int(a.nbytes),
                 "quant": q.to_dict() if q else None}
                for i, (a, order, q) in enumerate(zip(arrays, orders, quant, strict=True))]

    report = {
        "schema_version": REPORT_SCHEMA_VERSION,
        "model": program.name,
        "model_source": str(program.path),
        "imported": {"source": str(program.path), "reason": program.reason,
                     "npu_target": program.npu_target,
                     "npu_memory_mode": program.npu_memory_mode,
                     "npu_system_config": program.npu_system_config},
        "flow": flow.name,
        "cpu": cpu,
        "pte": {"file": PTE_NAME, "size": len(data), "sha256": pte_sha},
        "ops_yaml": OPS_YAML_NAME,
        "op_list": op_list,
        "kernel_calls": kernel_calls,
        "num_delegates": len(info.delegates),
        "planned_buffers": list(info.planned_buffers),
        "inputs": entries("input", inputs, dim_orders_in, inputs_quant),
        "outputs": entries("output", references[0], dim_orders_out, outputs_quant),
        "reference": {"kind": kind, "file": REFERENCE_NAME, "eager_max_abs_diff": 0.0},
        "tolerance": tolerance,
        "tolerance_source": "default",
        "export_seconds": seconds,
        "timings": {"import": seconds},
        "warnings": [],
    }
    npz = io.BytesIO()
    np.savez(npz, **{f"input_{i}": a for i, a in enumerate(inputs)},
             **{f"output_{i}": a for i, a in enumerate(references[0])},
             **{f"eager_output_{i}": a for i, a in enumerate(references[0])},
             **{f"set{k}_input_{i}": a for k, xs in enumerate(sets) for i, a in enumerate(xs)},
             **{f"set{k}_output_{i}": a for k, ys in enumerate(references)
                for i, a in enumerate(ys)})
    step("write outputs")
    write_atomic(out_dir / PTE_NAME, data)
    write_atomic(out_dir / OPS_YAML_NAME, ops_yaml)
    write_atomic(out_dir / REFERENCE_NAME, npz.getvalue())
    write_atomic(out_dir / REPORT_NAME, json.dumps(report, indent=2) + "\n")
    loaded = load_export(out_dir)
    assert loaded is not None
    return replace(loaded, input_sets=[list(xs) for xs in sets],
                   reference_sets=[list(ys) for ys in references])
