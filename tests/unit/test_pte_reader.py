"""The one reader of ExecuTorch's private .pte serialization: its conventions, pinned."""

from __future__ import annotations

import pytest

from deploykit.errors import ConfigError
from deploykit.inspect_pte import inspect_pte
from deploykit.pte_reader import load_program, method_plan, read_pte_info

torch = pytest.importorskip("torch")
pytest.importorskip("executorch")


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
