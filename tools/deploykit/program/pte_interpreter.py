"""A `.pte` run on the host through torch operators: the host reference of a program whose
kernels the host ExecuTorch runtime (the pybindings) lacks, and the host side of
`run --debug-intermediates` (profiling/intermediates.py), which observes every kernel call.

The pip ExecuTorch's runtime has the portable kernels and the XNNPACK delegate, not the
`cortex_m::` kernels (CMSIS-NN) nor `quantized_decomposed::`. ExecuTorch gives those operators
Python implementations as torch operators instead (the cortex_m ones are integer arithmetic
modelled on CMSIS-NN; the cortex_m flow compares its lowered graph with them). This module
executes a program's method instruction by instruction with them, holding its values as the
runtime does:

- the planned buffers are byte arenas and every planned tensor is a view of its arena at its
  offset, so a tensor no instruction writes (a kernel's scratch buffer, which the program
  allocates and hands to the kernel as an input) reads what the memory holds, and tensors the
  planner put at one place share it;
- every tensor keeps its program's dim order (its strides), constants and inputs included, so
  an operator sees the memory format the lowered graph gave it (CMSIS-NN's channels-last);
- each KernelCall runs the torch operator of that name (the `.out` overload into the planned
  memory, or the functional overload with the same arguments, its result copied into the out);
  a kernel takes one value per argument of its schema and then one for what it returns (its
  out, a TensorList of its outs, or the functional result), as ExecuTorch's emitter lays it out;
- moves and jumps run as the runtime runs them.

Delegate calls cannot run here: a program with a delegate is not interpretable
(`why_not_interpretable`). An operator whose implementation fails is a ConfigError naming the
instruction, never a traceback.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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
    "deploykit": "deploykit.flows.deploykit_ops",
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
    initial = [i for i, v in enumerate(plan.values) if type(v.val).__name__ == "Tensor"
               and v.val.data_buffer_idx > 0 and v.val.allocation_info is not None]
    if initial:
        return (f"values {', '.join(map(str, initial[:5]))} are planned tensors with an initial "
                "state (mutable buffers), which the host does not read from the program")
    return None


@dataclass(frozen=True)
class KernelOutputs:
    """What a KernelCall wrote: its out arguments' values, flattened as the runtime's event
    tracer logs them (a TensorList out gives each of its tensors), each as (value index, the
    tensor in the program's layout: logical sizes, strides of its dim order)."""

    chain: int
    instruction: int
    operator: str
    outputs: list[tuple[int, Any]]


def run_program(data: bytes, inputs: Sequence[np.ndarray], source: str = "the program",
                method: str = "forward",
                on_kernel: Callable[[KernelOutputs], None] | None = None) -> list[np.ndarray]:
    """The outputs of `method` on `inputs` (logical order, the program's dtypes).
    `on_kernel` sees each KernelCall's outputs right after it ran (they live in the planned
    memory, which later instructions overwrite: copy what is kept)."""
    import torch

    from deploykit.flows.cortex_m_int8 import exact_integer_conv

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
    try:
        arenas = [torch.zeros(int(size), dtype=torch.uint8)
                  for size in plan.non_const_buffer_sizes]
    except (RuntimeError, MemoryError) as exc:  # torch's allocator refuses
        raise ConfigError(f"The host cannot allocate the planned buffers of {source} "
                          f"({sum(int(s) for s in plan.non_const_buffer_sizes):,} B).",
                          "Give the expected outputs with --expect FILE.npz.") from exc
    values: list[Any] = [_initial_value(program, v.val, arenas) for v in plan.values]
    if len(inputs) != len(plan.inputs):
        raise ConfigError(f"{source} takes {len(plan.inputs)} inputs, {len(inputs)} given.",
                          "Give one array per input of the program.")
    for index, array in zip(plan.inputs, inputs, strict=True):
        given = torch.from_numpy(np.ascontiguousarray(array))
        if isinstance(values[index], torch.Tensor) and values[index].shape == given.shape:
            values[index].copy_(given)  # into its planned memory, or its dim order's layout
        else:
            values[index] = given.clone()
    # The integer reference of a dilated int8 convolution, which PyTorch lacks (flows).
    with torch.no_grad(), exact_integer_conv():
        for c, chain in enumerate(plan.chains):
            _run_chain(c, chain.instructions, values, names, on_kernel)
    return [values[i].detach().contiguous().numpy() if isinstance(values[i], torch.Tensor)
            else np.asarray(values[i]) for i in plan.outputs]


def _initial_value(program: Any, val: Any, arenas: list[Any]) -> Any:
    import torch

    kind = type(val).__name__
    if kind == "Tensor":
        dtype = _torch_dtype(int(val.scalar_type))
        sizes = [int(s) for s in val.sizes]
        dim_order = [int(d) for d in val.dim_order] or list(range(len(sizes)))
        if val.data_buffer_idx > 0 and val.allocation_info is None:  # a constant
            return _constant(program.constant_buffer[val.data_buffer_idx].storage, dtype, sizes,
                             dim_order)
        info = val.allocation_info
        if info is not None and int(info.memory_id) < len(arenas):
            return _planned(arenas[int(info.memory_id)], int(info.memory_offset), dtype, sizes,
                            dim_order)
        # Memory the caller gives at run time (an input the plan does not place).
        return _laid_out(torch.zeros(sizes, dtype=dtype), dim_order)
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
    if offset + nbytes > arena.numel():
        raise ConfigError(f"A tensor of {nbytes} B at offset {offset} lies outside its planned "
                          f"buffer of {arena.numel()} B.",
                          "The program is damaged: export it again.")
    memory = arena[offset:offset + nbytes].view(dtype)
    if not sizes:
        return memory.reshape(())
    return memory.reshape([sizes[d] for d in dim_order]).permute(list(np.argsort(dim_order)))


def _constant(storage: bytes, dtype: Any, sizes: list[int], dim_order: list[int]) -> Any:
    """A constant in logical order, with the strides of its dim order (a fresh copy)."""
    import torch

    count = int(np.prod(sizes)) if sizes else 1
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = bytes(storage[:count * itemsize])
    if len(raw) != count * itemsize:
        raise ConfigError(f"A constant of {count * itemsize} B has {len(raw)} B of data.",
                          "The program is damaged: export it again.")
    flat = torch.frombuffer(bytearray(raw), dtype=dtype) if raw else torch.zeros(0, dtype=dtype)
    if not sizes:
        return flat.reshape(())
    return flat.reshape([sizes[d] for d in dim_order]).permute(list(np.argsort(dim_order)))


def _laid_out(logical: Any, dim_order: list[int]) -> Any:
    """`logical` with its elements stored in `dim_order` (the strides the program gives it)."""
    if logical.dim() != len(dim_order) or dim_order == sorted(dim_order):
        return logical
    return logical.permute(dim_order).contiguous().permute(list(np.argsort(dim_order)))


def _run_chain(chain: int, instructions: list[Any], values: list[Any], names: tuple[str, ...],
               on_kernel: Callable[[KernelOutputs], None] | None) -> None:
    pc = 0
    while pc < len(instructions):
        at = pc
        args = instructions[pc].instr_args
        kind = type(args).__name__
        pc += 1
        if kind == "KernelCall":
            name = names[args.op_index]
            outs = _call(name, list(args.args), values, f"instruction {at} ({name})")
            if on_kernel is not None:
                on_kernel(KernelOutputs(chain, at, name, outs))
        elif kind == "MoveCall":
            values[args.move_to] = values[args.move_from]
        elif kind == "JumpFalseCall":
            if not bool(_read(values, args.cond_value_index)):
                pc = args.destination_instruction
        elif kind == "DelegateCall":
            raise ConfigError(f"Instruction {at} is a delegate call, which cannot run on the "
                              "host here.", "Give the expected outputs with --expect FILE.npz.")
        # FreeCall: nothing to free


def _read(values: list[Any], index: int) -> Any:
    value = values[index]
    return value.read(values) if isinstance(value, _Boxed) else value


def _call(name: str, indices: list[int], values: list[Any], where: str) -> list[tuple[int, Any]]:
    """Run one KernelCall; the (value index, tensor) of each tensor it wrote to an out."""

    if name in _PRIM_BINARY:
        a, b, out = indices
        values[out] = _PRIM_BINARY[name](_read(values, a), _read(values, b))
        return []
    if name == "executorch_prim::neg.Scalar":
        a, out = indices
        values[out] = -_read(values, a)
        return []
    if name == "executorch_prim::et_view.default":
        src, size, out = indices
        values[out] = _read(values, src).reshape([int(s) for s in _read(values, size)])
        return []
    if name == "aten::sym_size.int":
        src, dim, out = indices
        values[out] = int(_read(values, src).shape[_read(values, dim)])
        return []
    if name == "aten::sym_numel":
        src, out = indices
        values[out] = int(_read(values, src).numel())
        return []
    op = _torch_operator(name)
    arguments = list(op._schema.arguments)
    # ExecuTorch's emitter gives a kernel one value per argument of its schema, then one for
    # what it returns: its out, a TensorList of its outs, or the functional result.
    if len(indices) not in (len(arguments), len(arguments) + 1):
        raise ConfigError(f"{where} takes {len(arguments)} arguments and a return value; the "
                          f"program gives it {len(indices)} values.",
                          "The program is damaged: export it again.")
    outs = [(argument, index) for argument, index in zip(arguments, indices, strict=False)
            if argument.is_out]
    positional, keywords = [], {}
    try:
        for argument, index in zip(arguments, indices, strict=False):
            value = _argument(argument, _read(values, index))
            if argument.kwarg_only:
                keywords[argument.name] = value
            else:
                positional.append(value)
        try:
            result = op(*positional, **keywords)
        except NotImplementedError:  # no kernel for the .out overload: its functional twin
            result = _functional(name, op, positional, keywords, outs, values)
    except ConfigError:
        raise
    except Exception as exc:  # the operator's own code: any type, about this instruction
        raise ConfigError(f"{where} failed on the host: {type(exc).__name__}: {exc}",
                          "Give the expected outputs with --expect FILE.npz.") from exc
    if len(indices) > len(arguments) and not outs:  # a functional operator's result
        _store(values, indices[-1], result)
    written = []
    for _, index in outs:
        if isinstance(values[index], _Boxed):  # a Tensor[] out: each of its tensors
            written += [(i, values[i]) for i in values[index].items if i >= 0]
        else:
            written.append((index, values[index]))
    return written


def _functional(name: str, op: Any, positional: list[Any], keywords: dict[str, Any],
                outs: list[tuple[Any, int]], values: list[Any]) -> Any:
    """Run the functional overload of an out variant and copy its results into the outs."""
    functional = _functional_twin(name, op)
    if functional is None:
        raise ConfigError(f"No torch kernel runs {name} on the host.",
                          "Give the expected outputs with --expect FILE.npz.")
    out_names = {argument.name for argument, _ in outs}
    inputs = {k: v for k, v in keywords.items() if k not in out_names}
    # Fresh tensors (the implementations must not see the planned memory their outputs are
    # about to be written into) in the program's layout: some implementations read their
    # inputs' memory format (the cortex_m mul broadcasts a gate over channels-last tensors
    # only). Some fail on it instead (torch's max pool of a channels-last int8 tensor checks
    # its size against int8's range): those get the same values contiguous.
    try:
        result = functional(*[_owned(v) for v in positional],
                            **{k: _owned(v) for k, v in inputs.items()})
    except Exception as in_layout:  # noqa: BLE001 (the operator's own code, any type)
        try:
            result = functional(*[_owned(v, contiguous=True) for v in positional],
                                **{k: _owned(v, contiguous=True) for k, v in inputs.items()})
        except Exception:  # noqa: BLE001
            raise in_layout from None
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    for (_, index), tensor in zip(outs, results, strict=False):
        _store(values, index, tensor)
    return result


def _functional_twin(name: str, op: Any) -> Any:
    """The overload an out variant computes: the one whose arguments are the out variant's
    without its outs (`mean.out` -> `mean.dim`), else the packet's default."""
    import torch

    namespace, _, base = name.partition(".")[0].partition("::")
    packet = getattr(getattr(torch.ops, namespace), base)
    wanted = [a.name for a in op._schema.arguments if not a.is_out]
    for overload in packet.overloads():
        candidate = getattr(packet, overload)
        arguments = candidate._schema.arguments
        if [a.name for a in arguments] == wanted and not any(a.is_out for a in arguments):
            return candidate
    return _torch_operator(name.partition(".")[0])


def _store(values: list[Any], index: int, result: Any) -> None:
    """A result into the value `index`: into its memory when it is a tensor of that shape."""
    import torch

    target = values[index]
    if isinstance(target, _Boxed) and isinstance(result, (tuple, list)):
        for i, tensor in zip(target.items, result, strict=False):
            _store(values, i, tensor)
    elif (isinstance(target, torch.Tensor) and isinstance(result, torch.Tensor)
          and target.shape == result.shape):
        target.copy_(result.to(target.dtype))
    else:
        values[index] = result


def _owned(value: Any, contiguous: bool = False) -> Any:
    """A copy of a tensor argument with its strides kept, or `contiguous` (lists element by
    element)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.clone(memory_format=torch.contiguous_format if contiguous
                           else torch.preserve_format)
    if isinstance(value, list):
        return [_owned(v, contiguous) for v in value]
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
