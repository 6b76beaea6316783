"""Where deploykit's own files come from, and where a user's boards and models are found.

deploykit ships board files, example models, the firmware sources, the CMake files and the
pinned manifest (`west.yml`). `data_root()` is the one function that says where they are:

- in a checkout (an editable install, or running from the source tree), the checkout itself:
  `boards/`, `models/`, `firmware/`, `cmake/` and `west.yml` at its top;
- in an installed wheel, `deploykit/data/` inside the package, which the build copies from
  the checkout with the same layout (`setup.py`), so that relative references between
  `firmware/` and `cmake/` hold in both.

A user's own boards and models are searched before the bundled ones: `--boards-dir` /
`--models-dir` (or $DEPLOYKIT_BOARDS_DIR / $DEPLOYKIT_MODELS_DIR), then `./boards` /
`./models` in the current directory, then the bundled directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

# What a checkout or the bundled data holds (the build copies exactly these).
DATA_ITEMS = ("boards", "models", "firmware", "cmake", "west.yml")

_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the deploykit package (this is util/)
_ENV = {"boards": "DEPLOYKIT_BOARDS_DIR", "models": "DEPLOYKIT_MODELS_DIR"}
_explicit: dict[str, Path | None] = {"boards": None, "models": None}


def _is_data_dir(path: Path) -> bool:
    return all((path / item).exists() for item in DATA_ITEMS)


@cache
def checkout_root() -> Path | None:
    """The source checkout this package runs from, or None for an installed wheel."""
    root = _PACKAGE_DIR.parents[1]
    if (root / "pyproject.toml").is_file() and _is_data_dir(root):
        return root
    return None


@cache
def data_root() -> Path:
    """The directory that holds boards/, models/, firmware/, cmake/ and west.yml."""
    root = checkout_root()
    if root is not None:
        return root
    bundled = _PACKAGE_DIR / "data"
    if _is_data_dir(bundled):
        return bundled
    raise RuntimeError(
        f"deploykit's data files are missing: neither a checkout around {_PACKAGE_DIR} nor "
        f"{bundled} holds {', '.join(DATA_ITEMS)}. Reinstall deploykit from a wheel or a "
        "checkout (pip install .).")


def default_workspace() -> Path:
    """Where `deploykit setup` puts the upstream sources by default: `.workspace` in a
    checkout; for an installed wheel, $XDG_DATA_HOME/deploykit/workspace (by default
    ~/.local/share/deploykit/workspace), shared by every project of the user."""
    root = checkout_root()
    if root is not None:
        return root / ".workspace"
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "deploykit" / "workspace"


def set_user_dir(kind: str, path: Path | None) -> None:
    """--boards-dir / --models-dir: searched first (kind is "boards" or "models")."""
    _explicit[kind] = Path(path) if path is not None else None


@dataclass(frozen=True)
class SearchDir:
    path: Path
    origin: str  # "--boards-dir", "./boards", "bundled", ...


def search_dirs(kind: str) -> list[SearchDir]:
    """The directories a board or model name is looked up in, first match wins."""
    candidates: list[SearchDir] = []
    explicit = _explicit[kind] or (Path(os.environ[_ENV[kind]])
                                   if os.environ.get(_ENV[kind]) else None)
    if explicit is not None:
        candidates.append(SearchDir(explicit.expanduser(), f"--{kind}-dir"))
    candidates.append(SearchDir(Path.cwd() / kind, f"./{kind}"))
    candidates.append(SearchDir(data_root() / kind, "bundled"))
    seen: set[Path] = set()
    dirs = []
    for d in candidates:
        resolved = d.path.resolve()
        if resolved in seen or not d.path.is_dir():
            continue
        seen.add(resolved)
        # The checkout's own directories are the bundled ones, even when run from the checkout.
        bundled = resolved == (data_root() / kind).resolve()
        dirs.append(SearchDir(resolved, "bundled" if bundled else d.origin))
    return dirs
