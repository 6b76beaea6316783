"""`deploykit run --flow cortex_m_int8` for the GRU keyword model and the transformer block on
both QEMU boards: PASS against the host reference, and the report names what ran in float
(the GRU's gate projections; none of the transformer's multiply-accumulates).

Needs the ExecuTorch sources (`deploykit setup`); CI has no GitHub, so these skip there with
the reason. A few minutes each on 2 cores (the GRU's export alone is about half a minute).
"""

from __future__ import annotations

import json

import pytest

from deploykit import api
from tests.markers import requires_cmake, requires_qemu, requires_sources, requires_toolchain

pytestmark = [requires_toolchain, requires_cmake, requires_qemu, requires_sources]

BOARDS = ["qemu-an547", "qemu-an505"]
# model -> (the float MAC operator and the code of its model line, or None when every MAC is
# int8; float MACs, int8 MACs)
EXPECTED = {
    "gru_kws": ("aten::addmm", "out, _ = self.gru(x)", 49 * (10 + 24) * 72, 24 * 12),
    "transformer_block": (
        None,
        None,
        0,
        16 * 32 * (96 + 32 + 2 * 128) + 2 * 4 * 16 * 16 * 8,
    ),
}


@pytest.mark.parametrize("board", BOARDS)
@pytest.mark.parametrize("model", sorted(EXPECTED))
def test_int8_run_passes_and_reports_float_operators(tmp_path_factory, board, model):
    out = tmp_path_factory.getbasetemp() / "mixed" / board / model
    report = api.run(board, model, flow="cortex_m_int8", out=out, timeout=300)
    assert report.passed, report.summary()
    assert report.verdict is not None
    for o in report.verdict.outputs:
        assert o.max_abs_error <= o.tolerance.atol
    op, code, float_macs, int8_macs = EXPECTED[model]
    mixed = report.mixed_precision
    assert mixed["float_macs"] == float_macs and mixed["int8_macs"] == int8_macs
    assert [e["op"] for e in mixed["float_mac_ops"]] == ([op] if op else [])
    if code is not None:
        assert mixed["float_mac_ops"][0]["source"].endswith(code)
        text = report.summary()
        assert "float operators (mixed precision;" in text and code in text
    saved = json.loads((out / "run" / "result.json").read_text())
    assert saved["mixed_precision"]["float_macs"] == float_macs
