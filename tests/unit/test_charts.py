"""Every chart deploykit writes goes through util/charts.py: each kind (profile, footprint,
matrix, the bench's goals) is drawn in headless Chromium, and every text of it (labels, values,
legends, titles, ticks) must lie whole inside the canvas and overlap no other text, whatever the
length of a name: the case of issue #33 is an operator name of 60 characters. The same data
must give the same bytes.

The texts are glyph paths (svg.fonttype "path"): each is a `<g id="text_N">` group whose
comment holds the string and whose `<use>`s are its glyphs, so the browser's bounding box of
the group is the box of the glyphs as drawn. The Chromium tests skip where Debian's `chromium`
is missing (scripts/install --tests installs it)."""

from __future__ import annotations

import functools
import html
import importlib.machinery
import importlib.util
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import matplotlib
import pytest

from deploykit.pipeline.matrix import MatrixRow
from deploykit.pipeline.matrix import chart as matrix_chart
from deploykit.profiling.chart import profile_chart
from deploykit.readers.footprint import Footprint, RamBlock
from deploykit.readers.footprint import chart as footprint_chart
from deploykit.readers.protocol import decode
from deploykit.readers.trace import Instruction, kernel_of, profile_from_records
from deploykit.util import charts
from tests import chromium
from tests.unit.test_npu_sweep import sweep_chart

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
LONG_OPERATOR = "cortex_m::quantized_batch_matmul_with_a_rather_long_name.out"
assert len(LONG_OPERATOR) == 60


# ---- the charts of each kind, on long names ---------------------------------------------------

def profile_with_long_names() -> charts.Chart:
    """The recorded int8 MLP profile (tests/data), its matmul renamed to 60 characters and its
    output dequantize run by deploykit's own kernel, in a float island."""
    ops = ["cortex_m::quantize_per_tensor.out", LONG_OPERATOR, LONG_OPERATOR, LONG_OPERATOR,
           "aten::avg_pool3d.out"]
    program = {(0, i): Instruction(op, kernel_of(op)) for i, op in enumerate(ops)}
    profile = profile_from_records(
        decode((DATA / "profile-mlp_mnist-cortex_m_int8-qemu-an505.bin").read_bytes()), program)
    profile.unit, profile.scale = "instructions", 1e9 / (32 * profile.clock_hz)
    return profile_chart(profile, "transformer_block (cortex_m_int8) on qemu-an547: "
                         "instructions per operator", {"aten::avg_pool3d.out"})


def footprint_with_long_names() -> charts.Chart:
    fp = Footprint(
        "footprint: ds_cnn on qemu-an547 (dk_runner.elf)",
        (("model data", 39_348), ("CMSIS-NN", 9_560), ("runner", 7_244),
         ("kernels (inlined into their registration)", 1_024), ("model inputs", 506)),
        (RamBlock("method pool", 8_288, 7_732), RamBlock("temp pool + Ethos-U scratch", 304),
         RamBlock("stack", 32_768, 1_920), RamBlock(".data/.bss", 1_732, 1_732)),
        (("board + protocol", 1_438), ("kernels (inlined into their registration)", 56)),
        "measured on the target (run)",
        ("LTO build: code inlined across libraries is counted where it ended up (main holds "
         "the runner and the kernel and runtime code inlined into it)",))
    return footprint_chart(fp)


def matrix_rows() -> list[MatrixRow]:
    rows = []
    for model, macs in (("ds_cnn", 2_656_768), ("mobilenet_v1_025", 7_489_664)):
        for board, ipm in (("qemu-an505", 2.9), ("qemu-an547", 0.66)):
            for profile, extra in (("speed", 0), ("size", 4_096)):
                rows.append(MatrixRow(board, model, "cortex_m_int8", profile, result="PASS",
                                      flash=80_000, ram_linked=75_460 + extra,
                                      ram_need=27_324, instructions=ipm * macs, macs=macs))
    rows.append(MatrixRow("pico2-uart", "mobilenet_v1_025", "cortex_m_int8", "speed",
                          result="MEMORY", reason="region RAM overflows by 1,234 B"))
    return rows


@functools.cache
def load_bench() -> ModuleType:
    """bench/run as a module (a script without .py; its dataclasses need it in sys.modules)."""
    name = "dk_bench_run"
    loader = importlib.machinery.SourceFileLoader(name, str(REPO / "bench" / "run"))
    spec = importlib.util.spec_from_loader(name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


def bench_goals() -> list[dict]:
    bench = load_bench()
    kib = bench.KIB
    rows = [
        bench.Row("qemu-an505", "mlp_mnist", "int8", "size", "PASS", code=19_800,
                  model_inputs=784, ram_linked=7_900, ram_need=7_400,
                  ram_sections={".data": 100, ".bss": 7_800}, warm_rebuild_s=2.1,
                  warm_steps=["[1/2] Building C object model_pte.c.obj"]),
        bench.Row("qemu-an505", "mlp_mnist", "int8", "speed", "PASS", code=21_000,
                  instructions=51_234.0),
        bench.Row("qemu-an505", "mlp_mnist", "fp32", "size", "PASS", code=45 * kib),
        bench.Row("qemu-an505", "mlp_mnist", "fp32", "reference", "PASS", code=45 * kib,
                  instructions=2_500_000.0),
        bench.Row("qemu-an505", "mlp_mnist", "fp32", "speed", "PASS", code=45 * kib,
                  instructions=100_000.0),
        bench.Row("pico2", "mlp_mnist", "int8", "size", "BUILT", code=30 * kib,
                  ram_linked=9 * kib, reason="measured on qemu-an505"),
    ]
    return bench.goals(rows, cold=False)


def bench_chart() -> charts.Chart:
    return load_bench().chart(bench_goals())


def confusion() -> charts.Chart:
    """validate's confusion matrices: ten digits with three-digit counts, and a set whose
    class names are wider than a cell (its column labels stand upright)."""
    digits = tuple(str(d) for d in range(10))
    counts = tuple(tuple(112 if i == j else (i * 3 + j) % 4 for j in range(10))
                   for i in range(10))
    names = ("airplane", "automobile", "bird", "a rather long class name")
    return charts.Chart("digits_cnn (cortex_m_int8) on qemu-an547 over digits:test", (
        charts.Grid("device: top-1 97.11% (437/450)", digits, digits, counts, "true class",
                    "predicted class"),
        charts.Grid("cortex_m_int8 host, calibration 'model'", names, names,
                    ((30, 2, 0, 1), (1, 112, 3, 0), (0, 0, 0, 0), (4, 0, 0, 9)), "true class",
                    "predicted class")), ("Rows: the true class; columns: the class predicted.",))


KINDS = {
    "profile": profile_with_long_names,
    "footprint": footprint_with_long_names,
    "matrix": lambda: matrix_chart(matrix_rows()),
    "bench": bench_chart,
    "npu-sweep": sweep_chart,  # Pareto points hatched, a latency target line
    "empty": lambda: matrix_chart([]),  # a matrix whose filter ran nothing: says so
    "confusion": confusion,
}


def labels(chart: charts.Chart) -> set[str]:
    """The texts a chart must show: its titles, group labels, bar texts, grid labels and
    counts, and notes."""
    out = {chart.title} | set(chart.notes)
    for p in chart.panels:
        if isinstance(p, charts.Grid):
            out |= {p.title, p.row_axis, p.column_axis, *p.rows, *p.columns}
            out |= {f"{c:,}" for row in p.counts for c in row if c}
            continue
        out |= {p.title, p.axis} | {g.label for g in p.groups}
        out |= {b.text for g in p.groups for b in g.bars if b.text}
    return out - {""}


# ---- the data of each kind --------------------------------------------------------------------

def test_the_profile_chart_colours_by_kernel_library_and_marks_float_islands():
    chart = profile_with_long_names()
    (panel,) = chart.panels
    bars = {g.label: g.bars[0] for g in panel.groups}
    assert list(bars)[0] == LONG_OPERATOR  # the largest first
    assert bars[LONG_OPERATOR].series == "CMSIS-NN (cortex_m)"
    assert bars["aten::avg_pool3d.out"].series == "deploykit's own"
    assert bars["aten::avg_pool3d.out"].marked and not bars[LONG_OPERATOR].marked
    assert re.fullmatch(r"[\d,]+ \(\d+\.\d%\)", bars[LONG_OPERATOR].text)
    assert "instructions" in panel.axis and "execute() total" in chart.notes[0]


def test_the_footprint_chart_has_flash_ram_against_peak_and_static_data():
    flash, ram, static = footprint_with_long_names().panels
    assert flash.title == "flash: 57,682 B"
    assert {g.bars[0].series for g in flash.groups} == {"code", "model data and inputs"}
    blocks = {g.label: g.bars[0] for g in ram.groups}
    assert (blocks["stack"].value, blocks["stack"].inner) == (32_768, 1_920)
    # a peak not known: a size only (drawn light, as the linked size of the others)
    assert blocks["temp pool + Ethos-U scratch"].inner is None
    assert blocks["temp pool + Ethos-U scratch"].text == "304 (peak not known)"
    assert ram.inner == "peak (measured on the target (run))"
    assert [g.label for g in static.groups][0] == "board + protocol"


def test_the_matrix_chart_groups_each_model_by_board_and_profile():
    per_mac, ram = matrix_chart(matrix_rows()).panels
    assert [g.label for g in per_mac.groups] == ["ds_cnn", "mobilenet_v1_025"]
    ds = per_mac.groups[0]
    assert [b.series for b in ds.bars] == ["qemu-an505 speed", "qemu-an505 size",
                                           "qemu-an547 speed", "qemu-an547 size"]
    assert ds.bars[0].value == pytest.approx(2.9)
    failed = per_mac.groups[1].bars[-1]
    assert failed.value is None and failed.text == "pico2-uart speed: MEMORY"
    assert "instructions per MAC" in per_mac.axis and ram.axis == "bytes"
    assert ram.groups[0].bars[0].inner == 27_324


def test_the_bench_chart_holds_every_goal_but_no_time():
    goals = bench_goals()
    chart = bench_chart()
    (panel,) = chart.panels
    assert panel.goal == 1.0
    bars = {g.label: g.bars[0] for g in panel.groups}
    code = bars["int8 mlp_mnist M33 size: code ≤ 20 KiB"]
    assert code.value == pytest.approx(19_800 / 20_480) and code.series == "met"
    assert code.text == "19.3 KiB (goal ≤ 20.0 KiB)"
    fp32 = bars["fp32 mlp_mnist M33 size: code ≤ 40 KiB"]
    assert fp32.series == "missed" and fp32.value > 1
    faster = bars["fp32 mlp_mnist M33: speed ≥ 20x fewer instructions than reference"]
    assert faster.value == pytest.approx(20 / 25) and faster.text.startswith("25.00x (goal ≥")
    assert bars["int8 mlp_mnist M33 size: static RAM ≤ 8 KiB and ≤ 1.1x need (RAM / need)"] \
        .text == "1.07x (goal ≤ 1.10x)"
    # Build times stay out of the chart (bench.json keeps them).
    assert not any("rebuild" in label or "cold" in label for label in bars)
    assert any(g["goal"] == "weight-only rebuild <= 5 s" and g["checks"] for g in goals)
    assert bars["int8 mlp_mnist pico2-uart size: static RAM ≤ 8 KiB, code ≤ 24 KiB"].value \
        is None


def test_a_grid_writes_each_count_in_its_cell_and_refuses_a_misshapen_one():
    assert charts.render(confusion()) == charts.render(confusion())  # the same bytes
    names = ("cat", "dog", "emu")
    grid = charts.Grid("g", names, names, ((11, 0, 1_234), (0, 22, 0), (5, 0, 33)), "true",
                       "predicted")
    svg = charts.render(charts.Chart("t", (grid,)))
    # a text per non-zero cell (a text group's comment holds its string), none for a 0
    for count in ("11", "1,234", "22", "5", "33"):
        assert svg.count(f"<!-- {count} -->") == 1, count
    assert "<!-- 0 -->" not in svg
    with pytest.raises(ValueError, match="labels for counts of another shape"):
        charts.Grid("g", ("a", "b"), ("a", "b"), ((1, 2),), "true", "predicted")


# ---- the SVG --------------------------------------------------------------------------------

def test_the_same_data_gives_the_same_bytes():
    chart = footprint_with_long_names()
    first = charts.render(chart)
    # A user's settings do not leak in.
    with matplotlib.rc_context({"font.size": 20, "svg.fonttype": "none"}):
        assert charts.render(chart) == first
    assert "<text" not in first  # glyph paths: no font needed to view it
    assert "Date" not in first and "<dc:date>" not in first


def test_the_font_is_the_one_matplotlib_ships():
    from matplotlib.font_manager import FontProperties, findfont

    found = Path(findfont(FontProperties(family=charts.FONT), fallback_to_default=False))
    assert found.is_relative_to(Path(matplotlib.get_data_path()))


def test_write_keeps_an_unchanged_chart(tmp_path):
    chart = charts.Chart("t", (charts.Panel("p", "bytes", (charts.Group(
        "a", (charts.Bar(1.0),)),)),))
    path = charts.write(chart, tmp_path / "c.svg")
    mtime = path.stat().st_mtime_ns
    charts.write(chart, path)
    assert path.stat().st_mtime_ns == mtime and path.read_text().startswith("<?xml")


def test_the_package_writes_no_svg_by_hand():
    """The charts go through util/charts.py: no SVG markup in deploykit's code or the bench."""
    sources = [*(REPO / "tools" / "deploykit").rglob("*.py"), REPO / "bench" / "run"]
    found = [f"{p.relative_to(REPO)}: {m.group(0)}" for p in sources
             for m in re.finditer(r"<(svg|rect|text)[\s>]|www\.w3\.org/2000/svg",
                                  p.read_text())]
    assert found == []


# ---- drawn in a browser -----------------------------------------------------------------------

MEASURE = """(() => {
  const canvas = document.documentElement.getBoundingClientRect();
  const texts = [...document.querySelectorAll('g[id^="text_"]')].map(g => {
    const note = [...g.childNodes].find(n => n.nodeType === Node.COMMENT_NODE);
    const r = g.getBoundingClientRect();
    return {text: note ? note.nodeValue.trim() : '', box: [r.left, r.top, r.right, r.bottom]};
  });
  return {canvas: [canvas.left, canvas.top, canvas.right, canvas.bottom], texts};
})()"""


@pytest.fixture(scope="module")
def browser() -> Iterator[chromium.Browser]:
    if chromium.CHROMIUM is None:
        pytest.skip(chromium.SKIP_REASON)
    with chromium.Browser() as b:
        yield b


def drawn_texts(browser: chromium.Browser, svg: Path) -> dict[str, Any]:
    browser.goto(svg.as_uri())
    browser.wait_for("document.readyState === 'complete' && "
                     "document.documentElement.tagName === 'svg'", 30)
    return browser.evaluate(MEASURE)


def _overlap(a: list[float], b: list[float]) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return w * h if w > 0 and h > 0 else 0.0


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_text_is_whole_inside_the_canvas(kind, browser, tmp_path):
    chart = KINDS[kind]()
    svg = charts.write(chart, tmp_path / f"{kind}.svg")
    drawn = drawn_texts(browser, svg)
    left, top, right, bottom = drawn["canvas"]
    texts = drawn["texts"]
    assert texts, "no text drawn"
    outside = [t for t in texts if not (left <= t["box"][0] and t["box"][2] <= right
                                        and top <= t["box"][1] and t["box"][3] <= bottom)]
    assert outside == [], f"texts cut at the canvas {drawn['canvas']}: {outside}"
    # Each label is drawn, in one piece (notes are wrapped into lines: each line is drawn).
    shown = {t["text"] for t in texts}
    wrapped = set(chart.notes)
    # (the comment that names a text group is escaped as XML)
    missing = [s for s in labels(chart) - wrapped if html.escape(s, quote=False) not in shown]
    assert missing == []
    for note in wrapped:
        assert all(any(word in s for s in shown) for word in note.split()[:3])
    # No text covers another one (a value over a legend, tick labels run together).
    covered = [(a["text"], b["text"]) for i, a in enumerate(texts) for b in texts[i + 1:]
               if _overlap(a["box"], b["box"]) > 1.0]
    assert covered == []


def test_the_readme_chart_is_whole(browser):
    """docs/images/profile.svg (deploykit's profile of the int8 transformer block on
    qemu-an547), which the README shows."""
    svg = REPO / "docs" / "images" / "profile.svg"
    assert "(docs/images/profile.svg)" in (REPO / "README.md").read_text()
    text = svg.read_text()
    # No path of the machine that drew it: the checkout, the temporary directory, the home.
    for machine_path in (str(REPO), tempfile.gettempdir(), str(Path.home())):
        assert machine_path not in text, machine_path
    drawn = drawn_texts(browser, svg)
    left, top, right, bottom = drawn["canvas"]
    texts = drawn["texts"]
    assert any(t["text"] == "cortex_m::quantized_batch_matmul.out" for t in texts)
    assert all(left <= t["box"][0] and t["box"][2] <= right and top <= t["box"][1]
               and t["box"][3] <= bottom for t in texts)


def test_a_60_character_operator_name_and_its_share_are_drawn_whole(browser, tmp_path):
    svg = charts.write(profile_with_long_names(), tmp_path / "profile.svg")
    drawn = drawn_texts(browser, svg)
    left, _top, right, _bottom = drawn["canvas"]
    by_text = {t["text"]: t["box"] for t in drawn["texts"]}
    name = by_text[LONG_OPERATOR]
    assert left <= name[0] < name[2] <= right
    # 60 glyphs of a 9 pt font: far wider than the 330 px the hand-written chart allowed
    assert name[2] - name[0] > 250
    share = next(box for text, box in by_text.items() if re.fullmatch(r"[\d,]+ \(\d+\.\d%\)",
                                                                      text))
    assert share[2] <= right and share[0] > name[2]
