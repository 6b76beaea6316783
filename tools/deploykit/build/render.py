"""Render stage: Jinja2 templates → the generated firmware inputs (docs/generated-files.md).

Every file is a pure function of its inputs: no dates, and a header comment with the SHA-256
of the template and its context, so identical inputs give byte-identical files and an
unchanged file keeps its mtime (no needless recompiles).
"""

from __future__ import annotations

import hashlib
import json
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from jinja2 import Environment, PackageLoader, StrictUndefined

from deploykit.memory.plan import MemoryPlan
from deploykit.readers.boards import Board
from deploykit.readers.protocol.budget import transcript_bytes
from deploykit.util.fsutil import write_if_changed

BOARD_TEMPLATES = ("board_config.h", "irq_vectors.h", "board.cmake", "memory.ld")
PTE_FILE = "model.pte"  # the program beside model_pte.c, which .incbin's it
MODEL_TEMPLATES = ("model_pte.h", "model_pte.c", "model_config.h", "model_io.h", "model_io.c")

# numpy dtype → ExecuTorch ScalarType code (runtime/core/portable_type/scalar_type.h)
SCALAR_TYPES = {
    np.dtype("uint8"): 0, np.dtype("int8"): 1, np.dtype("int16"): 2, np.dtype("int32"): 3,
    np.dtype("int64"): 4, np.dtype("float32"): 6, np.dtype("float64"): 7, np.dtype("bool"): 11,
}


@dataclass(frozen=True)
class GeneratedSources:
    directory: Path
    files: tuple[Path, ...]
    changed: tuple[Path, ...]
    input_hash: str  # over all rendered files' inputs


@dataclass(frozen=True)
class ModelSources:
    """What the model-specific templates need."""

    pte: bytes
    input_sets: Sequence[Sequence[np.ndarray]]  # one or more sets, each in memory order
    expected_outputs: Sequence[np.ndarray]
    plan: MemoryPlan
    et_commit: str
    build_info: str


def _environment() -> Environment:
    env = Environment(loader=PackageLoader("deploykit", "build/templates"),
                      undefined=StrictUndefined, keep_trailing_newline=True,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["hex"] = lambda n: f"0x{int(n):08X}"
    env.filters["c_bytes"] = _c_bytes
    env.filters["c_string"] = lambda s: json.dumps(str(s))
    env.filters["pyrepr"] = _py_literal
    return env


def _py_literal(value: Any, column: int = 8, indent: int = 8, width: int = 100) -> str:
    """A Python literal starting at `column` of a line indented by `indent`, laid out as ruff
    format leaves it: a string too long for the line goes in parentheses, split into one
    piece per line when it does not fit on one line there either."""
    if not isinstance(value, str):
        return repr(value)
    literal = json.dumps(value)
    if column + len(literal) + 1 <= width:  # + the trailing comma
        return literal
    pad = " " * (indent + 4)
    if len(pad) + len(literal) <= width:
        return f"(\n{pad}{literal}\n{' ' * indent})"
    pieces = textwrap.wrap(value, width - len(pad) - 8, drop_whitespace=False)
    body = "\n".join(pad + json.dumps(p) for p in pieces)
    return f"(\n{body}\n{' ' * indent})"


def _c_bytes(data: bytes, per_line: int = 16) -> str:
    rows = (", ".join(f"0x{b:02x}" for b in data[i:i + per_line])
            for i in range(0, len(data), per_line))
    return ",\n".join(f"    {row}" for row in rows) or "    0"


def _hash_inputs(template_source: str, context: dict[str, Any]) -> str:
    h = hashlib.sha256(template_source.encode())
    h.update(json.dumps(context, sort_keys=True, default=_json_default).encode())
    return h.hexdigest()


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return hashlib.sha256(value).hexdigest()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(type(value))


def render_text(template_name: str, context: dict[str, Any]) -> str:
    """One template rendered with its input hash in the header (`input_hash`, `template_name`)."""
    env = _environment()
    source, _, _ = env.loader.get_source(env, template_name)
    return env.get_template(template_name).render(
        **context, input_hash=_hash_inputs(source, context), template_name=template_name)


def _render_all(names: Sequence[str], context: dict[str, Any], out_dir: Path) -> GeneratedSources:
    env = _environment()
    files, changed, hashes = [], [], []
    for name in names:
        template_name = f"{name}.j2"
        source, _, _ = env.loader.get_source(env, template_name)
        input_hash = _hash_inputs(source, context)
        text = env.get_template(template_name).render(
            **context, input_hash=input_hash, template_name=template_name)
        path = out_dir / name
        if write_if_changed(path, text):
            changed.append(path)
        files.append(path)
        hashes.append(input_hash)
    overall = hashlib.sha256("".join(hashes).encode()).hexdigest()
    return GeneratedSources(out_dir, tuple(files), tuple(changed), overall)


def render_board_files(board: Board, out_dir: Path,
                       stack_heap_source: str = "the board file",
                       plan: MemoryPlan | None = None) -> GeneratedSources:
    """board_config.h, irq_vectors.h, board.cmake and memory.ld from the board file. A build
    that sizes the stack and heap itself (deploykit build --fit) passes the board with its
    stack_size and heap_size replaced, and says so in `stack_heap_source`; the board file stays
    the source of the defaults. With `plan`, a program with Ethos-U delegates gets the model,
    the NPU scratch (with the temp pool) and the fast arena linked where the plan put them
    (the Vela memory mode's regions, npu.npu_placement); without one they follow the board's
    `placement` (model) and `pools`."""
    from deploykit.readers.npu import npu_board_facts, npu_placement

    board_ctx = board.as_template_context()
    board_ctx["npu"] = npu_board_facts(board)  # base in the firmware's security state, IRQ, ...
    placement = dict(board_ctx["placement"])
    placement.setdefault("npu_scratch", placement["pools"])
    placement.setdefault("npu_fast", placement["pools"])
    if plan is not None:
        placement.update(npu_placement(plan))
    board_ctx["placement"] = placement
    sized = _render_all(("board_config.h", "irq_vectors.h", "memory.ld"),
                        {"board": board_ctx, "stack_heap_source": stack_heap_source}, out_dir)
    # board.cmake holds CPU facts only: keep stack and heap out of its inputs, so a fitted
    # stack does not rewrite it (which would reconfigure the firmware build).
    cpu = _render_all(("board.cmake",), {"board": {k: v for k, v in board_ctx.items()
                                                   if k in ("name", "family", "cpu")}},
                      out_dir)
    files = {f.name: f for f in (*sized.files, *cpu.files)}
    return GeneratedSources(out_dir, tuple(files[n] for n in BOARD_TEMPLATES),
                            (*sized.changed, *cpu.changed),
                            hashlib.sha256((sized.input_hash + cpu.input_hash).encode())
                            .hexdigest())


def _tensor_context(arrays: Sequence[np.ndarray], prefix: str) -> list[dict[str, Any]]:
    tensors = []
    for i, array in enumerate(arrays):
        array = np.ascontiguousarray(array)
        if array.dtype not in SCALAR_TYPES:
            raise ValueError(f"{prefix} {i} has dtype {array.dtype}, which the runner lacks")
        tensors.append({
            "name": f"{prefix}_{i}",
            "dtype": SCALAR_TYPES[array.dtype],
            "dtype_name": str(array.dtype),
            "sizes": [int(s) for s in array.shape],
            "data": array.tobytes(),
        })
    return tensors


def render_model_files(model: ModelSources, out_dir: Path) -> GeneratedSources:
    """The embedded `.pte`, pool sizes, inputs and host-expected outputs."""
    from deploykit.readers.npu import npu_plan_sizes

    pte_sha = hashlib.sha256(model.pte).hexdigest()
    npu_scratch, npu_fast = npu_plan_sizes(model.plan)
    input_sets = [_tensor_context(arrays, f"set{k}_input")
                  for k, arrays in enumerate(model.input_sets)]
    inputs = [t for tensors in input_sets for t in tensors]
    # model_pte.c assembles the program in with .incbin from this copy (docs/generated-files.md).
    pte_file = Path(out_dir) / PTE_FILE
    write_if_changed(pte_file, model.pte)
    context = {
        "pte": model.pte,
        "pte_name": PTE_FILE,
        "pte_sha256": pte_sha[:16],
        "inputs_sha256": hashlib.sha256(b"".join(t["data"] for t in inputs)).hexdigest()[:16],
        "inputs": inputs,
        "input_sets": input_sets,
        "num_inputs": len(input_sets[0]),
        "expected": _tensor_context(model.expected_outputs, "expected"),
        "method_pool": model.plan.method_pool,
        "temp_pool": model.plan.temp_pool,
        "planned_buffers": list(model.plan.planned_buffers),
        "npu_scratch": npu_scratch,
        "npu_fast": npu_fast,
        "et_commit": model.et_commit,
        "build_info": model.build_info,
        # What a run sends (protocol/budget.py): sizes the serial link's transcript.
        "result_bytes": transcript_bytes(
            [(np.asarray(a).nbytes, np.asarray(a).ndim) for a in model.expected_outputs],
            len(model.input_sets)),
    }
    return _render_all(MODEL_TEMPLATES, context, out_dir)
