"""Map a model's operator list onto ExecuTorch kernel libraries (run by ExecuTorchRuntime.cmake).

Input: the `selected_operators.yaml` that `python -m executorch.codegen.tools.gen_oplist
--model_file_path=X.pte` writes for a model. Output: a CMake fragment that says

- which portable kernel source files implement the model's portable operators (each becomes its
  own small static library in the cached runtime build, so only those are ever compiled);
- whether the model needs cortex_m operators (and so the cortex_m kernels and CMSIS-NN);
- which kernel YAMLs the registration codegen needs;
- the exact number of kernels the generated registration plus the primitive operators put into
  the registry, used as MAX_KERNEL_NUM.

Any operator that no kernel library here implements is a configure error naming the operator,
rather than a firmware that fails at Method load with OperatorMissing.

Operator -> file: a portable kernel is the op_*.cpp file that mentions the kernel function
(`torch::executor::add_out` -> `add_out`) as a word. That is exactly one file for all but two
entries of kernels/portable/functions.yaml in v1.4.1; ties prefer op_<name>.cpp, else all
matches are taken (an unused archive member is never linked).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml


def _entries(functions_yaml: Path) -> dict[str, list[str]]:
    """`namespace::name.overload` -> kernel function names, from a kernel YAML."""
    out: dict[str, list[str]] = {}
    for entry in yaml.safe_load(functions_yaml.read_text()) or []:
        op = entry.get("op") or entry.get("func", "").split("(")[0]
        if "::" not in op:
            op = "aten::" + op
        kernels = [k["kernel_name"].split("::")[-1] for k in entry.get("kernels", [])]
        out[op] = kernels
    return out


def _count_prim_ops(et_root: Path) -> int:
    """Primitive operators are always registered; count them as ExecuTorch's own tool does."""
    sys.path.insert(0, str(et_root))
    try:
        from codegen.tools.gen_max_kernel_num import _count_prim_ops
    finally:
        sys.path.pop(0)
    return _count_prim_ops(et_root / "kernels/prim_ops/register_prim_ops.cpp")


def _portable_files(kernel_fns: list[str], op: str, cpu_dir: Path,
                    sources: dict[str, str]) -> list[str]:
    base = op.split("::")[-1].split(".")[0]
    preferred = {f"op_{base}.cpp", f"op_{base.strip('_')}.cpp"}
    files: list[str] = []
    for fn in kernel_fns:
        hits = sorted(f for f, text in sources.items() if re.search(rf"\b{re.escape(fn)}\b", text))
        pick = [f for f in hits if f in preferred] if len(hits) > 1 else hits
        files.extend(pick or hits)
    return sorted(set(files))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ops-yaml", required=True, type=Path)
    ap.add_argument("--executorch-root", required=True, type=Path)
    ap.add_argument("--cortex-m", action="store_true", help="cortex_m kernels are available")
    ap.add_argument("--output", required=True, type=Path)
    ap.add_argument("--normalized-yaml", type=Path,
                    help="write the operator list without debug_info (the .pte path) here, "
                         "so a weight-only change leaves the registration codegen's input as is")
    args = ap.parse_args(argv)

    et = args.executorch_root
    selected = yaml.safe_load(args.ops_yaml.read_text()) or {}
    if selected.get("include_all_operators"):
        print("the operator list selects all operators; give the model's own list "
              "(gen_oplist --model_file_path)", file=sys.stderr)
        return 1
    ops = sorted((selected.get("operators") or {}).keys())

    portable = _entries(et / "kernels/portable/functions.yaml")
    cortex_m = _entries(et / "backends/cortex_m/ops/operators.yaml")
    cpu_dir = et / "kernels/portable/cpu"
    sources = {p.name: p.read_text() for p in sorted(cpu_dir.glob("op_*.cpp"))}

    portable_files: set[str] = set()
    portable_ops: list[str] = []
    cortex_m_ops: list[str] = []
    missing: list[str] = []
    kernels = 0
    for op in ops:
        if op in portable:
            files = _portable_files(portable[op], op, cpu_dir, sources)
            if not files:
                missing.append(f"{op} (in functions.yaml but no op_*.cpp defines it)")
                continue
            portable_files.update(files)
            portable_ops.append(op)
            kernels += max(1, len(portable[op]))
        elif op in cortex_m and args.cortex_m:
            cortex_m_ops.append(op)
            kernels += max(1, len(cortex_m[op]))
        elif op in cortex_m:
            missing.append(f"{op} (cortex_m operator: configure with -DDK_CMSIS_NN_DIR=...)")
        else:
            missing.append(op)
    if missing:
        print("no kernel for: " + ", ".join(missing), file=sys.stderr)
        return 2

    needs_pattern = any('pattern/pattern.h' in sources[f] or 'pattern/' in sources[f]
                        for f in portable_files)
    prim = _count_prim_ops(et)
    stems = sorted(Path(f).stem for f in portable_files)
    lines = [
        "# Generated by cmake/executorch_select_kernels.py from " + str(args.ops_yaml),
        f"set(DK_SEL_OPS \"{';'.join(ops)}\")",
        f"set(DK_SEL_PORTABLE_OPS \"{';'.join(portable_ops)}\")",
        f"set(DK_SEL_PORTABLE_SOURCES \"{';'.join(stems)}\")",
        f"set(DK_SEL_NEEDS_PATTERN {'ON' if needs_pattern else 'OFF'})",
        f"set(DK_SEL_CORTEX_M_OPS \"{';'.join(cortex_m_ops)}\")",
        f"set(DK_SEL_KERNELS {kernels})",
        f"set(DK_SEL_PRIM_OPS {prim})",
        f"set(DK_SEL_MAX_KERNEL_NUM {kernels + prim})",
    ]
    _write_if_changed(args.output, "\n".join(lines) + "\n")
    if args.normalized_yaml:
        for info in (selected.get("operators") or {}).values():
            if isinstance(info, dict):
                info.pop("debug_info", None)
        _write_if_changed(args.normalized_yaml, yaml.safe_dump(selected, sort_keys=True))
    return 0


def _write_if_changed(path: Path, text: str) -> None:
    """Keep the mtime of an unchanged file, so nothing downstream rebuilds."""
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
