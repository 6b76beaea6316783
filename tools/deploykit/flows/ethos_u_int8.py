"""ethos_u_int8: int8 on an Arm Ethos-U NPU (TOSA -> Vela), leftovers on the CPU.

For the board's `npu:` section (`target_settings`): ``EthosUCompileSpec`` (target such as
``ethos-u85-256``, Vela system config and memory mode) -> ``EthosUQuantizer`` (symmetric,
per-channel) -> PT2E prepare / calibrate / convert (flows/pt2e.py) -> torch.export ->
``to_edge_transform_and_lower`` with ``EthosUPartitioner`` (TOSA, then Vela) ->
``ReplaceQuantNodesPass`` (quantize/dequantize left on the CPU become ``cortex_m::`` ops, as
aot_arm_compiler.py does) -> ``to_executorch`` with the delegate blobs inline. Inputs stay
NCHW. The reference is the lowered program run on the host with each delegate's TOSA graph
(the one Vela compiled) in the TOSA reference model of tosa-tools, and its CPU ops in PyTorch:
the NPU's integer semantics. Its difference from the converted PT2E model is recorded
(``reference.tosa_reference_check``; ``pt2e_output_<i>`` in reference.npz); the PT2E model is
the fallback reference when the TOSA run fails. Each delegate's TOSA flatbuffer is kept
beside the .pte as ``delegate_<i>.tosa`` (``deploykit explore --tosa``). ``export.json`` gets
``partition``: the graph in execution order (delegate segments with their edge ops and Vela's
summary and per-operator estimate (flows/vela.py), CPU op runs), keyed by delegate index,
which ``deploykit inspect`` shows.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploykit.flows.base import (
    DELEGATE_TOSA_NAME,
    ExportOptions,
    ExportTarget,
    Flow,
    FlowResult,
    QuantParams,
)
from deploykit.flows.common import flatten_tensors, in_steps, max_abs_diff, to_numpy
from deploykit.flows.pt2e import io_quant, quantize_pt2e
from deploykit.flows.vela import compile_with_report, parse_per_layer, parse_summary
from deploykit.readers.npu import ETHOS_U_BACKEND, npu_firmware_definitions
from deploykit.readers.op_coverage import model_line
from deploykit.util.errors import ConfigError, EnvironmentProblem, ExportError

if TYPE_CHECKING:
    from deploykit.flows.common import Stages
    from deploykit.memory.plan import MemoryPlan
    from deploykit.program.models import ModelSpec
    from deploykit.readers.boards import Board
    from deploykit.readers.pte_reader import PteInfo
    from deploykit.readers.sources import Workspace

TOSA_REFERENCE_KIND = "tosa-reference-model"


class EthosUInt8(Flow):
    name = "ethos_u_int8"
    summary = "int8 on an Arm Ethos-U55/U85 NPU (TOSA, Vela), leftovers on the Cortex-M"
    quantization = "int8 PT2E with EthosUQuantizer (symmetric, per-channel weights)"
    lowering = ("EthosUPartitioner: TOSA, compiled by Vela for the board's NPU and memory "
                "mode; quantize/dequantize left outside become cortex_m ops")
    host_reference = ("the lowered program with each delegate run by the TOSA reference model "
                      "(the NPU's integer semantics), else the quantized PT2E model")
    needs_npu = True
    quantized = True
    fallback_reference_kind = "pt2e-quantized-torch"
    # Vela compiles the delegated graph into one command stream and places its tensors in
    # the NPU's memories itself (it cascades the first layers in stripes on its own); tiles
    # made before it would only be more operators for it to place.
    patches_refusal = ("Vela compiles the graph into one NPU command stream and plans the "
                       "NPU's SRAM itself (with its own cascading of the first layers), so "
                       "tiles made before it would not change ExecuTorch's planned buffers")

    def applies_to(self, board: Board) -> str | None:
        return None if board.npu is not None else f"{board.name} has no NPU"

    def target_settings(self, board: Board) -> dict[str, Any] | None:
        npu = board.npu
        return npu.export_settings() if npu is not None else None

    def target_description(self, target: ExportTarget) -> str:
        s = npu_export_settings(target.settings)
        return f"{s['target']} ({s['memory_mode']})"

    def validate(self, target: ExportTarget) -> None:
        super().validate(target)
        npu_export_settings(target.settings)

    def lower(self, spec: ModelSpec, stages: Stages, target: ExportTarget,
              options: ExportOptions) -> FlowResult:
        st = stages
        npu = npu_export_settings(target.settings)
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
            from executorch.exir import (
                EdgeCompileConfig,
                ExecutorchBackendConfig,
                to_edge_transform_and_lower,
            )

        inputs = tuple(t.clone().contiguous() for t in spec.example_inputs)
        calibration = [tuple(t.clone().contiguous() for t in s) for s in spec.calibration_inputs]
        with st.step("EthosUCompileSpec", "Check the board's npu section against Vela's "
                     "vela.ini."):
            compile_spec = EthosUCompileSpec(npu["target"], system_config=npu["system_config"],
                                             memory_mode=npu["memory_mode"])
        quantizer = EthosUQuantizer(compile_spec)
        quantizer.set_global(get_symmetric_quantization_config(is_per_channel=True))
        converted, reference, eager = quantize_pt2e(spec, st, inputs, calibration, quantizer)
        with st.step("torch.export (quantized)"):
            qep = torch.export.export(converted, inputs)
        with st.step("to_edge_transform_and_lower (EthosUPartitioner: TOSA -> Vela)",
                     "Vela or the TOSA lowering rejected the model; see the log."), \
                _capture_vela(spec.source_path) as vela_calls:
            edge = to_edge_transform_and_lower(
                qep, partitioner=[EthosUPartitioner(compile_spec)],
                compile_config=EdgeCompileConfig(_check_ir_validity=False))
        with st.step("ReplaceQuantNodesPass (leftover q/dq -> cortex_m)"):
            # As aot_arm_compiler.py at v1.4.1: quantize/dequantize left outside the
            # delegates become cortex_m ops, so the firmware needs no quantized_decomposed
            # kernels.
            edge = edge.transform([ReplaceQuantNodesPass()])
            lowered = edge.exported_program()
            input_quant, output_quant = io_quant(lowered)
            segments, delegates = _partition_report(lowered, vela_calls)
        with st.step("TOSA reference model"):
            tosa_check, tosa_out = _tosa_reference(lowered, delegates, inputs, reference,
                                                   output_quant)
        pt2e_reference = reference
        warnings = []
        if tosa_out is not None:
            # The device is compared with the integer semantics the NPU implements: the
            # lowered program with its delegates run by the TOSA reference model. The PT2E
            # model (float simulation of the quantization) drifts from it by rounding, layer
            # after layer.
            reference = tosa_out
        else:
            warnings.append(f"The TOSA reference model did not run ({tosa_check.get('error')});"
                            " the reference is the quantized PT2E model, which can differ from "
                            "the NPU by a few output steps.")
        with st.step("to_executorch"):
            # Delegate blobs inline in the program (as aot_arm_compiler.py writes them).
            pte = bytes(edge.to_executorch(
                config=ExecutorchBackendConfig(extract_delegate_segments=False)).buffer)
        # Each delegate's TOSA flatbuffer, the graph Vela compiled, kept beside the .pte for
        # `deploykit explore --tosa`.
        tosa_files = {DELEGATE_TOSA_NAME.format(index=d["index"]): d["_tosa"]
                      for d in delegates if d["_tosa"] is not None}
        for d in delegates:
            name = DELEGATE_TOSA_NAME.format(index=d["index"])
            d["tosa_file"] = name if name in tosa_files else None
        partition = {"backend": ETHOS_U_BACKEND, "segments": segments,
                     "delegates": [{k: v for k, v in d.items() if not k.startswith("_")}
                                   for d in delegates]}
        return FlowResult(
            pte=pte, inputs=inputs, reference=reference, eager=eager,
            input_quant=input_quant, output_quant=output_quant,
            reference_kind=TOSA_REFERENCE_KIND if tosa_out is not None
            else self.fallback_reference_kind,
            reference_fn=None, prepare_inputs=None, pt2e_reference=pt2e_reference,
            report={"ethos_u": npu, "partition": partition},
            reference_report={"tosa_reference_check": tosa_check}, warnings=warnings,
            files=tosa_files)

    def check_program(self, model: str, op_list: list[str], info: PteInfo,
                      options: ExportOptions) -> list[str]:
        if info.num_delegates == 0:
            raise ExportError(f"ethos_u_int8 export of '{model}' delegated nothing to the "
                              "Ethos-U.", "No layer of the model is supported by the "
                              "EthosUPartitioner; use the cortex_m_int8 flow.")
        warn = []
        rest = [o for o in op_list if not o.startswith("cortex_m::")]
        if rest:
            warn.append("Some operators run on the CPU as portable kernels between the NPU "
                        f"delegates (the firmware must include them): {', '.join(rest)}.")
        if info.num_delegates > 1:
            warn.append(f"The graph is split into {info.num_delegates} Ethos-U delegates; "
                        "each boundary costs a round trip through the CPU.")
        return warn

    def firmware_definitions(self, board: Board, workspace: Workspace, out: Path,
                             plan: MemoryPlan) -> dict[str, str]:
        """The NPU firmware's CMake definitions (npu.npu_firmware_definitions: Arm's Ethos-U
        core driver and CMSIS_6 from the workspace, the board's NPU configuration), so the
        runner links ExecuTorch's EthosUBackend. Without those sources the build stops here,
        after the export and the plan, saying so."""
        try:
            return npu_firmware_definitions(board, workspace, plan)
        except EnvironmentProblem as exc:
            raise EnvironmentProblem(
                f"{exc.cause} The export and memory plan are done: {out / 'export'}, "
                f"{out / 'plan.json'}.",
                f"{exc.hint}\nThe driver may be Arm's repository (pinned, Arm's GitLab) or "
                "Zephyr's module zephyrproject-rtos/hal_ethos_u (GitHub). CPU-only firmware for "
                "this board needs neither: --flow cortex_m_int8.") from exc


def npu_export_settings(npu: dict[str, Any] | None) -> dict[str, Any]:
    """Normalise the NPU settings given to `export` into {type, macs, target, system_config,
    memory_mode}. Accepts a board file's `npu:` section (type, macs, vela{...}) or the already
    flat form (`deploykit.readers.npu.NpuConfig.export_settings()`). MAC count and mode are
    validated."""
    from deploykit.readers.npu import DEFAULT_MACS, check_macs, check_memory_mode

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


@contextlib.contextmanager
def _capture_vela(model_file: Path | None) -> Iterator[list[dict[str, Any]]]:
    """Record, for each Vela compilation of the Ethos-U backend, the TOSA flatbuffer it was
    given, the binary it returned, what Vela printed (its network summary and, asked for with
    --verbose-cycle-estimate, its cycle estimate) and its per-operator report
    (--verbose-performance, flows/vela.py); neither flag changes the command stream.

    The backend calls `vela_compile` through its module's global name, which is swapped for a
    recording wrapper for the duration (and always restored). So is the TOSA lowering's
    `process_call_function`, called for each node of a delegate's graph just before its Vela
    compile, to note where each node comes from in the model: Vela names an operator by its
    TOSA node."""
    from executorch.backends.arm.ethosu import backend as ethosu_backend
    from executorch.backends.arm.tosa import backend as tosa_backend

    calls: list[dict[str, Any]] = []
    origins: dict[str, str] = {}  # TOSA node name -> model line, of the delegate being lowered
    original = ethosu_backend.vela_compile
    original_visit = tosa_backend.process_call_function

    def recording(tosa_flatbuffer: bytes, flags: list[str], *args: Any, **kwargs: Any) -> bytes:
        binary, printed, per_layer = compile_with_report(original, tosa_flatbuffer, flags,
                                                         *args, **kwargs)
        calls.append({"tosa": bytes(tosa_flatbuffer), "binary": binary,
                      "vela_output": printed,
                      "layers": parse_per_layer(per_layer, dict(origins))})
        origins.clear()
        return binary

    def visiting(node: Any, *args: Any, **kwargs: Any) -> Any:
        origin = _model_origin(node, model_file)
        if origin:
            origins[node.name] = origin
        return original_visit(node, *args, **kwargs)

    ethosu_backend.vela_compile = recording
    tosa_backend.process_call_function = visiting
    try:
        yield calls
    finally:
        ethosu_backend.vela_compile = original
        tosa_backend.process_call_function = original_visit


def _model_origin(node: Any, model_file: Path | None) -> str | None:
    """Where a node of the backend's graph comes from: the module it was called in
    (`features.0.0 (Conv2d)`) and the model file's line in its stack trace, those of them the
    graph knows. Only the model file's frames are named: another frame would name this
    machine's paths."""
    modules = [m for m in (node.meta.get("nn_module_stack") or {}).values()
               if isinstance(m, tuple) and m and m[0]]
    module = (f"{modules[-1][0]} ({str(modules[-1][1]).rsplit('.', 1)[-1]})" if modules
              else None)
    line = model_line(node.meta.get("stack_trace") or "", model_file)
    if not (line and model_file is not None and line.startswith(f"{model_file.name}:")):
        line = None
    return ", ".join(x for x in (module, line) if x) or None


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
                     "vela": parse_summary(call["vela_output"]) if call else {},
                     "vela_layers": call["layers"] if call else []}
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
            out = flatten_tensors(Interp(ep.module()).run(*[t.clone() for t in inputs]))
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return {"ran": False, "error": f"{type(e).__name__}: {msg}"[:500]}, None
    if len(out) != len(reference):
        return {"ran": False, "error": f"{len(out)} outputs, reference has {len(reference)}"}, None
    diffs = max_abs_diff([to_numpy(t) for t in out], [to_numpy(t) for t in reference])
    steps = in_steps(diffs, output_quant)
    return {"ran": True, "delegates": len(delegates),
            "max_abs_diff_vs_pt2e": max(diffs) if diffs else 0.0,
            "max_diff_output_steps": max((s for s in steps if s is not None), default=None),
            "bit_exact": all(d == 0.0 for d in diffs)}, out
