#!/usr/bin/env python3
"""The ExecuTorch lab's three-way comparison, on this host: one OPT-125M forward pass (the
architecture of transformers' OPTConfig, fp32, 128 tokens) in PyTorch eager, in ExecuTorch on
the portable kernels, and in ExecuTorch lowered to XNNPACK, through ExecuTorch's Python runtime.

    bench/opt_bench.py                          OPT-125M, sequence length 128 (minutes)
    bench/opt_bench.py --model opt_small        the small test configuration (seconds)
    bench/opt_bench.py --threads 2 --repeats 10 --int8 --json out.json
    bench/opt_bench.py --checkpoint DIR         a local Hugging Face OPT checkpoint's weights

Each runtime gets the same input; each is timed over --repeats runs after --warmup runs, and
the median, min and max (ms) and the median's ratio to eager are printed. The weights are
seeded random (nothing is downloaded here) unless --checkpoint is given: the work per
inference, and so the timing, is that of the real model; its outputs carry no meaning. The
exports are deploykit's own flows (portable_fp32, xnnpack_fp32, and with --int8 xnnpack_int8),
the ones `deploykit run --board rpi5` builds into the Raspberry Pi runner.

Threads: PyTorch (torch.set_num_threads) and XNNPACK (ExecuTorch's thread pool) both use
--threads (default: every core of this machine); the portable kernels are single-threaded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "models"))


def timed(fn, warmup: int, repeats: int) -> dict:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return {
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "max_ms": max(times),
        "runs": repeats,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="opt_125m", choices=("opt_125m", "opt_small"))
    ap.add_argument("--seq-len", type=int, help="tokens (default: the model file's)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument(
        "--portable-repeats",
        type=int,
        default=3,
        help="runs of the portable kernels (slow on a large model)",
    )
    ap.add_argument(
        "--int8",
        action="store_true",
        help="also ExecuTorch + XNNPACK int8 "
        "(xnnpack_int8: dynamic activations, per-channel weights)",
    )
    ap.add_argument("--checkpoint", help="a local OPT checkpoint directory (from_pretrained)")
    ap.add_argument("--json", type=Path, help="also write the figures to this file")
    args = ap.parse_args(argv)

    import importlib

    import torch

    from deploykit.errors import DeployKitError
    from deploykit.flows import get_flow
    from deploykit.flows.base import ExportOptions, ExportTarget
    from deploykit.flows.common import Stages
    from deploykit.models import ModelSpec

    mod = importlib.import_module(args.model)
    seq_len = args.seq_len or mod.SEQ_LEN
    module = mod.build(mod.CONFIG, args.checkpoint)
    inputs = (mod.tokens(module.lm.config.vocab_size, seq_len),)
    spec = ModelSpec(
        name=args.model,
        module=module,
        example_inputs=inputs,
        calibration_inputs=[inputs],
        tolerance={},
        source_path=ROOT / "models" / f"{args.model}.py",
    )
    torch.set_num_threads(args.threads)
    from executorch.extension.pybindings import portable_lib

    portable_lib._unsafe_reset_threadpool(args.threads)
    weights = "checkpoint " + args.checkpoint if args.checkpoint else "seeded random weights"
    params = sum(p.numel() for p in module.parameters())
    print(
        f"{args.model}: OPT architecture, {params / 1e6:.1f} M parameters, {weights}; "
        f"sequence length {seq_len}, fp32; {args.threads} thread(s) (torch "
        f"{torch.get_num_threads()}, XNNPACK {portable_lib._threadpool_get_thread_count()})",
        flush=True,
    )

    rows: list[dict] = []
    with torch.no_grad():
        eager_out = module(*inputs)
    rows.append(
        {"runtime": "PyTorch eager", **timed(lambda: module(*inputs), args.warmup, args.repeats)}
    )
    print(f"  eager done: median {rows[-1]['median_ms']:.1f} ms", flush=True)
    flows = [
        ("ExecuTorch portable", "portable_fp32", args.portable_repeats),
        ("ExecuTorch + XNNPACK", "xnnpack_fp32", args.repeats),
    ]
    if args.int8:
        flows.append(("ExecuTorch + XNNPACK int8", "xnnpack_int8", args.repeats))
    from executorch.runtime import Runtime

    for label, flow, repeats in flows:
        t0 = time.perf_counter()
        try:
            result = get_flow(flow).lower(
                spec, Stages(flow, args.model), ExportTarget("cortex-a76"), ExportOptions()
            )
        except DeployKitError as exc:  # one runtime failing does not hide the others
            rows.append({"runtime": label, "flow": flow, "error": exc.cause})
            print(f"  {label}: export failed: {exc.cause}", flush=True)
            continue
        export_s = time.perf_counter() - t0
        method = Runtime.get().load_program(result.pte).load_method("forward")
        out = method.execute(list(result.inputs))[0]
        diff = float((out - eager_out).abs().max())
        warmup = min(args.warmup, 1) if flow == "portable_fp32" else args.warmup
        rows.append(
            {
                "runtime": label,
                "flow": flow,
                "pte_bytes": len(result.pte),
                "export_s": round(export_s, 1),
                "max_abs_diff_to_eager": diff,
                **timed(lambda m=method, r=result: m.execute(list(r.inputs)), warmup, repeats),
            }
        )
        print(f"  {label} done: median {rows[-1]['median_ms']:.1f} ms", flush=True)

    eager = rows[0]["median_ms"]
    print(
        f"\n{'runtime':<28}{'median ms':>11}{'min':>10}{'max':>10}{'runs':>6}"
        f"{'/ eager':>9}  max |diff| to eager"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['runtime']:<28}  failed: {r['error']}")
            continue
        r["ratio_to_eager"] = r["median_ms"] / eager
        diff = f"{r['max_abs_diff_to_eager']:.2e}" if "max_abs_diff_to_eager" in r else "-"
        print(
            f"{r['runtime']:<28}{r['median_ms']:>11.1f}{r['min_ms']:>10.1f}"
            f"{r['max_ms']:>10.1f}{r['runs']:>6}{r['ratio_to_eager']:>9.2f}  {diff}"
        )
    print(
        "\nHost figures (this machine, not a Raspberry Pi). Goal of issue 16: "
        "ExecuTorch + XNNPACK / eager <= 0.7 for opt_125m at 128 tokens."
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "model": args.model,
                    "seq_len": seq_len,
                    "threads": args.threads,
                    "weights": weights,
                    "rows": rows,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
