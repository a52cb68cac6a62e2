"""A test that starts a server carries a server marker (`server`, `integration` or `real`), so
`make test-unit` (`-m "not integration and not real and not server"`) starts none: the session
fails the test that started an unmarked one (tests/conftest.py), here with a stand-in server."""

from __future__ import annotations

from types import SimpleNamespace

import conftest
import pytest


def _server() -> SimpleNamespace:
    return SimpleNamespace(name="stand-in", info={"startup_s": 1.5}, port=1234)


def _record_as(item: pytest.Item) -> None:
    conftest._running.append(item)
    try:
        conftest._record_server_start(_server())
    finally:
        conftest._running.remove(item)


def test_an_unmarked_test_that_starts_a_server_fails(request: pytest.FixtureRequest) -> None:
    with pytest.raises(conftest.UnmarkedServerTest, match="without a `server` marker"):
        _record_as(request.node)
    assert not request.node.user_properties


@pytest.mark.server
def test_a_marked_test_records_the_start_up(request: pytest.FixtureRequest) -> None:
    _record_as(request.node)
    assert [name for name, _ in request.node.user_properties] == [conftest.ci_times.SERVER_PROPERTY]
