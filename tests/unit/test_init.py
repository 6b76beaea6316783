"""`deploykit init`: the scaffold's files, its refusal to overwrite, and that its project
resolves and exports as written (the run on QEMU: tests/integration/test_project.py)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

from deploykit.cli import main
from deploykit.pipeline.scaffold import PROJECT_FILES
from deploykit.program.models import load_model
from deploykit.readers.project_file import load_project_file
from deploykit.util.errors import ExitCode


def test_init_writes_the_project_and_says_what_next(tmp_path, capsys):
    project = tmp_path / "new"
    assert main(["init", str(project)]) == 0
    out = capsys.readouterr().out
    assert sorted(str(p.relative_to(project)) for p in project.rglob("*") if p.is_file()) == \
        sorted(PROJECT_FILES)
    assert "deploykit run --board qemu-an547" in out and "pytest --board qemu-an547" in out
    settings = load_project_file(project / "deploykit.toml").settings
    assert settings["model"] == "model.py"
    assert settings["boards"]["qemu-an547"]["flow"] == "portable_fp32"
    spec = load_model(str(project / "model.py"), project)  # model(), example_inputs(), forward
    assert spec.name == "model" and tuple(spec.example_inputs[0].shape) == (1, 1, 16, 16)
    model_text = (project / "model.py").read_text()
    assert "def calibration_inputs" in model_text and "TOLERANCE" in model_text  # as comments
    functions = {n.name for n in ast.walk(ast.parse(model_text)) if isinstance(n, ast.FunctionDef)}
    assert {"model", "example_inputs"} <= functions and "calibration_inputs" not in functions
    test = ast.parse((project / "tests" / "test_on_board.py").read_text())
    [fn] = [n for n in test.body if isinstance(n, ast.FunctionDef)]
    assert fn.name.startswith("test_") and [a.arg for a in fn.args.args] == ["deployed"]


def test_init_overwrites_nothing(tmp_path, capsys):
    (tmp_path / "model.py").write_text("# mine\n")
    assert main(["init", str(tmp_path)]) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert "already holds model.py" in err and "overwrites nothing" in err
    assert "Traceback" not in err
    assert (tmp_path / "model.py").read_text() == "# mine\n"
    assert not (tmp_path / "deploykit.toml").exists() and not (tmp_path / "tests").exists()


def test_the_new_project_resolves_and_exports(tmp_path):
    project = tmp_path / "p"
    assert main(["init", str(project)]) == 0
    sub = project / "tests"  # from a subdirectory: the file is found upwards
    res = subprocess.run([sys.executable, "-m", "deploykit", "config", "--json", "--board",
                          "qemu-an547"], cwd=sub, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    settings = json.loads(res.stdout)["settings"]
    assert settings["model"] == {"value": str(project / "model.py"),
                                 "source": "deploykit.toml line 7 (model)"}
    assert settings["flow"]["value"] == "portable_fp32"
    assert settings["flow"]["source"].startswith("deploykit.toml line ")
    res = subprocess.run([sys.executable, "-m", "deploykit", "export", "--board", "qemu-an547",
                          "--quiet"], cwd=project, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert (project / "build" / "qemu-an547" / "model" / "export" / "model.pte").is_file()
    assert "reference: executorch-pybindings" in res.stdout
