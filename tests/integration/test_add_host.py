"""deploykit's int8 elementwise add (firmware/kernels/cmsis_nn_add.c, dk_elementwise_add_s8)
against CMSIS-NN's own arm_elementwise_add_s8, both compiled with the host's C compiler: the same
bytes for every input.

On the host neither MVE nor DSP is defined, so both take their scalar paths: CMSIS-NN's scalar
add (which its DSP path equals at ExecuTorch's left shift of 20) and deploykit's rescale tables.
The parameters are the ones ExecuTorch's cortex_m pass computes for an add (twice the larger
input scale, a left shift of 20), over input and output scales a decade apart each way, zero
points at both ends of int8, with and without a ReLU; the inputs are random over the whole int8
range. Calls of 1,024 elements or more take the tables, shorter ones and other left shifts
CMSIS-NN's add; both kinds are here.

Needs CMSIS-NN's sources from the workspace (`deploykit setup`); a few seconds.
"""

from __future__ import annotations

import itertools
import subprocess

import numpy as np
import pytest

from tests.integration.host_kernels import NEEDS_CC, build_pair
from tests.markers import requires_sources

pytestmark = [
    requires_sources,
    NEEDS_CC,
    pytest.mark.timeout(300),  # one compile and a few hundred calls: seconds
]

TABLE_MIN_ELEMENTS = 1024  # DK_ADD_TABLE_MIN_ELEMENTS in cmsis_nn_add.c
SCALES = [0.004, 0.02, 0.1, 0.5]
ZERO_POINTS = [-128, -3, 127]
BLOCK_SIZES = [17, TABLE_MIN_ELEMENTS - 1, TABLE_MIN_ELEMENTS, 3001]

# Reads calls (15 int32 parameters, then the two int8 inputs) and writes, for each, CMSIS-NN's
# output and then deploykit's.
DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>

#include "arm_nnfunctions.h"
#include "cmsis_nn_add.h"

#if defined(ARM_MATH_MVEI) || defined(ARM_MATH_DSP)
#error "the host build must take CMSIS-NN's scalar add"
#endif

int main(int argc, char **argv) {
  if (argc != 3) return 2;
  FILE *in = fopen(argv[1], "rb"), *out = fopen(argv[2], "wb");
  if (!in || !out) return 2;
  int32_t p[15];
  while (fread(p, sizeof(p), 1, in) == 1) {
    const size_t n = (size_t)p[14];
    int8_t *a = malloc(n), *b = malloc(n), *cmsis = malloc(n), *dk = malloc(n);
    if (!a || !b || !cmsis || !dk || fread(a, 1, n, in) != n || fread(b, 1, n, in) != n) return 2;
    if (arm_elementwise_add_s8(a, b, p[0], p[1], p[2], p[3], p[4], p[5], p[6], cmsis, p[7], p[8],
                               p[9], p[10], p[11], p[14]) != ARM_CMSIS_NN_SUCCESS ||
        dk_elementwise_add_s8(a, b, p[0], p[1], p[2], p[3], p[4], p[5], p[6], dk, p[7], p[8],
                              p[9], p[10], p[11], p[14]) != ARM_CMSIS_NN_SUCCESS) {
      return 3;
    }
    if (fwrite(cmsis, 1, n, out) != n || fwrite(dk, 1, n, out) != n) return 2;
    free(a);
    free(b);
    free(cmsis);
    free(dk);
  }
  return fclose(out) == 0 ? 0 : 2;
}
"""


def _add_params(scale_1: float, scale_2: float, scale_out: float) -> list[int]:
    """Multipliers and shifts as ExecuTorch's cortex_m pass computes them for an add."""
    from executorch.backends.cortex_m.passes.passes_utils import quantize_multiplier_aot

    twice_max = 2 * max(scale_1, scale_2)
    m1, s1 = quantize_multiplier_aot(scale_1 / twice_max)
    m2, s2 = quantize_multiplier_aot(scale_2 / twice_max)
    mo, so = quantize_multiplier_aot(twice_max / (scale_out * (1 << 20)))
    return [int(m1), int(s1), int(m2), int(s2), int(mo), int(so)]


def _calls(rng: np.random.Generator):
    for scale_1, scale_2, scale_out in itertools.product(SCALES, SCALES, [0.01, 0.2]):
        m1, s1, m2, s2, mo, so = _add_params(scale_1, scale_2, scale_out)
        for zp_1, zp_2, zp_out in zip(rng.permutation(ZERO_POINTS), ZERO_POINTS,
                                      rng.permutation(ZERO_POINTS), strict=True):
            relu = bool(rng.integers(0, 2))
            size = int(rng.choice(BLOCK_SIZES))
            left_shift = 20 if rng.random() < 0.9 else 10
            params = [-zp_1, m1, s1, -zp_2, m2, s2, left_shift, zp_out, mo, so,
                      zp_out if relu else -128, 127, 0, 0, size]
            a = rng.integers(-128, 128, size).astype(np.int8)
            b = rng.integers(-128, 128, size).astype(np.int8)
            yield (scale_1, scale_2, scale_out), params, a, b


def test_dk_add_gives_cmsis_nn_results_bit_for_bit(tmp_path):
    exe = build_pair(tmp_path, DRIVER, "cmsis_nn_add.c",
                     ["BasicMathFunctions/arm_elementwise_add_s8.c"])
    rng = np.random.default_rng(20261202)
    calls = list(_calls(rng))
    with (tmp_path / "calls.bin").open("wb") as f:
        for _, params, a, b in calls:
            f.write(np.array(params, dtype="<i4").tobytes() + a.tobytes() + b.tobytes())
    subprocess.run([str(exe), str(tmp_path / "calls.bin"), str(tmp_path / "outputs.bin")],
                   check=True, timeout=120)
    outputs = np.fromfile(tmp_path / "outputs.bin", dtype=np.int8)

    offset = tables = 0
    for (scale_1, scale_2, scale_out), params, a, b in calls:
        n = params[-1]
        cmsis = outputs[offset:offset + n]
        dk = outputs[offset + n:offset + 2 * n]
        offset += 2 * n
        np.testing.assert_array_equal(dk, cmsis, err_msg=f"parameters {params}")
        tables += n >= TABLE_MIN_ELEMENTS and params[6] == 20
        if params[6] != 20:
            continue
        # The reference is an add, not two equal wrong answers: within one output step of the
        # float sum of the dequantized inputs.
        off_1, off_2, zp_out, act_min = params[0], params[3], params[7], params[10]
        real = scale_1 * (a.astype(np.float64) + off_1) + scale_2 * (b.astype(np.float64) + off_2)
        q = np.clip(np.round(real / scale_out) + zp_out, act_min, 127)
        assert np.abs(cmsis.astype(np.int64) - q).max() <= 1, params
    assert offset == outputs.size
    assert 20 < tables < len(calls)  # both paths were taken
