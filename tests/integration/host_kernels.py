"""deploykit's firmware kernels and CMSIS-NN's functions built side by side with the host's C
compiler, for the tests that compare the two byte for byte (test_softmax_host.py,
test_add_host.py). On the host neither MVE nor DSP is defined, so CMSIS-NN takes its scalar
paths."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from deploykit.readers.sources import load_workspace

REPO = Path(__file__).resolve().parents[2]
CC = shutil.which("cc") or shutil.which("gcc")
NEEDS_CC = pytest.mark.skipif(CC is None,
                              reason="no host C compiler (cc or gcc) to build the kernels")


def cmsis_nn_dir() -> Path:
    ws = load_workspace()
    if not ws.has("cmsis-nn"):
        pytest.skip("the workspace has no CMSIS-NN sources (cmsis-nn): run `deploykit setup`")
    return ws.path_of("cmsis-nn")


def build_pair(tmp_path: Path, driver: str, kernel: str, library: list[str]) -> Path:
    """An executable of `driver` (C source) linked with firmware/kernels/`kernel` and the
    CMSIS-NN sources `library` (paths under its Source/)."""
    cmsis_nn = cmsis_nn_dir()
    source = tmp_path / "driver.c"
    source.write_text(driver)
    exe = tmp_path / "pair"
    includes = [f"-I{cmsis_nn / 'Include'}", f"-I{REPO / 'firmware' / 'kernels'}"]
    # deploykit's kernel with the firmware's warnings as errors; CMSIS-NN as it comes.
    subprocess.run([CC, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", *includes, "-c",
                    str(REPO / "firmware" / "kernels" / kernel), "-o", str(tmp_path / "dk.o")],
                   check=True, capture_output=True, text=True, timeout=120)
    subprocess.run([CC, "-std=c11", "-O2", *includes, str(source),
                    *(str(cmsis_nn / "Source" / name) for name in library),
                    str(tmp_path / "dk.o"), "-o", str(exe)], check=True, capture_output=True,
                   text=True, timeout=120)
    return exe
