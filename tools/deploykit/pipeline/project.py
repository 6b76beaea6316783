"""The settings of one command: the command line over the project file, which is read once here.

A command's choices (board, model, flow, profile, NPU overrides, runner options, inputs,
tolerance, ...) come from, in order: its command line, the board's table of the project file
(`[boards.<name>]`), the project file's top level. What none of them sets is left to the Target
resolution (pipeline/target.py: the board file's defaults, then deploykit's), which is given
the chosen values and where each came from, so that an error about one names the project
file's line. `deploykit config` shows every resolved setting with its source
(`describe_settings`).

`inputs`, `expect` and `tolerance` describe the project's model: when the command line names
another model, the project file's are left out (and `deploykit config` says so).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploykit.program.imported import PROGRAM_SUFFIX
from deploykit.readers.project_file import (
    PROJECT_FILE_NAME,
    ProjectFile,
    find_project_file,
    load_project_file,
)
from deploykit.util.errors import ConfigError

if TYPE_CHECKING:
    from deploykit.pipeline.target import Target

# Each setting's command-line flag (the project file's key is the setting's name).
FLAGS: dict[str, str] = {
    "board": "--board", "model": "--model", "flow": "--flow", "profile": "--profile",
    "npu_macs": "--npu-macs", "npu_memory_mode": "--npu-memory-mode", "strict": "--strict",
    "patches": "--patches", "fit": "--fit", "inputs": "--inputs", "expect": "--expect",
    "tolerance": "--atol/--rtol", "timeout": "--timeout",
}
# Settings that describe the project's model, not another one given on the command line.
MODEL_SETTINGS = ("inputs", "expect", "tolerance")
PATH_SETTINGS = ("inputs", "expect")
DEFAULT_TIMEOUT_S = 120.0


def runner_flags() -> dict[str, str]:
    """The runners' options (run/runners), each setting name -> its flag."""
    from deploykit.run.runners import runner_options

    return {o.dest: o.flag for o in runner_options()}


@dataclass(frozen=True)
class Setting:
    """A chosen value and where it came from: a flag ("--flow"), a project file's key
    ("deploykit.toml line 7 (boards.corstone-320.flow)"), a board file or a default."""

    value: Any
    source: str
    in_project_file: bool = False


@dataclass(frozen=True)
class Choices:
    """What the command line and the project file choose for one command."""

    project: ProjectFile | None
    settings: dict[str, Setting]  # the chosen ones: given on the command line or in the file
    left_out: dict[str, Setting] = field(default_factory=dict)  # the file's, not applied

    def value(self, name: str, default: Any = None) -> Any:
        chosen = self.settings.get(name)
        return default if chosen is None else chosen.value

    @property
    def board(self) -> str | None:
        return self.value("board")

    @property
    def model(self) -> str | None:
        return self.value("model")

    def board_or_error(self) -> str:
        if self.board is None:
            raise no_board_error(self.project)
        return str(self.board)

    def origins(self) -> dict[str, str]:
        """The settings that came from the project file -> their location, for the errors of
        the Target resolution."""
        return {name: s.source for name, s in self.settings.items() if s.in_project_file}

    def runner_options(self) -> dict[str, Any]:
        return {name: self.value(name) for name in runner_flags() if name in self.settings}

    def tolerance(self) -> tuple[float | None, float | None]:
        tol = self.value("tolerance") or {}
        return tol.get("atol"), tol.get("rtol")


def looks_like_path(model: str) -> bool:
    """A model written as a file (a .py or a .pte, or anything with a directory in it)."""
    return model.endswith((".py", PROGRAM_SUFFIX)) or "/" in model or "\\" in model


def load_project(project: ProjectFile | Path | str | bool | None = None,
                 start: Path | None = None) -> ProjectFile | None:
    """The project file: `project` (a path, or one already read) when given, none when False,
    else the one found from `start` (the current directory) upwards."""
    if isinstance(project, ProjectFile):
        return project
    if project is False:
        return None
    if project not in (None, True):
        return load_project_file(Path(str(project)))
    found = find_project_file(start)
    return load_project_file(found) if found is not None else None


def choose(given: Mapping[str, Any], project: ProjectFile | None) -> Choices:
    """The command line's values (`given`: setting name -> value, None when not given; `atol`
    and `rtol` for the tolerance) over the project file's (module docstring)."""
    given = dict(given)
    atol, rtol = given.pop("atol", None), given.pop("rtol", None)
    if atol is not None or rtol is not None:
        given["tolerance"] = {k: v for k, v in (("atol", atol), ("rtol", rtol))
                              if v is not None}
    flags = {**FLAGS, **runner_flags()}
    settings = {name: Setting(value, flags.get(name, name)) for name, value in given.items()
                if value is not None}
    left_out: dict[str, Setting] = {}
    if project is None:
        return Choices(None, settings)
    _check_board_tables(project)
    if "board" not in settings and "board" in project.settings:
        settings["board"] = Setting(project.settings["board"], str(project.location("board")),
                                    True)
    board = Path(str(settings["board"].value)).stem if "board" in settings else None
    from_file = {}
    for name in flags:
        if name == "board":
            continue
        found = project.lookup(name, board)
        if found is not None:
            value, where = found
            from_file[name] = Setting(_normalised(project, name, value), str(where), True)
    if "model" in settings and "model" in from_file and not _same_model(
            settings["model"].value, from_file["model"].value):
        for name in MODEL_SETTINGS:  # they describe the project's model, not this one
            if name in from_file:
                left_out[name] = from_file.pop(name)
    for name, setting in from_file.items():
        settings.setdefault(name, setting)
    _check_names(settings)
    return Choices(project, settings, left_out)


def _normalised(project: ProjectFile, name: str, value: Any) -> Any:
    """A project file's value as the command line would give it: paths relative to the file,
    runner options as strings."""
    if name == "model" and looks_like_path(value):
        return str(project.resolve_path(value))
    if name in PATH_SETTINGS:
        return project.resolve_path(value)
    if name in runner_flags():
        return str(value)
    return value


def _same_model(a: str, b: str) -> bool:
    if looks_like_path(a) and looks_like_path(b):
        return Path(a).resolve() == Path(b).resolve()
    return a == b


def _check_board_tables(project: ProjectFile) -> None:
    from deploykit.readers.boards import available_boards

    known = available_boards()
    for name in project.board_tables():
        if name not in known:
            raise ConfigError(f"{project.location('boards', name)}: there is no board named "
                              f"'{name}'.",
                              f"Boards: {', '.join(known)} (deploykit boards); a board file of "
                              "your own goes in ./boards or --boards-dir.")


def _check_names(settings: dict[str, Setting]) -> None:
    """A flow or profile the project file names exists (the command line's are choices)."""
    from deploykit.flows import flow_names
    from deploykit.pipeline.profiles import PROFILES

    for name, known in (("flow", flow_names()), ("profile", tuple(PROFILES))):
        chosen = settings.get(name)
        if chosen is not None and chosen.in_project_file and chosen.value not in known:
            raise ConfigError(f"{chosen.source}: {name} '{chosen.value}' is not a {name} "
                              "deploykit knows.", f"Use one of: {', '.join(known)}.")


def no_board_error(project: ProjectFile | None) -> ConfigError:
    where = (f"or set board = \"...\" in {project.path}" if project is not None else
             f"or set board = \"...\" in a {PROJECT_FILE_NAME}")
    return ConfigError("No board given.",
                       f"Give --board NAME (deploykit boards lists them), {where}.")


def no_model_error(board: str, project: ProjectFile | None) -> ConfigError:
    """Neither the command line nor a project file names a model: how to name one."""
    from deploykit.program.models import list_models
    from deploykit.readers.boards import repo_root

    names = ", ".join(list_models(repo_root()))
    ways = (f"  --model NAME          a model of ./models or a bundled one ({names})\n"
            "  --model my_model.py   a Python file with model() and example_inputs()\n"
            "  --model program.pte   an ExecuTorch program made elsewhere\n")
    if project is None:
        return ConfigError(
            f"No model given, and no {PROJECT_FILE_NAME} here or above "
            f"({Path.cwd()}) names one.",
            f"Name one:\n{ways}  or start a project here: `deploykit init` writes "
            f"{PROJECT_FILE_NAME}, a model file and an on-board test.")
    return ConfigError(
        f"No model given, and the project file {project.path} names none for {board}.",
        f"Write `model = \"...\"` at its top (or under [boards.{board}]), or name one:\n"
        f"{ways.rstrip()}")


# ---- deploykit config ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ResolvedSetting:
    name: str
    value: Any
    source: str


def resolved_settings(choices: Choices, target: Target | None,
                      runner_settings: bool = True) -> list[ResolvedSetting]:
    """Every setting of a command as it resolves, with where each value came from: the
    command line, the project file, the board file or deploykit's default."""
    rows: list[ResolvedSetting] = []

    def add(name: str, value: Any, source: str) -> None:
        chosen = choices.settings.get(name)
        if chosen is not None:
            rows.append(ResolvedSetting(name, chosen.value, chosen.source))
        else:
            rows.append(ResolvedSetting(name, value, source))

    add("board", None, "not given")
    add("model", None, "not given (`deploykit init` starts a project)")
    if target is None:
        for name in ("flow", "profile", "npu_macs", "npu_memory_mode"):
            add(name, None, "the board file's (no board given)")
    else:
        board_file = f"board file {_shown(target.board.path)}"
        if target.program is not None and "flow" not in choices.settings:
            add("flow", target.flow.name, f"the program {Path(str(choices.model)).name} "
                "(its operators and delegates)")
        else:
            add("flow", target.flow.name, f"{board_file} (export.default)")
        add("profile", target.profile.name, f"{board_file} (profile)"
            if target.board.raw.get("profile") else "default")
        npu = target.npu
        program = target.program
        if program is not None and program.npu_target is not None:
            made_for = f"the program {program.path.name} (compiled by Vela for " \
                f"{program.npu_target}, {program.npu_memory_mode or 'its default memory mode'})"
            add("npu_macs", npu.macs if npu else None, made_for)
            add("npu_memory_mode", npu.memory_mode if npu else None, made_for)
        else:
            add("npu_macs", npu.macs if npu else None,
                f"{board_file} (npu.macs)" if npu else "- (the board has no NPU)")
            add("npu_memory_mode", npu.memory_mode if npu else None,
                f"{board_file} (npu.vela.memory_mode)" if npu else "- (the board has no NPU)")
    add("strict", False, "default")
    if target is not None and target.board.export.get("patches"):
        add("patches", target.profile.patches,
            f"board file {_shown(target.board.path)} (export.patches)")
    else:
        add("patches", "off", "default")
    add("fit", False, "default (estimated pools; --fit measures them)")
    program = target.program if target is not None else None
    if program is None:
        add("inputs", None, "default (the model's example inputs)")
        add("expect", None, "default (the host's reference)")
    else:
        add("inputs", None, "default (deterministic data of the program's input shapes and "
            "dtypes)")
        add("expect", None, "default (the program run on the host)" if not program.delegates_npu
            else "none: the host cannot run an NPU program (--expect FILE.npz, --no-compare)")
    add("tolerance", None, "default (the model's TOLERANCE, else the flow's)")
    add("timeout", DEFAULT_TIMEOUT_S, "default")
    if runner_settings:
        flags = runner_flags()
        taken = ([o.dest for o in target.runner.options] if target is not None
                 else list(flags))
        for name in taken:
            add(name, None, f"default ({target.runner.kind} runner)" if target else "default")
    for name, setting in choices.left_out.items():
        rows.append(ResolvedSetting(name, setting.value, f"{setting.source}: left out, "
                                    "--model names another model"))
    return rows


def _shown(path: Path) -> str:
    """A path relative to the current directory when it is inside it."""
    try:
        return os.path.relpath(path) if Path(path).resolve().is_relative_to(Path.cwd()) \
            else str(path)
    except ValueError:
        return str(path)


def describe_settings(choices: Choices, rows: list[ResolvedSetting]) -> str:
    project = choices.project
    lines = [f"project file: {project.path}" if project is not None else
             f"project file: none ({PROJECT_FILE_NAME} or pyproject.toml [tool.deploykit] in "
             f"{Path.cwd()} or above)"]
    width = max(len(r.name) for r in rows)
    for r in rows:
        value = "-" if r.value is None else _value_text(r.value)
        lines.append(f"  {r.name:<{width}}  {value:<24} {r.source}")
    return "\n".join(lines)


def _value_text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return str(value)
