"""Serve firmware's loop around a stand-in model (tests/serve_standin.c), compiled for the host,
and the host's side of what it computes: shared by the parser's, the session's and the serial
link's tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np

from deploykit.readers.boards import repo_root

CC = shutil.which("cc") or shutil.which("gcc")
# The stand-in model: input 0 float32 [1, 2, 3] in dim order [0, 2, 1], input 1 int8 [5];
# output 0 = input 0 * 2 (same layout), output 1 = sum(input 1) as int32 [1].
IN0_ORDER = [0, 2, 1]
F32, I8, I32 = 6, 1, 3


def build_standin(out: Path, *extra: str, name: str = "serve-standin") -> Path:
    """The stand-in, built with the firmware's dk_stream.c and dk_protocol.c (`extra`: more
    compiler arguments, e.g. -DSTANDIN_LINK=1 and the link's sources)."""
    fw = repo_root() / "firmware"
    exe = out / name
    cmd = [CC, "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-DDK_SERVE=1",
           f"-I{fw / 'protocol'}", f"-I{fw / 'boards'}", f"-I{fw / 'boards' / 'rp2350'}",
           str(repo_root() / "tests" / "serve_standin.c"), str(fw / "protocol" / "dk_stream.c"),
           str(fw / "protocol" / "dk_protocol.c"), *extra, "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return exe


def sample(k: int) -> tuple[np.ndarray, np.ndarray]:
    """Sample k's inputs (logical layout)."""
    in0 = (np.arange(6, dtype=np.float32).reshape(1, 2, 3) - 2.5) * (k + 1)
    in1 = (np.arange(5, dtype=np.int8) - 2) * np.int8(k + 1)
    return in0, in1


def expected(k: int) -> list[np.ndarray]:
    """What the stand-in answers for sample k (logical layout)."""
    in0, in1 = sample(k)
    return [in0 * 2, np.array([in1.astype(np.int32).sum()], dtype=np.int32)]
