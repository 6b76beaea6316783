"""Inspect stage: read a `.pte` and describe what the runtime will need to run it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError


@dataclass(frozen=True)
class TensorInfo:
    dtype: int  # ExecuTorch ScalarType code
    sizes: tuple[int, ...]


@dataclass(frozen=True)
class DelegateInfo:
    backend: str
    size: int


@dataclass(frozen=True)
class ProgramInfo:
    """What a `.pte` asks of the runtime (method `forward`)."""

    path: Path
    size: int
    method: str
    operators: tuple[str, ...]  # "aten::add.out", in the program's operator table order
    delegates: tuple[DelegateInfo, ...]
    planned_buffers: tuple[int, ...]  # per memory id >= 1
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    num_values: int
    num_instructions: int
    constant_bytes: int
    notes: list[str] = field(default_factory=list)

    @property
    def planned_total(self) -> int:
        return sum(self.planned_buffers)


def inspect_pte(path: Path, method: str = "forward") -> ProgramInfo:
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.schema import Tensor

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"No .pte file at {path}.", "Run `deploykit export` first.")
    data = path.read_bytes()
    try:
        program = deserialize_pte_binary(data).program
    except Exception as exc:  # the flatbuffer parser raises many unrelated types
        raise ConfigError(f"{path} is not a readable ExecuTorch program: {exc}",
                          "Re-export the model with the pinned executorch version.") from exc
    plans = {p.name: p for p in program.execution_plan}
    if method not in plans:
        raise ConfigError(f"{path} has no method '{method}'.",
                          f"Methods: {', '.join(plans)}.")
    plan = plans[method]

    def tensor_of(index: int) -> TensorInfo:
        val = plan.values[index].val
        if not isinstance(val, Tensor):
            raise ConfigError(f"{path}: input/output {index} is not a tensor.",
                              "deploykit supports tensor inputs and outputs only.")
        return TensorInfo(int(val.scalar_type), tuple(int(s) for s in val.sizes))

    operators = tuple(
        f"{op.name}.{op.overload}" if op.overload else op.name for op in plan.operators)
    delegates = tuple(
        DelegateInfo(d.id, _delegate_size(program, d)) for d in plan.delegates)
    constant_bytes = sum(len(b.storage) for b in program.constant_buffer)
    constant_bytes += sum(s.size for s in program.segments)
    return ProgramInfo(
        path=path,
        size=len(data),
        method=method,
        operators=operators,
        delegates=delegates,
        planned_buffers=tuple(int(s) for s in plan.non_const_buffer_sizes[1:]),
        inputs=tuple(tensor_of(i) for i in plan.inputs),
        outputs=tuple(tensor_of(i) for i in plan.outputs),
        num_values=len(plan.values),
        num_instructions=sum(len(c.instructions) for c in plan.chains),
        constant_bytes=constant_bytes,
    )


def _delegate_size(program, delegate) -> int:
    loc = delegate.processed
    if loc.location == 0:  # INLINE
        return len(program.backend_delegate_data[loc.index].data)
    return program.segments[loc.index].size
