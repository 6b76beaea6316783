"""A `.pte` run on the host through torch operators: the host reference of a program whose
kernels the host ExecuTorch runtime (the pybindings) lacks.

The pip ExecuTorch's runtime has the portable kernels and the XNNPACK delegate, not the
`cortex_m::` kernels (CMSIS-NN) nor `quantized_decomposed::`. ExecuTorch gives those operators
Python implementations as torch operators instead (the cortex_m ones are integer arithmetic
modelled on CMSIS-NN; the cortex_m flow compares its lowered graph with them). This module
executes a program's method instruction by instruction with them: its values table (constants
from the program, the planned tensors as fresh tensors, the method's inputs), each KernelCall as
the torch operator of that name (the `.out` overload, or the functional one with its result
stored in the out value), moves and jumps as the runtime does them. Delegate calls cannot run
here: a program with a delegate is not interpretable (`why_not_interpretable`).

Tensors are held in their logical order (the program stores constants in their dim order, which
is undone when they are read), as the operators' Python implementations expect.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from deploykit.readers.pte_reader import load_program, method_plan, operator_names
from deploykit.util.errors import ConfigError

# executorch_prim:: and sym operators the runtime implements itself (no torch operator).
_PRIM_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "executorch_prim::add.Scalar": operator.add, "executorch_prim::sub.Scalar": operator.sub,
    "executorch_prim::mul.Scalar": operator.mul,
    "executorch_prim::floordiv.Scalar": operator.floordiv,
    "executorch_prim::floordiv.int": operator.floordiv,
    "executorch_prim::truediv.Scalar": operator.truediv,
    "executorch_prim::mod.int": operator.mod, "executorch_prim::mod.Scalar": operator.mod,
    "executorch_prim::eq.Scalar": operator.eq, "executorch_prim::gt.Scalar": operator.gt,
    "executorch_prim::lt.Scalar": operator.lt, "executorch_prim::ge.Scalar": operator.ge,
    "executorch_prim::le.Scalar": operator.le,
    "executorch_prim::sym_max.Scalar": max, "executorch_prim::sym_min.Scalar": min,
}
_PRIM_OTHER = ("executorch_prim::et_view.default", "aten::sym_size.int", "aten::sym_numel",
               "executorch_prim::neg.Scalar")
# Modules whose import registers the torch operators of a namespace.
_REGISTRARS = {
    "cortex_m": "executorch.backends.cortex_m.passes.cortex_m_pass_manager",
    "quantized_decomposed": "torchao.quantization.pt2e.quantize_pt2e",
    "dim_order_ops": "executorch.exir.passes.dim_order_ops_registry",
}
_DTYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16",
           6: "float32", 7: "float64", 11: "bool", 15: "bfloat16"}


def _torch_dtype(code: int) -> Any:
    import torch

    name = _DTYPES.get(int(code))
    if name is None:
        raise ConfigError(f"ExecuTorch scalar type {code} has no torch dtype here.",
                          "Give the expected outputs with --expect FILE.npz instead.")
    return getattr(torch, name)


def _register(namespace: str) -> None:
    import importlib

    module = _REGISTRARS.get(namespace)
    if module is not None:
        importlib.import_module(module)


def _torch_operator(name: str) -> Any:
    """The torch OpOverload of "ns::op.overload", or None."""
    import torch

    qualified, _, overload = name.partition(".")
    namespace, _, op = qualified.partition("::")
    _register(namespace)
    try:
        packet = getattr(getattr(torch.ops, namespace), op)
        return getattr(packet, overload or "default")
    except (AttributeError, RuntimeError):
        return None


def why_not_interpretable(data: bytes, source: str, method: str = "forward") -> str | None:
    """None when the method can run here, else why not (a delegate, an unknown operator)."""
    plan = method_plan(load_program(data, source), method, source)
    if plan.delegates:
        return f"it calls {', '.join(sorted({d.id for d in plan.delegates}))}, a delegate"
    unknown = [op for op in operator_names(plan) if op not in _PRIM_BINARY
               and op not in _PRIM_OTHER and _torch_operator(op) is None]
    if unknown:
        return f"no torch operator implements {', '.join(unknown)}"
    return None


def run_program(data: bytes, inputs: Sequence[np.ndarray], source: str = "the program",
                method: str = "forward") -> list[np.ndarray]:
    """The outputs of `method` on `inputs` (logical order, the program's dtypes)."""
    import torch

    program = load_program(data, source)
    plan = method_plan(program, method, source)
    why = why_not_interpretable(data, source, method)
    if why:
        raise ConfigError(f"{source} cannot run on the host: {why}.",
                          "Give the expected outputs with --expect FILE.npz.")
    names = operator_names(plan)
    # The planned buffers, as the runtime lays them out: a tensor the memory plan puts at a
    # buffer's offset is a view of that memory, so that tensors planned at the same place
    # (a view the planner made an alias, an input read in place) share it.
    arenas = [torch.zeros(int(size), dtype=torch.uint8) for size in plan.non_const_buffer_sizes]
    values: list[Any] = [_initial_value(program, v.val, arenas) for v in plan.values]
    if len(inputs) != len(plan.inputs):
        raise ConfigError(f"{source} takes {len(plan.inputs)} inputs, {len(inputs)} given.",
                          "Give one array per input of the program.")
    for index, array in zip(plan.inputs, inputs, strict=True):
        given = torch.from_numpy(np.ascontiguousarray(array))
        if isinstance(values[index], torch.Tensor) and values[index].shape == given.shape:
            values[index].copy_(given)
        else:
            values[index] = given.clone()
    with torch.no_grad():
        for chain in plan.chains:
            _run_chain(chain.instructions, values, names, plan)
    return [values[i].detach().contiguous().numpy() if isinstance(values[i], torch.Tensor)
            else np.asarray(values[i]) for i in plan.outputs]


def _initial_value(program: Any, val: Any, arenas: list[Any]) -> Any:
    import torch

    kind = type(val).__name__
    if kind == "Tensor":
        dtype = _torch_dtype(int(val.scalar_type))
        sizes = [int(s) for s in val.sizes]
        dim_order = [int(d) for d in val.dim_order]
        if val.data_buffer_idx > 0 and val.allocation_info is None:  # a constant
            return _constant(program.constant_buffer[val.data_buffer_idx].storage, dtype, sizes,
                             dim_order)
        info = val.allocation_info
        if info is not None and int(info.memory_id) < len(arenas):
            return _planned(arenas[int(info.memory_id)], int(info.memory_offset), dtype, sizes,
                            dim_order)
        return torch.zeros(sizes, dtype=dtype)
    if kind == "Int":
        return int(val.int_val)
    if kind == "Double":
        return float(val.double_val)
    if kind == "Bool":
        return bool(val.bool_val)
    if kind == "String":
        return str(val.string_val)
    if kind in ("DoubleList", "BoolList"):
        return list(val.items)
    if kind in ("IntList", "TensorList", "OptionalTensorList"):
        return _Boxed(kind, [int(i) for i in val.items])  # indices into the values table
    return None  # Null


class _Boxed:
    """A list of indices into the values table (IntList, TensorList, OptionalTensorList),
    read when an instruction takes it."""

    def __init__(self, kind: str, items: list[int]) -> None:
        self.kind, self.items = kind, items

    def read(self, values: list[Any]) -> list[Any]:
        return [None if i < 0 else values[i] for i in self.items]


def _planned(arena: Any, offset: int, dtype: Any, sizes: list[int],
             dim_order: list[int]) -> Any:
    """A tensor in a planned buffer at `offset`: a view of its memory, in logical order."""
    import torch

    count = int(np.prod(sizes)) if sizes else 1
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    memory = arena[offset:offset + nbytes].view(dtype)
    if not sizes:
        return memory.reshape(())
    return memory.reshape([sizes[d] for d in dim_order]).permute(list(np.argsort(dim_order)))


def _constant(storage: bytes, dtype: Any, sizes: list[int], dim_order: list[int]) -> Any:
    import torch

    count = int(np.prod(sizes)) if sizes else 1
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = bytes(storage[:count * itemsize])
    flat = torch.frombuffer(bytearray(raw), dtype=dtype) if raw else torch.zeros(0, dtype=dtype)
    physical = flat.reshape([sizes[d] for d in dim_order]) if sizes else flat.reshape(())
    return physical.permute(list(np.argsort(dim_order))).contiguous() if sizes else physical


def _run_chain(instructions: list[Any], values: list[Any], names: tuple[str, ...],
               plan: Any) -> None:
    pc = 0
    while pc < len(instructions):
        args = instructions[pc].instr_args
        kind = type(args).__name__
        pc += 1
        if kind == "KernelCall":
            _call(names[args.op_index], list(args.args), values, plan)
        elif kind == "MoveCall":
            values[args.move_to] = values[args.move_from]
        elif kind == "JumpFalseCall":
            if not bool(_read(values, args.cond_value_index)):
                pc = args.destination_instruction
        elif kind == "DelegateCall":
            raise ConfigError("A delegate call cannot run on the host here.",
                              "Give the expected outputs with --expect FILE.npz.")
        # FreeCall: nothing to free


def _read(values: list[Any], index: int) -> Any:
    value = values[index]
    return value.read(values) if isinstance(value, _Boxed) else value


def _call(name: str, indices: list[int], values: list[Any], plan: Any) -> None:
    import torch

    if name in _PRIM_BINARY:
        a, b, out = indices
        values[out] = _PRIM_BINARY[name](_read(values, a), _read(values, b))
        return
    if name == "executorch_prim::neg.Scalar":
        a, out = indices
        values[out] = -_read(values, a)
        return
    if name == "executorch_prim::et_view.default":
        src, size, out = indices
        values[out] = _read(values, src).reshape([int(s) for s in _read(values, size)])
        return
    if name == "aten::sym_size.int":
        src, dim, out = indices
        values[out] = int(_read(values, src).shape[_read(values, dim)])
        return
    if name == "aten::sym_numel":
        src, out = indices
        values[out] = int(_read(values, src).numel())
        return
    op = _torch_operator(name)
    schema = op._schema
    arguments = list(schema.arguments)
    # The call's values: the arguments, then the returns (an out variant returns its out).
    if len(indices) != len(arguments) + len(schema.returns):
        raise ConfigError(f"{name} takes {len(arguments)} arguments and returns "
                          f"{len(schema.returns)}; the program gives it {len(indices)} values.",
                          "Give the expected outputs with --expect FILE.npz.")
    returns = indices[len(arguments):]
    positional, keywords, outs = [], {}, []
    for argument, index in zip(arguments, indices, strict=False):
        value = _argument(argument, _read(values, index))
        if argument.kwarg_only:
            keywords[argument.name] = value
            if argument.alias_info is not None and argument.alias_info.is_write:
                outs.append((argument.name, index))
        else:
            positional.append(value)
    try:
        result = op(*positional, **keywords)
    except NotImplementedError:  # no kernel for the .out overload: its functional twin
        functional = _torch_operator(name.partition(".")[0])
        if functional is None:
            raise ConfigError(f"No torch kernel runs {name} on the host.",
                              "Give the expected outputs with --expect FILE.npz.") from None
        plain = {k: _contiguous(v) for k, v in keywords.items() if k not in dict(outs)}
        # The Python implementations are written for the eager graph's tensors: contiguous,
        # not views of the planned memory in its dim order.
        result = functional(*[_contiguous(v) for v in positional], **plain)
        results = result if isinstance(result, (tuple, list)) else (result,)
        for (key, index), tensor in zip(outs, results, strict=False):
            target = values[index]
            if isinstance(target, torch.Tensor) and target.shape == tensor.shape:
                target.copy_(tensor.to(target.dtype))  # into its planned memory
            else:
                values[index] = tensor
            keywords[key] = values[index]
        result = results if len(results) > 1 else results[0]
    results = result if isinstance(result, (tuple, list)) else (result,)
    for index, value in zip(returns, results, strict=False):
        if values[index] is not value and not isinstance(value, torch.Tensor):
            values[index] = value  # a scalar return; a tensor's is its out, written in place


def _contiguous(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.contiguous()
    if isinstance(value, list):
        return [_contiguous(v) for v in value]
    return value


def _argument(argument: Any, value: Any) -> Any:
    """A value of the program as the torch operator's argument of that type."""
    kind = str(argument.type)
    if value is None:
        return None
    if "ScalarType" in kind and isinstance(value, int):
        return _torch_dtype(value)
    if "MemoryFormat" in kind and isinstance(value, int):
        import torch

        formats = (torch.contiguous_format, torch.preserve_format, torch.channels_last,
                   torch.channels_last_3d)
        return formats[value]
    if kind.startswith("List[int]") or kind.startswith("SymInt[]") or kind == "int[]":
        return [int(v) for v in value]
    return value
