"""Accuracy over a data set, for `deploykit validate` (docs/validation.md): the metrics of each
way the model ran (fp32 on the host, the flow's host program, the device), and the report
they make: a side-by-side table, validation.json and the confusion-matrix chart.

Everything here is numpy on arrays of logits, one row per sample; what ran the model and how
is the caller's (pipeline/validation.py).

- top-1 accuracy: the share of labelled samples whose largest logit is their label;
- agreement: the share of samples on which two ways pick the same class, and the indices
  where they do not (two ways of equal accuracy can be right on different samples);
- confusion matrix: counts of (true class, predicted class) over the labelled samples;
- error against fp32: over every logit of the samples both have, the mean and max of
  |got - fp32|, the RMSE sqrt(mean((got - fp32)^2)), and the cosine similarity of each
  sample's logit vector with fp32's (mean and min over the samples).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from deploykit.util import charts
from deploykit.util.errors import ExitCode
from deploykit.util.fsutil import write_atomic
from deploykit.util.jsonable import to_jsonable

SCHEMA_VERSION = 1
REPORT_NAME = "validation.json"
CHART_NAME = "confusion.svg"
FP32, HOST, DEVICE = "fp32", "host", "device"  # column keys; a host column is host:<calibration>


def top1(logits: np.ndarray) -> np.ndarray:
    """The predicted class of each row (the first of equal largest logits, as argmax)."""
    return np.asarray(logits).reshape(len(logits), -1).argmax(axis=1)


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The cosine similarity of each row of `a` with the same row of `b`: 1 where both rows
    are zero, 0 where only one is."""
    a = np.asarray(a, dtype=np.float64).reshape(len(a), -1)
    b = np.asarray(b, dtype=np.float64).reshape(len(b), -1)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    dot = np.einsum("ij,ij->i", a, b)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = dot / (na * nb)
    return np.where((na == 0) & (nb == 0), 1.0, np.where((na == 0) | (nb == 0), 0.0, cos))


@dataclass(frozen=True)
class LogitError:
    """The error of one way's logits against a reference's (fp32), over `samples` samples."""

    samples: int
    mean_abs: float
    max_abs: float
    rmse: float
    cosine_mean: float
    cosine_min: float


def logit_error(got: np.ndarray, reference: np.ndarray) -> LogitError:
    """`got` against `reference`, one row of logits per sample each."""
    if not len(got):
        nan = float("nan")
        return LogitError(0, nan, nan, nan, nan, nan)
    got = np.asarray(got, dtype=np.float64).reshape(len(got), -1)
    reference = np.asarray(reference, dtype=np.float64).reshape(len(reference), -1)
    if got.shape != reference.shape:
        raise ValueError(f"logits {got.shape} against {reference.shape}")
    diff = got - reference
    cos = cosine_rows(got, reference)
    return LogitError(len(got), float(np.abs(diff).mean()), float(np.abs(diff).max()),
                      float(np.sqrt((diff ** 2).mean())), float(cos.mean()), float(cos.min()))


def confusion_matrix(labels: Sequence[int | None], predictions: Sequence[int],
                     classes: int) -> np.ndarray:
    """counts[true, predicted] over the samples that have a label."""
    counts = np.zeros((classes, classes), dtype=np.int64)
    for label, predicted in zip(labels, predictions, strict=False):
        if label is not None:
            counts[label, predicted] += 1
    return counts


@dataclass(frozen=True)
class Agreement:
    """Two ways' top-1 over the same samples."""

    compared: int
    agreed: int
    disagreements: tuple[int, ...]  # sample indices where the two pick other classes

    @property
    def rate(self) -> float | None:
        return self.agreed / self.compared if self.compared else None


def agreement(a: Sequence[int], b: Sequence[int]) -> Agreement:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise ValueError(f"predictions {a.shape} against {b.shape}")
    differ = np.flatnonzero(a != b)
    return Agreement(len(a), len(a) - len(differ), tuple(int(i) for i in differ))


@dataclass(frozen=True)
class Column:
    """One way the model ran over the samples (the first `scored` of them)."""

    key: str  # "fp32", "host:<calibration>", "device"
    title: str
    scored: int
    labelled: int  # scored samples that have a label
    correct: int | None  # None without labels
    predictions: tuple[int, ...]
    confusion: tuple[tuple[int, ...], ...] | None
    error_vs_fp32: LogitError | None  # None for fp32 itself

    @property
    def accuracy(self) -> float | None:
        return self.correct / self.labelled if self.correct is not None and self.labelled \
            else None


def score(key: str, title: str, logits: np.ndarray, labels: Sequence[int | None],
          classes: int, fp32: np.ndarray | None = None) -> Column:
    """A column from its logits (one row per scored sample, in the samples' order) and the
    labels of every sample; `fp32`: the fp32 logits of every sample (its error against them)."""
    predictions = top1(logits) if len(logits) else np.zeros(0, dtype=np.int64)
    scored = len(predictions)
    mine = list(labels[:scored])
    labelled = sum(1 for label in mine if label is not None)
    correct = (sum(1 for label, p in zip(mine, predictions, strict=True) if label == p)
               if labelled else None)
    confusion = (tuple(tuple(int(c) for c in row)
                       for row in confusion_matrix(mine, predictions, classes))
                 if labelled else None)
    error = logit_error(logits, fp32[:scored]) if fp32 is not None else None
    return Column(key, title, scored, labelled, correct, tuple(int(p) for p in predictions),
                  confusion, error)


@dataclass(frozen=True)
class DeviceOutcome:
    """How the device's part went: every sample answered, or where it stopped."""

    scored: int
    stopped_at: int | None  # the sample it did not answer; None when it answered every one
    error: str  # why it stopped
    exit_code: int  # the stopping error's
    agreement: Agreement  # with the host program, sample by sample
    beyond_tolerance: tuple[int, ...]  # samples whose outputs differ from the host program's
    max_abs_vs_host: float
    tolerance: dict[str, float]


@dataclass(frozen=True)
class ValidationReport:
    board: str
    model: str
    flow: str
    dataset: str  # NAME:SPLIT
    samples: int
    classes: int
    class_names: tuple[str, ...]
    device_calibration: str  # the calibration of the program the device runs (and `host`)
    calibrations: dict[str, str]  # calibration -> what it calibrated on; {}: not quantized
    columns: tuple[Column, ...]
    device: DeviceOutcome | None  # None: host only
    max_accuracy_drop: float  # points of top-1 the int8 program may lose against fp32
    passed: bool
    exit_code: int
    cause: str
    names: tuple[str, ...]
    labels: tuple[int | None, ...]

    def column(self, key: str) -> Column | None:
        return next((c for c in self.columns if c.key == key), None)

    @property
    def host(self) -> Column:
        """The host program of the device's calibration: what the device is compared with."""
        column = self.column(f"{HOST}:{self.device_calibration}")
        assert column is not None
        return column

    def summary(self) -> str:
        return table(self)


def evaluate(*, board: str, model: str, flow: str, dataset: str, names: Sequence[str],
             labels: Sequence[int | None], classes: int, class_names: Sequence[str],
             fp32: np.ndarray, host: dict[str, np.ndarray], host_titles: dict[str, str],
             device_calibration: str, calibrations: dict[str, str],
             device: np.ndarray | None = None, device_error: tuple[str, int] | None = None,
             beyond_tolerance: Sequence[int] = (), max_abs_vs_host: float = 0.0,
             tolerance: dict[str, float] | None = None,
             max_accuracy_drop: float = 1.0) -> ValidationReport:
    """The report of one validation. `fp32`, `host[calibration]`: the logits of every sample;
    `device`: the logits of the samples the device answered (None: host only), with
    `device_error` (message, exit code) when it stopped before the end; `beyond_tolerance`,
    `max_abs_vs_host`: its outputs against the host program's, within `tolerance`."""
    n = len(labels)
    columns = [score(FP32, "fp32 (PyTorch, host)", fp32, labels, classes)]
    columns += [score(f"{HOST}:{c}", host_titles[c], logits, labels, classes, fp32)
                for c, logits in host.items()]
    outcome = None
    if device is not None:
        columns.append(score(DEVICE, "device", device, labels, classes, fp32))
        scored = len(device)
        host_predictions = columns[1 + list(host).index(device_calibration)].predictions
        outcome = DeviceOutcome(
            scored, scored if device_error is not None else None,
            device_error[0] if device_error else "",
            device_error[1] if device_error else int(ExitCode.OK),
            agreement(top1(device) if scored else [], host_predictions[:scored]),
            tuple(beyond_tolerance), max_abs_vs_host, dict(tolerance or {}))
    report = ValidationReport(
        board=board, model=model, flow=flow, dataset=dataset, samples=n, classes=classes,
        class_names=tuple(class_names), device_calibration=device_calibration,
        calibrations=dict(calibrations), columns=tuple(columns), device=outcome,
        max_accuracy_drop=max_accuracy_drop, passed=False, exit_code=int(ExitCode.OK),
        cause="", names=tuple(names), labels=tuple(labels))
    exit_code, cause = _verdict(report)
    return replace(report, passed=exit_code == ExitCode.OK, exit_code=int(exit_code),
                   cause=cause)


def _verdict(report: ValidationReport) -> tuple[ExitCode, str]:
    """PASS: every sample scored by every way asked for, the device's outputs within the
    tolerance of the host program's on each, and the int8 program's top-1 (host and device)
    at most `max_accuracy_drop` points below fp32's."""
    device = report.device
    if device is not None and device.stopped_at is not None:
        return (ExitCode(device.exit_code) if device.exit_code else ExitCode.PROTOCOL,
                f"the device stopped answering at sample {device.stopped_at} of "
                f"{report.samples} ({device.error}); {device.scored} sample(s) scored, the "
                "rest not")
    if device is not None and device.beyond_tolerance:
        shown = ", ".join(str(i) for i in device.beyond_tolerance[:10])
        return (ExitCode.MISMATCH,
                f"the device's outputs differ from the host program's beyond the tolerance "
                f"on {len(device.beyond_tolerance)} sample(s) (max abs err "
                f"{device.max_abs_vs_host:.3g}, tolerance {device.tolerance}): {shown}"
                + (" ..." if len(device.beyond_tolerance) > 10 else ""))
    fp32 = report.column(FP32)
    if fp32 is None or fp32.accuracy is None:
        return ExitCode.OK, ""
    low = [c for c in (report.host, report.column(DEVICE)) if c is not None
           and c.accuracy is not None
           and (fp32.accuracy - c.accuracy) * 100 > report.max_accuracy_drop + 1e-9]
    if low:
        return (ExitCode.MISMATCH, "; ".join(
            f"{c.title}: top-1 {_percent(c.accuracy)}, {(fp32.accuracy - c.accuracy) * 100:.2f}"
            f" points below fp32's {_percent(fp32.accuracy)} (the limit is "
            f"{report.max_accuracy_drop:g})" for c in low))
    return ExitCode.OK, ""


# ---- output -----------------------------------------------------------------------------------

def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def _number(value: float | None, digits: int = 3) -> str:
    return "-" if value is None or value != value else f"{value:.{digits}g}"


def table(report: ValidationReport) -> str:
    """The columns side by side: top-1, correct, and the error against fp32."""
    state = "PASS" if report.passed else f"FAIL ({ExitCode(report.exit_code).name})"
    head = (f"validation of {report.model} ({report.flow}) on {report.board} over "
            f"{report.dataset}: {report.samples:,} samples, {report.classes} classes: {state}")
    rows = [("", "top-1", "correct", "|err| mean", "|err| max", "RMSE", "cosine (min)")]
    for c in report.columns:
        e = c.error_vs_fp32
        rows.append((c.title, _percent(c.accuracy),
                     f"{c.correct:,}/{c.labelled:,}" if c.correct is not None
                     else f"{c.scored:,} scored",
                     _number(e.mean_abs) if e else "-", _number(e.max_abs) if e else "-",
                     _number(e.rmse) if e else "-",
                     f"{e.cosine_mean:.4f} ({e.cosine_min:.4f})" if e and e.samples else "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [head]
    lines += ["  " + "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
              for row in rows]
    lines.append("  (|err|, RMSE, cosine: the logits against fp32's, sample by sample)")
    if report.calibrations:  # a quantized flow's
        lines.append(f"  the device program: calibration '{report.device_calibration}' "
                     f"({report.calibrations[report.device_calibration]})")
    device = report.device
    if device is None:
        lines.append("  device: not run (host only)")
    else:
        a = device.agreement
        where = (", ".join(str(i) for i in a.disagreements[:20])
                 + (" ..." if len(a.disagreements) > 20 else "")) or "none"
        lines.append(f"  device against the host program: top-1 agrees on {a.agreed:,}/"
                     f"{a.compared:,} ({_percent(a.rate)}); disagrees at samples: {where}; "
                     f"outputs beyond the tolerance on {len(device.beyond_tolerance):,} "
                     f"(max abs err {_number(device.max_abs_vs_host)})")
    if report.cause:
        lines.append(f"  cause: {report.cause}")
    return "\n".join(lines)


def report_json(report: ValidationReport) -> dict:
    out = to_jsonable(report)
    out["schema_version"] = SCHEMA_VERSION
    for column, entry in zip(report.columns, out["columns"], strict=True):
        entry["accuracy"] = column.accuracy
    if report.device is not None:
        out["device"]["agreement"]["rate"] = report.device.agreement.rate
    return out


def confusion_chart(report: ValidationReport) -> charts.Chart:
    """The confusion matrices of the device (when it scored a sample) and of the host
    program it is compared with."""
    labels = report.class_names or tuple(str(c) for c in range(report.classes))
    grids = []
    for column in (report.column(DEVICE), report.host):
        if column is None or column.confusion is None or not column.scored:
            continue
        grids.append(charts.Grid(
            f"{column.title}: top-1 {_percent(column.accuracy)} ({column.correct:,}/"
            f"{column.labelled:,})", labels, labels, column.confusion, "true class",
            "predicted class"))
    notes = ("Rows: the true class; columns: the class predicted. Each cell is shaded by its "
             "share of its row: green on the diagonal (right), red off it (wrong).",)
    if not grids:
        notes = ("No sample has a label: no confusion matrix.",)
    return charts.Chart(f"{report.model} ({report.flow}) on {report.board} over "
                        f"{report.dataset}", tuple(grids), notes)


def write_report(report: ValidationReport, directory: Path) -> tuple[Path, Path]:
    """validation.json (sorted keys) and confusion.svg in `directory`, each written whole."""
    path = Path(directory) / REPORT_NAME
    write_atomic(path, json.dumps(report_json(report), indent=2, sort_keys=True,
                                  allow_nan=False) + "\n")
    return path, charts.write(confusion_chart(report), Path(directory) / CHART_NAME)
