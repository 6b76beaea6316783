"""`deploykit` command line: parses arguments, calls the Python API, prints the result.

Errors the user can act on are printed as one paragraph without a traceback and exit with
the code of their failure class (deploykit.util.errors.ExitCode); `--debug` shows tracebacks.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from deploykit import api
from deploykit.flows import flow_names, registry
from deploykit.flows.base import CALIBRATIONS
from deploykit.pipeline.profiles import DEFAULT_PROFILE, PROFILES
from deploykit.run.runners import runner_options
from deploykit.util.errors import (
    NO_SPACE_ERRNOS,
    ConfigError,
    DeployKitError,
    DiskFullError,
    ExitCode,
    disk_full,
)
from deploykit.util.jsonable import to_jsonable
from deploykit.util.paths import set_user_dir
from deploykit.util.progress import ProgressDisplay
from deploykit.util.thirdparty_log import route_third_party_logs

_EPILOG = """\
typical use:
  deploykit init my-project                         start a project: deploykit.toml, model, test
  deploykit doctor                                  check toolchain, QEMU, Python stack, sources
  deploykit setup                                   fetch the pinned upstream sources (west.yml)
  deploykit run --board qemu-an547 --model tiny_cnn export, build, run on QEMU, compare with host
  deploykit selftest --board qemu-an505             board support + protocol check, no ExecuTorch
"""


class _Output:
    def __init__(self, as_json: bool, quiet: bool = False) -> None:
        self.as_json = as_json
        self.quiet = quiet
        # stderr: a live status line on a terminal, plain lines otherwise (util/progress.py).
        self.progress = ProgressDisplay(quiet=quiet)

    def close(self) -> None:
        self.progress.close()

    def result(self, payload: Any, text: str) -> None:
        self.close()
        if self.as_json:
            print(json.dumps(to_jsonable(payload), indent=2, allow_nan=False))
        else:
            print(text)


def _common(p: argparse.ArgumentParser, *, board: bool = True, model: bool = True,
            out_default: str = "build/<board>/<model>") -> None:
    if board:
        p.add_argument("--board", help="board name from boards/ (see `deploykit boards`) or a "
                       "path to a board file (default: the project file's `board`)")
    if model:
        p.add_argument("--model", help="a model name (./models or a bundled one), a Python "
                       "file defining model() and example_inputs(), or an ExecuTorch program "
                       "(.pte) made elsewhere (default: the project file's `model`, "
                       "docs/project.md)")
        p.add_argument("--flow", choices=flow_names(),
                       help="export flow (default: the board file's export.default): "
                       + "; ".join(f"{f.name}: {f.summary}" for f in registry().values()))
        p.add_argument("--npu-macs", type=int, metavar="N",
                       help="Ethos-U MAC configuration (U55: 32/64/128/256, U85: 128..2048); "
                       "overrides the board's npu.macs for Vela and the FVP alike")
        p.add_argument("--npu-memory-mode", metavar="MODE",
                       help="Vela memory mode, one of the board's npu.vela.memory_modes "
                       "(e.g. Shared_Sram, Dedicated_Sram_384KB)")
        p.add_argument("--profile", choices=list(PROFILES),
                       help="build profile (default: the board file's `profile:`, else "
                       f"{DEFAULT_PROFILE}); see `deploykit build --help` and docs/profiles.md")
        p.add_argument("--strict", action="store_true", default=None,
                       help="cortex_m_int8: fail when an operator cannot be lowered to "
                       "int8, instead of keeping it in float (automatic mixed precision; "
                       "docs/int8-coverage.md)")
        p.add_argument("--patches", metavar="auto|NxM|off",
                       help="run the first layers of an image model on N x M overlapping "
                       "tiles, one at a time, so that their large feature maps are never "
                       "whole (cortex_m_int8, portable_fp32); auto picks the grid and the "
                       "last tiled layer with the least activation memory within 25%% more "
                       "MACs (default: the board file's export.patches, else off; "
                       "docs/memory.md)")
    p.add_argument("--out", type=Path, help=f"output directory (default {out_default})")


def _global_options(p: argparse.ArgumentParser, *, top: bool) -> None:
    """Options every command takes, before or after the command name. Given after it, they
    override the ones before it (the subcommand's defaults are SUPPRESS so that they do not
    overwrite a value given before the command)."""
    def default(value):
        return value if top else argparse.SUPPRESS

    g = p.add_argument_group("common options (before or after the command)")
    g.add_argument("--debug", action="store_true", default=default(False),
                   help="show tracebacks on errors, and third-party warnings")
    g.add_argument("--json", action="store_true", default=default(False),
                   help="print machine-readable JSON on stdout")
    g.add_argument("-q", "--quiet", action="store_true", default=default(False),
                   help="no progress on stderr (errors and the result still print)")
    g.add_argument("--workspace", type=Path, default=default(None),
                   help="upstream sources workspace (default $DEPLOYKIT_WORKSPACE, else "
                   ".workspace in a checkout, else ~/.local/share/deploykit/workspace)")
    g.add_argument("--boards-dir", type=Path, metavar="DIR", default=default(None),
                   help="look for board files here first, then in ./boards, then in the "
                   "bundled ones")
    g.add_argument("--models-dir", type=Path, metavar="DIR", default=default(None),
                   help="look for models here first, then in ./models, then in the bundled "
                   "ones")
    g.add_argument("--project", type=Path, metavar="FILE", default=default(None),
                   help="the project file (default: deploykit.toml, or pyproject.toml with "
                   "[tool.deploykit], in the current directory or above; docs/project.md)")
    g.add_argument("--no-project", action="store_true", default=default(False),
                   help="read no project file")


class _Parser(argparse.ArgumentParser):
    """Subparsers get the common options too, so that they work after the command."""

    def add_subparsers(self, **kwargs):
        action = super().add_subparsers(**kwargs)
        make = action.add_parser

        def add_parser(name, **kw):
            sub = make(name, **kw)
            _global_options(sub, top=False)
            return sub

        action.add_parser = add_parser
        return action


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="deploykit", description="Take a PyTorch model onto an Arm microcontroller with "
        "ExecuTorch, and check that it runs right.", epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _global_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("boards", help="list the boards and their memory maps",
                       description="List every board on the search path (--boards-dir, "
                       "./boards, then the bundled boards) with its CPU, family, runner, "
                       "flows and memory map, and the file it came from.")

    p = sub.add_parser("profiles", help="list the build profiles (reference, size, speed)",
                       description="List the build profiles: what each one sets in the "
                       "ExecuTorch runtime and firmware build, and why (docs/profiles.md).")
    p.add_argument("--cmake", metavar="PROFILE", choices=list(PROFILES),
                   help="print PROFILE's CMake -D options, for configuring firmware/ by hand")

    p = sub.add_parser("doctor", help="check the Python stack, toolchain, QEMU and sources",
                       description="Check the pinned Python stack (torch, executorch), the Arm "
                       "cross toolchain, CMake, Ninja, QEMU and the upstream sources of the "
                       "workspace, and say how to fix what is missing. Exits 4 when a check "
                       "fails.")

    p = sub.add_parser("init", help="start a project: deploykit.toml, a model file and an "
                       "on-board test", description="Write a working project into DIR "
                       "(default: the current directory): deploykit.toml (the project file: "
                       "the model and per-board settings, docs/project.md), model.py (model() "
                       "and example_inputs(), the optional ones in a comment) and "
                       "tests/test_on_board.py (the model on a board against the host, through "
                       "deploykit's pytest plugin). Then `deploykit run --board qemu-an547` and "
                       "`pytest --board qemu-an547` pass there. Overwrites nothing: when one of "
                       "the files exists, it says so and writes none.")
    p.add_argument("directory", type=Path, nargs="?", metavar="DIR",
                   help="the project's directory (created if missing)")

    p = sub.add_parser("config", help="every setting of a command as it resolves, and where "
                       "each came from", description="Print every setting a command on the "
                       "board would use (model, flow, profile, NPU, runner options, inputs, "
                       "tolerance, ...) and where each value came from: an option, the project "
                       "file (file and line), the board file, or deploykit's default. Takes the "
                       "options of `deploykit run`, so `deploykit config --board B --flow F` "
                       "shows what `deploykit run --board B --flow F` would do. docs/project.md.")
    _common(p)
    p.add_argument("--inputs", type=Path, metavar="DIR", help="as for run")
    p.add_argument("--expect", type=Path, metavar="FILE.npz", help="as for run")
    p.add_argument("--atol", type=float, help="as for run")
    p.add_argument("--rtol", type=float, help="as for run")
    p.add_argument("--timeout", type=float, help="as for run")
    _fit_option(p)
    _board_selection(p)

    p = sub.add_parser("setup", help="fetch the pinned upstream sources into a workspace",
                       description="Fetch every project of west.yml into the workspace with "
                       "`west update`. Without GitHub access, give projects from local git "
                       "copies with --source NAME=PATH[@REV] (REV defaults to the pinned one); "
                       "the workspace remembers them, so a later setup (--group pico) needs "
                       "only its new projects' --source.")
    p.add_argument("--source", action="append", default=[], metavar="NAME=PATH[@REV]",
                   help="take project NAME from the local git repository PATH (repeatable); "
                   "the workspace remembers it, and later setups use it again")
    p.add_argument("--forget", action="append", default=[], metavar="NAME",
                   help="forget the remembered override of project NAME: fetch it from its "
                   "upstream again (repeatable; `deploykit doctor` lists the remembered ones)")
    p.add_argument("--group", action="append", default=[], metavar="GROUP",
                   help="also fetch the optional projects of GROUP (repeatable): "
                   + _groups_help())

    p = sub.add_parser("export", help="export a model to a .pte (and host reference outputs)",
                       description="Export a model for a board through its flow: <out>/export/"
                       "model.pte, the operator list (ops.yaml), the host's reference outputs "
                       "(reference.npz) and export.json. Needs no upstream sources.")
    _common(p)

    p = sub.add_parser("explore", help="open a .pte (or, --tosa, its Ethos-U delegates' TOSA "
                       "graphs) in Model Explorer", description="Serve a .pte in Google's Model "
                       "Explorer on 127.0.0.1 through Arm's PTE adapter, with each node's "
                       "segment (NPU delegate or CPU) as node data; --tosa shows the TOSA graph "
                       "of each Ethos-U delegate (kept by the ethos_u_int8 export) through the "
                       "TOSA adapter. Model Explorer runs from a pinned environment of its own, "
                       "created on first use in the user cache ($DEPLOYKIT_TOOLS_DIR to move "
                       "it); `deploykit doctor` reports it. Ctrl-C stops the server.")
    p.add_argument("pte", type=Path, nargs="?", help="the .pte file (in its export directory)")
    p.add_argument("--tosa", action="store_true",
                   help="show the delegates' TOSA graphs (delegate_<i>.tosa beside the .pte)")
    p.add_argument("--port", type=int, help="port on 127.0.0.1 (default: the first free one "
                   "from 8080)")
    p.add_argument("--no-browser", action="store_true",
                   help="print the URL, do not open a browser")
    p.add_argument("--node-data", type=Path, action="append", default=[], metavar="FILE",
                   help="a further Model Explorer node data file to overlay (repeatable)")
    p.add_argument("--profile", type=Path, metavar="PROFILE_JSON", help="overlay each "
                   "instruction's time and share of execute() from `deploykit profile`'s "
                   "profile.json (default: <out>/profile/profile.json when the .pte is "
                   "<out>/export/*.pte and the file is not older than it)")
    p.add_argument("--intermediates", type=Path, metavar="JSON", help="overlay each "
                   "instruction's max abs error from `run --debug-intermediates`' "
                   "intermediates.json (default: <out>/debug/intermediates.json, as above)")
    p.add_argument("--no-auto-data", action="store_true", help="do not pick up profile.json "
                   "and intermediates.json from the model's out directory")
    p.add_argument("--wheels", type=Path, metavar="DIR", help="create the Model Explorer "
                   "environment from this directory of wheels, without the package index "
                   "(also $DEPLOYKIT_EXPLORE_WHEELS)")
    p.add_argument("--setup", action="store_true",
                   help="only create the Model Explorer environment (if missing) and exit")

    p = sub.add_parser("inspect", help="describe a .pte: segments in execution order, "
                       "delegates with their ops and Vela scratch, CPU ops, buffers",
                       description="Describe a .pte without running it: its segments in "
                       "execution order (delegates with their ops and Vela scratch, CPU ops), "
                       "planned buffers, constant data, and the inputs and outputs.")
    p.add_argument("pte", type=Path, help="the .pte file")

    p = sub.add_parser("plan", help="memory plan of a model (or a .pte) on a board, checked "
                       "before compiling", description="Size every memory item (constant data, "
                       "planned buffers, CMSIS-NN and Ethos-U scratch, method and temp pools, "
                       "stack, heap), place it in the board's regions and print used, available "
                       "and headroom per region; writes <out>/plan.json. Exits 6 with the table "
                       "and a suggestion when a region overflows. Pools, stack and heap are "
                       "estimated until measured (deploykit build --fit, stored in "
                       "<out>/fit.json). docs/memory.md.")
    _common(p)
    _model_optional(p)
    p.add_argument("--pte", type=Path, metavar="FILE",
                   help="plan this .pte instead of exporting --model (out defaults to the "
                   "build directory it is in)")

    p = sub.add_parser("build", help="export, plan, render and cross-compile the firmware",
                       description="Export, plan, render and cross-compile the firmware, in "
                       "one build profile (--profile).", epilog=_profiles_help(),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p)
    _fit_option(p)

    p = sub.add_parser("run", help="build, run on the board's simulator (or flash the board "
                       "and read it over USB), compare with the host",
                       description="Build the firmware, run it on the board's runner (QEMU, an "
                       "Arm FVP, or a flashed board read over USB) and compare every output "
                       "with the host's reference: max/mean abs error, cosine, top-1/top-5. "
                       "Exits non-zero when they disagree.")
    _common(p)
    _fit_option(p)
    p.add_argument("--timeout", type=float,
                   help="seconds before a silent simulator is killed (default 120)")
    p.add_argument("--inputs", type=Path, metavar="DIR",
                   help="run every sample in DIR (NAME.npy, NAME.npz with input_0.., or "
                   "NAME.pt; optional labels.json of NAME -> class) in one firmware run and "
                   "report agreement and accuracy over them")
    p.add_argument("--atol", type=float, help="absolute tolerance of the device-vs-host "
                   "comparison (default: the model's TOLERANCE, else the flow's default)")
    p.add_argument("--rtol", type=float, help="relative tolerance, added to --atol")
    p.add_argument("--expect", type=Path, metavar="FILE.npz",
                   help="a .pte model's expected outputs (output_0, output_1, ...), for a "
                   "program the host cannot run (an NPU delegate); default: the program run "
                   "on the host")
    p.add_argument("--no-compare", action="store_true",
                   help="a .pte model with no reference (an NPU program without --expect): "
                   "pass when the run ends well, printing the outputs (without it the run "
                   f"exits {int(ExitCode.NOT_COMPARED)}: nothing was compared)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also print the detail of the report's last line: each pool linked "
                   "above its peak (--json always has it)")
    p.add_argument("--debug-intermediates", action="store_true",
                   help="also build firmware that streams every operator's output, run it, "
                   "compare each output with the host's run of the same program in execution "
                   "order, print the per-operator error table and name the first operator "
                   "beyond the tolerance (<out>/debug/intermediates.json; docs/profiling.md)")
    _board_selection(p)

    p = sub.add_parser("profile", help="per-operator time on the board: a table, profile.json, "
                       "an SVG chart and an ETDump for ExecuTorch's Inspector",
                       description="Build the firmware with deploykit's streaming EventTracer "
                       "(and the plain firmware, to measure what profiling costs in RAM), run "
                       "both on the board's runner and print one row per operator: kernel "
                       "(portable, cortex_m = CMSIS-NN, deploykit's own, delegate), calls, time "
                       "(instructions under QEMU, cycles on hardware, and microseconds), share and "
                       "cumulative share of execute(). Writes <out>/profile/: profile.json, "
                       "profile.svg and model.etdump, which executorch.devtools.Inspector opens "
                       "with <out>/export/model.etrecord (docs/profiling.md).")
    _common(p)
    _fit_option(p)
    p.add_argument("--timeout", type=float,
                   help="seconds before a silent simulator is killed (default 120)")
    _board_selection(p)

    p = sub.add_parser("validate", help="score a model over a data set: fp32, the host "
                       "program (both calibrations) and the device; accuracy, agreement, "
                       "confusion matrices", description="Run every sample of a data set's "
                       "split through the model in fp32 on the host, through the flow's host "
                       "program (the reference `run` compares the device with), calibrated on "
                       "the model's calibration_inputs() and, for an int8 flow, on its example "
                       "input alone, and on the device; print top-1 accuracy side by side, the "
                       "device's agreement with the host program sample by sample (and where "
                       "they disagree), and the logits' error against fp32. Writes "
                       "<out>/validate/validation.json and confusion.svg. Fails when a sample "
                       "is not scored, the device's outputs leave the tolerance, or the int8 "
                       "top-1 is more than --max-drop points below fp32's "
                       "(docs/validation.md).")
    _common(p)
    p.add_argument("--dataset", metavar="NAME[:SPLIT]",
                   help="the data set and split (default digits:test): a built-in one ("
                   "digits: train, test), a directory of samples with labels.json (one "
                   "subdirectory per split, or the samples themselves), or a Python file "
                   "defining SPLITS and load(split)")
    p.add_argument("--inputs", type=Path, metavar="DIR",
                   help="a directory of samples with labels.json as the data set (as for run)")
    p.add_argument("--limit", type=int, metavar="N", help="only the first N samples")
    p.add_argument("--host-only", action="store_true",
                   help="fp32 and the host program only, no device")
    p.add_argument("--calibration", choices=list(CALIBRATIONS), default="model",
                   help="what the device program is calibrated on: model (its "
                   "calibration_inputs(), default) or example (its example input alone); the "
                   "host program of the other is shown beside it")
    p.add_argument("--max-drop", type=float, default=1.0, metavar="POINTS",
                   help="points of top-1 accuracy the int8 program may lose against fp32 "
                   "(default 1)")
    p.add_argument("--timeout", type=float,
                   help="seconds before a silent device is given up (default 120)")
    _board_selection(p)

    p = sub.add_parser("flash", help="flash a built firmware onto a board (picotool, the "
                       "BOOTSEL drive, or SWD; see the board file's flashers)",
                       description="Flash a firmware built by `deploykit build` (--model) or "
                       "a given image (--image) with the first of the board file's flashers "
                       "that sees exactly one board.")
    _common(p, model=False)
    p.add_argument("--model", help="flash build/<board>/<model>/firmware/dk_runner (built by "
                   "`deploykit build`)")
    p.add_argument("--image", type=Path, help="flash this .uf2 or .elf instead")
    _board_selection(p)

    p = sub.add_parser("monitor", help="find the board's serial port and print its decoded "
                       "results (a late open loses nothing)",
                       description="Find the board's serial port (by its USB VID/PID, or "
                       "--port), read one run's records and print them decoded.")
    _common(p, model=False, out_default="build/<board>/monitor")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds to wait for the results after the port opens (default 60)")
    p.add_argument("--port", metavar="PORT",
                   help="serial port or pyserial URL (default: found by the board's USB VID/PID)")

    p = sub.add_parser("matrix", help="build and run every board x model x flow x profile "
                       "a filter selects; one table of results, sizes and instructions per MAC",
                       description="Build every board x model x flow x profile (x patches "
                       "setting) the filter selects, run each where the board's runner is "
                       "available here, and write one table (terminal, <out>/matrix.md), "
                       "<out>/matrix.json and <out>/matrix.svg (instructions per MAC and RAM, "
                       "grouped per model): the tiles of the first layers, "
                       "result (PASS or the failure class), flash and RAM as "
                       "linked, RAM needed, instructions per inference, MACs, instructions per "
                       "MAC, planned activation memory against its lower bound, NPU segments "
                       "with Vela's estimate, CPU-fallback ops. A combination that cannot work "
                       "is a row with its reason. Exits 0 when every row that ran passed.")
    p.add_argument("--boards", nargs="+", metavar="BOARD", help="boards (default: all)")
    p.add_argument("--models", nargs="+", metavar="MODEL", help="models (default: all)")
    p.add_argument("--flows", nargs="+", metavar="FLOW", choices=flow_names(),
                   help="flows (default: each board's allowed flows)")
    p.add_argument("--profiles", nargs="+", metavar="PROFILE", choices=list(PROFILES),
                   help="build profiles (default: speed)")
    p.add_argument("--patches", nargs="+", metavar="auto|NxM|off",
                   help="patch settings of the first layers, each a column of combinations "
                   "(e.g. --patches off auto: the model with and without tiles side by side); "
                   "left out for flows that cannot tile (default: each board file's own, "
                   "docs/memory.md)")
    p.add_argument("-j", "--jobs", type=int, default=1,
                   help="worker processes (default 1); on 2 cores use -j 2 at most")
    p.add_argument("--out", type=Path, help="output directory (default build/matrix)")

    p = sub.add_parser("npu-sweep", help="Vela's estimate of a model over the Ethos-U "
                       "configurations (MACs x memory mode x system config); Pareto front",
                       description="Export the model once (ethos_u_int8, cached) and compile "
                       "its NPU delegates with Vela for each MAC configuration of the board's "
                       "NPU family x each memory mode x each system configuration of the board "
                       "file: estimated latency at the NPU clock, cycles, MAC utilisation, SRAM "
                       "and DRAM traffic per inference, arena and fast scratch, and whether the "
                       "memory plan fits the board. Prints the table with the Pareto front "
                       "(latency against SRAM) and the build command of the chosen point; "
                       "writes <out>/npu-sweep/sweep.json, sweep.md and sweep.svg. Exits 0 "
                       "when a point is chosen, 6 (memory) when none fits, 1 when none that "
                       "fits meets --latency-target. docs/npu.md.")
    p.add_argument("--board", help="board with an `npu:` section (default: the project "
                   "file's `board`)")
    p.add_argument("--model", help="model name or Python file (default: the project file's)")
    p.add_argument("--macs", type=int, nargs="+", metavar="N",
                   help="only these MAC configurations (default: all of the NPU family)")
    p.add_argument("--memory-modes", nargs="+", metavar="MODE",
                   help="only these of the board's npu.vela.memory_modes (default: all)")
    p.add_argument("--system-configs", nargs="+", metavar="NAME",
                   help="only these of the board's npu.vela.system_configs (default: all)")
    p.add_argument("--latency-target", type=float, metavar="MS",
                   help="choose the fitting point that meets this latency with the least "
                   "SRAM (default: choose the fastest fitting point)")
    p.add_argument("-j", "--jobs", type=int, default=1,
                   help="Vela compiles at once, one process each (default 1)")
    p.add_argument("--out", type=Path, help="output directory of the export (default "
                   "build/<board>/<model>); the sweep goes to <out>/npu-sweep")

    p = sub.add_parser("selftest", help="build and run the board-support self-test firmware "
                       "(no ExecuTorch needed)",
                       description="Build and run the board-support self-test firmware: "
                       "startup, UART, timer, exit and the result protocol, without ExecuTorch "
                       "(no `deploykit setup` needed).")
    _common(p, model=False, out_default="build/<board>/selftest-<variant>")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds (default 30)")
    p.add_argument("--variant", choices=["ok", "fault", "stack-overflow", "error", "hang"],
                   default="ok", help="make the firmware fault, report an error or hang on "
                   "purpose, and check that the host classifies the run exactly so (a hang: "
                   "times out, and on QEMU names the function it hung in) (default ok)")
    p = sub.add_parser("library", help="a self-contained component of one or more models "
                       "for your own CMake or pico-sdk project",
                       description="Export and plan each model, then build a component in "
                       "--out: one C header per model (include/dk_<name>.h: init, run, "
                       "zero-copy inputs and outputs, shapes, int8 parameters, arena sizes), "
                       "the ExecuTorch runtime with only the models' kernels (one registry), "
                       "each model's program in section .dk_model.<name>, a CMake package "
                       "(find_package(deploykit_<name> CONFIG), target deploykit::<name>), "
                       "README.md and manifest.json. docs/library.md.")
    p.add_argument("--board", help="board name from boards/ (its CPU flags are the "
                   "component's) or a path to a board file (default: the project file's)")
    p.add_argument("--model", action="append", dest="models",
                   help="model name from models/, a path to a Python file or a .pte; repeat "
                   "for several models in one component (default: the project file's model)")
    p.add_argument("--flow", choices=flow_names(),
                   help="export flow of every model (default: the board file's export.default)")
    p.add_argument("--npu-macs", type=int, metavar="N",
                   help="ethos_u_int8: the Ethos-U MAC configuration (default the board's "
                   "npu.macs)")
    p.add_argument("--npu-memory-mode", metavar="MODE",
                   help="ethos_u_int8: the Vela memory mode, one of the board's "
                   "npu.vela.memory_modes (where the program and the NPU's scratch must be "
                   "linked: the headers say)")
    p.add_argument("--profile", choices=list(PROFILES),
                   help=f"build profile (default: the board file's `profile:`, else "
                   f"{DEFAULT_PROFILE})")
    p.add_argument("--name", help="the component's name (default: the models' names joined "
                   "by _): find_package(deploykit_<name>), target deploykit::<name>")
    p.add_argument("--out", type=Path, required=True, help="the component's directory")
    p.add_argument("--timeout", type=float,
                   help="seconds for each --fit measurement run (default 120)")
    _fit_option(p)
    _farm_parser(sub)
    return parser


def _farm_parser(sub: Any) -> None:
    p = sub.add_parser("farm", help="a labgrid board farm: exporter configuration, places "
                       "(docs/farm.md)",
                       description="Boards on a labgrid farm: `deploykit run --place` runs on "
                       "them; these commands help set one up and watch it.")
    farm = p.add_subparsers(dest="farm_command", required=True, metavar="COMMAND")
    q = farm.add_parser("exporter-config", help="write a board's labgrid exporter YAML from "
                        "its board file (VID/PID of its serial port and BOOTSEL device)")
    _common(q, model=False, out_default="stdout")
    q.add_argument("--serial", required=True, metavar="USB_SERIAL",
                   help="the board's USB serial number (udev ID_SERIAL_SHORT)")
    q.add_argument("--name", metavar="GROUP", help="resource group and place name (default "
                   "<board>-<serial>)")
    q.add_argument("--probe", metavar="SERIAL", help="also export this SWD debug probe")
    q = farm.add_parser("status", help="the places: board kind, holder, last result")
    q.add_argument("--coordinator", metavar="HOST[:PORT]",
                   help="the labgrid coordinator (default $LG_COORDINATOR)")


def _farm(args: argparse.Namespace, out: _Output) -> int:
    if args.farm_command == "status":
        address, places = api.farm_status(args.coordinator)
        out.result({"coordinator": address, "places": places},
                   api.describe_places(address, places))
        return 0
    board = api.chosen(args.board,
                       project=False if args.no_project else args.project).board_or_error()
    cfg = api.farm_exporter_config(board, args.serial, group=args.name, probe=args.probe,
                                   out=args.out)
    out.result(cfg, f"wrote {args.out}" if args.out else cfg.text.rstrip())
    return 0


def _groups_help() -> str:
    """The optional project groups of west.yml and their projects, for `setup --group`."""
    from deploykit.readers.sources import read_manifest

    try:
        groups: dict[str, list[str]] = {}
        for project in read_manifest():
            if project.optional:
                for g in project.groups:
                    groups.setdefault(g, []).append(project.name)
    except (OSError, KeyError, TypeError):
        return "see west.yml"
    return "; ".join(f"{g}: {', '.join(names)}" for g, names in sorted(groups.items()))


def _profiles_help() -> str:
    """The profile table of `deploykit build --help`, from deploykit.pipeline.profiles itself."""
    return ("build profiles (--profile; a board file may set its default with `profile:`; "
            f"default {DEFAULT_PROFILE}; docs/profiles.md):\n\n"
            + "\n\n".join(p.describe() for p in PROFILES.values()))


def _fit_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fit", action="store_true", default=None,
                   help="measure the model's memory on the board's runner first (generous "
                   "pools, one run), then link the pools and stack at the measured peaks plus a "
                   "small margin; stored in <out>/fit.json, so later builds of the same .pte and "
                   "runtime are exact without running again (docs/memory.md)")


def _model_optional(p: argparse.ArgumentParser) -> None:
    """--model is not required where --pte may replace it."""
    for action in p._actions:
        if action.dest == "model":
            action.required = False


def _board_selection(p: argparse.ArgumentParser) -> None:
    """The options the runners declare (a board's runner takes its own; see runners/)."""
    for option in runner_options():
        p.add_argument(option.flag, dest=option.dest, metavar=option.metavar,
                       help=option.help)


def _given_runner_options(args: argparse.Namespace) -> dict[str, Any]:
    return {o.dest: getattr(args, o.dest, None) for o in runner_options()}


def _setting_options(args: argparse.Namespace) -> dict[str, Any]:
    """The settings `deploykit config` was given (pipeline/project.py's names)."""
    names = ("flow", "profile", "npu_macs", "npu_memory_mode", "strict", "patches", "fit",
             "inputs",
             "expect", "atol", "rtol", "timeout")
    return {**{n: getattr(args, n, None) for n in names}, **_given_runner_options(args)}


def _dispatch(args: argparse.Namespace, out: _Output) -> int:
    cmd = args.command
    project = False if args.no_project else args.project
    if cmd == "profiles":
        if args.cmake:
            defs = PROFILES[args.cmake].cmake_definitions()
            out.result(defs, " ".join(f'"-D{k}={v}"' for k, v in defs.items()))
        else:
            out.result(list(PROFILES.values()), _profiles_help())
        return 0
    if cmd == "boards":
        boards, broken = api.boards_and_errors()
        for error in broken:  # a user's broken board file does not hide the others
            print(f"deploykit: error: {error}", file=sys.stderr)
        payload = [{**to_jsonable(b), "origin": api.board_origin(b)} for b in boards]
        out.result(payload, "\n".join(api.describe_board(b) for b in boards))
        return int(ExitCode.CONFIG) if broken else 0
    if cmd == "doctor":
        checks = api.doctor(args.workspace)
        lines = [f"{('warn' if c.warning else 'ok  ') if c.ok else 'NO  '} {c.name:<19} "
                 f"{c.detail}" + (f"\n      fix: {c.fix}" if c.fix and (c.warning or not c.ok)
                                  else "") for c in checks]
        out.result(checks, "\n".join(lines))
        return 0 if all(c.ok for c in checks) else int(ExitCode.ENVIRONMENT)
    if cmd == "setup":
        ws = api.setup(args.workspace, args.source, progress=out.progress, groups=args.group,
                       forget=args.forget)
        text = "\n".join(f"{p.name:<12} {p.commit[:12]}  {p.origin}  {ws.root / p.path}"
                         for p in ws.projects.values())
        if ws.overrides:
            text += ("\nremembered overrides (used again by the next setup; --forget NAME): "
                     + ", ".join(o.describe() for o in ws.overrides.values()))
        out.result(ws, text)
        return 0
    if cmd == "explore":
        if args.setup:
            env = api.explore_setup(wheels=args.wheels, progress=out.progress)
            out.result(env, f"Model Explorer environment: {env.path}")
            return 0
        if args.pte is None:
            raise ConfigError("explore needs a .pte file.",
                              "deploykit explore build/<board>/<model>/export/model.pte, or "
                              "--setup to only create the Model Explorer environment.")

        def ready(session: Any) -> None:
            out.result(session, f"Model Explorer: {session.url}\n(Ctrl-C stops it)")
            sys.stdout.flush()  # the URL now, while the server runs

        api.explore(args.pte, port=args.port, open_browser=not args.no_browser,
                    tosa=args.tosa, node_data=args.node_data, profile=args.profile,
                    intermediates=args.intermediates, auto_data=not args.no_auto_data,
                    wheels=args.wheels,
                    progress=out.progress, on_ready=ready)
        return 0
    if cmd == "inspect":
        info = api.inspect(args.pte)
        out.result(api.program_json(info), api.describe_program(info))
        return 0
    if cmd == "farm":
        return _farm(args, out)
    if cmd == "flash":
        if getattr(args, "place", None):
            raise ConfigError("`deploykit flash` flashes a board on this machine; --place is "
                              "for `deploykit run`.", "Use deploykit run --place NAME.")
        chosen = api.chosen(args.board, args.model, project=project)
        result = api.flash(chosen.board_or_error(), model=None if args.image else chosen.model,
                           image=args.image, out=args.out, port=args.port, probe=args.probe,
                           workspace=args.workspace, progress=out.progress)
        out.result(result, result.summary())
        return 0
    if cmd == "monitor":
        board = api.chosen(args.board, project=project).board_or_error()
        report = api.monitor(board, port=args.port, timeout=args.timeout, out=args.out,
                             progress=out.progress)
        out.result(report, report.summary())
        return 0 if report.ok else int(report.exit_code)
    if cmd == "matrix":
        from deploykit.pipeline.matrix import table

        rows = api.matrix(args.boards, args.models, args.flows, args.profiles, args.out,
                          args.workspace, args.jobs, progress=out.progress,
                          patches=args.patches)
        out.result(rows, table(rows))
        return 0 if all(r.result in ("PASS", "BUILT") for r in rows) else 1
    if cmd == "npu-sweep":
        from deploykit.pipeline.npu_sweep import table as sweep_table
        from deploykit.pipeline.npu_sweep import to_json as sweep_json

        result = api.npu_sweep(args.board, args.model, macs=args.macs,
                               memory_modes=args.memory_modes,
                               system_configs=args.system_configs, jobs=args.jobs,
                               latency_target_ms=args.latency_target, out=args.out,
                               progress=out.progress, project=project)
        files = "\n".join(f"{k}: {v}" for k, v in result.files.items())
        out.result(sweep_json(result), f"{sweep_table(result)}\n{files}")
        if result.chosen is not None:
            return 0
        # None fits (the memory class), or the latency target is met by none that fits.
        return 1 if any(r.result == "fits" for r in result.rows) else int(ExitCode.MEMORY)
    if cmd == "library":
        component = api.library(args.board, args.models, args.out, flow=args.flow,
                                workspace=args.workspace, progress=out.progress,
                                profile=args.profile, fit=args.fit, name=args.name,
                                timeout=args.timeout, npu_macs=args.npu_macs,
                                npu_memory_mode=args.npu_memory_mode, project=project)
        out.result(component.manifest, component.summary())
        return 0
    if cmd == "init":
        scaffold = api.init(args.directory)
        out.result({"directory": scaffold.directory, "files": scaffold.files},
                   scaffold.summary())
        return 0
    if cmd == "config":
        choices, rows = api.config(args.board, args.model, project=project,
                                   **_setting_options(args))
        payload = {"project_file": choices.project.path if choices.project else None,
                   "settings": {r.name: {"value": r.value, "source": r.source} for r in rows}}
        out.result(payload, api.describe_config(choices, rows))
        return 0
    if cmd == "selftest":
        board = api.chosen(args.board, project=project).board_or_error()
        report = api.selftest(board, out=args.out, workspace=args.workspace,
                              progress=out.progress, timeout=args.timeout or 30.0,
                              variant=args.variant)
        out.result(report, report.summary())
        return 0 if report.passed else int(report.exit_code)
    common = {"board": args.board, "model": args.model, "out": args.out,
              "progress": out.progress, "flow": args.flow, "npu_macs": args.npu_macs,
              "npu_memory_mode": args.npu_memory_mode, "profile": args.profile,
              "strict": args.strict, "patches": args.patches, "project": project}
    if cmd == "export":
        result = api.export(**common)
        out.result(result, api.describe_export(result))
        return 0
    common["workspace"] = args.workspace
    if cmd == "plan":
        plan = api.plan(**common, pte=args.pte)
        what = args.pte or args.model or api.chosen(args.board, project=project).model
        out.result(plan.to_json(), f"memory plan of {what} on {plan.board}:\n{plan.table()}")
        return 0
    if cmd == "build":
        fw = api.build(**common, fit=args.fit)
        out.result(fw, fw.summary())
        return 0
    runner = _given_runner_options(args)
    if cmd == "run":
        report = api.run(**common, timeout=args.timeout, runner_options=runner,
                         inputs=args.inputs, atol=args.atol, rtol=args.rtol, fit=args.fit,
                         expect=args.expect, no_compare=args.no_compare)
        if not args.debug_intermediates:
            out.result(report, report.summary(verbose=args.verbose))
            return 0 if report.passed else int(report.exit_code)
        debug = api.debug_intermediates(**common, timeout=args.timeout, runner_options=runner,
                                        atol=args.atol, rtol=args.rtol, fit=args.fit)
        out.result({"run": to_jsonable(report), "intermediates": debug.json()},
                   f"{report.summary(verbose=args.verbose)}\n\n{debug.text()}")
        if not report.passed:
            return int(report.exit_code)
        return int(ExitCode.MISMATCH) if debug.diverged else 0
    if cmd == "validate":
        from deploykit.run.accuracy import report_json

        validation = api.validate(**common, dataset=args.dataset, inputs=args.inputs,
                                  limit=args.limit, calibration=args.calibration,
                                  max_accuracy_drop=args.max_drop,
                                  on_board=not args.host_only, timeout=args.timeout,
                                  runner_options=runner)
        out.result(report_json(validation), validation.summary())
        return 0 if validation.passed else int(validation.exit_code)
    if cmd == "profile":
        profiled = api.profile(**common, timeout=args.timeout, runner_options=runner,
                               fit=args.fit)
        out.result(profiled.json(), profiled.text())
        return 0
    raise AssertionError(cmd)


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # `deploykit boards | head -1`: the reader went away; say nothing more. Python would
        # report the pipe again when it flushes stdout at exit, so point stdout at devnull.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a command a pipe closed on


def _main(argv: list[str] | None) -> int:
    try:
        parser = build_parser()  # lists the installed flows: a broken extension stops here
    except DeployKitError as exc:
        print(f"deploykit: error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    args = parser.parse_args(argv)
    route_third_party_logs(debug=args.debug)
    out = _Output(args.json, quiet=args.quiet)
    for kind in ("boards", "models"):
        path = getattr(args, f"{kind}_dir")
        if path is not None and not path.is_dir():
            print(f"deploykit: error: --{kind}-dir {path} is not a directory.",
                  file=sys.stderr)
            return int(ExitCode.CONFIG)
        set_user_dir(kind, path)
    try:
        return _dispatch(args, out)
    except DeployKitError as exc:
        out.close()
        if args.debug:
            raise
        print(f"deploykit: error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        out.close()
        print("deploykit: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        if exc.errno not in NO_SPACE_ERRNOS or args.debug:
            raise
        # A write no stage expected to fail (a log, a lock file): the file system is full.
        out.close()
        if exc.filename:
            full = disk_full(exc.filename, exc)
        else:  # a buffered write that failed when flushed: which file is not known
            full = DiskFullError("A file system deploykit writes to is full (No space left on "
                                 "device).", "Free space where the command writes (its --out, "
                                 "the workspace) and run it again; nothing half-written is "
                                 "kept.")
        print(f"deploykit: error: {full}", file=sys.stderr)
        return int(full.exit_code)
    finally:
        out.close()


if __name__ == "__main__":
    sys.exit(main())
