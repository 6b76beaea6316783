"""A connection to a labgrid coordinator: the places, who holds them, acquire and release.

labgrid's own client (`labgrid.remote.client.ClientSession`, gRPC since labgrid 25.0) does the
talking; this module keeps its event loop running in a thread of its own, so that the
coordinator's updates keep arriving (and the connection stays alive) while deploykit flashes
and reads a board, and gives the rest of deploykit a few synchronous calls.

Acquiring is the coordinator's business: its AcquirePlace is atomic, so of two jobs that ask
for the same free place one gets it and the other is refused and tries the next candidate.
Nothing here decides who holds a place.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from deploykit.util.errors import DeployKitError, EnvironmentProblem, ExitCode

Progress = Callable[[str], None]
DEFAULT_PORT = 20408  # labgrid-coordinator's gRPC port
RESULT_TAG = "dk_result"  # the place tag deploykit sets to the outcome of its last run there
BOARD_TAG = "board"  # the place tag naming the board file (`farm exporter-config` suggests it)


def _quiet(_message: str) -> None:
    pass


def describe_error(exc: BaseException) -> str:
    """One line for an exception: a gRPC error's details (its repr spans several lines)."""
    details = getattr(exc, "details", None)
    text = details() if callable(details) else str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _warn_stderr(message: str) -> None:
    print(f"deploykit: warning: {message}", file=sys.stderr, flush=True)


class FarmError(DeployKitError):
    """The board farm could not give a board: no coordinator, no such place, all busy."""

    exit_code = ExitCode.ENVIRONMENT


@dataclass(frozen=True)
class PlaceInfo:
    """One place as the coordinator describes it."""

    name: str
    tags: dict[str, str]
    holder: str | None  # "host/user" of the client that acquired it
    aliases: tuple[str, ...] = ()
    comment: str = ""
    matches: tuple[str, ...] = ()

    @property
    def board(self) -> str | None:
        return self.tags.get(BOARD_TAG)

    @property
    def last_result(self) -> str | None:
        return self.tags.get(RESULT_TAG)


@dataclass(frozen=True)
class PlaceResource:
    """A resource of an acquired place: its labgrid class (NetworkSerialPort, ...), the
    name it has in the place, its parameters and whether the exporter sees it now."""

    name: str
    cls: str
    params: dict[str, Any]
    avail: bool


@dataclass(frozen=True)
class PlaceQuery:
    """What `--place` asks for: a place by name (or alias), or any place with these tags."""

    name: str | None = None
    tags: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> PlaceQuery:
        text = text.strip()
        if "=" not in text:
            if not text:
                raise FarmError(
                    "--place is empty.",
                    "Give a place name, or tags such as board=pico2 for any free place with them.",
                )
            return cls(name=text)
        tags = {}
        for pair in text.split(","):
            key, sep, value = pair.partition("=")
            if not sep or not key.strip() or not value.strip():
                raise FarmError(
                    f"--place {text!r}: {pair!r} is not KEY=VALUE.",
                    "Give a place name, or tags: --place board=pico2[,KEY=VALUE].",
                )
            tags[key.strip()] = value.strip()
        return cls(tags=tags)

    def describe(self) -> str:
        if self.name is not None:
            return f"place {self.name}"
        return "a place with " + ", ".join(f"{k}={v}" for k, v in self.tags.items())

    def matches(self, place: PlaceInfo) -> bool:
        if self.name is not None:
            return place.name == self.name or self.name in place.aliases
        return all(place.tags.get(k) == v for k, v in self.tags.items())


def coordinator_address(given: str | None) -> str:
    address = given or os.environ.get("LG_COORDINATOR")
    if not address:
        raise FarmError(
            "No labgrid coordinator given.",
            "Pass --coordinator HOST[:PORT] or set LG_COORDINATOR "
            f"(labgrid-coordinator listens on port {DEFAULT_PORT}).",
        )
    return address if ":" in address.rsplit("]", 1)[-1] else f"{address}:{DEFAULT_PORT}"


def require_labgrid() -> Any:
    """labgrid's client module; EnvironmentProblem naming the extra when it is missing."""
    try:
        from labgrid.remote import client
    except ImportError as exc:
        raise EnvironmentProblem(
            f"Running on a labgrid board farm needs labgrid, which is not installed ({exc}).",
            "pip install 'deploykit[farm]' (labgrid 26), or scripts/install --farm.",
        ) from exc
    return client


class FarmSession:
    """A session with the coordinator at `address` (see the module docstring)."""

    def __init__(self, address: str | None, *, connect_timeout_s: float = 10.0,
                 warn: Progress = _warn_stderr) -> None:
        client = require_labgrid()
        self.address = coordinator_address(address)
        self.warn = warn  # what went wrong without failing the command (close() below)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="labgrid-session", daemon=True
        )
        self._thread.start()

        async def start() -> Any:
            # Made on the loop's own thread: gRPC's channel binds to the running loop.
            session = client.ClientSession(self.address, self._loop)
            await session.start()
            return session

        try:
            self._session = self._call(start(), connect_timeout_s)
        except Exception as exc:  # labgrid's ServerError, gRPC's errors, a timeout
            self._stop_loop()
            raise FarmError(
                f"Cannot reach the labgrid coordinator at {self.address}: {exc}",
                "Check that labgrid-coordinator runs there and the address "
                "(--coordinator or LG_COORDINATOR).",
            ) from exc

    # -- plumbing: run a coroutine on the session's loop --------------------------------------

    def _call(self, coro: Any, timeout_s: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def _rpc(self, method: str, request: Any) -> Any:
        """One call of the coordinator's gRPC service, made on the session's loop."""

        async def call() -> Any:
            return await getattr(self._session.stub, method)(request)

        return self._call(call())

    def sync(self) -> None:
        """Wait until every update the coordinator sent so far has been applied."""
        self._call(self._session.sync_with_coordinator())

    @property
    def user(self) -> str:
        """The name the coordinator records as the holder of what this session acquires."""
        return f"{self._session.gethostname()}/{self._session.getuser()}"

    # -- places ---------------------------------------------------------------------------------

    def places(self) -> list[PlaceInfo]:
        self.sync()
        out = []
        for name, p in sorted(self._session.places.items()):
            out.append(
                PlaceInfo(
                    name=name,
                    tags=dict(p.tags),
                    holder=p.acquired or None,
                    aliases=tuple(sorted(p.aliases)),
                    comment=p.comment or "",
                    matches=tuple(str(m) for m in p.matches),
                )
            )
        return out

    def find(self, query: PlaceQuery) -> list[PlaceInfo]:
        places = self.places()
        found = [p for p in places if query.matches(p)]
        if not found:
            known = ", ".join(f"{p.name} ({p.board or 'no board tag'})" for p in places)
            raise FarmError(
                f"The coordinator at {self.address} has no {query.describe()}.",
                f"Its places: {known or 'none'}. A place is tagged with "
                f"`labgrid-client -p NAME set-tags {BOARD_TAG}=BOARD`.",
            )
        return found

    def acquire(
        self,
        query: PlaceQuery,
        *,
        timeout_s: float = 300.0,
        progress: Progress = _quiet,
        poll_s: float = 0.5,
        on_acquired: Callable[[PlaceInfo], None] | None = None,
    ) -> PlaceInfo:
        """Acquire the named place, or any free place with the query's tags; wait for one to
        be released until `timeout_s`, then fail naming who holds them. `on_acquired` hears of
        the place before a Ctrl-C can interrupt, so that its caller can always release it."""
        from labgrid.remote.generated import labgrid_coordinator_pb2 as pb2

        grpc = _grpc()
        deadline = time.monotonic() + timeout_s
        waiting_said = False
        while True:
            candidates = self.find(query)
            for place in (p for p in candidates if p.holder is None):
                request = pb2.AcquirePlaceRequest(placename=place.name)
                with _interrupts_deferred():
                    try:
                        self._rpc("AcquirePlace", request)
                    except grpc.aio.AioRpcError as exc:
                        if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                            continue  # another job was quicker, or a resource is in use
                        raise FarmError(
                            f"Acquiring {place.name} failed: {exc.details()}",
                            "See the coordinator's log.",
                        ) from exc
                    if on_acquired is not None:
                        on_acquired(place)
                self.sync()
                return place
            held = "; ".join(f"{p.name} held by {p.holder}" for p in candidates if p.holder)
            held = held or "free, but their resources are in use by other places"
            if time.monotonic() >= deadline:
                raise FarmError(
                    f"No free {query.describe()} within {timeout_s:g} s: {held}.",
                    "Wait for the holder to finish, raise --place-timeout, or "
                    "ask them to release it (labgrid-client -p NAME release).",
                )
            if not waiting_said:
                progress(f"waiting up to {timeout_s:g} s for {query.describe()} ({held})")
                waiting_said = True
            time.sleep(poll_s)

    def release(self, name: str) -> None:
        from labgrid.remote.generated import labgrid_coordinator_pb2 as pb2

        grpc = _grpc()
        try:
            self._rpc("ReleasePlace", pb2.ReleasePlaceRequest(placename=name))
        except grpc.aio.AioRpcError as exc:
            raise FarmError(
                f"Releasing {name} failed: {exc.details()}",
                f"Release it by hand: labgrid-client -p {name} release",
            ) from exc

    def set_tags(self, name: str, tags: dict[str, str]) -> None:
        from labgrid.remote.generated import labgrid_coordinator_pb2 as pb2

        self._rpc("SetPlaceTags", pb2.SetPlaceTagsRequest(placename=name, tags=tags))

    def resources(self, name: str) -> list[PlaceResource]:
        """The resources of place `name`, which this session must hold."""
        self.sync()
        place = self._session.places[name]
        try:
            entries = self._session.get_target_resources(place)
        except Exception as exc:  # labgrid's UserError/ServerError: not ours, or orphaned
            raise FarmError(
                f"Place {name}: {exc}",
                "Check that its exporter is running (labgrid-client resources).",
            ) from exc
        return [
            PlaceResource(rname, cls, dict(e.args), bool(e.avail))
            for (rname, cls), e in sorted(entries.items())
        ]

    def labgrid_target(self, name: str) -> Any:
        """A labgrid Target holding place `name`'s resources (which this session must hold),
        for labgrid's own drivers; made as labgrid-client makes its targets."""
        from labgrid import Target
        from labgrid.resource.remote import RemotePlace, RemotePlaceManager

        manager = RemotePlaceManager.get()
        manager.session, manager.loop = self._session, self._loop
        target = Target(name)
        RemotePlace(target, name=name)
        return target

    def close(self) -> None:
        """Stop the update stream and close the channel, the second also when the first
        fails; a failure is said, not raised: the run's own outcome matters more."""
        problems = []
        for step in ("stop", "close"):
            try:
                self._call(getattr(self._session, step)(), timeout_s=5.0)
            except Exception as exc:  # labgrid's, gRPC's, a timeout: whatever it is, say it
                problems.append(f"{step}() failed: {describe_error(exc)}")
        self._stop_loop()
        if problems:
            self.warn(f"the labgrid session with {self.address} did not end cleanly: "
                      + "; ".join(problems))

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> FarmSession:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _grpc() -> Any:
    import grpc

    return grpc


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the body is done (main thread only; elsewhere as is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    blocked = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def held_place(
    session: FarmSession,
    query: PlaceQuery,
    *,
    timeout_s: float = 300.0,
    progress: Progress = _quiet,
) -> Iterator[PlaceInfo]:
    """Hold a place for the body of the `with`: released when it ends, however it ends (an
    error, Ctrl-C). Only a killed process (SIGKILL) leaves it held, as with labgrid-client."""
    acquired: list[PlaceInfo] = []
    try:
        session.acquire(query, timeout_s=timeout_s, progress=progress, on_acquired=acquired.append)
        progress(f"acquired {acquired[0].name} on {session.address} as {session.user}")
        yield acquired[0]
    finally:
        for place in acquired:
            progress(f"releasing {place.name}")
            with _interrupts_deferred():  # a second Ctrl-C must not leave the place held
                session.release(place.name)
            progress(f"released {place.name}")
