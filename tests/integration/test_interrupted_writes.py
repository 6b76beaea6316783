"""deploykit killed while it writes an entry, and on a full disk (tests/interrupted_writes.py):
the representative cases (the last builds a runtime: ExecuTorch sources, a minute or two).
bench/soak --parts kill,disk runs 30 kill points over a cold firmware build and a full disk
at several sizes (docs/failures.md)."""

from __future__ import annotations

import subprocess

import pytest

from deploykit import api
from tests.interrupted_writes import can_mount, deploykit, private_workspace, sha256, small_disk
from tests.markers import requires_cmake, requires_sources, requires_toolchain

MODEL = ["--no-project", "--board", "qemu-an547", "--model", "tiny_cnn"]


@pytest.fixture(scope="module")
def clean_pte(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("clean")
    return sha256(api.export("qemu-an547", "tiny_cnn", out=out, project=False).pte_path)


def test_an_export_killed_while_it_writes_is_made_again(tmp_path, clean_pte):
    """SIGKILL (the whole process tree) the moment the program file appears: the export is
    half-written. The next export makes it again and ends with the clean export's program."""
    out = tmp_path / "out"
    killed = deploykit(["export", *MODEL, "--out", str(out)], tmp_path,
                       kill_when=out / "export" / "model.pte", timeout=600)
    assert killed.returncode is None, "the export finished before it was killed"
    assert not (out / "export" / "export-key").exists()
    messages: list[str] = []
    result = api.export("qemu-an547", "tiny_cnn", out=out, project=False,
                        progress=messages.append)
    assert any(m.startswith("exporting tiny_cnn") for m in messages), messages
    assert sha256(result.pte_path) == clean_pte


@pytest.mark.skipif(can_mount() is not None, reason=can_mount() or "")
def test_a_full_disk_is_named_and_the_export_succeeds_when_space_returns(tmp_path, clean_pte):
    """--out on a 64 KiB tmpfs: the export stops with the environment's exit code, naming the
    file it could not write, and keeps no entry; with space back, the same command exports
    the clean program."""
    with small_disk(tmp_path / "disk", 64 << 10) as disk:
        out = disk / "out"
        full = deploykit(["export", *MODEL, "--out", str(out)], tmp_path, timeout=600)
        assert full.returncode == 4, full.stderr
        assert f"No space left to write {out / 'export'}/" in full.stderr
        assert "Traceback" not in full.stderr
        left = {p.name for p in (out / "export").iterdir()}
        assert "export-key" not in left and not any(n.endswith(".tmp") for n in left), left
        subprocess.run(["mount", "-o", "remount,size=16m", str(disk)], check=True)
        again = deploykit(["export", *MODEL, "--out", str(out)], tmp_path, timeout=600)
        assert again.returncode == 0, again.stderr
        assert sha256(out / "export" / "model.pte") == clean_pte


@requires_toolchain
@requires_cmake
@requires_sources
@pytest.mark.skipif(can_mount() is not None, reason=can_mount() or "")
def test_a_runtime_cache_on_a_full_disk_is_configured_again_when_space_returns(tmp_path):
    """The workspace's runtime cache on a 1 MiB tmpfs: the runtime's configure runs out of
    space (CMake still says "Generating done", without build.ninja). The build stops with the
    full-disk error naming the cache, and with space back the same build passes: the half
    configured runtime directory is configured again, not taken as configured."""
    from deploykit.readers.sources import load_workspace

    with small_disk(tmp_path / "disk", 1 << 20) as disk:
        ws = private_workspace(disk / "ws", load_workspace().root)
        args = ["build", *MODEL, "--workspace", str(ws), "--out", str(tmp_path / "out")]
        full = deploykit(args, tmp_path, timeout=900)
        assert full.returncode == 4, full.stderr
        assert f"{ws / 'runtime-cache'}" in full.stderr and "Traceback" not in full.stderr
        subprocess.run(["mount", "-o", "remount,size=2g", str(disk)], check=True)
        again = deploykit(args, tmp_path, timeout=900)
        assert again.returncode == 0, again.stderr
        runtime = next((ws / "runtime-cache").glob("et*-cortex-m55-*"))
        assert (runtime / "dk-runtime-configured").is_file()
        assert (runtime / "build.ninja").is_file()
