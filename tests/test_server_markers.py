"""A test that starts a server carries a server marker (`server`, `integration` or `real`), so
`make test-unit` (`-m "not integration and not real and not server"`) starts none: the session
fails the test that started an unmarked one (tests/server_markers.py), here with a stand-in
server."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import server_markers
from _pytest.mark.expression import Expression

ROOT = Path(__file__).resolve().parents[1]


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


def test_the_real_pair_smoke_moves_first_in_file_order_and_the_rest_keeps_its_order() -> None:
    ids = [
        ("tests/eval/test_sweep.py::b", 9),
        ("tests/integration/real_pair/test_options.py::x[json]", 70),
        ("tests/launch/test_zygote.py::a", 5),
        ("tests/integration/real_pair/test_greedy.py::y", 90),
        ("tests/integration/real_pair/test_greedy.py::w", 40),
        ("tests/integration/test_ssd_api.py::c", 3),
    ]
    items = [SimpleNamespace(nodeid=nodeid, location=(nodeid, line, "")) for nodeid, line in ids]
    server_markers.real_pair_first(items)  # type: ignore[arg-type]
    order = [ids[4], ids[3], ids[1], ids[0], ids[2], ids[5]]
    assert [item.nodeid for item in items] == [nodeid for nodeid, _ in order]


def test_make_test_unit_deselects_every_server_marker() -> None:
    """The Makefile's `test-unit` expression, read as pytest reads `-m`: it keeps a test with no
    marker and drops one with any `SERVER_MARKERS` marker, each declared in pyproject.toml."""
    recipe = re.search(r"^test-unit:.*\n\t(.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert recipe, "no test-unit recipe in the Makefile"
    found = re.search(r'-m "([^"]+)"', recipe.group(1))
    assert found, f"test-unit selects no markers: {recipe.group(1)}"
    expression = Expression.compile(found.group(1))
    assert expression.evaluate(lambda name, **_: False), "test-unit drops unmarked tests"
    for marker in server_markers.SERVER_MARKERS:
        assert not expression.evaluate(lambda name, **_: name == marker), marker  # noqa: B023
    pyproject = (ROOT / "pyproject.toml").read_text()
    markers = re.search(r"^markers = \[(.*?)^\]", pyproject, re.M | re.S)
    assert markers, "no pytest markers in pyproject.toml"
    declared = set(re.findall(r'^\s+"(\w+): ', markers.group(1), re.M))
    assert set(server_markers.SERVER_MARKERS) <= declared
