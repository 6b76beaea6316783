"""Runners: where firmware runs (QEMU today; FVP and serial boards plug in the same way)."""

from __future__ import annotations

from typing import Any

from deploykit.errors import ConfigError
from deploykit.runners.base import DEFAULT_TIMEOUT_S, Runner, RunResult, runner_section
from deploykit.runners.qemu import QemuRunner, icount_instructions

RUNNERS: dict[str, type[Runner]] = {QemuRunner.kind: QemuRunner}


def runner_for_board(board: Any, **kwargs: Any) -> Runner:
    """The runner named by the board's `runner.kind`, configured from that section."""
    section = runner_section(board)
    kind = section.get("kind")
    cls = RUNNERS.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise ConfigError(f"runner kind {kind!r} is not supported",
                          f"Known kinds: {', '.join(sorted(RUNNERS))}.")
    return cls(section, **kwargs)  # type: ignore[call-arg]


__all__ = ["DEFAULT_TIMEOUT_S", "RUNNERS", "QemuRunner", "RunResult", "Runner",
           "icount_instructions", "runner_for_board", "runner_section"]
