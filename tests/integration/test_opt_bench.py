"""bench/opt_bench.py on the small OPT configuration: the lab's three-way comparison runs end
to end and prints every runtime with its ratio to eager (the ratios are printed, not asserted:
timings on a shared CI machine prove nothing), and each ExecuTorch result matches eager."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from deploykit.readers.boards import repo_root


def test_small_opt_three_way(tmp_path):
    pytest.importorskip("transformers", reason="pip install 'deploykit[bench]'")
    out = tmp_path / "bench.json"
    res = subprocess.run(
        [
            sys.executable,
            str(repo_root() / "bench" / "opt_bench.py"),
            "--model",
            "opt_small",
            "--threads",
            "2",
            "--warmup",
            "1",
            "--repeats",
            "3",
            "--portable-repeats",
            "2",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    print(res.stdout)
    for label in ("PyTorch eager", "ExecuTorch portable", "ExecuTorch + XNNPACK"):
        assert label in res.stdout
    assert "seeded random weights" in res.stdout and "/ eager" in res.stdout
    data = json.loads(out.read_text())
    rows = {r["runtime"]: r for r in data["rows"]}
    assert data["threads"] == 2 and data["seq_len"] == 32
    assert rows["PyTorch eager"]["ratio_to_eager"] == 1.0
    for label in ("ExecuTorch portable", "ExecuTorch + XNNPACK"):
        row = rows[label]
        assert row["runs"] >= 2 and row["min_ms"] <= row["median_ms"] <= row["max_ms"]
        assert row["max_abs_diff_to_eager"] < 1e-3  # the same model, fp32
