"""Runners: where firmware runs (QEMU, Arm FVPs; serial boards plug in the same way)."""

from __future__ import annotations

from typing import Any

from deploykit.run.runners.base import (
    DEFAULT_TIMEOUT_S,
    Runner,
    RunnerOption,
    RunResult,
    runner_section,
)
from deploykit.run.runners.fvp import FvpRunner
from deploykit.run.runners.linux import LinuxRunner
from deploykit.run.runners.qemu import QemuRunner, icount_instructions
from deploykit.run.runners.serial_port import PicoRunner
from deploykit.util.errors import ConfigError

RUNNERS: dict[str, type[Runner]] = {QemuRunner.kind: QemuRunner, FvpRunner.kind: FvpRunner,
                                    PicoRunner.kind: PicoRunner, LinuxRunner.kind: LinuxRunner}


def runner_class(board: Any) -> type[Runner]:
    """The runner class named by the board's `runner.kind`."""
    kind = runner_section(board).get("kind")
    cls = RUNNERS.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise ConfigError(f"runner kind {kind!r} is not supported",
                          f"Known kinds: {', '.join(sorted(RUNNERS))}.")
    return cls


def runner_for_board(board: Any, **kwargs: Any) -> Runner:
    """The runner of the board's `runner.kind`, configured from the board."""
    return runner_class(board).from_board(board, **kwargs)


def runner_options() -> tuple[RunnerOption, ...]:
    """The command-line options of every runner, each once (by flag)."""
    seen: dict[str, RunnerOption] = {}
    for cls in RUNNERS.values():
        for option in cls.options:
            seen.setdefault(option.flag, option)
    return tuple(seen.values())


__all__ = ["DEFAULT_TIMEOUT_S", "RUNNERS", "FvpRunner", "LinuxRunner", "PicoRunner", "QemuRunner",
           "RunResult", "Runner", "RunnerOption", "icount_instructions", "runner_class",
           "runner_for_board", "runner_options", "runner_section"]
