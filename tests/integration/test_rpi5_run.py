"""The Raspberry Pi 5 runner for real: cross-built (ExecuTorch + XNNPACK, the model's portable
operators) and run under qemu-aarch64 with parity against the host, and the same binary run
over SSH against a real sshd on loopback.

Needs the ExecuTorch sources with the XNNPACK group (`deploykit setup --group xnnpack`),
g++-aarch64-linux-gnu, qemu-user and CMake/Ninja; the SSH test also openssh-server and root
(sshd's privilege separation). The first build compiles the aarch64 runtime (about 20 minutes
on 2 busy cores); later ones reuse it from the workspace's runtime cache.

The loopback "Pi" is this x86 machine: its sshd runs the aarch64 runner through qemu-aarch64
(DEPLOYKIT_REMOTE_EXEC), which stands in for the absent board; everything on the deploykit side
(ssh/scp, the copy, the protocol read from ssh's standard output) is what a Pi gets.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploykit import api
from deploykit.families import get_family
from deploykit.readers.boards import load_board, repo_root
from deploykit.readers.sources import load_workspace, require_projects
from deploykit.run.runners import runner_for_board
from deploykit.util.errors import DeployKitError
from deploykit.util.process import free_port
from tests.markers import requires_cmake


def _reason() -> str | None:
    for tool, package in (
        ("aarch64-linux-gnu-g++", "g++-aarch64-linux-gnu"),
        ("qemu-aarch64", "qemu-user"),
    ):
        if shutil.which(tool) is None:
            return f"{tool} not installed (apt-get install {package})"
    try:
        require_projects(
            load_workspace(), list(get_family("linux_aarch64").projects), "The rpi5 runner"
        )
    except DeployKitError as exc:
        return (
            f"XNNPACK sources not in the workspace ({exc.cause}): deploykit setup "
            "--group xnnpack (or --source xnnpack=PATH@REV ..., see docs/rpi5.md)"
        )
    return None


pytestmark = [
    requires_cmake,
    pytest.mark.skipif(_reason() is not None, reason=_reason() or ""),
    # The first test builds the aarch64 runtime: about 20 minutes on 2 busy cores, beyond the
    # suite's default limit (pyproject.toml).
    pytest.mark.timeout(3600),
]


@pytest.mark.parametrize(
    "model,flow",
    [
        ("tiny_cnn", "xnnpack_fp32"),
        ("mlp_mnist", "xnnpack_fp32"),
        ("mlp_mnist", "xnnpack_int8"),
        ("opt_small", "xnnpack_fp32"),
    ],
)
def test_run_under_qemu_aarch64_matches_the_host(tmp_path, model, flow):
    if model.startswith("opt"):
        pytest.importorskip("transformers", reason="pip install 'deploykit[bench]'")
    report = api.run("rpi5", model, flow=flow, out=tmp_path, timeout=300)
    assert report.passed, report.cause
    assert report.verdict.passed and report.ticks and report.ticks > 0
    hello = report.records.hello.fields
    assert "XnnpackBackend" in hello["backends"]
    assert hello["board"] == "rpi5"
    header = subprocess.run(
        ["aarch64-linux-gnu-readelf", "-h", "-l", str(report.elf)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "AArch64" in header and "INTERP" not in header  # static: no dynamic loader


def _sshd_reason() -> str | None:
    if shutil.which("ssh") is None or not Path("/usr/sbin/sshd").exists():
        return "openssh-server not installed (apt-get install openssh-server)"
    if os.geteuid() != 0:
        return "sshd on loopback needs root here (its privilege separation directory)"
    return None


@pytest.fixture
def loopback_pi(tmp_path, monkeypatch):
    """A real sshd on 127.0.0.1 with a temporary host key and user key; the client side is an
    ssh config file (DEPLOYKIT_SSH_CONFIG), as a user's ~/.ssh/config would be."""
    reason = _sshd_reason()
    if reason:
        pytest.skip(reason)
    keys = tmp_path / "keys"
    keys.mkdir()
    for name in ("host", "user"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name)], check=True
        )
    (keys / "authorized_keys").write_text((keys / "user.pub").read_text())
    port = free_port()
    (keys / "known_hosts").write_text(f"[127.0.0.1]:{port} {(keys / 'host.pub').read_text()}")
    Path("/run/sshd").mkdir(exist_ok=True)
    sshd_config = keys / "sshd_config"
    sshd_config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {keys / 'host'}\n"
        f"AuthorizedKeysFile {keys / 'authorized_keys'}\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPermitRootLogin yes\n"
        f"PidFile {keys / 'sshd.pid'}\n"
        # scp speaks SFTP (OpenSSH 9): Debian's sshd_config has this line too.
        "Subsystem sftp /usr/lib/openssh/sftp-server\n"
    )
    with open(keys / "sshd.log", "wb") as sshd_log:
        sshd = subprocess.Popen(
            ["/usr/sbin/sshd", "-D", "-e", "-f", str(sshd_config)],
            stdout=subprocess.DEVNULL,
            stderr=sshd_log,
        )
    ssh_config = keys / "ssh_config"
    ssh_config.write_text(
        f"Host loopback-pi\n  HostName 127.0.0.1\n  Port {port}\n  User root\n"
        f"  IdentityFile {keys / 'user'}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {keys / 'known_hosts'}\n  StrictHostKeyChecking yes\n"
    )
    monkeypatch.setenv("DEPLOYKIT_SSH_CONFIG", str(ssh_config))
    monkeypatch.setenv("DEPLOYKIT_REMOTE_EXEC", "qemu-aarch64 -cpu cortex-a76")
    try:
        for _ in range(100):  # until sshd accepts a login
            if (
                subprocess.run(
                    ["ssh", "-F", str(ssh_config), "-o", "BatchMode=yes", "loopback-pi", "true"],
                    capture_output=True,
                ).returncode
                == 0
            ):
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"sshd did not accept the test key: {(keys / 'sshd.log').read_text()}")
        yield "loopback-pi"
    finally:
        sshd.terminate()
        sshd.wait(timeout=10)


def test_run_over_ssh_on_a_loopback_sshd(tmp_path, loopback_pi):
    built = api.build("rpi5", "tiny_cnn", flow="xnnpack_fp32", out=tmp_path)
    runner = runner_for_board(load_board("rpi5"), host=loopback_pi)
    remote = Path(runner.remote_path(built.firmware.elf))  # the loopback "Pi" is this machine
    remote.unlink(missing_ok=True)  # a copy from an earlier run would skip the scp
    report = api.run(
        "rpi5",
        "tiny_cnn",
        flow="xnnpack_fp32",
        out=tmp_path,
        timeout=300,
        runner_options={"host": loopback_pi, "threads": 2},
    )
    assert report.passed, report.cause
    log = (tmp_path / "run" / "runner.log").read_text()
    assert "scp" in log and "loopback-pi" in log and "DK_THREADS=2" in log
    # the runner was copied under its content hash and is reused on the next run
    assert remote.is_file()
    again = api.run(
        "rpi5",
        "tiny_cnn",
        flow="xnnpack_fp32",
        out=tmp_path,
        timeout=300,
        runner_options={"host": loopback_pi},
    )
    assert again.passed
    assert "scp" not in (tmp_path / "run" / "runner.log").read_text()


def test_ssh_to_an_unreachable_host_is_a_clear_error(tmp_path, monkeypatch):
    reason = _sshd_reason()
    if reason:
        pytest.skip(reason)
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host nowhere\n  HostName 127.0.0.1\n  Port {free_port()}\n  ConnectTimeout 3\n"
    )
    monkeypatch.setenv("DEPLOYKIT_SSH_CONFIG", str(config))
    with pytest.raises(DeployKitError, match="ssh could not connect to nowhere"):
        api.run(
            "rpi5",
            "tiny_cnn",
            flow="xnnpack_fp32",
            out=tmp_path / "out",
            timeout=60,
            runner_options={"host": "nowhere"},
        )


def test_opt_bench_on_the_loopback_pi(tmp_path, loopback_pi):
    """bench/opt_bench.py --host: each flow's cross-built runner timed on the "Pi" over SSH, its
    table printed beside the host's and labelled emulated (the loopback runs qemu-aarch64)."""
    pytest.importorskip("transformers", reason="pip install 'deploykit[bench]'")
    out = tmp_path / "bench.json"
    res = subprocess.run(
        [
            sys.executable,
            str(repo_root() / "bench" / "opt_bench.py"),
            *("--model", "opt_small", "--host", loopback_pi, "--board", "rpi5"),
            *(
                "--threads",
                "2",
                "--warmup",
                "1",
                "--repeats",
                "2",
                "--portable-repeats",
                "1",
                "--int8",
            ),
            *("--out", str(tmp_path / "pi"), "--json", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    print(res.stdout)
    pi_text = res.stdout.split("\nRaspberry Pi (rpi5 over ssh loopback-pi", 1)[1]
    assert "2 thread(s)" in pi_text.splitlines()[0]
    assert "PyTorch eager not measured on the Pi" in pi_text and "/ portable" in pi_text
    assert "EMULATED: the runner ran under qemu-aarch64 -cpu cortex-a76 on loopback-pi" in pi_text
    pi = json.loads(out.read_text())["pi"]
    assert pi["threads"] == 2 and pi["emulated_by"] and pi["eager_not_measured"]
    rows = {r["runtime"]: r for r in pi["rows"]}
    assert set(rows) == {
        "ExecuTorch portable",
        "ExecuTorch + XNNPACK",
        "ExecuTorch + XNNPACK int8",
    }
    for label, row in rows.items():
        assert "error" not in row, row
        assert 0 < row["min_ms"] <= row["median_ms"] <= row["max_ms"]
        assert row["clock"] == "emulated" and row["runner_bytes"] > 0
        assert f"{label:<28}" in pi_text and "EMULATED" in pi_text.split(label, 1)[1].split("\n")[0]
    assert rows["ExecuTorch portable"]["ratio_to_portable"] == 1.0
    assert rows["ExecuTorch portable"]["runs"] == 1 and rows["ExecuTorch + XNNPACK"]["runs"] == 2
    assert {r["flow"] for r in pi["rows"]} == {"portable_fp32", "xnnpack_fp32", "xnnpack_int8"}


def test_opt_bench_times_eager_on_a_remote_with_torch(loopback_pi, monkeypatch):
    """The Pi's eager row: the model's source sent to the remote interpreter over ssh. The
    loopback remote is this machine, and its interpreter with torch and transformers is the
    one running the tests (--remote-python; the PATH's python3 may have neither); without
    DEPLOYKIT_REMOTE_EXEC only its machine (x86_64) says the runner would be emulated there;
    remote_eager is asked as for a real Pi."""
    pytest.importorskip("transformers", reason="pip install 'deploykit[bench]'")
    monkeypatch.delenv("DEPLOYKIT_REMOTE_EXEC")
    spec = importlib.util.spec_from_file_location("opt_bench", repo_root() / "bench/opt_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    small = importlib.import_module("opt_small")
    runner = runner_for_board(load_board("rpi5"), host=loopback_pi, threads=1)
    args = bench.argparse.Namespace(warmup=1, repeats=3, remote_python=sys.executable)
    assert (
        bench.remote_emulation(runner) == "loopback-pi is x86_64: its binfmt emulation of aarch64"
    )
    eager = bench.remote_eager(runner, None, dict(small.CONFIG), small.SEQ_LEN, args)
    assert "not_measured" not in eager, eager
    assert eager["runs"] == 3 and 0 < eager["min_ms"] <= eager["median_ms"] <= eager["max_ms"]
    args.remote_python = "python3-without-torch"  # no such interpreter on the remote
    missing = bench.remote_eager(runner, None, dict(small.CONFIG), small.SEQ_LEN, args)
    assert missing == {
        "not_measured": "python3-without-torch with torch and transformers not on loopback-pi"
    }
