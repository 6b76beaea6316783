"""The source override: a real local git repository, archived into a real workspace."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deploykit.readers import sources
from deploykit.readers.sources import SourceOverride, read_manifest
from deploykit.util.errors import ConfigError, EnvironmentProblem


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def upstream(tmp_path):
    """A local git repository per manifest project, each with one commit."""
    repos = {}
    for project in read_manifest():
        repo = tmp_path / "upstream" / project.name
        files = {"README": f"{project.name}\n", **_TREES.get(project.name, {})}
        repos[project.name] = (repo, _repo_with(repo, files))
    return repos


def _repo_with(repo, files, tag=None):
    repo.mkdir(parents=True, exist_ok=True)
    _git(repo, "init", "-q")
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    if tag:
        _git(repo, "tag", tag)
    return _git(repo, "rev-parse", "HEAD")


# The files setup checks for in the Ethos-U projects (the trees' contents do not matter here).
_TREES = {
    sources.ETHOS_U_DRIVER: {f: "" for f in sources.DRIVER_FILES},
    sources.CMSIS: {f: "" for f in sources.CMSIS_FILES},
}


def test_override_parsing():
    o = SourceOverride.parse("executorch=/a/b.git@v1.4.1")
    assert (o.name, str(o.path), o.revision) == ("executorch", "/a/b.git", "v1.4.1")
    assert SourceOverride.parse("cmsis-nn=/x").revision is None
    with pytest.raises(ConfigError):
        SourceOverride.parse("executorch")


def test_manifest_pins_executorch_v1_4_1():
    pins = {p.name: p for p in read_manifest()}
    assert pins["executorch"].revision == "e4d02f41f7909e8ed5bf4a14ffc520d733453d9f"
    assert pins["flatbuffers"].path.startswith("executorch/third-party/")
    assert pins["executorch"].url == "https://github.com/pytorch/executorch"


def test_setup_from_overrides_builds_a_workspace(tmp_path, upstream):
    overrides = [SourceOverride(name, repo, commit) for name, (repo, commit) in upstream.items()]
    ws = sources.setup(tmp_path / "ws", overrides, progress=lambda _m: None)
    assert ws.executorch_commit == upstream["executorch"][1]
    # nested project extracted inside its parent
    assert (ws.root / "executorch/third-party/flatcc/README").read_text() == "flatcc\n"
    state = json.loads((ws.root / sources.STATE_FILE).read_text())
    assert [p["name"] for p in state["projects"]] == [p.name for p in read_manifest()]
    # A mismatch with the installed wheel is refused and both commits are named.
    with pytest.raises(EnvironmentProblem) as exc:
        sources.check_executorch_commit(ws)
    assert upstream["executorch"][1] in exc.value.cause


def test_reextracting_a_parent_redoes_its_children(tmp_path, upstream):
    overrides = [SourceOverride(name, repo, commit) for name, (repo, commit) in upstream.items()]
    ws = sources.setup(tmp_path / "ws", overrides, progress=lambda _m: None)
    repo, _ = upstream["executorch"]
    (repo / "NEW").write_text("x")
    _git(repo, "add", "NEW")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "second")
    overrides[0] = SourceOverride("executorch", repo, "HEAD")
    ws = sources.setup(tmp_path / "ws", overrides, progress=lambda _m: None)
    assert (ws.root / "executorch/NEW").exists()
    assert (ws.root / "executorch/third-party/flatbuffers/README").exists()


def test_unknown_project_and_non_git_path_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="not a project"):
        sources.setup(tmp_path / "ws", [SourceOverride("nope", tmp_path, None)])
    with pytest.raises(ConfigError, match="not a git repository"):
        sources.setup(tmp_path / "ws", [SourceOverride("executorch", tmp_path, None)])


def test_missing_workspace_says_how_to_set_up(tmp_path):
    with pytest.raises(EnvironmentProblem) as exc:
        sources.load_workspace(tmp_path / "nowhere")
    assert "ExecuTorch sources not available" in exc.value.cause
    assert "deploykit setup" in exc.value.hint


def _stand_in_west(bin_dir: Path, calls: Path) -> None:
    """A `west` that fails to fetch as it does without GitHub, whatever the network is."""
    bin_dir.mkdir()
    west = bin_dir / "west"
    west.write_text(f"""#!/bin/sh
echo "$@" >> {calls}
case "$1" in
  init) mkdir -p .west; exit 0 ;;
  update) echo "fatal: unable to access 'https://github.com/google/flatbuffers/': Could not \
resolve host: github.com" >&2; exit 1 ;;
esac
exit 2
""")
    west.chmod(0o755)


def test_without_network_setup_prints_the_override_instructions(tmp_path, upstream,
                                                                monkeypatch):
    # Only executorch is given locally; the others need west, whose fetch fails as it does
    # without GitHub (a stand-in, so the test does not depend on the network). The error
    # lists the --source lines to use.
    bin_dir, calls = tmp_path / "bin", tmp_path / "west-calls"
    _stand_in_west(bin_dir, calls)
    # deploykit looks for west beside its Python first, then on PATH: the stand-in is both.
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python3"))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    repo, commit = upstream["executorch"]
    with pytest.raises(EnvironmentProblem) as exc:
        sources.setup(tmp_path / "ws", [SourceOverride("executorch", repo, commit)],
                      progress=lambda _m: None)
    assert "west update` could not fetch" in exc.value.cause and "flatbuffers" in exc.value.cause
    assert "--source flatbuffers=PATH@595bf0007ab1929570c7671f091313c8fc20644e" in exc.value.hint
    assert "Could not resolve host" in Path(exc.value.log_path).read_text()
    assert calls.read_text().splitlines()[-1].startswith("update --narrow")


def test_without_west_setup_says_how_to_install_it(tmp_path, upstream, monkeypatch):
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setattr(sys, "executable", str(empty / "python3"))
    git_dir = Path(shutil.which("git")).parent
    if (git_dir / "west").exists():
        pytest.skip(f"west is installed beside git ({git_dir}): cannot hide it from PATH")
    monkeypatch.setenv("PATH", f"{empty}{os.pathsep}{git_dir}")
    repo, commit = upstream["executorch"]
    with pytest.raises(EnvironmentProblem) as exc:
        sources.setup(tmp_path / "ws", [SourceOverride("executorch", repo, commit)],
                      progress=lambda _m: None)
    assert "west is not installed" in exc.value.cause and "pip install west" in exc.value.hint
    assert "--source flatbuffers=PATH@" in exc.value.hint


def _ws_with_driver(tmp_path, upstream, driver_files, tag=None, rev=None):
    """A workspace whose ethos-u-core-driver is a local repository with `driver_files`."""
    driver = tmp_path / "driver-src"
    commit = _repo_with(driver, driver_files, tag)
    overrides = [SourceOverride(name, repo, commit) for name, (repo, commit) in upstream.items()
                 if name != sources.ETHOS_U_DRIVER]
    overrides.append(SourceOverride(sources.ETHOS_U_DRIVER, driver, rev or commit))
    return sources.setup(tmp_path / "ws", overrides, progress=lambda _m: None), commit


def test_driver_layouts_and_the_pinned_release(tmp_path, upstream):
    """Arm's repository at its 26.02 tag is the pin; the Zephyr module (same driver at the root,
    plus zephyr/module.yml naming hal_ethos_u) is accepted and reported, with a warning."""
    from deploykit.readers.doctor import ethos_u_checks

    arm = {f: "" for f in sources.DRIVER_FILES}
    ws, commit = _ws_with_driver(tmp_path / "a", upstream, arm, tag="26.02", rev="26.02")
    info = sources.ethos_u_driver_info(ws)
    assert (info.layout, info.tags, info.revision, info.is_pinned) == (
        "arm", ("26.02",), "26.02", True)
    driver_check = next(c for c in ethos_u_checks(ws) if c.name == sources.ETHOS_U_DRIVER)
    assert driver_check.ok and not driver_check.warning
    assert "Arm's ethos-u-core-driver repository" in driver_check.detail

    zephyr = {**arm, "zephyr/module.yml": "name: hal_ethos_u\n"}
    ws, commit = _ws_with_driver(tmp_path / "z", upstream, zephyr)
    info = sources.ethos_u_driver_info(ws)
    assert (info.layout, info.is_pinned) == ("zephyr-module", False)
    driver_check, cmsis_check = ethos_u_checks(ws)
    assert driver_check.ok and driver_check.warning
    assert driver_check.detail.startswith(
        f"the Zephyr module zephyrproject-rtos/hal_ethos_u, commit {commit[:12]}")
    assert "not the pinned release 26.02" in driver_check.detail
    assert cmsis_check.ok and cmsis_check.name == sources.CMSIS


def test_a_copy_that_is_not_the_driver_is_refused(tmp_path, upstream):
    with pytest.raises(ConfigError, match="not the Ethos-U core driver"):
        _ws_with_driver(tmp_path, upstream, {"README": "something else\n"})


def test_manifest_drops_the_platform_and_adds_cmsis_6():
    pins = {p.name: p for p in read_manifest()}
    assert "ethos-u-core-platform" not in pins
    assert pins["cmsis"].url == "https://github.com/ARM-software/CMSIS_6"
    assert pins["cmsis"].groups == ("ethos-u",) and pins["cmsis"].optional
    assert pins["ethos-u-core-driver"].revision == "26.02"



def test_manifest_peers_are_optional_and_apart_from_executorchs_flatbuffers():
    """bench/peers' projects are skipped unless asked for, and TFLM's flatbuffers (a newer
    release than ExecuTorch's) lives at a path of its own, not over ExecuTorch's copy."""
    pins = {p.name: p for p in read_manifest()}
    peers = ("tflite-micro", "mlcommons-tiny", "tflm-flatbuffers", "gemmlowp", "ruy")
    for name in peers:
        assert pins[name].groups == ("peers",) and pins[name].optional, name
        assert pins[name].path.startswith("peers/"), name
    assert pins["tflm-flatbuffers"].url == pins["flatbuffers"].url
    assert pins["tflm-flatbuffers"].revision != pins["flatbuffers"].revision

# ---- remembered overrides ----------------------------------------------------------------------

def _offline_west(tmp_path, monkeypatch) -> Path:
    """A `west` whose fetch fails as without GitHub; returns the file its calls go to."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "west-calls"
    _stand_in_west(bin_dir, calls)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python3"))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return calls


def _given(upstream, *names):
    return [SourceOverride(n, upstream[n][0], upstream[n][1]) for n in names]


REQUIRED = ("executorch", "flatbuffers", "flatcc", "cmsis-nn")


def test_a_later_setup_uses_the_overrides_given_before(tmp_path, upstream, monkeypatch):
    """The issue's case: the sources and the Ethos-U projects from local copies, then
    `setup --group pico` with only the pico projects' --source: nothing is fetched from the
    network (west is never asked), every project stays where it came from."""
    calls = _offline_west(tmp_path, monkeypatch)
    ws = sources.setup(tmp_path / "ws", _given(upstream, *REQUIRED, sources.ETHOS_U_DRIVER,
                                               sources.CMSIS),
                       progress=lambda _m: None, groups=["ethos-u"])
    assert set(ws.overrides) == {*REQUIRED, sources.ETHOS_U_DRIVER, sources.CMSIS}
    said: list[str] = []
    ws = sources.setup(tmp_path / "ws", _given(upstream, "pico-sdk", "tinyusb", "picotool"),
                       progress=said.append, groups=["pico"])
    assert not calls.exists(), "west was asked to fetch: " + calls.read_text()
    for name in (*REQUIRED, sources.ETHOS_U_DRIVER, sources.CMSIS, "pico-sdk", "tinyusb",
                 "picotool"):
        assert ws.has(name) and ws.projects[name].origin.startswith("override:"), name
        assert ws.overrides[name].path == upstream[name][0].resolve()
    assert any(m.startswith(f"{sources.ETHOS_U_DRIVER}: from ") and "as remembered" in m
               for m in said)
    # doctor lists them
    from deploykit.readers.doctor import overrides_check

    check = overrides_check(sources.load_workspace(tmp_path / "ws"))
    assert check.ok and f"{sources.ETHOS_U_DRIVER}={upstream[sources.ETHOS_U_DRIVER][0]}" \
        in check.detail and "--forget NAME" in check.detail


def test_an_override_stays_until_replaced_or_forgotten(tmp_path, upstream, monkeypatch):
    calls = _offline_west(tmp_path, monkeypatch)
    sources.setup(tmp_path / "ws", _given(upstream, *REQUIRED, sources.CMSIS),
                  progress=lambda _m: None)
    # Replaced: another copy of cmsis (a second commit) is remembered from now on.
    other = tmp_path / "cmsis-fork"
    fork_commit = _repo_with(other, {"README": "fork\n", **_TREES[sources.CMSIS]})
    ws = sources.setup(tmp_path / "ws", [SourceOverride(sources.CMSIS, other, fork_commit)],
                       progress=lambda _m: None)
    assert ws.overrides[sources.CMSIS].path == other.resolve()
    ws = sources.setup(tmp_path / "ws", [], progress=lambda _m: None)
    assert ws.projects[sources.CMSIS].commit == fork_commit
    assert (ws.path_of(sources.CMSIS) / "README").read_text() == "fork\n"
    assert not calls.exists()
    # Forgotten: the project comes from its upstream again (here: west, which cannot fetch).
    with pytest.raises(EnvironmentProblem, match="could not fetch cmsis"):
        sources.setup(tmp_path / "ws", [], progress=lambda _m: None, forget=[sources.CMSIS])
    assert calls.read_text().split()[-1] == sources.CMSIS
    with pytest.raises(ConfigError, match="not a project of west.yml"):
        sources.setup(tmp_path / "ws", [], progress=lambda _m: None, forget=["nope"])


def test_a_remembered_copy_that_moved_says_how_to_go_on(tmp_path, upstream, monkeypatch):
    _offline_west(tmp_path, monkeypatch)
    moved = tmp_path / "moved-cmsis-nn"
    shutil.copytree(upstream["cmsis-nn"][0], moved)
    given = [*_given(upstream, "executorch", "flatbuffers", "flatcc"),
             SourceOverride("cmsis-nn", moved, upstream["cmsis-nn"][1])]
    sources.setup(tmp_path / "ws", given, progress=lambda _m: None)
    shutil.rmtree(moved)
    with pytest.raises(ConfigError) as exc:
        sources.setup(tmp_path / "ws", [], progress=lambda _m: None)
    assert f"--source cmsis-nn={moved.resolve()}@" in exc.value.cause
    assert "--source cmsis-nn=PATH" in exc.value.hint and "--forget cmsis-nn" in exc.value.hint


def test_a_workspace_from_before_remembers_its_local_copies(tmp_path, upstream, monkeypatch):
    """A state file without `overrides` (written before they were remembered): the projects
    whose origin is a local copy are remembered with the revision they were taken at."""
    calls = _offline_west(tmp_path, monkeypatch)
    ws = sources.setup(tmp_path / "ws", _given(upstream, *REQUIRED), progress=lambda _m: None)
    state_path = ws.root / sources.STATE_FILE
    state = json.loads(state_path.read_text())
    del state["overrides"]
    state_path.write_text(json.dumps(state))
    ws = sources.load_workspace(tmp_path / "ws")
    assert set(ws.overrides) == set(REQUIRED)
    assert ws.overrides["flatcc"].revision == upstream["flatcc"][1]
    sources.setup(tmp_path / "ws", [], progress=lambda _m: None)
    assert not calls.exists()
