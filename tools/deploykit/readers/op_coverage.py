"""Operator coverage at export: every operator of an exported program must have a kernel in
the runtime build, checked before anything is planned, rendered or compiled.

The runtime build (cmake/ExecuTorchRuntime.cmake) maps a model's operator list onto kernel
libraries with `cmake/executorch_select_kernels.py`; this module loads that same script and
calls its `kernel_library()` on the same tables, so the export and the build cannot
disagree about what is covered:

- ExecuTorch's portable kernels (`kernels/portable/functions.yaml`) and the cortex_m
  kernels (`backends/cortex_m/ops/operators.yaml`), read from the installed ExecuTorch
  package that made the `.pte` (the build refuses sources of another commit, so these are the
  files the build reads);
- deploykit's own kernels (`firmware/kernels/functions.yaml`);
- the primitive operators, from `kernels/prim_ops/register_prim_ops.cpp` of the sources
  workspace when there is one; without sources (the package does not carry that file), the
  `executorch_prim::` namespace and the symbolic-size ATen operators, which is what a
  dynamic-shape export emits.

An uncovered operator is an `OperatorCoverageError` that names it, the model line it comes
from (the graph node's stack trace), why it has no kernel and the fix. The CMake check stays
as a second line of defence.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from deploykit.util.errors import OperatorCoverageError
from deploykit.util.paths import data_root

DK_KERNELS_YAML = Path("firmware/kernels/functions.yaml")
_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')


@dataclass(frozen=True)
class KernelTables:
    """The runtime build's kernel tables: operator name -> kernel function names."""

    portable: dict[str, list[str]]
    cortex_m: dict[str, list[str]]
    deploykit: dict[str, list[str]]
    prim_ops: frozenset[str]
    prim_ops_exact: bool  # read from register_prim_ops.cpp (else the namespace rule)

    def library(self, op: str) -> str | None:
        prim = self.prim_ops if self.prim_ops_exact else _PrimRule(self.prim_ops)
        return _select_kernels().kernel_library(
            op, prim, self.portable, self.deploykit, self.cortex_m
        )


class _PrimRule:
    """`in` for primitive operators without register_prim_ops.cpp."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def __contains__(self, op: object) -> bool:
        return isinstance(op, str) and (
            op in self.names or op.startswith(("executorch_prim::", "aten::sym_"))
        )


@dataclass(frozen=True)
class UncoveredOperator:
    op: str
    sources: tuple[str, ...]  # "models/x.py:12 in forward: y = torch.sort(x)[0]"
    reason: str
    fix: str


@cache
def _select_kernels() -> ModuleType:
    path = data_root() / "cmake" / "executorch_select_kernels.py"
    spec = importlib.util.spec_from_file_location("deploykit_select_kernels", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def executorch_package_root() -> Path:
    import executorch

    return Path(next(iter(executorch.__path__)))


def kernel_tables(executorch_sources: Path | None = None) -> KernelTables:
    """The tables of the runtime build. `executorch_sources`: an ExecuTorch source tree for
    the primitive operators (else the namespace rule)."""
    sel = _select_kernels()
    et = executorch_package_root()
    prim: frozenset[str] = frozenset()
    exact = False
    if (
        executorch_sources is not None
        and (executorch_sources / "kernels/prim_ops/register_prim_ops.cpp").is_file()
    ):
        prim = frozenset(sel.prim_op_macros(executorch_sources))
        exact = True
    return KernelTables(
        portable=sel.entries(et / "kernels/portable/functions.yaml"),
        cortex_m=sel.entries(et / "backends/cortex_m/ops/operators.yaml"),
        deploykit=sel.entries(data_root() / DK_KERNELS_YAML),
        prim_ops=prim,
        prim_ops_exact=exact,
    )


@cache
def deploykit_kernel_ops() -> frozenset[str]:
    """The operators of deploykit's own kernels (firmware/kernels/functions.yaml)."""
    return frozenset(_select_kernels().entries(data_root() / DK_KERNELS_YAML))


def workspace_executorch() -> Path | None:
    """The sources workspace's ExecuTorch tree ($DEPLOYKIT_WORKSPACE or the default), if
    there is one; an export needs no sources, so none is fine."""
    from deploykit.readers.sources import workspace_dir

    tree = workspace_dir() / "executorch"
    return tree if tree.is_dir() else None


def op_name(target: Any) -> str | None:
    """`aten::linear.out` for a graph node's target, as gen_oplist names the operator."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return None
    overload = schema.overload_name
    return f"{schema.name}.{overload}" if overload else schema.name


def graph_op_names(graph_module: Any) -> list[str]:
    """The operators a program graph calls, named as gen_oplist names them, sorted (for a
    check before the `.pte` is read back, e.g. before a flow runs it on the host)."""
    names = {op_name(n.target) for n in graph_module.graph.nodes if n.op == "call_function"}
    return sorted(n for n in names if n is not None)


def source_lines(
    graph_module: Any, op: str, model_file: Path | None, limit: int = 3
) -> tuple[str, ...]:
    """Where the nodes of `op` come from: the model file's frame of each node's stack trace
    (else its innermost frame), distinct, at most `limit`."""
    found: list[str] = []
    if graph_module is None:
        return ()
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or op_name(node.target) != op:
            continue
        line = model_line(node.meta.get("stack_trace") or "", model_file)
        if line and line not in found:
            found.append(line)
        if len(found) >= limit:
            break
    return tuple(found)


def model_line(stack_trace: str, model_file: Path | None) -> str | None:
    frames = _FRAME_RE.findall(stack_trace)
    if not frames:
        return None
    mine = [f for f in frames if model_file is not None and _same_file(f[0], model_file)]
    file, line, func, code = (mine or frames)[-1]
    shown = Path(file).name if model_file is None else _display(Path(file), model_file)
    return f"{shown}:{line} in {func}: {code.strip()}"


def _same_file(a: str, b: Path) -> bool:
    try:
        return Path(a).resolve() == b.resolve()
    except OSError:
        return False


def _display(path: Path, model_file: Path) -> str:
    return model_file.name if _same_file(str(path), model_file) else str(path)


def explain(op: str, tables: KernelTables) -> tuple[str, str]:
    """Why `op` has no kernel, and the fix."""
    base = op.split(".")[0]
    siblings = sorted(o for o in (*tables.portable, *tables.deploykit) if o.split(".")[0] == base)
    namespace = op.split("::")[0]
    if namespace == "quantized_decomposed":
        why = (
            "it is an int8 operator of ExecuTorch's quantized kernel library, which the "
            "runtime build does not link: the flow's passes left a quantize/dequantize "
            "they did not convert"
        )
        fix = (
            "Report the model to deploykit (the flow should convert it); meanwhile "
            "export with --flow portable_fp32."
        )
    elif siblings:
        why = (
            f"ExecuTorch's portable library implements {', '.join(siblings)} but not this overload"
        )
        fix = (
            "Call the operator with the arguments of an implemented overload, or add a "
            f"kernel for {op} to {DK_KERNELS_YAML} (docs/runtime-build.md)."
        )
    else:
        why = (
            "no kernel library of the runtime build implements it (ExecuTorch's portable "
            "kernels, the cortex_m kernels, deploykit's firmware/kernels)"
        )
        fix = (
            "Rewrite that line with operators that have kernels (deploykit export lists a "
            f"model's operators), or add a kernel for {op} to {DK_KERNELS_YAML} "
            "(docs/runtime-build.md)."
        )
    return why, fix


def uncovered(
    op_list: Iterable[str],
    tables: KernelTables,
    graph_module: Any,
    model_file: Path | None,
) -> list[UncoveredOperator]:
    out = []
    for op in op_list:
        if tables.library(op) is not None:
            continue
        why, fix = explain(op, tables)
        out.append(UncoveredOperator(op, source_lines(graph_module, op, model_file), why, fix))
    return out


def check_coverage(
    op_list: Iterable[str],
    graph_module: Any,
    model: str,
    model_file: Path | None,
    flow: str,
    tables: KernelTables | None = None,
) -> None:
    """Raise OperatorCoverageError when an operator of `op_list` has no kernel."""
    tables = tables or kernel_tables(workspace_executorch())
    missing = uncovered(op_list, tables, graph_module, model_file)
    if not missing:
        return
    lines = []
    for m in missing:
        where = "; ".join(m.sources) if m.sources else "no source line recorded"
        lines.append(f"  {m.op}\n    from: {where}\n    why: {m.reason}\n    fix: {m.fix}")
    names = ", ".join(m.op for m in missing)
    raise OperatorCoverageError(
        f"The {flow} export of '{model}' has operator(s) with no kernel in the runtime build: "
        f"{names}.\n" + "\n".join(lines),
        "Nothing was planned or compiled. Fix each operator as said above.",
    )
