"""Environment checks: the pinned Python stack, the cross toolchain, QEMU, the sources."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from deploykit.readers.sources import (
    CMSIS,
    ETHOS_U_DRIVER,
    Workspace,
    check_executorch_commit,
    ethos_u_driver_info,
    load_workspace,
    read_manifest,
)
from deploykit.util.errors import DeployKitError, EnvironmentProblem

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
    warning: bool = False  # ok, but worth a look (printed `warn`, exit code unaffected)


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


def charts_check() -> Check:
    """matplotlib, which draws every chart (util/charts.py): an environment made before it was
    a dependency lacks it until scripts/install runs again."""
    from deploykit.util.charts import MATPLOTLIB_MIN, MISSING_HINT

    try:
        version = metadata.version("matplotlib")
    except metadata.PackageNotFoundError:
        return Check("matplotlib", False, "not installed", MISSING_HINT, "charts")
    ok = _version_tuple(version) >= _version_tuple(MATPLOTLIB_MIN)
    return Check("matplotlib", ok, version, "" if ok else MISSING_HINT, "charts")


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:2])


def run_checks(workspace: Path | None = None) -> list[Check]:
    checks = [_python_package("torch"), _python_package("executorch"), charts_check()]
    for tool, purpose in (("arm-none-eabi-gcc", "build"), ("cmake", "build"),
                          ("ninja", "build"), ("qemu-system-arm", "run")):
        version = _tool_version(tool)
        checks.append(Check(tool, version is not None, version or "not found",
                            "" if version else f"apt-get install {APT_PACKAGES}", purpose))
    ws = None
    try:
        ws = load_workspace(workspace)
        commit = check_executorch_commit(ws)
        checks.append(Check("sources", True, f"{ws.root} (executorch {commit[:12]})",
                            required_for="firmware"))
    except DeployKitError as exc:
        checks.append(Check("sources", False, exc.cause, exc.hint, "firmware"))
    if ws is not None:
        checks += ethos_u_checks(ws)
        checks.append(overrides_check(ws))
    checks.append(model_explorer_check())
    return checks


def overrides_check(ws: Workspace) -> Check:
    """The source overrides the workspace remembers (`deploykit setup` uses them again)."""
    if not ws.overrides:
        return Check("overrides", True, "none remembered (every project from its upstream)",
                     required_for="setup")
    listed = ", ".join(o.describe() for o in ws.overrides.values())
    return Check("overrides", True, f"remembered: {listed} (deploykit setup --forget NAME "
                 "fetches one from its upstream again)", required_for="setup")


def model_explorer_check() -> Check:
    """Model Explorer's own environment (deploykit.util.tool_env): optional, made on first use."""
    from deploykit.util import tool_env

    st = tool_env.state()
    fix = "" if st.ready else ("deploykit explore --setup (needs PyPI, or --wheels DIR); "
                               "also made on the first `deploykit explore`")
    broken = st.path.exists() and not st.ready
    return Check("model-explorer", not broken, st.detail, fix, "explore")


def ethos_u_checks(ws: Workspace) -> list[Check]:
    """The Ethos-U core driver and CMSIS_6 (group ethos-u): optional, needed only by NPU
    firmware (ethos_u_int8 on corstone-300/320). The driver's layout (Arm's repository or the
    Zephyr module) and revision are reported; another revision than the pinned release is a
    warning, not an error."""
    pins = {p.name: p for p in read_manifest()}
    info = ethos_u_driver_info(ws)
    need = "needed only for NPU firmware (ethos_u_int8)"
    fix = (f"deploykit setup --group ethos-u, or --source {ETHOS_U_DRIVER}=PATH@REV "
           f"--source {CMSIS}=PATH@{pins[CMSIS].revision[:12]}")
    if info is None:
        return [Check(ETHOS_U_DRIVER, True, f"not in the workspace ({need})", fix,
                      "NPU firmware")]
    checks = []
    if info.layout is None:
        checks.append(Check(ETHOS_U_DRIVER, False, f"{ws.path_of(ETHOS_U_DRIVER)} is not the "
                            "Ethos-U core driver", fix, "NPU firmware"))
    elif info.is_pinned:
        checks.append(Check(ETHOS_U_DRIVER, True, f"{info.describe()}: the pinned release "
                            f"{info.pinned}", required_for="NPU firmware"))
    else:
        checks.append(Check(
            ETHOS_U_DRIVER, True, f"{info.describe()}: not the pinned release {info.pinned} "
            f"(the one ExecuTorch v1.4.1 uses); NPU firmware builds with it",
            f"for the pinned release: --source {ETHOS_U_DRIVER}=PATH@{info.pinned} "
            f"({pins[ETHOS_U_DRIVER].url})", "NPU firmware", warning=True))
    if ws.has(CMSIS):
        state = ws.projects[CMSIS]
        tags = f" (tag {', '.join(state.tags)})" if state.tags else ""
        pinned = state.commit == pins[CMSIS].revision
        checks.append(Check(CMSIS, True, f"commit {state.commit[:12]}{tags}"
                            + ("" if pinned else f", not the pinned {pins[CMSIS].revision[:12]}"),
                            required_for="NPU firmware", warning=not pinned))
    else:
        checks.append(Check(CMSIS, False, "not in the workspace; the Ethos-U driver needs its "
                            "CMSIS/Core/Include", fix, "NPU firmware"))
    return checks


def require_tools(*tools: str) -> None:
    """Raise a one-paragraph error when a needed program is missing."""
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        raise EnvironmentProblem(f"Missing program(s): {', '.join(missing)}.",
                                 f"Install them with: apt-get install {APT_PACKAGES}")
