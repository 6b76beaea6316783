"""The error table: `protocol/errors.yaml` rendered into the firmware's C header, the host's
Python table and the table of docs/protocol.md (one source for the device and the host).

`python -m deploykit.build.error_table` regenerates the three files in a checkout; `--check` only
says which of them differ from the data file (tests/unit/test_error_table.py runs it).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from deploykit.build.render import render_text
from deploykit.readers.protocol.records import DoneStatus
from deploykit.util.errors import ExitCode
from deploykit.util.fsutil import write_if_changed

DATA_FILE = Path(__file__).parents[1] / "readers" / "protocol" / "errors.yaml"
CHECKOUT = Path(__file__).resolve().parents[3]
C_HEADER = Path("firmware/protocol/dk_errors.h")
PY_TABLE = Path("tools/deploykit/readers/protocol/error_codes.py")
DOC = Path("docs/protocol.md")
DOC_BEGIN = "<!-- error table: generated from tools/deploykit/readers/protocol/errors.yaml -->\n"
DOC_END = "<!-- end of error table -->\n"
DEFAULT_CLASS = "DEVICE_ERROR"


@dataclass(frozen=True)
class ErrorEntry:
    code: int
    name: str
    source: str  # "executorch" or "deploykit"
    meaning: str
    exit_class: str  # an ExitCode name
    done_status: int
    advice: str
    pool: str | None
    sample: bool = False  # serve firmware: one rejected frame or sample; the device serves on


def load_entries(path: Path = DATA_FILE) -> list[ErrorEntry]:
    """The entries of the data file, checked: unique codes and names, known classes and
    statuses, deploykit's codes above every ExecuTorch value."""
    data = yaml.safe_load(path.read_text())
    entries: list[ErrorEntry] = []
    for source in ("executorch", "deploykit"):
        for raw in data[source]:
            entries.append(_entry(source, raw))
    codes = [e.code for e in entries]
    names = [e.name for e in entries]
    if len(set(codes)) != len(codes) or len(set(names)) != len(names):
        raise ValueError(f"{path}: duplicate code or name")
    if min(e.code for e in entries if e.source == "deploykit") <= max(
        e.code for e in entries if e.source == "executorch"
    ):
        raise ValueError(f"{path}: deploykit's codes must lie above ExecuTorch's")
    return entries


def _entry(source: str, raw: dict[str, Any]) -> ErrorEntry:
    unknown = set(raw) - {"code", "name", "meaning", "class", "status", "advice", "pool",
                          "sample"}
    if unknown:
        raise ValueError(f"error table entry {raw.get('name')}: unknown keys {sorted(unknown)}")
    exit_class = raw.get("class", DEFAULT_CLASS)
    if exit_class not in ExitCode.__members__:
        raise ValueError(f"error table entry {raw['name']}: class {exit_class!r} is no ExitCode")
    status = int(raw.get("status", DoneStatus.EXECUTORCH_ERROR))
    if status not in (DoneStatus.EXECUTORCH_ERROR, DoneStatus.POOL_TOO_SMALL):
        raise ValueError(f"error table entry {raw['name']}: done status {status} is not 1 or 3")
    if (status == DoneStatus.POOL_TOO_SMALL) != ("pool" in raw):
        raise ValueError(f"error table entry {raw['name']}: a pool code has status 3 and a pool")
    return ErrorEntry(
        code=int(raw["code"]),
        name=str(raw["name"]),
        source=source,
        meaning=" ".join(str(raw["meaning"]).split()),
        exit_class=exit_class,
        done_status=status,
        advice=" ".join(str(raw.get("advice", "")).split()),
        pool=raw.get("pool"),
        sample=bool(raw.get("sample", False)),
    )


def rendered(entries: list[ErrorEntry], doc_text: str) -> dict[Path, str]:
    """Each generated file's text (paths relative to the checkout)."""
    context = {
        "entries": [e.__dict__ for e in entries],
        "exit_codes": {c.name: int(c) for c in ExitCode},
    }
    table = render_text("error_table.md.j2", context)
    if DOC_BEGIN not in doc_text or DOC_END not in doc_text:
        raise ValueError(f"{DOC} lacks the error table markers")
    head, rest = doc_text.split(DOC_BEGIN, 1)
    _, tail = rest.split(DOC_END, 1)
    return {
        C_HEADER: render_text("dk_errors.h.j2", context),
        PY_TABLE: render_text("error_codes.py.j2", context),
        DOC: head + DOC_BEGIN + table + DOC_END + tail,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deploykit.build.error_table", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if a generated file is out of date",
    )
    parser.add_argument("--root", type=Path, default=CHECKOUT, help="the checkout")
    args = parser.parse_args(argv)
    files = rendered(load_entries(), (args.root / DOC).read_text())
    stale = []
    for rel, text in files.items():
        path = args.root / rel
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(str(rel))
        elif write_if_changed(path, text):
            print(f"wrote {rel}")
    if stale:
        print(
            "out of date with tools/deploykit/readers/protocol/errors.yaml: "
            + ", ".join(stale)
            + " (regenerate: python -m deploykit.build.error_table)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
