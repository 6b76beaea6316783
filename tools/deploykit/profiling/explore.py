"""`deploykit explore`: a `.pte` (or its delegates' TOSA graphs) in Google's Model Explorer.

Model Explorer and Arm's adapters live in a tool environment of their own (deploykit.util.tool_env),
never in deploykit's: explore runs `python -m model_explorer` of that environment as a child
process, bound to 127.0.0.1, and prints its URL (and opens it in the browser unless
`--no-browser`). Ctrl-C stops the server and returns normally.

- The `.pte` view goes through the PTE adapter: the method's instructions (kernel calls and
  delegate calls) with each delegate as its own subgraph.
- `--tosa`: the TOSA flatbuffer of each Ethos-U delegate, kept by the ethos_u_int8 export as
  `delegate_<i>.tosa` beside the `.pte`, through the TOSA adapter: the graph Vela compiled.
  Its NPU operators carry Vela's per-operator estimate (export.json), cycles and share of the
  delegate, on the TOSA node whose output Vela names the operator by (the adapter's own ids).
- Node data: deploykit overlays the segment of each instruction (NPU delegate or CPU) as a
  Model Explorer node data file keyed by the adapter's own node ids (read from the adapter's
  conversion, not guessed). `--profile` (a `deploykit profile` profile.json) overlays each
  instruction's time and share of execute(), `--intermediates` (a `run
  --debug-intermediates` intermediates.json) each instruction's max abs error; both are
  matched by (chain, instruction index), checked against the .pte's own instruction list,
  and picked up from the model's out directory when the .pte is `<out>/export/*.pte`.
  `node_data_file` writes a file from {(graph id, node id): value}, and `--node-data FILE`
  passes any such file through.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import webbrowser
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploykit.flows.base import FLOW_FILE_GLOBS
from deploykit.util.errors import ConfigError, EnvironmentProblem
from deploykit.util.tool_env import ToolEnv, ensure

HOST = "127.0.0.1"  # never another interface: the server reads local files on request
DEFAULT_PORT = 8080  # Model Explorer's own default; the next free one up to 8099, then any
PTE_ADAPTER = "pte_adapter_model_explorer"
TOSA_ADAPTER = "tosa_adapter_model_explorer"
SEGMENT_COLORS = {"NPU": "#4caf50", "CPU": "#ff9800"}
# Time and error: pale at the graph's smallest value, deep red at its largest (Model Explorer
# interpolates between the stops).
HEAT_GRADIENT = ((0.0, "#fff5f0"), (1.0, "#cb181d"))
METHOD = "forward"  # the method deploykit exports, and the PTE adapter's id of its graph
STARTUP_SECONDS = 120.0  # the first start compiles the environment's bytecode
STOP_SECONDS = 10.0

Progress = Callable[[str], None]


@dataclass(frozen=True)
class AdapterNode:
    """One node of the PTE adapter's graph, as far as the overlays need it."""

    graph: str
    id: str
    label: str
    instruction: str  # "KernelCall", "DelegateCall", ... ("" for graph inputs/outputs)
    subgraphs: tuple[str, ...] = ()


@dataclass(frozen=True)
class ExploreSession:
    """What explore served: the URL, the files shown, the node data overlaid."""

    url: str
    port: int
    models: tuple[Path, ...]
    node_data: tuple[Path, ...]


@dataclass(frozen=True)
class Overlay:
    """Per-instruction values of one fact, keyed by (chain, instruction index) of the method."""

    name: str
    values: dict[tuple[int, int], float]


def tosa_files(pte: Path) -> list[Path]:
    """The TOSA flatbuffers of the delegates of the export that `pte` belongs to, in delegate
    order (export.json's partition, else the files beside the .pte)."""
    export_dir = pte.parent
    report = export_dir / "export.json"
    names: list[str] = []
    with contextlib.suppress(OSError, ValueError, AttributeError):
        delegates = json.loads(report.read_text()).get("partition", {}).get("delegates", [])
        names = [d["tosa_file"] for d in delegates if d.get("tosa_file")]
    if not names:
        names = sorted(
            (p.name for g in FLOW_FILE_GLOBS for p in export_dir.glob(g)),
            key=lambda n: int(re.sub(r"\D", "", n) or 0),
        )
    files = [export_dir / n for n in names if (export_dir / n).is_file()]
    if not files:
        raise ConfigError(
            f"No TOSA graph beside {pte} (the ethos_u_int8 export keeps each delegate's as "
            "delegate_<i>.tosa).",
            "Export the model with the ethos_u_int8 flow (a board with an NPU, e.g. "
            "corstone-320) with this version of deploykit, then run explore --tosa on that "
            ".pte; a CPU-only .pte has no TOSA graph.",
        )
    return files


def tosa_output_names(env: ToolEnv, tosa: Path) -> dict[tuple[str, str], str]:
    """(graph, node id) -> the name of the node's first output, as the TOSA adapter converts
    `tosa` in the tool environment. Vela names an NPU operator by that tensor."""
    script = (
        "import json, sys\n"
        f"from {TOSA_ADAPTER}.main import TosaFlatbufferAdapter\n"
        "out = []\n"
        "for g in TosaFlatbufferAdapter().convert(sys.argv[1], {})['graphs']:\n"
        "    for n in g.nodes:\n"
        "        meta = list(getattr(n, 'outputsMetadata', None) or [])\n"
        "        a = {x.key: x.value for x in meta[0].attrs} if meta else {}\n"
        "        out.append([g.id, n.id, a.get('name', '')])\n"
        "print(json.dumps(out))\n"
    )
    rows = _adapter_rows(env, script, tosa, "TOSA adapter",
                         "Export the model again (deploykit export): the file may be cut short.")
    return {(g, i): name for g, i, name in rows if name}


def _adapter_rows(env: ToolEnv, script: str, path: Path, adapter: str, fix: str) -> list[Any]:
    """The JSON rows `script` prints (its last line) for `path`, run in the tool environment;
    a failure names the adapter, its last message and `fix`."""
    proc = subprocess.run(
        [str(env.python), "-c", script, str(path)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise EnvironmentProblem(f"The {adapter} could not read {path}: {last}", fix)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def vela_estimate_values(names: Mapping[tuple[str, str], str],
                         layers: Iterable[tuple[str, int]]
                         ) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]:
    """Vela's (operator name, cycles) of one delegate on the TOSA nodes that output those
    names: (graph, node id) -> cycles, and -> share of the delegate's cycles in percent. An
    operator whose name no node outputs gets no value."""
    cycles_of = dict(layers)
    total = sum(cycles_of.values())
    cycles = {key: float(cycles_of[name]) for key, name in names.items() if name in cycles_of}
    share = {key: 100.0 * value / total for key, value in cycles.items()} if total else {}
    return cycles, share


def _vela_layers(pte: Path) -> dict[int, list[tuple[str, int]]]:
    """Delegate index -> Vela's (operator name, cycles), from the export report beside `pte`."""
    from deploykit.program.inspect import inspect_pte

    return {d.index: [(layer.name, layer.cycles) for layer in d.vela_estimate.layers]
            for d in inspect_pte(pte).delegates
            if d.vela_estimate is not None and d.vela_estimate.layers}


def adapter_nodes(env: ToolEnv, pte: Path) -> list[AdapterNode]:
    """The PTE adapter's nodes for `pte`, converted in the tool environment."""
    script = (
        "import json, sys\n"
        f"from {PTE_ADAPTER}.main import PTEAdapter\n"
        "out = []\n"
        "for c in PTEAdapter().convert(sys.argv[1], {})['graphCollections']:\n"
        "    for g in c.graphs:\n"
        "        for n in g.nodes:\n"
        "            a = {x.key: x.value for x in n.attrs}\n"
        "            out.append([g.id, n.id, n.label, a.get('Instruction Type', ''),\n"
        "                        list(getattr(n, 'subgraphIds', None) or [])])\n"
        "print(json.dumps(out))\n"
    )
    rows = _adapter_rows(env, script, pte, "PTE adapter",
                         "Check that the file is an ExecuTorch program (.pte).")
    return [AdapterNode(g, i, label, kind, tuple(subs)) for g, i, label, kind, subs in rows]


def segment_values(nodes: Iterable[AdapterNode]) -> dict[tuple[str, str], tuple[float, str]]:
    """(graph, node id) -> (value, colour): 1 for a delegate call (the NPU), 0 for a kernel
    call (the CPU). Graph inputs/outputs and the delegates' own subgraphs carry none."""
    out = {}
    for n in nodes:
        if n.instruction == "DelegateCall":
            out[(n.graph, n.id)] = (1.0, SEGMENT_COLORS["NPU"])
        elif n.instruction == "KernelCall":
            out[(n.graph, n.id)] = (0.0, SEGMENT_COLORS["CPU"])
    return out


def instruction_node_id(chain: int, instruction: int, method: str = METHOD) -> str:
    """The PTE adapter's node id of a method's instruction: `<method>_<chain>_<instruction>`."""
    return f"{method}_{chain}_{instruction}"


def _read_report(path: Path, what: str, fix: str) -> dict:
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"Cannot read {what} {path}: {exc}", fix) from None
    if not isinstance(report, dict):
        raise ConfigError(f"{path} is not {what} (not a JSON object).", fix)
    return report


def _check_program(
    path: Path, found: Mapping[tuple[int, int], str], program: Mapping[tuple[int, int], str]
) -> None:
    """Every instruction of the file runs the same operator in the .pte, or the file is of
    another program and its values would land on the wrong nodes."""
    for (chain, index), operator in sorted(found.items()):
        there = program.get((chain, index))
        if there != operator:
            raise ConfigError(
                f"{path} is not of this program: its instruction {chain}:{index} is "
                f"{operator}, the .pte's is {there or 'missing'}.",
                "Re-run it on this export, or give the file that belongs to this .pte.",
            )


def profile_overlays(path: Path, program: Mapping[tuple[int, int], str]) -> tuple[Overlay, Overlay]:
    """Each instruction's time per run (instructions under QEMU, cycles on hardware) and its
    share of execute(), from a `deploykit profile` profile.json. `program` maps (chain,
    instruction index) to what the .pte runs there (profiling.trace.program_instructions)."""
    fix = "Give the profile.json `deploykit profile` wrote (<out>/profile/profile.json)."
    report = _read_report(path, "a deploykit profile", fix)
    rows = report.get("instructions")
    clock = report.get("clock") or {}
    unit = clock.get("unit") if isinstance(clock, dict) else None
    if not isinstance(rows, list) or not unit:
        raise ConfigError(
            f"{path} has no per-instruction times (written before they were recorded).",
            "Run `deploykit profile` again for this model.",
        )
    iterations = max(1, int(report.get("iterations") or 1))
    try:
        found = {(int(r["chain"]), int(r["instruction"])): str(r["operator"]) for r in rows}
        times = {
            (int(r["chain"]), int(r["instruction"])): float(r[unit]) / iterations for r in rows
        }
        shares = {(int(r["chain"]), int(r["instruction"])): 100 * float(r["share"]) for r in rows}
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: an instruction entry lacks {exc}.", fix) from None
    _check_program(path, found, program)
    return (
        Overlay(f"time ({unit} per run)", times),
        Overlay("share of execute() (%)", shares),
    )


def intermediates_overlay(path: Path, program: Mapping[tuple[int, int], str]) -> Overlay:
    """Each instruction's max abs error against the host (the largest over its outputs), from
    a `run --debug-intermediates` intermediates.json. An instruction without a comparable
    output gets no value."""
    fix = (
        "Give the intermediates.json `deploykit run --debug-intermediates` wrote "
        "(<out>/debug/intermediates.json)."
    )
    report = _read_report(path, "a --debug-intermediates report", fix)
    rows = report.get("operators")
    if not isinstance(rows, list):
        raise ConfigError(f"{path} has no operator list.", fix)
    found: dict[tuple[int, int], str] = {}
    errors: dict[tuple[int, int], float] = {}
    try:
        for r in rows:
            key = (int(r["chain"]), int(r["instruction"]))
            found[key] = str(r["operator"])
            if r["max_abs"] is not None:
                errors[key] = max(errors.get(key, 0.0), float(r["max_abs"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: an operator entry lacks {exc}.", fix) from None
    _check_program(path, found, program)
    return Overlay("max abs error vs host (integer outputs: steps)", errors)


def overlay_values(overlay: Overlay, nodes: Iterable[AdapterNode]) -> dict[tuple[str, str], float]:
    """(graph, node id) -> value for the method's nodes the adapter has; an instruction
    without a value gets none."""
    ids = {(n.graph, n.id) for n in nodes if n.instruction and n.graph == METHOD}
    out = {}
    for (chain, index), value in overlay.values.items():
        key = (METHOD, instruction_node_id(chain, index))
        if key in ids:
            out[key] = value
    return out


@dataclass(frozen=True)
class DataFiles:
    """The profile and intermediates files to overlay (None: none)."""

    profile: Path | None
    intermediates: Path | None


def find_data_files(
    pte: Path, profile: Path | None, intermediates: Path | None, auto: bool, say: Progress
) -> DataFiles:
    """The files given, else (with `auto`) those of the model's out directory when the .pte
    lies in `<out>/export/`: `<out>/profile/profile.json` and `<out>/debug/intermediates.json`,
    if they exist and are not older than the .pte. Says which it takes, and which it skips."""
    for given in (profile, intermediates):
        if given is not None and not given.is_file():
            raise ConfigError(
                f"No such file: {given}.",
                "Give the profile.json of `deploykit profile` or the intermediates.json of "
                "`deploykit run --debug-intermediates`.",
            )
    if not auto or pte.parent.name != "export":
        return DataFiles(profile, intermediates)
    out = pte.parent.parent

    def pick(given: Path | None, found: Path) -> Path | None:
        if given is not None or not found.is_file():
            return given
        if found.stat().st_mtime < pte.stat().st_mtime:
            say(f"not overlaying {found}: it is older than {pte.name} (give it explicitly)")
            return None
        say(f"overlaying {found}")
        return found

    return DataFiles(
        pick(profile, out / "profile" / "profile.json"),
        pick(intermediates, out / "debug" / "intermediates.json"),
    )


def node_data_file(
    path: Path,
    name: str,
    values: Mapping[tuple[str, str], float | tuple[float, str]],
    gradient: Iterable[tuple[float, str]] = (),
) -> Path:
    """Write a Model Explorer node data file (its ModelNodeData JSON: graph id -> results by
    node id). A value may carry its background colour; else `gradient` (stops from 0, the
    graph's smallest value, to 1, its largest, with colours) colours the nodes. The hook for
    any further overlay keyed by the adapter's node ids."""
    stops = [{"stop": stop, "bgColor": color} for stop, color in gradient]
    graphs: dict[str, dict[str, object]] = {}
    for (graph, node), value in sorted(values.items()):
        number, color = value if isinstance(value, tuple) else (value, None)
        result: dict[str, object] = {"value": number}
        if color:
            result["bgColor"] = color
        entry = graphs.setdefault(graph, {"name": name, "results": {}})
        if stops:
            entry["gradient"] = stops
        entry["results"][node] = result  # type: ignore[index]
    path.write_text(json.dumps(graphs, indent=2, sort_keys=True) + "\n")
    return path


def free_port(preferred: int | None) -> int:
    """`preferred` if given (an error when taken), else Model Explorer's default range
    8080-8099, else any free loopback port."""
    if preferred is not None:
        if not 0 < preferred < 65536:
            raise ConfigError(f"--port {preferred} is not a TCP port.", "Give 1..65535.")
        if not _bindable(preferred):
            raise ConfigError(
                f"Port {preferred} on {HOST} is in use.",
                "Choose another with --port, or omit it for a free one.",
            )
        return preferred
    for port in range(DEFAULT_PORT, DEFAULT_PORT + 20):
        if _bindable(port):
            return port
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def explore(
    pte: Path,
    *,
    port: int | None = None,
    open_browser: bool = True,
    tosa: bool = False,
    node_data: Iterable[Path] = (),
    profile: Path | None = None,
    intermediates: Path | None = None,
    auto_data: bool = True,
    wheels: Path | None = None,
    progress: Progress | None = None,
    on_ready: Callable[[ExploreSession], None] | None = None,
) -> ExploreSession:
    """Serve Model Explorer on `pte` (or, with `tosa`, its delegates' TOSA graphs) until the
    server ends or Ctrl-C stops it. `profile`/`intermediates` overlay per-instruction time and
    error (with `auto_data`, found in the model's out directory when not given). `on_ready` is
    told the session once the server answers (default: print the URL)."""
    say = progress or (lambda _msg: None)
    pte = Path(pte)
    if not pte.is_file():
        raise ConfigError(f"No .pte file at {pte}.", "Run `deploykit export` first.")
    extra = [Path(p) for p in node_data]
    for p in extra:
        if not p.is_file():
            raise ConfigError(
                f"No node data file at {p}.", "Give a Model Explorer node data JSON file."
            )
    if tosa and (profile or intermediates):
        raise ConfigError(
            "--profile and --intermediates overlay the .pte's instructions, not the TOSA view.",
            "Leave out --tosa to see them.",
        )
    data = (
        DataFiles(None, None)
        if tosa
        else find_data_files(pte, profile, intermediates, auto_data, say)
    )
    overlays_in: list[Overlay] = []
    if data.profile or data.intermediates:
        from deploykit.readers.trace import program_instructions

        program = {k: v.name for k, v in program_instructions(pte.read_bytes()).items()}
        if data.profile:
            overlays_in += profile_overlays(data.profile, program)
        if data.intermediates:
            overlays_in.append(intermediates_overlay(data.intermediates, program))
    models = tosa_files(pte) if tosa else [pte]
    for p in [*models, *extra]:
        if "," in str(p.resolve()):  # Model Explorer splits its file lists at commas
            raise ConfigError(
                f"Model Explorer cannot open {p}: its path has a comma.",
                "Move or link the file to a path without one.",
            )
    port = free_port(port)  # a bad --port is refused before any environment work
    env = ensure(wheels=wheels, progress=say)
    with tempfile.TemporaryDirectory(prefix="dk-explore-") as tmp:
        overlays = list(extra)
        if not tosa:
            say("reading the graph's node ids (PTE adapter)")
            nodes = adapter_nodes(env, pte)
            segments = segment_values(nodes)
            facts = []
            if segments:
                facts.append(
                    node_data_file(
                        Path(tmp) / "segment.json", "segment (1 = NPU, 0 = CPU)", segments
                    )
                )
            for n, overlay in enumerate(overlays_in):
                values = overlay_values(overlay, nodes)
                if values:
                    facts.append(
                        node_data_file(
                            Path(tmp) / f"data-{n}.json", overlay.name, values, HEAT_GRADIENT
                        )
                    )
            overlays[:0] = facts
        else:
            overlays[:0] = _vela_overlays(env, pte, models, Path(tmp), say)
        return _serve(
            env,
            port,
            tuple(m.resolve() for m in models),
            tuple(overlays),
            open_browser,
            say,
            on_ready,
        )


def _vela_overlays(env: ToolEnv, pte: Path, models: list[Path], tmp: Path,
                   say: Progress) -> list[Path]:
    """Node data files of Vela's per-operator estimate on each delegate's TOSA graph: its
    cycles and its share of the delegate, one pair per delegate (each graph is `main`)."""
    layers = _vela_layers(pte)
    files = []
    for model in models:
        index = int(re.sub(r"\D", "", model.stem) or 0)
        if index not in layers:
            continue
        say(f"overlaying Vela's per-operator estimate on {model.name}")
        cycles, share = vela_estimate_values(tosa_output_names(env, model), layers[index])
        if not cycles:
            continue
        files += [
            node_data_file(tmp / f"vela-{index}-cycles.json",
                           f"delegate {index}: NPU cycles (Vela estimate)", cycles,
                           HEAT_GRADIENT),
            node_data_file(tmp / f"vela-{index}-share.json",
                           f"delegate {index}: % of the delegate (Vela estimate)", share,
                           HEAT_GRADIENT),
        ]
    return files


def _serve(
    env: ToolEnv,
    port: int,
    models: tuple[Path, ...],
    overlays: tuple[Path, ...],
    open_browser: bool,
    say: Progress,
    on_ready: Callable[[ExploreSession], None] | None,
) -> ExploreSession:
    cmd = [
        str(env.python),
        "-m",
        "model_explorer",
        ",".join(str(m) for m in models),
        "--host",
        HOST,
        "--port",
        str(port),
        "--extensions",
        f"{PTE_ADAPTER},{TOSA_ADAPTER}",
        "--no_open_in_browser",
    ]
    if overlays:
        cmd += ["--node_data_paths", ",".join(str(p.resolve()) for p in overlays)]
    say(f"starting Model Explorer on {HOST}:{port}")
    # Its own process group: Ctrl-C reaches deploykit, which stops the server itself (and
    # waits for it), instead of both racing on the terminal's signal.
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
        preexec_fn=_end_with_parent,
    )
    ready = threading.Event()
    found: list[str] = []
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip())
            if not found and line.startswith(f"http://{HOST}:"):
                found.append(line.strip())
                ready.set()
        ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not ready.wait(STARTUP_SECONDS) or not found:
            _stop(proc)
            tail = "\n".join(lines[-8:]) or "no output"
            raise EnvironmentProblem(
                f"Model Explorer did not start on {HOST}:{port}:\n{tail}",
                "Run `deploykit doctor`; try another --port.",
            )
        session = ExploreSession(found[0], port, models, overlays)
        (on_ready or _print_url)(session)
        if open_browser:
            webbrowser.open_new_tab(session.url)
        code = proc.wait()
        if code != 0:
            raise EnvironmentProblem(
                f"Model Explorer stopped with exit code {code}:\n" + "\n".join(lines[-8:]),
                "Run `deploykit doctor`.",
            )
        return session
    except KeyboardInterrupt:
        _stop(proc)
        print("Model Explorer stopped.", file=sys.stderr, flush=True)
        return ExploreSession(found[0] if found else "", port, models, overlays)
    finally:
        _stop(proc)
        reader.join(timeout=2)


def _end_with_parent() -> None:
    """In the server process (Linux): SIGTERM when deploykit ends, however it ends, so that
    a killed deploykit leaves no server holding the port (its own session shields it from the
    terminal's signals)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _print_url(session: ExploreSession) -> None:
    print(f"Model Explorer: {session.url}\n(Ctrl-C stops it)", flush=True)


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGINT (Model Explorer's own way to stop), then SIGKILL if it does not end."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(STOP_SECONDS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
