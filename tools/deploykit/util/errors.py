"""Domain errors: one line of cause, one line of what to do next, and an exit code per class."""

from __future__ import annotations

import errno
import os
from enum import IntEnum
from pathlib import Path


class ExitCode(IntEnum):
    """Process exit codes, one per failure class, so CI can tell failures apart."""

    OK = 0
    USAGE = 2
    CONFIG = 3  # bad board file, unknown model, bad arguments
    ENVIRONMENT = 4  # missing toolchain, QEMU, sources, mismatched commits
    EXPORT = 5
    MEMORY = 6  # the memory plan does not fit the board
    BUILD = 7
    FLASH = 8
    NO_BOOT = 9
    FAULT = 10
    TIMEOUT = 11
    MISMATCH = 12
    PROTOCOL = 13
    DEVICE_ERROR = 14
    UNSUPPORTED_OPERATOR = 15  # an exported operator has no kernel in the runtime build
    NOT_COMPARED = 16  # the run ended well, but nothing to compare its outputs with (a .pte)


class DeployKitError(Exception):
    """An error the user can act on. The CLI prints it without a traceback."""

    exit_code: ExitCode = ExitCode.CONFIG

    def __init__(self, cause: str, hint: str = "", *, log_path: str | None = None) -> None:
        super().__init__(cause)
        self.cause = cause
        self.hint = hint
        self.log_path = log_path

    def __str__(self) -> str:
        parts = [self.cause]
        if self.hint:
            parts.append(self.hint)
        if self.log_path:
            parts.append(f"Full log: {self.log_path}")
        return "\n".join(parts)


class ConfigError(DeployKitError):
    exit_code = ExitCode.CONFIG


class EnvironmentProblem(DeployKitError):
    exit_code = ExitCode.ENVIRONMENT


class DiskFullError(EnvironmentProblem):
    """A write the file system refused for want of space (ENOSPC, EDQUOT)."""


# The errno values of a full file system (or a user's quota).
NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def disk_full(path: Path | str, exc: OSError | None = None) -> DiskFullError:
    """The DiskFullError of a write to `path` (a file, or the directory it went into)."""
    place = Path(path)
    probe = next((p for p in (place, *place.parents) if p.exists()), None)
    free = ""
    if probe is not None:
        stat = os.statvfs(probe)
        free = f" ({stat.f_bavail * stat.f_frsize:,} B free there)"
    detail = f": {exc.strerror}" if exc is not None and exc.strerror else ""
    return DiskFullError(f"No space left to write {place}{free}{detail}.",
                         "Free space on that file system (or give another --out or "
                         "--workspace) and run the command again; nothing half-written is "
                         "kept.")


class ExportError(DeployKitError):
    exit_code = ExitCode.EXPORT


class OperatorCoverageError(ExportError):
    """An exported operator that no kernel library of the runtime build implements."""

    exit_code = ExitCode.UNSUPPORTED_OPERATOR


class MemoryPlanError(DeployKitError):
    exit_code = ExitCode.MEMORY


class BuildError(DeployKitError):
    exit_code = ExitCode.BUILD


class RunError(DeployKitError):
    """A run that did not produce a trustworthy result; the exit code names why."""

    def __init__(self, cause: str, hint: str = "", *, exit_code: ExitCode,
                 log_path: str | None = None) -> None:
        super().__init__(cause, hint, log_path=log_path)
        self.exit_code = exit_code
