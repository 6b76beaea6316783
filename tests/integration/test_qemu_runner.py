"""QemuRunner against real QEMU and real ELFs.

Until the selftest firmware lands, the device side is a stand-in compiled here: a few lines of
C that write bytes to the board's CMSDK UART (frames pre-encoded by the reference encoder, or
built on the device with its own CRC) and leave through semihosting SYS_EXIT_EXTENDED. The
board facts (UART base and clock, memory origins, core) come from boards/*.yaml.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from deploykit.readers.protocol import FAULT_REGISTERS, decode
from deploykit.run.runners import QemuRunner, RunResult, icount_instructions, runner_for_board
from deploykit.util.errors import ConfigError, EnvironmentProblem, ExitCode, RunError
from tests.protocol_encoder import StreamEncoder

REPO = Path(__file__).resolve().parents[2]
BOARDS = ["qemu-an505", "qemu-an547"]
GCC = shutil.which("arm-none-eabi-gcc")
QEMU = shutil.which("qemu-system-arm")
needs_gcc = pytest.mark.skipif(
    GCC is None, reason="arm-none-eabi-gcc not on PATH (apt-get install gcc-arm-none-eabi)")
needs_qemu = pytest.mark.skipif(
    QEMU is None, reason="qemu-system-arm not on PATH (apt-get install qemu-system-arm)")


def on_device(test):
    """Marks for a test that builds a stand-in ELF and runs it in QEMU."""
    for mark in (pytest.mark.toolchain, pytest.mark.qemu, needs_gcc, needs_qemu):
        test = mark(test)
    return test


HELLO = {"protocol": "1", "firmware": "selftest", "build": "integration stand-in"}


def load_board(name: str) -> dict:
    return yaml.safe_load((REPO / "boards" / f"{name}.yaml").read_text())


def _region_origin(board: dict, item: str) -> int:
    region = board["placement"][item]
    return next(m["origin"] for m in board["memory"] if m["name"] == region)


def _c_array(name: str, data: bytes) -> str:
    body = ",\n".join(",".join(str(b) for b in data[i:i + 32])
                       for i in range(0, len(data), 32)) or "0"
    return f"static const uint8_t {name}[] = {{{body}}};\n#define {name.upper()}_LEN {len(data)}u\n"


C_TEMPLATE = r"""
#include <stdint.h>
#define UART(o) (*(volatile uint32_t *)(UART_BASE + (o)))
#define SYST_CSR (*(volatile uint32_t *)0xE000E010u)
#define SYST_RVR (*(volatile uint32_t *)0xE000E014u)
#define SYST_CVR (*(volatile uint32_t *)0xE000E018u)
extern uint32_t __stack_top;
void reset_handler(void);
static void hang(void) { for (;;) {} }
__attribute__((section(".vectors"), used))
const void *const vectors[16] = {&__stack_top, reset_handler, hang, hang, hang, hang, hang};

static void out(const uint8_t *p, uint32_t n) {
  while (n--) { while (UART(4) & 1u) {} UART(0) = *p++; }
}
static uint32_t crc32(const uint8_t *p, uint32_t n, uint32_t c) {
  c = ~c;
  while (n--) { c ^= *p++; for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & -(c & 1u)); }
  return ~c;
}
static void put32(uint8_t *p, uint32_t v) {
  p[0] = v; p[1] = v >> 8; p[2] = v >> 16; p[3] = v >> 24;
}
static void frame(uint8_t type, uint16_t seq, const uint8_t *payload, uint32_t len) {
  uint8_t h[12] = {0xA5, 'D', 'K', 1, type, 0, (uint8_t)seq, (uint8_t)(seq >> 8)};
  uint8_t t[4];
  put32(h + 8, len);
  put32(t, crc32(payload, len, crc32(h + 3, 9, 0)));
  out(h, 12); out(payload, len); out(t, 4);
}
static void sh_exit(uint32_t status) {
  volatile uint32_t block[2] = {0x20026u, status};  /* ADP_Stopped_ApplicationExit */
  register uint32_t r0 __asm__("r0") = 0x20;        /* SYS_EXIT_EXTENDED */
  register uint32_t r1 __asm__("r1") = (uint32_t)block;
  __asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
  hang();
}
void reset_handler(void) {
  UART(0x10) = UART_CLOCK / UART_BAUD;
  UART(8) = 1u; /* TX enable */
  out(before, BEFORE_LEN);
#if MEASURE_LOOPS
  SYST_RVR = 0xFFFFFFu; SYST_CVR = 0; SYST_CSR = 5u; /* processor clock, enabled */
  while (SYST_CVR == 0) {}
  uint32_t n = MEASURE_LOOPS;
  uint32_t t0 = SYST_CVR;
  __asm__ volatile("1: subs %0, %0, #1\n\tbne 1b" : "+r"(n) : : "cc");
  uint32_t t1 = SYST_CVR;
  uint8_t p[24];
  put32(p, (t0 - t1) & 0xFFFFFFu); put32(p + 4, 0);
  put32(p + 8, TIMER_HZ); put32(p + 12, 1);
  put32(p + 16, 0xFFFFFFFFu); put32(p + 20, 0xFFFFFFFFu);
  frame(3, MEASURE_SEQ, p, sizeof p);
#endif
  out(after, AFTER_LEN);
#if HANG
  hang();
#endif
  sh_exit(EXIT_STATUS);
}
"""

LINK_TEMPLATE = """
MEMORY {{ CODE (rx) : ORIGIN = {code:#x}, LENGTH = 256K
         RAM (rwx) : ORIGIN = {ram:#x}, LENGTH = 64K }}
SECTIONS {{
  .text : {{ KEEP(*(.vectors)) *(.text*) *(.rodata*) }} > CODE
  __stack_top = ORIGIN(RAM) + LENGTH(RAM);
}}
"""


def build_stand_in(tmp_path: Path, board: dict, before: bytes, *, after: bytes = b"",
                   status: int = 0, hang: bool = False, measure_loops: int = 0,
                   measure_seq: int = 0) -> Path:
    """A tiny bare-metal ELF for `board` that prints before [+ timing] + after, then exits."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    src = tmp_path / "standin.c"
    defs = {"UART_BASE": f"{board['console']['base']:#x}u",
            "UART_CLOCK": f"{board['console']['clock_hz']}u",
            "UART_BAUD": f"{board['console']['baud']}u", "TIMER_HZ": f"{board['timer']['hz']}u",
            "EXIT_STATUS": f"{status}u", "HANG": int(hang), "MEASURE_LOOPS": measure_loops,
            "MEASURE_SEQ": measure_seq}
    src.write_text("#include <stdint.h>\n" + "".join(f"#define {k} {v}\n" for k, v in defs.items())
                   + _c_array("before", before) + _c_array("after", after) + C_TEMPLATE)
    ld = tmp_path / "standin.ld"
    ld.write_text(LINK_TEMPLATE.format(code=_region_origin(board, "vectors"),
                                       ram=_region_origin(board, "stack")))
    elf = tmp_path / "standin.elf"
    cmd = [GCC, f"-mcpu={board['cpu']['core']}", "-mthumb", "-mfloat-abi=soft", "-O2",
           "-ffreestanding", "-nostdlib", "-nostartfiles", "-T", str(ld), "-o", str(elf),
           str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return elf


def runner(board: dict, **kwargs) -> QemuRunner:
    r = runner_for_board(board, **kwargs)
    assert isinstance(r, QemuRunner)
    return r


def qemu_processes_running(elf: Path) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if str(elf).encode() in cmdline and b"qemu-system-arm" in cmdline:
                pids.append(int(entry.name))
    return pids


# ---- configuration (no QEMU needed) ---------------------------------------------------------

@pytest.mark.parametrize("name", BOARDS)
def test_command_line_from_board_file(name, tmp_path):
    board = load_board(name)
    r = runner(board)
    assert (r.machine, r.cpu, r.icount_shift) == (board["runner"]["machine"],
                                                  board["runner"]["cpu"], 5)
    cmd = r.command(tmp_path / "x.elf", 4321)
    assert cmd == ["qemu-system-arm", "-machine", board["runner"]["machine"],
                   "-cpu", board["runner"]["cpu"], "-nographic", "-monitor", "none",
                   "-semihosting", "-icount", "shift=5,align=off,sleep=off",
                   "-serial", "tcp:127.0.0.1:4321,server=on,wait=on",
                   "-kernel", str(tmp_path / "x.elf")]
    assert QemuRunner.capabilities() == {"supports_exit_code": True, "supports_icount": True,
                                         "is_simulator": True, "supports_stream": True}


def test_runner_config_errors():
    with pytest.raises(ConfigError, match="not supported"):
        runner_for_board({"name": "b", "runner": {"kind": "jtag"}})
    with pytest.raises(ConfigError, match="no `runner:` section"):
        runner_for_board({"name": "b"})
    with pytest.raises(ConfigError, match="unknown key"):
        QemuRunner({"kind": "qemu", "machine": "mps2-an505", "mashine": "x"})
    with pytest.raises(ConfigError, match="machine"):
        QemuRunner({"kind": "qemu"})
    with pytest.raises(ConfigError, match="icount_shift"):
        QemuRunner({"kind": "qemu", "machine": "m", "icount_shift": 11})
    assert QemuRunner({"kind": "qemu", "machine": "m", "icount_shift": None}).command(
        Path("e"), 1).count("-icount") == 0


def test_icount_conversion():
    # shift 5: 32 ns per instruction; a 32 MHz tick is 31.25 ns.
    assert icount_instructions(1000, 32_000_000, 5) == pytest.approx(976.5625)
    assert icount_instructions(640, 20_000_000, 5) == pytest.approx(1000.0)
    with pytest.raises(ValueError):
        icount_instructions(1, 0, 5)


def test_missing_qemu_names_the_package(tmp_path):
    elf = tmp_path / "x.elf"
    elf.write_bytes(b"")
    r = QemuRunner({"kind": "qemu", "machine": "mps2-an505"}, qemu="qemu-system-arm-absent")
    with pytest.raises(EnvironmentProblem) as err:
        r.run(elf, tmp_path)
    assert "apt-get install qemu-system-arm" in str(err.value)
    assert err.value.exit_code == ExitCode.ENVIRONMENT


def _result(stream: bytes, **kw) -> RunResult:
    kw.setdefault("exit_code", None)
    return RunResult(records=decode(stream), wall_seconds=1.0, console_log=Path("c.bin"),
                     runner_log=Path("q.log"), runner="QEMU", supports_exit_code=True,
                     timeout_s=5.0, **kw)


def test_run_result_classification_without_qemu():
    e = StreamEncoder()
    ok = e.hello(**HELLO) + e.done(0)
    assert _result(ok, exit_code=0).outcome().ok
    assert _result(ok, exit_code=0).check().exit_code == 0
    o = _result(ok, exit_code=3).outcome()
    assert o.exit_code == ExitCode.PROTOCOL and "disagrees" in o.cause
    o = _result(ok, killed=True).outcome()
    assert o.exit_code == ExitCode.PROTOCOL and "did not exit" in o.cause
    e = StreamEncoder()
    faulted = e.hello(**HELLO) + e.fault([0] * 13)
    o = _result(faulted, timed_out=True, killed=True).outcome()
    assert o.exit_code == ExitCode.FAULT and "killed after the 5 s host-side limit" in o.cause
    e = StreamEncoder()
    o = _result(e.hello(**HELLO), exit_code=0).outcome()
    assert o.exit_code == ExitCode.PROTOCOL and "QEMU exited with code 0" in o.cause
    with pytest.raises(RunError) as err:
        _result(b"", timed_out=True, killed=True).check()
    assert err.value.exit_code == ExitCode.NO_BOOT and err.value.log_path == "c.bin"
    assert "q.log" in str(err.value)


@pytest.mark.qemu
@needs_qemu
def test_unknown_machine_reports_qemus_message(tmp_path):
    elf = tmp_path / "x.elf"
    elf.write_bytes(b"\x7fELF")
    r = QemuRunner({"kind": "qemu", "machine": "no-such-machine"})
    with pytest.raises(EnvironmentProblem) as err:
        r.run(elf, tmp_path, timeout_s=10)
    assert "no-such-machine" in str(err.value) and err.value.log_path.endswith("qemu.log")


# ---- real runs ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", BOARDS)
@on_device
def test_success_round_trip(name, tmp_path):
    board = load_board(name)
    enc = StreamEncoder()
    logits = np.linspace(-3, 3, 20_000, dtype=np.float32).reshape(4, 5000)  # 80 KB, 2 chunks
    q = np.arange(-8, 8, dtype=np.int8).reshape(2, 8)
    banner = b"*** stand-in booting ***\r\n"
    stream = (banner + enc.hello(board=name, **HELLO) + b"printf says hi\n"
              + enc.tensor(0, logits) + enc.tensor(1, q, scale=0.25, zero_point=-1)
              + enc.memory({"stack": (1024, 32768)}) + enc.timing(4096, board["timer"]["hz"], 4)
              + enc.done(0))
    elf = build_stand_in(tmp_path, board, stream)
    result = runner(board).run(elf, tmp_path / "out", timeout_s=60)
    assert isinstance(result, RunResult) and result.outcome().ok
    rec = result.records
    assert rec.hello.board == name and rec.done.status == 0 and result.exit_code == 0
    np.testing.assert_array_equal(rec.tensors[0].data, logits)
    np.testing.assert_array_equal(rec.tensors[1].data, q)
    assert rec.tensors[1].scale == 0.25 and rec.tensors[1].zero_point == -1
    assert rec.memory.entries == {"stack": (1024, 32768)}
    assert result.stats.clean and result.stats.noise_bytes == len(banner) + 15
    # Every byte the device sent is in the console log, up to the last one before exit.
    assert result.console_log == tmp_path / "out" / "run" / "console.bin"
    assert result.console_log.read_bytes() == stream
    log = result.runner_log.read_text()
    assert log.startswith("$ ") and "-icount shift=5" in log
    assert not list((tmp_path / "out" / "run").glob(".*.tmp"))
    assert result.icount_shift == 5 and not result.killed and not result.timed_out
    assert result.instructions_estimate == pytest.approx(4096 * 1e9 / (32 * board["timer"]["hz"]))
    assert result.instructions_per_iteration_estimate == pytest.approx(
        result.instructions_estimate / 4)


@pytest.mark.parametrize("name", BOARDS)
@on_device
def test_icount_estimate_counts_a_known_loop(name, tmp_path):
    """SysTick ticks measured on the device convert to the loop's instruction count."""
    board = load_board(name)
    loops = 200_000  # `subs; bne`: 2 instructions per iteration
    enc = StreamEncoder()
    before = enc.hello(board=name, **HELLO)
    seq = enc.seq
    enc.seq += 1
    enc.count += 1
    elf = build_stand_in(tmp_path, board, before, after=enc.done(0), measure_loops=loops,
                         measure_seq=seq)
    result = runner(board).run(elf, tmp_path / "out", timeout_s=60)
    t = result.records.timing
    assert t is not None and t.tick_hz == board["timer"]["hz"] and t.instructions is None
    assert result.stats.clean  # the device-built frame passed the host CRC check
    assert abs(result.instructions_estimate - 2 * loops) < 2 * loops * 0.001 + 20


@on_device
def test_hang_times_out_kills_qemu_and_says_what_arrived(tmp_path):
    board = load_board("qemu-an547")
    enc = StreamEncoder()
    stream = enc.hello(board="qemu-an547", **HELLO) + enc.log("entering the model")
    elf = build_stand_in(tmp_path, board, stream, hang=True)
    limit = 5
    t0 = time.monotonic()
    with pytest.raises(RunError) as err:
        runner(board).run(elf, tmp_path / "out", timeout_s=limit)
    elapsed = time.monotonic() - t0
    e = err.value
    assert e.exit_code == ExitCode.TIMEOUT
    text = str(e)
    assert f"{limit} s" in text and "killed" in text
    assert "hello(board=qemu-an547" in text and "entering the model" in text
    console = tmp_path / "out" / "run" / "console.bin"
    assert e.log_path == str(console) and str(console) in text and "qemu.log" in text
    assert console.read_bytes() == stream
    # Killed at the limit: not before, and well before a second limit would end (the margin
    # holds at a load average of 8 on two cores; docs/failures.md).
    assert limit <= elapsed < 2 * limit
    assert qemu_processes_running(elf) == []


@on_device
def test_silent_firmware_is_no_boot(tmp_path):
    board = load_board("qemu-an505")
    elf = build_stand_in(tmp_path, board, b"bootloader: jumping to app\r\n", status=0)
    with pytest.raises(RunError) as err:
        runner(board).run(elf, tmp_path / "out", timeout_s=30)
    assert err.value.exit_code == ExitCode.NO_BOOT
    assert "jumping to app" in str(err.value) and "exited with code 0" in str(err.value)


@on_device
def test_exit_code_must_agree_with_done(tmp_path):
    board = load_board("qemu-an505")
    enc = StreamEncoder()
    elf = build_stand_in(tmp_path, board, enc.hello(**HELLO) + enc.done(0), status=1)
    with pytest.raises(RunError) as err:
        runner(board).run(elf, tmp_path / "out", timeout_s=30)
    assert err.value.exit_code == ExitCode.PROTOCOL
    assert "exit code 1 disagrees with done.status 0" in str(err.value)


@on_device
def test_device_error_and_fault_are_classified(tmp_path):
    board = load_board("qemu-an547")
    enc = StreamEncoder()
    elf = build_stand_in(tmp_path / "a", board, enc.hello(**HELLO)
                         + enc.error(20, "Operator missing: aten::foo") + enc.done(1), status=1)
    result = runner(board).run(elf, tmp_path / "out-a", timeout_s=30, check=False)
    assert result.exit_code == 1 and result.outcome().exit_code == ExitCode.DEVICE_ERROR
    assert "Operator missing" in result.outcome().cause

    enc = StreamEncoder()
    regs = dict.fromkeys(FAULT_REGISTERS, 0) | {"pc": 0x10000abc, "cfsr": 1 << 25,
                                                 "hfsr": 1 << 30}
    elf = build_stand_in(tmp_path / "b", board, enc.hello(**HELLO) + enc.fault(regs)
                         + enc.done(2), status=2)
    with pytest.raises(RunError) as err:
        runner(board).run(elf, tmp_path / "out-b", timeout_s=30)
    assert err.value.exit_code == ExitCode.FAULT
    assert "pc=0x10000abc" in str(err.value) and "DIVBYZERO" in str(err.value)


@on_device
def test_done_without_exit_is_a_protocol_error(tmp_path):
    board = load_board("qemu-an505")
    enc = StreamEncoder()
    elf = build_stand_in(tmp_path, board, enc.hello(**HELLO) + enc.done(0), hang=True)
    t0 = time.monotonic()
    with pytest.raises(RunError) as err:
        runner(board, done_grace_s=1.0).run(elf, tmp_path / "out", timeout_s=60)
    # The grace after done ended it (a protocol error), not the run's limit (a timeout); and
    # well before that limit, with room for QEMU's start on a loaded machine.
    assert err.value.exit_code == ExitCode.PROTOCOL and "did not exit" in str(err.value)
    assert time.monotonic() - t0 < 30
    assert qemu_processes_running(elf) == []

