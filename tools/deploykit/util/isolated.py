"""Running code that may crash, hang or exhaust memory on untrusted data in a child process:
the host reference of a program deploykit did not make (program/imported.py), which the host's
ExecuTorch runtime or its operators' torch implementations execute. A damaged program can make
either loop forever, abort or read out of bounds; in a child, that is an error naming the
program, not a dead or stuck deploykit.

The child is forked from the calling process, so it costs no interpreter start and no import
(torch, the ExecuTorch runtime are loaded already); it runs the function, sends its result
back pickled through a pipe and exits at once (`os._exit`, no cleanup of the parent's state).
torch runs single-threaded in the child: its OpenMP pool does not survive a fork.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import pickle
import select
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from deploykit.util.errors import ConfigError, DeployKitError

T = TypeVar("T")


def run_isolated(fn: Callable[[], T], timeout_s: float, what: str, hint: str) -> T:
    """`fn()` in a forked child; its result, or the DeployKitError it raised. A child that
    dies (a signal, another exception) or outlives `timeout_s` is a ConfigError saying what
    (`what`: "the host reference of model.pte") did, with `hint`."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read_fd)
        code = 0
        try:
            try:
                faulthandler.disable()  # a crash here is the parent's to report, by its signal
                _single_threaded_torch()
                answer: tuple[str, Any] = ("ok", fn())
            except DeployKitError as exc:
                answer = ("deploykit", (type(exc).__name__, exc.cause, exc.hint))
            except BaseException as exc:  # noqa: BLE001 (sent to the parent, which says it)
                answer = ("exception", f"{type(exc).__name__}: {exc}")
            with os.fdopen(write_fd, "wb") as pipe:
                pickle.dump(answer, pipe, protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException:  # noqa: BLE001 (the pipe itself failed: the parent sees a death)
            code = 70
        os._exit(code)
    os.close(write_fd)
    try:
        data, finished = _read_until(read_fd, time.monotonic() + timeout_s)
    finally:
        os.close(read_fd)
    if not finished:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise ConfigError(f"{what} did not finish in {timeout_s:.0f} s.", hint)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        raise ConfigError(f"{what} crashed ({signal.Signals(number).name}).", hint)
    try:
        kind, value = pickle.loads(data)
    except Exception as exc:  # nothing, or part of an answer: the child died writing it
        raise ConfigError(f"{what} ended without an answer (exit status "
                          f"{os.waitstatus_to_exitcode(status)}).", hint) from exc
    if kind == "ok":
        return value
    if kind == "deploykit":
        _name, cause, child_hint = value
        raise ConfigError(cause, child_hint)
    raise ConfigError(f"{what} failed: {value}.", hint)


def _single_threaded_torch() -> None:
    """torch's OpenMP thread pool does not survive a fork: a child whose parent ran parallel
    torch operators hangs in its first one. With one thread, torch runs them in the caller."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def _read_until(fd: int, deadline: float) -> tuple[bytes, bool]:
    """Everything written to `fd` until it closes (True), or what came before `deadline`."""
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return b"".join(chunks), False
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return b"".join(chunks), False
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)
