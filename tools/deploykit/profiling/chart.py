"""The chart of a profile (profile.svg): the operators by time, largest first, each coloured by
the kernel library it ran on, the operators of float islands hatched (util/charts.py draws it)."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from deploykit.readers.trace import Profile
from deploykit.util import charts

# The kernel libraries (readers/trace.kernel_of) as the legend names them, each with a colour
# of its own in every chart, in legend order. cortex_m's kernels are CMSIS-NN's.
KERNELS = {
    "cortex_m": ("CMSIS-NN (cortex_m)", charts.PALETTE[1]),
    "deploykit": ("deploykit's own", charts.PALETTE[2]),
    "portable": ("portable", charts.PALETTE[0]),
    "delegate": ("delegate", charts.PALETTE[6]),
    "unknown": ("unknown", charts.MISSING_COLOUR),
}


def _kernel(kernel: str) -> str:
    return KERNELS.get(kernel, (kernel, ""))[0]


def profile_chart(profile: Profile, title: str,
                  float_operators: Collection[str] = ()) -> charts.Chart:
    """`float_operators`: the operators that run in a float island (profiling/stage.py)."""
    total = profile.total_ticks or 1.0
    groups = tuple(
        charts.Group(r.operator, (charts.Bar(
            profile.value(r.ticks), _kernel(r.kernel),
            f"{profile.value(r.ticks):,.0f} ({100 * r.ticks / total:.1f}%)",
            marked=r.operator in float_operators),))
        for r in profile.rows)
    rest = profile.total_ticks - profile.operator_ticks
    panel = charts.Panel(
        "operators by time (share of execute())",
        f"{profile.unit}, {profile.iterations} run(s)",
        groups,
        colours=tuple(KERNELS.values()),
        marked="in a float island",
        empty="no operator events",
    )
    notes = (f"execute() total: {profile.value(profile.total_ticks):,.0f} {profile.unit} over "
             f"{profile.iterations} run(s); between operators (the runtime): "
             f"{profile.value(rest):,.0f} ({100 * rest / total:.1f}%)",)
    return charts.Chart(title, (panel,), notes)


def write_svg(profile: Profile, title: str, path: Path,
              float_operators: Collection[str] = ()) -> Path:
    return charts.write(profile_chart(profile, title, float_operators), path)
