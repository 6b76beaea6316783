"""Exports several integration test files share, made once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def mobilenet_v2_lrn_ethos_u(tmp_path_factory):
    """mobilenet_v2_lrn through the ethos_u_int8 flow for corstone-320 (Ethos-U85-256): the
    split case, two NPU delegates with the LRN remnant on the CPU between them. About a minute
    on two cores, so exported once (test_ethos_u_export.py, test_explore.py)."""
    pytest.importorskip("executorch")
    pytest.importorskip("ethosu.vela")
    from deploykit.boards import load_board
    from deploykit.export import export
    from deploykit.models import load_model
    from deploykit.npu import npu_config

    board = load_board("corstone-320")
    return export(
        load_model("mobilenet_v2_lrn", REPO),
        "ethos_u_int8",
        tmp_path_factory.mktemp("mobilenet_v2_lrn-corstone-320"),
        cpu=board.cpu["core"],
        settings=npu_config(board).export_settings(),
    )
