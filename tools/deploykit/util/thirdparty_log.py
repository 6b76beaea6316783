"""Keep third-party import noise off the user's terminal, and in a log file instead.

Importing torch, torchao and executorch prints lines that are no concern of a deploykit user
(torchao's CUDA extensions failing to load on a CPU build of torch, a torch deprecation
warning about torchao, Python warnings from upstream code). The command line routes those
loggers, and Python's warnings, to `log_path()`; with `--debug` they also reach stderr.
Only the named loggers and the warnings are touched, and only by the CLI: a program that
uses the Python API keeps its own logging configuration.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

# Loggers whose warnings come at import time, before deploykit has said anything (matplotlib:
# "building the font cache" on the first chart a user draws).
NOISY_LOGGERS = ("torchao", "torch.utils._pytree", "py.warnings", "matplotlib")


def log_path() -> Path:
    """$XDG_STATE_HOME/deploykit/deploykit.log (by default ~/.local/state/...)."""
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "deploykit" / "deploykit.log"


class _LazyFileHandler(logging.Handler):
    """Opens the log file on the first record; a file that cannot be written is skipped."""

    def __init__(self, path: Path) -> None:
        super().__init__(logging.DEBUG)
        self.path = path
        self._inner: logging.Handler | None = None
        self._failed = False
        self.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if self._failed:
            return
        if self._inner is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._inner = logging.FileHandler(self.path, encoding="utf-8")
            except OSError:
                self._failed = True
                return
            self._inner.setFormatter(self.formatter)
        self._inner.emit(record)


def route_third_party_logs(debug: bool = False) -> None:
    """Send NOISY_LOGGERS and Python warnings to the log file (and to stderr when debug)."""
    handler = _LazyFileHandler(log_path())
    logging.captureWarnings(True)
    for name in NOISY_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(h, _LazyFileHandler) for h in logger.handlers):
            logger.addHandler(handler)
        logger.propagate = False
        if debug:
            logger.addHandler(logging.StreamHandler())
