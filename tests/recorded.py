"""The recorded runs of tests/data/: event streams from profiling firmware on QEMU, committed
with the very programs (and the input) they were recorded from, so that tests read them
without exporting anything. An int8 export's bytes depend on the host's CPU (its float
calibration runs through torch's CPU kernels), so a re-export on another machine need not be
the program a stream was recorded from. tests/data/README.md says how they were recorded."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent / "data"

# mlp_mnist, cortex_m_int8, size profile, cortex-m33 (qemu-an505).
MLP_PTE = DATA / "mlp_mnist-cortex_m_int8-qemu-an505.pte"
MLP_INPUT = DATA / "mlp_mnist-cortex_m_int8-qemu-an505-input.npy"  # its first input set
MLP_PROFILE_STREAM = DATA / "profile-mlp_mnist-cortex_m_int8-qemu-an505.bin"
MLP_DEBUG_STREAM = DATA / "debug-mlp_mnist-cortex_m_int8-qemu-an505.bin"
# tiny_cnn, portable_fp32, size profile, cortex-m55 (qemu-an547).
TINY_CNN_PTE = DATA / "tiny_cnn-portable_fp32-qemu-an547.pte"
TINY_CNN_PROFILE_STREAM = DATA / "profile-tiny_cnn-portable_fp32-qemu-an547.bin"


def short_sha(data: bytes) -> str:
    """SHA-256's first 16 hex digits, as the firmware's hello record carries them."""
    return hashlib.sha256(data).hexdigest()[:16]


def lay_out_export(out: Path, pte: Path = MLP_PTE) -> Path:
    """`<out>/export/model.pte`, the recorded program where `deploykit profile` and `run
    --debug-intermediates` leave the export. Returns `out`."""
    (out / "export").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(pte, out / "export" / "model.pte")
    return out


def first_input() -> list[np.ndarray]:
    """mlp_mnist's first input set, as the recorded runs fed the device."""
    return [np.load(MLP_INPUT)]
