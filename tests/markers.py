"""Skip markers for components a machine may lack, each with the precise reason."""

from __future__ import annotations

import shutil

import pytest

from deploykit.readers.sources import load_workspace
from deploykit.util.errors import DeployKitError

requires_toolchain = pytest.mark.skipif(
    shutil.which("arm-none-eabi-gcc") is None,
    reason="arm-none-eabi-gcc not installed (apt-get install gcc-arm-none-eabi)")
requires_qemu = pytest.mark.skipif(
    shutil.which("qemu-system-arm") is None,
    reason="qemu-system-arm not installed (apt-get install qemu-system-arm)")
requires_cmake = pytest.mark.skipif(
    shutil.which("cmake") is None or shutil.which("ninja") is None,
    reason="cmake and ninja not installed (apt-get install cmake ninja-build)")


def _sources_reason() -> str | None:
    try:
        load_workspace()
    except DeployKitError:
        return ("ExecuTorch sources not available: run `deploykit setup` (or set "
                "DEPLOYKIT_WORKSPACE to a workspace made by it)")
    return None


requires_sources = pytest.mark.skipif(_sources_reason() is not None,
                                      reason=_sources_reason() or "")


def _ethos_u_sources_reason() -> str | None:
    from deploykit.readers.sources import CMSIS, ETHOS_U_DRIVER

    try:
        ws = load_workspace()
    except DeployKitError:
        return _sources_reason()
    missing = [n for n in (ETHOS_U_DRIVER, CMSIS) if not ws.has(n)]
    if missing:
        return (f"Ethos-U NPU firmware sources not in the workspace ({', '.join(missing)}): "
                "deploykit setup --group ethos-u, or without Arm's GitLab "
                f"--source {ETHOS_U_DRIVER}=PATH@REV (Arm's ethos-u-core-driver or the Zephyr "
                f"module zephyrproject-rtos/hal_ethos_u) --source {CMSIS}=PATH@REV (CMSIS_6)")
    return None


requires_ethos_u_sources = pytest.mark.skipif(_ethos_u_sources_reason() is not None,
                                              reason=_ethos_u_sources_reason() or "")
