"""validate's metrics on synthetic arrays (run/accuracy.py): top-1, confusion, agreement and
where it fails, the logits' error against fp32 against numpy's formulas; the verdict (a device
that stops mid-set never passes); validation.json and the confusion chart."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deploykit.run.accuracy import (
    CHART_NAME,
    DEVICE,
    FP32,
    REPORT_NAME,
    SCHEMA_VERSION,
    agreement,
    confusion_chart,
    confusion_matrix,
    cosine_rows,
    evaluate,
    logit_error,
    report_json,
    score,
    top1,
    write_report,
)
from deploykit.util import charts
from deploykit.util.errors import ExitCode

CLASSES = 4


def logits_for(predictions: list[int], classes: int = CLASSES, scale: float = 3.0
               ) -> np.ndarray:
    """Rows whose largest logit is at `predictions`, the rest seeded noise below it."""
    rng = np.random.default_rng(len(predictions))
    rows = rng.uniform(-1.0, 1.0, (len(predictions), classes))
    rows[np.arange(len(predictions)), predictions] = scale
    return rows


# ---- metrics --------------------------------------------------------------------------------

def test_top1_and_confusion_count_each_labelled_sample():
    labels = [0, 1, 2, 3, 1, None, 2]
    predicted = [0, 2, 2, 3, 1, 3, 0]
    assert top1(logits_for(predicted)).tolist() == predicted
    m = confusion_matrix(labels, predicted, CLASSES)
    assert m[1, 2] == 1 and m[2, 0] == 1 and m[2, 2] == 1 and m[1, 1] == 1
    assert m.sum() == 6  # the unlabelled sample is not counted
    assert np.trace(m) == 4


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=60))
def test_confusion_matches_numpy(pairs):
    labels, predicted = zip(*pairs, strict=True)
    expected = np.zeros((6, 6), dtype=np.int64)
    np.add.at(expected, (np.array(labels), np.array(predicted)), 1)
    assert np.array_equal(confusion_matrix(labels, predicted, 6), expected)


def test_agreement_names_where_two_ways_disagree():
    a = agreement([0, 1, 2, 3, 1], [0, 2, 2, 3, 0])
    assert (a.compared, a.agreed, a.disagreements) == (5, 3, (1, 4))
    assert a.rate == pytest.approx(0.6)
    assert agreement([], []).rate is None
    with pytest.raises(ValueError):
        agreement([0, 1], [0])


def test_logit_error_against_numpy_formulas():
    rng = np.random.default_rng(7)
    ref = rng.normal(size=(40, 10))
    got = ref + rng.normal(scale=0.1, size=ref.shape)
    e = logit_error(got, ref)
    diff = got - ref
    assert e.samples == 40
    assert e.mean_abs == pytest.approx(np.mean(np.abs(diff)))
    assert e.max_abs == pytest.approx(np.max(np.abs(diff)))
    assert e.rmse == pytest.approx(np.sqrt(np.mean(diff ** 2)))
    cos = [np.dot(g, r) / (np.linalg.norm(g) * np.linalg.norm(r))
           for g, r in zip(got, ref, strict=True)]
    assert e.cosine_mean == pytest.approx(np.mean(cos))
    assert e.cosine_min == pytest.approx(np.min(cos))
    assert logit_error(ref, ref).rmse == 0.0 and logit_error(ref, ref).cosine_min == \
        pytest.approx(1.0)


def test_cosine_of_zero_rows():
    zero, one = np.zeros((1, 3)), np.ones((1, 3))
    assert cosine_rows(zero, zero).tolist() == [1.0]
    assert cosine_rows(zero, one).tolist() == [0.0]
    assert cosine_rows(one, -one).tolist() == [pytest.approx(-1.0)]


def test_score_of_a_partial_column():
    labels = [0, 1, 2, 3]
    fp32 = logits_for([0, 1, 2, 3])
    column = score(DEVICE, "device", logits_for([0, 2]), labels, CLASSES, fp32)
    assert (column.scored, column.labelled, column.correct) == (2, 2, 1)
    assert column.accuracy == 0.5 and column.predictions == (0, 2)
    assert column.error_vs_fp32.samples == 2
    unlabelled = score(FP32, "fp32", fp32, [None] * 4, CLASSES)
    assert unlabelled.accuracy is None and unlabelled.confusion is None


# ---- the verdict ----------------------------------------------------------------------------

LABELS = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]


def report(device: list[int] | None = None, host: list[int] | None = None, **kw):
    fp32 = logits_for(LABELS)
    host_logits = logits_for(host or LABELS)
    return evaluate(
        board="qemu-an547", model="m", flow="cortex_m_int8", dataset="set:test",
        names=[f"s{i}" for i in range(len(LABELS))], labels=LABELS, classes=CLASSES,
        class_names=("a", "b", "c", "d"), fp32=fp32,
        host={"model": host_logits, "example": logits_for([0] * len(LABELS))},
        host_titles={"model": "int8 host, model", "example": "int8 host, example"},
        device_calibration="model",
        calibrations={"model": "calibration_inputs(): 8", "example": "example_inputs(): 1"},
        device=None if device is None else logits_for(device), tolerance={"atol": 0.5}, **kw)


def test_host_only_passes_within_the_accuracy_limit():
    r = report()
    assert r.passed and r.exit_code == 0 and r.device is None
    assert [c.key for c in r.columns] == ["fp32", "host:model", "host:example"]
    assert r.host.accuracy == 1.0 and r.column("host:example").accuracy == pytest.approx(0.3)
    assert "device: not run" in r.summary()


def test_an_int8_program_below_the_limit_fails():
    r = report(host=[0, 1, 2, 3, 0, 1, 2, 3, 0, 0])  # 90% against 100%
    assert not r.passed and r.exit_code == ExitCode.MISMATCH
    assert "10.00 points below fp32's 100.00%" in r.cause
    assert report(host=[0, 1, 2, 3, 0, 1, 2, 3, 0, 0], max_accuracy_drop=10.0).passed


def test_a_device_that_disagrees_is_named_sample_by_sample():
    device = [0, 1, 2, 3, 0, 2, 2, 3, 0, 1]
    r = report(device=device, beyond_tolerance=[5], max_abs_vs_host=4.0)
    assert r.device.agreement.disagreements == (5,) and r.device.agreement.agreed == 9
    assert not r.passed and r.exit_code == ExitCode.MISMATCH
    assert "beyond the tolerance on 1 sample(s)" in r.cause
    assert "disagrees at samples: 5" in r.summary()


def test_a_device_that_stops_mid_set_never_passes():
    """The scored samples are kept, where it stopped is said, and the run fails with the
    exit code of the error that stopped it."""
    r = report(device=LABELS[:4], device_error=("no answer in 10 s", int(ExitCode.TIMEOUT)))
    assert not r.passed and r.exit_code == ExitCode.TIMEOUT
    assert r.device.stopped_at == 4 and r.device.scored == 4
    device = r.column(DEVICE)
    assert device.scored == 4 and device.correct == 4 and device.accuracy == 1.0
    assert "stopped answering at sample 4 of 10 (no answer in 10 s)" in r.cause
    assert r.device.agreement.compared == 4
    # even one that stopped before the first sample
    r = report(device=[], device_error=("dead", int(ExitCode.NO_BOOT)))
    assert not r.passed and r.exit_code == ExitCode.NO_BOOT and r.column(DEVICE).scored == 0


# ---- the files ------------------------------------------------------------------------------

def test_validation_json_is_versioned_sorted_and_whole(tmp_path):
    r = report(device=LABELS, max_abs_vs_host=0.1)
    json_path, svg_path = write_report(r, tmp_path)
    assert (json_path.name, svg_path.name) == (REPORT_NAME, CHART_NAME)
    text = json_path.read_text()
    data = json.loads(text)
    assert data["schema_version"] == SCHEMA_VERSION and data["passed"] is True
    assert text == json.dumps(data, indent=2, sort_keys=True) + "\n"  # sorted keys
    assert [c["key"] for c in data["columns"]] == ["fp32", "host:model", "host:example",
                                                   "device"]
    assert data["columns"][3]["accuracy"] == 1.0 and data["device"]["agreement"]["rate"] == 1.0
    assert data["columns"][0]["error_vs_fp32"] is None
    assert data["names"][:2] == ["s0", "s1"] and data["labels"] == LABELS
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHART_NAME, REPORT_NAME]  # no temp
    # a report with a NaN (a device that answered nothing) is still valid JSON
    stopped = report(device=[], device_error=("dead", int(ExitCode.NO_BOOT)))
    assert json.loads(json.dumps(report_json(stopped), allow_nan=False))["device"]["scored"] == 0


def test_the_confusion_chart_holds_the_device_and_its_host_program():
    r = report(device=[0, 1, 2, 3, 0, 2, 2, 3, 0, 1])
    chart = confusion_chart(r)
    device, host = chart.panels
    assert isinstance(device, charts.Grid) and device.rows == ("a", "b", "c", "d")
    assert device.title == "device: top-1 90.00% (9/10)"
    assert device.counts[1] == (0, 2, 1, 0) and host.title.startswith("int8 host, model")
    assert charts.render(chart) == charts.render(confusion_chart(r))  # the same bytes
    # host only: the host program alone; no labels: no matrix, and it says so
    assert len(confusion_chart(report()).panels) == 1
    unlabelled = evaluate(
        board="b", model="m", flow="portable_fp32", dataset="d:all", names=["x"],
        labels=[None], classes=2, class_names=(), fp32=np.ones((1, 2)),
        host={"model": np.ones((1, 2))}, host_titles={"model": "host"},
        device_calibration="model", calibrations={"model": "-"})
    empty = confusion_chart(unlabelled)
    assert empty.panels == () and "No sample has a label" in empty.notes[0]
    assert charts.render(empty).startswith("<?xml")
