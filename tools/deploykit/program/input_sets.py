"""Input sets for `deploykit run --inputs DIR`: several samples in one firmware run.

A directory holds one file per sample, taken in name order:
- `NAME.npy`: the single input of a one-input model;
- `NAME.npz`: arrays `input_0`, `input_1`, ... for a model with several inputs;
- `NAME.pt`: a tensor, or a tuple/list of tensors (torch.save).
An optional `labels.json` maps sample names (file stems) to integer class labels; with it the
report gives the device's top-1 accuracy beside its agreement with the host.

The same directory is a data set for `deploykit validate` (program/datasets.py, the `folder`
kind): `read_samples` reads it, `check_sample` checks one sample against the model, for both.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploykit.util.errors import ConfigError

SUFFIXES = (".npy", ".npz", ".pt")
LABELS_NAME = "labels.json"
_NPZ_KEY = re.compile(r"^input_(\d+)$")


@dataclass(frozen=True)
class InputSets:
    directory: Path
    names: tuple[str, ...]
    samples: tuple[tuple[Any, ...], ...]  # torch tensors, one tuple per sample
    labels: tuple[int | None, ...]
    digest: str  # over every file's bytes, for the export cache key

    @property
    def has_labels(self) -> bool:
        return any(label is not None for label in self.labels)


def sample_files(directory: Path) -> list[Path]:
    """The sample files of `directory`, in name order."""
    return sorted(p for p in Path(directory).iterdir() if p.suffix in SUFFIXES and p.is_file())


def load_input_sets(directory: Path, example_inputs: tuple[Any, ...]) -> InputSets:
    """Load and check every sample against the model's example inputs (count, shape, dtype)."""
    sets = read_samples(directory, "--inputs")
    for path, sample in zip(sample_files(directory), sets.samples, strict=True):
        check_sample(f"--inputs: {path.name}", sample, example_inputs)
    return sets


def read_samples(directory: Path, what: str) -> InputSets:
    """Every sample of `directory` and its label, not yet checked against a model. `what`
    names the directory in errors ("--inputs", "data set ./my_set")."""
    import torch

    directory = Path(directory)
    if not directory.is_dir():
        raise ConfigError(f"{what} {directory}: not a directory.",
                          "Give a directory of .npy/.npz/.pt files, one per sample.")
    files = sample_files(directory)
    if not files:
        raise ConfigError(f"{what} {directory}: no .npy, .npz or .pt files.",
                          "Save one file per sample (numpy.save or torch.save).")
    stems = [p.stem for p in files]
    twice = sorted({s for s in stems if stems.count(s) > 1})
    if twice:
        raise ConfigError(f"{what} {directory}: more than one file for sample(s) "
                          f"{', '.join(twice)}.",
                          "Keep one file per sample name (labels.json names samples by it).")
    digest = hashlib.sha256()
    samples = []
    for path in files:
        digest.update(path.name.encode() + hashlib.sha256(path.read_bytes()).digest())
        try:
            tensors = _read_sample(path, what)
        except ConfigError:
            raise
        except Exception as exc:  # numpy's and torch's readers raise many unrelated types
            raise ConfigError(f"{what}: cannot read {path}: {type(exc).__name__}: {exc}",
                              "Each file holds one sample (see `deploykit run --help`).") \
                from exc
        if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
            raise ConfigError(f"{what}: {path.name} holds something other than tensors.",
                              "Save a tensor, or a tuple of tensors, with torch.save.")
        samples.append(tensors)
    labels: dict[str, int] = {}
    labels_file = directory / LABELS_NAME
    if labels_file.exists():
        labels = _read_labels(labels_file)
        digest.update(labels_file.read_bytes())
        stray = sorted(set(labels) - set(stems))
        if stray:
            raise ConfigError(
                f"{labels_file} labels {len(stray)} sample(s) with no file in {directory}: "
                f"{', '.join(stray[:5])}{' ...' if len(stray) > 5 else ''}.",
                "Each name of labels.json is a sample file's name without its suffix "
                "(digit_0 for digit_0.npy); remove the stray names or add their files.")
    return InputSets(directory, tuple(stems), tuple(samples),
                     tuple(labels.get(n) for n in stems), digest.hexdigest())


def _npz_inputs(keys: list[str]) -> list[str]:
    """The input arrays of a sample .npz, in order: input_0, input_1, ... with no gap."""
    indices = sorted(int(m.group(1)) for k in keys if (m := _NPZ_KEY.match(k)))
    if not indices or indices != list(range(len(indices))):
        raise KeyError(f"arrays {', '.join(sorted(keys))}: expected input_0, input_1, ...")
    return [f"input_{i}" for i in indices]


def _read_labels(path: Path) -> dict[str, int]:
    try:
        raw = json.loads(path.read_text())
        if not isinstance(raw, dict):
            raise ValueError("not an object")
        labels = {}
        for k, v in raw.items():
            # 7 or "7"; not 7.5, true or null
            if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
                raise ValueError(f"label of {k} is {v!r}")
            labels[str(k)] = int(v)
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise ConfigError(f"{path} is not a JSON object of name → integer label "
                          f"({type(exc).__name__}: {exc}).",
                          'Write it like {"digit_0": 7, "digit_1": 2}.') from exc
    return labels


def _read_sample(path: Path, what: str) -> tuple[Any, ...]:
    """The tensors of one sample file. An .npy is mapped rather than read, so that a header
    claiming more data than the file holds is refused, not allocated; an .npz member's header
    is checked against its size before it is read."""
    import numpy as np
    import torch

    if path.suffix == ".npy":
        return (torch.from_numpy(np.array(np.load(path, mmap_mode="r"))),)
    if path.suffix == ".npz":
        with np.load(path) as npz:
            arrays = []
            for key in _npz_inputs(npz.files):
                _check_npz_member(npz, key, path, what)
                arrays.append(torch.from_numpy(np.ascontiguousarray(npz[key])))
            return tuple(arrays)
    value = torch.load(path, weights_only=True)
    return tuple(value) if isinstance(value, list | tuple) else (value,)


def _check_npz_member(npz: Any, key: str, path: Path, what: str) -> None:
    import numpy as np

    info = npz.zip.getinfo(f"{key}.npy")
    with npz.zip.open(info) as member:
        version = np.lib.format.read_magic(member)
        shape, _, dtype = np.lib.format._read_array_header(member, version)
        header = member.tell()
    count = 1
    for s in shape:
        count *= s
    if count * dtype.itemsize > info.file_size - header:
        raise ConfigError(f"{what}: {path.name}: {key} claims {shape} {dtype}, more than "
                          f"its {info.file_size - header} bytes of data.",
                          "The file is damaged: save the sample again (numpy.savez).")


def check_sample(what: str, tensors: tuple[Any, ...], example: tuple[Any, ...]) -> None:
    """One sample against the model's example inputs: as many inputs, each of the same shape
    and dtype (the export is specialised to them). `what` names the sample."""
    if len(tensors) != len(example):
        raise ConfigError(f"{what} has {len(tensors)} input(s); the model takes "
                          f"{len(example)}.", "Use .npz with input_0, input_1, ... for several.")
    for i, (got, want) in enumerate(zip(tensors, example, strict=True)):
        if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
            raise ConfigError(
                f"{what} input {i} is {got.dtype} {tuple(got.shape)}; the model takes "
                f"{want.dtype} {tuple(want.shape)}.",
                "Every sample must have the example input's shape and dtype.")
