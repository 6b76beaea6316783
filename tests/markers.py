"""Skip markers for components a machine may lack, each with the precise reason."""

from __future__ import annotations

import shutil

import pytest

from deploykit.errors import DeployKitError
from deploykit.sources import load_workspace

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
