"""portable_fp32: float32 on ExecuTorch's portable kernels, for any Cortex-M.

torch.export -> ``to_edge_transform_and_lower`` (no partitioner) -> ``constant_prop_pass``
(folds the Linear weight transposes: ~1/4 the instructions and no 100 KB planned buffer for an
MLP) -> ``to_executorch``. The reference is the ``.pte`` itself run by the host ExecuTorch
pybindings (the device runs the same portable kernels, so bit-exact is expected); PyTorch
eager is run too and its difference recorded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deploykit.flows.base import ExportOptions, ExportTarget, Flow, FlowResult
from deploykit.flows.common import flatten_tensors
from deploykit.flows.patches import OFF, Tiler
from deploykit.readers.op_coverage import check_coverage, graph_op_names
from deploykit.util.errors import ExportError

if TYPE_CHECKING:
    from deploykit.flows.common import Stages
    from deploykit.program.models import ModelSpec
    from deploykit.readers.pte_reader import PteInfo


class PortableFp32(Flow):
    name = "portable_fp32"
    summary = "float32 on ExecuTorch's portable kernels (any Cortex-M or Cortex-A)"
    quantization = "none (float32)"
    lowering = "to_edge_transform_and_lower without a partitioner, constant_prop_pass"
    host_reference = "the .pte run by the host ExecuTorch pybindings (bit-exact expected)"
    fallback_reference_kind = "executorch-pybindings"
    patches_refusal = ""

    def validate(self, target: ExportTarget) -> None:
        # The portable kernels run on any CPU: Cortex-A (Linux) boards too.
        if not target.cpu.strip().lower().startswith("cortex-a"):
            super().validate(target)

    def lower(self, spec: ModelSpec, stages: Stages, target: ExportTarget,
              options: ExportOptions) -> FlowResult:
        st = stages
        with st.step("import torch/executorch"):
            import torch
            from executorch.exir import to_edge_transform_and_lower
            from executorch.exir.passes.constant_prop_pass import constant_prop_pass

        inputs = tuple(t.clone().contiguous() for t in spec.example_inputs)
        with st.step("torch.export", "Make the model exportable with torch.export.export("
                     "model, example_inputs()) (no data-dependent Python control flow)."):
            ep = torch.export.export(spec.module, inputs)
        tiler = None
        if options.patches != OFF:
            with st.step("patches (tiles of the first stage)"):
                tiler = Tiler(options.patches, quantized=False, plan_inputs=options.plan_inputs,
                              int8_inputs=False)
                graph_module = ep.module(check_guards=False)
                if tiler.rewrite(graph_module):
                    ep = torch.export.export(graph_module, inputs)
        with st.step("to_edge_transform_and_lower"):
            edge = to_edge_transform_and_lower(ep, generate_etrecord=True)
        if options.fold_constants:
            with st.step("constant_prop_pass"):
                folded = constant_prop_pass(edge.exported_program())
                if folded is not edge.exported_program():
                    # The same hand-off upstream's tester uses: EdgeProgramManager has no
                    # public setter for a transformed program.
                    edge._edge_programs["forward"] = folded
        with st.step("to_executorch"):
            program = edge.to_executorch(options.backend_config())
            pte = bytes(program.buffer)

        with st.step("operator coverage"):
            # Before the host runtime loads the program: it has the same portable kernels,
            # and an operator missing there is better named with its model line.
            graph = program.exported_program().graph_module
            check_coverage(graph_op_names(graph), graph, spec.name, spec.source_path,
                           self.name)
        with st.step("host reference (executorch pybindings)",
                     "The .pte did not run on the host ExecuTorch runtime; a kernel is missing "
                     "or the program is invalid."):
            from executorch.runtime import Runtime

            method = Runtime.get().load_program(pte).load_method("forward")

            def reference_fn(xs: tuple[Any, ...]) -> list[Any]:
                return flatten_tensors(list(method.execute([t.clone().contiguous()
                                                            for t in xs])))

            reference = reference_fn(inputs)
        with st.step("eager reference"), torch.no_grad():
            eager = flatten_tensors(spec.module(*[t.clone() for t in inputs]))
        return FlowResult(
            pte=pte, inputs=inputs, reference=reference, eager=eager,
            input_quant=[None] * len(inputs), output_quant=[None] * len(reference),
            reference_kind=self.fallback_reference_kind, reference_fn=reference_fn,
            prepare_inputs=lambda xs: tuple(t.clone().contiguous() for t in xs),
            etrecord=program.get_etrecord(), program_graph=graph,
            report={"patches": tiler.report} if tiler is not None else {})

    def check_program(self, model: str, op_list: list[str], info: PteInfo,
                      options: ExportOptions) -> list[str]:
        bad = [o for o in op_list if o.startswith("cortex_m::")]
        if bad:
            raise ExportError(f"portable_fp32 export of '{model}' contains Cortex-M ops: {bad}.",
                              "Report this: the fp32 flow must use portable kernels only.")
        if info.kernel_calls.get("aten::permute_copy.out") and options.fold_constants:
            return ["aten::permute_copy.out remains after constant_prop_pass: some transposes "
                    "run at inference time."]
        return []
