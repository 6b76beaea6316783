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

On a Raspberry Pi too, with --host HOST (an SSH host alias or user@host; --board rpi5 or
rpi4): deploykit builds the cross-built runner of each flow (its API, the linux_aarch64 family,
the runtime cached in the workspace: DEPLOYKIT_WORKSPACE, with the xnnpack group), runs it on
HOST over SSH as `deploykit run --host` does (the system's ssh/scp, the user's SSH config,
BatchMode), and prints the Pi's table beside the host's. Each Pi figure is the execute() time
the runner reports (clock-monotonic) for one inference; the runner is invoked --warmup times
first, then --repeats times (--portable-repeats for the portable kernels), one inference per
invocation, each on a freshly loaded method. Eager runs on the Pi when `python3 -c "import
torch, transformers"` works there (--remote-python names another interpreter, a virtual
environment's, say); otherwise the table says so and its ratios are to the
runner's portable figure. When the remote runs the runner through qemu
(DEPLOYKIT_REMOTE_EXEC, the tests' loopback "Pi"), every Pi row is labelled emulated.

    bench/opt_bench.py --model opt_small --host pi5 --board rpi5 --threads 4

Threads: PyTorch (torch.set_num_threads) and XNNPACK (ExecuTorch's thread pool) both use
--threads (default: every core of this machine; on the Pi, the board file's linux.threads);
the portable kernels are single-threaded.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "models"))


def spread(times: list[float]) -> dict:
    return {
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "max_ms": max(times),
        "runs": len(times),
    }


def timed(fn, warmup: int, repeats: int) -> dict:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return spread(times)


# Eager PyTorch on the Pi: this script follows models/opt_125m.py's source (build, tokens) on
# the remote python3's standard input, and prints the timings as one JSON line.
_REMOTE_EAGER = """
import json as _json, sys as _sys, time as _time
torch.set_num_threads({threads})
_module = build({config!r})
_inputs = (tokens(_module.lm.config.vocab_size, {seq_len}),)
_times = []
with torch.no_grad():
    for _i in range({warmup} + {repeats}):
        _t0 = _time.perf_counter()
        _module(*_inputs)
        if _i >= {warmup}:
            _times.append((_time.perf_counter() - _t0) * 1e3)
print("DK_EAGER " + _json.dumps(_times))
"""


def remote_emulation(runner: Any) -> str | None:
    """What emulates the aarch64 runner on the remote, if anything: the runner's own wrapper
    (DEPLOYKIT_REMOTE_EXEC), or a remote that is no aarch64 machine (binfmt emulation)."""
    if runner.emulated_by:
        return runner.emulated_by
    res = subprocess.run(
        ["ssh", *runner.ssh_options(), runner.host, "uname -m"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    machine = res.stdout.strip()
    if res.returncode == 0 and machine != "aarch64":
        return f"{runner.host} is {machine}: its binfmt emulation of aarch64"
    return None


def remote_eager(
    runner: Any, emulated: str | None, config: dict, seq_len: int, args: argparse.Namespace
) -> dict:
    """Eager PyTorch timed on the Pi, or {"not_measured": why}."""
    if emulated:
        return {
            "not_measured": f"the runner is emulated there ({emulated}); "
            "eager python3 would run natively, so no comparable figure"
        }
    ssh = ["ssh", *runner.ssh_options(), runner.host]
    python = shlex.quote(args.remote_python)
    probe = subprocess.run(
        [*ssh, f'{python} -c "import torch, transformers"'],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if probe.returncode == 255:
        return {"not_measured": f"ssh could not connect to {runner.host}"}
    if probe.returncode != 0:
        return {
            "not_measured": f"{args.remote_python} with torch and transformers not on {runner.host}"
        }
    script = (ROOT / "models" / "opt_125m.py").read_text() + _REMOTE_EAGER.format(
        threads=runner.threads,
        config=config,
        seq_len=seq_len,
        warmup=args.warmup,
        repeats=args.repeats,
    )
    res = subprocess.run(
        [*ssh, f"{python} -"], input=script, capture_output=True, text=True, check=False
    )
    line = next((x for x in res.stdout.splitlines() if x.startswith("DK_EAGER ")), None)
    if res.returncode != 0 or line is None:
        return {"not_measured": f"eager failed on {runner.host}: {res.stderr.strip()[-300:]}"}
    return spread(json.loads(line.split(" ", 1)[1]))


def pi_rows(
    args: argparse.Namespace, flows: list[tuple[str, str, int]], config: dict, seq_len: int
) -> dict:
    """The Pi's table: each flow's cross-built runner, run on args.host over SSH."""
    from deploykit import api
    from deploykit.readers.boards import load_board
    from deploykit.run.runners import runner_for_board
    from deploykit.util.errors import DeployKitError

    runner = runner_for_board(load_board(args.board), host=args.host, threads=args.pi_threads)
    runner.check_environment()
    emulated = remote_emulation(runner)
    out = args.out / f"{args.board}-{args.model}"
    rows: list[dict] = []
    for label, flow, repeats in flows:
        try:
            built = api.build(args.board, args.model, flow=flow, out=out / flow)
            elf = built.firmware.elf
            times = []
            for i in range(args.warmup + repeats):
                timing = runner.run(elf, out / flow, timeout_s=args.pi_timeout).records.timing
                if timing is None or not timing.tick_hz or not timing.iterations:
                    raise SystemExit(f"opt_bench: the runner for {flow} sent no timing record")
                if i >= args.warmup:
                    times.append(timing.ticks / timing.tick_hz / timing.iterations * 1e3)
        except DeployKitError as exc:
            rows.append({"runtime": label, "flow": flow, "error": exc.cause})
            print(f"  Pi {label}: failed: {exc.cause}", flush=True)
            continue
        rows.append(
            {"runtime": label, "flow": flow, "runner_bytes": elf.stat().st_size, **spread(times)}
        )
        print(f"  Pi {label} done: median {rows[-1]['median_ms']:.1f} ms", flush=True)
    eager = remote_eager(runner, emulated, config, seq_len, args)
    if "not_measured" not in eager:
        rows.insert(0, {"runtime": "PyTorch eager", **eager})
    return {
        "board": args.board,
        "host": args.host,
        "threads": runner.threads,
        "emulated_by": emulated,
        "eager_not_measured": eager.get("not_measured"),
        "rows": rows,
    }


def print_table(rows: list[dict], base: float | None, base_name: str, extra: str) -> None:
    """Rows with median/min/max and each median's ratio to `base` (ms)."""
    print(
        f"{'runtime':<28}{'median ms':>11}{'min':>10}{'max':>10}{'runs':>6}"
        f"{'/ ' + base_name:>12}  {extra}"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['runtime']:<28}  failed: {r['error']}")
            continue
        ratio = r["median_ms"] / base if base else float("nan")
        r["ratio_to_" + base_name] = ratio
        print(
            f"{r['runtime']:<28}{r['median_ms']:>11.1f}{r['min_ms']:>10.1f}"
            f"{r['max_ms']:>10.1f}{r['runs']:>6}{ratio:>12.2f}  {r.get('extra', '')}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="opt_125m", choices=("opt_125m", "opt_small"))
    ap.add_argument("--seq-len", type=int, help="tokens (default: the model file's)")
    ap.add_argument(
        "--threads",
        type=int,
        help="threads of torch and XNNPACK (default: this machine's cores; on the Pi, "
        "the board file's linux.threads)",
    )
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
    ap.add_argument(
        "--host",
        help="also on this Raspberry Pi (SSH host alias or user@host): the cross-built runner",
    )
    ap.add_argument("--board", default="rpi5", choices=("rpi5", "rpi4"), help="with --host")
    ap.add_argument(
        "--out",
        type=Path,
        help="with --host: where the runners are built (default: a temporary directory)",
    )
    ap.add_argument(
        "--remote-python",
        default="python3",
        help="with --host: the Pi's interpreter with torch and transformers, for the eager row",
    )
    ap.add_argument(
        "--pi-timeout", type=float, default=900.0, help="seconds per runner invocation on the Pi"
    )
    args = ap.parse_args(argv)
    if args.host and (args.seq_len or args.checkpoint):
        ap.error(
            "--host builds the runner from the model file (its sequence length and seeded "
            "weights): drop --seq-len/--checkpoint, or give --model opt_small/opt_125m as is"
        )
    args.pi_threads = args.threads
    args.threads = args.threads or os.cpu_count() or 1

    import importlib

    import torch

    from deploykit.flows import get_flow
    from deploykit.flows.base import ExportOptions, ExportTarget
    from deploykit.flows.common import Stages
    from deploykit.program.models import ModelSpec
    from deploykit.util.errors import DeployKitError

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

    for r in rows:
        if "max_abs_diff_to_eager" in r:
            r["extra"] = f"{r['max_abs_diff_to_eager']:.2e}"
    print(f"\nHost (this machine, ExecuTorch's Python runtime, {args.threads} thread(s)):")
    print_table(rows, rows[0]["median_ms"], "eager", "max |diff| to eager")
    print(
        "Host figures (this machine, not a Raspberry Pi). Goal of issue 16: "
        "ExecuTorch + XNNPACK / eager <= 0.7 for opt_125m at 128 tokens."
    )
    pi: dict | None = None
    if args.host:
        with tempfile.TemporaryDirectory(prefix="opt_bench-") as tmp:
            args.out = args.out or Path(tmp)
            try:
                pi = pi_rows(args, flows, dict(mod.CONFIG), seq_len)
            except DeployKitError as exc:  # e.g. no ssh, or a board file problem
                print(f"opt_bench: error: {exc.cause} {exc.hint or ''}".rstrip(), file=sys.stderr)
                return 2
        emulated = pi["emulated_by"]
        clock = "EMULATED" if emulated else "board"
        for r in pi["rows"]:
            r["clock"] = "emulated" if emulated else "board"
            r["extra"] = clock + (
                f", runner {r['runner_bytes']:,} B" if "runner_bytes" in r else ""
            )
        print(
            f"\nRaspberry Pi ({pi['board']} over ssh {pi['host']}, the cross-built runner's "
            f"execute() per inference, {pi['threads']} thread(s)):"
        )
        if pi["eager_not_measured"]:
            print(f"PyTorch eager not measured on the Pi: {pi['eager_not_measured']}")
        measured = {r["runtime"]: r["median_ms"] for r in pi["rows"] if "error" not in r}
        base_name = "eager" if "PyTorch eager" in measured else "portable"
        base = measured.get("PyTorch eager", measured.get("ExecuTorch portable"))
        print_table(pi["rows"], base, base_name, "clock")
        if emulated:
            print(
                f"EMULATED: the runner ran under {emulated}; these times are emulation, "
                "no measurement of a Raspberry Pi."
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
                    "pi": pi,
                },
                indent=2,
            )
            + "\n"
        )
    if pi is not None and all("error" in r for r in pi["rows"]):
        print(f"opt_bench: error: no runtime ran on {args.host}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
