"""The project file (docs/project.md): found from the current directory upwards, validated with
file, line and key in every error, the command line over a board's table over the top level,
and `deploykit config` showing where each setting came from. No sources needed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from deploykit import api
from deploykit.cli import main
from deploykit.pipeline.project import choose, load_project
from deploykit.readers.project_file import (
    find_project_file,
    key_lines,
    load_project_file,
)
from deploykit.util.errors import ConfigError, ExitCode

REPO = Path(__file__).resolve().parents[2]


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_key_lines_follow_tables_dotted_and_inline_keys():
    text = ('# a comment\nmodel = "m.py"  # with = in a comment\n'
            'tolerance = { atol = 1e-4, rtol = 0 }\nnotes = """\nflow = "not a key"\n"""\n'
            'list = [\n  "a = b",\n]\n[boards.corstone-320]\nflow = "ethos_u_int8"\n'
            '[boards."qemu-an547"]\nboards.x = 1\n')
    lines = key_lines(text)
    assert lines[("model",)] == 2
    assert lines[("tolerance", "atol")] == 3 and lines[("tolerance", "rtol")] == 3
    assert ("flow",) not in lines  # inside a multi-line string
    assert lines[("list",)] == 7
    assert lines[("boards", "corstone-320", "flow")] == 11
    assert lines[("boards", "qemu-an547")] == 12
    assert lines[("boards", "qemu-an547", "boards", "x")] == 13


def test_unknown_keys_and_wrong_types_name_file_line_and_key(tmp_path):
    path = _write(tmp_path / "deploykit.toml",
                  'model = "tiny_cnn"\nflwo = "portable_fp32"\n\n[boards.corstone-320]\n'
                  'npu_macs = "512"\ntolerance = { atol = -1 }\n')
    with pytest.raises(ConfigError) as exc:
        load_project_file(path)
    cause = exc.value.cause
    assert str(path) in cause
    assert "deploykit.toml line 2 (flwo): unknown key 'flwo' (did you mean 'flow'?)" in cause
    assert "deploykit.toml line 5 (boards.corstone-320.npu_macs): '512' is not of type " \
           "'integer'" in cause
    assert "line 6 (boards.corstone-320.tolerance.atol)" in cause
    assert "docs/project.md" in exc.value.hint


def test_a_toml_syntax_error_names_the_file_and_line(tmp_path):
    path = _write(tmp_path / "deploykit.toml", 'model = "a"\nflow = \n')
    with pytest.raises(ConfigError, match=r"deploykit.toml is not valid TOML: .*line 2"):
        load_project_file(path)


def test_found_upwards_and_deploykit_toml_wins_over_pyproject(tmp_path):
    root = tmp_path / "proj"
    _write(root / "pyproject.toml", '[project]\nname = "x"\n\n[tool.deploykit]\n'
           'model = "net.py"\n[tool.deploykit.boards.qemu-an505]\nflow = "cortex_m_int8"\n')
    deep = root / "src" / "deeper"
    deep.mkdir(parents=True)
    assert find_project_file(deep) == (root / "pyproject.toml").resolve()
    project = load_project_file(root / "pyproject.toml")
    assert project.location("boards", "qemu-an505", "flow").line == 7
    assert str(project.location("model")) == "pyproject.toml line 5 (tool.deploykit.model)"
    # A pyproject.toml without the table is another tool's: the search goes on upwards.
    _write(deep / "pyproject.toml", '[project]\nname = "y"\n')
    assert find_project_file(deep) == (root / "pyproject.toml").resolve()
    _write(root / "deploykit.toml", 'model = "tiny_cnn"\n')
    assert find_project_file(deep) == (root / "deploykit.toml").resolve()
    assert find_project_file(tmp_path) is None


def test_the_command_line_wins_over_the_board_table_over_the_top_level(tmp_path):
    path = _write(tmp_path / "deploykit.toml",
                  'model = "net.py"\nprofile = "speed"\ninputs = "samples"\n'
                  'tolerance = { atol = 0.01 }\n\n[boards.qemu-an505]\nprofile = "reference"\n'
                  'flow = "cortex_m_int8"\n')
    project = load_project(path)
    on_505 = choose({"board": "qemu-an505", "profile": None}, project)
    assert on_505.model == str(tmp_path / "net.py")  # relative to the file, not the cwd
    assert on_505.settings["profile"].value == "reference"
    assert on_505.settings["profile"].source == (
        "deploykit.toml line 7 (boards.qemu-an505.profile)")
    assert on_505.value("inputs") == tmp_path / "samples"
    assert on_505.tolerance() == (0.01, None)
    given = choose({"board": "qemu-an505", "profile": "size", "atol": 0.5}, project)
    assert given.settings["profile"].source == "--profile" and given.value("profile") == "size"
    assert given.tolerance() == (0.5, None)
    on_547 = choose({"board": "qemu-an547"}, project)
    assert on_547.value("profile") == "speed" and on_547.value("flow") is None
    # Another model on the command line: the project model's inputs and tolerance are left out.
    other = choose({"board": "qemu-an547", "model": "tiny_cnn"}, project)
    assert other.value("inputs") is None and other.tolerance() == (None, None)
    assert set(other.left_out) == {"inputs", "tolerance"}


def test_errors_about_a_value_of_the_file_name_its_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "deploykit.toml", 'model = "tiny_cnn"\n[boards.qemu-an547]\n'
           'flow = "ethos_u_int8"\n')
    with pytest.raises(ConfigError) as exc:
        api.command("qemu-an547")
    assert exc.value.cause.startswith("deploykit.toml line 3 (boards.qemu-an547.flow): Board "
                                      "qemu-an547 does not support the ethos_u_int8 flow")
    _write(tmp_path / "deploykit.toml", 'model = "tiny_cnn"\nflow = "int4"\n')
    with pytest.raises(ConfigError, match=r"line 2 \(flow\): flow 'int4' is not a flow"):
        api.command("qemu-an547")
    _write(tmp_path / "deploykit.toml", '[boards.qemu-an574]\nflow = "portable_fp32"\n')
    with pytest.raises(ConfigError, match=r"line 1 \(boards.qemu-an574\): there is no board"):
        api.command("qemu-an547")
    _write(tmp_path / "deploykit.toml", 'model = "tiny_cnn"\n[boards.qemu-an547]\nport = '
           '"/dev/ttyACM0"\n')
    with pytest.raises(ConfigError, match=r"line 3 \(boards.qemu-an547.port\): --port is not "
                       "an option of the qemu runner"):
        api.command("qemu-an547", runs=True)
    api.command("qemu-an547")  # a build takes no runner options: the file's are not applied


def _config_json(args: list[str], cwd: Path) -> dict:
    res = subprocess.run([sys.executable, "-m", "deploykit", "config", "--json", *args],
                         cwd=cwd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["settings"]


def test_the_repository_project_file_names_mobilenet_v2_for_the_ethos_u_boards():
    """The headline `deploykit build --board corstone-320` in this checkout: the model of the
    repository's deploykit.toml, the board's NPU flow."""
    for board in ("corstone-300", "corstone-320"):
        settings = _config_json(["--board", board], REPO)
        assert settings["model"]["value"] == "mobilenet_v2"
        assert settings["model"]["source"].startswith("deploykit.toml line ")
        assert f"(boards.{board}.model)" in settings["model"]["source"]
        assert settings["flow"] == {"value": "ethos_u_int8", "source":
                                    f"board file boards/{board}.yaml (export.default)"}
    settings = _config_json(["--board", "qemu-an547"], REPO)
    assert settings["model"]["value"] == "tiny_cnn"
    assert settings["flow"]["value"] == "portable_fp32"
    settings = _config_json(["--board", "rpi5", "--model", "mlp_mnist", "--host", "pi5"], REPO)
    assert settings["model"] == {"value": "mlp_mnist", "source": "--model"}
    assert settings["host"] == {"value": "pi5", "source": "--host"}
    assert settings["flow"]["value"] == "xnnpack_fp32"


def test_config_shows_every_setting_and_its_source(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "deploykit.toml", 'board = "corstone-300"\nmodel = "net.py"\n'
           '[boards.corstone-300]\nnpu_macs = 64\nprofile = "speed"\n')
    assert main(["config"]) == 0
    text = capsys.readouterr().out
    assert f"project file: {tmp_path / 'deploykit.toml'}" in text
    rows = {line.split()[0]: line for line in text.splitlines()[1:]}
    assert "corstone-300" in rows["board"] and "deploykit.toml line 1 (board)" in rows["board"]
    assert str(tmp_path / "net.py") in rows["model"]
    assert "64" in rows["npu_macs"] and "line 4 (boards.corstone-300.npu_macs)" in rows[
        "npu_macs"]
    assert "ethos_u_int8" in rows["flow"] and "board file" in rows["flow"]
    assert "Shared_Sram" in rows["npu_memory_mode"]
    assert "120" in rows["timeout"] and "default" in rows["timeout"]


def test_without_a_model_anywhere_the_error_says_how_to_name_one(tmp_path, monkeypatch,
                                                                 capsys):
    monkeypatch.chdir(tmp_path)
    code = main(["build", "--board", "qemu-an547"])
    err = capsys.readouterr().err
    assert code == ExitCode.CONFIG and "Traceback" not in err
    assert "No model given, and no deploykit.toml here or above" in err
    assert "--model NAME" in err and "tiny_cnn" in err and ".pte" in err
    assert "deploykit init" in err
    code = main(["build"])
    assert code == ExitCode.CONFIG and "No board given" in capsys.readouterr().err


def test_no_project_and_an_explicit_project_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "deploykit.toml", 'model = "tiny_cnn"\n')
    other = _write(tmp_path / "elsewhere" / "dk.toml", 'model = "mlp_mnist"\n')
    assert api.chosen("qemu-an547").model == "tiny_cnn"
    assert api.chosen("qemu-an547", project=other).model == "mlp_mnist"
    assert api.chosen("qemu-an547", project=False).model is None


def test_the_target_is_resolved_once_with_a_project_file(tmp_path, monkeypatch):
    from tests.unit.test_layout import ONCE_EACH, counted_resolvers

    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "deploykit.toml", 'model = "tiny_cnn"\n[boards.corstone-320]\n'
           'npu_macs = 512\nflow = "ethos_u_int8"\n')
    with counted_resolvers() as calls:
        cmd = api.command("corstone-320")
    assert dict(calls) == ONCE_EACH
    assert cmd.target.npu is not None and cmd.target.npu.target == "ethos-u85-512"
    with counted_resolvers() as calls:
        api.config("corstone-320")
    assert dict(calls) == ONCE_EACH
