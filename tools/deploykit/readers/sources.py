"""Upstream sources: the pinned manifest (west.yml), the workspace, and source overrides.

`deploykit setup` brings every project of `west.yml` into a workspace directory, with
`west update`, or, for projects given with `--source NAME=PATH[@REV]`, from a local git
repository (bare or not) through `git archive`: the way to work behind a firewall.
The workspace records what it holds in `deploykit-sources.json`; builds read only that.
It also remembers every override given (`overrides` there): a later `deploykit setup` takes the
project from the same local copy again, without `--source`, until another `--source` of that
project replaces it or `--forget NAME` removes it (then the project comes from its upstream).

Board-specific projects (the pico-sdk for RP2350 boards, ...) are in west groups that the
manifest's `group-filter` disables. They are *optional*: `setup` brings them only when their
group is asked for (`--group pico`) or when they are given with `--source`, and a workspace
without them is complete for every other board. A build that needs them calls
`require_projects()`, which says how to add them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from deploykit.util.errors import ConfigError, EnvironmentProblem
from deploykit.util.fsutil import write_atomic
from deploykit.util.paths import data_root, default_workspace

STATE_FILE = "deploykit-sources.json"
WORKSPACE_ENV = "DEPLOYKIT_WORKSPACE"


@dataclass(frozen=True)
class Project:
    """One pinned upstream project of the manifest."""

    name: str
    url: str
    revision: str
    path: str
    groups: tuple[str, ...] = ()
    optional: bool = False  # every group disabled by the manifest's group-filter


@dataclass(frozen=True)
class SourceOverride:
    """`NAME=PATH[@REV]`: take project NAME from the local git repository PATH."""

    name: str
    path: Path
    revision: str | None

    def describe(self) -> str:
        return f"{self.name}={self.path}" + (f"@{self.revision}" if self.revision else "")

    def to_json(self) -> dict[str, str | None]:
        return {"name": self.name, "path": str(self.path), "revision": self.revision}

    @classmethod
    def parse(cls, text: str) -> SourceOverride:
        name, sep, rest = text.partition("=")
        if not sep or not name or not rest:
            raise ConfigError(f"Cannot read the source override '{text}'.",
                              "Write it as NAME=PATH or NAME=PATH@REV, for example "
                              "executorch=/src/executorch.git@v1.4.1.")
        path, at, rev = rest.rpartition("@") if "@" in rest else (rest, "", "")
        return cls(name=name, path=Path(path).expanduser(), revision=rev if at else None)


@dataclass(frozen=True)
class ProjectState:
    """What the workspace holds for one project."""

    name: str
    path: str  # relative to the workspace root
    commit: str
    origin: str  # "west" or "override:<path>"
    missing_files: tuple[str, ...] = ()
    # What was asked for (`@REV`, else the pin), the tags naming `commit` in the source
    # repository and the commit's date: how `doctor` tells a pinned release from another copy.
    revision: str = ""
    tags: tuple[str, ...] = ()
    date: str = ""


@dataclass(frozen=True)
class Workspace:
    root: Path
    projects: dict[str, ProjectState]
    # The overrides `deploykit setup` remembers (and uses again), by project name.
    overrides: dict[str, SourceOverride] = field(default_factory=dict)

    def path_of(self, name: str) -> Path:
        return self.root / self.projects[name].path

    def has(self, name: str) -> bool:
        return name in self.projects and self.path_of(name).is_dir()

    @property
    def executorch_dir(self) -> Path:
        return self.path_of("executorch")

    @property
    def executorch_commit(self) -> str:
        return self.projects["executorch"].commit


def manifest_path() -> Path:
    return data_root() / "west.yml"


def read_manifest(path: Path | None = None) -> list[Project]:
    data = yaml.safe_load((path or manifest_path()).read_text())["manifest"]
    remotes = {r["name"]: r["url-base"] for r in data.get("remotes", [])}
    default_remote = data.get("defaults", {}).get("remote")
    disabled = {g[1:] for g in data.get("group-filter", []) if g.startswith("-")}
    projects = []
    for p in data["projects"]:
        base = remotes[p.get("remote", default_remote)]
        url = p.get("url") or f"{base}/{p.get('repo-path', p['name'])}"
        groups = tuple(p.get("groups", ()))
        # west: a project is inactive when all of its groups are disabled.
        optional = bool(groups) and all(g in disabled for g in groups)
        projects.append(Project(p["name"], url, str(p["revision"]), p.get("path", p["name"]),
                                groups, optional))
    return projects


def workspace_dir(explicit: Path | None = None) -> Path:
    """--workspace, else $DEPLOYKIT_WORKSPACE, else paths.default_workspace() (`.workspace`
    in a checkout)."""
    if explicit:
        return Path(explicit).resolve()
    if os.environ.get(WORKSPACE_ENV):
        return Path(os.environ[WORKSPACE_ENV]).resolve()
    return default_workspace()


def load_workspace(explicit: Path | None = None) -> Workspace:
    root = workspace_dir(explicit)
    state = root / STATE_FILE
    if not state.exists():
        raise EnvironmentProblem(
            f"ExecuTorch sources not available: no workspace at {root}.",
            "Run `deploykit setup` (or `deploykit setup --source executorch=PATH@REV ...` "
            "without GitHub access; see README), or point --workspace / "
            f"${WORKSPACE_ENV} at an existing workspace.")
    data = json.loads(state.read_text())
    projects = {p["name"]: _project_state(p) for p in data["projects"]}
    ws = Workspace(root, projects, remembered_overrides(data))
    for project in read_manifest():
        if project.optional:
            continue
        if project.name not in projects or not ws.path_of(project.name).is_dir():
            raise EnvironmentProblem(
                f"The workspace at {root} lacks project '{project.name}'.",
                "Run `deploykit setup` again.")
    return ws


def remembered_overrides(state: dict) -> dict[str, SourceOverride]:
    """The overrides a workspace's state remembers. A state written before deploykit
    remembered them has none listed: its projects taken from a local copy (origin
    `override:<path>`) are remembered with the revision they were taken at."""
    if "overrides" in state:
        return {o["name"]: SourceOverride(o["name"], Path(o["path"]), o.get("revision"))
                for o in state["overrides"]}
    found = {}
    for p in state.get("projects", []):
        origin = str(p.get("origin", ""))
        if origin.startswith("override:"):
            found[p["name"]] = SourceOverride(p["name"], Path(origin[len("override:"):]),
                                              p.get("revision") or None)
    return found


def _project_state(data: dict) -> ProjectState:
    return ProjectState(**{**data, "missing_files": tuple(data.get("missing_files", ())),
                           "tags": tuple(data.get("tags", ()))})


def require_projects(ws: Workspace, names: list[str], why: str) -> None:
    """Raise EnvironmentProblem naming how to add the optional projects `names` lacks."""
    pinned = {p.name: p for p in read_manifest()}
    missing = [pinned[n] for n in names if not ws.has(n)]
    if not missing:
        return
    groups = sorted({g for p in missing for g in p.groups})
    lines = "\n".join(f"  --source {p.name}=PATH@{p.revision}   # {p.url}" for p in missing)
    raise EnvironmentProblem(
        f"{why} needs {', '.join(p.name for p in missing)}, which the workspace at {ws.root} "
        "does not hold.",
        f"Run `deploykit setup {' '.join(f'--group {g}' for g in groups)}`, or without GitHub "
        f"access give them from local git copies:\n  deploykit setup \\\n{lines}")


def _git(repo: Path, *args: str, text: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=text,
                          check=False)


def resolve_commit(repo: Path, revision: str) -> str:
    res = _git(repo, "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}")
    if res.returncode != 0:
        raise ConfigError(f"Revision '{revision}' is not in the git repository {repo}.",
                          "Fetch it there first, or name a revision it has.")
    return res.stdout.strip()


def _missing_blobs(repo: Path, commit: str) -> list[str]:
    """Paths whose blobs the repository lacks (partial or size-limited clones)."""
    tree = _git(repo, "ls-tree", "-r", "-z", commit)
    entries = [line.split("\t", 1) for line in tree.stdout.split("\0") if line]
    # Several paths can share one blob, so keep (sha, path) pairs, not a dict by sha.
    blobs = [(meta.split()[2], path) for meta, path in entries if meta.split()[1] == "blob"]
    check = subprocess.run(["git", "-C", str(repo), "cat-file", "--batch-check"],
                           input="\n".join(sha for sha, _ in blobs) + "\n",
                           capture_output=True, text=True, check=False)
    missing = {line.split()[0] for line in check.stdout.splitlines() if line.endswith("missing")}
    return sorted(path for sha, path in blobs if sha in missing)


def extract_tree(repo: Path, commit: str, dest: Path) -> list[str]:
    """`git archive` `commit` of `repo` into `dest` (replaced atomically)."""
    missing = _missing_blobs(repo, commit)
    excludes = [f":(exclude,literal){p}" for p in missing]
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    archive = tmp.with_suffix(".tar")
    with archive.open("wb") as out:
        res = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", commit,
                              "--", ".", *excludes], stdout=out, stderr=subprocess.PIPE,
                             check=False)
    try:
        if res.returncode != 0:
            raise EnvironmentProblem(
                f"git archive of {commit[:12]} from {repo} failed: "
                f"{res.stderr.decode(errors='replace').strip()}",
                "Check that the path is a git repository holding that revision.")
        with tarfile.open(archive) as tar:
            if hasattr(tarfile, "tar_filter"):
                tar.extractall(tmp, filter="tar")
            else:  # Python before 3.11.4 (Debian 12's 3.11.2): no extraction filters yet
                tar.extractall(tmp)  # our own git archive of the pinned revision
    finally:
        archive.unlink(missing_ok=True)
    # Nested projects (submodule paths) that live inside dest are kept across re-extraction
    # only if the caller re-extracts them afterwards; dest is replaced whole.
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(dest)
    return missing


def _tags_at(repo: Path, commit: str) -> tuple[str, ...]:
    res = _git(repo, "tag", "--points-at", commit)
    return tuple(sorted(res.stdout.split())) if res.returncode == 0 else ()


def _commit_date(repo: Path, commit: str) -> str:
    res = _git(repo, "log", "-1", "--format=%cs", commit)
    return res.stdout.strip() if res.returncode == 0 else ""


# ---- the Ethos-U core driver and CMSIS (group ethos-u) ----------------------------------------

ETHOS_U_DRIVER = "ethos-u-core-driver"
CMSIS = "cmsis"
# What the firmware build compiles (cmake/ethos-u): the driver's sources and its CMake project,
# identical in Arm's repository and in the Zephyr module.
DRIVER_FILES = ("CMakeLists.txt", "include/ethosu_driver.h", "include/pmu_ethosu.h",
                "src/ethosu_driver.c", "src/ethosu_pmu.c", "src/ethosu_device_u55_u65.c",
                "src/ethosu_device_u85.c")
CMSIS_FILES = ("CMSIS/Core/Include/cmsis_compiler.h",)
LAYOUTS = {
    "arm": "Arm's ethos-u-core-driver repository",
    "zephyr-module": "the Zephyr module zephyrproject-rtos/hal_ethos_u",
}


def ethos_u_driver_layout(tree: Path) -> str | None:
    """`arm` (Arm's repository: the driver at the root), `zephyr-module` (the same driver at the
    root plus zephyr/module.yml naming hal_ethos_u), or None when `tree` is not the driver."""
    if not all((tree / f).is_file() for f in DRIVER_FILES):
        return None
    module = tree / "zephyr" / "module.yml"
    if module.is_file() and "hal_ethos_u" in module.read_text(errors="replace"):
        return "zephyr-module"
    return "arm"


def _check_tree(name: str, tree: Path, override: SourceOverride) -> None:
    """Refuse a local copy that is not the project (the build would fail much later)."""
    if name == ETHOS_U_DRIVER and ethos_u_driver_layout(tree) is None:
        missing = [f for f in DRIVER_FILES if not (tree / f).is_file()]
        raise ConfigError(
            f"--source {name}={override.path}: not the Ethos-U core driver (lacks "
            f"{', '.join(missing)}).",
            "Give Arm's ethos-u-core-driver repository or the Zephyr module "
            "zephyrproject-rtos/hal_ethos_u (the driver at the repository root).")
    if name == CMSIS and not all((tree / f).is_file() for f in CMSIS_FILES):
        raise ConfigError(f"--source {name}={override.path}: not CMSIS_6 (lacks "
                          f"{CMSIS_FILES[0]}).", "Give a copy of ARM-software/CMSIS_6.")


@dataclass(frozen=True)
class DriverInfo:
    """What the workspace's Ethos-U core driver is, for `doctor` and build messages."""

    layout: str | None  # arm, zephyr-module, None (not the driver)
    commit: str
    revision: str  # asked for (`@REV`), or the pin
    tags: tuple[str, ...]
    date: str
    pinned: str  # the manifest's release tag
    origin: str = ""  # "west" or "override:<path>"

    @property
    def is_pinned(self) -> bool:
        """The release west.yml pins: a tag of that name at the commit, or fetched by west."""
        return self.pinned in self.tags or (self.origin == "west"
                                            and self.revision == self.pinned)

    def describe(self) -> str:
        what = LAYOUTS.get(self.layout or "", "not the Ethos-U core driver")
        tags = f" (tag {', '.join(self.tags)})" if self.tags else ""
        date = f", {self.date}" if self.date else ""
        return f"{what}, commit {self.commit[:12]}{tags}{date}"


def ethos_u_driver_info(ws: Workspace) -> DriverInfo | None:
    if not ws.has(ETHOS_U_DRIVER):
        return None
    state = ws.projects[ETHOS_U_DRIVER]
    pin = next(p for p in read_manifest() if p.name == ETHOS_U_DRIVER)
    return DriverInfo(ethos_u_driver_layout(ws.path_of(ETHOS_U_DRIVER)), state.commit,
                      state.revision, state.tags, state.date, pin.revision, state.origin)


def _is_git_repo(path: Path) -> bool:
    return path.is_dir() and _git(path, "rev-parse", "--git-dir").returncode == 0


def setup(workspace: Path | None = None, overrides: list[SourceOverride] | None = None,
          progress: Callable[[str], None] = print,
          groups: list[str] | None = None, forget: list[str] | None = None) -> Workspace:
    """Bring every required manifest project into the workspace, plus the optional ones of
    `groups` and those given in `overrides`; return what it holds. The overrides given before
    are used again (module docstring) unless `overrides` replaces one or `forget` names it."""
    root = workspace_dir(workspace)
    root.mkdir(parents=True, exist_ok=True)
    all_projects = read_manifest()
    by_name = {p.name: p for p in all_projects}
    overrides = overrides or []
    groups = list(groups or [])
    known_groups = {g for p in all_projects for g in p.groups}
    for g in groups:
        if g not in known_groups:
            raise ConfigError(f"--group {g}: no project of west.yml is in that group.",
                              f"Groups: {', '.join(sorted(known_groups)) or '-'}.")
    for name in forget or []:
        if name not in by_name:
            raise ConfigError(f"--forget names '{name}', which is not a project of west.yml.",
                              f"Projects: {', '.join(by_name)}.")
    for o in overrides:
        if o.name not in by_name:
            raise ConfigError(f"--source names '{o.name}', which is not a project of west.yml.",
                              f"Projects: {', '.join(by_name)}.")
        if o.name in (forget or []):
            raise ConfigError(f"--source {o.name}=... and --forget {o.name} together.",
                              "Give one of them: --source replaces the remembered override "
                              "anyway.")
        if not _is_git_repo(o.path):
            raise ConfigError(f"--source {o.name}={o.path}: not a git repository.",
                              "Point it at a clone or bare git directory of the project.")

    previous: dict[str, ProjectState] = {}
    remembered: dict[str, SourceOverride] = {}
    state_path = root / STATE_FILE
    if state_path.exists():
        state = json.loads(state_path.read_text())
        for p in state["projects"]:
            previous[p["name"]] = _project_state(p)
        remembered = remembered_overrides(state)
    for name in forget or []:
        if remembered.pop(name, None) is not None:
            progress(f"{name}: the override is forgotten; it comes from its upstream now")
        else:
            progress(f"{name}: no override was remembered")
    given = {o.name: SourceOverride(o.name, o.path.resolve(), o.revision) for o in overrides}
    for name, o in remembered.items():
        if name in given:
            continue
        if not _is_git_repo(o.path):
            raise ConfigError(
                f"The workspace remembers --source {o.describe()}, which is not a git "
                "repository any more.",
                f"Give its new place (deploykit setup --source {name}=PATH), or take it from "
                f"upstream again (deploykit setup --forget {name}).")
        progress(f"{name}: from {o.path}, as remembered (--forget {name} to fetch it from "
                 "upstream)")
    chosen = {**remembered, **given}
    # Optional projects: asked for by group or override, or already in the workspace.
    projects = [p for p in all_projects
                if not p.optional or p.name in chosen or p.name in previous
                or set(p.groups) & set(groups)]

    states: dict[str, ProjectState] = {}
    reextracted: list[str] = []
    pending_west: list[Project] = []
    for project in projects:  # parents come before the projects nested in them
        dest = root / project.path
        parent_redone = any(project.path.startswith(p + "/") for p in reextracted)
        override = chosen.get(project.name)
        if override is None:
            old = previous.get(project.name)
            if old and old.commit == project.revision and dest.is_dir() and not parent_redone:
                states[project.name] = old
            else:
                pending_west.append(project)
            continue
        commit = resolve_commit(override.path, override.revision or project.revision)
        origin = f"override:{override.path.resolve()}"
        old = previous.get(project.name)
        if old and old.commit == commit and old.origin == origin and dest.is_dir() \
                and not parent_redone:
            progress(f"{project.name}: {commit[:12]} already in the workspace")
            states[project.name] = old
            continue
        progress(f"{project.name}: extracting {commit[:12]} from {override.path}")
        missing = extract_tree(override.path, commit, dest)
        if missing:
            progress(f"{project.name}: {len(missing)} file(s) absent from the local copy "
                     f"were skipped (for example {missing[0]})")
        _check_tree(project.name, dest, override)
        reextracted.append(project.path)
        states[project.name] = ProjectState(
            project.name, project.path, commit, origin, tuple(missing),
            revision=override.revision or project.revision,
            tags=_tags_at(override.path, commit), date=_commit_date(override.path, commit))

    if pending_west:
        states.update(_west_update(root, pending_west, progress,
                                   sorted({g for p in pending_west if p.optional
                                           for g in p.groups})))

    ordered = [asdict(states[p.name]) for p in projects]
    write_atomic(state_path, json.dumps({
        "projects": ordered,
        "overrides": [chosen[p.name].to_json() for p in all_projects if p.name in chosen],
    }, indent=2) + "\n")
    return load_workspace(root)


def _west_update(root: Path, projects: list[Project], progress: Callable[[str], None],
                 groups: list[str] | None = None) -> dict[str, ProjectState]:
    names = [p.name for p in projects]
    how = " \\\n".join(f"    --source {p.name}=PATH@{p.revision}" for p in projects)
    where = "\n".join(f"  {p.name}: {p.url}" for p in projects)
    hint = ("Without GitHub access, give each project from a local git copy (a clone or bare "
            f"repository of it, anywhere on this machine):\n  deploykit setup \\\n{how}\n"
            f"Upstream repositories:\n{where}")
    # Beside deploykit's Python first: the .venv's bin/ need not be on PATH.
    beside = Path(sys.executable).parent / "west"
    west = str(beside) if beside.is_file() else shutil.which("west")
    if west is None:
        raise EnvironmentProblem(
            f"west is not installed, so {', '.join(names)} cannot be fetched.",
            "Install it with `pip install west`. " + hint)
    manifest_dir = root / "deploykit-manifest"
    manifest_dir.mkdir(exist_ok=True)
    shutil.copyfile(manifest_path(), manifest_dir / "west.yml")
    log = root / "west.log"
    with log.open("w") as out:
        if not (root / ".west").exists():
            res = subprocess.run([west, "init", "-l", str(manifest_dir)], cwd=root,
                                 stdout=out, stderr=subprocess.STDOUT, check=False)
            if res.returncode != 0:
                raise EnvironmentProblem("`west init` failed.", hint, log_path=str(log))
        progress(f"west update {' '.join(names)} (this downloads the pinned sources)")
        group_opts = [f"--group-filter=+{g}" for g in groups or []]
        res = subprocess.run([west, "update", "--narrow", "--fetch-opt=--depth=1", *group_opts,
                              *names],
                             cwd=root, stdout=out, stderr=subprocess.STDOUT, check=False)
    if res.returncode != 0:
        raise EnvironmentProblem(f"`west update` could not fetch {', '.join(names)}.", hint,
                                 log_path=str(log))
    states = {}
    for p in projects:
        commit = _git(root / p.path, "rev-parse", "HEAD").stdout.strip()
        states[p.name] = ProjectState(p.name, p.path, commit, "west", revision=p.revision,
                                      tags=_tags_at(root / p.path, commit),
                                      date=_commit_date(root / p.path, commit))
    return states


def installed_executorch_commit() -> str | None:
    """The commit the installed `executorch` wheel was built from, or None if not installed."""
    try:
        from executorch.version import git_version
    except ImportError:
        return None
    return str(git_version)


def check_executorch_commit(ws: Workspace) -> str:
    """Refuse a workspace whose ExecuTorch commit differs from the installed wheel's."""
    wheel = installed_executorch_commit()
    if wheel is None:
        raise EnvironmentProblem("The executorch Python package is not installed.",
                                 "Install it with the README's set-up command.")
    if wheel != ws.executorch_commit:
        raise EnvironmentProblem(
            "The ExecuTorch sources and the installed wheel are different commits: "
            f"workspace {ws.executorch_commit}, wheel {wheel}.",
            "The runtime must be built from the exact commit that exported the model. "
            "Run `deploykit setup --source executorch=PATH@" + wheel + "` or install the "
            "matching wheel; upgrade both together.")
    return wheel
