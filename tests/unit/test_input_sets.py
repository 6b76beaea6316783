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
