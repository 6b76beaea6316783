"""Failures deploykit used to drop without a word, each now said: the cortex_m flow's integer
reference that did not run, a compiler whose version cannot be had for a cache key, and a
damaged fit.json. (The farm's dropped errors, the result tag and the session's close, need a
labgrid coordinator: tests/integration/test_farm.py.)"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from deploykit.util.errors import EnvironmentProblem


def _program(tmp_path: Path, name: str, script: str) -> str:
    """An executable `<tmp>/bin/<name>` running `script` (sh); its path without the name's
    last part, as the toolchain prefix the callers take."""
    path = tmp_path / "bin" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


# ---- the cortex_m flow's reference -------------------------------------------------------------


def test_a_dialect_check_that_did_not_run_is_a_warning():
    """When the cortex_m ops' integer reference cannot run the lowered graph, the device is
    compared with the PT2E model: the export says so, as the Ethos-U flow does for its TOSA
    reference model."""
    import torch

    from deploykit.flows.cortex_m_int8 import _dialect_check, dialect_check_warning

    exported = torch.export.export(torch.nn.Linear(4, 2).eval(), (torch.zeros(1, 4),))
    # Inputs the graph cannot take: the check fails for real inside the graph.
    check, model, out = _dialect_check(exported, (torch.zeros(1, 3),), [torch.zeros(1, 2)],
                                       [None])
    assert check["ran"] is False and model is None and out is None
    warning = dialect_check_warning(check)
    assert warning is not None
    assert "integer reference did not run" in warning and check["error"] in warning
    assert "the reference is the quantized PT2E model" in warning
    # A check that ran and agrees says nothing; one that differs says by how much.
    assert dialect_check_warning({"ran": True, "bit_exact": True}) is None
    assert "by 2 output steps" in dialect_check_warning(
        {"ran": True, "bit_exact": False, "max_diff_output_steps": 2})


# ---- compiler versions in cache keys -----------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "said"),
    [("echo 'broken install' >&2; exit 3", "exit 3: broken install"),
     ("exit 0", "exit 0, no output")],
)
def test_a_compiler_without_a_version_stops_the_runtime_key(tmp_path, script, said):
    from deploykit.families.linux_runtime import runtime_key

    prefix = _program(tmp_path, "cross-g++", script)[: -len("g++")]
    with pytest.raises(EnvironmentProblem) as err:
        runtime_key(["-mcpu=cortex-a76"], {"executorch": "0" * 8}, toolchain_prefix=prefix)
    assert f"`{prefix}g++ --version` failed ({said})" in err.value.cause
    assert "the aarch64 runtime's cache key" in err.value.cause


def test_an_absent_cross_compiler_stops_the_runtime_key(tmp_path):
    from deploykit.families.linux_runtime import runtime_key

    prefix = str(tmp_path / "nowhere-")
    with pytest.raises(EnvironmentProblem, match=f"`{prefix}g\\+\\+ --version` could not run"):
        runtime_key(["-mcpu=cortex-a76"], {}, toolchain_prefix=prefix)


def test_a_failing_arm_compiler_stops_the_fit_key(tmp_path):
    from deploykit.memory.fit import _compiler_version

    prefix = _program(tmp_path, "arm-gcc", "exit 1")[: -len("gcc")]
    with pytest.raises(EnvironmentProblem) as err:
        _compiler_version(prefix)
    assert f"`{prefix}gcc -dumpfullversion` failed (exit 1, no output)" in err.value.cause
    assert "stored memory measurements" in err.value.cause
    good = _program(tmp_path, "ok-gcc", "echo 12.2.1")[: -len("gcc")]
    assert _compiler_version(good) == "12.2.1"


# ---- a damaged fit.json ------------------------------------------------------------------------


def test_a_damaged_fit_file_is_said_naming_it(tmp_path):
    from deploykit.memory.fit import FIT_FILE, FIT_VERSION, load_fit

    said: list[str] = []
    assert load_fit(tmp_path, "k", said.append) is None and said == []  # none: nothing to say
    (tmp_path / FIT_FILE).write_text('{"version": ')  # cut short, as by a full disk
    assert load_fit(tmp_path, "k", said.append) is None
    (message,) = said
    assert message.startswith(f"{tmp_path / FIT_FILE} is damaged (")
    assert "estimates instead" in message and "build --fit" in message
    said.clear()
    (tmp_path / FIT_FILE).write_text(
        json.dumps({"version": FIT_VERSION, "entries": {"k": {"key": "k", "board": "b"}}}))
    assert load_fit(tmp_path, "k", said.append) is None
    (message,) = said
    assert message.startswith(f"{tmp_path / FIT_FILE}: the entry k is damaged")


def test_plan_says_that_fit_json_is_damaged(tmp_path):
    """Through the command's own path: the plan of tiny_cnn with a damaged fit.json in its
    out directory runs on estimates and says why."""
    from deploykit import api
    from deploykit.memory.fit import FIT_FILE

    (tmp_path / FIT_FILE).write_text("\0\0\0\0")
    said: list[str] = []
    plan = api.plan("qemu-an547", "tiny_cnn", out=tmp_path, progress=said.append)
    assert plan.fits
    warnings = [m for m in said if m.startswith("warning: ")]
    assert warnings == [m for m in warnings if f"{tmp_path / FIT_FILE} is damaged" in m]
    assert len(warnings) == 1, said
