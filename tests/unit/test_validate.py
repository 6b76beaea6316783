"""Parity metrics: each can fail, and each names what failed."""

import numpy as np

from deploykit.run.validate import Tolerance, compare_outputs, compare_sets


def test_identical_outputs_pass_with_exact_metrics():
    host = [np.array([[0.1, 0.7, 0.2, 0.0, 0.5, 0.3]], np.float32)]
    v = compare_outputs([host[0].copy()], host, Tolerance(atol=0.0))
    o = v.outputs[0]
    assert v.passed and o.max_abs_error == 0.0 and abs(o.cosine_similarity - 1.0) < 1e-12
    assert o.top1_agrees and o.topk_overlap == 1.0


def test_error_over_tolerance_fails_and_top1_is_checked():
    host = [np.array([[0.1, 0.7, 0.2]], np.float32)]
    device = [np.array([[0.8, 0.7, 0.2]], np.float32)]
    v = compare_outputs(device, host, Tolerance(atol=0.01))
    o = v.outputs[0]
    assert not v.passed and abs(o.max_abs_error - 0.7) < 1e-6 and o.top1_agrees is False


def test_missing_wrong_shape_and_extra_outputs_fail():
    host = [np.zeros((1, 4), np.float32), np.zeros(2, np.float32)]
    v = compare_outputs([None, np.zeros(3, np.float32), np.zeros(1)], host, Tolerance(1.0))
    problems = [o.problem for o in v.outputs]
    assert not v.passed
    assert problems[0] == "missing on the device" and "shape" in problems[1]
    assert "extra" in problems[2]


def test_non_finite_device_values_fail():
    host = [np.zeros(3, np.float32)]
    v = compare_outputs([np.array([0, np.nan, 0], np.float32)], host, Tolerance(10.0))
    assert not v.passed and "non-finite" in v.outputs[0].problem


def test_sets_are_compared_together():
    host_sets = [[np.array([0.0, 1.0])], [np.array([1.0, 0.0])]]
    ok = compare_sets([[np.array([0.0, 1.0])], [np.array([1.0, 0.0])]], host_sets,
                      Tolerance(0.0))
    assert ok.passed and ok.outputs[0].shape == (2, 2)
    bad = compare_sets([[np.array([0.0, 1.0])], [np.array([0.0, 1.0])]], host_sets,
                       Tolerance(0.1))
    assert not bad.passed and bad.outputs[0].top1_agrees is False
