"""A child process's output read line by line against a deadline.

`for line in proc.stderr` and `readline()` block until a line or the end comes: a child that
hangs without a word holds the test (and CI) forever, and a deadline checked after each line
never fires. `Lines` waits on the pipe with select() for at most the time left, so every wait
ends by its deadline. It reads the pipe's descriptor itself (not the Popen file object, whose
own buffer select() cannot see), so use it for all reading of that pipe.
"""

from __future__ import annotations

import os
import re
import select
import time
from typing import IO, Any


class Deadline(AssertionError):
    """The awaited output did not come in time (an assertion: the test fails, naming it)."""


class Lines:
    """The lines of one pipe of a child, each kept with the time it was read."""

    def __init__(self, pipe: IO[Any]) -> None:
        self._fd = pipe.fileno()
        self._buffer = b""
        self.eof = False
        self.seen: list[tuple[float, str]] = []

    @property
    def text(self) -> str:
        return "".join(line for _, line in self.seen)

    def next(self, deadline: float) -> str | None:
        """The next line (with its newline), or None at the end of the output; Deadline when
        neither came by `deadline` (time.monotonic())."""
        while b"\n" not in self._buffer and not self.eof:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Deadline(f"no line in time; so far:\n{self.text}{self._partial()}")
            ready, _, _ = select.select([self._fd], [], [], left)
            if ready:
                chunk = os.read(self._fd, 1 << 16)
                self.eof = not chunk
                self._buffer += chunk
        if not self._buffer:
            return None
        raw, newline, self._buffer = self._buffer.partition(b"\n")
        line = (raw + newline).decode(errors="replace")
        self.seen.append((time.monotonic(), line))
        return line

    def wait_for(self, pattern: str | re.Pattern[str], limit_s: float) -> str:
        """Read until a line matches `pattern`; that line. Deadline after `limit_s`, an
        AssertionError when the output ends first."""
        deadline = time.monotonic() + limit_s
        while True:
            line = self.next(deadline)
            if line is None:
                raise AssertionError(f"{_pattern(pattern)!r} never came:\n{self.text}")
            if re.search(pattern, line):
                return line

    def rest(self, limit_s: float) -> str:
        """Everything up to the end of the output (the child closed the pipe: it exited)."""
        deadline = time.monotonic() + limit_s
        start = len(self.seen)
        while self.next(deadline) is not None:
            pass
        return "".join(line for _, line in self.seen[start:])

    def _partial(self) -> str:
        return self._buffer.decode(errors="replace")


def _pattern(pattern: str | re.Pattern[str]) -> str:
    return pattern if isinstance(pattern, str) else pattern.pattern
