"""xnnpack_fp32: float32 through ExecuTorch's XNNPACK delegate, for Cortex-A (Linux) boards.

torch.export -> ``to_edge_transform_and_lower`` with the ``XnnpackPartitioner`` (the supported
subgraphs become XNNPACK delegate calls; the rest stays on the portable kernels) ->
``to_executorch``. The reference is the ``.pte`` run by the host ExecuTorch pybindings, which
carry the XNNPACK backend too. The host's XNNPACK runs x86 micro-kernels and the board's runs
NEON ones: the same operations, summed in another order, so the outputs agree to float
rounding, not bit for bit (the default tolerance below).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deploykit.flows.base import ExportOptions, ExportTarget, Flow, FlowResult
from deploykit.flows.common import flatten_tensors
from deploykit.flows.ethos_u_int8 import _op_name
from deploykit.util.errors import ConfigError

if TYPE_CHECKING:
    from deploykit.flows.common import Stages
    from deploykit.program.models import ModelSpec
    from deploykit.readers.boards import Board
    from deploykit.readers.pte_reader import PteInfo

XNNPACK_BACKEND = "XnnpackBackend"
# Host (x86 micro-kernels) against device (NEON, fused multiply-add): float rounding only.
XNNPACK_FP32_TOLERANCE = {"atol": 1e-4, "rtol": 1e-4}


def check_cortex_a(cpu: str) -> None:
    if not cpu.strip().lower().startswith("cortex-a"):
        raise ConfigError(
            f"CPU '{cpu}' is not a Cortex-A CPU: the XNNPACK flows target Cortex-A Linux boards.",
            "Use a board of the linux_aarch64 family (rpi5, rpi4), or "
            "--flow portable_fp32 / cortex_m_int8 on a Cortex-M board.",
        )


def lower_with_xnnpack(
    program: Any, st: Stages, options: ExportOptions, dynamic: bool = False
) -> tuple[bytes, dict[str, Any]]:
    """The exported program through the XNNPACK partitioner: the `.pte` bytes and the
    partition report (export.json's `partition`, which `inspect` shows). `dynamic`: the
    dynamically quantized linears are partitioned first, each on its own, as ExecuTorch's
    LLM export does (one partitioner for all of a transformer finds dependency cycles)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
        XnnpackDynamicallyQuantizedPartitioner,
        XnnpackPartitioner,
    )
    from executorch.exir import to_edge_transform_and_lower

    partitioners = [XnnpackPartitioner()]
    if dynamic:
        partitioners.insert(0, XnnpackDynamicallyQuantizedPartitioner())
    with st.step("to_edge_transform_and_lower (XnnpackPartitioner)"):
        edge = to_edge_transform_and_lower(program, partitioner=partitioners)
        partition = partition_report(edge.exported_program())
    with st.step("to_executorch"):
        return bytes(edge.to_executorch(options.backend_config()).buffer), partition


def partition_report(ep: Any) -> dict[str, Any]:
    """The lowered graph in execution order: each delegate call with the ops inside it, and
    the runs of ops left to the CPU. Delegates are numbered in the order the emitter meets
    them, which is the `.pte`'s delegate index."""
    import operator

    gm = ep.graph_module
    segments: list[dict[str, Any]] = []
    delegates: list[dict[str, Any]] = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        if "executorch_call_delegate" in str(node.target):
            lowered = getattr(gm, node.args[0].target)
            ops: dict[str, int] = {}
            for inner in lowered.original_module.graph.nodes:
                if inner.op == "call_function" and inner.target is not operator.getitem:
                    name = _op_name(inner.target)
                    ops[name] = ops.get(name, 0) + 1
            entry = {
                "index": len(delegates),
                "backend": lowered.backend_id,
                "ops": ops,
                "num_ops": sum(ops.values()),
            }
            delegates.append(entry)
            segments.append({"kind": "delegate", **entry})
        else:
            name = _op_name(node.target)
            if segments and segments[-1]["kind"] == "cpu":
                segments[-1]["ops"].append(name)
            else:
                segments.append({"kind": "cpu", "ops": [name]})
    return {"backend": XNNPACK_BACKEND, "segments": segments, "delegates": delegates}


def host_method(pte: bytes, st: Stages) -> Any:
    with st.step(
        "host reference (executorch pybindings with XNNPACK)",
        "The .pte did not run on the host ExecuTorch runtime; the XNNPACK backend or "
        "a portable kernel is missing from the executorch package.",
    ):
        from executorch.runtime import Runtime

        return Runtime.get().load_program(pte).load_method("forward")


def xnnpack_program_checks(flow: str, model: str, info: PteInfo) -> list[str]:
    if info.num_delegates == 0:
        return [
            f"{flow}: no part of '{model}' was delegated to XNNPACK; everything runs on "
            "the portable kernels."
        ]
    return []


class XnnpackFp32(Flow):
    name = "xnnpack_fp32"
    summary = "float32 through ExecuTorch's XNNPACK delegate (Cortex-A Linux boards)"
    quantization = "none (float32)"
    lowering = "to_edge_transform_and_lower with the XnnpackPartitioner"
    host_reference = "the .pte run by the host ExecuTorch pybindings (XNNPACK, x86 kernels)"
    fallback_reference_kind = "executorch-pybindings"

    def applies_to(self, board: Board) -> str | None:
        core = board.cpu["core"]
        return None if core.startswith("cortex-a") else f"{core} is not a Cortex-A CPU"

    def validate(self, target: ExportTarget) -> None:
        check_cortex_a(target.cpu)

    def default_tolerance(self, output_quant: list[Any]) -> dict[str, float]:
        return dict(XNNPACK_FP32_TOLERANCE)

    def lower(
        self, spec: ModelSpec, stages: Stages, target: ExportTarget, options: ExportOptions
    ) -> FlowResult:
        st = stages
        with st.step("import torch/executorch"):
            import torch

        inputs = tuple(t.clone().contiguous() for t in spec.example_inputs)
        with st.step(
            "torch.export",
            "Make the model exportable with torch.export.export("
            "model, example_inputs()) (no data-dependent Python control flow).",
        ):
            ep = torch.export.export(spec.module, inputs)
        pte, partition = lower_with_xnnpack(ep, st, options)
        method = host_method(pte, st)

        def reference_fn(xs: tuple[Any, ...]) -> list[Any]:
            return flatten_tensors(list(method.execute([t.clone().contiguous() for t in xs])))

        reference = reference_fn(inputs)
        with st.step("eager reference"), torch.no_grad():
            eager = flatten_tensors(spec.module(*[t.clone() for t in inputs]))
        return FlowResult(
            pte=pte,
            inputs=inputs,
            reference=reference,
            eager=eager,
            input_quant=[None] * len(inputs),
            output_quant=[None] * len(reference),
            reference_kind=self.fallback_reference_kind,
            reference_fn=reference_fn,
            prepare_inputs=lambda xs: tuple(t.clone().contiguous() for t in xs),
            report={"partition": partition},
        )

    def check_program(
        self, model: str, op_list: list[str], info: PteInfo, options: ExportOptions
    ) -> list[str]:
        return xnnpack_program_checks(self.name, model, info)

    def program_report(self, op_list: list[str]) -> dict[str, Any]:
        return {"cpu_ops": op_list}
