"""Input sets for `deploykit run --inputs DIR`: several samples in one firmware run.

A directory holds one file per sample, taken in name order:
- `NAME.npy`: the single input of a one-input model;
- `NAME.npz`: arrays `input_0`, `input_1`, ... for a model with several inputs;
- `NAME.pt`: a tensor, or a tuple/list of tensors (torch.save).
An optional `labels.json` maps sample names (file stems) to integer class labels; with it the
report gives the device's top-1 accuracy beside its agreement with the host.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploykit.util.errors import ConfigError

SUFFIXES = (".npy", ".npz", ".pt")


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


def load_input_sets(directory: Path, example_inputs: tuple[Any, ...]) -> InputSets:
    """Load and check every sample against the model's example inputs (count, shape, dtype)."""
    import torch

    directory = Path(directory)
    if not directory.is_dir():
        raise ConfigError(f"--inputs {directory}: not a directory.",
                          "Give a directory of .npy/.npz/.pt files, one per sample.")
    files = sorted(p for p in directory.iterdir() if p.suffix in SUFFIXES)
    if not files:
        raise ConfigError(f"--inputs {directory}: no .npy, .npz or .pt files.",
                          "Save one file per sample (numpy.save or torch.save).")
    digest = hashlib.sha256()
    samples = []
    for path in files:
        digest.update(path.name.encode() + hashlib.sha256(path.read_bytes()).digest())
        try:
            tensors = _read_sample(path, len(example_inputs))
        except ConfigError:
            raise
        except Exception as exc:  # numpy's and torch's readers raise many unrelated types
            raise ConfigError(f"--inputs: cannot read {path}: {type(exc).__name__}: {exc}",
                              "Each file holds one sample (see `deploykit run --help`).") \
                from exc
        if not all(isinstance(t, torch.Tensor) for t in tensors):
            raise ConfigError(f"--inputs: {path.name} holds something other than tensors.",
                              "Save a tensor, or a tuple of tensors, with torch.save.")
        _check_sample(path, tensors, example_inputs)
        samples.append(tensors)
    labels_file = directory / "labels.json"
    labels: dict[str, int] = {}
    if labels_file.exists():
        try:
            labels = {str(k): _label(v) for k, v in json.loads(labels_file.read_text()).items()}
        except (ValueError, AttributeError, TypeError, OverflowError, RecursionError) as exc:
            raise ConfigError(f"{labels_file} is not a JSON object of name → integer label "
                              f"({type(exc).__name__}: {exc}).",
                              'Write it like {"digit_0": 7, "digit_1": 2}.') from exc
        digest.update(labels_file.read_bytes())
    names = tuple(p.stem for p in files)
    return InputSets(directory, names, tuple(samples), tuple(labels.get(n) for n in names),
                     digest.hexdigest())


def _label(value: Any) -> int:
    """A class label: an integer (JSON has no other kind of whole number; a bool is none)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise ValueError(f"{value!r} is not an integer label")
    return int(value)


def _read_sample(path: Path, inputs: int) -> tuple[Any, ...]:
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
            for i in range(inputs):
                _check_npz_member(npz, f"input_{i}", path)
                arrays.append(torch.from_numpy(np.ascontiguousarray(npz[f"input_{i}"])))
            return tuple(arrays)
    value = torch.load(path, weights_only=True)
    return tuple(value) if isinstance(value, list | tuple) else (value,)


def _check_npz_member(npz: Any, key: str, path: Path) -> None:
    import numpy as np

    name = f"{key}.npy"
    if name not in npz.zip.namelist():
        raise KeyError(f"{key} is not in {path.name}")
    info = npz.zip.getinfo(name)
    with npz.zip.open(name) as member:
        version = np.lib.format.read_magic(member)
        shape, _, dtype = np.lib.format._read_array_header(member, version)
        header = member.tell()
    count = 1
    for s in shape:
        count *= s
    if count * dtype.itemsize > info.file_size - header:
        raise ConfigError(f"--inputs: {path.name}: {key} claims {shape} {dtype}, more than "
                          f"its {info.file_size - header} bytes of data.",
                          "The file is damaged: save the sample again (numpy.savez).")


def _check_sample(path: Path, tensors: tuple[Any, ...], example: tuple[Any, ...]) -> None:
    if len(tensors) != len(example):
        raise ConfigError(f"--inputs: {path.name} has {len(tensors)} input(s); the model takes "
                          f"{len(example)}.", "Use .npz with input_0, input_1, ... for several.")
    for i, (got, want) in enumerate(zip(tensors, example, strict=True)):
        if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
            raise ConfigError(
                f"--inputs: {path.name} input {i} is {got.dtype} {tuple(got.shape)}; the model "
                f"takes {want.dtype} {tuple(want.shape)}.",
                "Every sample must have the example input's shape and dtype.")
