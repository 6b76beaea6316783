"""The command line's edges: `python -m deploykit`, common options before or after the command,
a closed pipe, help texts, and the search path of boards and models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from deploykit.cli import build_parser, main
from deploykit.util.paths import data_root, set_user_dir


def _env(tmp_path: Path) -> dict[str, str]:
    """The environment of a `python -m deploykit` child: this package first on its path."""
    tools = data_root() / "tools"
    parts = [str(tools)] if tools.is_dir() else []
    if os.environ.get("PYTHONPATH"):
        parts.append(os.environ["PYTHONPATH"])
    return dict(os.environ, PYTHONPATH=os.pathsep.join(parts),
                XDG_STATE_HOME=str(tmp_path / "state"))


@pytest.fixture(autouse=True)
def _no_user_dirs(monkeypatch, tmp_path):
    """Each test starts in an empty directory, with no --boards-dir / --models-dir."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DEPLOYKIT_BOARDS_DIR", raising=False)
    monkeypatch.delenv("DEPLOYKIT_MODELS_DIR", raising=False)
    yield
    set_user_dir("boards", None)
    set_user_dir("models", None)


def test_python_dash_m_deploykit(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "deploykit", "profiles"], capture_output=True,
                          text=True, timeout=120, env=_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "size" in proc.stdout and proc.stderr == ""


@pytest.mark.parametrize("argv", [
    ["--debug", "--json", "--workspace", "W", "doctor"],
    ["doctor", "--debug", "--json", "--workspace", "W"],
    ["--json", "doctor", "--debug", "--workspace", "W"],
])
def test_common_options_before_or_after_the_command(argv):
    args = build_parser().parse_args(argv)
    assert args.debug and args.json and args.workspace == Path("W")


def test_common_options_default_when_not_given():
    args = build_parser().parse_args(["boards"])
    assert not args.debug and not args.json and not args.quiet and args.workspace is None
    args = build_parser().parse_args(["--quiet", "selftest", "--board", "qemu-an547"])
    assert args.quiet


def test_a_closed_pipe_is_not_a_traceback(tmp_path):
    """`deploykit boards | head -1`."""
    proc = subprocess.Popen([sys.executable, "-m", "deploykit", "boards"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=_env(tmp_path), cwd=tmp_path)
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) in (0, 141)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def _subcommands():
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return action.choices


def test_every_subcommand_has_a_description():
    for name, sub in _subcommands().items():
        assert sub.description and len(sub.description) > 40, name


def test_monitor_and_selftest_do_not_offer_a_model_directory():
    subs = _subcommands()
    for name, default in (("monitor", "build/<board>/monitor"),
                          ("selftest", "build/<board>/selftest-<variant>")):
        text = subs[name].format_help()
        assert "<model>" not in text, name
        assert default in " ".join(text.split()), name


def test_setup_group_lists_every_optional_group():
    text = " ".join(_subcommands()["setup"].format_help().split())
    assert "pico:" in text and "ethos-u:" in text


def _write_board(directory: Path, name: str, description: str) -> Path:
    data = yaml.safe_load((data_root() / "boards" / "qemu-an547.yaml").read_text())
    data.update(name=name, description=description)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _boards_json(capsys, *argv) -> dict[str, dict]:
    assert main([*argv, "boards", "--json"]) == 0
    return {b["name"]: b for b in json.loads(capsys.readouterr().out)}


def test_boards_search_path_and_origin(tmp_path, capsys):
    _write_board(tmp_path / "boards", "my-board", "mine, in ./boards")
    _write_board(tmp_path / "elsewhere", "qemu-an547", "a shadowing copy")
    boards = _boards_json(capsys)
    assert boards["my-board"]["origin"] == "./boards"
    assert boards["qemu-an547"]["origin"] == "bundled"
    boards = _boards_json(capsys, "--boards-dir", str(tmp_path / "elsewhere"))
    assert boards["qemu-an547"]["origin"] == "--boards-dir"
    assert boards["qemu-an547"]["description"] == "a shadowing copy"
    assert main(["boards"]) == 0
    assert "from ./boards" in capsys.readouterr().out


def test_a_broken_user_board_does_not_hide_the_others(tmp_path, capsys):
    (tmp_path / "boards").mkdir()
    (tmp_path / "boards" / "bad.yaml").write_text("name: bad\n")
    assert main(["boards"]) == 3
    cap = capsys.readouterr()
    assert "bad.yaml" in cap.err and "qemu-an547" in cap.out


def test_a_missing_boards_dir_is_an_error(tmp_path, capsys):
    assert main(["boards", "--boards-dir", str(tmp_path / "nope")]) == 3
    assert "--boards-dir" in capsys.readouterr().err


def test_models_search_path(tmp_path):
    from deploykit.program.models import resolve_model_path

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "mine.py").write_text("def model(): ...\n")
    assert resolve_model_path("mine", data_root()) == ("mine", tmp_path / "models" / "mine.py")
    other = tmp_path / "other"
    other.mkdir()
    (other / "tiny_cnn.py").write_text("def model(): ...\n")
    set_user_dir("models", other)
    assert resolve_model_path("tiny_cnn", data_root())[1] == other / "tiny_cnn.py"
    set_user_dir("models", None)
    assert resolve_model_path("tiny_cnn", data_root())[1] == data_root() / "models/tiny_cnn.py"
