"""The Model Explorer tool environment: a virtual environment of its own, pinned, created on
first use and reused, the way pipx or uv keep an application apart from a project.

Model Explorer and Arm's adapters cannot share deploykit's environment: every release of
`pte-adapter-model-explorer` wants `flatbuffers>25.9`, while `tosa-tools` (from
`executorch[ethos-u]`) pins `flatbuffers==25.2.10`. So deploykit never imports them; it runs
them with the tool environment's Python (deploykit.profiling.explore).

Where: `$DEPLOYKIT_TOOLS_DIR`, else `$XDG_CACHE_HOME/deploykit/tools`, else
`~/.cache/deploykit/tools`; one directory per set of pins and Python version, so a change of
pins makes a new environment beside the old one. Creation is atomic and safe against two
first uses at once: under an exclusive lock, the environment is built in a temporary directory
next to its final place, checked (its packages import), marked, and renamed into place. A
directory without the mark is not an environment and is never used.

Offline, `pip` needs the wheels from somewhere: `wheels` (`deploykit explore --wheels DIR`, or
`$DEPLOYKIT_EXPLORE_WHEELS`) installs from that directory only (`pip --no-index
--find-links`); `pip download -d DIR` with the pins below fills it on a machine that has the
package index.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from deploykit.util.errors import EnvironmentProblem

# The versions known to work together (and with deploykit's .pte files); tosa-adapter 0.1.0
# reads the TOSA 1.0 flatbuffers ExecuTorch 1.4.1's Arm backend hands Vela.
PINS = (
    "ai-edge-model-explorer==0.1.34",
    "pte-adapter-model-explorer==0.2.0",
    "tosa-adapter-model-explorer==0.1.0",
)
# Import name of each pinned distribution, checked after the install.
MODULES = ("model_explorer", "pte_adapter_model_explorer", "tosa_adapter_model_explorer")
TOOLS_DIR_ENV = "DEPLOYKIT_TOOLS_DIR"
WHEELS_ENV = "DEPLOYKIT_EXPLORE_WHEELS"
MARK_NAME = "deploykit-tool.json"
NAME = "model-explorer"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ToolEnv:
    """A ready tool environment: its directory and the versions installed in it."""

    path: Path
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"


@dataclass(frozen=True)
class ToolEnvState:
    """What `deploykit doctor` reports: where the environment is (or would be), and whether
    it is ready."""

    path: Path
    ready: bool
    detail: str


def tools_dir() -> Path:
    if os.environ.get(TOOLS_DIR_ENV):
        return Path(os.environ[TOOLS_DIR_ENV]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "deploykit" / "tools"


def env_path() -> Path:
    """The environment's directory for these pins and this Python (major.minor)."""
    py = f"py{sys.version_info[0]}{sys.version_info[1]}"
    digest = hashlib.sha256("\n".join(PINS).encode()).hexdigest()[:10]
    return tools_dir() / f"{NAME}-{py}-{digest}"


def _read_mark(path: Path) -> dict[str, str] | None:
    try:
        mark = json.loads((path / MARK_NAME).read_text())
    except (OSError, ValueError):
        return None
    if mark.get("pins") != list(PINS) or not (path / "bin" / "python").exists():
        return None
    return dict(mark.get("versions") or {})


def state() -> ToolEnvState:
    path = env_path()
    versions = _read_mark(path)
    if versions is not None:
        listed = ", ".join(f"{k} {v}" for k, v in versions.items())
        return ToolEnvState(path, True, f"{path} ({listed})")
    if path.exists():
        return ToolEnvState(path, False, f"{path} exists but is not a complete environment")
    return ToolEnvState(
        path, False, f"not created yet (the first `deploykit explore` creates it in {path})"
    )


def wheels_hint() -> str:
    return (
        f"Without the package index, give a directory of wheels: deploykit explore "
        f"--wheels DIR (or {WHEELS_ENV}=DIR). Fill it where PyPI is reachable, for the "
        f"same Python version and platform, with: python3 -m pip download -d DIR "
        f"{' '.join(PINS)}"
    )


def ensure(wheels: Path | None = None, progress: Progress | None = None) -> ToolEnv:
    """The ready environment, created first when there is none (see the module docstring)."""
    say = progress or (lambda _msg: None)
    path = env_path()
    versions = _read_mark(path)
    if versions is not None:
        return ToolEnv(path, versions)
    if wheels is None and os.environ.get(WHEELS_ENV):
        wheels = Path(os.environ[WHEELS_ENV])
    if wheels is not None and not Path(wheels).is_dir():
        raise EnvironmentProblem(f"The wheel directory {wheels} does not exist.", wheels_hint())
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path.parent / f".{path.name}.lock", say):
        versions = _read_mark(path)  # made by another deploykit while this one waited
        if versions is not None:
            return ToolEnv(path, versions)
        # What a killed creator left (its temporary directory): no one else is creating now.
        for leftover in path.parent.glob(f".{path.name}.*.tmp"):
            shutil.rmtree(leftover, ignore_errors=True)
        return _create(path, Path(wheels) if wheels else None, say)


@contextlib.contextmanager
def _locked(lock: Path, say: Progress) -> Iterator[None]:
    with open(lock, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("waiting for another deploykit creating the Model Explorer environment")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _create(path: Path, wheels: Path | None, say: Progress) -> ToolEnv:
    build = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        # mkdtemp makes the directory private (0700); the environment gets a plain mkdir's mode.
        umask = os.umask(0)
        os.umask(umask)
        build.chmod(0o777 & ~umask)
        say(f"creating the Model Explorer environment in {path}")
        _run(
            [sys.executable, "-m", "venv", str(build)],
            say,
            "python3 -m venv",
            "Install the venv module (Debian/Ubuntu: apt-get install python3-venv).",
        )
        python = build / "bin" / "python"
        source = ["--no-index", "--find-links", str(wheels)] if wheels is not None else []
        where = f"from {wheels}" if wheels is not None else "from the package index"
        say(f"installing {', '.join(PINS)} {where}")
        _run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--progress-bar",
                "off",
                *source,
                *PINS,
            ],
            say,
            "pip install",
            wheels_hint(),
        )
        probe = (
            "import importlib, importlib.metadata as m, json, sys\n"
            f"for mod in {MODULES!r}: importlib.import_module(mod)\n"
            "print(json.dumps({d: m.version(d) for d in sys.argv[1:]}))"
        )
        dists = [p.split("==")[0] for p in PINS]
        out = _run(
            [str(python), "-c", probe, *dists],
            say,
            "the import check",
            "Delete the tools directory and try again.",
            quiet=True,
        )
        versions = json.loads(out.strip().splitlines()[-1])
        (build / MARK_NAME).write_text(
            json.dumps(
                {
                    "pins": list(PINS),
                    "versions": versions,
                    "python": ".".join(map(str, sys.version_info[:3])),
                },
                indent=2,
            )
            + "\n"
        )
        if path.exists():  # an incomplete leftover (no mark): replaced
            shutil.rmtree(path)
        os.rename(build, path)
        say(f"Model Explorer environment ready: {path}")
        return ToolEnv(path, versions)
    finally:
        if build.exists():
            shutil.rmtree(build, ignore_errors=True)


def _run(cmd: list[str], say: Progress, what: str, hint: str, quiet: bool = False) -> str:
    """Run `cmd`, reporting its lines as progress; EnvironmentProblem with its last lines."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PIP_NO_INPUT": "1"},
    )
    lines: list[str] = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            lines.append(line.rstrip())
            if not quiet and line.startswith(("Collecting", "Installing", "Successfully")):
                say(line.strip())
    except BaseException:
        # Ctrl-C: pip must be gone before the caller removes the directory it writes into.
        proc.kill()
        proc.wait()
        raise
    if proc.wait() != 0:
        tail = "\n".join(
            ln for ln in lines if ln.strip() and not ln.startswith("WARNING: Location")
        )
        tail = "\n".join(tail.splitlines()[-6:])
        raise EnvironmentProblem(
            f"Creating the Model Explorer environment failed in {what} "
            f"(exit {proc.returncode}):\n{tail}",
            hint,
        )
    return "\n".join(lines)
