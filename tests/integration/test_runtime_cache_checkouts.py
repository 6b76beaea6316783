"""Two checkouts of deploykit sharing one workspace share its cached ExecuTorch runtimes
(docs/runtime-build.md): the runtime key is by content (key.cmake), and a runtime directory is
configured from copies of the runtime project and the toolchain file kept in it, so its build
files name no checkout. The other checkout is real: a copy of this one's tracked package and
data files (tests/other_checkout.py) at another path, run as its own process."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.markers import requires_cmake, requires_qemu, requires_sources, requires_toolchain

pytestmark = [requires_toolchain, requires_cmake, requires_qemu, requires_sources]

RUNTIME_LINE = re.compile(r"-- ExecuTorch runtime: (\S+) \((new|cached)\)")


def _configured_source(build_dir: Path) -> Path:
    """CMake's own record of the source tree a build directory was configured from."""
    cache = (build_dir / "CMakeCache.txt").read_text()
    return Path(cache.split("CMAKE_HOME_DIRECTORY:INTERNAL=")[1].splitlines()[0])


@pytest.mark.timeout(600)
def test_a_second_checkout_reuses_the_runtime_the_first_built(tmp_path):
    """This checkout runs tiny_cnn on qemu-an505 (building the runtime if its key is new), then
    a copy of it at another path does the same into another output directory: its firmware
    build names the same runtime directory, reports it cached, and passes."""
    from deploykit.util.paths import data_root
    from tests.other_checkout import copy_checkout, run_python

    this = data_root()
    other = copy_checkout(tmp_path / "other-checkout")
    found: dict[str, tuple[str, str]] = {}
    for name, checkout in (("this", this), ("other", other)):
        out = tmp_path / f"out-{name}"
        done = run_python(checkout, ["-m", "deploykit", "run", "--board", "qemu-an505",
                                     "--model", "tiny_cnn", "--out", str(out)],
                          cwd=tmp_path, timeout=280)
        output = done.stdout + done.stderr
        assert done.returncode == 0, output
        assert "tiny_cnn (portable_fp32) on qemu-an505: PASS" in output, output
        assert _configured_source(out / "firmware") == checkout / "firmware"
        m = RUNTIME_LINE.search((out / "firmware" / "build.log").read_text())
        assert m, f"no runtime line in {out / 'firmware' / 'build.log'}"
        found[name] = (m.group(1), m.group(2))
    runtime = Path(found["this"][0])
    assert found["other"] == (str(runtime), "cached"), found
    # The runtime directory's build files name the cache and the workspace, neither checkout.
    assert _configured_source(runtime) == runtime / "project"
    for name in ("CMakeCache.txt", "build.ninja", "dk-runtime-key.txt",
                 "dk-runtime-targets.cmake", "dk-runtime-options.cmake"):
        text = (runtime / name).read_text()
        for checkout in (this, other):
            assert str(checkout) not in text, f"{runtime / name} names {checkout}"
