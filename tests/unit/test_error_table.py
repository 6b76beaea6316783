"""The error table (tools/deploykit/readers/protocol/errors.yaml): the generated C header, Python
table and docs table agree with it; the host names every code and takes the failure class, the
advice and the pool from the table, never from the message text; the selftest's deliberate
error has its own code."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from deploykit.build import error_table
from deploykit.readers.protocol import decode
from deploykit.readers.protocol.error_codes import BY_NAME, CODES, label
from deploykit.readers.protocol.outcome import pool_too_small
from deploykit.util.errors import ExitCode
from tests.protocol_encoder import StreamEncoder

ROOT = Path(__file__).resolve().parents[2]
HELLO = {"protocol": "1", "board": "qemu-an547", "firmware": "executorch-runner"}


def test_generated_files_match_the_data_file():
    assert error_table.main(["--check", "--root", str(ROOT)]) == 0


def test_check_names_a_stale_file(tmp_path, capsys):
    for rel in (error_table.C_HEADER, error_table.PY_TABLE, error_table.DOC):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    header = tmp_path / error_table.C_HEADER
    header.write_text(header.read_text().replace("0x1002u", "0x1012u"))
    assert error_table.main(["--check", "--root", str(tmp_path)]) == 1
    assert "firmware/protocol/dk_errors.h" in capsys.readouterr().err


def test_c_header_defines_every_deploykit_code(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no host C compiler (cc or gcc) on PATH")
    main = tmp_path / "main.c"
    main.write_text(
        '#include <stdio.h>\n#include "dk_errors.h"\nint main(void) {\n'
        + "".join(
            f'  printf("{e.name} %u\\n", (unsigned)DK_ERR_{e.name});\n'
            for e in CODES.values()
            if e.source == "deploykit"
        )
        + "  return 0;\n}\n"
    )
    exe = tmp_path / "codes"
    subprocess.run(
        [
            cc,
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            f"-I{ROOT / 'firmware' / 'protocol'}",
            str(main),
            "-o",
            str(exe),
        ],
        check=True,
    )
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    got = {name: int(v) for name, v in (line.split() for line in out.splitlines())}
    assert got == {e.name: e.code for e in CODES.values() if e.source == "deploykit"}


def test_executorch_codes_are_those_of_the_pinned_error_h():
    # The values of runtime/core/error.h of ExecuTorch v1.4.1, as the installed wheel's
    # headers hold them (the wheel ships the runtime headers).
    import executorch

    header = (
        Path(next(iter(executorch.__path__)))
        / "include"
        / "executorch"
        / "runtime"
        / "core"
        / "error.h"
    )
    text = header.read_text()
    enum = text[text.index("enum class Error") :]
    enum = enum[: enum.index("};")]
    values = {
        name: int(v, 16) for name, v in re.findall(r"^\s*(\w+)\s*=\s*(0x[0-9a-fA-F]+)", enum, re.M)
    }
    ours = {e.name: e.code for e in CODES.values() if e.source == "executorch"}
    assert ours == values


def test_executorch_error_is_named_on_the_host():
    enc = StreamEncoder()
    run = decode(enc.hello(**HELLO) + enc.error(0x21, "load_method failed") + enc.done(1))
    outcome = run.outcome()
    assert "MemoryAllocationFailed (0x21): load_method failed" in outcome.cause
    assert outcome.exit_code == ExitCode.MEMORY
    assert "--fit" in outcome.hint


def test_unknown_code_is_named_as_such():
    assert label(0x4242) == "unknown code 0x4242"
    enc = StreamEncoder()
    outcome = decode(enc.hello(**HELLO) + enc.error(0x4242, "?") + enc.done(1)).outcome()
    assert outcome.exit_code == ExitCode.DEVICE_ERROR and "unknown code 0x4242" in outcome.cause


def test_the_pool_comes_from_the_code_not_the_message():
    enc = StreamEncoder()
    # A message that starts with another pool's name: the code decides.
    run = decode(
        enc.hello(**HELLO)
        + enc.error(BY_NAME["TEMP_POOL"].code, "method_pool said hello")
        + enc.done(3)
    )
    assert pool_too_small(run) == "temp_pool"
    assert run.outcome().exit_code == ExitCode.MEMORY


def test_planned_buffer_count_mismatch_is_not_a_pool_too_small():
    enc = StreamEncoder()
    run = decode(
        enc.hello(**HELLO)
        + enc.error(
            BY_NAME["PLANNED_COUNT"].code, "model_config.h plans 2 buffers, the program has 1"
        )
        + enc.done(1)
    )
    outcome = run.outcome()
    assert pool_too_small(run) is None
    assert outcome.exit_code == ExitCode.BUILD
    assert "--fit does not help" in outcome.hint and "deploykit build" in outcome.hint


def test_selftest_error_does_not_share_the_abort_code():
    assert BY_NAME["SELFTEST"].code != BY_NAME["ABORT"].code
    source = (ROOT / "firmware" / "selftest" / "selftest.c").read_text()
    assert "dk_send_error(DK_ERR_SELFTEST," in source
    assert not re.search(r"dk_send_error\(\s*0x", source)


def test_send_return_values_are_checked_in_the_firmware():
    # A call whose result is dropped is a statement of its own (or cast to void).
    for rel in ("firmware/runner/runner.cpp", "firmware/selftest/selftest.c"):
        text = (ROOT / rel).read_text()
        assert re.search(r"dk_send_(?:tensor|memory)\(", text), rel
        dropped = re.findall(r"^\s*(?:\(void\)\s*)?dk_send_(?:tensor|memory)\(", text, re.M)
        assert not dropped, (rel, dropped)


def test_bad_data_file_is_refused(tmp_path):
    bad = tmp_path / "errors.yaml"
    bad.write_text(
        "executorch:\n  - {code: 0x21, name: A, meaning: m}\n"
        "deploykit:\n  - {code: 0x1002, name: B, meaning: m, status: 3}\n"
    )
    with pytest.raises(ValueError, match="pool"):
        error_table.load_entries(bad)
    bad.write_text(
        "executorch:\n  - {code: 0x21, name: A, meaning: m}\n"
        "deploykit:\n  - {code: 0x1002, name: B, meaning: m, class: NOPE}\n"
    )
    with pytest.raises(ValueError, match="NOPE"):
        error_table.load_entries(bad)
