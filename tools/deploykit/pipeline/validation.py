"""`deploykit validate`: a model scored over a whole split of a data set (docs/validation.md).

Each sample of the split runs three ways:

- fp32: the model file's module in PyTorch on the host;
- the flow's host program: the reference `deploykit run` compares the device with (for
  cortex_m_int8, the lowered int8 graph through the cortex_m ops' integer reference), computed
  by the export stage for every sample, for the calibration the device program uses (the
  model's calibration_inputs() by default) and, for an int8 flow, for the other one too (the
  example input alone), so that the report shows what calibrating on real data buys;
- the device, through a callable the caller passes in (`Device`: one sample's inputs in, its
  outputs out), or not at all (host only).

Then run/accuracy.py scores them: top-1 accuracy, agreement sample by sample, confusion
matrices, the logits' error against fp32. Written under <out>/validate/:

    calibration-<name>/export/   the host program of each calibration, with reference.npz
                                 holding its outputs on every sample (the export stage's files)
    validation.json              the report (schema-versioned, sorted keys)
    confusion.svg                the confusion matrices of the device and its host program
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

import numpy as np

from deploykit.flows.base import CALIBRATIONS
from deploykit.pipeline.chains import export_stage
from deploykit.pipeline.target import Target
from deploykit.program.datasets import Dataset, check_dataset, load_dataset
from deploykit.program.export import ExportResult
from deploykit.program.models import ModelSpec, load_model
from deploykit.readers.boards import repo_root
from deploykit.run.accuracy import ValidationReport, evaluate, write_report
from deploykit.run.validate import Tolerance, compare_outputs
from deploykit.util.errors import ConfigError, DeployKitError

Progress = Callable[[str], None]
# The device: one sample's inputs (ExportResult.input_sets[k]: logical shapes, the dtypes the
# program takes) in, its outputs out, in the host reference's layout (logical order, float
# where the model's outputs are). It raises a DeployKitError when the device stops answering.
Device = Callable[[Sequence[np.ndarray]], list[np.ndarray]]
# Opens the device for the host program it is to match (its .pte is what the device runs),
# for the length of a `with`: device_session, or a Device the caller has (the API's `device`).
Session = Callable[[ExportResult], AbstractContextManager[Device]]
PROGRESS_UPDATES = 10  # progress lines over a split, about (piped output gets each one)


VALIDATE_DIR = "validate"
DEVICE_DIR = "device"  # under <out>/validate: the serve firmware's export, build and session


@contextlib.contextmanager
def device_session(target: Target, model: str, out: Path, program: ExportResult,
                   workspace: Path | None, timeout: float, progress: Progress, *,
                   calibration: str = "model") -> Iterator[Device]:
    """The board of `target` as a `Device` running `program` (the host program of the
    device's calibration `calibration`), for the length of the `with`: serve firmware built
    for the same model and calibration (pipeline/stream.py) in <out>/validate/device, started
    on the board's runner, one sample at a time over its link. The firmware's program must be
    `program` byte for byte, or the device would be scored against another program."""
    from deploykit.pipeline.stream import open_stream

    session = open_stream(target, model, Path(out) / VALIDATE_DIR / DEVICE_DIR, workspace, progress,
                          timeout=timeout, calibration=calibration)
    with session:
        # What the device runs, as its hello says (the first 16 hex digits of the .pte's hash).
        running = session.hello.fields.get("pte_sha256", "") if session.hello else ""
        if not running or not program.pte_sha256.startswith(running):
            raise ConfigError(
                f"The device runs the program {running or '(unknown)'}, not the host program "
                f"scored beside it ({program.pte_sha256[:16]}): the two exports of "
                f"{target.flow.name} differ.",
                "Export twice with the same settings and compare the .pte files: the export is "
                "expected to be reproducible (see docs/validation.md).")
        yield session.infer


def classes_of(spec: ModelSpec) -> int:
    """The number of classes: the width of the model's first output, which must be one row
    of logits (validate scores classifiers)."""
    import torch

    with torch.no_grad():
        out = spec.module(*[t.clone() for t in spec.example_inputs])
    first = out[0] if isinstance(out, tuple | list) else out
    shape = tuple(first.shape)
    if not shape or shape[-1] < 2 or first.numel() != shape[-1]:
        raise ConfigError(f"{spec.name}: the first output is {list(shape)}, not one row of "
                          "class scores; validate scores classifiers.",
                          "Validate a model whose first output is [1, classes] (or "
                          "[classes]); compare other models with `deploykit run --inputs`.")
    return shape[-1]


def validate_model(target: Target, model: str, dataset: str | Dataset, out: Path,
                   progress: Progress, *, session: Session | None = None,
                   limit: int | None = None, calibration: str = "model",
                   max_accuracy_drop: float = 1.0) -> ValidationReport:
    """Score `model` over `dataset` (NAME[:SPLIT], or a loaded split), its first `limit`
    samples, on the host and, given `session`, on the device it opens for the host program
    of `calibration`; write <out>/validate/."""
    if target.program is not None:
        raise ConfigError("validate needs the model's Python file: its fp32 outputs are the "
                          f"reference, which a .pte ({target.program.path}) does not have.",
                          "Give the model file, or compare the program with `deploykit run "
                          "--inputs DIR`.")
    if calibration not in CALIBRATIONS:
        raise ConfigError(f"Unknown calibration '{calibration}'.",
                          f"Use one of: {', '.join(CALIBRATIONS)}.")
    spec = load_model(model, repo_root())
    data = (dataset if isinstance(dataset, Dataset) else load_dataset(dataset)).head(limit)
    classes = classes_of(spec)
    check_dataset(data, spec.example_inputs, classes)
    work = Path(out) / VALIDATE_DIR
    n = len(data.samples)

    fp32 = _fp32_logits(spec, data, progress)
    calibrations = [calibration] + ([c for c in CALIBRATIONS if c != calibration]
                                    if target.flow.quantized else [])
    host: dict[str, np.ndarray] = {}
    programs: dict[str, ExportResult] = {}
    for c in calibrations:
        progress(f"the {target.flow.name} host program, calibrated on "
                 f"{_calibration_text(spec, c)}, over {data.title} ({n:,} samples)")
        programs[c] = export_stage(target, model, work / f"calibration-{c}", progress,
                                   samples=data, calibration=c, spec=spec)
        host[c] = np.stack([_logits(outputs) for outputs in programs[c].reference_sets])
    titles = {c: f"{target.flow.name} host" + (f", calibration '{c}'"
                                                if target.flow.quantized else "")
              for c in calibrations}

    scored = beyond = None
    error = None
    max_abs = 0.0
    if session is not None:
        with session(programs[calibration]) as device:
            scored, beyond, max_abs, error = _on_device(device, programs[calibration],
                                                        data.title, progress)
    report = evaluate(
        board=target.name, model=spec.name, flow=target.flow.name, dataset=data.title,
        names=data.names, labels=data.labels, classes=classes, class_names=data.class_names,
        fp32=fp32, host=host, host_titles=titles, device_calibration=calibration,
        calibrations={c: _calibration_text(spec, c) for c in calibrations
                      if target.flow.quantized},
        device=scored, device_error=error, beyond_tolerance=beyond or (),
        max_abs_vs_host=max_abs, tolerance=programs[calibration].tolerance,
        max_accuracy_drop=max_accuracy_drop)
    write_report(report, work)
    return report


def _calibration_text(spec: ModelSpec, calibration: str) -> str:
    if calibration == "example" or not spec.has_calibration_inputs:
        return "example_inputs(): 1 sample"
    return f"calibration_inputs(): {len(spec.calibration_inputs):,} samples"


def _logits(outputs: Sequence[np.ndarray]) -> np.ndarray:
    """A sample's class scores: its first output, as one row."""
    return np.asarray(outputs[0], dtype=np.float64).reshape(-1)


def _updates(n: int) -> set[int]:
    """The sample counts at which a progress line is due: about PROGRESS_UPDATES of them."""
    step = max(1, n // PROGRESS_UPDATES)
    return {k for k in range(step, n + 1, step)} | {n}


def _fp32_logits(spec: ModelSpec, data: Dataset, progress: Progress) -> np.ndarray:
    import torch

    due, rows = _updates(len(data.samples)), []
    with torch.no_grad():
        for k, sample in enumerate(data.samples, 1):
            out = spec.module(*[t.clone() for t in sample])
            first = out[0] if isinstance(out, tuple | list) else out
            rows.append(first.numpy().astype(np.float64).reshape(-1))
            if k in due:
                progress(f"fp32 over {data.title}: {k:,}/{len(data.samples):,}")
    return np.stack(rows)


def _on_device(device: Device, program: ExportResult, title: str, progress: Progress
               ) -> tuple[np.ndarray, list[int], float, tuple[str, int] | None]:
    """Each sample through `device`, until the end or until it stops answering: the logits
    of the samples it answered, those whose outputs are beyond the tolerance of the host
    program's, the largest error against them, and why it stopped (None: it did not)."""
    tolerance = Tolerance(**program.tolerance)
    n = len(program.input_sets)
    due = _updates(n)
    rows: list[np.ndarray] = []
    beyond: list[int] = []
    max_abs = 0.0
    for k, (inputs, expected) in enumerate(zip(program.input_sets, program.reference_sets,
                                               strict=True)):
        try:
            outputs = device(inputs)
        except DeployKitError as exc:
            progress(f"the device stopped answering at sample {k:,} of {title}: "
                     f"{exc.cause}")
            return _rows(rows), beyond, max_abs, (exc.cause, int(exc.exit_code))
        verdict = compare_outputs(outputs, expected, tolerance)
        if not verdict.passed:
            beyond.append(k)
        max_abs = max(max_abs, verdict.max_abs_error)
        width = np.size(expected[0])
        # A missing or misshapen first output scores as no class (NaN logits), and is
        # beyond the tolerance already.
        rows.append(_logits(outputs) if outputs and np.size(outputs[0]) == width
                    else np.full(width, np.nan))
        if k + 1 in due:
            progress(f"device over {title}: {k + 1:,}/{n:,}")
    return _rows(rows), beyond, max_abs, None


def _rows(rows: list[np.ndarray]) -> np.ndarray:
    return np.stack(rows) if rows else np.zeros((0, 0))
