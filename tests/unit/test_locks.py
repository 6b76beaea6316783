"""The --out lock (tools/deploykit/util/locks.py): nested stages of one command take it once, a
command that fails before writing leaves no directory, and another process waits for it,
saying who holds it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploykit.util.locks import LOCK_NAME, out_lock

ROOT = Path(__file__).resolve().parents[2]
OTHER = """
import sys, time
from pathlib import Path
from deploykit.util.locks import out_lock
with out_lock(Path(sys.argv[1]), on_wait=lambda m: print("WAIT", m, flush=True)):
    print("GOT", time.monotonic(), flush=True)
"""


def test_nested_stages_take_the_lock_once(tmp_path):
    with out_lock(tmp_path / "o"), out_lock(tmp_path / "o"), out_lock(tmp_path / "o" / "."):
        assert (tmp_path / "o" / LOCK_NAME).read_text().startswith("pid ")


def test_a_failure_before_any_output_leaves_no_directory(tmp_path):
    with pytest.raises(RuntimeError), out_lock(tmp_path / "new"):
        raise RuntimeError("failed first")
    assert not (tmp_path / "new").exists()
    with out_lock(tmp_path / "kept"):
        (tmp_path / "kept" / "export").mkdir()
    assert (tmp_path / "kept" / "export").is_dir()


def test_another_process_waits_and_names_the_holder(tmp_path):
    out = tmp_path / "o"
    with out_lock(out):
        other = subprocess.Popen(
            [sys.executable, "-c", OTHER, str(out)],
            text=True,
            stdout=subprocess.PIPE,
            cwd=ROOT,
            env={"PYTHONPATH": str(ROOT / "tools")},
        )
        assert other.stdout is not None
        first = other.stdout.readline()
        assert first.startswith("WAIT waiting for pid ") and str(out) in first
        time.sleep(0.3)
        assert other.poll() is None  # still waiting
        released = time.monotonic()
    rest = other.communicate(timeout=30)[0]
    assert other.returncode == 0
    assert float(rest.split()[1]) >= released
