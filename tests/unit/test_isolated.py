"""util/isolated.py: code run on untrusted data in a forked child. Its result or its
DeployKitError comes back; a child that dies, raises something else or outlives its time is a
ConfigError saying so, and the parent lives on."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from deploykit.util.errors import ConfigError, MemoryPlanError
from deploykit.util.isolated import run_isolated


def test_the_result_comes_back():
    arrays = run_isolated(lambda: [np.arange(1 << 20, dtype=np.int32)], 10, "a copy", "")
    assert arrays[0].sum() == sum(range(1 << 20))


def test_a_deploykit_error_comes_back_with_its_cause_and_hint():
    def refuse():
        raise MemoryPlanError("the plan does not fit", "shrink it")

    with pytest.raises(ConfigError) as exc:
        run_isolated(refuse, 10, "a plan", "")
    assert (exc.value.cause, exc.value.hint) == ("the plan does not fit", "shrink it")


@pytest.mark.parametrize("how, said", [
    (lambda: os.kill(os.getpid(), signal.SIGSEGV), "crashed (SIGSEGV)"),
    (lambda: os.abort(), "crashed (SIGABRT)"),
    (lambda: 1 / 0, "failed: ZeroDivisionError: division by zero"),
    (lambda: os._exit(3), "ended without an answer (exit status 3)"),
])
def test_a_child_that_dies_is_an_error_naming_how(how, said):
    with pytest.raises(ConfigError) as exc:
        run_isolated(how, 10, "The reference", "export it again")
    assert exc.value.cause == f"The reference {said}."
    assert exc.value.hint == "export it again"


def test_a_child_that_hangs_is_stopped_at_its_time():
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"The reference did not finish in 1 s\."):
        run_isolated(signal.pause, 1.0, "The reference", "")  # waits forever
    assert time.monotonic() - started < 5


def test_torch_runs_in_the_child_after_the_parent_used_its_threads():
    """torch's OpenMP pool does not survive a fork; the child runs torch single-threaded."""
    import torch

    x = torch.rand(512, 512)
    expected = (x @ x).sum().item()  # the parent's parallel matmul
    assert run_isolated(lambda: (x @ x).sum().item(), 10, "a matmul", "") == \
        pytest.approx(expected, rel=1e-5)
