"""The run report says why the cortex_m flow's reference fell back to the PT2E model (#32):
export.json records the failed integer-reference check, the report prints it beside the
verdict's reference line."""

from __future__ import annotations

import json
from types import SimpleNamespace

from deploykit.pipeline.chains import _reference_fallback
from deploykit.run.report import RunReport
from deploykit.run.validate import Verdict
from deploykit.util.errors import ExitCode


def _export(tmp_path, reference):
    path = tmp_path / "export.json"
    path.write_text(json.dumps({"reference": reference}))
    return SimpleNamespace(report_path=path)


def test_the_reason_comes_from_the_failed_check(tmp_path):
    exported = _export(tmp_path, {
        "kind": "pt2e-quantized-torch",
        "cortex_m_dialect_check": {
            "ran": False,
            "error": "NotImplementedError: \"slow_conv_dilated<>\" not implemented for 'Int'",
        },
    })
    why = _reference_fallback(exported)
    assert "did not run on the host (NotImplementedError" in why and "PT2E" in why
    report = RunReport(board="qemu-an547", model="m", flow="cortex_m_int8", passed=True,
                       exit_code=ExitCode.OK, verdict=Verdict(()),
                       reference_kind="pt2e-quantized-torch", reference_fallback=why)
    assert f"  reference: pt2e-quantized-torch (fallback: {why})" in report.summary()


def test_no_reason_where_the_integer_reference_ran(tmp_path):
    exported = _export(tmp_path, {"kind": "cortex-m-integer",
                                  "cortex_m_dialect_check": {"ran": True, "bit_exact": True}})
    assert _reference_fallback(exported) == ""
    assert _reference_fallback(_export(tmp_path, {"kind": "executorch"})) == ""
