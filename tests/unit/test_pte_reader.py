"""The one reader of ExecuTorch's private .pte serialization: its conventions, pinned."""

from __future__ import annotations

import executorch  # noqa: F401  (a hard dependency: a broken install fails here)
import pytest
import torch

from deploykit.program.inspect import inspect_pte
from deploykit.readers.pte_reader import load_program, method_plan, read_pte_info
from deploykit.util.errors import ConfigError


@pytest.fixture(scope="module")
def pte(tmp_path_factory):
    from executorch.exir import to_edge

    class AddRelu(torch.nn.Module):
        def forward(self, x, y):
            return torch.relu(x + y) * 2.0

    inputs = (torch.ones(2, 3), torch.ones(2, 3))
    program = to_edge(torch.export.export(AddRelu(), inputs)).to_executorch()
    path = tmp_path_factory.mktemp("pte") / "add_relu.pte"
    path.write_bytes(program.buffer)
    return path


def test_the_export_and_inspect_views_agree(pte):
    info, program = read_pte_info(pte), inspect_pte(pte)
    raw = method_plan(load_program(pte.read_bytes(), "t"), "forward", "t")
    # Memory id 0 is reserved (always 0) and dropped by both views alike.
    assert raw.non_const_buffer_sizes[0] == 0
    assert tuple(info.planned_buffers) == program.planned_buffers \
        == tuple(raw.non_const_buffer_sizes[1:])
    assert sum(info.planned_buffers) > 0
    assert tuple(info.operators) == program.operators
    assert set(info.operators) == {"aten::add.out", "aten::relu.out", "aten::mul.out"}
    assert sum(info.kernel_calls.values()) == 3
    assert [t.sizes for t in info.inputs] == [[2, 3], [2, 3]]
    assert [t.dtype for t in info.outputs] == ["float32"]
    assert [t.sizes for t in program.inputs] == [(2, 3), (2, 3)]
    assert info.num_delegates == 0 and program.delegates == ()


def test_not_a_program_is_a_clear_error(tmp_path, pte):
    bad = tmp_path / "bad.pte"
    bad.write_bytes(b"\x00" * 64)
    for read in (read_pte_info, inspect_pte):
        with pytest.raises(ConfigError) as exc:
            read(bad)
        assert "not a readable ExecuTorch program" in exc.value.cause
    with pytest.raises(ConfigError) as exc:
        read_pte_info(pte, method="train")
    assert "no method 'train'" in exc.value.cause and "forward" in exc.value.hint


def test_inspect_names_dtypes_as_users_know_them(pte):
    from deploykit.api import describe_program

    text = describe_program(inspect_pte(pte))
    assert "inputs: float32 [2, 3], float32 [2, 3]" in text
    assert "outputs: float32 [2, 3]" in text
    assert "dtype 6" not in text


def test_inspect_of_a_bad_file_starts_with_deploykit(tmp_path):
    """No third-party import noise (torchao, torch's _pytree) comes before deploykit's error."""
    import subprocess
    import sys

    bad = tmp_path / "bad.pte"
    bad.write_bytes(b"not a program")
    proc = subprocess.run([sys.executable, "-m", "deploykit", "inspect", str(bad)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=_env_with_state(tmp_path))
    assert proc.returncode == 3
    assert proc.stderr.splitlines()[0].startswith("deploykit: error:"), proc.stderr
    assert "Traceback" not in proc.stderr


def _env_with_state(tmp_path):
    import os

    from deploykit.util.paths import data_root

    tools = str(data_root() / "tools") if (data_root() / "tools").is_dir() else ""
    path = os.pathsep.join(p for p in (tools, os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"), PYTHONPATH=path)
