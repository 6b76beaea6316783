"""The int8 kernels' QEMU tests share one run: a model in the cortex_m_int8 flow with
`--strict` (no float island may be left), run on a board and compared with the host's integer
reference, which the device must match bit for bit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from deploykit import api


def run_strict_int8(board: str, model: str, out: Path) -> tuple[Any, dict[str, Any]]:
    """`deploykit run --flow cortex_m_int8 --strict` of `model` on `board` into `out`; asserts
    it passed with every output bit for bit the host's. Returns the run report and the
    export's export.json."""
    report = api.run(board, model, flow="cortex_m_int8", out=out, timeout=300, strict=True,
                     project=False)
    assert report.passed, report.summary()
    assert report.verdict is not None
    for o in report.verdict.outputs:
        assert o.max_abs_error == 0  # the device is the host's integer reference, bit for bit
    return report, json.loads((out / "export" / "export.json").read_text())
