"""`deploykit run` for real: export, runtime build, render, cross-compile, QEMU, parity.

Needs the ExecuTorch sources (`deploykit setup`); CI has no GitHub, so these skip there with
the reason, and developers run them with a workspace made through the source override.
"""

import json

import pytest

from deploykit import api
from deploykit.readers.boards import load_board
from tests.markers import requires_cmake, requires_qemu, requires_sources, requires_toolchain

pytestmark = [requires_toolchain, requires_cmake, requires_qemu, requires_sources]

CASES = [("qemu-an547", "tiny_cnn", "portable_fp32"),
         ("qemu-an547", "mlp_mnist", "cortex_m_int8"),
         ("qemu-an505", "tiny_cnn", "portable_fp32"),
         ("qemu-an505", "mlp_mnist", "cortex_m_int8")]


@pytest.mark.parametrize(("board", "model", "flow"), CASES)
def test_run_matches_host(tmp_path_factory, board, model, flow):
    out = tmp_path_factory.getbasetemp() / "e2e" / board / f"{model}-{flow}"
    report = api.run(board, model, flow=flow, out=out, timeout=120)
    assert report.passed, report.summary()
    assert report.verdict is not None and report.verdict.passed
    for o in report.verdict.outputs:
        assert o.max_abs_error <= o.tolerance.atol
        assert o.cosine_similarity > 0.999
    assert report.ticks and report.ticks > 0
    # The pools the plan linked in are not overrun: every peak is within its capacity.
    assert report.memory, "the firmware reports its memory peaks"
    for name, (used, capacity) in report.memory.items():
        assert 0 <= used <= capacity, name
    # The result file is the machine-readable twin of the report.
    saved = json.loads((out / "run" / "result.json").read_text())
    assert saved["passed"] is True and saved["board"] == board
    # The vector table sits where the board file places it.
    from elftools.elf.elffile import ELFFile

    with open(report.elf, "rb") as f:
        vectors = ELFFile(f).get_section_by_name(".vectors")
        assert vectors["sh_addr"] == load_board(board).region_for("vectors").origin


def test_several_inputs_in_one_run(tmp_path):
    import sys

    import numpy as np

    sys.path.insert(0, str(load_board("qemu-an505").path.parents[1] / "models"))
    import mlp_mnist

    samples = tmp_path / "samples"
    samples.mkdir()
    labels = {}
    for k, digit in enumerate("0147"):
        np.save(samples / f"s{k}.npy", mlp_mnist.draw_digit(digit).numpy())
        labels[f"s{k}"] = int(digit)
    (samples / "labels.json").write_text(json.dumps(labels))
    report = api.run("qemu-an505", "mlp_mnist", flow="cortex_m_int8", out=tmp_path / "out",
                     inputs=samples)
    assert report.passed, report.summary()
    assert report.input_sets.count == 4 and report.input_sets.labelled == 4
    assert report.input_sets.top1_agreement == 1.0
    assert report.verdict.outputs[0].shape == (4, 1, 10)


def test_build_and_run_resolve_the_target_once(tmp_path_factory):
    """One build and one run each resolve the board's family, the flow, the profile, the NPU
    section and the runner exactly once (pipeline/target.py); the stages ask the Target."""
    from tests.unit.test_layout import ONCE_EACH, counted_resolvers

    out = tmp_path_factory.getbasetemp() / "e2e" / "qemu-an547" / "tiny_cnn-portable_fp32"
    with counted_resolvers() as calls:
        api.build("qemu-an547", "tiny_cnn", flow="portable_fp32", out=out, fit=True)
    assert dict(calls) == ONCE_EACH
    with counted_resolvers() as calls:
        report = api.run("qemu-an547", "tiny_cnn", flow="portable_fp32", out=out, timeout=120)
    assert dict(calls) == ONCE_EACH and report.passed, report.summary()
