"""`--inputs DIR`: samples load in name order, with labels, and bad samples are refused."""

import json

import numpy as np
import pytest
import torch

from deploykit.program.input_sets import load_input_sets
from deploykit.util.errors import ConfigError

EXAMPLE = (torch.zeros(1, 4),)


def test_samples_and_labels(tmp_path):
    for name, value in (("b", 2.0), ("a", 1.0)):
        np.save(tmp_path / f"{name}.npy", np.full((1, 4), value, np.float32))
    torch.save(torch.full((1, 4), 3.0), tmp_path / "c.pt")
    (tmp_path / "labels.json").write_text(json.dumps({"a": 7, "c": 1}))
    sets = load_input_sets(tmp_path, EXAMPLE)
    assert sets.names == ("a", "b", "c")
    assert [float(s[0][0, 0]) for s in sets.samples] == [1.0, 2.0, 3.0]
    assert sets.labels == (7, None, 1) and sets.has_labels
    before = sets.digest
    np.save(tmp_path / "b.npy", np.full((1, 4), 9.0, np.float32))
    assert load_input_sets(tmp_path, EXAMPLE).digest != before


def test_wrong_shape_names_the_file(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((2, 4), np.float32))
    with pytest.raises(ConfigError, match=r"x.npy input 0 is torch.float32 \(2, 4\)"):
        load_input_sets(tmp_path, EXAMPLE)


def test_empty_or_missing_directory(tmp_path):
    with pytest.raises(ConfigError, match="no .npy"):
        load_input_sets(tmp_path, EXAMPLE)
    with pytest.raises(ConfigError, match="not a directory"):
        load_input_sets(tmp_path / "nope", EXAMPLE)


def test_npz_inputs_in_order_and_without_a_gap(tmp_path):
    two = (torch.zeros(1, 4), torch.zeros(2))
    np.savez(tmp_path / "a.npz", input_1=np.ones(2, np.float32),
             input_0=np.zeros((1, 4), np.float32))
    sets = load_input_sets(tmp_path, two)
    assert [tuple(t.shape) for t in sets.samples[0]] == [(1, 4), (2,)]
    np.savez(tmp_path / "b.npz", input_0=np.zeros((1, 4), np.float32),
             input_2=np.ones(2, np.float32))
    with pytest.raises(ConfigError, match=r"cannot read .*b.npz.*input_0, input_1, \.\.\."):
        load_input_sets(tmp_path, two)


def test_labels_must_be_integers(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((1, 4), np.float32))
    (tmp_path / "labels.json").write_text(json.dumps({"a": "7"}))
    assert load_input_sets(tmp_path, EXAMPLE).labels == (7,)
    for bad in ({"a": 7.5}, {"a": True}, {"a": None}, [7]):
        (tmp_path / "labels.json").write_text(json.dumps(bad))
        with pytest.raises(ConfigError, match="not a JSON object of name → integer label"):
            load_input_sets(tmp_path, EXAMPLE)
