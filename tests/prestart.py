"""Servers started in the background when the test session begins (test helper).

A server start-up is mostly one process importing SGLang on one core (~30 s for a tiny server,
~90 s for the real pair on a 2-core AVX2-only CPU), and the shared servers used to start only
when their first test asked for them, with the other core idle. `tests/conftest.py`'s
`prestart_servers` starts the session's shared servers (the tiny pair's, and the real pair's when
`tests/integration/real_pair` is selected) in background threads as the session begins, while
the unit tests run; the fixture that owns them takes them with `taken` (waiting for the
start-up to finish) and stops them as it always did. Nothing is prestarted for a server no
selected test uses, and a prestart nobody took is stopped at the end of the session.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping

from eval.servers import Server, started_together

THREAD_PREFIX = "prestart-"  # the name of each prestart's thread: "prestart-<key>"
_background: set[int] = set()  # id() of every server a prestart started or is starting


class Prestart:
    """One set of servers started side by side (`eval.servers.started_together`) in a thread."""

    def __init__(self, key: str, make: Callable[[], Mapping[str, Server]]) -> None:
        self.key = key
        self._make = make
        self._stack = contextlib.ExitStack()
        self._servers: Mapping[str, Server] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=THREAD_PREFIX + key, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            made = self._make()
            _background.update(id(server) for server in made.values())
            self._servers = self._stack.enter_context(started_together(made))
        except BaseException as error:  # handed to whoever takes the servers
            self._error = error

    def wait(self) -> Mapping[str, Server]:
        """The running servers, once started.

        Raises:
            eval.servers.ServerError: whatever the start-up raised (every server stopped).
        """
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._servers is not None
        return self._servers

    def close(self) -> None:
        """Stop the servers (after their start-up, if it is still running)."""
        self._thread.join()
        self._stack.close()


_pending: dict[str, Prestart] = {}


def begin(key: str, make: Callable[[], Mapping[str, Server]]) -> None:
    """Start `make()`'s servers in the background under `key` (one prestart per key).

    Raises:
        ValueError: if `key` has a prestart not yet taken.
    """
    if key in _pending:
        raise ValueError(f"servers {key!r} are already being prestarted")
    _pending[key] = Prestart(key, make)


@contextlib.contextmanager
def taken(key: str, make: Callable[[], Mapping[str, Server]]) -> Iterator[Mapping[str, Server]]:
    """The servers prestarted under `key` (waiting for their start-up), or `make()`'s started
    now when there is no such prestart; stopped on exit either way.

    Raises:
        eval.servers.ServerError: if a start-up fails.
    """
    pending = _pending.pop(key, None)
    if pending is None:
        with started_together(make()) as made:
            yield made
        return
    try:
        yield pending.wait()
    finally:
        pending.close()


def close_all() -> None:
    """Stop every prestart nobody took (the session's end)."""
    while _pending:
        _pending.popitem()[1].close()


def prestarted(server: Server) -> bool:
    """Whether a prestart started `server` (in the background, not for the test then running)."""
    return id(server) in _background
