"""Progress of the long steps (export and its steps, Vela, build, fit, flash) on stderr.

On a terminal: a live status line (rich) with a spinner, the current step and its elapsed
time; each finished step stays as one `· message` line. Piped, in CI ($CI set) or with
TERM=dumb: the same `· message` lines, plain, one per step, nothing redrawn. `--quiet`: none.
Progress goes to stderr so that `--json` output on stdout stays machine-readable.
"""

from __future__ import annotations

import os
import sys
from typing import IO, Any


def _is_live(stream: IO[str]) -> bool:
    if os.environ.get("CI") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class ProgressDisplay:
    """Callable as `progress(message)`; `step(name)` names a sub-step of the current message
    (an export flow's steps), shown on the live line only."""

    def __init__(self, *, quiet: bool = False, stream: IO[str] | None = None,
                 live: bool | None = None) -> None:
        self.quiet = quiet
        self.stream = stream
        self.live = (not quiet) and (_is_live(self._out) if live is None else live)
        self._bar: Any = None  # rich.progress.Progress while a step is shown
        self._task: Any = None
        self._message: str | None = None
        self._own: IO[str] | None = None  # the terminal stream the live line writes to

    @property
    def _out(self) -> IO[str]:
        return self.stream or sys.stderr

    def __call__(self, message: str) -> None:
        if self.quiet:
            return
        if not self.live or not self._start(message):
            print(f"· {message}", file=self._out, flush=True)
            return
        new_step = self._message is None or not _same_step(self._message, message)
        if new_step and self._message is not None:
            self._bar.console.print(f"· {self._message}", highlight=False, markup=False,
                                   soft_wrap=True)
        if new_step:
            self._bar.reset(self._task)  # the elapsed time is the step's own
        self._message = message
        self._bar.update(self._task, description=_escape(message))

    def step(self, name: str) -> None:
        if self.quiet or not self.live or self._bar is None or self._message is None:
            return
        head = self._message.splitlines()[0].split(" (")[0]
        self._bar.update(self._task, description=_escape(f"{head} · {name}"))

    def close(self) -> None:
        """Stop the live line, leaving the last step as a finished line."""
        if self._bar is None:
            return
        if self._message is not None:
            self._bar.console.print(f"· {self._message}", highlight=False, markup=False,
                                   soft_wrap=True)
        self._bar.stop()
        self._bar = None
        self._message = None
        if self._own is not None:
            self._own.close()
            self._own = None

    def _start(self, first: str) -> bool:
        if self._bar is not None:
            return True
        try:
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
        except ImportError:  # rich is a dependency; without it, plain lines
            self.live = False
            return False
        if self.stream is not None:
            out = self.stream
        else:
            # A stream of its own on the terminal: the export sends fd 2 to a log file while
            # native libraries run (pipeline._native_output_to), and the line stays live then.
            self._own = out = os.fdopen(os.dup(sys.stderr.fileno()), "w", buffering=1)
        console = Console(file=out, force_terminal=True)
        self._bar = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                             TimeElapsedColumn(), console=console, transient=True,
                             redirect_stdout=False, redirect_stderr=False)
        self._task = self._bar.add_task(_escape(first), total=None)
        self._bar.start()
        return True


def _same_step(previous: str, message: str) -> bool:
    """`building firmware: 3/11` after `building firmware: 1/11` updates the same line."""
    head = previous.partition(":")[0]
    return ":" in previous and ":" in message and head == message.partition(":")[0]


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text.splitlines()[0] if text else text)
