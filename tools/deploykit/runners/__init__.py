"""Runners: where firmware runs (QEMU, Arm FVPs; serial boards plug in the same way)."""

from __future__ import annotations

from typing import Any

from deploykit.errors import ConfigError
from deploykit.runners.base import DEFAULT_TIMEOUT_S, Runner, RunResult, runner_section
from deploykit.runners.fvp import FvpRunner
from deploykit.runners.qemu import QemuRunner, icount_instructions
from deploykit.runners.serial_port import PicoRunner

RUNNERS: dict[str, type[Runner]] = {QemuRunner.kind: QemuRunner, FvpRunner.kind: FvpRunner,
                                    PicoRunner.kind: PicoRunner}


def runner_for_board(board: Any, **kwargs: Any) -> Runner:
    """The runner named by the board's `runner.kind`, configured from that section."""
    section = runner_section(board)
    kind = section.get("kind")
    cls = RUNNERS.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise ConfigError(f"runner kind {kind!r} is not supported",
                          f"Known kinds: {', '.join(sorted(RUNNERS))}.")
    if isinstance(cls, type) and issubclass(cls, FvpRunner):
        return cls.from_board(board, **kwargs)  # also needs the board's npu.macs
    if getattr(cls, "needs_board", False):  # serial boards: usb, serial, flashers sections
        kwargs.setdefault("board", board)
    return cls(section, **kwargs)  # type: ignore[call-arg]


__all__ = ["DEFAULT_TIMEOUT_S", "RUNNERS", "FvpRunner", "PicoRunner", "QemuRunner", "RunResult",
           "Runner",
           "icount_instructions", "runner_for_board", "runner_section"]
