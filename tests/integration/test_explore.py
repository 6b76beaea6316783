"""`deploykit explore` for real: the pinned Model Explorer environment (created once per machine
in the user cache, then reused), deploykit's own `.pte` and TOSA files through Arm's adapters,
the server on loopback stopped by Ctrl-C, and the page in headless Chromium.

The environment needs PyPI the first time (about 40 s, 0.7 GB); where it cannot be created
the tests skip and say why. The concurrency test builds a second environment from a local
wheel directory (`--wheels`, no index), with two first uses at once. The browser tests need
Debian's `chromium` (`apt-get install chromium`); screenshots go to
$DEPLOYKIT_TEST_ARTIFACTS (default: the test's temporary directory)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from deploykit.profiling import explore
from deploykit.program.export import export
from deploykit.program.inspect import inspect_pte
from deploykit.program.models import load_model
from deploykit.readers.boards import load_board
from deploykit.readers.npu import npu_config
from deploykit.readers.trace import program_instructions
from deploykit.util import tool_env
from deploykit.util.errors import EnvironmentProblem
from tests import chromium
from tests.lines import Lines
from tests.perturb import perturb_requantize_scale
from tests.unit.test_explore_node_data import (
    lay_out_recorded_program,
    write_intermediates,
    write_profile,
)

REPO = Path(__file__).resolve().parents[2]
# The adapters' extension ids (their AdapterMetadata), as the server's API names them.
PTE_ADAPTER_ID = "pte_adapter_model_explorer"
TOSA_ADAPTER_ID = "tosa_flatbuffer_adapter"
# Adapter conversion in the tool environment: graph collections -> graphs -> nodes.
CONVERT = """
import json, sys
from pte_adapter_model_explorer.main import PTEAdapter
from tosa_adapter_model_explorer.main import TosaFlatbufferAdapter
path = sys.argv[1]
def graph(g):
    return {"id": g.id, "nodes": [
        {"id": n.id, "label": n.label,
         "instruction": {a.key: a.value for a in n.attrs}.get("Instruction Type", ""),
         "subgraphs": list(getattr(n, "subgraphIds", None) or [])} for n in g.nodes]}
if path.endswith(".tosa"):
    out = {"tosa": [graph(g) for g in TosaFlatbufferAdapter().convert(path, {})["graphs"]]}
else:
    out = {c.label: [graph(g) for g in c.graphs]
           for c in PTEAdapter().convert(path, {})["graphCollections"]}
print(json.dumps(out))
"""


def index_unreachable() -> str | None:
    """Why pip cannot reach its package index for the pinned Model Explorer, or None when it
    can. Asked the way the environment is made: this Python's pip, with its configuration."""
    name = tool_env.PINS[0].split("==")[0]
    try:
        res = subprocess.run(
            [sys.executable, "-m", "pip", "index", "versions", name],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        )
    except subprocess.TimeoutExpired:
        return f"pip index versions {name} got no answer in 300 s"
    if res.returncode == 0:
        return None
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    return f"pip index versions {name}: {lines[-1] if lines else f'exit {res.returncode}'}"


@pytest.fixture(scope="session")
def model_explorer_env() -> tool_env.ToolEnv:
    try:
        return tool_env.ensure(progress=lambda msg: print(msg, file=sys.stderr))
    except EnvironmentProblem as exc:
        problem = f"{exc.cause}\n{exc.hint or ''}"
    # Without the package index (and no wheel directory given) the environment cannot be
    # made here: that is the machine, a skip. Anything else is deploykit's failure.
    if not os.environ.get(tool_env.WHEELS_ENV):
        unreachable = index_unreachable()
        if unreachable is not None:
            pytest.skip(
                f"the Model Explorer environment needs the package index, which is not "
                f"reachable ({unreachable}); or ${tool_env.WHEELS_ENV} with the wheels"
            )
    pytest.fail(
        f"the Model Explorer environment could not be created at {tool_env.env_path()}, "
        f"although nothing it needs is missing: {problem}"
    )


def _export(model: str, board_name: str, flow: str, out: Path) -> Path:
    board = load_board(board_name)
    npu = npu_config(board)
    result = export(
        load_model(model, REPO),
        flow,
        out,
        cpu=board.cpu["core"],
        settings=npu.export_settings() if flow == "ethos_u_int8" else None,
    )
    return result.pte_path


@pytest.fixture(scope="module")
def cmsis_nn_pte(tmp_path_factory) -> Path:
    return _export("tiny_cnn", "qemu-an547", "cortex_m_int8", tmp_path_factory.mktemp("cm"))


@pytest.fixture(scope="module")
def ethos_u_pte(tmp_path_factory) -> Path:
    return _export("tiny_cnn", "corstone-320", "ethos_u_int8", tmp_path_factory.mktemp("eu"))


def convert(env: tool_env.ToolEnv, path: Path) -> dict[str, list[dict[str, Any]]]:
    proc = subprocess.run(
        [str(env.python), "-c", CONVERT, str(path)], capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def tosa_operators(path: Path) -> Counter[str]:
    """The operators of a TOSA flatbuffer's main block, read with tosa-tools' own schema
    (deploykit's environment), independently of the adapter."""
    from tosa.Op import Op
    from tosa.TosaGraph import TosaGraph

    names = {v: k for k, v in vars(Op).items() if not k.startswith("_")}
    block = TosaGraph.GetRootAsTosaGraph(path.read_bytes(), 0).Regions(0).Blocks(0)
    return Counter(names[block.Operators(i).Op()] for i in range(block.OperatorsLength()))


def _convolutions(tosa_ops: Counter[str]) -> int:
    return tosa_ops["CONV2D"] + tosa_ops["DEPTHWISE_CONV2D"]


def _convolutions_before(delegate: dict[str, Any]) -> int:
    """The convolutions a delegate's edge ops become in TOSA: each convolution, and each
    linear (lowered as a 1x1 CONV2D)."""
    return delegate["ops"].get("aten::convolution", 0) + delegate["ops"].get("aten::linear", 0)


def _check_pte_graph(graphs: dict[str, list[dict[str, Any]]], pte: Path) -> list[dict]:
    """The method graph against deploykit's own reading of the program: one node per
    instruction (plus the graph's inputs and outputs), kernel calls named as the program's
    operators in execution order, a delegate call where a delegate segment is."""
    info = inspect_pte(pte)
    (forward,) = graphs["model.pte"]
    assert forward["id"] == "forward"
    nodes = forward["nodes"]
    assert len(nodes) == info.num_instructions + 2
    calls = [n for n in nodes if n["instruction"]]
    expected = []
    for seg in info.segments:
        if seg.kind == "delegate":
            expected.append(("DelegateCall", seg.backend))
        else:
            expected += [("KernelCall", op.split(".")[0]) for op in seg.ops]
    assert [(n["instruction"], n["label"]) for n in calls] == expected
    return calls


def test_cmsis_nn_pte_through_the_pte_adapter(model_explorer_env, cmsis_nn_pte):
    graphs = convert(model_explorer_env, cmsis_nn_pte)
    calls = _check_pte_graph(graphs, cmsis_nn_pte)
    assert len(calls) == 7 and {n["instruction"] for n in calls} == {"KernelCall"}
    assert "cortex_m::quantized_conv2d" in {n["label"] for n in calls}
    assert not graphs.get("delegates")  # nothing delegated, no delegate subgraph


def test_ethos_u_pte_has_its_delegate_as_a_subgraph(model_explorer_env, ethos_u_pte):
    graphs = convert(model_explorer_env, ethos_u_pte)
    calls = _check_pte_graph(graphs, ethos_u_pte)
    (delegate,) = [n for n in calls if n["instruction"] == "DelegateCall"]
    assert delegate["label"] == "EthosUBackend"
    assert (
        [g["id"] for g in graphs["delegates"]]
        == delegate["subgraphs"]
        == [f"model.pte::{delegate['id']}"]
    )


def test_ethos_u_tosa_through_the_tosa_adapter(model_explorer_env, ethos_u_pte):
    """The export keeps the TOSA flatbuffer Vela compiled; the TOSA adapter shows every
    operator of it (and the graph's inputs and outputs)."""
    (tosa,) = explore.tosa_files(ethos_u_pte)
    assert tosa.name == "delegate_0.tosa"
    report = json.loads((ethos_u_pte.parent / "export.json").read_text())
    assert report["partition"]["delegates"][0]["tosa_file"] == tosa.name
    (graph,) = convert(model_explorer_env, tosa)["tosa"]
    ops = tosa_operators(tosa)
    labels = Counter(n["label"] for n in graph["nodes"])
    assert len(graph["nodes"]) == sum(ops.values()) + 2
    assert {k: labels[k] for k in ops} == dict(ops)
    assert _convolutions(ops) == _convolutions_before(report["partition"]["delegates"][0])


@pytest.mark.slow
def test_mobilenet_v2_lrn_shows_two_delegate_subgraphs(
    model_explorer_env, mobilenet_v2_lrn_ethos_u
):
    lrn_pte = mobilenet_v2_lrn_ethos_u.pte_path
    graphs = convert(model_explorer_env, lrn_pte)
    calls = _check_pte_graph(graphs, lrn_pte)
    delegates = [n for n in calls if n["instruction"] == "DelegateCall"]
    assert len(delegates) == 2
    assert sorted(g["id"] for g in graphs["delegates"]) == sorted(
        s for n in delegates for s in n["subgraphs"]
    )
    between = calls[calls.index(delegates[0]) + 1 : calls.index(delegates[1])]
    assert "aten::avg_pool3d" in [n["label"] for n in between]  # the LRN remnant, on the CPU
    # Each delegate's TOSA graph: its convolutions are the delegate's (the export's count).
    report = json.loads((lrn_pte.parent / "export.json").read_text())
    tosas = explore.tosa_files(lrn_pte)
    assert [t.name for t in tosas] == ["delegate_0.tosa", "delegate_1.tosa"]
    for tosa, entry in zip(tosas, report["partition"]["delegates"], strict=True):
        (graph,) = convert(model_explorer_env, tosa)["tosa"]
        ops = tosa_operators(tosa)
        assert len(graph["nodes"]) == sum(ops.values()) + 2
        assert _convolutions(ops) == _convolutions_before(entry)


# ---- the server ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Served:
    """`deploykit explore --no-browser` in a process of its own, as a user starts it."""

    def __init__(self, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO / "tools")}
        # A port of its own (the kernel's pick), not deploykit's default of the first free one
        # from 8080: another test run on the machine may serve there, and the port checks
        # below would see its server.
        port = [] if "--port" in args else ["--port", str(_free_port())]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "deploykit", "explore", "--no-browser", *port, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
            # As in a terminal's foreground job: SIGINT at its default (a shell's background
            # job, such as a CI step, may hand it down ignored; Python then never raises
            # KeyboardInterrupt).
            preexec_fn=_default_sigint,
        )
        assert self.proc.stdout is not None
        out = Lines(self.proc.stdout)
        try:
            line = out.wait_for(r"^Model Explorer: http://", 180)
        except AssertionError as exc:
            _, err = self.interrupt()
            raise AssertionError(f"no URL printed: {exc}\n{err}") from None
        self.url = line.split(": ", 1)[1].strip()
        self.port = int(urllib.parse.urlsplit(self.url).port or 0)

    def server_pids(self) -> list[int]:
        """The Model Explorer server: deploykit's child, in its own session."""
        return list(_children(self.proc.pid))

    def interrupt(self) -> tuple[int, str]:
        """Ctrl-C as a terminal sends it: SIGINT to deploykit's process group."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise
        return self.proc.returncode, err

    def graph_api(self, model: Path, adapter: str) -> dict[str, Any]:
        """The server's own conversion API, as the web app calls it."""
        cmd = {
            "extensionId": adapter,
            "cmdId": "convert",
            "modelPath": str(model),
            "settings": {},
            "deleteAfterConversion": False,
        }
        url = (
            f"http://127.0.0.1:{self.port}/api/v1/send_command?json="
            f"{urllib.parse.quote(json.dumps(cmd))}"
        )
        with urllib.request.urlopen(url, timeout=60) as r:
            reply = json.loads(r.read())
        assert "error" not in reply, reply
        return reply


def _children(pid: int) -> dict[int, str]:
    """The child processes of `pid`, with their command lines."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found[int(stat.parent.name)] = cmdline
    return found


def _running(pid: int) -> bool:
    """Alive and not a zombie: an orphan's exit status waits for whatever reaps it here."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _listening_addresses(port: int) -> set[str]:
    """Local addresses listening on `port`, from /proc/net/tcp{,6} (hex, as the kernel
    lists them)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, _, state = line.split()[1:4]
            addr, hex_port = local.split(":")
            if int(hex_port, 16) == port and state == "0A":  # LISTEN
                found.add(addr)
    return found


def test_server_on_loopback_stops_on_ctrl_c(model_explorer_env, ethos_u_pte):
    served = Served(str(ethos_u_pte), "--port", str(explore.free_port(None)))
    servers = served.server_pids()
    assert servers, "no Model Explorer process under deploykit"
    assert served.url.startswith(f"http://127.0.0.1:{served.port}/")
    assert _listening_addresses(served.port) == {"0100007F"}  # 127.0.0.1 only
    with urllib.request.urlopen(f"http://127.0.0.1:{served.port}/", timeout=30) as r:
        assert r.status == 200 and b"Model Explorer" in r.read()
    code, err = served.interrupt()
    assert code == 0, err
    assert "Model Explorer stopped." in err and "Traceback" not in err
    assert not [p for p in servers if _running(p)]
    assert not _listening_addresses(served.port)


def test_a_killed_deploykit_leaves_no_server(model_explorer_env, ethos_u_pte):
    """deploykit killed outright (no Ctrl-C handling): the server, in a session of its own,
    still ends with it instead of holding the port."""
    served = Served(str(ethos_u_pte))
    servers = served.server_pids()
    assert servers and _listening_addresses(served.port)
    os.killpg(served.proc.pid, signal.SIGKILL)
    served.proc.wait()
    # The port closes when the last process holding the socket has gone, which can be a moment
    # after the server's own pid (its children exit with it): wait for both.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (
        [p for p in servers if _running(p)] or _listening_addresses(served.port)
    ):
        time.sleep(0.2)
    assert not [p for p in servers if _running(p)]
    assert not _listening_addresses(served.port)


EXPAND_ALL = """(() => {
  const icon = [...document.querySelectorAll("mat-icon")]
    .find(e => e.textContent.trim() === "unfold_more_double");
  if (!icon) return "no expand-all button";
  icon.click();
  return "clicked";
})()"""


def _artifacts(tmp_path: Path) -> Path:
    out = Path(os.environ.get("DEPLOYKIT_TEST_ARTIFACTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.mark.skipif(chromium.CHROMIUM is None, reason=chromium.SKIP_REASON)
@pytest.mark.slow
def test_headless_chromium_shows_the_partitioned_graph(
    model_explorer_env, mobilenet_v2_lrn_ethos_u, tmp_path
):
    lrn_pte = mobilenet_v2_lrn_ethos_u.pte_path
    # A further overlay through --node-data (the hook per-operator time and error use): a
    # value on the second delegate call, by the adapter's node id.
    nodes = explore.adapter_nodes(model_explorer_env, lrn_pte)
    second = [n for n in nodes if n.instruction == "DelegateCall"][1]
    extra = explore.node_data_file(
        tmp_path / "extra.json", "extra overlay", {(second.graph, second.id): 42.0}
    )
    served = Served(str(lrn_pte), "--node-data", str(extra))
    try:
        with chromium.Browser() as browser:
            browser.goto(served.url)
            # The graph is laid out and the segment overlay loaded: Model Explorer lists the
            # node data per node, by label, in its side panel.
            text = browser.wait_for(
                "document.body && document.body.innerText.includes('segment (1 = NPU') && "
                "document.body.innerText.includes('EthosUBackend') && document.body.innerText",
                timeout=120,
            )
            # Open the method's layer (Model Explorer's "expand all layers" button) so the
            # screenshot shows the nodes coloured by segment; the check above is the graph's.
            assert browser.evaluate(EXPAND_ALL) == "clicked"
            time.sleep(3)  # the layout animation, for the picture only
            shot = browser.screenshot(_artifacts(tmp_path) / "explore-mobilenet_v2_lrn.png")
        graph = served.graph_api(lrn_pte, PTE_ADAPTER_ID)
    finally:
        code, err = served.interrupt()
    assert code == 0, err
    assert shot.startswith(b"\x89PNG") and len(shot) > 20_000
    info = inspect_pte(lrn_pte)
    assert f"op node count\n\t\n{info.num_instructions + 2}" in text
    labels = {
        n["label"] for c in graph["graphCollections"] for g in c["graphs"] for n in g["nodes"]
    }
    for label in ("EthosUBackend", "aten::avg_pool3d", "cortex_m::quantize_per_tensor"):
        assert label in labels and label in text
    assert re.search(r"Sum\s+2\b", text)  # two nodes on the NPU
    assert "extra overlay" in text and re.search(r"\b42\b", text)


@pytest.fixture(scope="module")
def profiled_out(tmp_path_factory) -> Path:
    """mlp_mnist's out directory as `deploykit profile` and `run --debug-intermediates` leave
    it: the recorded program (tests/data/) as the export, profile/profile.json from the
    recorded profiling stream, and debug/intermediates.json from the recorded debug stream
    compared with a program whose second linear layer has its scale changed (so that errors
    show)."""
    out = lay_out_recorded_program(tmp_path_factory.mktemp("mlp_mnist"))
    write_profile(out)
    pte = (out / "export" / "model.pte").read_bytes()
    write_intermediates(out, perturb_requantize_scale(pte, instruction=2, factor=0.8))
    return out


def test_the_adapters_instruction_ids_are_chain_and_index(model_explorer_env, profiled_out):
    """The overlays' keys: the PTE adapter names each instruction of the method
    <method>_<chain>_<instruction>, which is what explore matches profiles and errors by."""
    pte = profiled_out / "export" / "model.pte"
    nodes = explore.adapter_nodes(model_explorer_env, pte)
    ids = sorted(n.id for n in nodes if n.instruction)
    assert {n.graph for n in nodes} == {explore.METHOD}
    program = program_instructions(pte.read_bytes())
    assert ids == sorted(explore.instruction_node_id(c, i) for c, i in program)


@pytest.mark.skipif(chromium.CHROMIUM is None, reason=chromium.SKIP_REASON)
def test_headless_chromium_shows_the_time_and_error_overlays(
    model_explorer_env, profiled_out, tmp_path
):
    pte = profiled_out / "export" / "model.pte"
    served = Served(str(pte))  # the out directory's profile and intermediates, found
    try:
        with chromium.Browser() as browser:
            browser.goto(served.url)
            text = browser.wait_for(
                "document.body && document.body.innerText.includes('time (instructions per "
                "run)') && document.body.innerText.includes('max abs error vs host') && "
                "document.body.innerText",
                timeout=120,
            )
            assert browser.evaluate(EXPAND_ALL) == "clicked"
            time.sleep(3)  # the layout animation, for the picture only
            shot = browser.screenshot(_artifacts(tmp_path) / "explore-mlp_mnist-profile.png")
    finally:
        code, err = served.interrupt()
    assert code == 0, err
    assert shot.startswith(b"\x89PNG")
    assert f"overlaying {profiled_out / 'profile' / 'profile.json'}" in err
    assert f"overlaying {profiled_out / 'debug' / 'intermediates.json'}" in err
    assert "share of execute() (%)" in text and "segment (1 = NPU" in text
    # The page's aggregated stats: the largest value of each overlay is the file's (segment:
    # all on the CPU).
    time_, share = explore.profile_overlays(
        profiled_out / "profile" / "profile.json", _program_names(pte)
    )
    error = explore.intermediates_overlay(
        profiled_out / "debug" / "intermediates.json", _program_names(pte)
    )
    largest = [max(o.values.values()) for o in (time_, share, error)]
    assert "Max\t0\t" + "\t".join(_js_number(v) for v in largest) in text
    assert largest[2] > 1  # the changed scale shows as an error


def _program_names(pte: Path) -> dict[tuple[int, int], str]:
    return {k: v.name for k, v in program_instructions(pte.read_bytes()).items()}


def _js_number(value: float) -> str:
    """A number as JavaScript prints it (the shortest round-trip form, as Python's repr)."""
    return str(int(value)) if value == int(value) else repr(value)


@pytest.mark.skipif(chromium.CHROMIUM is None, reason=chromium.SKIP_REASON)
def test_headless_chromium_shows_the_tosa_graph(model_explorer_env, ethos_u_pte, tmp_path):
    served = Served("--tosa", str(ethos_u_pte))
    (tosa,) = explore.tosa_files(ethos_u_pte)
    try:
        with chromium.Browser() as browser:
            browser.goto(served.url)
            text = browser.wait_for(
                "document.body && document.body.innerText.includes('op node count') && "
                "document.body.innerText",
                timeout=120,
            )
            shot = browser.screenshot(_artifacts(tmp_path) / "explore-tiny_cnn-tosa.png")
        graph = served.graph_api(tosa, TOSA_ADAPTER_ID)
    finally:
        code, err = served.interrupt()
    assert code == 0, err
    assert shot.startswith(b"\x89PNG")
    ops = tosa_operators(tosa)
    assert "delegate_0.tosa" in text
    # The page counts the op nodes it draws: CONST operators are folded into their users'
    # inputs there (the adapter's graph API still lists them).
    assert f"op node count\n\t\n{sum(ops.values()) - ops['CONST'] + 2}" in text
    labels = Counter(n["label"] for g in graph["graphs"] for n in g["nodes"])
    assert labels["CONV2D"] == ops["CONV2D"] > 0


def test_ctrl_c_while_creating_leaves_nothing(tmp_path):
    """Ctrl-C during the pip install of a first use: deploykit exits 130 and neither the
    environment nor its temporary directory is left (the next use starts clean)."""
    tools = tmp_path / "tools"
    env = {**os.environ, "PYTHONPATH": str(REPO / "tools"), tool_env.TOOLS_DIR_ENV: str(tools)}
    env.pop(tool_env.WHEELS_ENV, None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "deploykit", "explore", "--setup"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=_default_sigint,
    )
    assert proc.stderr is not None
    err = Lines(proc.stderr)
    try:
        # The step's own line (a renamed line fails here, it does not skip), then pip at
        # work under deploykit: the interrupt lands inside the install.
        err.wait_for(r"^· installing ", 300)
        deadline = time.monotonic() + 300
        while not any(" -m pip install " in c for c in _children(proc.pid).values()):
            if proc.poll() is not None:
                err.rest(60)
                unreachable = index_unreachable()
                if unreachable is not None:
                    pytest.skip(f"pip ended before the interrupt without the package index "
                                f"({unreachable}):\n{err.text}")
                pytest.fail(f"pip ended before the interrupt:\n{err.text}")
            assert time.monotonic() < deadline, f"no pip install under deploykit:\n{err.text}"
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGINT)
        err.rest(60)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err.text
    assert "deploykit: interrupted" in err.text and "Traceback" not in err.text
    assert [p.name for p in tools.iterdir()] == [f".{tool_env.env_path().name}.lock"]


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the download and two environments, beyond the default limit
@pytest.mark.skipif(
    not os.environ.get("DEPLOYKIT_TEST_TOOL_ENV_RACE"),
    reason="builds a second Model Explorer environment from downloaded wheels (about 65 s); "
    "opt-in to keep CI short: set DEPLOYKIT_TEST_TOOL_ENV_RACE=1",
)
def test_two_first_uses_at_once_build_one_environment_offline(tmp_path):
    """Two `deploykit explore --setup` at once on an empty tools directory, from a local wheel
    directory without the index (the offline path): one builds, the other waits for it and
    reuses it; one environment, no temporary directory left."""
    wheels = tmp_path / "wheels"
    download = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "-d", str(wheels), *tool_env.PINS],
        capture_output=True,
        text=True,
        check=False,
    )
    if download.returncode != 0:
        pytest.skip(
            f"pip download of {' '.join(tool_env.PINS)} failed (needs PyPI): "
            f"{download.stderr.strip().splitlines()[-1:]}"
        )
    tools = tmp_path / "tools"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "tools"),
        tool_env.TOOLS_DIR_ENV: str(tools),
        "PIP_NO_CACHE_DIR": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "deploykit",
        "--json",
        "explore",
        "--setup",
        "--wheels",
        str(wheels),
    ]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert first.stderr is not None
    # It says so once it holds the lock (tool_env._create runs under it).
    first_err = Lines(first.stderr)
    first_err.wait_for(r"creating the Model Explorer environment in", 300)
    second = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    first_rest = first_err.rest(600)  # its stdout (one JSON line) cannot fill the pipe
    assert first.stdout is not None
    results = [(first.stdout.read().decode(), first_rest), second.communicate(timeout=600)]
    first.wait(timeout=60)
    assert first.returncode == second.returncode == 0, results
    paths = {json.loads(out)["path"] for out, _ in results}
    assert len(paths) == 1
    (path,) = paths
    assert "waiting for another deploykit" in results[1][1]
    assert "creating the Model Explorer environment in" not in results[1][1]
    assert sorted(p.name for p in tools.iterdir()) == sorted(
        [Path(path).name, f".{Path(path).name}.lock"]
    )
    mark = json.loads((Path(path) / tool_env.MARK_NAME).read_text())
    assert mark["versions"] == {p.split("==")[0]: p.split("==")[1] for p in tool_env.PINS}
