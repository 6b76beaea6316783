"""Validate stage: compare the device's outputs with the host's, per output, with metrics."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float = 0.0


@dataclass(frozen=True)
class OutputComparison:
    index: int
    shape: tuple[int, ...]
    max_abs_error: float
    mean_abs_error: float
    cosine_similarity: float
    top1_agrees: bool | None  # for classifier-shaped outputs, else None
    topk_overlap: float | None  # |device top-k ∩ host top-k| / k, k = min(5, classes)
    tolerance: Tolerance
    passed: bool
    problem: str = ""


@dataclass(frozen=True)
class Verdict:
    outputs: tuple[OutputComparison, ...]

    @property
    def passed(self) -> bool:
        return bool(self.outputs) and all(o.passed for o in self.outputs)

    @property
    def max_abs_error(self) -> float:
        return max((o.max_abs_error for o in self.outputs), default=float("nan"))


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.dot(a.ravel(), b.ravel()) / (na * nb))


def _topk_overlap(got: np.ndarray, expected: np.ndarray) -> float:
    """Mean over rows of |top-k(device) ∩ top-k(host)| / k, with k = min(5, classes)."""
    k = min(5, expected.shape[-1])
    rows_got = got.reshape(-1, got.shape[-1])
    rows_exp = expected.reshape(-1, expected.shape[-1])
    overlaps = [len(set(np.argsort(-g)[:k]) & set(np.argsort(-e)[:k])) / k
                for g, e in zip(rows_got, rows_exp, strict=True)]
    return float(np.mean(overlaps))


def compare_outputs(device: Sequence[np.ndarray | None], host: Sequence[np.ndarray],
                    tolerance: Tolerance) -> Verdict:
    """Each host output must have a device output of the same shape within tolerance."""
    results = []
    for i, expected in enumerate(host):
        expected = np.asarray(expected, dtype=np.float64)
        got = device[i] if i < len(device) else None
        if got is None:
            results.append(OutputComparison(i, expected.shape, float("inf"), float("inf"), 0.0,
                                            None, None, tolerance, False,
                                            "missing on the device"))
            continue
        got = np.asarray(got, dtype=np.float64)
        if got.shape != expected.shape:
            results.append(OutputComparison(
                i, expected.shape, float("inf"), float("inf"), 0.0, None, None, tolerance, False,
                f"shape {got.shape} on the device, {expected.shape} on the host"))
            continue
        diff = np.abs(got - expected)
        finite = bool(np.all(np.isfinite(got)))
        top1 = topk = None
        if expected.ndim >= 1 and expected.shape[-1] > 1:
            top1 = bool(np.array_equal(got.argmax(-1), expected.argmax(-1)))
            topk = _topk_overlap(got, expected)
        ok = finite and bool(np.all(diff <= tolerance.atol + tolerance.rtol * np.abs(expected)))
        results.append(OutputComparison(
            i, expected.shape, float(diff.max(initial=0.0)), float(diff.mean()) if diff.size
            else 0.0, _cosine(got, expected), top1, topk, tolerance, ok,
            "" if finite else "non-finite values on the device"))
    extra = len(device) - len(host)
    if extra > 0:
        results.append(OutputComparison(len(host), (), float("inf"), float("inf"), 0.0, None,
                                        None, tolerance, False,
                                        f"{extra} unexpected extra output(s)"))
    return Verdict(tuple(results))


def compare_sets(device_sets: Sequence[Sequence[np.ndarray | None]],
                 host_sets: Sequence[Sequence[np.ndarray]], tolerance: Tolerance) -> Verdict:
    """Compare several input sets at once: each output is stacked across the sets, so the
    metrics (max and mean abs error, cosine, top-1) cover every set."""
    if len(host_sets) == 1:
        return compare_outputs(device_sets[0], host_sets[0], tolerance)
    stacked_host = [np.stack([h[i] for h in host_sets]) for i in range(len(host_sets[0]))]
    stacked_device: list[np.ndarray | None] = []
    for i in range(len(host_sets[0])):
        parts = [d[i] if i < len(d) else None for d in device_sets]
        if any(p is None or p.shape != host_sets[0][i].shape for p in parts):
            stacked_device.append(None)
        else:
            stacked_device.append(np.stack(parts))
    return compare_outputs(stacked_device, stacked_host, tolerance)
