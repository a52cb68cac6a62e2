"""Which tests may start servers, and the record of each server start-up a test caused.

A test that starts a server carries a server marker (`SERVER_MARKERS`), so `make test-unit`
(`-m "not integration and not real and not server"`) starts none. Tests using a fixture of
`SERVER_FIXTURES` are marked at collection (`mark_server_tests`); a server started under any
other test fails it (`record_server_start` raises `UnmarkedServerTest`). tests/conftest.py
wires these to pytest's hooks and to `eval.servers.START_LISTENERS`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
import ci_times

if TYPE_CHECKING:
    from eval.servers import Server

SERVER_MARKERS = ("server", "integration", "real")
# Fixtures that start servers: a test using one (directly or through another fixture) gets the
# `server` marker at collection; a test that starts one otherwise is marked by hand.
SERVER_FIXTURES = frozenset(
    {"tiny_servers", "keyed_pool", "servers", "own_servers", "draws", "tiny_run"}
)

running: list[pytest.Item] = []  # the test this process sets up, runs or tears down


class UnmarkedServerTest(RuntimeError):
    """A test without a server marker started a server (`make test-unit` would start it)."""


def mark_server_tests(items: list[pytest.Item]) -> None:
    """Add the `server` marker to every item that uses a fixture of `SERVER_FIXTURES`."""
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.server)


def server_marked(item: pytest.Item) -> bool:
    """Whether `item` has one of `SERVER_MARKERS` (on itself, its class or its module)."""
    return any(item.get_closest_marker(name) for name in SERVER_MARKERS)


def record_server_start(server: Server) -> None:
    """Every `eval.servers.Server` the session starts becomes a `server_start` property of the
    test whose setup started it (name, start-up seconds, that test, the port): JUnit charges a
    shared server to the first test that uses it, so `scripts/ci_times.py` lists each start-up
    on its own line (`.ci/run` prints it).

    Raises:
        UnmarkedServerTest: when that test has none of `SERVER_MARKERS` (the server is running
            and is stopped by its owner, as after any failed start-up).
    """
    if running:
        item = running[-1]
        if not server_marked(item):
            raise UnmarkedServerTest(
                f"{item.nodeid} started server {server.name!r} without a `server` marker: mark "
                "the test or its module (pytest.mark.server), so `make test-unit` leaves it out"
            )
        value = ci_times.server_start_value(
            server.name, server.info["startup_s"], item.nodeid, server.port
        )
        item.user_properties.append((ci_times.SERVER_PROPERTY, value))


REAL_PAIR = "tests/integration/real_pair/"


def real_pair_first(items: list[pytest.Item]) -> None:
    """Move the real pair's smoke (`REAL_PAIR`) ahead of every other test, in file order even in
    a shuffled run, keeping the other tests' order: its accept-length checks follow the
    speculator's speed against the target's, so it runs before any other server of the session
    is up, on an otherwise quiet machine, and its package-scoped servers see the same requests
    in the same order every run (on the AMX Xeon a shuffled run that sent the JSON-schema
    request to the cold SSD server first measured accept length 1.5 against its bar > 1.5).
    Its servers stop when the package ends."""
    real = sorted(
        (item for item in items if item.nodeid.startswith(REAL_PAIR)),
        key=lambda item: (item.nodeid.split("::")[0], item.location[1]),
    )
    rest = [item for item in items if not item.nodeid.startswith(REAL_PAIR)]
    items[:] = real + rest
