"""The host's run of a program, kernel call by kernel call (program/pte_interpreter.py, which
`run --debug-intermediates` observes through profiling/intermediates.py, and which is the host
reference of a `.pte` given as the model), on bundled models whose programs the runtime lays
out in ways a naive interpreter misreads:

- every int8 convolution of the cortex_m flow takes a scratch buffer: a planned tensor the
  program allocates for the kernel and no instruction writes (mobilenet_v3_block, tiny_cnn);
- the squeeze-excite of a MobileNetV3 block multiplies a 12x12 map by a 1x1 gate, which the
  cortex_m reference only broadcasts for channels-last tensors (the program's dim order);
- kernels with two outs or a list of outs return one TensorList value (tiny_cnn's max pool);
- `squeeze_copy.dims_out` has two functional overloads of the same argument names, and
  `full.out` none (transformer_block, gru_kws in fp32);
- a dilated int8 convolution, which PyTorch cannot convolve in integers (kws_lstm1d).

Each program is exported as `deploykit export` makes it; the host's run must reproduce the
export's reference (the cortex_m integer reference of the lowered graph: bit for bit), and give
every kernel call its outputs. The device side is tests/integration/test_profile_qemu.py."""

from __future__ import annotations

import numpy as np
import pytest

from deploykit import api
from deploykit.profiling.intermediates import run_program as run_for_intermediates
from deploykit.program import pte_interpreter
from deploykit.readers.pte_reader import load_program, method_plan, operator_names

CASES = [
    ("mobilenet_v3_block", "cortex_m_int8"),
    ("mobilenet_v3_block", "portable_fp32"),
    ("tiny_cnn", "cortex_m_int8"),
    ("tiny_cnn", "portable_fp32"),
    ("transformer_block", "portable_fp32"),
    ("gru_kws", "portable_fp32"),
    ("kws_lstm1d", "cortex_m_int8"),
]


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[tuple[str, str], object]:
    out = tmp_path_factory.mktemp("host-interpreter")
    return {case: api.export("qemu-an547", case[0], case[1], out=out / "-".join(case),
                             project=False) for case in CASES}


def _kernel_calls(pte: bytes) -> list[tuple[int, int, str]]:
    plan = method_plan(load_program(pte, "t"), "forward", "t")
    names = operator_names(plan)
    return [(c, n, names[i.instr_args.op_index]) for c, chain in enumerate(plan.chains)
            for n, i in enumerate(chain.instructions)
            if type(i.instr_args).__name__ == "KernelCall"]


@pytest.mark.parametrize("case", CASES, ids="-".join)
def test_the_host_runs_every_kernel_call_and_reproduces_the_export(exports, case):
    exported = exports[case]
    pte = exported.pte_path.read_bytes()
    inputs = exported.input_sets[0]
    host = run_for_intermediates(pte, inputs)
    calls = _kernel_calls(pte)
    assert sorted(host.outputs) == [(c, n) for c, n, _ in calls]
    assert [host.operators[(c, n)] for c, n, _ in calls] == [op for _, _, op in calls]
    assert all(host.outputs[key] for key in host.outputs)  # every kernel writes something
    outputs = pte_interpreter.run_program(pte, inputs)
    for got, want in zip(outputs, exported.host_outputs, strict=True):
        if case[1] == "cortex_m_int8":
            assert exported.reference_kind == "cortex_m-integer-reference"
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_the_mobilenet_v3_block_program_has_the_shapes_it_is_here_for(exports):
    """The int8 program holds what the host used to misread: a scratch buffer that no
    instruction writes, and a squeeze-excite multiply whose gate is broadcast; the host's
    values of both are the device's layout (so a later model change cannot quietly drop the
    case)."""
    pte = exports[("mobilenet_v3_block", "cortex_m_int8")].pte_path.read_bytes()
    plan = method_plan(load_program(pte, "t"), "forward", "t")
    names = operator_names(plan)
    written, read = set(), set()
    gate_shapes = []
    for instruction in plan.chains[0].instructions:
        args = instruction.instr_args
        name = names[args.op_index]
        read.update(args.args[:-2])
        written.update(args.args[-2:])
        if name == "cortex_m::quantized_mul.out":
            gate_shapes.append([list(plan.values[i].val.sizes) for i in (args.args[0],
                                                                         args.args[2])])
    planned_inputs = {i for i in read - written - set(plan.inputs)
                      if type(plan.values[i].val).__name__ == "Tensor"
                      and plan.values[i].val.allocation_info is not None}
    assert planned_inputs, "no scratch buffer: the program no longer has the case"
    assert [[1, 48, 12, 12], [1, 48, 1, 1]] in gate_shapes


def test_its_program_as_the_model_has_the_interpreters_reference(exports, tmp_path):
    """The same int8 program given as the model (a .pte made elsewhere): its host reference is
    this interpreter's run, bit for bit the export's own reference on the export's input."""
    from deploykit.program.imported import INTERPRETER_REFERENCE

    exported = exports[("mobilenet_v3_block", "cortex_m_int8")]
    result = api.export("qemu-an547", str(exported.pte_path), out=tmp_path / "as-model",
                        project=False)
    assert (result.flow, result.reference_kind) == ("cortex_m_int8", INTERPRETER_REFERENCE)
    again = pte_interpreter.run_program(exported.pte_path.read_bytes(), result.inputs)
    np.testing.assert_array_equal(result.host_outputs[0], again[0])
