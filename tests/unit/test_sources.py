"""The source override: a real local git repository, archived into a real workspace."""

import json
import subprocess

import pytest

from deploykit import sources
from deploykit.errors import ConfigError, EnvironmentProblem
from deploykit.sources import SourceOverride, read_manifest


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def upstream(tmp_path):
    """A local git repository per manifest project, each with one commit."""
    repos = {}
    for project in read_manifest():
        repo = tmp_path / "upstream" / project.name
        repo.mkdir(parents=True)
        _git(repo, "init", "-q")
        (repo / "README").write_text(f"{project.name}\n")
        _git(repo, "add", "README")
        _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
        repos[project.name] = (repo, _git(repo, "rev-parse", "HEAD"))
    return repos


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


def test_without_network_setup_prints_the_override_instructions(tmp_path, upstream,
                                                                monkeypatch):
    # Only executorch is given locally; the others need west, which cannot reach GitHub here
    # (or is absent). Either way the error lists the --source lines to use.
    monkeypatch.setenv("GIT_TERMINAL_PROMPT", "0")
    repo, commit = upstream["executorch"]
    with pytest.raises(EnvironmentProblem) as exc:
        sources.setup(tmp_path / "ws", [SourceOverride("executorch", repo, commit)],
                      progress=lambda _m: None)
    assert "--source flatbuffers=PATH@595bf0007ab1929570c7671f091313c8fc20644e" in exc.value.hint
