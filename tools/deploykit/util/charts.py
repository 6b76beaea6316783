"""Every chart deploykit writes (profile.svg, footprint.svg, matrix.svg, the bench's chart), drawn
with matplotlib's SVG backend from plain data: labels, values, series, goal lines, units.

Why a plotting library: the charts used to be SVG strings whose widths came from a character
count, so any label longer than the guess was cut. Here every text is measured with the font
it is drawn in, and the layout follows from the measurements:

- the value written at the end of a bar is kept inside its axes (the axis is lengthened until
  the widest one fits, and the axes widened when a text would take more than half of them);
- a legend sits to the right of its axes, which are made at least as tall as it;
- the space above and below each axes (titles, tick labels, the axis label) is measured;
- the file is cut to the extent of everything drawn (`bbox_inches="tight"`), so a long label
  widens the picture instead of leaving it.

Reproducible: the same data gives the same bytes (no date in the metadata, a fixed hash salt
for matplotlib's ids, matplotlib's built-in defaults instead of a user's matplotlibrc, and
DejaVu Sans, the font matplotlib ships, written as paths, so a viewer needs no font and draws
the glyphs that were measured). Another matplotlib version may write other bytes.

A chart is a `Chart` of panels stacked top to bottom. A `Panel` is horizontal bars in groups:
one bar per group (a plain bar chart: a profile's operators), or several (a grouped bar chart:
one bar per board and profile for each model), each bar in the colour of its series, with the
series in a legend. A bar may carry a second value drawn inside it (a RAM block's peak inside
its linked size), may be hatched (an operator in a float island), or may have no value (a
combination that did not run: its text is written instead). A panel may draw a goal as a line.
A `Grid` is a matrix of counts, one cell per row and column (a confusion matrix: true class by
predicted class), each cell shaded by its share of its row, the diagonal in one colour and the
rest in another, with its count written in it; column labels wider than a cell stand upright.

matplotlib is imported on first use only: `import deploykit` stays fast.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploykit.util.errors import EnvironmentProblem
from deploykit.util.fsutil import write_if_changed

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.legend import Legend
    from matplotlib.text import Text

# The lowest matplotlib this module is written against (pyproject.toml pins the same).
MATPLOTLIB_MIN = "3.8"
MISSING_HINT = ("scripts/install again (matplotlib is one of deploykit's dependencies), or "
                f"pip install 'matplotlib>={MATPLOTLIB_MIN}'")

# Colours of series in order of appearance (Tableau 10: told apart by most colour-blind
# readers too), and what a chart draws besides its series.
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac")
MISSING_COLOUR = "#7f7f7f"
GOAL_COLOUR = "#333333"
OUTER_ALPHA = 0.35  # a bar with an inner value: the outer bar in a light shade of its colour

FONT = "DejaVu Sans"
TITLE_SIZE, PANEL_TITLE_SIZE, TICK_SIZE, TEXT_SIZE = 12.0, 10.0, 9.0, 8.0

# Geometry, in points (the figure's dpi is 72: one pixel is one point, as in the SVG).
DPI = 72
SLOT = 16.0  # one bar's row
GROUP_GAP = 0.6  # between groups of several bars, in rows
AXES_WIDTH = 400.0  # the bars' length at the longest; grows for wide value texts
TEXT_PAD = 4.0  # between a bar's end and its text
GAP = 14.0  # between two panels, and around the title and the notes
CELL = 24.0  # a grid's cell, square
GRID_DIAGONAL, GRID_OFF = "#59a14f", "#e15759"  # a grid's diagonal cells, the others
GRID_LIGHTEST = 0.25  # the shade of a cell of the least count above 0 (1: the full colour)
NOTE_WIDTH = 110  # characters a note line is wrapped at (a wrap, not a fit: nothing is cut)

_RC = {
    "svg.fonttype": "path",
    "svg.hashsalt": "deploykit",
    "font.family": [FONT],
    "font.size": TICK_SIZE,
    "axes.titlesize": PANEL_TITLE_SIZE,
    "axes.titleweight": "bold",
    "axes.labelsize": TICK_SIZE,
    "xtick.labelsize": TICK_SIZE,
    "ytick.labelsize": TICK_SIZE,
    "legend.fontsize": TEXT_SIZE,
    "hatch.linewidth": 0.8,
}
_METADATA = {"Date": None, "Creator": "deploykit"}
_TEXT_GROUND = {"boxstyle": "square,pad=0.15", "facecolor": "white", "edgecolor": "none"}


@dataclass(frozen=True)
class Bar:
    """One bar. `value` None: nothing ran; `text` is written where the bar would start."""

    value: float | None
    series: str = ""  # its colour and legend entry ("" with one series: no legend)
    text: str = ""  # written after the bar's end; "" writes the value
    inner: float | None = None  # a second value drawn inside the bar (a peak in a size)
    marked: bool = False  # hatched, with the panel's `marked` legend entry


@dataclass(frozen=True)
class Group:
    """The bars of one label (a model's bars, one per board and profile), top to bottom."""

    label: str
    bars: tuple[Bar, ...]


@dataclass(frozen=True)
class Panel:
    title: str
    axis: str  # the value axis's label, with its unit
    groups: tuple[Group, ...]
    # series -> colour, in legend order; a series not named here takes the next colour of
    # PALETTE that is not used here
    colours: tuple[tuple[str, str], ...] = ()
    outer: str = ""  # legend entries of the two values of bars with an inner one
    inner: str = ""
    marked: str = ""  # legend entry of the hatched bars
    goal: float | None = None  # drawn as a dashed line across the panel
    goal_label: str = "goal"
    integers: bool = True  # ticks as 12,345 (else as 1.5)
    empty: str = "nothing to show"  # written in a panel without groups


@dataclass(frozen=True)
class Grid:
    """A matrix of counts: `counts[i][j]` in the cell of row i (top to bottom) and column j
    (left to right). A confusion matrix: rows are the true classes, columns the predicted."""

    title: str
    rows: tuple[str, ...]  # row labels
    columns: tuple[str, ...]  # column labels
    counts: tuple[tuple[int, ...], ...]
    row_axis: str  # the rows' axis label ("true class")
    column_axis: str  # the columns' ("predicted class")

    def __post_init__(self) -> None:
        if len(self.counts) != len(self.rows) or any(len(r) != len(self.columns)
                                                     for r in self.counts):
            raise ValueError(f"grid '{self.title}': {len(self.rows)} x {len(self.columns)} "
                             "labels for counts of another shape")


@dataclass(frozen=True)
class Chart:
    title: str
    panels: tuple[Panel | Grid, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)  # lines under the panels


# ---- public ----------------------------------------------------------------------------------

def render(chart: Chart) -> str:
    """The chart as an SVG document (the same bytes for the same chart). matplotlib's settings
    are global: one chart at a time per process (the matrix's workers are processes)."""
    with _matplotlib():
        fig = _draw(chart)
        out = io.BytesIO()
        fig.savefig(out, format="svg", bbox_inches="tight", pad_inches=0.1,
                    metadata=_METADATA, facecolor="white")
    return out.getvalue().decode()


def write(chart: Chart, path: Path) -> Path:
    """Write the chart to `path` whole (temp file + rename), unless it already holds it: an
    unchanged chart keeps its mtime."""
    write_if_changed(path, render(chart))
    return path


def _bar_text(value: float, integers: bool = True) -> str:
    return f"{value:,.0f}" if integers else f"{value:,.3g}"


# ---- drawing ---------------------------------------------------------------------------------

@contextmanager
def _matplotlib() -> Iterator[None]:
    """matplotlib with deploykit's settings on its own defaults (a user's matplotlibrc or
    style would change the bytes), restored afterwards."""
    try:
        import matplotlib
        from matplotlib.backends.backend_svg import FigureCanvasSVG  # noqa: F401
    except ImportError as exc:
        raise EnvironmentProblem(f"matplotlib is not installed: deploykit draws its charts "
                                 f"with it ({exc})", MISSING_HINT) from exc
    with matplotlib.rc_context():
        matplotlib.rcdefaults()
        matplotlib.rcParams.update(_RC)
        yield


@dataclass
class _Drawn:
    """One panel as drawn, with what its layout needs."""

    panel: Panel | Grid
    ax: Axes
    rows: float  # the y extent, in rows
    texts: list[tuple[Text, float]]  # each value text and the x it starts from (bars)
    legend: Legend | None
    top: float = 0.0  # measured: points above the axes (title)
    bottom: float = 0.0  # points below the axes (ticks, axis label)
    height: float = 0.0  # of the axes
    width: float = 0.0  # of the axes: the bars' common width, or a grid's columns

    @property
    def bars(self) -> bool:
        return isinstance(self.panel, Panel)


def _draw(chart: Chart) -> Figure:
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 6), dpi=DPI)
    FigureCanvasSVG(fig)
    title = fig.text(0, 1, chart.title, fontsize=TITLE_SIZE, fontweight="bold", va="top")
    notes = [fig.text(0, 0, line, fontsize=TEXT_SIZE, va="top", color="#444444")
             for note in chart.notes for line in textwrap.wrap(note, NOTE_WIDTH) or [""]]
    drawn = [_draw_panel(fig, p) if isinstance(p, Panel) else _draw_grid(fig, p)
             for p in chart.panels]
    # Measure (the texts' sizes do not depend on where they are), then lay out.
    fig.draw_without_rendering()
    width = AXES_WIDTH
    for d in drawn:
        for text, _x in d.texts if d.bars else ():
            width = max(width, 2 * (text.get_window_extent().width + TEXT_PAD))
    for d in drawn:
        if isinstance(d.panel, Grid):
            _upright_wide_columns(d)
            fig.draw_without_rendering()
    for d in drawn:
        axbox = d.ax.get_window_extent()
        d.top = d.ax.title.get_window_extent().y1 - axbox.y1 if d.panel.title else 0.0
        ticks = d.ax.xaxis.get_tightbbox()
        d.bottom = axbox.y0 - ticks.y0 if ticks is not None else 0.0
        if d.bars:
            legend_h = d.legend.get_window_extent().height if d.legend is not None else 0.0
            d.height = max(d.rows * SLOT, legend_h, 2 * SLOT)
            d.width = width
            _fit_value_axis(d, width)
        else:
            d.height, d.width = d.rows * CELL, len(_grid(d).columns) * CELL
    label_boxes = [d.ax.yaxis.get_tightbbox() for d in drawn]
    left = max((b.width for b in label_boxes if b is not None), default=0.0) + GAP
    right = max((d.legend.get_window_extent().width for d in drawn if d.legend is not None),
                default=0.0) + 2 * GAP
    title_h = title.get_window_extent().height
    notes_h = sum(n.get_window_extent().height * 1.25 for n in notes)
    height = (GAP + title_h + GAP + sum(d.top + d.height + d.bottom + GAP for d in drawn)
              + notes_h + GAP)
    # A grid's title or column labels may be wider than its cells (and than the bars).
    grids = [d for d in drawn if not d.bars]
    content = max([d.width for d in grids]
                  + [d.ax.title.get_window_extent().width for d in grids if d.panel.title]
                  + [_width_of(d.ax.xaxis.get_tightbbox()) for d in grids], default=0.0)
    fig_w = left + max(width, content) + right
    fig.set_size_inches(fig_w / DPI, height / DPI)
    # Top down, in points from the bottom of the figure.
    y = height - GAP
    title.set_position((GAP / fig_w, y / height))
    y -= title_h + GAP
    for d in drawn:
        y -= d.top + d.height
        d.ax.set_position((left / fig_w, y / height, d.width / fig_w, d.height / height))
        y -= d.bottom + GAP
        if d.bars:
            _thin_ticks(d, width)
    for n in notes:
        n.set_position((GAP / fig_w, y / height))
        y -= n.get_window_extent().height * 1.25
    return fig


def _colours(panel: Panel) -> dict[str, str]:
    colours = dict(panel.colours)
    free = [c for c in PALETTE if c not in colours.values()] or list(PALETTE)
    for group in panel.groups:
        for bar in group.bars:
            if bar.series not in colours:
                colours[bar.series] = free[(len(colours) - len(panel.colours)) % len(free)]
    return colours


def _draw_panel(fig: Figure, panel: Panel) -> _Drawn:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ax = fig.add_axes((0.1, 0.1, 0.8, 0.8))
    colours = _colours(panel)
    texts: list[tuple[Text, float]] = []
    ticks, labels = [], []
    y = 0.0
    grouped = any(len(g.bars) > 1 for g in panel.groups)
    # In a panel of sizes against peaks, a bar whose peak is not known is drawn as a size only
    # (light), not as a full bar that would read as all of it used.
    with_inner = any(b.inner is not None for g in panel.groups for b in g.bars)
    for gi, group in enumerate(panel.groups):
        if gi and grouped:
            y += GROUP_GAP
        ticks.append(y + (len(group.bars) - 1) / 2)
        labels.append(group.label)
        for bar in group.bars:
            colour = colours[bar.series]
            if bar.value is None:
                t = ax.text(0, y, bar.text or "no value", va="center", ha="left",
                            fontsize=TEXT_SIZE, color=MISSING_COLOUR, fontstyle="italic")
                texts.append((t, 0.0))
                y += 1
                continue
            hatch = "////" if bar.marked else None
            if with_inner:
                ax.barh(y, bar.value, height=0.8, color=colour, alpha=OUTER_ALPHA,
                        edgecolor=colour, linewidth=0.6)
                if bar.inner is not None:
                    ax.barh(y, bar.inner, height=0.45, color=colour, hatch=hatch,
                            edgecolor="#222222" if hatch else colour, linewidth=0)
            else:
                ax.barh(y, bar.value, height=0.8, color=colour, hatch=hatch,
                        edgecolor="#222222" if hatch else colour, linewidth=0)
            end = max(bar.value, bar.inner or 0.0)
            # On a white ground: a goal line or a grid line behind it never crosses the text.
            t = ax.text(end, y, bar.text or _bar_text(bar.value, panel.integers), va="center",
                        ha="left", fontsize=TEXT_SIZE, bbox=_TEXT_GROUND)
            texts.append((t, end))
            y += 1
    rows = max(y, 1.0)
    ax.set_yticks(ticks, labels)
    ax.set_ylim(rows - 0.4, -0.6)  # the first group at the top
    ax.tick_params(axis="y", length=0)
    if not panel.groups:
        ax.set_yticks([])
        ax.text(0.5, 0.5, panel.empty, transform=ax.transAxes, ha="center", va="center",
                fontsize=TICK_SIZE, color=MISSING_COLOUR)
    if panel.title:
        ax.set_title(panel.title, loc="left")
    ax.set_xlabel(panel.axis)
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(axis="x", color="#e0e0e0", linewidth=0.6)
    ax.set_axisbelow(True)
    _format_ticks(ax, panel.integers)
    handles: list[Any] = []
    # The series with a bar drawn (a bar without a value names its series in its text).
    used = {b.series for g in panel.groups for b in g.bars if b.value is not None}
    if len(used) > 1 or (used and "" not in used):
        handles += [Patch(color=c, label=s) for s, c in colours.items() if s in used]
    if with_inner and (panel.outer or panel.inner):
        handles += [Patch(color="#444444", alpha=OUTER_ALPHA, label=panel.outer),
                    Patch(color="#444444", label=panel.inner)]
    if panel.marked and any(b.marked for g in panel.groups for b in g.bars):
        handles.append(Patch(facecolor="white", edgecolor="#222222", hatch="////",
                             label=panel.marked))
    if panel.goal is not None:
        ax.axvline(panel.goal, color=GOAL_COLOUR, linestyle="--", linewidth=1.2)
        handles.append(Line2D([], [], color=GOAL_COLOUR, linestyle="--", label=panel.goal_label))
    legend = None
    if handles:
        # Beside the axes, its top at theirs: it never covers a bar or a text.
        legend = ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                           borderaxespad=0.0, frameon=False)
    return _Drawn(panel, ax, rows, texts, legend)


def _grid(d: _Drawn) -> Grid:
    assert isinstance(d.panel, Grid)
    return d.panel


def _width_of(box: Any) -> float:
    return box.width if box is not None else 0.0


def _draw_grid(fig: Figure, grid: Grid) -> _Drawn:
    """The cells of `grid`, each shaded by its share of its row, a cell of any count at least
    lightly (one error among a hundred still shows), its count written in it; a cell of 0 is
    white and empty."""
    from matplotlib.colors import to_rgb

    ax = fig.add_axes((0.1, 0.1, 0.8, 0.8))
    n_rows, n_cols = len(grid.rows), len(grid.columns)
    for i, row in enumerate(grid.counts):
        total = sum(row)
        for j, count in enumerate(row):
            shade = GRID_LIGHTEST + (1.0 - GRID_LIGHTEST) * count / total if count else 0.0
            base = to_rgb(GRID_DIAGONAL if i == j else GRID_OFF)
            # white at no count, the full colour at all of the row
            colour = tuple(1.0 - shade * (1.0 - c) for c in base)
            ax.add_patch(_cell(j, i, colour))
            if count:
                ax.text(j, i, f"{count:,}", ha="center", va="center", fontsize=TEXT_SIZE,
                        color="white" if shade > 0.6 else "#222222")
    ax.set_xlim(-0.5, n_cols - 0.5)
    ax.set_ylim(n_rows - 0.5, -0.5)  # the first row at the top
    ax.set_xticks(range(n_cols), grid.columns)
    ax.set_yticks(range(n_rows), grid.rows)
    ax.tick_params(length=0)
    ax.set_xlabel(grid.column_axis)
    ax.set_ylabel(grid.row_axis)
    for spine in ax.spines.values():
        spine.set_color("#bbbbbb")
    if grid.title:
        ax.set_title(grid.title, loc="left")
    return _Drawn(grid, ax, float(max(n_rows, 1)), [], None)


def _cell(x: float, y: float, colour: tuple[float, ...]) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x - 0.5, y - 0.5), 1.0, 1.0, facecolor=colour, edgecolor="white",
                     linewidth=1.0)


def _upright_wide_columns(d: _Drawn) -> None:
    """Column labels side by side when each fits its cell, else upright (measured)."""
    widest = max((t.get_window_extent().width for t in d.ax.get_xticklabels()), default=0.0)
    if widest > CELL - 2:
        d.ax.tick_params(axis="x", labelrotation=90)


def _format_ticks(ax: Axes, integers: bool) -> None:
    from matplotlib.ticker import FuncFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(
        lambda v, _pos: f"{v:,.0f}" if integers else f"{v:,.6g}"))


def _fit_value_axis(d: _Drawn, width: float) -> None:
    """The value axis's end, such that every bar's text ends inside the axes: a text of `w`
    points after a bar ending at x needs x / end * width + pad + w <= width."""
    end = max([d.panel.goal or 0.0] + [x for _t, x in d.texts]) or 1.0
    for text, x in d.texts:
        room = width - TEXT_PAD - text.get_window_extent().width  # > width / 2: see _draw
        end = max(end, x * width / room)
    d.ax.set_xlim(0, end * 1.02)
    # The text's offset from the bar's end, in points (a data offset would scale with the axis).
    from matplotlib.transforms import offset_copy

    for text, _x in d.texts:
        text.set_transform(offset_copy(d.ax.transData, fig=d.ax.figure, x=TEXT_PAD,
                                       units="points"))


def _thin_ticks(d: _Drawn, width: float) -> None:
    """As many value ticks as their labels fit side by side: the widest label is measured."""
    from matplotlib.ticker import MaxNLocator

    lo, hi = d.ax.get_xlim()
    fmt = d.ax.xaxis.get_major_formatter()
    widest = max(_text_width(fmt(v, 0)) for v in (lo, hi, (lo + hi) / 2))
    d.ax.xaxis.set_major_locator(MaxNLocator(nbins=max(2, int(width / (widest * 1.8)))))


def _text_width(s: str) -> float:
    """The width of a tick label, in points, as the SVG backend will lay its glyphs out."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import text_to_path

    w, _h, _d = text_to_path.get_text_width_height_descent(
        s, FontProperties(family=FONT, size=TICK_SIZE), ismath=False)
    return w
