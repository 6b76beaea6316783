"""Board files: load, validate against the schema, and expose typed board facts.

A board file in `boards/` is the single source of truth for a board: CPU flags, memory map,
console, timer, allowed export flows and how to run it. Everything else (linker script,
headers, CMake cache, simulator command line) is derived from it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from deploykit.readers.npu import NpuConfig, npu_config
from deploykit.util.errors import ConfigError
from deploykit.util.paths import data_root, search_dirs

PLACEMENT_KINDS = ("vectors", "code", "model", "data", "stack", "heap", "pools")
_SIZE_RE = re.compile(r"^(\d+)([KMG]?)$")
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(value: int | str) -> int:
    """`512K` → 524288; integers pass through (a whole float, as YAML may read `1e6`, too).
    ValueError for anything else."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = _SIZE_RE.match(value.strip()) if isinstance(value, str) else None
    if not m:
        raise ValueError(f"not a size: {value!r}")
    return int(m.group(1)) * _SIZE_UNITS[m.group(2)]


def _board_size(value: Any, where: str, path: Path) -> int:
    """A size of the board file, or a ConfigError naming its place."""
    try:
        size = parse_size(value)
    except ValueError as exc:
        raise ConfigError(f"Board file {path}: {where} is {value!r}, not a size.",
                          "Write a number of bytes, or one with K, M or G (512K).") from exc
    if not 0 <= size < 1 << 32:
        said = f"{size:,} B" if abs(size) < 1 << 64 else "more than 4 GiB"
        raise ConfigError(f"Board file {path}: {where} is {said}.",
                          "A size is between 0 and 4 GiB.")
    return size


@dataclass(frozen=True)
class MemoryRegion:
    name: str
    origin: int
    size: int
    holds: tuple[str, ...]

    @property
    def end(self) -> int:
        return self.origin + self.size


@dataclass(frozen=True)
class Board:
    name: str
    description: str
    family: str
    cpu: dict[str, Any]
    memory: tuple[MemoryRegion, ...]
    placement: dict[str, str]
    stack_size: int
    heap_size: int
    console: dict[str, Any]
    timer: dict[str, Any]
    export: dict[str, Any]
    runner: dict[str, Any]
    path: Path
    # The whole validated file, for optional sections (npu, usb, ...) that typed accessors
    # of their own modules read.
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # The `npu:` section, parsed and checked once when the file is loaded (None: no NPU); a copy
    # with --npu-macs / --npu-memory-mode applied carries the overridden one (readers/npu.py).
    npu: NpuConfig | None = field(default=None, repr=False)

    def region(self, name: str) -> MemoryRegion:
        return next(r for r in self.memory if r.name == name)

    def region_for(self, kind: str) -> MemoryRegion:
        """The region that holds `kind` (code, model, pools, ...) in this board's placement."""
        return self.region(self.placement[kind])

    @property
    def cpu_flags(self) -> list[str]:
        return [*self.cpu["gcc_flags"], *self.cpu.get("extra_cflags", [])]

    def as_template_context(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "family": self.family,
            "cpu": self.cpu,
            "memory": [
                {"name": r.name, "origin": r.origin, "size": r.size, "holds": list(r.holds)}
                for r in self.memory
            ],
            "placement": self.placement,
            "stack_size": self.stack_size,
            "heap_size": self.heap_size,
            "console": self.console,
            "timer": self.timer,
        }


def repo_root() -> Path:
    """Where deploykit's own boards/, firmware/, cmake/, models/ and west.yml are: the checkout,
    or the data bundled in an installed wheel (paths.data_root)."""
    return data_root()


def boards_dir() -> Path:
    """The bundled board files."""
    return data_root() / "boards"


def board_files() -> dict[str, tuple[Path, str]]:
    """Every board name on the search path (--boards-dir, ./boards, bundled; the first one
    found wins) -> (its file, where it came from)."""
    found: dict[str, tuple[Path, str]] = {}
    for d in search_dirs("boards"):
        for p in sorted(d.path.glob("*.yaml")):
            found.setdefault(p.stem, (p, d.origin))
    return found


@cache
def _schema() -> dict[str, Any]:
    text = resources.files("deploykit").joinpath("readers/schema/board.schema.json").read_text()
    return json.loads(text)


def available_boards() -> list[str]:
    return sorted(board_files())


def board_origin(board: Board) -> str:
    """Where a loaded board came from: "bundled", "./boards", "--boards-dir" or "path"."""
    found = board_files().get(board.name)
    if found and found[0].resolve() == board.path.resolve():
        return found[1]
    return "path"


def load_board(name_or_path: str | Path) -> Board:
    """Load a board by name (`qemu-an547`) or by path to a board file, validated."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") and candidate.exists():
        path = candidate
    else:
        found = board_files().get(str(name_or_path))
        path = found[0] if found else Path()
        if not found:
            raise ConfigError(
                f"Unknown board '{name_or_path}'.",
                f"Available boards: {', '.join(available_boards())}. "
                "Run `deploykit boards` for details, or pass a path to a board file.",
            )
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"Board file {path} is not valid YAML: {exc}",
                          "Fix the syntax error shown above.") from exc
    return board_from_dict(data, path)


def board_from_dict(data: Any, path: Path) -> Board:
    import jsonschema

    validator = jsonschema.Draft202012Validator(_schema())
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"  {'/'.join(map(str, e.absolute_path)) or '<top>'}: {e.message}"
                 for e in errors[:10]]
        raise ConfigError(f"Board file {path} does not match the board schema:\n"
                          + "\n".join(lines),
                          "See docs/boards.md for the board file reference.")
    data = _whole_numbers(data)
    memory = tuple(
        MemoryRegion(r["name"], r["origin"], _board_size(r["size"], f"region {r['name']} size",
                                                         path), tuple(r["holds"]))
        for r in data["memory"]
    )
    _check_memory(memory, data["placement"], path)
    if data["export"]["default"] not in data["export"]["allowed"]:
        raise ConfigError(f"Board file {path}: export.default is not in export.allowed.",
                          "Add it to export.allowed or pick an allowed default.")
    if data["name"] != path.stem:
        raise ConfigError(f"Board file {path} names the board '{data['name']}'.",
                          f"A board file's name field must match its file name ('{path.stem}').")
    return Board(
        name=data["name"],
        description=data["description"],
        family=data["family"],
        cpu=data["cpu"],
        memory=memory,
        placement=dict(data["placement"]),
        stack_size=_board_size(data["stack_size"], "stack_size", path),
        heap_size=_board_size(data["heap_size"], "heap_size", path),
        console=data["console"],
        timer=data["timer"],
        export=data["export"],
        runner=data["runner"],
        path=path,
        raw=data,
        npu=npu_config(data),
    )


def _whole_numbers(node: Any) -> Any:
    """The schema's integers as ints: JSON Schema takes a whole float (YAML reads `1e6` so) for
    an integer, which the code after it formats and adds as one."""
    if isinstance(node, dict):
        return {k: _whole_numbers(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_whole_numbers(v) for v in node]
    if isinstance(node, float) and node.is_integer():
        return int(node)
    return node


def _check_memory(memory: tuple[MemoryRegion, ...], placement: dict[str, str],
                  path: Path) -> None:
    names = [r.name for r in memory]
    if len(set(names)) != len(names):
        raise ConfigError(f"Board file {path}: duplicate memory region names {names}.",
                          "Give each region a unique name.")
    ordered = sorted(memory, key=lambda r: r.origin)
    for a, b in zip(ordered, ordered[1:], strict=False):
        if a.end > b.origin:
            raise ConfigError(
                f"Board file {path}: regions '{a.name}' and '{b.name}' overlap "
                f"(0x{a.origin:08X}+{a.size:#x} runs into 0x{b.origin:08X}).",
                "Fix the origin or size of one of them.")
    for r in memory:
        if r.end > 1 << 32:
            raise ConfigError(f"Board file {path}: region '{r.name}' ends past 4 GiB.",
                              "Fix its origin or size.")
    for kind, region in placement.items():
        if kind not in PLACEMENT_KINDS:
            raise ConfigError(f"Board file {path}: unknown placement kind '{kind}'.",
                              f"Known kinds: {', '.join(PLACEMENT_KINDS)}.")
        match = next((r for r in memory if r.name == region), None)
        if match is None:
            raise ConfigError(f"Board file {path}: placement.{kind} names region '{region}', "
                              "which is not in memory.",
                              f"Regions: {', '.join(names)}.")
        if kind not in match.holds:
            raise ConfigError(f"Board file {path}: placement.{kind} puts {kind} in "
                              f"'{region}', whose holds list does not allow it.",
                              f"Add '{kind}' to {region}.holds or place it elsewhere.")
