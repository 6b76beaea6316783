"""Real exports with --patches (flows/patches.py), on the host: `auto` leaves a model it
cannot help byte-identical and says why; the fp32 flow's tiles give the outputs of the
program without them, with about the planned buffer the estimate said (about a minute on 2
cores)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from deploykit.flows.base import ExportOptions
from deploykit.program.export import export
from deploykit.program.models import load_model

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("model, reason", [
    ("tiny_cnn", "tiles do not lower the peak"),
    ("mlp_mnist", "does not take a single 4-D image input"),
])
def test_auto_leaves_a_model_it_cannot_help_byte_identical(tmp_path, model, reason):
    spec = load_model(model, REPO)
    programs = {}
    for patches in ("off", "auto"):
        result = export(spec, "cortex_m_int8", tmp_path / patches, cpu="cortex-m33",
                        options=ExportOptions(plan_inputs=False, patches=patches))
        programs[patches] = result.pte_path.read_bytes()
    assert programs["auto"] == programs["off"]
    report = json.loads((tmp_path / "auto" / "export.json").read_text())
    assert reason in report["patches"]["reason"]


def test_fp32_tiles_equal_the_model_with_the_estimated_plan(tmp_path):
    spec = load_model("mobilenet_v1_025", REPO)
    results = {p: export(spec, "portable_fp32", tmp_path / p, cpu="cortex-m33",
                         options=ExportOptions(plan_inputs=False, patches=p))
               for p in ("off", "1x4")}
    tiled, plain = (np.load(results[p].report_path.parent / "reference.npz")
                    for p in ("1x4", "off"))
    # The host runs each .pte (the pybindings): the tiles compute what the whole map does.
    assert np.allclose(tiled["output_0"], plain["output_0"], rtol=0, atol=1e-5)
    report = json.loads(results["1x4"].report_path.read_text())["patches"]
    assert report["grid"] == "1x4"
    assert report["overlap"] == "carried"
    # The estimate is the live peak of the tiled graph (tests/unit/test_patches.py); the
    # planner's placement of the carried columns' slices and joins leaves a few percent
    # unused between buffers.
    planned = results["1x4"].planned_buffers[-1]
    assert report["estimated_peak"] <= planned <= 1.05 * report["estimated_peak"]
    assert results["1x4"].planned_buffers[-1] < results["off"].planned_buffers[-1] // 2
