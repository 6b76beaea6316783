"""The Target: what one command builds for, resolved once at the API boundary.

A command names a board, and maybe a flow, a build profile, NPU overrides (--npu-macs,
--npu-memory-mode), --strict and runner options (--port, --probe, ...). `resolve_target` turns
them into one immutable `Target`, doing every check on the way: the board file loads and names
known flows, the flow is allowed on the board and applies to it, the NPU overrides are valid
for the board's NPU, the runner takes the options given, and a board's proxy (where `--fit`
measures it when it is not attached) can stand in for it. Every stage then takes the Target
(or the parts of it it needs) instead of resolving the board's family, the flow, the profile
or the NPU again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploykit.families import family_of
from deploykit.flows import flow_names, get_flow
from deploykit.flows.patches import OFF, parse_patches
from deploykit.pipeline.profiles import resolve_profile
from deploykit.program.imported import check_for_board, read_program
from deploykit.readers.boards import Board, load_board
from deploykit.readers.npu import with_npu_overrides
from deploykit.run.proxy import proxy_board, proxy_section
from deploykit.run.runners import runner_class
from deploykit.util.errors import ConfigError
from deploykit.util.version import deploykit_version

if TYPE_CHECKING:
    from deploykit.families.base import BoardFamily
    from deploykit.flows.base import Flow
    from deploykit.pipeline.profiles import BuildProfile
    from deploykit.program.imported import ForeignProgram
    from deploykit.readers.npu import NpuConfig
    from deploykit.run.runners.base import Runner


@dataclass(frozen=True)
class ProxyTarget:
    """The simulated board a `--fit` measurement runs on when the board itself is not
    attached (run/proxy.py): built with the target's CPU/ABI flags and runtime options."""

    board: Board
    family: BoardFamily
    runner: type[Runner]
    extra_stack: int  # added to the fitted stack (the board file's proxy.extra_stack)


@dataclass(frozen=True)
class Target:
    """A board as one command compiles for it, with everything the stages ask of it."""

    board: Board  # as compiled: NPU overrides and the profile's CPU flags applied
    family: BoardFamily
    flow: Flow
    profile: BuildProfile  # --strict applied
    runner: type[Runner]
    runner_options: Mapping[str, Any] = field(default_factory=dict)  # checked, set ones only
    proxy: ProxyTarget | None = None
    # The model is an ExecuTorch program made elsewhere (a .pte): read once and checked
    # against the board; the flow and the NPU settings are the program's (program/imported.py).
    program: ForeignProgram | None = None

    @property
    def name(self) -> str:
        return self.board.name

    @property
    def npu(self) -> NpuConfig | None:
        """The board's NPU with the overrides applied; None without an `npu:` section."""
        return self.board.npu

    def cmake_definitions(self) -> dict[str, str]:
        """The firmware build's CMake cache entries of the profile, for this family, and the
        version of deploykit, which keys the cached runtime it links (key.cmake)."""
        return {**self.profile.cmake_definitions(self.family),
                "DK_DEPLOYKIT_VERSION": deploykit_version()}

    def runner_kwargs(self, workspace: Path | None,
                      progress: Callable[[str], None]) -> dict[str, Any]:
        """The runner's keyword arguments: the command-line options it declares, and the
        workspace and progress every runner is offered."""
        return {**self.runner_options, "workspace": workspace, "progress": progress}

    def make_runner(self, workspace: Path | None, progress: Callable[[str], None]) -> Runner:
        return self.runner.from_board(self.board, **self.runner_kwargs(workspace, progress))


def check_board_flows(board: Board) -> None:
    """A board file's export section names flows that exist (built-in or plugins)."""
    known = flow_names()
    unknown = [f for f in board.export["allowed"] if f not in known]
    if unknown:
        raise ConfigError(f"Board file {board.path}: export.allowed names unknown flow(s) "
                          f"{', '.join(unknown)}.", f"Known flows: {', '.join(known)}.")


def resolve_target(board: str | Path | Board, *, flow: str | None = None,
                   profile: str | None = None, strict: bool = False,
                   patches: str | None = None, npu_macs: int | None = None,
                   npu_memory_mode: str | None = None,
                   runner_options: Mapping[str, Any] | None = None,
                   origins: Mapping[str, str] | None = None, program: Path | None = None,
                   expect: Path | None = None) -> Target:
    """The Target of a command (module docstring). `board`: a name, a board file, or a loaded
    Board; `flow`: default the board file's `export.default`; `profile`: default the board
    file's `profile:`, else size; `strict`: the profile's export refuses float fallbacks;
    `patches`: the first stage in tiles ("auto", "off", "NxM"; default: the board file's
    `export.patches`, else off; flows/patches.py).
    `origins`: where a value came from when not from the command line (a setting's name ->
    its project file line, pipeline/project.py), named in the error it causes. `program`: the
    model is this .pte (`expect`: its expected outputs): the flow and the NPU's MACs and
    memory mode are the program's, and it is checked against the board here."""
    origins = origins or {}
    loaded = board if isinstance(board, Board) else load_board(board)
    check_board_flows(loaded)
    foreign = None
    if program is not None:
        with _blame(origins, "model", "expect"):
            foreign = read_program(Path(program), expect)
            check_for_board(foreign, loaded)
        flow, npu_macs, npu_memory_mode = _program_settings(foreign, flow, npu_macs,
                                                            npu_memory_mode, origins)
        if foreign.npu_target is not None:  # the NPU settings the program was compiled for
            made_for = f"{foreign.path.name} (compiled for {foreign.npu_target}, " \
                f"{foreign.npu_memory_mode or 'the default memory mode'})"
            origins = {"npu_macs": made_for, "npu_memory_mode": made_for, **origins}
    with _blame(origins, "npu_macs", "npu_memory_mode"):
        loaded = with_npu_overrides(loaded, npu_macs, npu_memory_mode)
    with _blame(origins, "flow"):
        flow_impl = _allowed_flow(loaded, flow)
    with _blame(origins, "profile"):
        build_profile = resolve_profile(loaded, profile)
    if strict:
        build_profile = dataclasses.replace(build_profile, strict=True)
    with _blame(origins, "patches"):
        tiles = _patches(loaded, flow_impl, patches, foreign is not None)
    if tiles != OFF:
        build_profile = dataclasses.replace(build_profile, patches=tiles)
    compiled = build_profile.board_for(loaded)
    runner = runner_class(compiled)
    with _blame(origins, *(runner_options or {})):
        options = runner.check_options(compiled.name, runner_options or {})
    return Target(board=compiled, family=family_of(compiled), flow=flow_impl,
                  profile=build_profile, runner=runner, runner_options=options,
                  proxy=_proxy_of(compiled), program=foreign)


def _program_settings(program: ForeignProgram, flow: str | None, npu_macs: int | None,
                      npu_memory_mode: str | None, origins: Mapping[str, str]
                      ) -> tuple[str, int | None, str | None]:
    """The flow, MAC count and memory mode a program was made for; a different one given is
    an error naming both (a compiled program cannot change them)."""
    def given(name: str, flag: str) -> str:
        return origins.get(name) or flag

    if flow is not None and flow != program.flow:
        raise ConfigError(f"{given('flow', '--flow')} {flow}: the program {program.path} is "
                          f"{program.flow} ({program.reason}).",
                          "Leave the flow out: a program's flow is the one it was made for.")
    if program.npu_target is None:
        return program.flow, npu_macs, npu_memory_mode
    if npu_macs is not None and npu_macs != program.npu_macs:
        raise ConfigError(f"{given('npu_macs', '--npu-macs')} {npu_macs}: the program "
                          f"{program.path} was compiled by Vela for {program.npu_target} "
                          f"({program.npu_macs} MACs).",
                          "Leave --npu-macs out (the board's NPU is configured as the program "
                          "needs), or compile the model for that configuration.")
    mode = program.npu_memory_mode
    if npu_memory_mode is not None and mode is not None and npu_memory_mode != mode:
        raise ConfigError(f"{given('npu_memory_mode', '--npu-memory-mode')} {npu_memory_mode}: "
                          f"the program {program.path} was compiled for the {mode} memory "
                          "mode.", "Leave --npu-memory-mode out, or compile the model for it.")
    return program.flow, program.npu_macs, mode or npu_memory_mode


@contextmanager
def _blame(origins: Mapping[str, str], *names: str) -> Iterator[None]:
    """A ConfigError about settings `names` names the project file's lines they came from."""
    try:
        yield
    except ConfigError as exc:
        where = [origins[n] for n in names if n in origins]
        if not where:
            raise
        raise ConfigError(f"{'; '.join(where)}: {exc.cause}", exc.hint) from exc


def _patches(board: Board, flow: Flow, given: str | None, program: bool) -> str:
    """The `--patches` setting, checked: its form, and that the flow can tile (a program made
    elsewhere is what it is). The board file's `export.patches` is the default."""
    from_board = given is None
    value = board.export.get("patches", OFF) if from_board else given
    where = f"board file {board.path} (export.patches)" if from_board else "--patches"
    parse_patches(str(value), where)
    value = str(value).strip().lower()
    if value == OFF:
        return OFF
    if program:
        if from_board:
            return OFF
        raise ConfigError(f"--patches {value}: the model is a compiled program (.pte); its "
                          "layers cannot be tiled any more.",
                          "Leave --patches out, or export the model from its Python file.")
    if flow.patches_refusal:
        if from_board:
            return OFF
        raise ConfigError(f"--patches {value}: the {flow.name} flow cannot run patches: "
                          f"{flow.patches_refusal}.",
                          "Use --patches off, or the cortex_m_int8 or portable_fp32 flow.")
    return value


def _allowed_flow(board: Board, flow: str | None) -> Flow:
    name = flow or board.export["default"]
    if name not in board.export["allowed"]:
        raise ConfigError(f"Board {board.name} does not support the {name} flow.",
                          f"Allowed flows: {', '.join(board.export['allowed'])}.")
    flow_impl = get_flow(name)
    why_not = flow_impl.applies_to(board)
    if why_not:
        raise ConfigError(f"The {name} flow cannot target board {board.name}: {why_not}.",
                          f"Allowed flows: {', '.join(board.export['allowed'])}.")
    return flow_impl


def _proxy_of(board: Board) -> ProxyTarget | None:
    """The board's proxy, checked, when its board file names one."""
    section = proxy_section(board)
    if not section:
        return None
    proxy = proxy_board(board)
    return ProxyTarget(board=proxy, family=family_of(proxy), runner=runner_class(proxy),
                       extra_stack=int(section["extra_stack"]))
