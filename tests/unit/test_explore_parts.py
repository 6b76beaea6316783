"""`deploykit explore` without the package index: the tool environment's refusals and offline
error (a real venv and a real `pip --no-index` that finds nothing), its atomic creation (no
leftover when it fails), doctor's report, the TOSA file lookup, the node data overlay, the port
choice. What needs Model Explorer itself is in tests/integration/test_explore.py."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest
import tomllib

from deploykit.cli import main
from deploykit.profiling import explore
from deploykit.readers.doctor import model_explorer_check
from deploykit.util import tool_env
from deploykit.util.errors import ConfigError, EnvironmentProblem, ExitCode

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def tools(tmp_path, monkeypatch):
    path = tmp_path / "tools"
    monkeypatch.setenv(tool_env.TOOLS_DIR_ENV, str(path))
    monkeypatch.delenv(tool_env.WHEELS_ENV, raising=False)
    return path


def test_no_extra_puts_model_explorer_in_deploykits_environment():
    """The flatbuffers conflict (pte-adapter wants >25.9, tosa-tools pins 25.2.10) must never
    reach the user's environment: no dependency or extra of deploykit names the packages."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = [
        *project["dependencies"],
        *(d for deps in project.get("optional-dependencies", {}).values() for d in deps),
    ]
    assert "explore" not in project.get("optional-dependencies", {})
    assert not [n for n in names if "model-explorer" in n]


def test_env_path_follows_the_pins_and_the_tools_dir(tools):
    path = tool_env.env_path()
    assert path.parent == tools
    assert path.name.startswith("model-explorer-py3")
    assert tool_env.PINS == (
        "ai-edge-model-explorer==0.1.34",
        "pte-adapter-model-explorer==0.2.0",
        "tosa-adapter-model-explorer==0.1.0",
    )


def test_offline_creation_fails_clearly_and_leaves_nothing(tools, tmp_path, capsys):
    """A real venv and a real `pip install --no-index --find-links` on an empty wheel
    directory: what an offline machine gets. The error names the pins and both ways to give
    the wheels; no environment (complete or partial) is left behind."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    killed = tools / f".{tool_env.env_path().name}.killed.tmp"  # a killed creator's leftover
    (killed / "bin").mkdir(parents=True)
    assert main(["explore", "--setup", "--wheels", str(wheels)]) == int(ExitCode.ENVIRONMENT)
    err = capsys.readouterr().err
    assert "deploykit: error: Creating the Model Explorer environment failed in pip install" in err
    assert "ai-edge-model-explorer==0.1.34" in err  # pip's own "no matching distribution"
    assert "--wheels DIR" in err and tool_env.WHEELS_ENV in err and "pip download -d DIR" in err
    assert "Traceback" not in err
    left = sorted(p.name for p in tools.iterdir())
    assert left == [f".{tool_env.env_path().name}.lock"]  # no env, no temp directory at all
    assert not tool_env.state().ready


def test_missing_wheel_directory_is_refused(tools, tmp_path):
    with pytest.raises(EnvironmentProblem, match="wheel directory .* does not exist"):
        tool_env.ensure(wheels=tmp_path / "nowhere")
    assert not tools.exists() or not any(tools.iterdir())


def test_doctor_reports_the_environment(tools):
    check = model_explorer_check()
    assert check.ok and "not created yet" in check.detail and "--setup" in check.fix
    tool_env.env_path().mkdir(parents=True)  # a directory without the mark: not usable
    check = model_explorer_check()
    assert not check.ok and "not a complete environment" in check.detail
    assert not tool_env.state().ready


def test_a_marked_environment_is_ready(tools):
    """The mark is what makes a directory an environment (it is written last, before the
    rename); a mark for other pins does not count."""
    path = tool_env.env_path()
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "python").symlink_to(Path(sys.executable))
    mark = {"pins": list(tool_env.PINS), "versions": {"ai-edge-model-explorer": "0.1.34"}}
    (path / tool_env.MARK_NAME).write_text(json.dumps(mark))
    assert tool_env.state().ready
    assert tool_env.ensure().path == path  # reused: nothing installed
    (path / tool_env.MARK_NAME).write_text(json.dumps({**mark, "pins": ["other==1"]}))
    assert not tool_env.state().ready


def test_tosa_needs_an_ethos_u_export(tools, tmp_path, capsys):
    pte = tmp_path / "model.pte"
    pte.write_bytes(b"not used")
    assert main(["explore", "--tosa", "--no-browser", str(pte)]) == int(ExitCode.CONFIG)
    err = capsys.readouterr().err
    assert "No TOSA graph beside" in err and "ethos_u_int8" in err
    assert not tools.exists()  # refused before any environment work


def test_tosa_files_follow_the_delegate_order(tmp_path):
    for i in (0, 1, 10, 2):
        (tmp_path / f"delegate_{i}.tosa").write_bytes(b"t")
    pte = tmp_path / "model.pte"
    pte.write_bytes(b"p")
    assert [p.name for p in explore.tosa_files(pte)] == [
        "delegate_0.tosa",
        "delegate_1.tosa",
        "delegate_2.tosa",
        "delegate_10.tosa",
    ]
    report = {
        "partition": {
            "delegates": [
                {"index": 0, "tosa_file": "delegate_1.tosa"},
                {"index": 1, "tosa_file": "delegate_0.tosa"},
            ]
        }
    }
    (tmp_path / "export.json").write_text(json.dumps(report))
    assert [p.name for p in explore.tosa_files(pte)] == ["delegate_1.tosa", "delegate_0.tosa"]


def test_explore_needs_a_pte(tools, tmp_path, capsys):
    assert main(["explore"]) == int(ExitCode.CONFIG)
    assert "explore needs a .pte file" in capsys.readouterr().err
    assert main(["explore", str(tmp_path / "none.pte")]) == int(ExitCode.CONFIG)
    assert "No .pte file at" in capsys.readouterr().err


def test_segment_node_data_is_keyed_by_the_adapters_ids(tmp_path):
    nodes = [
        explore.AdapterNode("forward", "GraphInputs", "Graph Inputs", ""),
        explore.AdapterNode(
            "forward", "forward_0_0", "cortex_m::quantize_per_tensor", "KernelCall"
        ),
        explore.AdapterNode(
            "forward", "forward_0_1", "EthosUBackend", "DelegateCall", ("model.pte::forward_0_1",)
        ),
        explore.AdapterNode(
            "forward", "forward_0_2", "cortex_m::dequantize_per_tensor", "KernelCall"
        ),
    ]
    values = explore.segment_values(nodes)
    assert {k: v[0] for k, v in values.items()} == {
        ("forward", "forward_0_0"): 0.0,
        ("forward", "forward_0_1"): 1.0,
        ("forward", "forward_0_2"): 0.0,
    }
    path = explore.node_data_file(tmp_path / "seg.json", "segment", values)
    data = json.loads(path.read_text())
    assert data["forward"]["name"] == "segment"
    assert data["forward"]["results"]["forward_0_1"] == {
        "value": 1.0,
        "bgColor": explore.SEGMENT_COLORS["NPU"],
    }
    # The hook for other overlays (time, error): plain numbers by (graph, node).
    path = explore.node_data_file(
        tmp_path / "t.json", "time (us)", {("forward", "forward_0_1"): 12.5}
    )
    assert json.loads(path.read_text())["forward"]["results"] == {"forward_0_1": {"value": 12.5}}


def test_a_taken_port_is_refused(tools, tmp_path):
    with socket.socket() as s:
        s.bind((explore.HOST, 0))
        s.listen()
        taken = s.getsockname()[1]
        with pytest.raises(ConfigError, match=f"Port {taken} on 127.0.0.1 is in use"):
            explore.free_port(taken)
    assert explore.free_port(None) > 0


def test_an_export_removes_a_previous_exports_tosa_files(tmp_path):
    """A CPU-only export into a directory an Ethos-U export used: the old delegate_<i>.tosa
    must go, or explore --tosa would show a graph that is not in this .pte."""
    from deploykit.program.export import export
    from deploykit.program.models import load_model

    stale = tmp_path / "delegate_0.tosa"
    stale.write_bytes(b"old")
    export(load_model("tiny_cnn", REPO), "cortex_m_int8", tmp_path, cpu="cortex-m55")
    assert not stale.exists()
    with pytest.raises(ConfigError, match="No TOSA graph beside"):
        explore.tosa_files(tmp_path / "model.pte")


def test_a_path_with_a_comma_is_refused_before_any_work(tools, tmp_path, capsys):
    odd = tmp_path / "a,b"
    odd.mkdir()
    (odd / "model.pte").write_bytes(b"p")
    assert main(["explore", "--no-browser", str(odd / "model.pte")]) == int(ExitCode.CONFIG)
    assert "its path has a comma" in capsys.readouterr().err
    assert not tools.exists()


def test_vela_estimates_land_on_the_tosa_nodes_that_output_their_names(tmp_path):
    # The TOSA adapter's (graph, node id) -> first output name, and Vela's operators by name.
    names = {("main", "main/op25"): "tosa_depthwise_conv2d_default",
             ("main", "main/op30"): "tosa_rescale_default",
             ("main", "main/op46"): "tosa_rescale_default_2"}
    layers = [("tosa_rescale_default", 300), ("tosa_rescale_default_2", 100),
              ("tosa_avg_pool2d_default", 100)]  # no node outputs this one here
    cycles, share = explore.vela_estimate_values(names, layers)
    assert cycles == {("main", "main/op30"): 300.0, ("main", "main/op46"): 100.0}
    # Shares are of the whole delegate, the operator without a node included.
    assert share == {("main", "main/op30"): 60.0, ("main", "main/op46"): 20.0}
    path = explore.node_data_file(tmp_path / "v.json", "NPU cycles (Vela estimate)", cycles,
                                  explore.HEAT_GRADIENT)
    data = json.loads(path.read_text())["main"]
    assert data["results"] == {"main/op30": {"value": 300.0}, "main/op46": {"value": 100.0}}
    assert explore.vela_estimate_values(names, []) == ({}, {})
