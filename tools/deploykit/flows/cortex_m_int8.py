"""cortex_m_int8: int8 on the CMSIS-NN kernels of ExecuTorch's Cortex-M backend.

Each Conv1d as a Conv2d of height 1 (flows/conv1d_as_conv2d.py) -> ``CortexMQuantizer`` +
PT2E ``prepare_pt2e`` / calibrate / ``convert_pt2e`` (flows/pt2e.py) ->
torch.export -> ``to_edge_transform_and_lower`` with the Cortex-M edge config of
``backends/cortex_m/test/tester.py`` -> the passes of ``CortexMPassManager`` for the board CPU
(``CortexMTargetConfig``: MVE/DSP/scalar CMSIS-NN paths take differently laid-out constants,
so the ``.pte`` is CPU-specific); where they fail, the failing operator is kept in float and
the whole is redone (flows/mixed_precision.py) -> LayerNorm float islands to
``deploykit::quantized_layer_norm`` (flows/layer_norm_int8.py) -> elementwise float islands to
int8 table lookups (flows/elementwise_lut.py) -> float linears to ``addmm``
(flows/cortex_m_float_linear.py) -> ``to_executorch``. 4-D float inputs are made
channels-last (the CMSIS-NN kernels are NHWC), so such an input's bytes are NHWC on the
device: see ``input_dim_orders`` / ``export.memory_order_bytes``. The ``.pte`` cannot run on
the host (no ``cortex_m::`` kernels there), so the reference is the lowered graph run through the
cortex_m ops' Python reference code (integer arithmetic modelled on CMSIS-NN), else the
converted PT2E model run in PyTorch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import traceback
from typing import TYPE_CHECKING, Any

from deploykit.flows.base import (
    NOTES_NAME,
    ExportOptions,
    ExportTarget,
    Flow,
    FlowResult,
    QuantParams,
)
from deploykit.flows.cmsis_nn_checks import refusals
from deploykit.flows.common import flatten_tensors, in_steps, max_abs_diff, parse_cpu, to_numpy
from deploykit.flows.conv1d_as_conv2d import Conv1dRewrite, conv1d_as_conv2d
from deploykit.flows.cortex_m_float_linear import decompose_float_linear_pass
from deploykit.flows.early_batch_matmul import early_batch_matmul_pass
from deploykit.flows.elementwise_lut import REPORT_KEY as LOOKUP_TABLES
from deploykit.flows.elementwise_lut import elementwise_lookup_tables
from deploykit.flows.layer_norm_int8 import REPORT_KEY as INT8_LAYER_NORMS
from deploykit.flows.layer_norm_int8 import int8_layer_norms
from deploykit.flows.memory_planning import InPlacePlanning
from deploykit.flows.mixed_precision import (
    MAX_FALLBACKS,
    FloatChoice,
    LoweringFailure,
    UpstreamFailure,
    choice_for,
    excluding,
    failing_node,
    float_compute,
    op_base,
    summary,
)
from deploykit.flows.one_channel_conv import (
    drop_one_channel_layout_clones,
    one_channel_depthwise_as_conv,
)
from deploykit.flows.patches import OFF, Tiler, share_constants
from deploykit.flows.pt2e import dequantize, io_quant, quantize, quantize_pt2e
from deploykit.readers.op_coverage import deploykit_kernel_ops, model_line
from deploykit.util.errors import ConfigError, ExportError

if TYPE_CHECKING:
    from deploykit.flows.common import Stages
    from deploykit.program.models import ModelSpec
    from deploykit.readers.pte_reader import PteInfo

# The cortex_m ops' own Python reference (integer arithmetic modelled on CMSIS-NN) run on the
# lowered graph: what the device computes, where PT2E's float simulation drifts by rounding.
CORTEX_M_REFERENCE_KIND = "cortex_m-integer-reference"
# The int8 operators of the flow's programs: the Cortex-M backend's (CMSIS-NN) and deploykit's
# own (flows/deploykit_ops.py, firmware/kernels).
INT8_NAMESPACES = ("cortex_m::", "deploykit::")


class CortexMInt8(Flow):
    name = "cortex_m_int8"
    summary = "int8 on CMSIS-NN through ExecuTorch's cortex_m backend (any Cortex-M)"
    quantization = "int8 PT2E with CortexMQuantizer (per-tensor activations)"
    lowering = ("to_edge_transform_and_lower + CortexMPassManager for the board CPU's "
                "CMSIS-NN path (MVE, DSP or scalar); what it cannot take stays float "
                "(mixed precision, --strict to refuse)")
    host_reference = ("the lowered graph through the cortex_m ops' integer reference "
                      "(CMSIS-NN semantics), else the quantized PT2E model")
    quantized = True
    fallback_reference_kind = "pt2e-quantized-torch"
    patches_refusal = ""

    def validate(self, target: ExportTarget) -> None:
        super().validate(target)
        _target_config(target.cpu)

    def lower(self, spec: ModelSpec, stages: Stages, target: ExportTarget,
              options: ExportOptions) -> FlowResult:
        st = stages
        with st.step("import torch/executorch"):
            import torch
            from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer
            from executorch.exir import to_edge_transform_and_lower
            from executorch.exir.program._program import _transform

        cpu_target = _target_config(target.cpu)

        def nhwc(t: torch.Tensor) -> torch.Tensor:
            t = t.clone()
            if t.dim() == 4 and t.is_floating_point():
                return t.to(memory_format=torch.channels_last)
            return t

        inputs = tuple(nhwc(t) for t in spec.example_inputs)
        calibration = [tuple(nhwc(t) for t in sample) for sample in spec.calibration_inputs]

        excluded: list[FloatChoice] = []
        upstream: UpstreamFailure | None = None
        conv1d = Conv1dRewrite((), ())
        tiler = None
        patches_report: dict[str, Any] = {}
        if options.patches != OFF:
            tiler = Tiler(options.patches, quantized=True, plan_inputs=options.plan_inputs,
                          int8_inputs=options.int8_io)
            with st.step("patches (the grid and the split)"):
                probe = torch.export.export(spec.module, inputs).module(check_guards=False)
                plan = tiler.choose(probe)
                patches_report = tiler.report
                if plan is None:
                    tiler = None  # left unpatched: the program is the one without patches

        def conv1d_rewrite(graph_module: Any) -> None:
            # CMSIS-NN has no 1-D convolution: each Conv1d becomes a Conv2d of height 1.
            nonlocal conv1d
            conv1d = conv1d_as_conv2d(graph_module, spec.source_path)

        while True:
            quantizer = excluding(CortexMQuantizer(), excluded, spec.source_path)
            converted, reference, eager = quantize_pt2e(
                spec, st, inputs, calibration, quantizer, conv1d_rewrite,
                tiler.rewrite if tiler is not None else None)
            with st.step("torch.export (quantized)"):
                qep = torch.export.export(converted, inputs)
            with st.step("to_edge_transform_and_lower"):
                edge = to_edge_transform_and_lower(
                    qep, compile_config=_cortex_m_edge_compile_config(), generate_etrecord=True)
            with st.step("CortexMPassManager"):
                lowered, failure = _cortex_m_passes(edge.exported_program(), cpu_target)
                if failure is None:
                    failure = _unconverted_quantized_op(lowered)
            if failure is None:
                with st.step("one-channel depthwise convolutions to convolutions"):
                    one_channel_convs = one_channel_depthwise_as_conv(lowered, cpu_target)
                    layout_clones = drop_one_channel_layout_clones(lowered)
                with st.step(CMSIS_NN_CHECKS):
                    # What the kernels would refuse on the device (issue #32) falls back here,
                    # after the last rewrite that makes CMSIS-NN calls.
                    failure = _cmsis_nn_refusal(lowered, cpu_target)
            if failure is None:
                break
            choice = _fall_back(failure, spec, excluded, options, st)
            if upstream is None:
                upstream = failure.upstream(spec.source_path)
            excluded.append(choice)
        if tiler is not None:
            with st.step("patches: one placeholder per constant the tiles share"):
                patches_report["shared_constants"] = share_constants(lowered)

        def source_of(node: Any) -> str:
            return model_line(node.meta.get("stack_trace") or "", spec.source_path) or "?"

        with st.step("LayerNorm float islands to int8 layer norms"):
            layer_norms = int8_layer_norms(lowered, source_of)
        with st.step("elementwise float islands to int8 table lookups"):
            tables = elementwise_lookup_tables(lowered, source_of)
        with st.step("float linears to addmm"):
            lowered = _transform(lowered, decompose_float_linear_pass())
            if options.fold_constants:
                lowered = _fold_weight_transposes(lowered)
            # Upstream (tester.py, aot_arm_compiler.py) swaps the program in the same way.
            edge._edge_programs["forward"] = lowered
            input_quant, output_quant = io_quant(lowered)
        with st.step("mixed precision report"):
            mixed = float_compute(lowered.graph_module, spec.source_path)
            mixed["kept_in_float"] = [c.describe() for c in excluded]
            mixed.update(conv1d.report())
            mixed[LOOKUP_TABLES] = [t.describe() for t in tables]
            mixed[INT8_LAYER_NORMS] = [n.describe() for n in layer_norms]
            if upstream is not None:
                mixed["upstream_failure"] = dataclasses.asdict(upstream)
        with st.step("cortex_m dialect check"):
            # Before to_executorch, which rewrites the graph in place to out-variants.
            dialect_check, integer_model, integer_out = _dialect_check(
                lowered, inputs, reference, output_quant)
        pt2e_reference = reference
        if integer_out is not None:
            # The device is compared with the integer semantics CMSIS-NN implements, as the
            # Ethos-U flow uses the TOSA reference model; the PT2E difference stays in the
            # report.
            reference = integer_out
        int8_inputs: list[bool] = [False] * len(inputs)
        int8_outputs: list[bool] = [False] * len(reference)
        if options.int8_io:
            with st.step("int8 model I/O"):
                # The program's outputs are int8 now; output_quant keeps the parameters the
                # host dequantizes them with before comparing (device outputs are shown and
                # compared as floats, as with float I/O).
                int8_inputs, int8_outputs = _make_int8_io(lowered)
        with st.step("to_executorch"):
            # Cortex-M firmware has deploykit's copy kernels (firmware/kernels), so a slice or
            # join of a channels-last map stays channels-last (what the tiles of --patches cut
            # and join).
            # Its checked CMSIS-NN calls run a layer in place when output and input are one
            # tensor (flows/in_place.py).
            in_place = InPlacePlanning(cpu_target.backend)
            program = edge.to_executorch(options.backend_config(copies_in_memory_order=True,
                                                                in_place=in_place))
            pte = bytes(program.buffer)

        def to_device(xs: tuple[Any, ...]) -> tuple[Any, ...]:
            """Inputs as the program takes them: int8 where it starts with a quantize, made
            with the same op and parameters as the quantized model's own first step."""
            return tuple(quantize(t, q) if int8 and q else t
                         for t, int8, q in zip(xs, int8_inputs, input_quant, strict=True))

        def to_float(xs: tuple[Any, ...]) -> tuple[Any, ...]:
            return tuple(dequantize(t, q) if int8 and q else t
                         for t, int8, q in zip(xs, int8_inputs, input_quant, strict=True))

        def reference_fn(xs: tuple[Any, ...]) -> list[Any]:
            # int8 inputs: their dequantized values quantize back to exactly the same integers
            # in the model's first step, so the reference is that of the float input.
            model = integer_model if integer_model is not None else converted
            with torch.no_grad():
                return flatten_tensors(model(*[t.clone() for t in to_float(xs)]))

        warnings = []
        if mixed["float_macs"] or excluded:
            warnings.append(summary(mixed, excluded))
        warning = dialect_check_warning(dialect_check)
        if warning:
            warnings.append(warning)
        return FlowResult(
            pte=pte, inputs=to_device(inputs), reference=reference, eager=eager,
            input_quant=input_quant, output_quant=output_quant,
            reference_kind=CORTEX_M_REFERENCE_KIND if integer_out is not None
            else self.fallback_reference_kind,
            reference_fn=reference_fn,
            prepare_inputs=lambda xs: to_device(tuple(nhwc(t) for t in xs)),
            pt2e_reference=pt2e_reference,
            report={"cortex_m_target": {
                "cpu": cpu_target.target_string, "cmsis_nn_backend": cpu_target.backend.name,
                "one_channel_depthwise_as_conv": one_channel_convs,
                "one_channel_layout_clones_removed": layout_clones,
                "in_place": [p.as_dict() for p in in_place.made],
                **({"int8_inputs": int8_inputs, "int8_outputs": int8_outputs}
                   if options.int8_io else {})},
                "mixed_precision": mixed,
                **({"patches": patches_report} if patches_report else {})},
            reference_report={"cortex_m_dialect_check": dialect_check},
            warnings=warnings, etrecord=program.get_etrecord(),
            files={NOTES_NAME: upstream.log_text(spec.source_path, target.cpu,
                                                 _versions()).encode()}
            if upstream is not None else {},
            program_graph=program.exported_program().graph_module)

    def check_program(self, model: str, op_list: list[str], info: PteInfo,
                      options: ExportOptions) -> list[str]:
        warn = []
        rest = [o for o in op_list if not o.startswith(INT8_NAMESPACES)]
        # deploykit's own kernels (firmware/kernels) replace the portable ones of these
        # operators in every firmware of this flow: its copies run in memory order.
        own = deploykit_kernel_ops()
        portable = [o for o in rest if o not in own]
        if portable:
            warn.append("Not all operators were lowered to cortex_m (or deploykit's int8 "
                        "operators); these run as portable kernels (the firmware must include "
                        f"them): {', '.join(portable)}.")
        if len(portable) < len(rest):
            warn.append("Not all operators were lowered to cortex_m (or deploykit's int8 "
                        "operators); these run deploykit's own kernels "
                        "(firmware/kernels/functions.yaml): "
                        f"{', '.join(o for o in rest if o in own)}.")
        if not any(o.startswith("cortex_m::quantized_") for o in op_list):
            warn.append("No cortex_m::quantized_* operator: nothing runs in int8 CMSIS-NN "
                        "kernels. Check that the model uses supported layers.")
        return warn

    def program_report(self, op_list: list[str]) -> dict[str, Any]:
        return {"non_cortex_m_ops": [o for o in op_list if not o.startswith(INT8_NAMESPACES)]}


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


def _fold_weight_transposes(ep: Any) -> Any:
    """Fold the float linears' weight transposes (permute_copy of a constant) into constants,
    and nothing else: the Cortex-M passes' scratch tensors are constant-computable too, but
    must stay memory-planned (CMSIS-NN writes them)."""
    from executorch.exir.dialects._ops import ops as exir_ops
    from executorch.exir.passes.constant_prop_pass import constant_prop_pass

    permute = exir_ops.edge.aten.permute_copy.default
    others = {n.target for n in ep.graph.nodes if n.op == "call_function"} - {permute}
    return constant_prop_pass(ep, custom_skip_targets=others)


def _versions() -> dict[str, str]:
    import executorch.version as etv
    import torch

    return {"torch": torch.__version__, "executorch": getattr(etv, "__version__", "?")}


def cortex_m_pass_list() -> list[type]:
    """CortexMPassManager's passes (the same list and order), with the quantized batch matmuls
    lowered right after the q/dq folding (flows/early_batch_matmul.py)."""
    from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager

    passes = list(CortexMPassManager.pass_list)
    folding = next(i for i, p in enumerate(passes) if p.__name__ == "FoldAndAnnotateQParamsPass")
    passes.insert(folding + 1, early_batch_matmul_pass())
    return passes


def _cortex_m_passes(ep: Any, cpu_target: Any) -> tuple[Any, LoweringFailure | None]:
    """The passes of `cortex_m_pass_list`, one at a time, so that a failing pass's node can be
    found in the program it was given."""
    from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager

    for pass_cls in cortex_m_pass_list():
        try:
            ep = CortexMPassManager(ep, passes=[pass_cls], target_config=cpu_target).transform()
        except Exception as e:  # an upstream failure, whatever its type
            cause = e.__cause__ or e
            lines = str(cause).strip().splitlines()
            message = f"{type(cause).__name__}: {lines[0] if lines else ''}"
            return ep, LoweringFailure(pass_cls.__name__, e, failing_node(e, ep.graph_module),
                                       message)
    return ep, None


def _unconverted_quantized_op(ep: Any) -> LoweringFailure | None:
    """A quantize/dequantize the Cortex-M passes left (quantized_decomposed::, no kernel in
    the runtime build): the operator it feeds or comes from is an int8 operator with no
    cortex_m kernel."""
    for node in ep.graph_module.graph.nodes:
        if node.op != "call_function" or "quantized_decomposed" not in str(node.target):
            continue
        if "dequantize" in str(node.target):
            producer = node.args[0]
            culprit = producer if getattr(producer, "op", None) == "call_function" else None
        else:
            culprit = next((u for u in node.users if u.op == "call_function"), None)
        return LoweringFailure(
            "CortexMPassManager", None, culprit,
            f"{op_base(node.target)} left unconverted next to "
            f"{op_base(culprit.target) if culprit is not None else 'an input or output'}: "
            "an int8 operator with no cortex_m kernel")
    return None


CMSIS_NN_CHECKS = "CMSIS-NN argument checks"


def _cmsis_nn_refusal(ep: Any, cpu_target: Any) -> LoweringFailure | None:
    """The first CMSIS-NN-backed node whose kernel would refuse its arguments on the board's
    CPU (flows/cmsis_nn_checks.py), as a lowering failure that mixed precision takes."""
    found = refusals(ep, cpu_target.backend)
    if not found:
        return None
    first = found[0]
    return LoweringFailure(CMSIS_NN_CHECKS, None, first.node, first.message,
                           op=first.op)


def _fall_back(failure: LoweringFailure, spec: ModelSpec, excluded: list[FloatChoice],
               options: ExportOptions, st: Stages) -> FloatChoice:
    """The next operator (or module) to keep in float, or the ExportError that says why
    there is none (or --strict)."""
    choice = (choice_for(failure.node, spec.source_path, excluded, op=failure.op)
              if failure.node is not None else None)
    where = (f" on {failure.node.name}" if failure.node is not None else "")
    if failure.error is not None:
        st.failed_traceback = "".join(traceback.format_exception(failure.error))
    cause = (f"cortex_m_int8 export of '{spec.name}': the int8 lowering failed in "
             f"{failure.step}{where}: {failure.message}")
    if options.strict:
        raise ExportError(
            cause + (f" (at {choice.describe()})" if choice else ""),
            "--strict forbids keeping operators in float. Without --strict, deploykit keeps "
            "the failing operator in float and lowers the rest to int8.")
    if choice is None or len(excluded) >= MAX_FALLBACKS:
        tried = "; ".join(c.describe() for c in excluded) or "nothing"
        raise ExportError(
            cause + f" (already kept in float: {tried})",
            "No model line to keep in float was found for it. The model may use a pattern "
            "this flow does not support: use --flow portable_fp32, or change that layer.")
    if failure.step == CMSIS_NN_CHECKS:
        choice = dataclasses.replace(choice, reason=failure.message)
    if st.on_step is not None:
        st.on_step(f"keeping {choice.describe()} in float (mixed precision)")
    return choice


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


@contextlib.contextmanager
def exact_integer_conv() -> Any:
    """The cortex_m ops' reference code convolves int32 tensors with ``F.conv2d``, which
    PyTorch does not implement for a dilated convolution ("slow_conv_dilated<>" not
    implemented for 'Int'); there it is computed in float64 instead, which is exact (int8 x
    int8 products summed over any layer stay far below 2**53), so the integer reference also
    covers dilated layers (issue #32's depthwise Conv1d of dilation 2)."""
    import torch.nn.functional as F  # noqa: N812

    native = F.conv2d

    def conv2d(x: Any, weight: Any, bias: Any = None, *args: Any, **kwargs: Any) -> Any:
        try:
            return native(x, weight, bias, *args, **kwargs)
        except NotImplementedError:
            if x.is_floating_point():
                raise
            out = native(x.double(), weight.double(),
                         None if bias is None else bias.double(), *args, **kwargs)
            return out.round().to(x.dtype)

    F.conv2d = conv2d
    try:
        yield
    finally:
        F.conv2d = native


def dialect_check_warning(check: dict[str, Any]) -> str | None:
    """What export.json and the export's output say about the dialect check: a reference that
    differs from the PT2E simulation, or, when the check did not run, that the device is
    compared with the PT2E model instead (as the Ethos-U flow says when its TOSA reference
    model does not run)."""
    if not check.get("ran"):
        return (f"The cortex_m ops' integer reference did not run ({check.get('error')}); "
                "the reference is the quantized PT2E model, which can differ from CMSIS-NN "
                "by a few output steps.")
    if not check.get("bit_exact"):
        return ("The cortex_m ops' integer reference (reference.npz, what the device is "
                "compared with) differs from the PT2E float simulation by "
                f"{check['max_diff_output_steps']} output steps (pt2e_output_* in "
                "reference.npz).")
    return None


def _dialect_check(lowered: Any, inputs: tuple[Any, ...], reference: list[Any],
                   output_quant: list[QuantParams | None]
                   ) -> tuple[dict[str, Any], Any | None, list[Any] | None]:
    """Run the lowered cortex_m graph through the ops' Python reference code (integer
    arithmetic modelled on CMSIS-NN) and compare with the PT2E reference. Best effort: some
    ops' Python code rejects some shapes, so a failure here is recorded, not raised."""
    import torch

    graph_copy = lowered.module()  # a copy: to_executorch later rewrites the original

    def module(*args: Any) -> Any:
        with exact_integer_conv():
            return graph_copy(*args)

    try:
        with torch.no_grad():
            out = flatten_tensors(module(*[t.clone() for t in inputs]))
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return {"ran": False, "error": f"{type(e).__name__}: {msg}"[:500]}, None, None
    if len(out) != len(reference):
        return ({"ran": False, "error": f"{len(out)} outputs, reference has {len(reference)}"},
                None, None)
    diffs = max_abs_diff([to_numpy(t) for t in out], [to_numpy(t) for t in reference])
    steps = in_steps(diffs, output_quant)
    return ({"ran": True, "max_abs_diff_vs_reference": max(diffs) if diffs else 0.0,
             "max_diff_output_steps": max((s for s in steps if s is not None), default=None),
             "bit_exact": all(d == 0.0 for d in diffs)}, module, out)
