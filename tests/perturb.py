"""A deliberately broken int8 program: one operator's requantization scale changed after
quantization (tests of `run --debug-intermediates`)."""

from __future__ import annotations


def perturb_requantize_scale(pte: bytes, instruction: int, factor: float) -> bytes:
    """`pte` with the requantize multipliers of the cortex_m operator at `instruction` (chain
    0) scaled by `factor`: that operator's output scale is off, everything else unchanged."""
    import executorch.backends.cortex_m.passes.cortex_m_pass_manager  # noqa: F401
    import torch
    from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

    pte_file = deserialize_pte_binary(pte)
    plan = pte_file.program.execution_plan[0]
    call = plan.chains[0].instructions[instruction].instr_args
    op = plan.operators[call.op_index]
    namespace, name = op.name.split("::")
    schema = getattr(getattr(getattr(torch.ops, namespace), name), op.overload)._schema
    position = [a.name for a in schema.arguments].index("requantize_multipliers")
    for item in plan.values[call.args[position]].val.items:
        value = plan.values[item].val
        value.int_val = int(value.int_val * factor)
    return bytes(serialize_pte_binary(pte_file))
