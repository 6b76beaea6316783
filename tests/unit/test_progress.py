"""Progress on stderr: plain lines when piped, a live line on a terminal, none with --quiet."""

from __future__ import annotations

import io
import re

from deploykit.util.progress import ProgressDisplay


def test_quiet_prints_nothing():
    out = io.StringIO()
    p = ProgressDisplay(quiet=True, stream=out)
    p("exporting")
    p.step("torch.export")
    p.close()
    assert out.getvalue() == ""


def test_piped_output_is_one_plain_line_per_message(monkeypatch):
    out = io.StringIO()  # not a terminal
    p = ProgressDisplay(stream=out)
    assert not p.live
    p("exporting tiny_cnn")
    p.step("torch.export")  # steps show on the live line only
    p("building firmware: 1/11")
    p.close()
    assert out.getvalue() == "· exporting tiny_cnn\n· building firmware: 1/11\n"


def test_ci_is_never_live(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setenv("CI", "true")
    assert not ProgressDisplay(stream=Tty()).live
    monkeypatch.delenv("CI")
    monkeypatch.setenv("TERM", "xterm")
    assert ProgressDisplay(stream=Tty()).live
    assert not ProgressDisplay(stream=Tty(), quiet=True).live


def test_live_line_keeps_each_finished_step_once():
    out = io.StringIO()
    p = ProgressDisplay(stream=out, live=True)
    p("exporting tiny_cnn (log: x)")
    p.step("to_edge_transform_and_lower")
    p("building firmware: 1/11")
    p("building firmware: 11/11")  # the same step: updated in place
    p("running dk_runner.elf on qemu")
    p.close()
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue()).replace("\r", "\n")
    finished = [line.strip() for line in text.splitlines() if line.strip().startswith("· ")]
    assert finished == ["· exporting tiny_cnn (log: x)", "· building firmware: 11/11",
                        "· running dk_runner.elf on qemu"]
