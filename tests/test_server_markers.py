"""A test that starts a server carries a server marker (`server`, `integration` or `real`), so
`make test-unit` (`-m "not integration and not real and not server"`) starts none: the session
fails the test that started an unmarked one (tests/server_markers.py), here with a stand-in
server."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import server_markers


def _server() -> SimpleNamespace:
    return SimpleNamespace(name="stand-in", info={"startup_s": 1.5}, port=1234)


def _record_as(item: pytest.Item) -> None:
    server_markers.running.append(item)
    try:
        server_markers.record_server_start(_server())
    finally:
        server_markers.running.remove(item)


def test_an_unmarked_test_that_starts_a_server_fails(request: pytest.FixtureRequest) -> None:
    with pytest.raises(server_markers.UnmarkedServerTest, match="without a `server` marker"):
        _record_as(request.node)
    assert not request.node.user_properties


@pytest.mark.server
def test_a_marked_test_records_the_start_up(request: pytest.FixtureRequest) -> None:
    _record_as(request.node)
    names = [name for name, _ in request.node.user_properties]
    request.node.user_properties.clear()  # a stand-in: not a start-up for CI's report
    assert names == [server_markers.ci_times.SERVER_PROPERTY]


def test_the_real_pair_smoke_moves_first_keeping_each_groups_order() -> None:
    ids = [
        "tests/eval/test_sweep.py::b",
        "tests/integration/real_pair/test_options.py::x",
        "tests/test_zygote.py::a",
        "tests/integration/real_pair/test_greedy.py::y",
        "tests/integration/test_ssd_api.py::c",
    ]
    items = [SimpleNamespace(nodeid=nodeid) for nodeid in ids]
    server_markers.real_pair_first(items)  # type: ignore[arg-type]
    assert [item.nodeid for item in items] == [ids[1], ids[3], ids[0], ids[2], ids[4]]
