"""Environment checks: the pinned Python stack, the cross toolchain, QEMU, the sources."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from .errors import DeployKitError, EnvironmentProblem
from .sources import check_executorch_commit, load_workspace

PINNED = {"torch": "2.13.0", "executorch": "1.4.1"}
APT_PACKAGES = ("gcc-arm-none-eabi libnewlib-arm-none-eabi libstdc++-arm-none-eabi-newlib "
                "qemu-system-arm cmake ninja-build")


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required_for: str = "build"


def _tool_version(tool: str, args: tuple[str, ...] = ("--version",)) -> str | None:
    path = shutil.which(tool)
    if path is None:
        return None
    out = subprocess.run([path, *args], capture_output=True, text=True, check=False).stdout
    first = out.splitlines()[0] if out else ""
    m = re.search(r"\d+\.\d+(\.\d+)?", first)
    return m.group(0) if m else first


def _pip() -> str:
    """pip of the Python deploykit runs on (the checkout's .venv after scripts/install)."""
    return f"{sys.executable} -m pip install"


def _python_package(name: str) -> Check:
    try:
        version = metadata.version(name)
    except metadata.PackageNotFoundError:
        return Check(name, False, "not installed",
                     f"scripts/install in a checkout, or {_pip()} {name}=={PINNED[name]} "
                     "(torch first, pinned)", "export")
    base = version.split("+")[0]
    ok = base == PINNED[name]
    return Check(name, ok, version,
                 "" if ok else f"{_pip()} {name}=={PINNED[name]}", "export")


def run_checks(workspace: Path | None = None) -> list[Check]:
    checks = [_python_package("torch"), _python_package("executorch")]
    for tool, purpose in (("arm-none-eabi-gcc", "build"), ("cmake", "build"),
                          ("ninja", "build"), ("qemu-system-arm", "run")):
        version = _tool_version(tool)
        checks.append(Check(tool, version is not None, version or "not found",
                            "" if version else f"apt-get install {APT_PACKAGES}", purpose))
    try:
        ws = load_workspace(workspace)
        commit = check_executorch_commit(ws)
        checks.append(Check("sources", True, f"{ws.root} (executorch {commit[:12]})",
                            required_for="firmware"))
    except DeployKitError as exc:
        checks.append(Check("sources", False, exc.cause, exc.hint, "firmware"))
    return checks


def require_tools(*tools: str) -> None:
    """Raise a one-paragraph error when a needed program is missing."""
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        raise EnvironmentProblem(f"Missing program(s): {', '.join(missing)}.",
                                 f"Install them with: apt-get install {APT_PACKAGES}")
