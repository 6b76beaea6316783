#!/usr/bin/env python3
"""Patch-based execution of the first layers (--patches, docs/memory.md) against the same
program without patches, on the QEMU boards: planned activations, the method pool, flash,
instructions per inference (QEMU icount) and whether the outputs are the same, bit for bit.

    bench/patches_bench.py                                   mobilenet_v1_025, auto
    bench/patches_bench.py --patches 1x4 --boards qemu-an505
    bench/patches_bench.py --model mobilenet_v2 --boards qemu-an505 --timeout 3600
    bench/patches_bench.py --json out.json

Each board builds and runs the model twice with the build profile given (default speed: int8
model input read in place, so that the input is not planned as a float or a full int8 copy),
under <out>/<board>/off and <out>/<board>/<patches>. Needs the upstream workspace
(DEPLOYKIT_WORKSPACE) and QEMU. The instruction count is QEMU's (icount), the memory the
runner's counting allocators' peaks.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from deploykit import api  # noqa: E402
from deploykit.util.fsutil import write_atomic  # noqa: E402


def measure(board: str, model: str, patches: str, profile: str, out: Path,
            timeout: float) -> dict:
    report = api.run(board, model, flow="cortex_m_int8", profile=profile, patches=patches,
                     out=out, timeout=timeout, project=False)
    exported = json.loads((out / "export" / "export.json").read_text())
    return {
        "passed": report.passed,
        "instructions": report.instructions_estimate,
        "planned": exported["planned_buffers"][-1],
        "method_pool": report.memory.get("method_pool", (None, None))[0],
        "pte": exported["pte"]["size"],
        "patches": exported.get("patches"),
        "reference": out / "export" / "reference.npz",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mobilenet_v1_025")
    parser.add_argument("--patches", default="auto")
    parser.add_argument("--boards", default="qemu-an505,qemu-an547")
    parser.add_argument("--profile", default="speed")
    parser.add_argument("--out", type=Path, default=Path("build/bench-patches"))
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for board in args.boards.split(","):
        base = args.out / board / args.model
        off = measure(board, args.model, "off", args.profile, base / "off", args.timeout)
        on = measure(board, args.model, args.patches, args.profile, base / args.patches,
                     args.timeout)
        same = all(np.array_equal(np.load(on["reference"])[k], np.load(off["reference"])[k])
                   for k in np.load(off["reference"]).files if k.startswith("output_"))
        rows.append({"board": board, "off": off, "patches": on, "same_outputs": same})
        p = on["patches"] or {}
        print(f"{board} {args.model} ({args.profile}), patches {p.get('grid', '-')} up to "
              f"{p.get('split', '-')}:")
        for name, key in (("planned activations", "planned"), ("method pool", "method_pool"),
                          (".pte", "pte"), ("instructions", "instructions")):
            a, b = off[key], on[key]
            ratio = f"{b / a:.2f}x" if a and b else "-"
            print(f"  {name:<20} {a or 0:>14,.0f} -> {b or 0:>14,.0f}  {ratio}")
        print(f"  MACs +{p.get('mac_overhead', 0):.1%}; both runs passed: "
              f"{off['passed'] and on['passed']}; outputs bit for bit the same: {same}")
    if args.json:
        write_atomic(args.json, json.dumps(rows, indent=2, default=str) + "\n")
    return 0 if all(r["same_outputs"] and r["off"]["passed"] and r["patches"]["passed"]
                    for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
