"""`deploykit run --fit` for real on both QEMU boards: the model is measured once with generous
pools, rebuilt with pools and stack at peak + margin, and the fitted ELF runs correctly; its
static RAM is within 1.25x of the measured need; a later build reuses the measurement without
running; and a pool smaller than its peak fails the run cleanly, naming the pool.

"Static RAM" is checked two ways (docs/memory.md): the reserved blocks (method, temp and
planned pools, stack, heap as linked) against their measured peaks, and everything in RAM
(plus .data/.bss, which is needed as linked) against the need including .data/.bss.

Needs the ExecuTorch sources (`deploykit setup`); skips with the reason without them.
"""

import json

import pytest

from deploykit import api
from deploykit.memory import fit as fitting
from deploykit.util.errors import ExitCode
from tests.markers import requires_cmake, requires_qemu, requires_sources, requires_toolchain

pytestmark = [requires_toolchain, requires_cmake, requires_qemu, requires_sources]

CASES = [("qemu-an547", "tiny_cnn", "portable_fp32"),
         ("qemu-an547", "mlp_mnist", "cortex_m_int8"),
         ("qemu-an505", "tiny_cnn", "portable_fp32"),
         ("qemu-an505", "mlp_mnist", "cortex_m_int8")]
RESERVED = ("method pool", "temp pool", "planned buffers", "stack", "heap")


@pytest.mark.parametrize(("board", "model", "flow"), CASES)
def test_fit_runs_correctly_within_a_quarter_of_the_need(tmp_path_factory, board, model, flow):
    out = tmp_path_factory.getbasetemp() / "fit" / board / f"{model}-{flow}"
    messages: list[str] = []
    report = api.run(board, model, flow=flow, out=out, fit=True, progress=messages.append)
    assert report.passed, report.summary()
    assert any(m.startswith("measuring on the target") for m in messages)
    assert report.warnings == [], report.warnings  # every pool within 25% of its peak

    (entry,) = json.loads((out / "fit.json").read_text())["entries"].values()
    peaks, fitted = entry["peaks"], entry["fitted"]
    # the fitted firmware links what fit.json says, and reports peaks within it
    for name in ("method_pool", "temp_pool", "stack", "heap"):
        used, capacity = report.memory[name]
        assert capacity == fitted[name], name
        assert used <= capacity, name
    # the fitted run needs what the measurement run needed (same code paths)
    assert report.memory["method_pool"][0] == peaks["method_pool"]
    assert report.memory["temp_pool"][0] == peaks["temp_pool"]

    fp = json.loads((out / "footprint.json").read_text())
    blocks = {b["name"]: b for b in fp["ram"]}
    reserved = sum(blocks[n]["size"] for n in RESERVED)
    reserved_need = sum(blocks[n]["peak"] for n in RESERVED)
    assert reserved <= 1.25 * reserved_need, (reserved, reserved_need)
    assert fp["ram_total"] <= 1.25 * fp["need"], (fp["ram_total"], fp["need"])
    assert "<svg" in (out / "footprint.svg").read_text()

    # a later build of the same model is exact without running again
    messages.clear()
    built = api.build(board, model, flow=flow, out=out, progress=messages.append)
    assert not any(m.startswith("measuring") for m in messages)
    plan = built.planned.plan
    assert plan.item("method pool").source == "fit"
    assert (plan.method_pool, plan.stack_size) == (fitted["method_pool"], fitted["stack"])
    assert built.footprint is not None and "fit.json" in built.footprint.peak_source


def test_a_pool_below_its_peak_fails_the_run_naming_it(tmp_path):
    board, model, flow = "qemu-an505", "mlp_mnist", "cortex_m_int8"
    out = tmp_path / "small"
    assert api.run(board, model, flow=flow, out=out, fit=True).passed
    path = out / "fit.json"
    data = json.loads(path.read_text())
    (key, entry), = data["entries"].items()
    entry["fitted"]["method_pool"] = entry["peaks"]["method_pool"] // 2 // 16 * 16
    path.write_text(json.dumps(data))
    report = api.run(board, model, flow=flow, out=out)
    assert not report.passed
    assert report.exit_code == ExitCode.MEMORY
    assert "method_pool too small" in report.cause and "--fit" in report.cause
    assert fitting.load_fit(out, key) is not None
