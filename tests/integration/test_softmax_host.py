"""deploykit's int8 softmax (firmware/kernels/cmsis_nn_softmax.c, dk_arm_softmax_s8) against
CMSIS-NN's own arm_softmax_s8, both compiled with the host's C compiler: the same bytes for
every input.

On the host neither MVE nor DSP is defined, so arm_softmax_s8 runs the scalar
arm_nn_softmax_common_s8: the path GCC 12.2 builds for both Cortex-M boards (ARM_GCC_12_2_ICE),
and the one dk_arm_softmax_s8 must equal. The parameters are the ones ExecuTorch's cortex_m pass
computes for a softmax's input scale (_compute_softmax_params), over input scales from 2^-10
(every difference in [-255, 0] used) to 8 (diff_min = -1); the inputs are random over the whole
int8 range, narrow, all equal, or one peak with the rest below diff_min, in calls of several
rows with different maxima (the exp table is shared by the rows of a call).

Needs CMSIS-NN's sources from the workspace (`deploykit setup`); a few seconds.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from tests.integration.host_kernels import NEEDS_CC, build_pair
from tests.markers import requires_sources

pytestmark = [
    requires_sources,
    NEEDS_CC,
    pytest.mark.timeout(300),  # one compile and a few thousand calls: seconds
]

ROW_SIZES = [1, 3, 16, 17, 100, 300]
INPUT_SCALES = [2.0**-10, 0.004, 0.01, 0.03, 1 / 16, 0.1, 0.2, 0.35, 0.5, 1.0, 2.0, 4.0, 8.0]
KINDS = ["uniform", "narrow", "equal", "peak_over_cut", "mixed_rows"]

# Reads calls (num_rows, row_size, mult, shift, diff_min as int32, then the int8 input) and
# writes, for each, CMSIS-NN's output and then deploykit's.
DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>

#include "arm_nnfunctions.h"
#include "cmsis_nn_softmax.h"

#if defined(ARM_MATH_MVEI) || defined(ARM_MATH_DSP)
#error "the host build must take CMSIS-NN's scalar softmax"
#endif

int main(int argc, char **argv) {
  if (argc != 3) return 2;
  FILE *in = fopen(argv[1], "rb"), *out = fopen(argv[2], "wb");
  if (!in || !out) return 2;
  int32_t call[5];
  while (fread(call, sizeof(call), 1, in) == 1) {
    const size_t n = (size_t)call[0] * (size_t)call[1];
    int8_t *input = malloc(n), *cmsis = malloc(n), *dk = malloc(n);
    if (!input || !cmsis || !dk || fread(input, 1, n, in) != n) return 2;
    arm_softmax_s8(input, call[0], call[1], call[2], call[3], call[4], cmsis);
    dk_arm_softmax_s8(input, call[0], call[1], call[2], call[3], call[4], dk);
    if (fwrite(cmsis, 1, n, out) != n || fwrite(dk, 1, n, out) != n) return 2;
    free(input);
    free(cmsis);
    free(dk);
  }
  return fclose(out) == 0 ? 0 : 2;
}
"""


def _softmax_params(scale: float) -> tuple[int, int, int]:
    from executorch.backends.cortex_m.passes.aten_to_cortex_m_pass import (
        _compute_softmax_params,
    )

    return _compute_softmax_params(scale)


def _rows(kind: str, rows: int, size: int, diff_min: int, rng: np.random.Generator):
    if kind == "uniform":
        return rng.integers(-128, 128, (rows, size))
    if kind == "narrow":
        base = rng.integers(-128, 120, (rows, 1))
        return base + rng.integers(0, 8, (rows, size))
    if kind == "equal":
        return np.repeat(rng.integers(-128, 128, (rows, 1)), size, axis=1)
    if kind == "peak_over_cut":
        # One element at the top, the others below it by more than -diff_min where int8 allows.
        peak = 127
        low = max(-128, peak + diff_min - 1)
        x = rng.integers(-128, low + 1, (rows, size))
        x[np.arange(rows), rng.integers(0, size, rows)] = peak
        return x
    # Rows of different maxima and spreads in one call.
    x = np.empty((rows, size), dtype=np.int64)
    for r in range(rows):
        lo = int(rng.integers(-128, 128))
        hi = int(rng.integers(lo, 128))
        x[r] = rng.integers(lo, hi + 1, size)
    return x


def _calls(rng: np.random.Generator):
    for scale in INPUT_SCALES:
        mult, shift, diff_min = _softmax_params(scale)
        for size in ROW_SIZES:
            for kind in KINDS:
                for _ in range(3):
                    rows = int(rng.integers(1, 7))
                    x = _rows(kind, rows, size, diff_min, rng).astype(np.int8)
                    yield scale, (rows, size, mult, shift, diff_min), x


def test_dk_softmax_gives_cmsis_nn_scalar_results_bit_for_bit(tmp_path):
    exe = build_pair(tmp_path, DRIVER, "cmsis_nn_softmax.c",
                     ["SoftmaxFunctions/arm_softmax_s8.c",
                      "SoftmaxFunctions/arm_nn_softmax_common_s8.c"])
    rng = np.random.default_rng(20240611)
    calls = list(_calls(rng))
    with (tmp_path / "calls.bin").open("wb") as f:
        for _, header, x in calls:
            f.write(np.array(header, dtype="<i4").tobytes() + x.tobytes())
    subprocess.run([str(exe), str(tmp_path / "calls.bin"), str(tmp_path / "outputs.bin")],
                   check=True, timeout=120)
    outputs = np.fromfile(tmp_path / "outputs.bin", dtype=np.int8)

    offset = below_cut = equal_rows = 0
    for scale, (rows, size, mult, shift, diff_min), x in calls:
        n = rows * size
        cmsis = outputs[offset:offset + n].reshape(rows, size)
        dk = outputs[offset + n:offset + 2 * n].reshape(rows, size)
        offset += 2 * n
        where = (f"input scale {scale} (mult {mult}, shift {shift}, diff_min {diff_min}), "
                 f"{rows} rows of {size}")
        np.testing.assert_array_equal(dk, cmsis, err_msg=where)

        # The reference is a softmax, not two equal wrong answers: within two output steps
        # (1/256, zero point -128) of the float softmax of the dequantized input.
        diff = x.astype(np.int64) - x.max(axis=1, keepdims=True)
        p = np.exp(scale * diff.astype(np.float64))
        p /= p.sum(axis=1, keepdims=True)
        q = np.clip(np.round(p * 256) - 128, -128, 127)
        used = diff >= diff_min  # below diff_min CMSIS-NN gives -128 outright
        assert np.all(cmsis[~used] == -128), where
        assert np.abs(cmsis[used] - q[used]).max() <= 2, where
        below_cut += int((~used).sum())
        equal_rows += int((x == x[:, :1]).all(axis=1).sum())
    assert offset == outputs.size
    assert below_cut > 1000 and equal_rows > 100  # the cases this test is for did occur
