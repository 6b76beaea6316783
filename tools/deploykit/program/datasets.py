"""Data sets: labelled samples that `deploykit validate` scores a model on (docs/validation.md).

A data set has a name, one or more splits (`train`, `test`, ...) and, per split, samples
(each a tuple of tensors shaped and typed exactly as the model's example inputs), an integer
label per sample (or none) and, optionally, the names of its classes. `NAME[:SPLIT]` names
one split (the data set's default split without `:SPLIT`); NAME is one of:

- a registered data set: the built-in `digits` (scikit-learn's handwritten digits, 8x8,
  inside its wheel: `train` and `test`, the split `models/digits_cnn.py` trains on), or one
  of another installed package (entry point group `deploykit.datasets`, a `DatasetSource`);
- a directory of samples (the `folder` kind, read as `deploykit run --inputs DIR` reads it,
  program/input_sets.py): sample files and `labels.json`, or one subdirectory of those per
  split;
- a Python file defining `SPLITS`, `load(split)` and optionally `CLASS_NAMES`.

Everything wrong with a data set or its fit to the model is a ConfigError that names the
sample and the fix. torch (and scikit-learn, for digits) is imported only when a split loads.
"""

from __future__ import annotations

import abc
import hashlib
import os
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploykit.program.input_sets import check_sample, read_samples, sample_files
from deploykit.program.models import describe_model, import_python_file
from deploykit.util.errors import ConfigError, EnvironmentProblem
from deploykit.util.plugins import load_plugins

if TYPE_CHECKING:
    import numpy as np

ENTRY_POINT_GROUP = "deploykit.datasets"
BUILTIN_DATASETS = {"digits": "deploykit.program.datasets:DigitsDataset"}
FOLDER_SPLIT = "all"  # the one split of a directory that holds its samples itself


@dataclass(frozen=True)
class Sample:
    """One sample as a data set's `load()` returns it."""

    inputs: tuple[Any, ...]  # torch tensors, as the model takes them
    label: int | None
    name: str


@dataclass(frozen=True)
class Dataset:
    """One split of a data set, loaded: what validate scores a model on."""

    name: str
    split: str
    description: str
    names: tuple[str, ...]
    samples: tuple[tuple[Any, ...], ...]  # torch tensors, one tuple per sample
    labels: tuple[int | None, ...]
    class_names: tuple[str, ...]  # () when the data set names none
    digest: str  # over every sample's tensors and label: the export cache key

    @property
    def title(self) -> str:
        return f"{self.name}:{self.split}"

    @property
    def has_labels(self) -> bool:
        return any(label is not None for label in self.labels)

    def head(self, limit: int | None) -> Dataset:
        """The first `limit` samples (all of them for None)."""
        if limit is None or limit >= len(self.samples):
            return self
        if limit < 1:
            raise ConfigError(f"--limit {limit}: at least one sample is needed.",
                              "Give --limit 1 or more, or leave it out for the whole split.")
        return replace(self, names=self.names[:limit], samples=self.samples[:limit],
                       labels=self.labels[:limit],
                       digest=_digest(self.names[:limit], self.samples[:limit],
                                      self.labels[:limit]))


class DatasetSource(abc.ABC):
    """A data set: its splits and how to load one. Subclass it for a data set of your own and
    register it as an entry point of the `deploykit.datasets` group (name = `name`)."""

    name: str = ""  # a registered one's registry name; a directory's or a file's path
    description: str = ""
    splits: tuple[str, ...] = ()
    default_split: str = ""
    class_names: tuple[str, ...] = ()

    @abc.abstractmethod
    def load(self, split: str) -> list[Sample]:
        """Every sample of `split` (one of `splits`), in a fixed order."""


# ---- the built-in digits ----------------------------------------------------------------------

# The split models/digits_cnn.py trains on: stratified, a quarter for the test split, a fixed
# seed; scikit-learn's pixels are 0..16, scaled to [0, 1].
DIGITS_TEST_FRACTION = 0.25
DIGITS_SPLIT_SEED = 0
DIGITS_MAX_PIXEL = 16.0


def digits_arrays(split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The `split` ("train" or "test") of scikit-learn's digits: images float32 [N, 1, 8, 8]
    in [0, 1], labels int64 [N], and each sample's index in scikit-learn's 1,797."""
    import numpy as np

    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as exc:
        raise EnvironmentProblem(f"The digits data set needs scikit-learn ({exc}).",
                                 "scripts/install again, or pip install scikit-learn.") from exc
    digits = load_digits()
    index = np.arange(len(digits.target))
    train, test = train_test_split(index, test_size=DIGITS_TEST_FRACTION,
                                   random_state=DIGITS_SPLIT_SEED, stratify=digits.target)
    chosen = {"train": train, "test": test}[split]
    images = (digits.images[chosen] / DIGITS_MAX_PIXEL).astype(np.float32)[:, None, :, :]
    return images, digits.target[chosen].astype(np.int64), chosen


class DigitsDataset(DatasetSource):
    name = "digits"
    description = ("scikit-learn's handwritten digits: 1,797 images 8x8 in [0, 1], 10 classes; "
                   "stratified split, 25% test (seed 0)")
    splits = ("train", "test")
    default_split = "test"
    class_names = tuple(str(d) for d in range(10))

    def load(self, split: str) -> list[Sample]:
        import torch

        images, labels, index = digits_arrays(split)
        return [Sample((torch.from_numpy(image[None].copy()),), int(label), f"digit_{i:04d}")
                for image, label, i in zip(images, labels, index, strict=True)]


# ---- a directory, a Python file ---------------------------------------------------------------

class FolderDataset(DatasetSource):
    """A directory of sample files with labels.json (program/input_sets.py), or one
    subdirectory of those per split."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.name = str(directory)
        self.description = f"the samples in {directory}"
        if not self.directory.is_dir():
            raise ConfigError(f"Data set {directory}: not a directory.",
                              "Give a directory of .npy/.npz/.pt files with labels.json.")
        if sample_files(self.directory):
            self.splits = (FOLDER_SPLIT,)
        else:
            self.splits = tuple(sorted(d.name for d in self.directory.iterdir()
                                       if d.is_dir() and sample_files(d)))
        if not self.splits:
            raise ConfigError(f"Data set {directory}: no .npy, .npz or .pt files, neither in "
                              "it nor in a subdirectory.",
                              "Save one file per sample (numpy.save or torch.save), with "
                              "labels.json beside them; or one such subdirectory per split.")
        self.default_split = "test" if "test" in self.splits else self.splits[0]

    def load(self, split: str) -> list[Sample]:
        where = self.directory if split == FOLDER_SPLIT else self.directory / split
        sets = read_samples(where, f"data set {self.name}")
        return [Sample(inputs, label, name) for name, inputs, label
                in zip(sets.names, sets.samples, sets.labels, strict=True)]


class ModuleDataset(DatasetSource):
    """A Python file: `SPLITS` (the split names, the default first), `load(split)` (a list of
    `(inputs, label)`: a tuple of tensors and an int, or None), optionally `CLASS_NAMES`."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.name = str(path)
        if not self.path.is_file():
            raise ConfigError(f"Data set file {path} does not exist.",
                              "Check the path, or name a built-in data set: "
                              f"{', '.join(registry())}.")
        self.module = import_python_file(self.path.resolve(), "data set")
        self.description = describe_model(self.path)
        splits = getattr(self.module, "SPLITS", None)
        if (not isinstance(splits, list | tuple) or not splits
                or not all(isinstance(s, str) and s for s in splits)):
            raise ConfigError(f"{path}: SPLITS must be a non-empty tuple of split names.",
                              'Write e.g. SPLITS = ("test", "train") (the default first).')
        if not callable(getattr(self.module, "load", None)):
            raise ConfigError(f"{path} does not define load(split).",
                              "Define `def load(split)` returning a list of (inputs, label).")
        self.splits = tuple(splits)
        self.default_split = self.splits[0]
        self.class_names = tuple(str(c) for c in getattr(self.module, "CLASS_NAMES", ()))

    def load(self, split: str) -> list[Sample]:
        import torch

        try:
            raw = self.module.load(split)
        except Exception as exc:
            raise ConfigError(f"{self.path}: load({split!r}) raised {type(exc).__name__}: "
                              f"{exc}", "Fix load() in the data set file.") from exc
        if not isinstance(raw, list | tuple):
            raise ConfigError(f"{self.path}: load({split!r}) returned {type(raw).__name__}.",
                              "Return a list of (inputs, label) pairs.")
        samples = []
        for i, item in enumerate(raw):
            ok = isinstance(item, list | tuple) and len(item) == 2
            inputs, label = item if ok else ((), None)
            if isinstance(inputs, torch.Tensor):
                inputs = (inputs,)
            ok = ok and isinstance(inputs, list | tuple) and bool(inputs) and all(
                isinstance(t, torch.Tensor) for t in inputs)
            if not ok or not (label is None or (isinstance(label, int)
                                                and not isinstance(label, bool))):
                raise ConfigError(f"{self.path}: load({split!r})[{i}] is not a pair of "
                                  "(tuple of tensors, int label or None).",
                                  "Return e.g. [((x0,), 3), ((x1,), 7), ...].")
            samples.append(Sample(tuple(inputs), label, f"{split}_{i:05d}"))
        return samples


# ---- resolving NAME[:SPLIT] ------------------------------------------------------------------

@cache
def registry() -> dict[str, DatasetSource]:
    """Every registered data set by name: the built-in ones, then those of installed
    packages."""
    return load_plugins(ENTRY_POINT_GROUP, BUILTIN_DATASETS, DatasetSource, "data set")


def parse_dataset(text: str) -> tuple[str, str | None]:
    """`NAME[:SPLIT]` as (NAME, SPLIT or None). The split is after the last colon that is
    followed by no path separator, so a directory named with a colon still works."""
    text = text.strip()
    name, colon, split = text.rpartition(":")
    if not colon or os.sep in split or "/" in split:
        return text, None
    return name, split


def resolve_source(name: str) -> DatasetSource:
    if not name:
        raise ConfigError("No data set given.", _known_hint())
    found = registry().get(name)
    if found is not None:
        return found
    path = Path(name).expanduser()
    if path.is_dir():
        return FolderDataset(path)
    if path.suffix == ".py":
        return ModuleDataset(path)
    if "/" in name or os.sep in name or path.exists():
        raise ConfigError(f"Data set {name}: neither a directory nor a Python (.py) file.",
                          _known_hint())
    raise ConfigError(f"Unknown data set '{name}'.", _known_hint())


def _known_hint() -> str:
    known = ", ".join(f"{n} ({', '.join(s.splits)})" for n, s in registry().items())
    return (f"Known data sets: {known}; or a directory of samples with labels.json, or a "
            "Python file defining SPLITS and load(split) (docs/validation.md).")


def load_dataset(text: str) -> Dataset:
    """The split `text` (`NAME[:SPLIT]`) names, loaded."""
    name, split = parse_dataset(text)
    source = resolve_source(name)
    split = split or source.default_split
    if split not in source.splits:
        raise ConfigError(f"Data set '{name}' has no split '{split}'.",
                          f"Its splits: {', '.join(source.splits)} (NAME:SPLIT).")
    samples = source.load(split)
    if not samples:
        raise ConfigError(f"Data set {name}:{split} has no samples.",
                          "Give a split with at least one sample.")
    names = tuple(s.name for s in samples)
    inputs = tuple(tuple(s.inputs) for s in samples)
    labels = tuple(s.label for s in samples)
    return Dataset(source.name, split, source.description, names,
                   inputs, labels, tuple(source.class_names), _digest(names, inputs, labels))


def _digest(names: tuple[str, ...], samples: tuple[tuple[Any, ...], ...],
            labels: tuple[int | None, ...]) -> str:
    h = hashlib.sha256()
    for name, sample, label in zip(names, samples, labels, strict=True):
        h.update(f"{name}:{label}".encode())
        for t in sample:
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


def check_dataset(dataset: Dataset, example_inputs: tuple[Any, ...], classes: int) -> None:
    """Every sample against the model: its inputs shaped and typed as the example inputs, its
    label one of the model's `classes` (the width of its first output), and the data set's
    class names, when it has them, as many as the model's classes."""
    if dataset.class_names and len(dataset.class_names) != classes:
        raise ConfigError(f"Data set {dataset.title} names {len(dataset.class_names)} classes; "
                          f"the model outputs {classes}.",
                          "Validate a model on a data set of its own classes.")
    for i, (name, sample, label) in enumerate(zip(dataset.names, dataset.samples,
                                                  dataset.labels, strict=True)):
        what = f"{dataset.title} sample {i} ({name})"
        check_sample(what, sample, example_inputs)
        if label is not None and not 0 <= label < classes:
            raise ConfigError(f"{what} has label {label}; the model has {classes} classes "
                              f"(its first output's width), labels 0 to {classes - 1}.",
                              "Fix the label (labels.json), or validate a model of the data "
                              "set's classes.")
