"""deploykit's own kernels (firmware/kernels) against PyTorch, on the simulated Cortex-M55.

ExecuTorch v1.4.1's portable library has no avg_pool3d.out, which the CPU part of an Ethos-U
model with a LocalResponseNorm needs (models/mobilenet_v2_lrn.py). The host ExecuTorch runtime
lacks it too, so no deploykit export flow can make a reference for it; this test exports a small
program with plain ExecuTorch, builds the runner for qemu-an547 through the same render and
build steps deploykit uses, and compares the device's outputs with torch's avg_pool3d: they
match bit for bit.
"""

from __future__ import annotations

import subprocess
import sys

import executorch  # noqa: F401  (a hard dependency: a broken install fails here)
import numpy as np
import torch

from deploykit.build.render import ModelSources, render_board_files, render_model_files
from deploykit.families import family_of
from deploykit.memory.plan import plan_memory
from deploykit.pipeline.profiles import resolve_profile
from deploykit.program.inspect import inspect_pte
from deploykit.readers.boards import load_board
from deploykit.readers.sources import load_workspace
from tests.markers import requires_cmake, requires_qemu, requires_sources, requires_toolchain

# (kernel, stride, padding, ceil_mode, count_include_pad, divisor_override): torch's defaults,
# the LRN's channel window, ceil_mode's clipped last window, padding excluded, an override.
POOLS = [
    ((2, 2, 2), None, 0, False, True, None),
    ((5, 1, 1), (1, 1, 1), (2, 0, 0), False, True, None),
    ((3, 2, 2), (1, 2, 1), (1, 1, 0), True, False, None),
    ((2, 3, 3), (2, 2, 2), (1, 1, 1), True, True, 5),
]


class Pools(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pools = torch.nn.ModuleList(
            torch.nn.AvgPool3d(k, stride=s, padding=p, ceil_mode=c, count_include_pad=i,
                               divisor_override=d) for k, s, p, c, i, d in POOLS)

    def forward(self, x):
        return tuple(pool(x) for pool in self.pools)


@requires_toolchain
@requires_cmake
@requires_qemu
@requires_sources
def test_avg_pool3d_matches_torch_on_the_device(tmp_path):
    from executorch.exir import to_edge

    from deploykit.run.runners import runner_for_board

    x = torch.randn(1, 2, 7, 9, 6, generator=torch.Generator().manual_seed(3))
    module = Pools().eval()
    expected = [t.numpy() for t in module(x)]
    program = to_edge(torch.export.export(module, (x,))).to_executorch()
    pte = tmp_path / "model.pte"
    pte.write_bytes(program.buffer)
    ops = tmp_path / "ops.yaml"
    subprocess.run([sys.executable, "-m", "executorch.codegen.tools.gen_oplist",
                    f"--model_file_path={pte}", f"--output_path={ops}"], check=True,
                   capture_output=True)
    assert "aten::avg_pool3d.out" in ops.read_text()

    board = load_board("qemu-an547")
    profile = resolve_profile(board)
    ws = load_workspace()
    plan = plan_memory(board, inspect_pte(pte))
    generated = tmp_path / "generated"
    render_board_files(board, generated, plan=plan)
    render_model_files(ModelSources(pte.read_bytes(), [[x.numpy()]], expected, plan,
                                    ws.executorch_commit, "flow=test"), generated)
    defs = {"EXECUTORCH_SOURCE_DIR": str(ws.executorch_dir),
            "DK_CMSIS_NN_DIR": str(ws.path_of("cmsis-nn")), "DK_OPS_YAML": str(ops),
            "DK_ET_RUNTIME_CACHE_DIR": str(ws.root / "runtime-cache"),
            "DK_ET_COMMIT": ws.executorch_commit, **profile.cmake_definitions(family_of(board))}
    fw = family_of(board).build_image(board, generated, tmp_path / "fw", "runner", defs)
    assert fw.sizes.flash_by_component  # linked, with deploykit's kernel library

    result = runner_for_board(board).run(fw.elf, tmp_path, timeout_s=60, check=False)
    assert result.outcome().ok, result.outcome().cause
    for i, want in enumerate(expected):
        got = result.records.tensors[i].data
        assert got.shape == want.shape, i
        np.testing.assert_array_equal(got, want, err_msg=f"pool {i}")  # bit for bit
