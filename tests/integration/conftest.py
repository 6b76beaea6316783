"""Exports several integration test files share, made once per test session; the SIGINT
disposition the deploykit processes the tests start inherit."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def pytest_configure(config: pytest.Config) -> None:
    # A test run started in the background by a non-interactive shell (`pytest ... &` in a
    # script) inherits SIGINT ignored, and so would every deploykit process the tests start:
    # Python installs no KeyboardInterrupt handler then, and the tests that interrupt deploykit
    # as Ctrl-C does (test_interrupt, test_concurrency, test_farm) would see it carry on, and
    # end it with SIGKILL, which leaves its QEMU running. A handler set here is reset to the
    # default in the processes this one starts; an ignored signal would stay ignored.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def mobilenet_v2_lrn_ethos_u(tmp_path_factory):
    """mobilenet_v2_lrn through the ethos_u_int8 flow for corstone-320 (Ethos-U85-256): the
    split case, two NPU delegates with the LRN remnant on the CPU between them. About a minute
    on two cores, so exported once (test_ethos_u_export.py, test_explore.py)."""
    from deploykit.program.export import export
    from deploykit.program.models import load_model
    from deploykit.readers.boards import load_board

    board = load_board("corstone-320")
    return export(
        load_model("mobilenet_v2_lrn", REPO),
        "ethos_u_int8",
        tmp_path_factory.mktemp("mobilenet_v2_lrn-corstone-320"),
        cpu=board.cpu["core"],
        settings=board.npu.export_settings(),
    )
