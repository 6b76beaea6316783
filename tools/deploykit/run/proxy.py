"""Fit by proxy: where `deploykit build --fit` measures a board's memory when the board itself is
not attached (docs/memory.md, "Fit by proxy").

The pools' and the stack's peaks are properties of the model, the runtime options and the
CPU/ABI, not of the board's peripherals. A board file may name a proxy (`proxy:`): a board
with the same core whose runner is a simulator (the Pico 2's is QEMU's mps2-an505, a Cortex-M33).
The measurement firmware is then built for the proxy's memory map, console and timer, but with
the target board's CPU/ABI flags and the target's runtime options (the CMake definitions of its
build profile), and runs there. The target image is linked at those peaks plus margin, plus
`proxy.extra_stack`: the stack the target's own runtime (an SDK's interrupt handlers and console
path) uses beyond what the proxy's firmware does.

Which one measures:
- a board whose runner is a simulator measures on itself;
- a physical board measures on itself when it is attached (its runner's `check_environment`)
  or when a runner option (`--port`, `--probe`) names it;
- otherwise its proxy, when the board file names one; else the runner's own error (what to
  connect) stands, with the proxy as the other way out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploykit.readers.boards import Board, load_board
from deploykit.run.runners import runner_class
from deploykit.run.runners.base import Runner
from deploykit.util.errors import ConfigError, EnvironmentProblem

if TYPE_CHECKING:
    from deploykit.pipeline.target import Target

# What the memory table and fit.json say when the peaks come from a proxy.
PROXY_SOURCE = "measured on {proxy} (proxy: same core, ABI and runtime options)"


@dataclass(frozen=True)
class MeasureTarget:
    """Where a `--fit` measurement runs: the board the measurement firmware is built for, the
    runner that runs it, and what the peaks are then said to be."""

    board: Board  # the target board itself, or its proxy with the target's CPU/ABI flags
    runner: Runner
    proxy: str | None  # the proxy board's name; None: measured on the board itself
    extra_stack: int  # added to the fitted stack (the proxy's `extra_stack`)

    @property
    def where(self) -> str:
        """E.g. "measured on qemu-an505 (proxy: same core, ABI and runtime options)"."""
        if self.proxy is None:
            return f"measured on {self.board.name}"
        return PROXY_SOURCE.format(proxy=self.proxy)


def proxy_section(board: Board) -> Mapping[str, Any] | None:
    return board.raw.get("proxy")


def proxy_board(board: Board) -> Board:
    """The board's proxy as the measurement firmware is built for it: the proxy's memory map,
    console, timer and runner; the target's CPU data (flags, float ABI, FPU, DSP). Raises
    ConfigError when the board names no proxy, or one that cannot stand in for it."""
    section = proxy_section(board)
    if not section:
        raise ConfigError(f"Board {board.name} names no proxy to measure on.",
                          "Add a `proxy:` section to its board file (docs/memory.md), or "
                          "connect the board.")
    proxy = load_board(section["board"])
    where = f"Board {board.name}'s proxy {proxy.name}"
    if not runner_class(proxy).is_simulator:
        raise ConfigError(f"{where} runs on runner kind {proxy.runner.get('kind')!r}, which is "
                          "not a simulator.",
                          "Name a simulated board with the same core (e.g. qemu-an505 for a "
                          "Cortex-M33).")
    if proxy.raw.get("proxy"):
        raise ConfigError(f"{where} names a proxy itself.",
                          "A proxy must be a simulated board that measures on itself.")
    if proxy.cpu["core"] != board.cpu["core"]:
        raise ConfigError(f"{where} is a {proxy.cpu['core']}, not a {board.cpu['core']}.",
                          "The proxy must have the same core: the peaks depend on it.")
    cpu = {k: v for k, v in board.cpu.items() if k != "note"}
    return dataclasses.replace(proxy, cpu=cpu)


def measure_target(target: Target, runner_kwargs: dict[str, Any],
                   progress: Callable[[str], None]) -> MeasureTarget:
    """Where `--fit` measures `target`'s board (module docstring). `runner_kwargs` are the
    board's runner options as resolved for this command (with workspace and progress)."""
    board, cls = target.board, target.runner
    chosen = {k for k, v in runner_kwargs.items()
              if v is not None and k in {o.dest for o in cls.options}}
    if cls.is_simulator or chosen or target.proxy is None:
        return MeasureTarget(board, cls.from_board(board, **runner_kwargs), None, 0)
    runner = cls.from_board(board, **runner_kwargs)
    try:
        found = runner.check_environment()
    except EnvironmentProblem:
        proxy = target.proxy
        progress(f"no {board.name} attached: measuring on its proxy {proxy.board.name} instead "
                 f"(same core, built with {board.name}'s CPU/ABI flags and runtime options)")
        return MeasureTarget(proxy.board, proxy.runner.from_board(
            proxy.board, workspace=runner_kwargs.get("workspace"),
            progress=runner_kwargs.get("progress")), proxy.board.name, proxy.extra_stack)
    progress(f"measuring on the board itself: {found}")
    return MeasureTarget(board, runner, None, 0)


def measurement_dirs(out: Path, target: MeasureTarget) -> tuple[Path, Path]:
    """(generated, build) directories of the measurement firmware: the target's own for a
    measurement on the board, `<out>/fit/proxy/` for a proxy's (its own CMake project)."""
    if target.proxy is None:
        return out / "generated", out / "firmware"
    return out / "fit" / "proxy" / "generated", out / "fit" / "proxy" / "firmware"
