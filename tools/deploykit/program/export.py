"""The Export stage: a loaded model -> `.pte`, operator list and host reference outputs.

The flow (deploykit.flows: portable_fp32, cortex_m_int8, ethos_u_int8, or one of another
installed package) quantizes and lowers the model and computes the host reference; this
module runs it, reads the program back, lists its operators, and writes the outputs.

Files written into ``out_dir`` (each atomically; stale ones are removed first, and on
failure nothing but ``export-error.log`` is left): ``model.pte``, ``ops.yaml`` (gen_oplist
selective-build yaml), ``reference.npz`` (``input_<i>``, ``output_<i>``, logical shapes,
C order) and, last, ``export.json`` (the report; its presence marks a complete export).

torch and executorch are imported inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploykit.flows import get_flow
from deploykit.flows.base import (
    CALIBRATIONS,
    FLOW_FILE_GLOBS,
    ExportOptions,
    ExportTarget,
    Flow,
    FlowResult,
    QuantParams,
)
from deploykit.flows.common import Stages, in_steps, max_abs_diff, to_numpy
from deploykit.readers.op_coverage import check_coverage
from deploykit.readers.pte_reader import PteTensor, read_pte_info
from deploykit.util.errors import ConfigError, ExportError
from deploykit.util.fsutil import write_atomic

if TYPE_CHECKING:
    import numpy as np

    from deploykit.program.models import ModelSpec

PTE_NAME = "model.pte"
ETRECORD_NAME = "model.etrecord"  # ExecuTorch's ETRecord, for Inspector (docs/profiling.md)
OPS_YAML_NAME = "ops.yaml"
REPORT_NAME = "export.json"
REFERENCE_NAME = "reference.npz"
ERROR_LOG_NAME = "export-error.log"
# 3: flows as modules; planned_buffers per memory id from 1 (was planned_buffer_sizes).
REPORT_SCHEMA_VERSION = 3


@dataclass
class ExportResult:
    flow: str
    cpu: str
    model_name: str
    pte_path: Path
    report_path: Path
    reference_path: Path
    ops_yaml_path: Path
    op_list: list[str]  # from ops.yaml (gen_oplist), sorted: "cortex_m::quantized_linear.out"
    inputs: list[np.ndarray]  # logical shapes, C-contiguous, the dtype the .pte takes
    input_dim_orders: list[list[int]]  # memory order the .pte expects for each input
    host_outputs: list[np.ndarray]  # the reference the device must match (logical, C order)
    output_dim_orders: list[list[int]]
    reference_kind: str  # the flow's reference (FlowResult.reference_kind)
    eager_outputs: list[np.ndarray]  # float PyTorch eager on the same inputs
    eager_max_abs_diff: float  # max |reference - eager| over all outputs
    input_quant: list[QuantParams | None]  # quantize node right after each input (int8 flow)
    output_quant: list[QuantParams | None]  # dequantize node right before each output
    tolerance: dict[str, float]  # device-vs-reference tolerance to apply (atol, rtol)
    tolerance_source: str  # "model" (its TOLERANCE) or "default"
    export_seconds: float
    pte_size: int
    pte_sha256: str
    planned_buffers: list[int]  # per memory id from 1
    kernel_calls: dict[str, int]
    timings: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # The input sets the firmware runs, in order, with the host reference of each: the
    # example inputs alone, or the samples of `deploykit run --inputs DIR`.
    input_sets: list[list[np.ndarray]] = field(default_factory=list)
    reference_sets: list[list[np.ndarray]] = field(default_factory=list)
    # A program made elsewhere, imported as it is (program/imported.py): its source, why it
    # took this flow, the NPU it was compiled for; {} for an export.
    imported: dict[str, Any] = field(default_factory=dict)


def memory_order_bytes(array: np.ndarray, dim_order: list[int]) -> bytes:
    """Raw bytes of a logical array in the memory order a `.pte` tensor expects.

    `dim_order` [0, 2, 3, 1] turns a logical NCHW array into NHWC bytes; the identity order
    gives the plain C-order bytes.
    """
    import numpy as np

    return np.ascontiguousarray(np.transpose(array, dim_order)).tobytes()


def parse_ops_yaml(path: Path) -> list[str]:
    """The operator names of a gen_oplist yaml (its `operators` keys), sorted."""
    return ops_from_yaml(Path(path).read_bytes())


def ops_from_yaml(text: bytes | str) -> list[str]:
    import yaml

    doc = yaml.safe_load(text) or {}
    return sorted((doc.get("operators") or {}).keys())


def export(spec: ModelSpec, flow: str | Flow, out_dir: Path, cpu: str = "cortex-m55",
           settings: dict[str, Any] | None = None,
           input_sets: list[tuple[Any, ...]] | None = None,
           options: ExportOptions | None = None,
           on_step: Callable[[str], None] | None = None) -> ExportResult:
    """Export `spec` through `flow` (a Flow, or a name of the flow registry) into `out_dir` (see the
    module docstring).

    `settings`: the flow's target settings (`Flow.target_settings(board)`; for ethos_u_int8
    the board's NPU: its `npu:` section with any --npu-macs / --npu-memory-mode override
    applied, or `NpuConfig.export_settings()`). `options`: the build profile's export choices
    (default: folded constants, float I/O). `on_step`: told the name of each step as it starts.

    Raises ConfigError for a bad flow/CPU, ExportError (with `log_path` to a full traceback)
    when a step fails. On failure no `.pte` (nor any other output but the error log) is left.
    """
    import numpy as np

    flow_impl = get_flow(flow) if isinstance(flow, str) else flow
    flow = flow_impl.name
    options = options or ExportOptions()
    target = ExportTarget(cpu, settings)
    flow_impl.validate(target)  # before any heavy work
    spec = calibrated(spec, options.calibration)

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    outputs = (REPORT_NAME, PTE_NAME, OPS_YAML_NAME, REFERENCE_NAME, ETRECORD_NAME)
    remove_outputs(out_dir, outputs + (ERROR_LOG_NAME,))  # never leave a stale mix behind
    _remove_flow_files(out_dir)

    st = Stages(flow, spec.name, on_step)
    t_start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            art = flow_impl.lower(spec, st, target, options)
            pte = art.pte
            with st.step("read .pte"):
                info = read_pte_info(pte)
            with st.step("gen_oplist"), tempfile.TemporaryDirectory(prefix="dk-oplist-") as tmp:
                ops_yaml = gen_oplist_yaml(pte, Path(tmp))
                op_list = ops_from_yaml(ops_yaml)
            with st.step("operator coverage"):
                # Before planning or compiling: the same kernel tables as the CMake build.
                check_coverage(op_list, art.program_graph, spec.name, spec.source_path, flow)
            set_inputs, set_references = _reference_sets(art, input_sets, st)
        export_seconds = round(time.perf_counter() - t_start, 3)

        inputs_np = [to_numpy(t) for t in art.inputs]
        reference_np = [to_numpy(t) for t in art.reference]
        eager_np = [to_numpy(t) for t in art.eager]
        if len(reference_np) != len(info.outputs) or len(inputs_np) != len(info.inputs):
            raise ExportError(
                f"The .pte has {len(info.inputs)} inputs/{len(info.outputs)} outputs but the "
                f"model has {len(inputs_np)}/{len(reference_np)}.",
                "Report this: the exported program does not match the model's signature.")
        diffs = max_abs_diff(reference_np, eager_np)
        warn = [*art.warnings, *flow_impl.check_program(spec.name, op_list, info, options)]

        tolerance, tol_source = _tolerance(spec, flow_impl, art.output_quant)
        pte_sha = hashlib.sha256(pte).hexdigest()

        npz = io.BytesIO()
        np.savez(npz, **{f"input_{i}": a for i, a in enumerate(inputs_np)},
                 **{f"output_{i}": a for i, a in enumerate(reference_np)},
                 **{f"eager_output_{i}": a for i, a in enumerate(eager_np)},
                 **{f"pt2e_output_{i}": to_numpy(t)
                    for i, t in enumerate(art.pt2e_reference or [])},
                 **{f"set{k}_input_{i}": a for k, xs in enumerate(set_inputs)
                    for i, a in enumerate(xs)},
                 **{f"set{k}_output_{i}": a for k, ys in enumerate(set_references)
                    for i, a in enumerate(ys)})

        # Lazily: the protocol's records need numpy, which importing this module must not.
        from deploykit.readers.execute_failure import instruction_sources

        report = {
            "schema_version": REPORT_SCHEMA_VERSION,
            "model": spec.name,
            "model_source": str(spec.source_path),
            "flow": flow,
            "cpu": cpu,
            "options": dataclasses.asdict(options),
            "calibration_samples": len(spec.calibration_inputs),
            **art.report,
            "versions": _versions(),
            "pte": {"file": PTE_NAME, "size": len(pte), "sha256": pte_sha},
            "ops_yaml": OPS_YAML_NAME,
            "op_list": op_list,
            "kernel_calls": info.kernel_calls,
            **flow_impl.program_report(op_list),
            "num_delegates": info.num_delegates,
            "planned_buffers": info.planned_buffers,
            "inputs": _tensor_entries("input", inputs_np, info.inputs, art.input_quant),
            "outputs": _tensor_entries("output", reference_np, info.outputs,
                                       art.output_quant),
            "reference": {
                "kind": art.reference_kind,
                "file": REFERENCE_NAME,
                "eager_max_abs_diff": max(diffs) if diffs else 0.0,
                "eager_max_abs_diff_per_output": diffs,
                "eager_max_abs_diff_in_output_steps": in_steps(diffs, art.output_quant),
                "output_range": [float(a.max() - a.min()) if a.size else 0.0
                                 for a in reference_np],
                **art.reference_report,
            },
            "tolerance": tolerance,
            "tolerance_source": tol_source,
            # Instruction index -> model line, to name where a failed execute() stopped.
            "instruction_sources": {
                str(k): v for k, v in
                instruction_sources(art.program_graph, pte, spec.source_path).items()},
            "export_seconds": export_seconds,
            "timings": st.timings,
            "warnings": warn,
        }

        with st.step("write outputs"):
            for name, data in art.files.items():
                write_atomic(out_dir / name, data)
            write_atomic(out_dir / PTE_NAME, pte)
            write_atomic(out_dir / OPS_YAML_NAME, ops_yaml)
            write_atomic(out_dir / REFERENCE_NAME, npz.getvalue())
            if art.etrecord is not None:
                write_atomic(out_dir / ETRECORD_NAME, _etrecord_bytes(art.etrecord))
            write_atomic(out_dir / REPORT_NAME, json.dumps(report, indent=2) + "\n")
    except BaseException as e:
        remove_outputs(out_dir, outputs)
        _remove_flow_files(out_dir)
        if isinstance(e, ExportError):
            log = out_dir / ERROR_LOG_NAME
            body = st.failed_traceback or "".join(traceback.format_exception(e))
            write_atomic(log, f"{e}\n\n{body}")
            e.log_path = str(log)
        raise

    return ExportResult(
        flow=flow, cpu=cpu, model_name=spec.name,
        pte_path=out_dir / PTE_NAME, report_path=out_dir / REPORT_NAME,
        reference_path=out_dir / REFERENCE_NAME, ops_yaml_path=out_dir / OPS_YAML_NAME,
        op_list=op_list, inputs=inputs_np,
        input_dim_orders=[t.dim_order for t in info.inputs],
        host_outputs=reference_np, output_dim_orders=[t.dim_order for t in info.outputs],
        reference_kind=art.reference_kind, eager_outputs=eager_np,
        eager_max_abs_diff=max(diffs) if diffs else 0.0,
        input_quant=list(art.input_quant), output_quant=list(art.output_quant),
        tolerance=tolerance, tolerance_source=tol_source,
        export_seconds=export_seconds, pte_size=len(pte), pte_sha256=pte_sha,
        planned_buffers=info.planned_buffers, kernel_calls=info.kernel_calls,
        timings=dict(st.timings), warnings=warn,
        input_sets=set_inputs or [inputs_np], reference_sets=set_references or [reference_np],
    )


def calibrated(spec: ModelSpec, calibration: str) -> ModelSpec:
    """`spec` with the calibration samples `calibration` (flows/base.CALIBRATIONS) chooses."""
    if calibration not in CALIBRATIONS:
        raise ConfigError(f"Unknown calibration '{calibration}'.",
                          "Use one of: " + ", ".join(f"{k} ({v})"
                                                     for k, v in CALIBRATIONS.items()) + ".")
    if calibration == "example":
        return dataclasses.replace(spec, calibration_inputs=[spec.example_inputs])
    return spec


def _reference_sets(art: FlowResult, input_sets: list[tuple[Any, ...]] | None,
                    st: Stages) -> tuple[list[list[np.ndarray]], list[list[np.ndarray]]]:
    """Host reference outputs for each extra input set (`deploykit run --inputs DIR`)."""
    if not input_sets:
        return [], []
    fn, prepare = art.reference_fn, art.prepare_inputs
    if fn is None or prepare is None:
        raise ConfigError("This export flow has no host reference that runs sample by sample "
                          "(its program runs on an accelerator only), which `run --inputs` "
                          "and `validate` need.",
                          "Use a CPU flow (cortex_m_int8, portable_fp32) for a data set, or "
                          "run the model's example inputs (no --inputs).")
    inputs, references = [], []
    with st.step(f"host reference for {len(input_sets)} input set(s)"):
        for sample in input_sets:
            xs = prepare(sample)
            inputs.append([to_numpy(t) for t in xs])
            references.append([to_numpy(t) for t in fn(xs)])
    return inputs, references


def load_export(out_dir: Path) -> ExportResult | None:
    """The ExportResult of a finished export in `out_dir` (export.json is written last), or None."""
    import numpy as np

    out_dir = Path(out_dir)
    report_path = out_dir / REPORT_NAME
    if not report_path.exists():
        return None
    report = json.loads(report_path.read_text())
    if report.get("schema_version") != REPORT_SCHEMA_VERSION:
        return None
    with np.load(out_dir / REFERENCE_NAME) as npz:
        arrays = {k: npz[k] for k in npz.files}

    def series(prefix: str, n: int) -> list[np.ndarray]:
        return [arrays[f"{prefix}_{i}"] for i in range(n)]

    def quant(entries: list[dict[str, Any]]) -> list[QuantParams | None]:
        return [QuantParams(**e["quant"]) if e["quant"] else None for e in entries]

    n_in, n_out = len(report["inputs"]), len(report["outputs"])
    n_sets = sum(1 for k in arrays if k.startswith("set") and k.endswith("_input_0"))
    input_sets = [series(f"set{k}_input", n_in) for k in range(n_sets)]
    reference_sets = [series(f"set{k}_output", n_out) for k in range(n_sets)]
    return ExportResult(
        input_sets=input_sets or [series("input", n_in)],
        reference_sets=reference_sets or [series("output", n_out)],
        flow=report["flow"], cpu=report["cpu"], model_name=report["model"],
        pte_path=out_dir / PTE_NAME, report_path=report_path,
        reference_path=out_dir / REFERENCE_NAME, ops_yaml_path=out_dir / OPS_YAML_NAME,
        op_list=report["op_list"], inputs=series("input", n_in),
        input_dim_orders=[e["dim_order"] for e in report["inputs"]],
        host_outputs=series("output", n_out),
        output_dim_orders=[e["dim_order"] for e in report["outputs"]],
        reference_kind=report["reference"]["kind"],
        eager_outputs=series("eager_output", n_out),
        eager_max_abs_diff=report["reference"]["eager_max_abs_diff"],
        input_quant=quant(report["inputs"]), output_quant=quant(report["outputs"]),
        tolerance=report["tolerance"], tolerance_source=report["tolerance_source"],
        export_seconds=report["export_seconds"], pte_size=report["pte"]["size"],
        pte_sha256=report["pte"]["sha256"], planned_buffers=report["planned_buffers"],
        kernel_calls=report["kernel_calls"], timings=report["timings"],
        warnings=report["warnings"], imported=report.get("imported", {}))


def _tensor_entries(prefix: str, arrays: list[np.ndarray], tensors: list[PteTensor],
                    quant: list[QuantParams | None]) -> list[dict[str, Any]]:
    return [{"name": f"{prefix}_{i}", "shape": list(a.shape), "dtype": str(a.dtype),
             "pte_dtype": t.dtype, "dim_order": t.dim_order, "nbytes": int(a.nbytes),
             "quant": q.to_dict() if q else None}
            for i, (a, t, q) in enumerate(zip(arrays, tensors, quant, strict=True))]


def _tolerance(spec: ModelSpec, flow: Flow,
               output_quant: list[QuantParams | None]) -> tuple[dict[str, float], str]:
    tol = spec.tolerance_for(flow.name)
    if tol:
        return {"atol": tol.get("atol", 0.0), "rtol": tol.get("rtol", 0.0)}, "model"
    return flow.default_tolerance(output_quant), "default"


def gen_oplist_yaml(pte: bytes, work: Path) -> bytes:
    from executorch.codegen.tools.gen_oplist import gen_oplist

    pte_path = work / "model.pte"
    yaml_path = work / "ops.yaml"
    pte_path.write_bytes(pte)
    with contextlib.redirect_stdout(io.StringIO()):  # it prints every operator
        gen_oplist(output_path=str(yaml_path), model_file_path=str(pte_path))
    # debug_info names the model file: make it the final name, not the temp path, so the
    # yaml is reproducible (builds key on its content).
    text = yaml_path.read_text()
    return text.replace(str(pte_path), PTE_NAME).encode()


def _remove_flow_files(out_dir: Path) -> None:
    """A previous export's further files (FlowResult.files), which this one may not write."""
    for pattern in FLOW_FILE_GLOBS:
        for path in out_dir.glob(pattern):
            path.unlink(missing_ok=True)


def remove_outputs(out_dir: Path, names: tuple[str, ...]) -> None:
    for name in names:
        (out_dir / name).unlink(missing_ok=True)


def _versions() -> dict[str, str]:
    import executorch.version as etv
    import torch

    return {"torch": torch.__version__, "executorch": getattr(etv, "__version__", "?"),
            "executorch_git": getattr(etv, "git_version", "?")}


def _etrecord_bytes(etrecord: Any) -> bytes:
    """An ETRecord serialized by ExecuTorch (a zip archive), as bytes for an atomic write."""
    buffer = io.BytesIO()
    etrecord.save(buffer)
    return buffer.getvalue()
