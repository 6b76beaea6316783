"""The run report's statistics and its JSON, on the cases that went wrong before."""

from __future__ import annotations

import json

import numpy as np
import pytest

from deploykit import api
from deploykit.run.report import set_statistics
from deploykit.run.validate import Tolerance, compare_sets
from deploykit.util.errors import ConfigError
from deploykit.util.jsonable import to_jsonable


def _logits(cls: int) -> np.ndarray:
    out = np.zeros((1, 4), dtype=np.float32)
    out[0, cls] = 1.0
    return out


def test_a_missing_set_does_not_shift_the_labels(tmp_path):
    labels = [0, 1, 2]
    host = [[_logits(c)] for c in labels]
    device = [[_logits(0)], [None], [_logits(2)]]  # set 1's output never arrived
    (tmp_path / "labels.json").write_text(json.dumps({"names": ["a", "b", "c"],
                                                      "labels": labels}))
    stats = set_statistics(device, host, tmp_path / "labels.json")
    assert stats.count == 3 and stats.labelled == 2
    assert stats.top1_agreement == 1.0
    assert stats.accuracy_device == 1.0 and stats.accuracy_host == 1.0


def test_json_of_a_missing_output_is_valid_json():
    host = [[_logits(1)]]
    verdict = compare_sets([[None]], host, Tolerance(atol=0.1))
    assert verdict.outputs[0].max_abs_error == float("inf")
    payload = {"verdict": verdict, "values": np.array([np.inf, -np.inf, np.nan, 1.5]),
               "scalar": np.float32("inf")}
    text = json.dumps(to_jsonable(payload), allow_nan=False)  # raises on Infinity/NaN
    decoded = json.loads(text)
    assert decoded["verdict"]["outputs"][0]["max_abs_error"] is None
    assert decoded["values"] == [None, None, None, 1.5] and decoded["scalar"] is None


@pytest.mark.parametrize("body", ["def example_inputs():\n    return ()\n",
                                  "raise RuntimeError('broken at import')\n"],
                         ids=["no-model-function", "raises-at-import"])
def test_a_model_file_that_cannot_load_leaves_nothing(tmp_path, body):
    model = tmp_path / "bad_model.py"
    model.write_text(body)
    out = tmp_path / "out"
    with pytest.raises(ConfigError):
        api.export("qemu-an547", str(model), out=out)
    assert not (out / "export").exists()


def test_a_first_run_ends_in_one_line_on_exact_memory():
    """Estimated pools above their peaks: one line says how to get exact memory (--fit); the
    pool by pool detail is for --verbose and the JSON (issue #27)."""
    from deploykit.memory.fit import check_peaks
    from deploykit.run.report import RunReport, memory_advice, report_json
    from deploykit.util.errors import ExitCode

    memory = {"temp_pool": (149, 224), "stack": (2_052, 32_768), "heap": (0, 16_384),
              "method_pool": (2_596, 2_832), "planned_pool": (16_384, 16_384)}
    failures, oversized = check_peaks(memory)
    assert failures == [] and len(oversized) == 3
    report = RunReport(board="qemu-an547", model="model", flow="portable_fp32", passed=True,
                       exit_code=ExitCode.OK, verdict=None, reference_kind="pybindings",
                       memory=memory, oversized_pools=oversized,
                       memory_advice=memory_advice(memory, oversized))
    lines = report.summary().splitlines()
    assert lines[-1] == ("  memory: 21,181 B used of 68,592 B linked; `deploykit run --fit` "
                         "measures the model once and links its pools, stack and heap exact "
                         "(detail: --verbose or --json)")
    assert not any("warning" in line for line in lines)
    verbose = report.summary(verbose=True)
    assert "stack is 32,768 B, its peak 2,052 B (16.0x)" in verbose
    assert "heap is 16,384 B, its peak 0 B (unused)" in verbose
    assert report_json(report)["oversized_pools"] == oversized
    fitted = RunReport(board="qemu-an547", model="model", flow="portable_fp32", passed=True,
                       exit_code=ExitCode.OK, verdict=None, reference_kind="pybindings",
                       memory={"stack": (2_052, 2_560)})
    assert "memory:" not in fitted.summary()
