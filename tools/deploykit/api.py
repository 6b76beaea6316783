"""The Python API: one function per pipeline stage, and the chains the CLI offers.

    export → inspect → plan → render → build → run → validate

Each stage is its own module with typed inputs and outputs; this module wires them together
with the conventions every command shares (output directories, board defaults, progress).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .boards import Board, available_boards, load_board
from .errors import ConfigError
from .inspect_pte import ProgramInfo, inspect_pte
from .sources import SourceOverride, Workspace

Progress = Callable[[str], None]


def _quiet(_message: str) -> None:
    pass


def boards() -> list[Board]:
    return [load_board(name) for name in available_boards()]


def describe_board(board: Board) -> str:
    lines = [f"{board.name}: {board.description}",
             f"  cpu {board.cpu['core']} ({' '.join(board.cpu_flags)}), runner "
             f"{board.runner['kind']}, flows {', '.join(board.export['allowed'])}"]
    for r in board.memory:
        placed = [k for k, v in board.placement.items() if v == r.name]
        lines.append(f"  {r.name:<8} 0x{r.origin:08X} {r.size // 1024:>8} KiB  "
                     f"{', '.join(placed) or '-'}")
    return "\n".join(lines)


def doctor(workspace: Path | None = None):
    from .doctor import run_checks

    return run_checks(workspace)


def setup(workspace: Path | None = None, sources: list[str] | None = None,
          progress: Progress = _quiet) -> Workspace:
    from . import sources as src

    overrides = [SourceOverride.parse(s) for s in sources or []]
    return src.setup(workspace, overrides, progress)


def inspect(pte: Path) -> ProgramInfo:
    return inspect_pte(pte)


def describe_program(info: ProgramInfo) -> str:
    lines = [f"{info.path}: {info.size:,} B, method '{info.method}'",
             f"  operators ({len(info.operators)}): {', '.join(info.operators) or '-'}",
             f"  delegates ({len(info.delegates)}): "
             + (", ".join(f"{d.backend} {d.size:,} B" for d in info.delegates) or "-"),
             f"  planned buffers: {', '.join(f'{s:,} B' for s in info.planned_buffers) or '-'}",
             f"  constant data: {info.constant_bytes:,} B",
             f"  values {info.num_values}, instructions {info.num_instructions}",
             "  inputs: " + ", ".join(f"{t.sizes} dtype {t.dtype}" for t in info.inputs),
             "  outputs: " + ", ".join(f"{t.sizes} dtype {t.dtype}" for t in info.outputs)]
    return "\n".join(lines)


def default_out(board: str, model: str) -> Path:
    return Path("build") / Path(board).stem / Path(model).stem


def resolve_flow(board: Board, flow: str | None) -> str:
    flow = flow or board.export["default"]
    if flow not in board.export["allowed"]:
        raise ConfigError(f"Board {board.name} does not support the {flow} flow.",
                          f"Allowed flows: {', '.join(board.export['allowed'])}.")
    return flow


def export(board: str, model: str, flow: str | None = None, out: Path | None = None,
           progress: Progress = _quiet):
    from .pipeline import export_stage

    b = load_board(board)
    return export_stage(b, model, resolve_flow(b, flow), out or default_out(board, model),
                        progress)


def describe_export(result) -> str:
    from .pipeline import describe_export as describe

    return describe(result)


def plan(board: str, model: str, flow: str | None = None, out: Path | None = None,
         workspace: Path | None = None, progress: Progress = _quiet):
    from .pipeline import plan_stage

    b = load_board(board)
    return plan_stage(b, model, resolve_flow(b, flow), out or default_out(board, model),
                      progress)


def build(board: str, model: str, flow: str | None = None, out: Path | None = None,
          workspace: Path | None = None, progress: Progress = _quiet):
    from .pipeline import build_firmware

    b = load_board(board)
    return build_firmware(b, model, resolve_flow(b, flow), out or default_out(board, model),
                          workspace, progress)


def run(board: str, model: str, flow: str | None = None, out: Path | None = None,
        workspace: Path | None = None, timeout: float = 120.0, progress: Progress = _quiet):
    from .pipeline import run_firmware

    b = load_board(board)
    return run_firmware(b, model, resolve_flow(b, flow), out or default_out(board, model),
                        workspace, timeout, progress)


def selftest(board: str, out: Path | None = None, workspace: Path | None = None,
             timeout: float = 30.0, progress: Progress = _quiet):
    from .selftest import run_selftest

    b = load_board(board)
    return run_selftest(b, out or default_out(board, "selftest"), timeout, progress)
