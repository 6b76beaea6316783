"""The Export stage: a loaded model -> `.pte`, operator list and host reference outputs.

Flows
-----
``portable_fp32``
    torch.export -> ``to_edge_transform_and_lower`` (no partitioner) -> ``constant_prop_pass``
    (folds the Linear weight transposes: ~1/4 the instructions and no 100 KB planned buffer
    for an MLP) -> ``to_executorch``. The reference is the ``.pte`` itself run by the host
    ExecuTorch pybindings (the device runs the same portable kernels, so bit-exact is
    expected); PyTorch eager is run too and its difference recorded.
``cortex_m_int8``
    ``CortexMQuantizer`` + PT2E ``prepare_pt2e`` / calibrate / ``convert_pt2e`` ->
    torch.export -> ``to_edge_transform_and_lower`` with the Cortex-M edge config of
    ``backends/cortex_m/test/tester.py`` -> ``CortexMPassManager`` for the board CPU
    (``CortexMTargetConfig``: MVE/DSP/scalar CMSIS-NN paths take differently laid-out
    constants, so the ``.pte`` is CPU-specific) -> ``to_executorch``. 4-D float inputs are
    made channels-last (the CMSIS-NN kernels are NHWC), so such an input's bytes are NHWC on
    the device: see ``input_dim_orders`` / :func:`memory_order_bytes`. The ``.pte`` cannot run
    on the host (no ``cortex_m::`` kernels there), so the reference is the converted PT2E model
    run in PyTorch; outputs are float (dequantized inside the graph).
``ethos_u_int8``
    For an Arm Ethos-U NPU, from the board's `npu:` section (``npu=`` argument):
    ``EthosUCompileSpec`` (target such as ``ethos-u85-256``, Vela system config and memory
    mode) -> ``EthosUQuantizer`` (symmetric, per-channel) -> PT2E prepare / calibrate / convert
    on ``.module(check_guards=False)`` -> torch.export -> ``to_edge_transform_and_lower`` with
    ``EthosUPartitioner`` (TOSA, then Vela) -> ``ReplaceQuantNodesPass`` (quantize/dequantize
    left on the CPU become ``cortex_m::`` ops, as aot_arm_compiler.py does) -> ``to_executorch``
    with the delegate blobs inline. Inputs stay NCHW. The reference is the lowered program run
    on the host with each delegate's TOSA graph (the one Vela compiled) in the TOSA reference
    model of tosa-tools, and its CPU ops in PyTorch: the NPU's integer semantics. Its
    difference from the converted PT2E model is recorded (``reference.tosa_reference_check``;
    ``pt2e_output_<i>`` in reference.npz); the PT2E model is the fallback reference when the
    TOSA run fails. ``export.json`` gets ``partition``: the graph in
    execution order (delegate segments with their edge ops and Vela's summary, CPU op runs),
    keyed by delegate index, which ``deploykit inspect`` shows.

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
import operator
import tempfile
import time
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ConfigError, DeployKitError, ExportError
from .fsutil import write_atomic

if TYPE_CHECKING:
    import numpy as np

    from .models import ModelSpec

FLOWS = ("portable_fp32", "cortex_m_int8", "ethos_u_int8")
PTE_NAME = "model.pte"
OPS_YAML_NAME = "ops.yaml"
REPORT_NAME = "export.json"
REFERENCE_NAME = "reference.npz"
ERROR_LOG_NAME = "export-error.log"
REPORT_SCHEMA_VERSION = 2

# The cortex_m ops' own Python reference (integer arithmetic modelled on CMSIS-NN) run on the
# lowered graph: what the device computes, where PT2E's float simulation drifts by rounding.
CORTEX_M_REFERENCE_KIND = "cortex_m-integer-reference"
REFERENCE_KINDS = {
    "portable_fp32": "executorch-pybindings",
    "cortex_m_int8": "pt2e-quantized-torch",  # when the integer reference could not run
    "ethos_u_int8": "pt2e-quantized-torch",  # when the TOSA reference model could not run
}
TOSA_REFERENCE_KIND = "tosa-reference-model"
# Used when the model file gives no TOLERANCE for the flow (device vs reference).
DEFAULT_FP32_TOLERANCE = {"atol": 1e-5, "rtol": 0.0}
DEFAULT_INT8_STEPS = 2.0  # int8 default atol: this many output quantization steps

_SCALAR_TYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16",
                 6: "float32", 7: "float64", 11: "bool", 15: "bfloat16", 27: "uint16",
                 28: "uint32", 29: "uint64"}


@dataclass(frozen=True)
class ExportOptions:
    """Export choices of a build profile (deploykit.profiles)."""

    # portable_fp32: constant_prop_pass folds constant subgraphs (the weight transposes of
    # every Linear), so they are not recomputed on every inference.
    fold_constants: bool = True
    # cortex_m_int8: the program takes int8 inputs / returns int8 outputs where the graph
    # starts with a quantize / ends with a dequantize (the device skips the float conversion;
    # the host quantizes the inputs and the reference outputs with the same parameters).
    int8_io: bool = False
    # Memory-plan the graph inputs (ExecuTorch's default): Method::set_input copies each input
    # into the planned buffers. False: inputs are not planned, set_input hands the method the
    # caller's buffer (the runner's embedded inputs, read in place), and the planned buffers
    # shrink by the input bytes.
    plan_inputs: bool = True

    def key(self) -> str:
        return (f"fold_constants={self.fold_constants} int8_io={self.int8_io} "
                f"plan_inputs={self.plan_inputs}")

    def backend_config(self) -> Any:
        """to_executorch's ExecutorchBackendConfig for these options."""
        from executorch.exir import ExecutorchBackendConfig
        from executorch.exir.passes import MemoryPlanningPass

        return ExecutorchBackendConfig(
            memory_planning_pass=MemoryPlanningPass(alloc_graph_input=self.plan_inputs))


@dataclass(frozen=True)
class QuantParams:
    """Affine int quantization of one tensor: real = (q - zero_point) * scale."""

    scale: float
    zero_point: int
    qmin: int
    qmax: int
    dtype: str  # "int8"

    def to_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "zero_point": self.zero_point, "qmin": self.qmin,
                "qmax": self.qmax, "dtype": self.dtype}


@dataclass
class PteTensor:
    dtype: str  # numpy dtype name, e.g. "float32", "int8"
    sizes: list[int]
    dim_order: list[int]  # [0, 2, 3, 1] = NHWC memory for a logical NCHW tensor

    @property
    def nbytes(self) -> int:
        import numpy as np

        n = 1
        for s in self.sizes:
            n *= s
        return n * np.dtype(self.dtype).itemsize


@dataclass
class PteInfo:
    """What the serialized program says about method `forward`."""

    operators: list[str]  # "aten::addmm.out", in the program's operator table order
    kernel_calls: dict[str, int]  # operator -> number of KernelCall instructions
    inputs: list[PteTensor]
    outputs: list[PteTensor]
    planned_buffer_sizes: list[int]  # execution_plan.non_const_buffer_sizes; index 0 reserved
    num_delegates: int


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
    reference_kind: str  # "executorch-pybindings" | "pt2e-quantized-torch"
    eager_outputs: list[np.ndarray]  # float PyTorch eager on the same inputs
    eager_max_abs_diff: float  # max |reference - eager| over all outputs
    input_quant: list[QuantParams | None]  # quantize node right after each input (int8 flow)
    output_quant: list[QuantParams | None]  # dequantize node right before each output
    tolerance: dict[str, float]  # device-vs-reference tolerance to apply (atol, rtol)
    tolerance_source: str  # "model" (its TOLERANCE) or "default"
    export_seconds: float
    pte_size: int
    pte_sha256: str
    planned_buffer_sizes: list[int]
    kernel_calls: dict[str, int]
    timings: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # The input sets the firmware runs, in order, with the host reference of each: the
    # example inputs alone, or the samples of `deploykit run --inputs DIR`.
    input_sets: list[list[np.ndarray]] = field(default_factory=list)
    reference_sets: list[list[np.ndarray]] = field(default_factory=list)


def memory_order_bytes(array: np.ndarray, dim_order: list[int]) -> bytes:
    """Raw bytes of a logical array in the memory order a `.pte` tensor expects.

    `dim_order` [0, 2, 3, 1] turns a logical NCHW array into NHWC bytes; the identity order
    gives the plain C-order bytes.
    """
    import numpy as np

    return np.ascontiguousarray(np.transpose(array, dim_order)).tobytes()


def read_pte_info(pte: Path | bytes) -> PteInfo:
    """Deserialize a `.pte` (path or bytes) and describe its `forward` method.

    Raises ExportError if it is not a valid ExecuTorch program.
    """
    from executorch.exir._serialize._program import deserialize_pte_binary

    data = Path(pte).read_bytes() if not isinstance(pte, (bytes, bytearray)) else bytes(pte)
    try:
        program = deserialize_pte_binary(data).program
    except Exception as e:
        raise ExportError(f"Not a valid ExecuTorch .pte: {type(e).__name__}: {e}",
                          "Re-run the export.") from e
    plans = [p for p in program.execution_plan if p.name == "forward"]
    if not plans:
        raise ExportError("The .pte has no 'forward' method.", "Re-run the export.")
    plan = plans[0]
    operators = [f"{o.name}.{o.overload}" if o.overload else o.name for o in plan.operators]
    calls: dict[str, int] = {}
    for chain in plan.chains:
        for instr in chain.instructions:
            op_index = getattr(instr.instr_args, "op_index", None)
            if op_index is not None and type(instr.instr_args).__name__ == "KernelCall":
                calls[operators[op_index]] = calls.get(operators[op_index], 0) + 1

    def tensor(i: int) -> PteTensor:
        v = plan.values[i].val
        if not hasattr(v, "dim_order"):
            raise ExportError(f"The .pte's forward has a non-tensor input/output ({type(v)}).",
                              "Only tensor inputs and outputs are supported.")
        st = int(v.scalar_type)
        return PteTensor(dtype=_SCALAR_TYPES.get(st, f"scalar_type_{st}"),
                         sizes=list(v.sizes), dim_order=list(v.dim_order))

    return PteInfo(operators=operators, kernel_calls=calls,
                   inputs=[tensor(i) for i in plan.inputs],
                   outputs=[tensor(i) for i in plan.outputs],
                   planned_buffer_sizes=list(plan.non_const_buffer_sizes),
                   num_delegates=len(plan.delegates))


def parse_ops_yaml(path: Path) -> list[str]:
    """The operator names of a gen_oplist yaml (its `operators` keys), sorted."""
    return _ops_from_yaml(Path(path).read_bytes())


def _ops_from_yaml(text: bytes | str) -> list[str]:
    import yaml

    doc = yaml.safe_load(text) or {}
    return sorted((doc.get("operators") or {}).keys())


def parse_cpu(cpu: str) -> tuple[str, str | None]:
    """Split a board CPU string into (cortex_m target string, ISA override or None).

    "cortex-m55" -> ("cortex-m55", None); "cortex-m55+nomve" -> ("cortex-m55", "DSP");
    "cortex-m33+nodsp" -> ("cortex-m33", "SCALAR"); "+nofp" etc. are ignored here.
    """
    base, *exts = cpu.strip().lower().split("+")
    if not base.startswith("cortex-m") or len(base) <= len("cortex-m"):
        raise ConfigError(f"CPU '{cpu}' is not a Cortex-M CPU.",
                          "Use a GCC-style name such as cortex-m55, cortex-m33 or "
                          "cortex-m33+nofp.")
    isa = None
    if any(e.startswith("nodsp") for e in exts):
        isa = "SCALAR"
    elif any(e.startswith("nomve") for e in exts):
        isa = "DSP"
    return base, isa


def _target_config(cpu: str) -> Any:
    from executorch.backends.cortex_m.library import cmsis_nn
    from executorch.backends.cortex_m.target_config import CortexM, CortexMTargetConfig

    base, isa = parse_cpu(cpu)
    try:
        cfg = CortexMTargetConfig.from_target_string(base)
        if isa is not None:
            cfg = CortexMTargetConfig(cpu=cfg.cpu, isa=getattr(cmsis_nn.Backend, isa))
        _ = cfg.backend  # resolves through cmsis_nn; fails for CPUs it does not know
    except ValueError as e:
        supported = ", ".join("cortex-m" + m.name[1:].lower() for m in CortexM)
        raise ConfigError(f"CPU '{cpu}' is not supported by the ExecuTorch Cortex-M backend: "
                          f"{e}", f"Supported: {supported}.") from e
    return cfg


# ---------------------------------------------------------------------------------------------
# Stage bookkeeping


class _Stages:
    """Times named steps and turns their exceptions into ExportError naming the step."""

    def __init__(self, flow: str, model: str) -> None:
        self.flow = flow
        self.model = model
        self.timings: dict[str, float] = {}
        self.failed_traceback: str | None = None

    @contextlib.contextmanager
    def step(self, name: str, hint: str = "") -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        except DeployKitError:
            raise
        except Exception as e:
            self.failed_traceback = traceback.format_exc()
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise ExportError(
                f"{self.flow} export of '{self.model}' failed in {name}: "
                f"{type(e).__name__}: {msg}",
                hint or "The model may use an operator or pattern this flow does not support; "
                "see the log for the full traceback.") from e
        finally:
            self.timings[name] = round(time.perf_counter() - t0, 3)


def _flatten_tensors(out: Any) -> list[Any]:
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _flatten_tensors(o)]
    raise TypeError(f"model output contains {type(out).__name__}; only tensors are supported")


def _to_numpy(t: Any) -> np.ndarray:
    return t.detach().contiguous().cpu().numpy().copy()


def _max_abs_diff(a: list[np.ndarray], b: list[np.ndarray]) -> list[float]:
    import numpy as np

    return [float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))) if x.size else 0.0
            for x, y in zip(a, b, strict=True)]


# ---------------------------------------------------------------------------------------------
# Flows. Each returns a dict: pte (bytes), reference (list[Tensor]), eager (list[Tensor]),
# inputs (tuple[Tensor]), input_quant, output_quant, extra (dict for the report).


def _cortex_m_edge_compile_config() -> Any:
    """The EdgeCompileConfig of backends/cortex_m/test/tester.py (CortexMToEdge) at v1.4.1."""
    import torch
    from executorch.exir import EdgeCompileConfig

    return EdgeCompileConfig(
        preserve_ops=[
            torch.ops.aten.linear.default,
            torch.ops.aten.hardsigmoid.default,
            torch.ops.aten.hardsigmoid_.default,
            torch.ops.aten.hardswish.default,
            torch.ops.aten.hardswish_.default,
            torch.ops.aten.silu.default,
        ],
        _check_ir_validity=False,
        _core_aten_ops_exception_list=[torch.ops.aten.max_pool2d.default],
    )


def _flow_portable_fp32(spec: ModelSpec, st: _Stages,
                        options: ExportOptions) -> dict[str, Any]:
    with st.step("import torch/executorch"):
        import torch
        from executorch.exir import to_edge_transform_and_lower
        from executorch.exir.passes.constant_prop_pass import constant_prop_pass

    inputs = tuple(t.clone().contiguous() for t in spec.example_inputs)
    with st.step("torch.export", "Make the model exportable with torch.export.export(model, "
                 "example_inputs()) (no data-dependent Python control flow)."):
        ep = torch.export.export(spec.module, inputs)
    with st.step("to_edge_transform_and_lower"):
        edge = to_edge_transform_and_lower(ep)
    if options.fold_constants:
        with st.step("constant_prop_pass"):
            folded = constant_prop_pass(edge.exported_program())
            if folded is not edge.exported_program():
                edge._edge_programs["forward"] = folded  # same hand-off upstream's tester uses
    with st.step("to_executorch"):
        pte = bytes(edge.to_executorch(options.backend_config()).buffer)

    with st.step("host reference (executorch pybindings)",
                 "The .pte did not run on the host ExecuTorch runtime; a kernel is missing or "
                 "the program is invalid."):
        from executorch.runtime import Runtime

        method = Runtime.get().load_program(pte).load_method("forward")

        def reference_fn(xs: tuple[Any, ...]) -> list[Any]:
            return _flatten_tensors(list(method.execute([t.clone().contiguous() for t in xs])))

        reference = reference_fn(inputs)
    with st.step("eager reference"), torch.no_grad():
        eager = _flatten_tensors(spec.module(*[t.clone() for t in inputs]))
    return {"pte": pte, "reference": reference, "eager": eager, "inputs": inputs,
            "input_quant": [None] * len(inputs), "output_quant": [None] * len(reference),
            "dialect_check": None, "extra": {}, "reference_fn": reference_fn,
            "prepare_input": lambda t: t.clone().contiguous()}


def _qparams_from_node_args(args: tuple[Any, ...]) -> QuantParams:
    # cortex_m.{quantize,dequantize}_per_tensor(x, scale, zero_point, qmin, qmax, dtype)
    _, scale, zp, qmin, qmax, dtype = args[:6]
    return QuantParams(scale=float(scale), zero_point=int(zp), qmin=int(qmin), qmax=int(qmax),
                       dtype=str(dtype).replace("torch.", ""))


def _io_quant(ep: Any) -> tuple[list[QuantParams | None], list[QuantParams | None]]:
    """QuantParams of the cortex_m quantize after each user input / dequantize before each
    user output of a lowered edge program (None where there is none)."""
    from torch.export.graph_signature import InputKind, OutputKind

    def is_op(node: Any, name: str) -> bool:
        return node.op == "call_function" and f"cortex_m.{name}" in str(node.target)

    sig = ep.graph_signature
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    in_q: list[QuantParams | None] = []
    for spec in sig.input_specs:
        if spec.kind != InputKind.USER_INPUT:
            continue
        node = placeholders.get(spec.arg.name)
        users = [u for u in node.users if is_op(u, "quantize_per_tensor")] if node else []
        in_q.append(_qparams_from_node_args(users[0].args) if len(users) == 1 else None)
    out_node = next(n for n in ep.graph.nodes if n.op == "output")
    out_args = list(out_node.args[0])
    out_q: list[QuantParams | None] = []
    for spec, arg in zip(sig.output_specs, out_args, strict=True):
        if spec.kind != OutputKind.USER_OUTPUT:
            continue
        ok = hasattr(arg, "op") and is_op(arg, "dequantize_per_tensor")
        out_q.append(_qparams_from_node_args(arg.args) if ok else None)
    return in_q, out_q


def _quantize_pt2e(spec: ModelSpec, st: _Stages, inputs: tuple[Any, ...],
                   calibration: list[tuple[Any, ...]], quantizer: Any) -> tuple[Any, list, list]:
    """torch.export → PT2E prepare → calibrate → convert; the quantized model and its and the
    float model's outputs on `inputs`. Shared by the int8 flows; only the quantizer differs."""
    import torch
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    with st.step("torch.export", "Make the model exportable with torch.export.export(model, "
                 "example_inputs()) (no data-dependent Python control flow)."):
        exported = torch.export.export(spec.module, inputs)
        try:
            # torch 2.13 adds a _guards_fn call_module that the Arm/Cortex-M passes reject.
            graph_module = exported.module(check_guards=False)
        except TypeError:  # older torch: no such argument, and no such node
            graph_module = exported.module()
    with st.step("quantization (prepare_pt2e)"):
        prepared = prepare_pt2e(graph_module, quantizer)
    with st.step("calibration"), torch.no_grad():
        for sample in calibration:
            prepared(*sample)
    with st.step("quantization (convert_pt2e)"):
        converted = convert_pt2e(prepared)
    with st.step("reference (quantized PT2E model)"), torch.no_grad():
        reference = _flatten_tensors(converted(*[t.clone() for t in inputs]))
    with st.step("eager reference"), torch.no_grad():
        eager = _flatten_tensors(spec.module(*[t.clone() for t in inputs]))
    return converted, reference, eager


def _flow_cortex_m_int8(spec: ModelSpec, st: _Stages, cpu: str,
                       options: ExportOptions) -> dict[str, Any]:
    with st.step("import torch/executorch"):
        import torch
        from executorch.backends.cortex_m.passes.cortex_m_pass_manager import (
            CortexMPassManager,
        )
        from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer
        from executorch.exir import to_edge_transform_and_lower

    target = _target_config(cpu)

    def nhwc(t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        if t.dim() == 4 and t.is_floating_point():
            return t.to(memory_format=torch.channels_last)
        return t

    inputs = tuple(nhwc(t) for t in spec.example_inputs)
    calibration = [tuple(nhwc(t) for t in sample) for sample in spec.calibration_inputs]

    converted, reference, eager = _quantize_pt2e(spec, st, inputs, calibration,
                                                 CortexMQuantizer())
    with st.step("torch.export (quantized)"):
        qep = torch.export.export(converted, inputs)
    with st.step("to_edge_transform_and_lower"):
        edge = to_edge_transform_and_lower(qep, compile_config=_cortex_m_edge_compile_config())
    with st.step("CortexMPassManager"):
        lowered = CortexMPassManager(edge.exported_program(), target_config=target).transform()
        # Upstream (tester.py, aot_arm_compiler.py) swaps the program in the same way.
        edge._edge_programs["forward"] = lowered
        input_quant, output_quant = _io_quant(lowered)
    with st.step("cortex_m dialect check"):
        # Before to_executorch, which rewrites the graph in place to out-variants.
        dialect_check, integer_model, integer_out = _dialect_check(lowered, inputs, reference,
                                                                    output_quant)
    pt2e_reference = reference
    if integer_out is not None:
        # The device is compared with the integer semantics CMSIS-NN implements, as the
        # Ethos-U flow uses the TOSA reference model; the PT2E difference stays in the report.
        reference = integer_out
    int8_inputs: list[bool] = [False] * len(inputs)
    if options.int8_io:
        with st.step("int8 model I/O"):
            int8_inputs, int8_outputs = _make_int8_io(lowered)
            # The program's outputs are int8 now; output_quant keeps the parameters the host
            # dequantizes them with before comparing (RunReport: device outputs are shown
            # and compared as floats, as with float I/O).
    with st.step("to_executorch"):
        pte = bytes(edge.to_executorch(options.backend_config()).buffer)

    def to_device(xs: tuple[Any, ...]) -> tuple[Any, ...]:
        """Inputs as the program takes them: int8 where it starts with a quantize, made with
        the same op and parameters as the quantized model's own first step."""
        return tuple(_quantize(t, q) if int8 and q else t
                     for t, int8, q in zip(xs, int8_inputs, input_quant, strict=True))

    def to_float(xs: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(_dequantize(t, q) if int8 and q else t
                     for t, int8, q in zip(xs, int8_inputs, input_quant, strict=True))

    def reference_fn(xs: tuple[Any, ...]) -> list[Any]:
        # int8 inputs: their dequantized values quantize back to exactly the same integers in
        # the model's first step, so the reference is that of the float input.
        model = integer_model if integer_model is not None else converted
        with torch.no_grad():
            return _flatten_tensors(model(*[t.clone() for t in to_float(xs)]))

    return {"pte": pte, "reference": reference, "eager": eager, "inputs": to_device(inputs),
            "input_quant": input_quant, "output_quant": output_quant,
            "dialect_check": dialect_check, "pt2e_reference": pt2e_reference,
            "reference_kind": CORTEX_M_REFERENCE_KIND if integer_out is not None
            else REFERENCE_KINDS["cortex_m_int8"],
            "extra": {"cpu": target.target_string, "cmsis_nn_backend": target.backend.name,
                      **({"int8_inputs": int8_inputs, "int8_outputs": int8_outputs}
                         if options.int8_io else {})},
            "reference_fn": reference_fn, "prepare_input": nhwc,
            "prepare_inputs": lambda xs: to_device(tuple(nhwc(t) for t in xs))}


def _quantize(t: Any, q: QuantParams) -> Any:
    import torch

    return torch.ops.quantized_decomposed.quantize_per_tensor.default(
        t, q.scale, q.zero_point, q.qmin, q.qmax, torch.int8)


def _dequantize(t: Any, q: QuantParams) -> Any:
    import torch

    if t.dtype != torch.int8:
        return t
    return torch.ops.quantized_decomposed.dequantize_per_tensor.default(
        t, q.scale, q.zero_point, q.qmin, q.qmax, torch.int8)


def _make_int8_io(ep: Any) -> tuple[list[bool], list[bool]]:
    """Make a lowered cortex_m program take int8 inputs and return int8 outputs where a user
    input's only use is a cortex_m quantize, and a user output is a cortex_m dequantize
    (what ExecuTorch's quantize_io_pass does for quantized_decomposed ops). Returns which
    inputs and outputs became int8."""
    from torch.export.graph_signature import InputKind, OutputKind, TensorArgument

    def is_op(node: Any, name: str) -> bool:
        return getattr(node, "op", None) == "call_function" and \
            f"cortex_m.{name}" in str(node.target)

    graph = ep.graph_module.graph
    placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    ins: list[bool] = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind != InputKind.USER_INPUT:
            continue
        node = placeholders.get(spec.arg.name)
        users = list(node.users) if node is not None else []
        if len(users) == 1 and is_op(users[0], "quantize_per_tensor"):
            quant = users[0]
            node.meta["val"] = quant.meta["val"]
            quant.replace_all_uses_with(node)
            graph.erase_node(quant)
            ins.append(True)
        else:
            ins.append(False)
    out_node = graph.output_node()
    args = list(out_node.args[0])
    outs: list[bool] = []
    for i, spec in enumerate(ep.graph_signature.output_specs):
        if spec.kind != OutputKind.USER_OUTPUT:
            continue
        arg = args[i]
        if is_op(arg, "dequantize_per_tensor") and len(arg.users) == 1:
            args[i] = arg.args[0]
            spec.arg = TensorArgument(name=arg.args[0].name)
            outs.append(True)
        else:
            outs.append(False)
    out_node.args = (tuple(args),)
    graph.eliminate_dead_code()
    ep.graph_module.recompile()
    return ins, outs


def _dialect_check(lowered: Any, inputs: tuple[Any, ...], reference: list[Any],
                   output_quant: list[QuantParams | None]
                   ) -> tuple[dict[str, Any], Any | None, list[Any] | None]:
    """Run the lowered cortex_m graph through the ops' Python reference code (integer
    arithmetic modelled on CMSIS-NN) and compare with the PT2E reference. Best effort: some
    ops' Python code rejects some shapes, so a failure here is recorded, not raised."""
    import torch

    module = lowered.module()  # a copy of the graph: to_executorch later rewrites the original
    try:
        with torch.no_grad():
            out = _flatten_tensors(module(*[t.clone() for t in inputs]))
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return {"ran": False, "error": f"{type(e).__name__}: {msg}"[:500]}, None, None
    if len(out) != len(reference):
        return ({"ran": False, "error": f"{len(out)} outputs, reference has {len(reference)}"},
                None, None)
    diffs = _max_abs_diff([_to_numpy(t) for t in out], [_to_numpy(t) for t in reference])
    steps = _in_steps(diffs, output_quant)
    return ({"ran": True, "max_abs_diff_vs_reference": max(diffs) if diffs else 0.0,
             "max_diff_output_steps": max((s for s in steps if s is not None), default=None),
             "bit_exact": all(d == 0.0 for d in diffs)}, module, out)


# ---------------------------------------------------------------------------------------------
# ethos_u_int8: Arm Ethos-U NPU (TOSA -> Vela), leftovers on the CPU.

ETHOS_U_BACKEND = "EthosUBackend"
_VELA_SUMMARY_KEYS = {
    "Accelerator configuration": "accelerator_config",
    "System configuration": "system_config",
    "Memory mode": "memory_mode",
    "Total SRAM used": "sram_used_kib",
    "Total DRAM used": "dram_used_kib",
    "CPU operators": "cpu_operators",
    "NPU operators": "npu_operators",
    "Neural network macs": "network_macs",
}


def npu_export_settings(npu: dict[str, Any] | None) -> dict[str, Any]:
    """Normalise the NPU settings given to `export` into {type, macs, target, system_config,
    memory_mode}. Accepts a board file's `npu:` section (type, macs, vela{...}) or the already
    flat form (`deploykit.npu.NpuConfig.export_settings()`). MAC count and mode are validated."""
    from .npu import DEFAULT_MACS, check_macs, check_memory_mode

    if not npu:
        raise ConfigError("The ethos_u_int8 flow needs the board's NPU settings.",
                          "Export for a board with an `npu:` section (corstone-300, "
                          "corstone-320), or pass npu={'type': 'ethos-u85', 'macs': 256, ...}.")
    npu_type = npu.get("type")
    if npu_type not in DEFAULT_MACS:
        raise ConfigError(f"Unknown NPU type {npu_type!r}.",
                          f"Known types: {', '.join(DEFAULT_MACS)}.")
    vela = npu.get("vela") or {}
    macs = check_macs(npu_type, int(npu.get("macs", DEFAULT_MACS[npu_type])), "npu.macs")
    system_config = npu.get("system_config") or vela.get("system_config")
    memory_mode = npu.get("memory_mode") or vela.get("memory_mode")
    if not system_config or not memory_mode:
        raise ConfigError("The NPU settings lack the Vela system_config or memory_mode.",
                          "Give both (board file: npu.vela.system_config / memory_mode).")
    check_memory_mode(npu_type, memory_mode)
    return {"type": npu_type, "macs": macs, "target": f"{npu_type}-{macs}",
            "system_config": system_config, "memory_mode": memory_mode}


def _op_name(target: Any) -> str:
    """`aten.convolution.default` -> "aten::convolution"; overloads other than default kept."""
    text = str(target)
    if text.startswith("<"):
        text = getattr(target, "__name__", text)
    parts = text.split(".")
    if len(parts) < 2:
        return text
    name = f"{parts[0]}::{parts[1]}"
    return name if len(parts) < 3 or parts[2] == "default" else f"{name}.{parts[2]}"


def _parse_vela_summary(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for line in text.splitlines():
        for label, key in _VELA_SUMMARY_KEYS.items():
            if line.startswith(label):
                value = line[len(label):].strip().lstrip("=").strip()
                number = value.split()[0] if value else ""
                try:
                    out[key] = float(number) if "." in number else int(number)
                except ValueError:
                    out[key] = value
    return out


@contextlib.contextmanager
def _capture_vela() -> Iterator[list[dict[str, Any]]]:
    """Record, for each Vela compilation of the Ethos-U backend, the TOSA flatbuffer it was
    given, the binary it returned and what Vela printed (its network summary).

    The backend calls `vela_compile` through its module's global name, which is swapped for a
    recording wrapper for the duration (and always restored)."""
    from executorch.backends.arm.ethosu import backend as ethosu_backend

    calls: list[dict[str, Any]] = []
    original = ethosu_backend.vela_compile

    def recording(tosa_flatbuffer: bytes, *args: Any, **kwargs: Any) -> bytes:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            binary = original(tosa_flatbuffer, *args, **kwargs)
        calls.append({"tosa": bytes(tosa_flatbuffer), "binary": bytes(binary),
                      "vela_output": printed.getvalue()})
        return binary

    ethosu_backend.vela_compile = recording
    try:
        yield calls
    finally:
        ethosu_backend.vela_compile = original


def _partition_report(ep: Any, vela_calls: list[dict[str, Any]]) -> tuple[list[dict[str, Any]],
                                                                       list[dict[str, Any]]]:
    """The lowered program's graph, in execution order: one entry per delegate call (its
    backend, the edge ops inside, Vela's summary) and one per CPU op. Delegates are numbered in
    the order the emitter meets them, which is the `.pte`'s delegate index."""
    gm = ep.graph_module
    by_binary = {c["binary"]: c for c in vela_calls}
    segments: list[dict[str, Any]] = []
    delegates: list[dict[str, Any]] = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        if "executorch_call_delegate" in str(node.target):
            lowered = getattr(gm, node.args[0].target)
            ops: dict[str, int] = {}
            folded = 0  # quantize/dequantize pairs inside: integer arithmetic on the NPU
            for inner in lowered.original_module.graph.nodes:
                if inner.op != "call_function" or inner.target is operator.getitem:
                    continue
                name = _op_name(inner.target)
                if name.startswith("quantized_decomposed::"):
                    folded += 1
                else:
                    ops[name] = ops.get(name, 0) + 1
            call = by_binary.get(bytes(lowered.processed_bytes))
            entry = {"index": len(delegates), "backend": lowered.backend_id, "ops": ops,
                     "num_ops": sum(ops.values()), "folded_quant_ops": folded,
                     "vela": _parse_vela_summary(call["vela_output"]) if call else {}}
            delegates.append({**entry, "_tosa": call["tosa"] if call else None,
                              "_module": node.args[0].target})
            segments.append({"kind": "delegate", **entry})
        else:
            name = _op_name(node.target)
            if segments and segments[-1]["kind"] == "cpu":
                segments[-1]["ops"].append(name)
            else:
                segments.append({"kind": "cpu", "ops": [name]})
    return segments, delegates


def _tosa_reference(ep: Any, delegates: list[dict[str, Any]], inputs: tuple[Any, ...],
                    reference: list[Any], output_quant: list[QuantParams | None]
                    ) -> tuple[dict[str, Any], list[Any] | None]:
    """Run the lowered program on the host with each Ethos-U delegate replaced by its TOSA graph
    run in the TOSA reference model (tosa-tools), which is bit-exact to the integer
    semantics Vela compiles. CPU ops (quantize/dequantize, fallbacks) run as their edge ops in
    PyTorch. Returns (report, outputs or None); best effort, a failure is recorded."""
    import numpy as np
    import torch

    try:
        import tosa_reference_model as refmodel
    except ImportError as e:
        return {"ran": False, "error": f"tosa_reference_model not importable: {e}"}, None
    tosa_of = {d["_module"]: d["_tosa"] for d in delegates}
    if any(t is None for t in tosa_of.values()):
        return {"ran": False, "error": "a delegate's TOSA graph was not captured"}, None

    def to_np(t: torch.Tensor) -> np.ndarray:
        order = list(t.dim_order())
        return np.ascontiguousarray(t.detach().permute(order).numpy())

    def from_np(a: np.ndarray, like: Any) -> torch.Tensor:
        order = list(like.dim_order())
        physical = [int(like.shape[d]) for d in order]
        t = torch.from_numpy(np.ascontiguousarray(a)).reshape(physical)
        return t.permute([order.index(i) for i in range(len(order))]).contiguous()

    class Interp(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:
            self.current_node = n
            return super().run_node(n)

        def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
            if "executorch_call_delegate" not in str(target):
                return super().call_function(target, args, kwargs)
            lowered, *tensors = args
            name = self.current_node.args[0].target
            outputs, status = refmodel.run(tosa_of[name], [to_np(t) for t in tensors],
                                           initialize_variable_tensor_from_numpy=True)
            if status != refmodel.GraphStatus.TOSA_VALID:
                raise RuntimeError(f"TOSA reference model: {status} for {name}")
            inner_out = next(n for n in lowered.original_module.graph.nodes if n.op == "output")
            likes = [n.meta["val"] for n in inner_out.args[0]]
            return tuple(from_np(a, like) for a, like in zip(outputs, likes, strict=True))

    try:
        with torch.no_grad():
            out = _flatten_tensors(Interp(ep.module()).run(*[t.clone() for t in inputs]))
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return {"ran": False, "error": f"{type(e).__name__}: {msg}"[:500]}, None
    if len(out) != len(reference):
        return {"ran": False, "error": f"{len(out)} outputs, reference has {len(reference)}"}, None
    diffs = _max_abs_diff([_to_numpy(t) for t in out], [_to_numpy(t) for t in reference])
    steps = _in_steps(diffs, output_quant)
    return {"ran": True, "delegates": len(delegates),
            "max_abs_diff_vs_pt2e": max(diffs) if diffs else 0.0,
            "max_diff_output_steps": max((s for s in steps if s is not None), default=None),
            "bit_exact": all(d == 0.0 for d in diffs)}, out


def _flow_ethos_u_int8(spec: ModelSpec, st: _Stages, npu: dict[str, Any]) -> dict[str, Any]:
    with st.step("import torch/executorch"):
        import torch
        from executorch.backends.arm.ethosu import EthosUCompileSpec, EthosUPartitioner
        from executorch.backends.arm.quantizer import (
            EthosUQuantizer,
            get_symmetric_quantization_config,
        )
        from executorch.backends.cortex_m.passes.replace_quant_nodes_pass import (
            ReplaceQuantNodesPass,
        )
        from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    inputs = tuple(t.clone().contiguous() for t in spec.example_inputs)
    calibration = [tuple(t.clone().contiguous() for t in s) for s in spec.calibration_inputs]
    with st.step("EthosUCompileSpec", "Check the board's npu section against Vela's vela.ini."):
        compile_spec = EthosUCompileSpec(npu["target"], system_config=npu["system_config"],
                                         memory_mode=npu["memory_mode"])
    quantizer = EthosUQuantizer(compile_spec)
    quantizer.set_global(get_symmetric_quantization_config(is_per_channel=True))
    converted, reference, eager = _quantize_pt2e(spec, st, inputs, calibration, quantizer)
    with st.step("torch.export (quantized)"):
        qep = torch.export.export(converted, inputs)
    with st.step("to_edge_transform_and_lower (EthosUPartitioner: TOSA -> Vela)",
                 "Vela or the TOSA lowering rejected the model; see the log."), \
            _capture_vela() as vela_calls:
        edge = to_edge_transform_and_lower(
            qep, partitioner=[EthosUPartitioner(compile_spec)],
            compile_config=EdgeCompileConfig(_check_ir_validity=False))
    with st.step("ReplaceQuantNodesPass (leftover q/dq -> cortex_m)"):
        # As aot_arm_compiler.py at v1.4.1: quantize/dequantize left outside the delegates
        # become cortex_m ops, so the firmware needs no quantized_decomposed kernels.
        edge = edge.transform([ReplaceQuantNodesPass()])
        lowered = edge.exported_program()
        input_quant, output_quant = _io_quant(lowered)
        segments, delegates = _partition_report(lowered, vela_calls)
    with st.step("TOSA reference model"):
        tosa_check, tosa_out = _tosa_reference(lowered, delegates, inputs, reference,
                                               output_quant)
    pt2e_reference = reference
    if tosa_out is not None:
        # The device is compared with the integer semantics the NPU implements: the lowered
        # program with its delegates run by the TOSA reference model. The PT2E model (float
        # simulation of the quantization) drifts from it by rounding, layer after layer.
        reference = tosa_out
    with st.step("to_executorch"):
        from executorch.exir import ExecutorchBackendConfig

        # Delegate blobs inline in the program (as aot_arm_compiler.py writes them).
        pte = bytes(edge.to_executorch(
            config=ExecutorchBackendConfig(extract_delegate_segments=False)).buffer)
    partition = {"backend": ETHOS_U_BACKEND, "segments": segments,
                 "delegates": [{k: v for k, v in d.items() if not k.startswith("_")}
                               for d in delegates]}
    return {"pte": pte, "reference": reference, "eager": eager, "inputs": inputs,
            "input_quant": input_quant, "output_quant": output_quant,
            "dialect_check": None, "tosa_check": tosa_check, "partition": partition,
            "extra": {}, "ethos_u": npu, "pt2e_reference": pt2e_reference,
            "reference_kind": TOSA_REFERENCE_KIND if tosa_out is not None
            else REFERENCE_KINDS["ethos_u_int8"]}


# ---------------------------------------------------------------------------------------------


def _gen_oplist(pte: bytes, work: Path) -> bytes:
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


def _remove_outputs(out_dir: Path, names: tuple[str, ...]) -> None:
    for name in names:
        (out_dir / name).unlink(missing_ok=True)


def _versions() -> dict[str, str]:
    import executorch.version as etv
    import torch

    return {"torch": torch.__version__, "executorch": getattr(etv, "__version__", "?"),
            "executorch_git": getattr(etv, "git_version", "?")}


def export(spec: ModelSpec, flow: str, out_dir: Path, cpu: str = "cortex-m55",
           npu: dict[str, Any] | None = None,
           input_sets: list[tuple[Any, ...]] | None = None,
           options: ExportOptions | None = None) -> ExportResult:
    """Export `spec` through `flow` into `out_dir` (see the module docstring).

    `options`: the build profile's export choices (default: folded constants, float I/O).

    `npu` (ethos_u_int8 only) is the board's NPU: its `npu:` section with any --npu-macs /
    --npu-memory-mode override applied, or `NpuConfig.export_settings()`.

    Raises ConfigError for a bad flow/CPU, ExportError (with `log_path` to a full traceback)
    when a step fails. On failure no `.pte` (nor any other output but the error log) is left.
    """
    import numpy as np

    if flow not in FLOWS:
        raise ConfigError(f"Unknown flow '{flow}'.", f"Use one of: {', '.join(FLOWS)}.")
    options = options or ExportOptions()
    parse_cpu(cpu)
    if flow == "cortex_m_int8":
        _target_config(cpu)  # validate before any heavy work
    npu_settings = npu_export_settings(npu) if flow == "ethos_u_int8" else None

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    outputs = (REPORT_NAME, PTE_NAME, OPS_YAML_NAME, REFERENCE_NAME)
    _remove_outputs(out_dir, outputs + (ERROR_LOG_NAME,))  # never leave a stale mix behind

    st = _Stages(flow, spec.name)
    t_start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            if flow == "portable_fp32":
                art = _flow_portable_fp32(spec, st, options)
            elif flow == "ethos_u_int8":
                assert npu_settings is not None
                art = _flow_ethos_u_int8(spec, st, npu_settings)
            else:
                art = _flow_cortex_m_int8(spec, st, cpu, options)
            pte: bytes = art["pte"]
            with st.step("read .pte"):
                info = read_pte_info(pte)
            with st.step("gen_oplist"), tempfile.TemporaryDirectory(prefix="dk-oplist-") as tmp:
                ops_yaml = _gen_oplist(pte, Path(tmp))
                op_list = _ops_from_yaml(ops_yaml)
            set_inputs, set_references = _reference_sets(art, input_sets, st)
        export_seconds = round(time.perf_counter() - t_start, 3)

        inputs_np = [_to_numpy(t) for t in art["inputs"]]
        reference_np = [_to_numpy(t) for t in art["reference"]]
        eager_np = [_to_numpy(t) for t in art["eager"]]
        if len(reference_np) != len(info.outputs) or len(inputs_np) != len(info.inputs):
            raise ExportError(
                f"The .pte has {len(info.inputs)} inputs/{len(info.outputs)} outputs but the "
                f"model has {len(inputs_np)}/{len(reference_np)}.",
                "Report this: the exported program does not match the model's signature.")
        diffs = _max_abs_diff(reference_np, eager_np)
        warn = _checks(flow, spec.name, op_list, info, options)
        tc = art.get("tosa_check")
        if tc is not None and not tc.get("ran"):
            warn.append(f"The TOSA reference model did not run ({tc.get('error')}); the "
                        "reference is the quantized PT2E model, which can differ from the NPU "
                        "by a few output steps.")
        dc = art["dialect_check"]
        if dc is not None and dc.get("ran") and not dc.get("bit_exact"):
            warn.append("The cortex_m ops' integer reference (reference.npz, what the device is "
                        "compared with) differs from the PT2E float simulation by "
                        f"{dc['max_diff_output_steps']} output steps (pt2e_output_* in "
                        "reference.npz).")

        tolerance, tol_source = _tolerance(spec, flow, art["output_quant"])
        pte_sha = hashlib.sha256(pte).hexdigest()

        npz = io.BytesIO()
        np.savez(npz, **{f"input_{i}": a for i, a in enumerate(inputs_np)},
                 **{f"output_{i}": a for i, a in enumerate(reference_np)},
                 **{f"eager_output_{i}": a for i, a in enumerate(eager_np)},
                 **{f"pt2e_output_{i}": _to_numpy(t)
                    for i, t in enumerate(art.get("pt2e_reference") or [])},
                 **{f"set{k}_input_{i}": a for k, xs in enumerate(set_inputs)
                    for i, a in enumerate(xs)},
                 **{f"set{k}_output_{i}": a for k, ys in enumerate(set_references)
                    for i, a in enumerate(ys)})

        report = {
            "schema_version": REPORT_SCHEMA_VERSION,
            "model": spec.name,
            "model_source": str(spec.source_path),
            "flow": flow,
            "cpu": cpu,
            "options": dataclasses.asdict(options),
            **({"cortex_m_target": art["extra"]} if art["extra"] else {}),
            **({"ethos_u": art["ethos_u"], "partition": art["partition"]}
               if "partition" in art else {}),
            "versions": _versions(),
            "pte": {"file": PTE_NAME, "size": len(pte), "sha256": pte_sha},
            "ops_yaml": OPS_YAML_NAME,
            "op_list": op_list,
            "kernel_calls": info.kernel_calls,
            **({"non_cortex_m_ops": [o for o in op_list if not o.startswith("cortex_m::")]}
               if flow == "cortex_m_int8" else {}),
            "num_delegates": info.num_delegates,
            "planned_buffer_sizes": info.planned_buffer_sizes,
            "inputs": _tensor_entries("input", inputs_np, info.inputs, art["input_quant"]),
            "outputs": _tensor_entries("output", reference_np, info.outputs,
                                       art["output_quant"]),
            "reference": {
                "kind": art.get("reference_kind", REFERENCE_KINDS[flow]),
                "file": REFERENCE_NAME,
                "eager_max_abs_diff": max(diffs) if diffs else 0.0,
                "eager_max_abs_diff_per_output": diffs,
                "eager_max_abs_diff_in_output_steps": _in_steps(diffs, art["output_quant"]),
                "output_range": [float(a.max() - a.min()) if a.size else 0.0
                                 for a in reference_np],
                **({"cortex_m_dialect_check": art["dialect_check"]}
                   if art["dialect_check"] is not None else {}),
                **({"tosa_reference_check": art["tosa_check"]} if "tosa_check" in art else {}),
            },
            "tolerance": tolerance,
            "tolerance_source": tol_source,
            "export_seconds": export_seconds,
            "timings": st.timings,
            "warnings": warn,
        }

        with st.step("write outputs"):
            write_atomic(out_dir / PTE_NAME, pte)
            write_atomic(out_dir / OPS_YAML_NAME, ops_yaml)
            write_atomic(out_dir / REFERENCE_NAME, npz.getvalue())
            write_atomic(out_dir / REPORT_NAME, json.dumps(report, indent=2) + "\n")
    except BaseException as e:
        _remove_outputs(out_dir, outputs)
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
        reference_kind=art.get("reference_kind", REFERENCE_KINDS[flow]), eager_outputs=eager_np,
        eager_max_abs_diff=max(diffs) if diffs else 0.0,
        input_quant=list(art["input_quant"]), output_quant=list(art["output_quant"]),
        tolerance=tolerance, tolerance_source=tol_source,
        export_seconds=export_seconds, pte_size=len(pte), pte_sha256=pte_sha,
        planned_buffer_sizes=info.planned_buffer_sizes, kernel_calls=info.kernel_calls,
        timings=dict(st.timings), warnings=warn,
        input_sets=set_inputs or [inputs_np], reference_sets=set_references or [reference_np],
    )


def _reference_sets(art: dict[str, Any], input_sets: list[tuple[Any, ...]] | None,
                    st: _Stages) -> tuple[list[list[np.ndarray]], list[list[np.ndarray]]]:
    """Host reference outputs for each extra input set (`deploykit run --inputs DIR`)."""
    if not input_sets:
        return [], []
    fn = art.get("reference_fn")
    if fn is None:
        raise ConfigError("This export flow cannot compute host references for an input set.",
                          "Run without --inputs (the model's example inputs are used).")
    prepare = art["prepare_input"]
    # A flow whose inputs depend on their position (int8 I/O) prepares a whole set at once.
    prepare_all = art.get("prepare_inputs") or (lambda xs: tuple(prepare(t) for t in xs))
    inputs, references = [], []
    with st.step(f"host reference for {len(input_sets)} input set(s)"):
        for sample in input_sets:
            xs = prepare_all(sample)
            inputs.append([_to_numpy(t) for t in xs])
            references.append([_to_numpy(t) for t in fn(xs)])
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
        pte_sha256=report["pte"]["sha256"], planned_buffer_sizes=report["planned_buffer_sizes"],
        kernel_calls=report["kernel_calls"], timings=report["timings"],
        warnings=report["warnings"])


def _tensor_entries(prefix: str, arrays: list[np.ndarray], tensors: list[PteTensor],
                    quant: list[QuantParams | None]) -> list[dict[str, Any]]:
    return [{"name": f"{prefix}_{i}", "shape": list(a.shape), "dtype": str(a.dtype),
             "pte_dtype": t.dtype, "dim_order": t.dim_order, "nbytes": int(a.nbytes),
             "quant": q.to_dict() if q else None}
            for i, (a, t, q) in enumerate(zip(arrays, tensors, quant, strict=True))]


def _in_steps(diffs: list[float], quant: list[QuantParams | None]) -> list[float | None]:
    return [d / q.scale if q else None for d, q in zip(diffs, quant, strict=True)]


def _checks(flow: str, model: str, op_list: list[str], info: PteInfo,
            options: ExportOptions | None = None) -> list[str]:
    """Verify the op list fits the flow; return warnings for the report."""
    warn: list[str] = []
    if flow == "portable_fp32":
        bad = [o for o in op_list if o.startswith("cortex_m::")]
        if bad:
            raise ExportError(f"portable_fp32 export of '{model}' contains Cortex-M ops: {bad}.",
                              "Report this: the fp32 flow must use portable kernels only.")
        if info.kernel_calls.get("aten::permute_copy.out") and (options or ExportOptions()
                                                                 ).fold_constants:
            warn.append("aten::permute_copy.out remains after constant_prop_pass: some "
                        "transposes run at inference time.")
    elif flow == "ethos_u_int8":
        if info.num_delegates == 0:
            raise ExportError(f"ethos_u_int8 export of '{model}' delegated nothing to the "
                              "Ethos-U.", "No layer of the model is supported by the "
                              "EthosUPartitioner; use the cortex_m_int8 flow.")
        rest = [o for o in op_list if not o.startswith("cortex_m::")]
        if rest:
            warn.append("Some operators run on the CPU as portable kernels between the NPU "
                        f"delegates (the firmware must include them): {', '.join(rest)}.")
        if info.num_delegates > 1:
            warn.append(f"The graph is split into {info.num_delegates} Ethos-U delegates; "
                        "each boundary costs a round trip through the CPU.")
    else:
        rest = [o for o in op_list if not o.startswith("cortex_m::")]
        if rest:
            warn.append("Not all operators were lowered to cortex_m; these run as portable "
                        f"kernels (the firmware must include them): {', '.join(rest)}.")
        if not any(o.startswith("cortex_m::quantized_") for o in op_list):
            warn.append("No cortex_m::quantized_* operator: nothing runs in int8 CMSIS-NN "
                        "kernels. Check that the model uses supported layers.")
    return warn


def _tolerance(spec: ModelSpec, flow: str,
               output_quant: list[QuantParams | None]) -> tuple[dict[str, float], str]:
    tol = spec.tolerance_for(flow)
    if tol:
        return {"atol": tol.get("atol", 0.0), "rtol": tol.get("rtol", 0.0)}, "model"
    if flow == "portable_fp32":
        return dict(DEFAULT_FP32_TOLERANCE), "default"
    scales = [q.scale for q in output_quant if q is not None]
    atol = DEFAULT_INT8_STEPS * max(scales) if scales else 1e-2
    return {"atol": atol, "rtol": 0.0}, "default"
