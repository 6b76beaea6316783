"""Inputs that cannot crash the tools (issue #31): damaged programs, board files and input
folders, each handed to deploykit as a user would, in a worker process with limits.

Cases, from a seed (`make_cases`), deterministic:

- a program (a `.pte` exported from a bundled model) damaged by flipped bits, a truncation,
  an inflated length or offset in its flatbuffer (an aligned word that holds a plausible
  offset or length made huge), or an inflated field of its extended header (program size,
  segment base offset, segment data size, header length), then given to `deploykit inspect`,
  to `deploykit plan --pte` and, as the model, to `deploykit plan --model`;
- a board file mutated through its schema (a key dropped, a value of another type, a huge or
  negative number, a region of size zero, YAML that does not parse, an alias bomb), then
  listed by `deploykit boards` and used by `deploykit plan --pte`;
- an input folder for `run --inputs` (samples whose .npy header claims a huge shape, a
  truncated or bit-flipped .npy, .npz or .pt, another dtype or shape, a labels.json of another
  shape), loaded against the program's example inputs as `run --inputs` loads it.

A case passes when deploykit finishes it (a damage the format tolerates) or stops with one of
its classified errors (a DeployKitError: its message and exit code, no traceback). It fails
when an exception escapes (a traceback), when it runs for more than CASE_TIMEOUT seconds, when
its memory grows past the worker's RLIMIT_AS of 1 GiB (a MemoryError, or a process that dies),
or when the worker dies.

The worker (`python tests/fuzz_inputs.py --worker`, started by `Worker`) imports deploykit once
and runs cases one after the other, so that a case costs what deploykit does with it, not an
interpreter's start. Its address space is limited (RLIMIT_AS, inherited by what it starts:
flatc, which ExecuTorch's program reader runs); the parent enforces the time limit and starts
a new worker after a hang or a death. The worker runs with an empty workspace, so nothing
builds firmware.

tests/unit/test_fuzz_inputs.py runs a 300-case sample; bench/soak --parts fuzz runs 10,000.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT_AS = 1 << 30  # bytes of address space for the worker and what it starts
CASE_TIMEOUT = 10.0  # seconds per case
# The programs damaged: committed exports of two bundled models (tests/data/README.md).
BASE_PROGRAMS = ("tiny_cnn-portable_fp32-qemu-an547.pte", "mlp_mnist-cortex_m_int8-qemu-an505.pte")
BOARDS = ("qemu-an547", "qemu-an505", "corstone-320", "pico2")
PASSING = ("ok", "error")


@dataclass
class Case:
    ident: str
    kind: str  # "cli": argv for deploykit's CLI; "input_sets": a folder for run --inputs
    argv: list[str] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)  # written into the case's directory
    program: str = ""  # input_sets: the base program whose example inputs the samples match


@dataclass
class Outcome:
    ident: str
    verdict: str  # ok, error (classified), traceback, hang, memory, crash
    exit_code: int | None
    detail: str
    seconds: float

    @property
    def passed(self) -> bool:
        return self.verdict in PASSING


# ---- programs ----------------------------------------------------------------------------------

def _extended_header(data: bytes) -> tuple[int, int] | None:
    """(offset, length) of the extended header ("eh00") of a .pte, if it has one."""
    if len(data) >= 16 and data[8:12] == b"eh00":
        return 8, struct.unpack_from("<I", data, 12)[0]
    return None


def _flatbuffer_end(data: bytes) -> int:
    header = _extended_header(data)
    if header is not None and len(data) >= 24:
        return min(len(data), struct.unpack_from("<Q", data, 16)[0])
    return len(data)


def _inflated(rng: random.Random, value: int, size: int) -> int:
    choices = [0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, value + size, value * 4096 + 1,
               value + rng.randrange(1, 64) * 4, size - 1, 0]
    return rng.choice(choices) & 0xFFFFFFFF


def mutate_program(rng: random.Random, data: bytes) -> tuple[str, bytes]:
    """One damage of a .pte and its description."""
    buf = bytearray(data)
    kind = rng.choice(("bitflip", "truncate", "flatbuffer-word", "flatbuffer-word",
                       "extended-header"))
    if kind == "bitflip":
        flips = rng.randrange(1, 9)
        for _ in range(flips):
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        return f"{flips} bits flipped", bytes(buf)
    if kind == "truncate":
        cut = rng.choice((rng.randrange(len(buf)), rng.randrange(min(64, len(buf))),
                          _flatbuffer_end(data) - rng.randrange(1, 16)))
        return f"cut at {cut} of {len(buf)}", bytes(buf[:max(cut, 0)])
    if kind == "flatbuffer-word":
        end = _flatbuffer_end(data)
        # Aligned words that hold a plausible offset or length (a small positive number):
        # uoffsets to tables, vectors and strings, vector and string lengths.
        words = [i for i in range(0, end - 3, 4)
                 if 0 < struct.unpack_from("<I", buf, i)[0] < end]
        i = rng.choice(words)
        old = struct.unpack_from("<I", buf, i)[0]
        new = _inflated(rng, old, len(buf))
        struct.pack_into("<I", buf, i, new)
        return f"flatbuffer word at {i}: {old} -> {new}", bytes(buf)
    header = _extended_header(data)
    if header is None:
        return mutate_program(rng, data)
    offset, _length = header
    # eh00: u32 header length, u64 program size, u64 segment base offset, u64 segment size.
    name, at, width = rng.choice((("header length", offset + 4, 4),
                                  ("program size", offset + 8, 8),
                                  ("segment base offset", offset + 16, 8),
                                  ("segment data size", offset + 24, 8)))
    if at + width > len(buf):
        return mutate_program(rng, data)
    old = int.from_bytes(buf[at:at + width], "little")
    new = rng.choice((0, 1, old + 1, old - 1 if old else 1, old * 1000, len(buf) + 1,
                      (1 << (8 * width)) - 1, 1 << (8 * width - 1))) % (1 << (8 * width))
    buf[at:at + width] = new.to_bytes(width, "little")
    return f"extended header {name}: {old} -> {new}", bytes(buf)


def program_case(rng: random.Random, index: int,
                 programs: dict[str, tuple[bytes, str]]) -> Case:
    base = rng.choice(sorted(programs))
    original, board = programs[base]
    what, data = mutate_program(rng, original)
    command = rng.choice(("inspect", "plan --pte", "plan --model"))
    argv = {"inspect": ["inspect", "program.pte"],
            "plan --pte": ["plan", "--no-project", "--board", board, "--pte", "program.pte",
                           "--out", "out"],
            "plan --model": ["plan", "--no-project", "--board", board, "--model", "program.pte",
                             "--out", "out"]}[command]
    return Case(f"{index} program {base}: {what}; {command}", "cli", argv,
                {"program.pte": data})


# ---- board files -------------------------------------------------------------------------------

_ODD_VALUES = (None, -1, 0, 2**64, 1e308, float("nan"), "", "x" * 10_000, [], {}, [[[]]],
               "0x", "12Q", True, "0xffffffffffffffffff", {"a": 1}, [1, "two", None])


def _mutate_tree(rng: random.Random, tree: object) -> str:
    """Mutate one node of a parsed YAML tree in place; the description."""
    paths: list[tuple[object, object]] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                paths.append((node, k))
                walk(v)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                paths.append((node, i))
                walk(v)

    walk(tree)
    parent, key = rng.choice(paths)
    action = rng.choice(("drop", "odd", "odd", "number", "zero-region"))
    if action == "drop" and isinstance(parent, dict):
        del parent[key]
        return f"dropped {key}"
    if action == "number":
        value = rng.choice((-(2**31), 2**63, 2**200, -1, 0, 7))
        parent[key] = value  # type: ignore[index]
        return f"{key} = {value}"
    if action == "zero-region" and isinstance(tree, dict) and tree.get("memory"):
        region = rng.choice(tree["memory"])
        if isinstance(region, dict):
            region["size"] = rng.choice((0, "0K", -4096, "4G", "999999999999M"))
            return f"region {region.get('name')} size {region['size']}"
    value = rng.choice(_ODD_VALUES)
    parent[key] = value  # type: ignore[index]
    return f"{key} = {str(value)[:20]}"


def board_case(rng: random.Random, index: int, boards: dict[str, str]) -> Case:
    import yaml

    base = rng.choice(sorted(boards))
    name = f"fuzz-{index}"
    kind = rng.choice(("schema", "schema", "schema", "syntax", "bomb"))
    if kind == "syntax":
        text = boards[base]
        cut = rng.randrange(len(text))
        text = text[:cut] + rng.choice(("\t", ": [", "{{", "\x00", "- ", "&a *a", "'")) + \
            text[cut:]
        what = f"YAML damaged at {cut}"
        text = text.replace(f"name: {base}", f"name: {name}")
    elif kind == "bomb":
        text = ("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n"
                "c: &c [*b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c]\n"
                "e: &e [*d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e]\n"
                f"name: {name}\nfamily: mps\ndescription: *f\ncpu: *f\nmemory: *f\n")
        what = "an alias bomb"
    else:
        tree = yaml.safe_load(boards[base])
        what = _mutate_tree(rng, tree)
        if isinstance(tree, dict):
            tree["name"] = name
        text = yaml.safe_dump(tree, sort_keys=False)
    pte = "tiny_cnn-portable_fp32-qemu-an547.pte"
    command = rng.choice(("boards", "plan --pte"))
    argv = (["boards", "--boards-dir", "boards"] if command == "boards" else
            ["plan", "--no-project", "--boards-dir", "boards", "--board", name, "--pte",
             str(ROOT / "tests" / "data" / pte), "--out", "out"])
    return Case(f"{index} board {base}: {what}; {command}", "cli", argv,
                {f"boards/{name}.yaml": text.encode("utf-8", "surrogatepass")})


# ---- input folders -----------------------------------------------------------------------------

def _npy(array: object) -> bytes:
    import numpy as np

    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def input_case(rng: random.Random, index: int) -> Case:
    import numpy as np

    program = rng.choice(BASE_PROGRAMS)
    shape = (1, 3, 8, 8) if program.startswith("tiny_cnn") else (1, 784)
    good = np.random.default_rng(index).standard_normal(shape).astype(np.float32)
    files: dict[str, bytes] = {"a.npy": _npy(good)}
    kind = rng.choice(("huge-header", "truncated", "bitflip", "npz", "pt", "dtype", "shape",
                       "labels", "labels", "pickle", "empty"))
    if kind == "huge-header":
        header = {"descr": "<f4", "fortran_order": False,
                  "shape": rng.choice(((1 << 40,), (1 << 20, 1 << 20), (2**31 - 1, 3, 8, 8)))}
        text = repr(header).encode()
        text += b" " * (63 - (len(text) + 10) % 64) + b"\n"
        files["b.npy"] = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + \
            b"\x00" * 64
        what = f"an .npy header of shape {header['shape']}"
    elif kind == "truncated":
        data = _npy(good)
        cut = rng.randrange(len(data))
        files["b.npy"] = data[:cut]
        what = f".npy cut at {cut}"
    elif kind == "bitflip":
        data = bytearray(_npy(good))
        for _ in range(rng.randrange(1, 5)):
            data[rng.randrange(128)] ^= 1 << rng.randrange(8)  # the header
        files["b.npy"] = bytes(data)
        what = ".npy header bits flipped"
    elif kind == "npz":
        out = io.BytesIO()
        np.savez(out, input_0=good)
        data = bytearray(out.getvalue())
        i = rng.randrange(len(data))
        data[i] ^= 0xFF
        files["b.npz"] = bytes(data) if rng.random() < 0.5 else bytes(data[:i])
        what = f".npz damaged at {i}"
    elif kind == "pt":
        import torch

        out = io.BytesIO()
        torch.save(torch.from_numpy(good), out)
        data = bytearray(out.getvalue())
        i = rng.randrange(len(data))
        data[i] ^= 0xFF
        files["b.pt"] = bytes(data) if rng.random() < 0.5 else bytes(data[:i])
        what = f".pt damaged at {i}"
    elif kind == "dtype":
        files["b.npy"] = _npy(good.astype(rng.choice((np.float64, np.int8, np.complex64,
                                                      np.bool_))))
        what = "another dtype"
    elif kind == "shape":
        files["b.npy"] = _npy(np.zeros(rng.choice(((1,), (0,), (2, *shape[1:]), ())),
                                       np.float32))
        what = "another shape"
    elif kind == "labels":
        labels = rng.choice(('{"a": {}}', '{"a": [1]}', '{"a": null}', '{"a": 1e400}',
                             '{"a": "7x"}', '[1, 2]', '"a"', '{"a": 1', "\xff\xfe",
                             '{"a": 99999999999999999999999}', '{"a": true}', "[" * 100000))
        files["labels.json"] = labels.encode("utf-8", "surrogateescape")
        what = f"labels.json {labels[:20]!r}"
    elif kind == "pickle":
        files["b.npy"] = _npy(np.array([{"x": 1}], dtype=object))
        what = "an object .npy (a pickle)"
    else:
        files = {"labels.json": b"{}"}
        what = "no samples"
    return Case(f"{index} inputs ({program}): {what}", "input_sets", files=files,
                program=program)


def make_cases(count: int, seed: int,
               more_programs: dict[str, tuple[bytes, str]] | None = None) -> list[Case]:
    """`count` cases from `seed`: three fifths programs, a fifth board files, a fifth input
    folders, interleaved. The programs damaged are BASE_PROGRAMS and `more_programs` (name ->
    the .pte's bytes and the board it was exported for)."""
    rng = random.Random(seed)
    programs = {name: ((ROOT / "tests" / "data" / name).read_bytes(),
                       "qemu-an505" if "an505" in name else "qemu-an547")
                for name in BASE_PROGRAMS}
    programs.update(more_programs or {})
    boards = {name: (ROOT / "boards" / f"{name}.yaml").read_text() for name in BOARDS}
    cases = []
    for i in range(count):
        slot = i % 5
        if slot < 3:
            cases.append(program_case(rng, i, programs))
        elif slot == 3:
            cases.append(board_case(rng, i, boards))
        else:
            cases.append(input_case(rng, i))
    return cases


# ---- the worker --------------------------------------------------------------------------------

def _limit_address_space() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_AS, LIMIT_AS))


class Worker:
    """A worker process (module docstring) that runs cases in `workdir`, restarted after a
    hang or a death."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None
        self.results: int | None = None

    def _start(self) -> None:
        read_fd, write_fd = os.pipe()
        empty_workspace = self.workdir / "no-workspace"
        empty_workspace.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tools"), str(ROOT)]),
               "DEPLOYKIT_WORKSPACE": str(empty_workspace), "OMP_NUM_THREADS": "1"}
        log = open(self.workdir / "worker.log", "ab")  # noqa: SIM115 (the worker keeps it)
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", str(write_fd)],
            stdin=subprocess.PIPE, stdout=log, stderr=log, env=env, cwd=self.workdir,
            pass_fds=(write_fd,), preexec_fn=_limit_address_space, start_new_session=True)
        log.close()
        os.close(write_fd)
        self.results = read_fd
        self._buffer = b""

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.proc = None
        if self.results is not None:
            os.close(self.results)
            self.results = None

    def run(self, case: Case) -> Outcome:
        if self.proc is None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        case_dir = Path(tempfile.mkdtemp(prefix="case-", dir=self.workdir))
        for name, data in case.files.items():
            (case_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (case_dir / name).write_bytes(data)
        request = {"dir": str(case_dir), "kind": case.kind, "argv": case.argv,
                   "program": case.program}
        start = time.monotonic()
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            return self._died(case, start)
        line = self._read_line(start + CASE_TIMEOUT)
        seconds = time.monotonic() - start
        if line == "":  # the pipe closed: the worker died
            return self._died(case, start)
        if line is None:
            self.stop()
            return Outcome(case.ident, "hang", None, f"no answer in {CASE_TIMEOUT:g} s",
                           seconds)
        answer = json.loads(line)
        return Outcome(case.ident, answer["verdict"], answer["exit_code"], answer["detail"],
                       seconds)

    def _read_line(self, deadline: float) -> str | None:
        """The worker's next answer; "" when it died, None when the deadline passed."""
        assert self.results is not None
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.results], [], [], left)
            if not ready:
                return None
            chunk = os.read(self.results, 65536)
            if not chunk:
                return ""
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def _died(self, case: Case, start: float) -> Outcome:
        assert self.proc is not None
        code = self.proc.wait()
        self.proc = None
        if self.results is not None:
            os.close(self.results)
            self.results = None
        how = f"signal {-code}" if code < 0 else f"exit {code}"
        return Outcome(case.ident, "crash", None, f"the worker died ({how})",
                       time.monotonic() - start)


def run_cases(cases: list[Case], workdir: Path,
              progress: object = None) -> list[Outcome]:
    worker = Worker(workdir)
    outcomes = []
    try:
        for i, case in enumerate(cases):
            outcome = worker.run(case)
            outcomes.append(outcome)
            if progress is not None and (i + 1) % 100 == 0:
                progress(f"{i + 1}/{len(cases)} cases: {dict(summary(outcomes))}")
    finally:
        worker.stop()
    return outcomes


def summary(outcomes: list[Outcome]) -> Counter:
    return Counter(o.verdict for o in outcomes)


# ---- inside the worker -------------------------------------------------------------------------

def _example_inputs(program: str) -> tuple:
    import torch

    from deploykit.program.imported import deterministic_inputs
    from deploykit.program.inspect import inspect_pte

    info = inspect_pte(ROOT / "tests" / "data" / program)
    return tuple(torch.from_numpy(a) for a in deterministic_inputs(info))


def _run_one(request: dict) -> dict:
    from deploykit.cli import main
    from deploykit.program.input_sets import load_input_sets
    from deploykit.util.errors import DeployKitError

    os.chdir(request["dir"])
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            if request["kind"] == "cli":
                code = main(request["argv"])
            else:
                load_input_sets(Path("."), _example_inputs(request["program"]))
                code = 0
    except DeployKitError as exc:  # raised past the CLI only by the input-set loader
        return {"verdict": "error", "exit_code": int(exc.exit_code), "detail": exc.cause[:300]}
    except SystemExit as exc:  # argparse
        code = exc.code if isinstance(exc.code, int) else 2
        return {"verdict": "error" if code == 2 else "traceback", "exit_code": code,
                "detail": captured.getvalue()[-300:]}
    except MemoryError:
        return {"verdict": "memory", "exit_code": None, "detail": "MemoryError"}
    except BaseException as exc:  # noqa: BLE001 (what escapes is the finding)
        return {"verdict": "traceback", "exit_code": None,
                "detail": "".join(traceback.format_exception(exc))[-1500:]}
    text = captured.getvalue()
    if code == 0:
        return {"verdict": "ok", "exit_code": 0, "detail": ""}
    classified = "deploykit: error:" in text and "Traceback" not in text
    return {"verdict": "error" if classified else "traceback", "exit_code": code,
            "detail": text[-300:]}


def worker_main(results_fd: int) -> None:
    # What native code prints goes to the worker's log; the answers go through their own pipe.
    results = os.fdopen(results_fd, "w", buffering=1)
    import deploykit.cli  # noqa: F401 (imported once, before the first case)
    import deploykit.program.input_sets  # noqa: F401

    for line in sys.stdin:
        answer = _run_one(json.loads(line))
        results.write(json.dumps(answer) + "\n")


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", type=int, metavar="FD", help=argparse.SUPPRESS)
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--seed", type=int, default=31)
    args = parser.parse_args()
    if args.worker is not None:
        worker_main(args.worker)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        outcomes = run_cases(make_cases(args.cases, args.seed), Path(tmp),
                             lambda m: print(m, file=sys.stderr))
    for o in outcomes:
        if not o.passed:
            print(json.dumps(asdict(o)))
    print(dict(summary(outcomes)), file=sys.stderr)
    return 0 if all(o.passed for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
