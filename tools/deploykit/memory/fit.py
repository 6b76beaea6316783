"""`deploykit build --fit`: measure the model's memory on the target once, then link it exactly.

1. Build with generous pools (`measurement_sizing`) and run once on the board's runner (the
   simulator for QEMU/FVP boards). The runner's counting allocators and the painted stack
   report each high-water mark in the `memory` record (docs/protocol.md).
2. Size each pool and the stack at its peak plus a small margin (`fitted_*`, below) and
   rebuild. The stack and heap sizes are a per-build override of the board file's defaults,
   rendered into the generated board_config.h / memory.ld (the board file is unchanged).
3. Store the measurement in `<out>/fit.json`, keyed by the `.pte`'s SHA-256 and the runtime
   build options (`fit_options`), so later plans and builds of the same model on the same
   runtime are exact without running again.

Margins (docs/memory.md):
- method and temp pools: peak + peak/16, rounded up to 16 B. The method pool's use is a
  deterministic function of the `.pte` and the runtime; the temp pool's too for the kernels
  here. The margin absorbs alignment differences, not growth.
- stack: peak + max(256 B, peak/8), rounded up to 16 B. The painted-stack peak is one run's:
  an interrupt (SysTick) that lands at the deepest call adds its exception frame with FP
  context (104 B) and its handler's frame, which this run may not have seen.
- heap: 0 when nothing called malloc (the runner does not); else as the stack.
- planned buffers: exact from the `.pte`, no margin.

A run's peaks are then checked (`check_peaks`): a peak above its capacity fails the run (the
device already refuses such an allocation with an error record and done status 3); a capacity
more than 25% (and more than 64 B) above its peak is a warning.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploykit.memory.plan import Sizing, align, estimate_pools
from deploykit.program.inspect import ProgramInfo
from deploykit.readers.boards import Board, repo_root
from deploykit.util.errors import MemoryPlanError
from deploykit.util.fsutil import write_atomic
from deploykit.util.process import tool_version
from deploykit.util.version import deploykit_version

if TYPE_CHECKING:
    from deploykit.families.base import BoardFamily
    from deploykit.pipeline.target import Target

FIT_FILE = "fit.json"
FIT_VERSION = 1
POOL_MARGIN_DIVISOR = 16
STACK_MARGIN_DIVISOR = 8
STACK_MARGIN_MIN = 256
WARN_RATIO = 1.25
WARN_MIN_EXCESS = 64
# Generous pools for the measurement run: this many times the estimate, at least this much.
MEASURE_FACTOR = 4
MEASURE_MIN = 64 * 1024
MEASURE_ATTEMPTS = 3
# The pools a measurement run doubles when the device reports them too small (the planned
# buffers' sizes come from the .pte, not from a guess).
MEASURED_POOLS = ("method_pool", "temp_pool")
POOLS = ("method_pool", "temp_pool", "planned_pool", "stack", "heap")


def fitted_pool(peak: int) -> int:
    """Method or temp pool for a measured peak: peak + peak/16, 16-byte aligned."""
    return align(peak + peak // POOL_MARGIN_DIVISOR) if peak > 0 else 0


def fitted_stack(peak: int) -> int:
    """Stack for a measured peak: peak + max(256 B, peak/8), 16-byte aligned."""
    return align(peak + max(STACK_MARGIN_MIN, peak // STACK_MARGIN_DIVISOR))


def fitted_heap(peak: int) -> int:
    """Heap for a measured peak: none when unused, else as the stack."""
    return fitted_stack(peak) if peak > 0 else 0


MARGINS = {
    "method_pool": "peak + peak/16, 16 B aligned",
    "temp_pool": "peak + peak/16, 16 B aligned",
    "stack": f"peak + max({STACK_MARGIN_MIN} B, peak/8), 16 B aligned",
    "heap": f"0 when unused, else peak + max({STACK_MARGIN_MIN} B, peak/8)",
    "planned_pool": "exact (from the .pte)",
}


@dataclass(frozen=True)
class FitRecord:
    """One measurement of a model on a runtime, and the sizes fitted from it."""

    key: str
    board: str
    flow: str
    options: dict[str, Any]  # what the key is the hash of
    peaks: dict[str, int]  # high-water marks: method_pool, temp_pool, planned_pool, stack, heap
    measured_with: dict[str, int]  # the capacities of the measurement run
    fitted: dict[str, int]  # method_pool, temp_pool, stack, heap
    et_runtime: str = ""  # the runtime cache key the measured firmware reported (hello)
    inputs_sha256: str = ""
    margins: dict[str, str] = field(default_factory=lambda: dict(MARGINS))
    # Where the peaks come from: "" or "measured on <board>" (the board itself), or
    # "measured on <proxy> (proxy: ...)" (run/proxy.py), and the stack the board's own runtime
    # adds beyond the proxy's peak (its `proxy.extra_stack`, in the fitted stack).
    measured_on: str = ""
    extra_stack: int = 0
    parity: str = ""  # the measurement run's outputs against the host reference

    @property
    def source(self) -> str:
        """What the memory table says about these peaks."""
        where = self.measured_on or "measured on the target"
        return where + (f", stack + {self.extra_stack:,} B for {self.board}'s own runtime"
                        if self.extra_stack else "")

    def sizing(self) -> Sizing:
        f = self.fitted
        return Sizing(method_pool=f["method_pool"], temp_pool=f["temp_pool"],
                      stack=f["stack"], heap=f["heap"], source="fit", peaks=dict(self.peaks),
                      note=self.measured_on if "proxy" in self.measured_on else "",
                      extra_stack=self.extra_stack)

    @property
    def need(self) -> int:
        """Measured RAM need of the reserved blocks: every pool's, the stack's and the heap's
        peak."""
        return sum(self.peaks.get(k, 0) for k in POOLS)


@functools.cache
def _compiler_version(prefix: str = "arm-none-eabi-") -> str:
    gcc = f"{prefix}gcc"
    if shutil.which(gcc) is None:
        # No toolchain (plan before anything is built): no measurement can have been made
        # with this key, so none is used; the build stage then names the missing compiler.
        return "none"
    return tool_version([gcc, "-dumpfullversion"], "the key of stored memory measurements")


def _executorch_version() -> str:
    try:
        from executorch.version import git_version

        return str(git_version)
    except ImportError:
        return "unknown"


def firmware_sources_hash(family: BoardFamily, root: Path | None = None) -> str:
    """SHA-256 over the deploykit sources a runner firmware of board family `family` is built
    from: the runner, the protocol encoder, the family's own firmware directories and the
    board API files they share, the firmware CMake project, the toolchain file and the
    runtime build scripts, and deploykit's own kernels (firmware/kernels). A change there
    re-measures; the selftest and other families do not count."""
    root = root or repo_root()
    fw = root / "firmware"
    paths = [*(fw / "boards").glob("*.*"), fw / "CMakeLists.txt"]
    for tree in (fw / "runner", fw / "protocol", fw / "kernels",
                 *(fw / d for d in family.firmware_dirs), root / "cmake"):
        paths += tree.rglob("*")
    h = hashlib.sha256()
    for p in sorted(set(paths)):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(root)).encode() + b"\0")
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()[:16]


def fit_options(program: ProgramInfo, target: Target,
                build_options: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What a measurement depends on: the .pte, the runtime (ExecuTorch version, compiler,
    CPU flags, the build profile's CMake options: build type, logging, LTO, ...), deploykit's
    firmware sources and the templates of the files it generates for them, and deploykit's
    version (a record another deploykit wrote into a shared output directory is not used).
    Paths are not in it: the same model and runtime measure the same in any output
    directory."""
    board = target.board
    return {"pte_sha256": program.sha256, "executorch": _executorch_version(),
            "compiler": _compiler_version(), "cpu_flags": board.cpu_flags,
            "family": board.family, "build_options": dict(sorted((build_options or {}).items())),
            "firmware_sources": firmware_sources_hash(target.family),
            "templates": templates_hash(), "deploykit": deploykit_version(),
            **_proxy_options(target)}


def templates_hash() -> str:
    """SHA-256 over the templates the firmware's generated files are rendered from (linker
    script, board and model configuration, the embedded program)."""
    templates = Path(__file__).parents[1] / "build" / "templates"
    h = hashlib.sha256()
    for p in sorted(templates.rglob("*.j2")):
        h.update(str(p.relative_to(templates)).encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()[:16]


def _proxy_options(target: Target) -> dict[str, Any]:
    """A board with a proxy (run/proxy.py) may be measured there: the proxy's name, the stack
    added for the board's own runtime and the proxy family's firmware sources are in the key
    too."""
    proxy = target.proxy
    if proxy is None:
        return {}
    return {"proxy": {"board": proxy.board.name, "extra_stack": proxy.extra_stack,
                      "firmware_sources": firmware_sources_hash(proxy.family)}}


def fit_key(options: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()[:16]


def _ignore(_message: str) -> None:
    pass


def _read_fits(out: Path, warn: Callable[[str], None]) -> dict[str, Any]:
    """The entries of `<out>/fit.json` ({} when there is none). A file that exists but cannot
    be read or parsed is said through `warn`, naming it: the build then runs on estimates, and
    "never measured" must not pass for "measured, and the record lost"."""
    path = out / FIT_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        warn(f"{path} cannot be read ({exc}); its measurements are not used (estimates "
             "instead)")
        return {}
    try:
        data = json.loads(text)
        entries = data.get("entries", {}) if data.get("version") == FIT_VERSION else {}
        if not isinstance(entries, dict):
            raise ValueError(f"'entries' is a {type(entries).__name__}, not an object")
    except (ValueError, AttributeError) as exc:
        warn(f"{path} is damaged ({exc}); its measurements are not used (estimates instead), "
             "and the next `build --fit` replaces it")
        return {}
    return entries


def load_fit(out: Path, key: str, warn: Callable[[str], None] = _ignore) -> FitRecord | None:
    """The measurement stored under `key` in `<out>/fit.json`, if any; a damaged file or
    entry is said through `warn`."""
    entry = _read_fits(out, warn).get(key)
    if not entry:
        return None
    try:
        return FitRecord(**{f.name: entry[f.name] for f in dataclasses.fields(FitRecord)
                            if f.name in entry})
    except (TypeError, KeyError) as exc:
        warn(f"{out / FIT_FILE}: the entry {key} is damaged ({exc!r}); not used (estimates "
             "instead), and the next `build --fit` replaces it")
        return None


def stale_fits(out: Path, pte_sha256: str, key: str) -> list[FitRecord]:
    """Measurements of the same .pte under another key (another runtime, compiler or firmware
    source): not used, but worth saying that --fit would refresh them."""
    return [r for k in _read_fits(out, _ignore) if k != key
            for r in [load_fit(out, k)] if r is not None
            and r.options.get("pte_sha256") == pte_sha256]


def save_fit(out: Path, record: FitRecord, keep: int = 8) -> Path:
    """Add `record` to `<out>/fit.json` (the newest `keep` entries stay)."""
    path = out / FIT_FILE
    try:
        data = json.loads(path.read_text())
        entries = data.get("entries", {}) if data.get("version") == FIT_VERSION else {}
    except (OSError, ValueError):
        entries = {}
    entries.pop(record.key, None)
    entries[record.key] = dataclasses.asdict(record)
    entries = dict(list(entries.items())[-keep:])
    write_atomic(path, json.dumps({"version": FIT_VERSION, "entries": entries}, indent=2)
                 + "\n")
    return path


def measurement_sizing(board: Board, program: ProgramInfo, headroom: int) -> Sizing:
    """Generous pools for the measurement run: 4x the estimate, at least 64 KiB each, but
    together within half of the pools region's headroom under the estimated plan. The board's
    stack and heap stay."""
    method, temp, _, _ = estimate_pools(program)
    want_m = max(MEASURE_FACTOR * method, MEASURE_MIN)
    want_t = max(MEASURE_FACTOR * temp, MEASURE_MIN)
    spare = max(headroom // 2, 0)
    extra = want_m + want_t - method - temp
    if extra > spare:
        scale = spare / extra if extra else 0.0
        want_m = method + int((want_m - method) * scale)
        want_t = temp + int((want_t - temp) * scale)
    return Sizing(method_pool=align(want_m), temp_pool=align(want_t), source="given")


def record_from_run(key: str, options: Mapping[str, Any], board: Board, flow: str,
                    memory: Mapping[str, tuple[int, int]],
                    hello: Mapping[str, str] | None, *, measured_on: str = "",
                    extra_stack: int = 0) -> FitRecord:
    """The record of one successful measurement run. `extra_stack` (a proxy's) is added to the
    fitted stack, after the margin."""
    missing = [k for k in POOLS if k not in memory]
    if missing:
        raise MemoryPlanError(
            f"The measurement run reported no {', '.join(missing)} in its memory record.",
            "The runner firmware reports method_pool, temp_pool, planned_pool, stack and heap "
            "(docs/protocol.md); rebuild it from this checkout.")
    peaks = {k: int(memory[k][0]) for k in POOLS}
    fitted = {"method_pool": fitted_pool(peaks["method_pool"]),
              "temp_pool": fitted_pool(peaks["temp_pool"]),
              "stack": fitted_stack(peaks["stack"]) + align(extra_stack),
              "heap": fitted_heap(peaks["heap"])}
    hello = hello or {}
    return FitRecord(key=key, board=board.name, flow=flow, options=dict(options), peaks=peaks,
                     measured_with={k: int(memory[k][1]) for k in POOLS}, fitted=fitted,
                     et_runtime=hello.get("et_runtime", ""),
                     inputs_sha256=hello.get("inputs_sha256", ""), measured_on=measured_on,
                     extra_stack=align(extra_stack))


@dataclass(frozen=True)
class MeasureAttempt:
    """What one measurement run returned: the memory record, the hello fields, and the
    failure (None when the run passed)."""

    memory: Mapping[str, tuple[int, int]]
    hello: Mapping[str, str] | None
    failure: str | None = None  # the cause, when the run failed
    pool_too_small: str | None = None  # the pool the device named (done status 3)
    parity: str = ""  # the run's outputs against the host reference, when it passed


def measure(board: Board, program: ProgramInfo, flow: str, key: str,
            options: Mapping[str, Any], sizing: Sizing,
            build_and_run: Callable[[Sizing], MeasureAttempt],
            progress: Callable[[str], None], *, run_board: Board | None = None,
            measured_on: str = "", extra_stack: int = 0) -> FitRecord:
    """Run with `sizing` (doubling a pool the device says is too small, up to 3 runs) and
    return the record of the first successful run. `run_board` is the board the measurement
    runs on when it is not `board` (a proxy, run/proxy.py)."""
    runs_on = run_board or board
    for attempt in range(1, MEASURE_ATTEMPTS + 1):
        progress(f"measuring on the target (run {attempt}): method pool "
                 f"{sizing.method_pool:,} B, temp pool {sizing.temp_pool:,} B, stack "
                 f"{runs_on.stack_size:,} B, heap {runs_on.heap_size:,} B")
        result = build_and_run(sizing)
        if result.failure is None:
            record = record_from_run(key, options, board, flow, result.memory, result.hello,
                                     measured_on=measured_on, extra_stack=extra_stack)
            return dataclasses.replace(record, parity=result.parity)
        pool = result.pool_too_small
        if pool in MEASURED_POOLS and attempt < MEASURE_ATTEMPTS:
            sizing = dataclasses.replace(sizing, **{pool: 2 * getattr(sizing, pool)})
            continue
        raise MemoryPlanError(f"The measurement run failed: {result.failure}",
                              "Fix the run first (deploykit run without --fit shows it); "
                              "--fit measures a run that passes.")
    raise AssertionError("unreachable")


def check_peaks(memory: Mapping[str, tuple[int, int]]) -> tuple[list[str], list[str]]:
    """(failures, warnings) of a run's memory record: a peak above its capacity fails; a
    capacity more than 25% (and 64 B) above its peak warns."""
    failures, warnings = [], []
    for name in POOLS:
        if name not in memory:
            continue
        used, capacity = memory[name]
        if used > capacity:
            failures.append(f"{name} peak {used:,} B exceeds its {capacity:,} B")
        elif capacity > WARN_RATIO * used and capacity - used > WARN_MIN_EXCESS:
            ratio = f"{capacity / used:.1f}x" if used else "unused"
            warnings.append(f"{name} is {capacity:,} B, its peak {used:,} B ({ratio}): "
                            "deploykit build --fit links it at peak + margin")
    return failures, warnings


