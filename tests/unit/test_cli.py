"""Bad input gets one paragraph naming the cause and the next step, and no traceback."""

import os
import re
import subprocess
import sys

import pytest

from deploykit.cli import main
from deploykit.util.errors import ExitCode


def _run(args, capsys):
    code = main(args)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured


def test_unknown_board(capsys):
    code, cap = _run(["export", "--board", "nope", "--model", "tiny_cnn"], capsys)
    assert code == ExitCode.CONFIG
    assert "Unknown board 'nope'" in cap.err and "qemu-an547" in cap.err


def test_unknown_model(capsys, tmp_path):
    code, cap = _run(["export", "--board", "qemu-an547", "--model", "no_such_model",
                      "--out", str(tmp_path)], capsys)
    assert code == ExitCode.CONFIG
    assert "no_such_model" in cap.err and "tiny_cnn" in cap.err


def test_model_file_without_entry_points(capsys, tmp_path):
    bad = tmp_path / "bad_model.py"
    bad.write_text("X = 1\n")
    code, cap = _run(["export", "--board", "qemu-an547", "--model", str(bad),
                      "--out", str(tmp_path / "out")], capsys)
    assert code == ExitCode.CONFIG
    assert "model" in cap.err and "example_inputs" in cap.err
    assert not list((tmp_path / "out").rglob("*.pte"))


def test_unknown_flow_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["export", "--board", "qemu-an547", "--model", "tiny_cnn", "--flow", "int4"])
    assert exc.value.code == 2
    assert "portable_fp32" in capsys.readouterr().err


def test_missing_sources_are_named_before_any_work(capsys, tmp_path):
    code, cap = _run(["build", "--board", "qemu-an547", "--model", "tiny_cnn",
                      "--workspace", str(tmp_path / "no-ws"), "--out", str(tmp_path / "o")],
                     capsys)
    assert code == ExitCode.ENVIRONMENT
    assert "ExecuTorch sources not available" in cap.err and "deploykit setup" in cap.err
    assert not (tmp_path / "o").exists()


def test_missing_toolchain_is_named(tmp_path):
    env = dict(os.environ, PATH=os.path.dirname(sys.executable))
    res = subprocess.run([sys.executable, "-m", "deploykit.cli", "selftest", "--board",
                          "qemu-an547", "--out", str(tmp_path)], env=env, capture_output=True,
                         text=True)
    assert res.returncode == ExitCode.ENVIRONMENT
    assert "arm-none-eabi-gcc" in res.stderr and "apt-get install" in res.stderr
    assert "Traceback" not in res.stderr


def test_help_explains_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    # The command list, not the epilog (whose examples name most commands too): each command
    # on a line of its own, with its one-line summary.
    listing = out.split("positional arguments:", 1)[1].split("\noptions:", 1)[0]
    listed = dict(re.findall(r"^    ([a-z]+) +(\S.*)$", listing, re.M))
    for cmd in ("boards", "profiles", "doctor", "setup", "export", "inspect", "plan", "build",
                "run", "flash", "monitor", "selftest"):
        assert cmd in listed, f"{cmd} is not in the command list of --help"
        assert len(listed[cmd]) > 15, listed[cmd]
    assert listed["run"].startswith("build, run on the board's simulator")
