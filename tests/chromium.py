"""Headless Chromium (Debian's `chromium` package) driven over the DevTools protocol through
a pipe (`--remote-debugging-pipe`: commands on fd 3, replies on fd 4, NUL-separated JSON), so
a browser test needs nothing from PyPI and no browser download.

The flags keep Chromium off the network (no background services, no component updates) and
let it run as root in a container (--no-sandbox); a fresh profile directory per browser.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SKIP_REASON = "Chromium not installed (apt-get install chromium)"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-pipe",
)


class Browser:
    """One headless Chromium with one page."""

    def __init__(self, width: int = 1400, height: int = 900) -> None:
        if CHROMIUM is None:
            raise RuntimeError(SKIP_REASON)
        self._profile = tempfile.mkdtemp(prefix="dk-chromium-")
        # Chromium wants the pipe ends on fds 3 and 4: bash moves them there and execs it.
        # Kept at 10 and above here, so that the moves never overwrite one another.
        to_browser_r, self._to_browser = (_high_fd(fd) for fd in os.pipe())
        self._from_browser, from_browser_w = (_high_fd(fd) for fd in os.pipe())
        move = (
            f'exec "$0" "$@" 3<&{to_browser_r} 4>&{from_browser_w} '
            f"{to_browser_r}<&- {from_browser_w}>&-"
        )
        self._proc = subprocess.Popen(
            [
                "bash",
                "-c",
                move,
                CHROMIUM,
                *FLAGS,
                f"--user-data-dir={self._profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            pass_fds=(to_browser_r, from_browser_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self._session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        self.call("Page.enable", session=True)
        self.call("Runtime.enable", session=True)

    def call(
        self, method: str, session: bool = False, timeout: float = 60.0, **params: Any
    ) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self._session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            # select() first: a bare os.read() would block past the deadline (forever, if
            # Chromium hangs with its pipe open).
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no reply from Chromium")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed its DevTools pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def goto(self, url: str) -> None:
        self.call("Page.navigate", session=True, url=url)

    def evaluate(self, expression: str) -> Any:
        result = self.call(
            "Runtime.evaluate",
            session=True,
            expression=expression,
            returnByValue=True,
            awaitPromise=True,
        )
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float) -> Any:
        """Poll `expression` in the page until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"still false after {timeout:.0f} s: {expression}")
            time.sleep(0.5)

    def screenshot(self, path: Path) -> bytes:
        data = base64.b64decode(
            self.call("Page.captureScreenshot", session=True, format="png")["data"]
        )
        path.write_bytes(data)
        return data

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):
            self.call("Browser.close", timeout=10)
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        for fd in (self._to_browser, self._from_browser):
            os.close(fd)
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _high_fd(fd: int) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high
