"""Two deploykits sharing an output directory or a workspace: an entry another version wrote
is not reused, one the same version wrote is (docs/failures.md, "Another deploykit's files").

The other deploykit is real: a copy of this checkout (tests/other_checkout.py) whose
pyproject.toml says another version, run as its own process. It exports into an output
directory this checkout then exports into, and prints the keys it would give a fit record, a
cached ExecuTorch runtime (the version it passes to key.cmake) and an aarch64 runtime. A copy
under this checkout's own version is the control: the same code, so the same keys. The
ExecuTorch runtime key itself is computed by key.cmake (tests/unit/test_profiles.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from deploykit import api
from tests.other_checkout import copy_checkout, run_python

OTHER_VERSION = "0.0.9+another"

# What the other deploykit prints: the keys of its entries for tiny_cnn on qemu-an547.
KEYS_SCRIPT = """
import json, shutil, sys
from pathlib import Path
from deploykit import api
from deploykit.memory.fit import fit_key, fit_options
from deploykit.pipeline.target import resolve_target
from deploykit.program.inspect import inspect_pte

out = Path(sys.argv[1])
result = api.export("qemu-an547", "tiny_cnn", out=out, project=False)
target = resolve_target("qemu-an547")
keys = {"fit": fit_key(fit_options(inspect_pte(result.pte_path), target,
                                   target.cmake_definitions())),
        "runtime_version": target.cmake_definitions().get("DK_DEPLOYKIT_VERSION"),
        "export": (out / "export" / "export-key").read_text()}
if shutil.which("aarch64-linux-gnu-g++"):
    from deploykit.families.linux_runtime import runtime_key
    keys["linux_runtime"] = runtime_key(["-mcpu=cortex-a76"], {"executorch": "e4d02f41"})[0]
print(json.dumps(keys))
"""


def _keys_of(checkout: Path, out: Path) -> dict[str, str]:
    done = run_python(checkout, ["-c", KEYS_SCRIPT, str(out)], cwd=out.parent)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _own_keys(out: Path, messages: list[str]) -> dict[str, str]:
    from deploykit.memory.fit import fit_key, fit_options
    from deploykit.pipeline.target import resolve_target
    from deploykit.program.inspect import inspect_pte

    result = api.export("qemu-an547", "tiny_cnn", out=out, project=False,
                        progress=messages.append)
    target = resolve_target("qemu-an547")
    keys = {"fit": fit_key(fit_options(inspect_pte(result.pte_path), target,
                                       target.cmake_definitions())),
            "runtime_version": target.cmake_definitions().get("DK_DEPLOYKIT_VERSION"),
            "export": (out / "export" / "export-key").read_text()}
    if shutil.which("aarch64-linux-gnu-g++"):
        from deploykit.families.linux_runtime import runtime_key

        keys["linux_runtime"] = runtime_key(["-mcpu=cortex-a76"], {"executorch": "e4d02f41"})[0]
    return keys


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[dict[str, str], dict[str, str], list[str]]]:
    """For a deploykit of another version and one of this version: the keys it printed after
    exporting into an output directory, then this checkout's keys after exporting into the same
    directory, and this checkout's progress messages."""
    base = tmp_path_factory.mktemp("two-deploykits")
    found = {}
    for name, version in (("other", OTHER_VERSION), ("same", None)):
        checkout = copy_checkout(base / f"{name}-checkout", version)
        out = base / f"{name}-out"
        theirs = _keys_of(checkout, out)
        messages: list[str] = []
        found[name] = (theirs, _own_keys(out, messages), messages)
    return found


def test_the_version_is_the_checkouts_own(runs):
    """A checkout's version is its pyproject.toml's, whichever deploykit distribution the
    environment has installed (both copies run in this one's environment)."""
    import re

    from deploykit.util.paths import data_root
    from deploykit.util.version import deploykit_version

    pyproject = (data_root() / "pyproject.toml").read_text()
    assert deploykit_version() == re.search(r'(?m)^version = "(.*)"$', pyproject).group(1)
    assert runs["other"][0]["runtime_version"] == OTHER_VERSION
    assert runs["same"][0]["runtime_version"] == deploykit_version()


def test_an_export_another_version_made_is_made_again(runs):
    theirs, ours, messages = runs["other"]
    assert theirs["export"] != ours["export"]
    assert not any("is up to date" in m for m in messages), messages
    assert any(m.startswith("exporting tiny_cnn") for m in messages), messages


def test_an_export_the_same_version_made_is_reused(runs):
    theirs, ours, messages = runs["same"]
    assert theirs["export"] == ours["export"]
    assert any("export of tiny_cnn is up to date" in m for m in messages), messages


@pytest.mark.parametrize("entry", ["fit", "runtime_version", "linux_runtime"])
def test_every_cache_key_names_the_version(runs, entry):
    """A fit record, the cached ExecuTorch runtime (key.cmake reads the version given here),
    and the aarch64 runtime: another version's key differs, the same version's does not."""
    if entry not in runs["same"][1]:
        pytest.skip("aarch64-linux-gnu-g++ not installed (apt-get install g++-aarch64-linux-gnu)")
    assert runs["other"][0][entry] != runs["other"][1][entry]
    assert runs["same"][0][entry] == runs["same"][1][entry]
