"""The project file: `deploykit.toml` (or a `[tool.deploykit]` table in `pyproject.toml`) in the
current directory or one above it.

It names a project's model and its per-board settings, as platformio.ini or Cargo.toml do,
so that a command line need not repeat them (docs/project.md):

    model = "model.py"                 # a model name, a Python model file or a .pte
    [boards.corstone-320]
    model = "mobilenet_v2"
    npu_macs = 512

The file is validated against `schema/project.schema.json` with the machinery of the board
files (jsonschema); an unknown key or a value of the wrong type is a ConfigError naming the
file, the line and the key. This module only reads: which value wins over which (the command
line over the file, a board's table over the top level) is pipeline/project.py's.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from deploykit.util.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as the tomli package (a dependency there)
    import tomli as tomllib

PROJECT_FILE_NAME = "deploykit.toml"
PYPROJECT_NAME = "pyproject.toml"
PYPROJECT_TABLE = ("tool", "deploykit")
DOCS = "docs/project.md"
# The keys only the top level may hold; every other key may be set per board too.
TOP_LEVEL_ONLY = ("board", "boards")


@dataclass(frozen=True)
class Location:
    """Where a value of a project file is: the file and the line of its key."""

    path: Path
    line: int | None
    key: str  # dotted, as written in the file: "boards.corstone-320.flow"

    def __str__(self) -> str:
        where = f"{self.path.name} line {self.line}" if self.line else self.path.name
        return f"{where} ({self.key})"


@dataclass(frozen=True)
class ProjectFile:
    """A validated project file. `settings` is the table (the whole deploykit.toml, or
    pyproject's [tool.deploykit]); `lines` maps each key path in it to its line."""

    path: Path
    settings: dict[str, Any]
    lines: dict[tuple[str, ...], int] = field(default_factory=dict, repr=False)
    table: tuple[str, ...] = ()  # () for deploykit.toml, ("tool", "deploykit") in pyproject

    @property
    def directory(self) -> Path:
        """Relative paths in the file are relative to this directory."""
        return self.path.parent

    def location(self, *keys: str) -> Location:
        full = (*self.table, *keys)
        line = next((self.lines[full[:n]] for n in range(len(full), 0, -1)
                     if full[:n] in self.lines), None)
        return Location(self.path, line, ".".join(full))

    def board_tables(self) -> dict[str, dict[str, Any]]:
        return dict(self.settings.get("boards", {}))

    def lookup(self, key: str, board: str | None) -> tuple[Any, Location] | None:
        """`key` for `board`: its [boards.<board>] table first, then the top level."""
        table = self.board_tables().get(board or "", {})
        if key in table:
            return table[key], self.location("boards", board or "", key)
        if key in self.settings and key not in TOP_LEVEL_ONLY:
            return self.settings[key], self.location(key)
        return None

    def resolve_path(self, value: str) -> Path:
        """A path written in the file, relative to the file's directory."""
        path = Path(value).expanduser()
        return path if path.is_absolute() else (self.directory / path).resolve()


def _has_table(pyproject: Path) -> bool:
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False  # not ours to complain about: pyproject may be another tool's
    return isinstance(data.get("tool"), dict) and "deploykit" in data["tool"]


def find_project_file(start: Path | None = None) -> Path | None:
    """The project file of `start` (default: the current directory): the first directory from
    it upwards that holds deploykit.toml, or a pyproject.toml with a [tool.deploykit] table
    (deploykit.toml wins in a directory that holds both)."""
    here = Path(start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        candidate = directory / PROJECT_FILE_NAME
        if candidate.is_file():
            return candidate
        pyproject = directory / PYPROJECT_NAME
        if pyproject.is_file() and _has_table(pyproject):
            return pyproject
    return None


@cache
def _schema() -> dict[str, Any]:
    text = resources.files("deploykit").joinpath("readers/schema/project.schema.json")
    return json.loads(text.read_text())


def setting_keys() -> tuple[str, ...]:
    """The keys a board table may hold (every setting), in the schema's order."""
    return tuple(_schema()["$defs"]["settings"]["properties"])


def load_project_file(path: Path) -> ProjectFile:
    """Read and validate a project file (deploykit.toml, or pyproject.toml's [tool.deploykit])."""
    path = Path(path).resolve()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"Cannot read the project file {path}: {exc.strerror}.",
                          "Check the path (--project FILE).") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"Project file {path} is not valid TOML: {exc}.",
                          f"Fix the syntax there ({DOCS} shows the keys).") from exc
    table: tuple[str, ...] = ()
    if path.name == PYPROJECT_NAME:
        table = PYPROJECT_TABLE
        data = data.get("tool", {}).get("deploykit")
        if not isinstance(data, dict):
            raise ConfigError(f"{path} has no [tool.deploykit] table.",
                              f"Add one, or write the settings in {PROJECT_FILE_NAME}.")
    project = ProjectFile(path, data, key_lines(text), table)
    _validate(project)
    return project


def _validate(project: ProjectFile) -> None:
    import jsonschema

    validator = jsonschema.Draft202012Validator(_schema())
    problems: list[tuple[int, str]] = []
    for error in validator.iter_errors(project.settings):
        keys = [str(k) for k in error.absolute_path]
        if error.validator in ("unevaluatedProperties", "additionalProperties"):
            known = _known_keys(keys)
            for name in sorted(set(error.instance) - set(known)):
                where = project.location(*keys, name)
                close = _close_to(name, known)
                problems.append((where.line or 0, f"{where}: unknown key '{name}'"
                                 + (f" (did you mean '{close}'?)" if close else "")
                                 + f"; known keys here: {', '.join(known)}"))
            continue
        if error.validator == "propertyNames":
            where = project.location(*keys, str(error.instance))
            problems.append((where.line or 0, f"{where}: '{error.instance}' is not a board "
                             "name"))
            continue
        where = project.location(*keys)
        problems.append((where.line or 0, f"{where}: {error.message}"))
    if problems:
        lines = "\n".join(f"  {p}" for _line, p in sorted(set(problems)))
        raise ConfigError(f"Project file {project.path} does not match the project file's "
                          f"schema:\n{lines}",
                          f"See {DOCS} for every key and its type.")


def _known_keys(keys: list[str]) -> list[str]:
    """The keys allowed in the table at key path `keys`."""
    settings = list(setting_keys())
    if not keys:
        return sorted([*settings, *TOP_LEVEL_ONLY])
    if keys[-1] == "tolerance":
        return ["atol", "rtol"]
    return sorted(settings)


def _close_to(name: str, known: list[str]) -> str | None:
    import difflib

    matches = difflib.get_close_matches(name, known, n=1, cutoff=0.7)
    return matches[0] if matches else None


# ---- line numbers ------------------------------------------------------------------------------
# tomllib reports no positions, so the lines of the keys are found by a scan of the text: table
# headers, `key = value` lines (dotted and quoted keys) and the keys of one-line inline tables.
# Values spanning lines (arrays, multi-line strings) are stepped over.

_KEY = r'(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|\'[^\']*\')'
_DOTTED = rf"{_KEY}(?:\s*\.\s*{_KEY})*"
_TABLE_RE = re.compile(rf"^\s*\[\[?\s*({_DOTTED})\s*\]\]?\s*(?:#.*)?$")
_KEY_RE = re.compile(rf"^\s*({_DOTTED})\s*=")
_INLINE_KEY_RE = re.compile(rf"[{{,]\s*({_DOTTED})\s*=")
_PART_RE = re.compile(_KEY)


def _split_key(dotted: str) -> tuple[str, ...]:
    parts = []
    for part in _PART_RE.findall(dotted):
        if part[:1] in "\"'":
            part = part[1:-1]
        parts.append(part)
    return tuple(parts)


def _strip_strings(text: str) -> tuple[str, str | None]:
    """`text` with its string literals blanked and its comment dropped, and the delimiter of a
    multi-line string left open at its end (or None)."""
    out, i = [], 0
    while i < len(text):
        for quote in ('"""', "'''"):
            if text.startswith(quote, i):
                end = text.find(quote, i + 3)
                if end < 0:
                    return "".join(out), quote
                i = end + 3
                break
        else:
            c = text[i]
            if c == "#":
                break
            if c in "\"'":
                end = i + 1
                while end < len(text) and text[end] != c:
                    end += 2 if c == '"' and text[end] == "\\" else 1
                i = end + 1
                out.append('""')
                continue
            out.append(c)
            i += 1
    return "".join(out), None


def key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Each key path of a TOML document -> the line (from 1) where it is defined."""
    found: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    depth = 0  # brackets still open from a value that spans lines
    open_string: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if open_string is not None:
            end = line.find(open_string)
            if end < 0:
                continue
            line, open_string = line[end + 3:], None
        if depth == 0:
            header = _TABLE_RE.match(line)
            if header:
                table = _split_key(header.group(1))
                for n in range(1, len(table) + 1):
                    found.setdefault(table[:n], number)
                continue
            key = _KEY_RE.match(line)
            if key:
                path = (*table, *_split_key(key.group(1)))
                for n in range(len(table) + 1, len(path) + 1):
                    found.setdefault(path[:n], number)
                rest, open_string = _strip_strings(line[key.end():])
                for inner in _INLINE_KEY_RE.finditer(rest):
                    found.setdefault((*path, *_split_key(inner.group(1))), number)
                depth += rest.count("[") + rest.count("{") - rest.count("]") - rest.count("}")
                continue
        rest, open_string = _strip_strings(line)
        depth = max(0, depth + rest.count("[") + rest.count("{") - rest.count("]")
                    - rest.count("}"))
    return found
