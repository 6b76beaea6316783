"""Data sets (program/datasets.py): the built-in digits and its split, folders of samples (the
same reading as `run --inputs`), data set files, NAME[:SPLIT], and every way a data set can
be wrong for a model, each a ConfigError that names the sample and the fix."""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from deploykit.program.datasets import (
    DIGITS_TEST_FRACTION,
    DatasetSource,
    check_dataset,
    digits_arrays,
    load_dataset,
    parse_dataset,
    registry,
)
from deploykit.program.input_sets import load_input_sets
from deploykit.util.errors import ConfigError

EXAMPLE = (torch.zeros(1, 1, 8, 8),)


# ---- digits --------------------------------------------------------------------------------

def test_digits_splits_are_disjoint_stratified_and_scaled():
    train_x, train_y, train_i = digits_arrays("train")
    test_x, test_y, test_i = digits_arrays("test")
    assert (len(train_i), len(test_i)) == (1347, 450)
    assert sorted([*train_i, *test_i]) == list(range(1797))  # every image, once
    assert train_x.shape == (1347, 1, 8, 8) and test_x.dtype == np.float32
    assert min(train_x.min(), test_x.min()) == 0.0 and max(train_x.max(), test_x.max()) == 1.0
    # stratified: each class's share of the test split is the test fraction of it
    whole = Counter([*train_y.tolist(), *test_y.tolist()])
    for digit, count in Counter(test_y.tolist()).items():
        assert abs(count - DIGITS_TEST_FRACTION * whole[digit]) <= 1
    again = digits_arrays("test")
    assert np.array_equal(again[0], test_x) and np.array_equal(again[2], test_i)


def test_the_digits_data_set_is_the_same_split():
    test = load_dataset("digits")  # the default split
    assert test.title == "digits:test" and len(test.samples) == 450
    assert test.class_names == tuple("0123456789")
    images, labels, index = digits_arrays("test")
    assert test.names[0] == f"digit_{index[0]:04d}"
    assert test.labels == tuple(int(v) for v in labels)
    assert test.samples[3][0].shape == (1, 1, 8, 8)
    assert np.array_equal(test.samples[3][0].numpy()[0], images[3])
    train = load_dataset("digits:train")
    assert len(train.samples) == 1347 and train.digest != test.digest
    assert load_dataset("digits:test").digest == test.digest
    assert "digits" in registry() and isinstance(registry()["digits"], DatasetSource)


def test_head_takes_the_first_samples():
    test = load_dataset("digits:test")
    five = test.head(5)
    assert five.names == test.names[:5] and len(five.samples) == 5
    assert five.digest != test.digest and test.head(None) is test and test.head(10**6) is test
    with pytest.raises(ConfigError, match="--limit 0"):
        test.head(0)


# ---- names ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, parsed", [
    ("digits", ("digits", None)),
    ("digits:train", ("digits", "train")),
    ("./my:set/data", ("./my:set/data", None)),
    ("./my:set/data:test", ("./my:set/data", "test")),
])
def test_name_and_split(text, parsed):
    assert parse_dataset(text) == parsed


def test_an_unknown_data_set_lists_the_known_ones():
    with pytest.raises(ConfigError) as e:
        load_dataset("mnist")
    assert "Unknown data set 'mnist'" in str(e.value)
    assert "digits (train, test)" in str(e.value) and "labels.json" in str(e.value)


def test_an_unknown_split_lists_the_splits():
    with pytest.raises(ConfigError, match=r"(?s)no split 'validation'.*Its splits: train, test"):
        load_dataset("digits:validation")


def test_a_path_that_is_neither_a_directory_nor_a_file(tmp_path):
    with pytest.raises(ConfigError, match="neither a directory nor a Python"):
        load_dataset(str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="does not exist"):
        load_dataset(str(tmp_path / "nope.py"))


# ---- folders -------------------------------------------------------------------------------

def write_samples(directory: Path, labels: dict[str, int] | None, n: int = 3,
                  shape: tuple[int, ...] = (1, 1, 8, 8)) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        np.save(directory / f"s{i}.npy", np.full(shape, i / 10, np.float32))
    if labels is not None:
        (directory / "labels.json").write_text(json.dumps(labels))


def test_a_folder_is_one_split(tmp_path):
    write_samples(tmp_path, {"s0": 4, "s2": 9})
    data = load_dataset(str(tmp_path))
    assert data.split == "all" and data.names == ("s0", "s1", "s2")
    assert data.labels == (4, None, 9) and data.class_names == ()
    assert float(data.samples[1][0][0, 0, 0, 0]) == pytest.approx(0.1)
    assert load_dataset(f"{tmp_path}:all").digest == data.digest


def test_a_folder_of_split_folders(tmp_path):
    write_samples(tmp_path / "train", {"s0": 1})
    write_samples(tmp_path / "test", {"s1": 2}, n=2)
    (tmp_path / "notes").mkdir()  # no samples: not a split
    data = load_dataset(str(tmp_path))
    assert data.split == "test" and len(data.samples) == 2 and data.labels == (None, 2)
    assert len(load_dataset(f"{tmp_path}:train").samples) == 3
    with pytest.raises(ConfigError, match="(?s)no split .notes.*Its splits: test, train"):
        load_dataset(f"{tmp_path}:notes")


def test_an_empty_folder(tmp_path):
    with pytest.raises(ConfigError, match="no .npy, .npz or .pt files, neither in it"):
        load_dataset(str(tmp_path))


def test_a_label_of_no_file_is_refused_here_and_for_run_inputs(tmp_path):
    write_samples(tmp_path, {"s0": 1, "s7": 3, "typo": 2})
    for load in (lambda: load_dataset(str(tmp_path)),
                 lambda: load_input_sets(tmp_path, EXAMPLE)):
        with pytest.raises(ConfigError) as e:
            load()
        assert "labels 2 sample(s) with no file" in str(e.value)
        assert "s7, typo" in str(e.value) and "remove the stray names" in str(e.value)


# ---- the data set against the model ---------------------------------------------------------

def test_a_sample_of_another_shape_is_named(tmp_path):
    write_samples(tmp_path, {"s0": 1})
    np.save(tmp_path / "s1.npy", np.zeros((1, 64), np.float32))
    data = load_dataset(str(tmp_path))
    with pytest.raises(ConfigError) as e:
        check_dataset(data, EXAMPLE, 10)
    assert (f"{tmp_path}:all sample 1 (s1) input 0 is torch.float32 (1, 64); the model takes "
            "torch.float32 (1, 1, 8, 8)") in str(e.value)


def test_a_sample_of_another_dtype_is_named(tmp_path):
    write_samples(tmp_path, None, n=1)
    np.save(tmp_path / "s1.npy", np.zeros((1, 1, 8, 8), np.float64))
    with pytest.raises(ConfigError, match=r"sample 1 \(s1\) input 0 is torch.float64"):
        check_dataset(load_dataset(str(tmp_path)), EXAMPLE, 10)


def test_a_label_outside_the_model_classes(tmp_path):
    write_samples(tmp_path, {"s0": 1, "s2": 10})
    with pytest.raises(ConfigError) as e:
        check_dataset(load_dataset(str(tmp_path)), EXAMPLE, 10)
    assert "sample 2 (s2) has label 10; the model has 10 classes" in str(e.value)
    assert "labels 0 to 9" in str(e.value)
    write_samples(tmp_path, {"s0": -1})
    with pytest.raises(ConfigError, match="sample 0 .s0. has label -1"):
        check_dataset(load_dataset(str(tmp_path)), EXAMPLE, 10)


def test_class_names_must_be_the_model_classes():
    digits = load_dataset("digits:test").head(3)
    check_dataset(digits, EXAMPLE, 10)
    with pytest.raises(ConfigError, match="names 10 classes; the model outputs 12"):
        check_dataset(digits, EXAMPLE, 12)


# ---- data set files ------------------------------------------------------------------------

GOOD_FILE = """
    '''Two samples per split.'''
    import torch

    SPLITS = ("test", "train")
    CLASS_NAMES = ("no", "yes")

    def load(split):
        base = 1.0 if split == "train" else 0.0
        image = torch.full((1, 1, 8, 8), base)
        return [((image,), 0), ((image + 0.5,), None)]
"""


def test_a_data_set_file(tmp_path):
    path = tmp_path / "my_set.py"
    path.write_text(textwrap.dedent(GOOD_FILE))
    data = load_dataset(str(path))
    assert data.split == "test" and data.class_names == ("no", "yes")
    assert data.labels == (0, None) and data.description == "Two samples per split."
    assert float(load_dataset(f"{path}:train").samples[1][0].max()) == 1.5
    check_dataset(data, EXAMPLE, 2)


@pytest.mark.parametrize("body, message", [
    ("def load(split): return []", "SPLITS must be a non-empty tuple"),
    ("SPLITS = ('a',)", r"does not define load\(split\)"),
    ("SPLITS = ('a',)\ndef load(split): raise RuntimeError('no data')",
     r"load\('a'\) raised RuntimeError: no data"),
    ("SPLITS = ('a',)\ndef load(split): return {}", r"load\('a'\) returned dict"),
    ("import torch\nSPLITS = ('a',)\ndef load(split): return [(torch.zeros(1), 'cat')]",
     r"load\('a'\)\[0\] is not a pair"),
    ("SPLITS = ('a',)\ndef load(split): return []", "a has no samples"),
    ("SPLITS = (", "syntax error"),
])
def test_a_broken_data_set_file(tmp_path, body, message):
    path = tmp_path / "broken.py"
    path.write_text(body + "\n")
    with pytest.raises(ConfigError, match=message):
        load_dataset(str(path))
