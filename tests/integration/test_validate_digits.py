"""`deploykit validate` on the host, for real: digits_cnn over the whole digits:test split (450
images) through the cortex_m_int8 flow: fp32 in PyTorch, and the int8 host program (the
lowered graph through the cortex_m ops' integer reference, what `run` compares the device
with) calibrated on the training split and on the example image alone. Then a device given as
a callable, as run/stream.py's session will be: one that answers as the host program does,
one that answers one sample wrong, one that stops answering mid-set; and the command line.

Needs only the executorch wheel (no sources, no QEMU): about a minute on two cores, most of
it the two exports, which the later cases reuse (the export stage's cache)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from deploykit import api
from deploykit.cli import main
from deploykit.pipeline.validation import Device
from deploykit.program.export import load_export
from deploykit.run.accuracy import DEVICE, FP32
from deploykit.util.errors import ConfigError, ExitCode, RunError
from tests.markers import requires_cmake, requires_qemu, requires_sources, requires_toolchain

BOARD, MODEL, FLOW = "qemu-an547", "digits_cnn", "cortex_m_int8"
SAMPLES = 450


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Iterator[Path]:
    """The out directory every case shares, and a user cache of the module's own (the
    model trains into it once, about 3 s)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        mp.delenv("DEPLOYKIT_DIGITS_CNN_CHECKPOINT", raising=False)
        yield tmp_path_factory.mktemp("validate") / MODEL


@pytest.fixture(scope="module")
def host_only(out):
    return api.validate(BOARD, MODEL, flow=FLOW, out=out, project=False)


def host_program(out: Path, calibration: str = "model"):
    exported = load_export(out / "validate" / f"calibration-{calibration}" / "export")
    assert exported is not None
    return exported


def test_int8_on_the_host_is_within_a_point_of_fp32(host_only, out):
    r = host_only
    assert r.passed, r.summary()
    assert (r.samples, r.classes, r.dataset, r.device) == (SAMPLES, 10, "digits:test", None)
    fp32, model, example = r.columns
    assert (fp32.key, model.key, example.key) == (FP32, "host:model", "host:example")
    assert fp32.accuracy > 0.95 and fp32.scored == fp32.labelled == SAMPLES
    # the goal: int8 within 1 point of fp32 on digits:test
    assert abs(model.accuracy - fp32.accuracy) <= 0.01
    assert model.error_vs_fp32.cosine_mean > 0.99
    # calibrating on the training split fits the int8 ranges better than the example alone
    assert model.error_vs_fp32.rmse < example.error_vs_fp32.rmse
    assert r.calibrations == {"model": "calibration_inputs(): 96 samples",
                              "example": "example_inputs(): 1 sample"}
    reports = {c: json.loads(host_program(out, c).report_path.read_text())
               for c in ("model", "example")}
    assert reports["model"]["calibration_samples"] == 96
    assert reports["example"]["calibration_samples"] == 1
    assert reports["example"]["options"]["calibration"] == "example"
    # the host program's output on each sample is the reference of its export: sample 0 is
    # the example input (the first test image), whose reference the export computed itself
    program = host_program(out)
    assert len(program.reference_sets) == SAMPLES
    assert np.array_equal(program.reference_sets[0][0], program.host_outputs[0])
    assert program.op_list == ["cortex_m::dequantize_per_tensor.out",
                               "cortex_m::quantize_per_tensor.out",
                               "cortex_m::quantized_conv2d.out"]
    saved = json.loads((out / "validate" / "validation.json").read_text())
    assert saved["passed"] is True and saved["columns"][1]["correct"] == model.correct
    assert (out / "validate" / "confusion.svg").read_text().startswith("<?xml")
    assert "device: not run" in r.summary()


def answering(out: Path, wrong: int | None = None, stop_at: int | None = None) -> Device:
    """A device that answers each sample with the host program's outputs for it (found by
    the sample's bytes, not by the order of the calls); `wrong`: that sample's class moved
    elsewhere; `stop_at`: from that sample on it answers nothing (a timeout)."""
    program = host_program(out)
    by_input = {b"".join(a.tobytes() for a in inputs): outputs for inputs, outputs
                in zip(program.input_sets, program.reference_sets, strict=True)}
    answered = []

    def device(inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        k = len(answered)
        if stop_at is not None and k >= stop_at:
            raise RunError("no result record within 10 s", exit_code=ExitCode.TIMEOUT)
        outputs = [o.copy() for o in by_input[b"".join(a.tobytes() for a in inputs)]]
        if k == wrong:
            outputs[0] = np.roll(outputs[0], 1, axis=-1)
        answered.append(k)
        return outputs

    return device


def test_a_device_that_answers_as_the_host_program_passes(host_only, out):
    r = api.validate(BOARD, MODEL, flow=FLOW, out=out, project=False, device=answering(out))
    assert r.passed, r.summary()
    device = r.column(DEVICE)
    assert device.scored == SAMPLES and device.predictions == r.host.predictions
    assert r.device.agreement.rate == 1.0 and r.device.beyond_tolerance == ()
    assert r.device.stopped_at is None and r.device.max_abs_vs_host == 0.0


def test_a_device_wrong_on_one_sample_is_named(host_only, out):
    r = api.validate(BOARD, MODEL, flow=FLOW, out=out, project=False,
                     device=answering(out, wrong=17))
    assert not r.passed and r.exit_code == ExitCode.MISMATCH
    assert r.device.beyond_tolerance == (17,) and r.device.agreement.disagreements == (17,)
    assert "disagrees at samples: 17" in r.summary()


def test_a_device_that_stops_mid_set_fails_with_what_it_scored(host_only, out):
    r = api.validate(BOARD, MODEL, flow=FLOW, out=out, project=False,
                     device=answering(out, stop_at=40))
    assert not r.passed and r.exit_code == ExitCode.TIMEOUT
    assert r.device.stopped_at == 40 and r.column(DEVICE).scored == 40
    assert r.device.agreement.compared == 40
    saved = json.loads((out / "validate" / "validation.json").read_text())
    assert saved["passed"] is False and saved["device"]["stopped_at"] == 40
    assert "stopped answering at sample 40 of 450 (no result record within 10 s)" in r.cause


def test_the_command_line(host_only, out, capsys):
    args = ["validate", "--board", BOARD, "--model", MODEL, "--flow", FLOW, "--out", str(out),
            "--no-project", "-q"]
    assert main([*args, "--host-only", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] is True and data["columns"][1]["accuracy"] == host_only.host.accuracy
    # a data set that does not fit the model is refused before any export
    assert main([*args, "--host-only", "--dataset", "digits:valid"]) == ExitCode.CONFIG
    assert "Its splits: train, test" in capsys.readouterr().err


def test_a_flow_without_a_per_sample_host_program_is_refused(out, tmp_path):
    """Ethos-U: the delegates run only on the NPU, so there is no host program to score a data
    set against; validate says so and names the flows that have one."""
    with pytest.raises(ConfigError) as err:
        api.validate("corstone-320", MODEL, flow="ethos_u_int8", out=tmp_path / "npu", limit=2,
                     project=False)
    assert "sample by sample" in str(err.value)
    assert "cortex_m_int8" in err.value.hint


@requires_toolchain
@requires_cmake
@requires_qemu
@requires_sources
@pytest.mark.parametrize("board", ["qemu-an547", "qemu-an505"])
def test_the_board_itself_scores_what_its_host_program_scores(host_only, out, board, capsys):
    """The issue's goal on the device: serve firmware on QEMU, the test split streamed sample by
    sample over the console, every device answer equal to the host program's (agreement 100%,
    no output beyond the tolerance) and int8 within a point of fp32: the command line, as a
    user runs it."""
    where = out.parent / f"on-{board}"
    args = ["validate", "--board", board, "--model", MODEL, "--flow", FLOW, "--out", str(where),
            "--no-project", "-q", "--json"]
    assert main(args) == 0, capsys.readouterr().err
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] is True and data["device"]["stopped_at"] is None
    assert data["device"]["agreement"]["rate"] == 1.0
    assert data["device"]["agreement"]["compared"] == SAMPLES
    assert data["device"]["beyond_tolerance"] == []
    device = next(c for c in data["columns"] if c["key"] == DEVICE)
    fp32 = data["columns"][0]
    assert device["scored"] == SAMPLES and abs(device["accuracy"] - fp32["accuracy"]) <= 0.01


@requires_toolchain
@requires_cmake
@requires_qemu
@requires_sources
def test_the_device_runs_the_program_of_the_chosen_calibration(host_only, out):
    """--calibration example: the serve firmware is built from the example-calibrated program
    (device_session checks the hash the device's hello reports against the host program's), so
    the device scores what that program scores, not the default program."""
    r = api.validate(BOARD, MODEL, flow=FLOW, out=out.parent / "example-on-board",
                     project=False, on_board=True, calibration="example", limit=60)
    assert r.passed, r.summary()
    assert r.device_calibration == "example"
    assert r.column(DEVICE).predictions == r.column("host:example").predictions
    assert r.device.agreement.rate == 1.0 and r.device.max_abs_vs_host == 0.0
