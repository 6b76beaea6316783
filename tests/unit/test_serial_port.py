"""The serial link over a real pty, with the firmware's own link code on the other end.

The device side is not a mock: firmware/boards/rp2350/dk_link.c and firmware/protocol/
dk_protocol.c (the code the Pico 2 runs) are compiled for the host with a small main() that
plays the runner (hello, tensor, timing, memory, done) on the master side of a pty, with the
slave side raw like a USB CDC port. The host side is deploykit's SerialLink reading the slave
through real pyserial. Scenarios: the host opens late (after the run), early (before it),
during it; stale bytes of an earlier session; a lost response (device repeat, host re-request);
a transcript overflow; a fault reboot (the port goes away and comes back with the saved
report); and the link serviced from a timer interrupt (a POSIX interval timer's signal stands
in for the RP2350's alarm interrupt, preempting the "firmware" wherever it is): a hung program
still answers, the interrupt never enters the link while the program is writing, and a
watchdog reboot serves the records before the hang with a WATCHDOG error. Port discovery is
tested against pyserial's ListPortInfo.
"""

from __future__ import annotations

import dataclasses
import os
import pty
import shutil
import subprocess
import threading
import tty
from pathlib import Path

import numpy as np
import pytest
import serial
from serial.tools.list_ports_common import ListPortInfo

from deploykit.readers.boards import load_board, repo_root
from deploykit.readers.protocol import DoneStatus
from deploykit.readers.protocol.budget import transcript_bytes
from deploykit.readers.protocol.error_codes import BY_NAME
from deploykit.run.runners import RUNNERS, runner_for_board
from deploykit.run.runners.serial_port import (
    ACK,
    REQUEST,
    SYNC,
    PicoRunner,
    SerialLink,
    read_board,
)
from deploykit.run.transport import cdc_ports, locate_port
from deploykit.util.errors import ConfigError, ExitCode, RunError
from tests.lines import Lines

CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="no host C compiler (apt-get install gcc)")

# The firmware's side, compiled for the host. argv: the pty master fd, then key=value options.
STANDIN_C = r"""
#define _DEFAULT_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dk_board.h"
#include "dk_errors.h"
#include "dk_link.h"
#include "dk_protocol.h"

static int fd;
static long written, drop_from = -1, drop_to = -1;

static int stale_pending;
static void raw_write(const unsigned char *p, size_t len);
static size_t port_read(void *buf, size_t len) {
  ssize_t n = read(fd, buf, len);
  if (n > 0 && stale_pending) { /* an earlier session's bytes, still in the TX FIFO */
    static const unsigned char old[] = "boot banner\r\n\x16" "DKS" "oldn\xa5" "DK\x01\x01\x00";
    raw_write(old, sizeof old - 1);
    stale_pending = 0;
  }
  return n > 0 ? (size_t)n : 0u;
}
static void raw_write(const unsigned char *p, size_t len) {
  while (len) {
    ssize_t n = write(fd, p, len);
    if (n < 0) {
      if (errno != EAGAIN && errno != EINTR) return;
      struct pollfd pf = {fd, POLLOUT, 0};
      poll(&pf, 1, 50);
      continue;
    }
    p += n;
    len -= (size_t)n;
  }
}
/* Bytes [drop_from, drop_to) of everything written are lost on the way (drop=A:B). */
static void port_write(const void *buf, size_t len) {
  const unsigned char *p = buf;
  for (size_t i = 0; i < len; ++i, ++written)
    if (written < drop_from || written >= drop_to) raw_write(p + i, 1);
}
static uint64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}
static void idle(void) { usleep(500); }
/* What the "firmware" has got to, on stdout, one line each: the test waits for these events
 * instead of guessing with sleeps how far it got on a loaded machine. */
static void event(const char *what) {
  printf("%s\n", what);
  fflush(stdout);
}
static const dk_link_port_t port = {port_read, port_write, now_us, idle};

void dk_console_write(const void *data, size_t len) { dk_link_write(data, len); }

static long opt(int argc, char **argv, const char *key, long dflt) {
  size_t k = strlen(key);
  for (int i = 2; i < argc; ++i)
    if (!strncmp(argv[i], key, k) && argv[i][k] == '=') return strtol(argv[i] + k + 1, 0, 0);
  return dflt;
}
static const char *sopt(int argc, char **argv, const char *key) {
  size_t k = strlen(key);
  for (int i = 2; i < argc; ++i)
    if (!strncmp(argv[i], key, k) && argv[i][k] == '=') return argv[i] + k + 1;
  return NULL;
}

static unsigned char transcript[DK_LINK_TRANSCRIPT_BYTES];

/* The timer interrupt (tick_us=N): a signal that preempts main() wherever it is, as the
 * RP2350's alarm interrupt preempts the runner, and services the link as board.c's does. */
static void on_tick(int sig) {
  (void)sig;
  dk_link_service();
}
static void start_tick(long us) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_tick;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGALRM, &sa, NULL);
  struct itimerval it = {{0, us}, {0, us}};
  setitimer(ITIMER_REAL, &it, NULL);
}
/* A hang in execute(): spins without touching the link (hang=1 forever; with watchdog_ms, the
 * watchdog "reset" after that long: the transcript as the scratch registers describe it is
 * saved, and the port goes away). */
static void hang(int argc, char **argv) {
  const long watchdog_ms = opt(argc, argv, "watchdog_ms", 0);
  const uint64_t end = now_us() + (uint64_t)watchdog_ms * 1000u;
  event("hanging");
  while (!watchdog_ms || now_us() < end) {
  }
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_REAL, &off, NULL);
  size_t used;
  const uint8_t *t = dk_link_transcript(&used);
  FILE *f = fopen(sopt(argc, argv, "save"), "wb");
  fwrite(t, 1, used, f);
  fclose(f);
  exit(5);
}

/* Polls the link for `ms` (a run would not poll; "busy" sleeps instead). */
static void serve_for(long ms, int busy) {
  uint64_t end = now_us() + (uint64_t)ms * 1000u;
  while (now_us() < end) {
    if (!busy) dk_link_poll();
    usleep(1000);
  }
}

static void finish(int argc, char **argv) {
  long exit_on_ack = opt(argc, argv, "exit_on_ack", 1), max_ms = opt(argc, argv, "max_ms", 20000);
  uint64_t end = now_us() + (uint64_t)max_ms * 1000u;
  dk_link_finish();
  event("finished"); /* the run is over: only the link is served from here */
  while (now_us() < end) {
    dk_link_poll();
    if (exit_on_ack && dk_link_get_stats()->acks) break;
    usleep(500);
  }
  const dk_link_stats_t *s = dk_link_get_stats();
  printf("requests=%u acks=%u repeats=%u overflow=%u serviced=%u deferred=%u\n", s->requests,
         s->acks, s->repeats, s->overflow, s->serviced, s->deferred);
  fflush(stdout);
  exit(s->acks ? 0 : 3);
}

int main(int argc, char **argv) {
  fd = atoi(argv[1]);
  const char *drop = sopt(argc, argv, "drop");
  if (drop) sscanf(drop, "%ld:%ld", &drop_from, &drop_to);
  const char *replay = sopt(argc, argv, "replay");
  if (replay) { /* after a fault (or watchdog) reboot: serve the saved transcript */
    FILE *f = fopen(replay, "rb");
    size_t n = fread(transcript, 1, sizeof transcript, f);
    fclose(f);
    dk_link_init(&port, transcript, sizeof transcript, n);
    if (opt(argc, argv, "watchdog", 0)) { /* what board.c appends after a watchdog reboot */
      dk_send_error(DK_ERR_WATCHDOG, "the watchdog reset the board in execute()");
      dk_send_done(DK_STATUS_ET_ERROR);
    }
    finish(argc, argv);
  }
  dk_link_init(&port, transcript, sizeof transcript, 0);
  const long tick_us = opt(argc, argv, "tick_us", 0);
  if (tick_us) start_tick(tick_us);
  stale_pending = (int)opt(argc, argv, "stale", 0);
  serve_for(opt(argc, argv, "delay_ms", 0), 1);
  long gap = opt(argc, argv, "gap_ms", 0), n_floats = opt(argc, argv, "floats", 10);
  dk_send_hello("protocol=1\nboard=pico2\nfirmware=executorch-runner\npte_sha256=0011223344556677");
  event("hello");
  serve_for(gap, 1);
  float *out = malloc((size_t)n_floats * sizeof *out);
  for (long i = 0; i < n_floats; ++i) out[i] = (float)i * 0.5f - 2.0f;
  const int32_t sizes[2] = {1, (int32_t)n_floats};
  dk_send_tensor(0, DK_DTYPE_FLOAT32, 2, sizes, 0.0f, 0, out, (uint32_t)(n_floats * 4));
  serve_for(gap, 1);
  for (long i = 0, logs = opt(argc, argv, "logs", 0); i < logs; ++i) {
    char text[32];
    snprintf(text, sizeof text, "log %ld", i);
    dk_send_log(text); /* the interrupt may land anywhere in here */
  }
  if (opt(argc, argv, "trace", 0)) { /* profiling firmware: its clock, two operators ended */
    uint8_t clock[20] = {2, 0, 0, 0, 0x40, 0x42, 0x0f, 0}; /* DWT cycles at 1 MHz */
    dk_send_record(DK_REC_TRACE_CLOCK, clock, sizeof clock);
    for (uint8_t i = 0; i < 2u; ++i) {
      uint8_t e[29 + 13];
      memset(e, 0, sizeof e);
      e[4] = i;               /* debug handle: instruction i of chain 0 */
      memset(e + 8, 0xff, 4); /* no delegate */
      e[12] = (uint8_t)(10u * i);
      e[20] = (uint8_t)(10u * i + 5u);
      e[28] = 13u;
      memcpy(e + 29, "OPERATOR_CALL", 13);
      dk_send_record(DK_REC_TRACE_EVENT, e, sizeof e);
    }
  }
  if (opt(argc, argv, "hang", 0)) hang(argc, argv);
  if (opt(argc, argv, "fault", 0)) { /* what board.c's fault handler does, then "reboot" */
    dk_link_enter_fault_mode();
    dk_send_log("fault: UsageFault (exception 6)");
    dk_fault_regs_t r;
    memset(&r, 0, sizeof r);
    r.pc = 0x10000abc;
    r.cfsr = 1u << 16;
    dk_send_fault(&r);
    dk_send_done(DK_STATUS_FAULT);
    size_t used;
    const uint8_t *t = dk_link_transcript(&used);
    FILE *f = fopen(sopt(argc, argv, "save"), "wb");
    fwrite(t, 1, used, f);
    fclose(f);
    return 4; /* the watchdog reboot: the port goes away */
  }
  dk_send_timing(123456, 1000000, 1, DK_INSTRUCTIONS_UNKNOWN);
  const dk_memory_entry_t mem[] = {{"method_pool", 1000, 2048}, {"stack", 700, 8192}};
  dk_send_memory(mem, 2);
  dk_send_done(DK_STATUS_OK);
  finish(argc, argv);
}
"""


@pytest.fixture(scope="module")
def standin(tmp_path_factory) -> dict[str, Path]:
    """The stand-in, built with the transcript the runner would get for its output (10 floats,
    [1, 10]: protocol/budget.py, as DK_RESULT_BYTES), with one sized for 2,000 floats, and with
    a 1 KiB one (overflow)."""
    d = tmp_path_factory.mktemp("standin")
    src = d / "standin.c"
    src.write_text(STANDIN_C)
    fw = repo_root() / "firmware"
    built = {}
    for name, transcript in (("default", transcript_bytes([(40, 2)])),
                             ("sized2000", transcript_bytes([(8000, 2)])), ("small", 1024)):
        exe = d / f"standin-{name}"
        cmd = [CC, "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror",
               f"-DDK_LINK_TRANSCRIPT_BYTES={transcript}", "-DDK_LINK_REPEAT_MS=300",
               f"-I{fw / 'boards' / 'rp2350'}", f"-I{fw / 'boards'}", f"-I{fw / 'protocol'}",
               str(src), str(fw / "boards" / "rp2350" / "dk_link.c"),
               str(fw / "protocol" / "dk_protocol.c"), "-o", str(exe)]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        built[name] = exe
    return built


class Device:
    """A pty whose master side is the stand-in firmware; `path` is the port the host opens."""

    def __init__(self, exe: Path, *args: str) -> None:
        self.master, slave = pty.openpty()
        tty.setraw(slave)  # a CDC port has no line discipline on the device side
        self.path = os.ttyname(slave)
        os.set_blocking(self.master, False)
        self.proc = subprocess.Popen([str(exe), str(self.master), *args],
                                     pass_fds=(self.master,), stdout=subprocess.PIPE)
        os.close(slave)  # only the host opens it from now on, by path
        assert self.proc.stdout is not None
        self.events = Lines(self.proc.stdout)

    def reached(self, event: str, limit_s: float = 60.0) -> None:
        """Wait until the stand-in says it got to `event` (hello, finished, hanging)."""
        self.events.wait_for(f"^{event}$", limit_s)

    def finish(self, timeout: float = 10.0) -> tuple[int, dict[str, int]]:
        self.events.rest(timeout)
        self.proc.wait(timeout=timeout)
        os.close(self.master)
        stats = next((dict(kv.split("=") for kv in line.split())
                      for _, line in self.events.seen if "requests=" in line), {})
        return self.proc.returncode, {k: int(v) for k, v in stats.items()}


def _locate_watched(state: dict) -> tuple:
    """A port finder over `state["path"]`, and an event set when the host asked for the port
    while it was gone (the host has noticed the reboot)."""
    looked = threading.Event()

    def locate():
        path = state["path"]
        if path is None:
            looked.set()
        return path

    return locate, looked


def read(path_or_locate, timeout=10.0, **kw):
    locate = path_or_locate if callable(path_or_locate) else (lambda: path_or_locate)
    return SerialLink(locate, request_interval_s=0.2, **kw).read(timeout)


def assert_full_run(res):
    rec = res.records
    assert rec.outcome().exit_code == ExitCode.OK, rec.outcome()
    assert rec.hello.fields["board"] == "pico2"
    np.testing.assert_array_equal(rec.tensors[0].data.ravel(),
                                  np.arange(10, dtype=np.float32) * 0.5 - 2)
    assert rec.timing.ticks == 123456 and rec.done.status == DoneStatus.OK
    assert res.stats.acked


def test_host_opens_late_after_the_run(standin):
    dev = Device(standin["default"])
    dev.reached("finished")  # the "firmware" ran and finished before anyone opened the port
    res = read(dev.path)
    assert_full_run(res)
    code, stats = dev.finish()
    assert code == 0 and stats["requests"] == 1 and stats["acks"] == 1
    assert res.stats.requests_sent == 1 and res.stats.syncs == 1


def test_host_opens_before_the_device_runs(standin):
    dev = Device(standin["default"], "delay_ms=700")  # busy: requests queue up unanswered
    res = read(dev.path)
    assert_full_run(res)
    code, stats = dev.finish()
    assert code == 0
    # The host repeated its request while the device was busy; the device answered the last
    # one queued, once.
    assert res.stats.requests_sent >= 3 and stats["requests"] == 1


def test_host_opens_during_the_run_and_gets_the_rest_live(standin):
    dev = Device(standin["default"], "gap_ms=400")
    dev.reached("hello")
    res = read(dev.path)
    assert_full_run(res)
    assert dev.finish()[0] == 0


def test_stale_bytes_of_an_earlier_session_are_discarded(standin):
    dev = Device(standin["default"], "stale=1")
    dev.reached("finished")
    res = read(dev.path)
    assert_full_run(res)
    assert res.stats.bytes_discarded >= 20
    assert res.records.stats.noise_bytes == 0 and res.records.stats.corrupted_frames == 0
    dev.finish()


def test_a_response_lost_whole_is_repeated_by_the_device(standin):
    # How long one answer is: SYNC + the whole transcript.
    probe = Device(standin["default"])
    n = read(probe.path).stats.bytes_received
    probe.finish()
    # Now everything after the first SYNC is lost on the way. The host is synced but gets no
    # records, so it does not ACK; after DK_LINK_REPEAT_MS the device sends SYNC + transcript
    # again, and the host's decoder restarts on that SYNC.
    dev = Device(standin["default"], f"drop=8:{n}")
    dev.reached("finished")
    res = read(dev.path)
    assert_full_run(res)
    code, stats = dev.finish()
    assert code == 0 and stats["repeats"] == 1 and stats["requests"] == 1
    assert res.stats.syncs == 2 and res.stats.rerequests == 0


def test_a_damaged_response_is_asked_for_again(standin):
    # The first answer loses bytes in the middle: the host sees done but a damaged stream,
    # so it does not acknowledge; it asks again and gets a clean copy.
    dev = Device(standin["default"], "drop=60:90")
    dev.reached("finished")
    res = read(dev.path)
    assert_full_run(res)
    assert res.stats.rerequests == 1
    code, stats = dev.finish()
    assert code == 0 and stats["requests"] == 2


def test_transcript_overflow_waits_for_the_host_then_streams(standin):
    # 2,000 floats do not fit a 1 KiB transcript: the device waits for a host and sends the
    # rest live. A second host later gets only the stored part: a truncated stream, reported
    # as such, never wrong numbers.
    dev = Device(standin["small"], "floats=2000", "exit_on_ack=0", "max_ms=4000")
    dev.reached("hello")  # then it fills the transcript and waits for a host
    res = read(dev.path)
    rec = res.records
    assert rec.outcome().exit_code == ExitCode.OK
    assert rec.tensors[0].data.size == 2000
    again = read(dev.path, timeout=1.5)
    assert again.records.outcome(timed_out=again.timed_out).exit_code != ExitCode.OK
    assert 0 not in again.records.tensors
    code, stats = dev.finish()
    assert stats["overflow"] > 0


def test_a_transcript_sized_from_the_model_holds_the_whole_run(standin):
    # The runner's transcript is what its run sends plus room for a failure, no more: far
    # below the old fixed 16 KiB, and a late host still gets everything, twice, no overflow.
    assert transcript_bytes([(40, 2)]) < 2048
    assert transcript_bytes([(8000, 2)]) < 8000 + 2048
    dev = Device(standin["sized2000"], "floats=2000", "exit_on_ack=0", "max_ms=4000")
    dev.reached("finished")  # the run is over before the port is opened
    first = read(dev.path)
    assert first.records.outcome().exit_code == ExitCode.OK
    assert first.records.tensors[0].data.size == 2000
    again = read(dev.path)  # a second session gets the whole run again from the transcript
    assert again.records.outcome().exit_code == ExitCode.OK
    np.testing.assert_array_equal(again.records.tensors[0].data, first.records.tensors[0].data)
    code, stats = dev.finish()
    assert stats["overflow"] == 0 and stats["requests"] == 2


def test_fault_reboot_port_goes_away_and_the_saved_report_is_served(standin, tmp_path):
    saved = tmp_path / "transcript.bin"
    state = {"path": None}
    first = Device(standin["default"], "fault=1", f"save={saved}", "gap_ms=300")
    state["path"] = first.path
    locate, looked_while_gone = _locate_watched(state)
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("res", read(locate, timeout=15.0)))
    t.start()
    assert first.proc.wait(timeout=10) == 4  # faulted: the port is gone (master closed)
    os.close(first.master)
    state["path"] = None
    # The board reboots and enumerates again, maybe under another name: only once the host
    # has looked for the port and found none.
    assert looked_while_gone.wait(30), "the host never looked for the port again"
    second = Device(standin["default"], f"replay={saved}")
    state["path"] = second.path
    t.join(timeout=20)
    res = box["res"]
    rec = res.records
    assert rec.outcome().exit_code == ExitCode.FAULT
    assert rec.fault.registers["pc"] == 0x10000ABC and rec.fault.cfsr_flags == ["UNDEFINSTR"]
    assert rec.done.status == DoneStatus.FAULT
    assert rec.hello is not None and 0 in rec.tensors  # what came before the fault, too
    assert res.stats.reopens == 1
    assert second.finish()[0] == 0


@pytest.mark.parametrize(
    ("tick", "expected"), [(True, ExitCode.TIMEOUT), (False, ExitCode.NO_BOOT)]
)
def test_a_hang_answers_from_the_timer_interrupt(standin, tick, expected):
    # The program hangs (in execute(), say) before the host opens the port. Serviced from the
    # timer interrupt, the link still answers and sends what came before: a timeout with the
    # last records. Without the interrupt nothing answers, which reads as a board that never
    # booted.
    args = ["hang=1", *(["tick_us=2000"] if tick else [])]
    dev = Device(standin["default"], *args)
    try:
        dev.reached("hanging")
        res = read(dev.path, timeout=3.0)
    finally:
        dev.proc.kill()
        dev.proc.wait()
        os.close(dev.master)
    outcome = res.records.outcome(timed_out=res.timed_out)
    assert res.timed_out and outcome.exit_code == expected, outcome
    if tick:
        assert res.records.done is None and 0 in res.records.tensors
        assert "hello(board=pico2" in outcome.cause and "1 tensor(s)" in outcome.cause


def test_the_interrupt_never_enters_the_link_while_the_program_writes(standin):
    # A tick every 50 us while the program writes 400 log records to a host already reading:
    # ticks land inside dk_link_write (they must defer) and between writes (they poll). The
    # stream must arrive whole and in order.
    dev = Device(standin["sized2000"], "tick_us=50", "delay_ms=300", "logs=400")
    res = read(dev.path, timeout=15.0)
    code, stats = dev.finish()
    rec = res.records
    assert rec.outcome().exit_code == ExitCode.OK, rec.outcome()
    assert [log.text for log in rec.logs] == [f"log {i}" for i in range(400)]
    assert res.stats.syncs == 1 and not rec.stats.problems(), rec.stats.problems()
    assert rec.stats.noise_bytes == 0 and rec.stats.duplicate_frames == 0
    assert code == 0 and stats["deferred"] > 0 and stats["serviced"] > 0, stats


def test_watchdog_reboot_serves_the_records_before_the_hang(standin, tmp_path):
    # execute() hangs with the watchdog armed: the tick streams what was sent, the watchdog
    # resets the board (the port goes away), and the next boot serves the saved transcript
    # followed by a WATCHDOG error (board.c's path, as the stand-in plays it).
    saved = tmp_path / "transcript.bin"
    state = {"path": None}
    first = Device(standin["default"], "tick_us=2000", "hang=1", "watchdog_ms=1500",
                   f"save={saved}")
    state["path"] = first.path
    locate, looked_while_gone = _locate_watched(state)
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("res", read(locate, timeout=15.0)))
    t.start()
    assert first.proc.wait(timeout=10) == 5  # the watchdog reset: the port is gone
    os.close(first.master)
    state["path"] = None
    assert looked_while_gone.wait(30), "the host never looked for the port again"
    second = Device(standin["default"], f"replay={saved}", "watchdog=1")
    state["path"] = second.path
    t.join(timeout=20)
    res = box["res"]
    rec = res.records
    outcome = rec.outcome()
    assert outcome.exit_code == ExitCode.TIMEOUT, outcome
    (error,) = rec.errors
    assert error.code == BY_NAME["WATCHDOG"].code
    assert "WATCHDOG" in outcome.cause and "execute()" in outcome.cause
    assert rec.hello is not None and 0 in rec.tensors  # the records before the hang
    assert res.stats.reopens == 1
    assert second.finish()[0] == 0


def test_a_profiling_run_that_hangs_is_placed_in_its_program(standin, pico2, tmp_path):
    # Profiling firmware sent its clock and two operator events, then hung: the timer-serviced
    # link delivers them, and the host places the hang in the program the ELF embeds.
    import torch
    from executorch.exir import to_edge

    from deploykit.readers.trace import program_instructions
    from tests.unit.test_hang_location import _elf_with_program

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    exported = torch.export.export(model.eval(), (torch.zeros(1, 4),))
    pte = to_edge(exported).to_executorch().buffer
    elf = _elf_with_program(tmp_path, pte)
    instructions = program_instructions(pte)
    names = [instructions[k].name for k in sorted(instructions)]
    assert sorted(instructions)[:3] == [(0, 0), (0, 1), (0, 2)]
    serial = {**pico2.raw["serial"], "connect_timeout_s": 0.5}
    board = dataclasses.replace(pico2, raw={**pico2.raw, "serial": serial})
    dev = Device(standin["default"], "tick_us=2000", "trace=1", "hang=1")
    try:
        dev.reached("hanging")
        result = read_board(board, tmp_path / "run", timeout_s=3.0, port=dev.path, elf=elf)
    finally:
        dev.proc.kill()
        dev.proc.wait()
        os.close(dev.master)
    outcome = result.outcome()
    assert outcome.exit_code == ExitCode.TIMEOUT, outcome
    assert (
        f"Hung in execute() call 1, after operator 2 of {len(names)} ({names[1]}); "
        f"operator 3 ({names[2]}) did not end" in outcome.cause
    ), outcome.cause


def test_no_port_means_no_boot(tmp_path):
    res = read(lambda: None, timeout=0.5)
    assert res.timed_out and res.stats.port is None


def test_link_frames_are_what_the_firmware_expects():
    assert REQUEST == b"\x16DKR" and ACK == b"\x16DKA" and SYNC == b"\x16DKS"
    h = (repo_root() / "firmware/boards/rp2350/dk_link.h").read_text()
    for letter in "RAS":
        assert f"'{letter}'" in h


# ---- port discovery: pyserial's list_ports data ------------------------------------------------

def port(device, vid=0x2E8A, pid=0x0009, serial_number="E6614104031B2C2A", location="1-1.4:1.0"):
    p = ListPortInfo(device, skip_link_detection=True)
    p.vid, p.pid, p.serial_number, p.location = vid, pid, serial_number, location
    p.manufacturer, p.product = "Raspberry Pi", "Pico"
    return p


@pytest.fixture
def pico2():
    return load_board("pico2")


def test_discovery_by_vid_pid(pico2):
    ports = [port("/dev/ttyS0", vid=None, pid=None, serial_number=None),
             port("/dev/ttyACM0"),
             port("/dev/ttyACM1", pid=0x000A, serial_number="RP2040BOARD"),  # an RP2040 Pico
             port("/dev/ttyUSB0", vid=0x0403, pid=0x6001, serial_number="FTDI")]
    assert [p.device for p in cdc_ports(pico2, ports)] == ["/dev/ttyACM0"]
    assert locate_port(pico2, ports) == "/dev/ttyACM0"
    assert locate_port(pico2, ports[:1]) is None  # not there (yet)


def test_two_boards_need_a_port(pico2):
    ports = [port("/dev/ttyACM0", serial_number="AAAA"), port("/dev/ttyACM1", serial_number="BBBB")]
    with pytest.raises(ConfigError) as exc:
        locate_port(pico2, ports)
    text = str(exc.value)
    assert "/dev/ttyACM0" in text and "/dev/ttyACM1" in text and "--port" in text
    assert locate_port(pico2, ports, port="/dev/ttyACM1") == "/dev/ttyACM1"
    # After flashing board BBBB, its port is found by serial number, even among several.
    assert locate_port(pico2, ports, serial_number="BBBB") == "/dev/ttyACM1"
    assert locate_port(pico2, ports, serial_number="CCCC") is None  # still enumerating


def test_a_port_whose_serial_number_does_not_match_is_refused(pico2):
    ports = [port("/dev/ttyACM0", serial_number="AAAA"), port("/dev/ttyACM1", serial_number="BBBB")]
    with pytest.raises(ConfigError) as exc:
        locate_port(pico2, ports, port="/dev/ttyACM0", serial_number="BBBB")
    text = str(exc.value)
    assert "AAAA" in text and "BBBB" in text and "/dev/ttyACM1" in text and "--port" in text


def test_urls_and_plain_paths_are_taken_as_given(pico2, tmp_path):
    assert locate_port(pico2, [], port="socket://127.0.0.1:5000") == "socket://127.0.0.1:5000"
    assert locate_port(pico2, [], port=str(tmp_path)) == str(tmp_path)
    assert locate_port(pico2, [], port=str(tmp_path / "ttyACM9")) is None


# ---- the runner and `monitor` ------------------------------------------------------------------

def test_pico_runner_is_registered_with_its_capabilities(pico2):
    assert RUNNERS["pico"] is PicoRunner
    r = runner_for_board(pico2, port="/dev/null")
    assert isinstance(r, PicoRunner) and r.board is pico2
    caps = PicoRunner.capabilities()
    assert caps == {"supports_exit_code": False, "supports_icount": False,
                    "is_simulator": False, "supports_stream": True}


def test_read_board_over_a_pty_found_by_list_ports(standin, pico2, tmp_path):
    dev = Device(standin["default"])
    dev.reached("finished")

    class Env:  # list_ports says the board's CDC port is the pty
        @staticmethod
        def ports():
            return [port(dev.path, serial_number="E661")]

    result = read_board(pico2, tmp_path / "run", timeout_s=10, serial_number="E661", env=Env())
    assert result.outcome().ok and result.records.tensors[0].data.size == 10
    assert (tmp_path / "run" / "console.bin").read_bytes().startswith(SYNC)
    assert "acked True" in (tmp_path / "run" / "link.log").read_text()
    dev.finish()


def test_read_board_without_a_port_is_no_boot(pico2, tmp_path):
    class Env:
        @staticmethod
        def ports():
            return []

    board = load_board("pico2")
    board.raw["serial"] = {**board.raw["serial"], "connect_timeout_s": 0.3}
    with pytest.raises(RunError) as exc:
        read_board(board, tmp_path / "run", timeout_s=0.2, env=Env())
    assert exc.value.exit_code == ExitCode.NO_BOOT


def test_real_pyserial_reads_the_pty(standin):
    dev = Device(standin["default"])
    with serial.Serial(dev.path, timeout=1) as s:  # plain pyserial, no deploykit
        s.write(REQUEST + b"abcd")
        head = s.read(8)
        assert head == SYNC + b"abcd"
        body = s.read(4)
        assert body == b"\xa5DK\x01"  # the first frame: hello
        s.write(ACK + b"abcd")
    assert dev.finish()[0] == 0
