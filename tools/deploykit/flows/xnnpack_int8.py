"""xnnpack_int8: int8 through ExecuTorch's XNNPACK delegate, for Cortex-A (Linux) boards.

``XNNPACKQuantizer`` (per-channel symmetric int8 weights) + PT2E prepare / calibrate / convert
(flows/pt2e.py) -> torch.export -> ``to_edge_transform_and_lower`` with the
``XnnpackPartitioner`` -> ``to_executorch``. Activations are quantized statically (observed
on the model's calibration inputs) when the model file gives calibration inputs, else
dynamically (per inference, from the tensor's own range: transformers, whose activations have
no calibration set here). The reference is the ``.pte`` run by the host ExecuTorch pybindings
(XNNPACK's x86 int8 kernels): the device's NEON kernels requantize the same way, but a value
on a rounding boundary may land one step away, hence a tolerance in output steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deploykit.flows.base import ExportOptions, ExportTarget, Flow, FlowResult, QuantParams
from deploykit.flows.common import flatten_tensors
from deploykit.flows.pt2e import quantize_pt2e
from deploykit.flows.xnnpack_fp32 import (
    XNNPACK_FP32_TOLERANCE,
    check_cortex_a,
    host_method,
    lower_with_xnnpack,
    xnnpack_program_checks,
)

if TYPE_CHECKING:
    from deploykit.flows.common import Stages
    from deploykit.program.models import ModelSpec
    from deploykit.readers.boards import Board
    from deploykit.readers.pte_reader import PteInfo

# Static int8: the outputs are dequantized in the delegate, so the tolerance is float; two
# output steps cover a requantization rounding difference carried to the output.
OUTPUT_STEPS = 2.0


class XnnpackInt8(Flow):
    name = "xnnpack_int8"
    summary = "int8 through ExecuTorch's XNNPACK delegate (Cortex-A Linux boards)"
    quantization = (
        "int8 PT2E with XNNPACKQuantizer: per-channel symmetric weights; static "
        "activations with calibration inputs, else dynamic (Linear layers)"
    )
    lowering = "to_edge_transform_and_lower with the XnnpackPartitioner"
    host_reference = "the .pte run by the host ExecuTorch pybindings (XNNPACK, x86 kernels)"
    quantized = True
    fallback_reference_kind = "executorch-pybindings"

    def applies_to(self, board: Board) -> str | None:
        core = board.cpu["core"]
        return None if core.startswith("cortex-a") else f"{core} is not a Cortex-A CPU"

    def validate(self, target: ExportTarget) -> None:
        check_cortex_a(target.cpu)

    def default_tolerance(self, output_quant: list[QuantParams | None]) -> dict[str, float]:
        scales = [q.scale for q in output_quant if q is not None]
        if not scales:  # dynamic quantization: float outputs, per-inference scales
            return {"atol": 0.05, "rtol": 0.0}
        return {
            "atol": max(OUTPUT_STEPS * max(scales), XNNPACK_FP32_TOLERANCE["atol"]),
            "rtol": 0.0,
        }

    def lower(
        self, spec: ModelSpec, stages: Stages, target: ExportTarget, options: ExportOptions
    ) -> FlowResult:
        st = stages
        with st.step("import torch/executorch"):
            import torch
            from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
                XNNPACKQuantizer,
                get_symmetric_quantization_config,
            )

        dynamic = not spec.has_calibration_inputs
        config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=dynamic)
        # Dynamic: the Linear layers only, as ExecuTorch's XNNPACK recipes quantize
        # transformers (annotating every op would quantize the embedding's token ids too).
        quantizer = (
            XNNPACKQuantizer().set_module_type(torch.nn.Linear, config)
            if dynamic
            else XNNPACKQuantizer().set_global(config)
        )
        inputs = tuple(t.clone().contiguous() for t in spec.example_inputs)
        calibration = [tuple(t.clone().contiguous() for t in s) for s in spec.calibration_inputs]
        converted, pt2e_reference, eager = quantize_pt2e(spec, st, inputs, calibration, quantizer)
        with st.step("torch.export (quantized)"):
            qep = torch.export.export(converted, inputs)
        output_quant = _output_quant(qep, len(pt2e_reference))
        pte, partition = lower_with_xnnpack(qep, st, options, dynamic=dynamic)
        method = host_method(pte, st)

        def reference_fn(xs: tuple[Any, ...]) -> list[Any]:
            return flatten_tensors(list(method.execute([t.clone().contiguous() for t in xs])))

        reference = reference_fn(inputs)
        return FlowResult(
            pte=pte,
            inputs=inputs,
            reference=reference,
            eager=eager,
            input_quant=[None] * len(inputs),
            output_quant=output_quant,
            reference_kind=self.fallback_reference_kind,
            reference_fn=reference_fn,
            prepare_inputs=lambda xs: tuple(t.clone().contiguous() for t in xs),
            pt2e_reference=pt2e_reference,
            report={
                "partition": partition,
                "xnnpack_quantization": "dynamic" if dynamic else "static",
            },
        )

    def check_program(
        self, model: str, op_list: list[str], info: PteInfo, options: ExportOptions
    ) -> list[str]:
        return xnnpack_program_checks(self.name, model, info)

    def program_report(self, op_list: list[str]) -> dict[str, Any]:
        return {"cpu_ops": op_list}


def _output_quant(ep: Any, count: int) -> list[QuantParams | None]:
    """The parameters of the dequantize before each user output of the quantized program
    (static quantization), for the tolerance in output steps; None where there is none. The
    outputs themselves stay float: XNNPACK dequantizes inside the delegate."""
    out_node = next(n for n in ep.graph.nodes if n.op == "output")
    result: list[QuantParams | None] = []
    for arg in list(out_node.args[0])[:count]:
        target = str(getattr(arg, "target", ""))
        if "dequantize_per_tensor" in target and len(arg.args) >= 6:
            _, scale, zp, qmin, qmax, dtype = arg.args[:6]
            result.append(
                QuantParams(
                    float(scale), int(zp), int(qmin), int(qmax), str(dtype).replace("torch.", "")
                )
            )
        else:
            result.append(None)
    return result + [None] * (count - len(result))
