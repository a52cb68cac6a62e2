"""Where CI's time went: `python scripts/ci_times.py JUNIT_XML [JUNIT_XML ...] [--top N]`.

Reads the JUnit XML files of pytest runs (`make test` writes one per phase) and prints
- the `N` (default 10) slowest test modules with their seconds (setup, call and teardown of
  their test cases: pytest charges a module- or session-scoped fixture to the first test that
  uses it, and its teardown to the last);
- one line per server the session started, with its start-up seconds and the test whose setup
  started it (the `server_start` properties that `tests/conftest.py` records for every
  `eval.servers.Server`), so a session-scoped server's start-up is visible on its own although
  JUnit charges it to whichever module used it first;
- the runs' total wall time (each file's test suite time, summed; with pytest-xdist the module
  seconds add up over workers that ran side by side, so their sum exceeds it).

The numbers are a report, never a pass/fail: the budget is measured, not asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

SERVER_PROPERTY = "server_start"


@dataclass(frozen=True)
class ServerStart:
    """One server start recorded during the run."""

    name: str
    seconds: float
    test: str


@dataclass(frozen=True)
class Times:
    """A run's durations: per module (seconds, in descending order), server starts, total."""

    modules: list[tuple[str, float]]
    servers: list[ServerStart]
    total_s: float


def server_start_value(name: str, seconds: float, test: str, port: int | None) -> str:
    """The `server_start` property's value for one start-up (what `read_times` reads back); the
    port tells two start-ups apart (JUnit repeats a test's properties for each of its phases)."""
    return json.dumps({"name": name, "seconds": round(seconds, 1), "test": test, "port": port})


def module_of(classname: str) -> str:
    """The test module of a JUnit classname: ``tests.a.test_b.TestC`` -> ``tests/a/test_b.py``
    (a test class's name starts with a capital letter, a module's does not)."""
    parts = classname.split(".")
    while len(parts) > 1 and parts[-1][:1].isupper():
        parts.pop()
    return "/".join(parts) + ".py"


def read_times(*junit_xml: str | Path) -> Times:
    """The durations in pytest JUnit XML files, together.

    Raises:
        FileNotFoundError: if a file is missing.
        xml.etree.ElementTree.ParseError: if one is not XML.
        ValueError: if a `server_start` property is not the JSON this report expects.
    """
    per_module: dict[str, float] = defaultdict(float)
    servers: dict[str, ServerStart] = {}  # by property value: JUnit repeats it per test phase
    total = 0.0
    for path in junit_xml:
        root = ET.parse(path).getroot()
        for case in root.iter("testcase"):
            per_module[module_of(case.get("classname", "?"))] += float(case.get("time") or 0.0)
        for prop in root.iter("property"):
            value = prop.get("value") or "{}"
            if prop.get("name") == SERVER_PROPERTY and value not in servers:
                record = json.loads(value)
                servers[value] = ServerStart(
                    record["name"], float(record["seconds"]), record["test"]
                )
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        total += sum(float(s.get("time") or 0.0) for s in suites)
    modules = sorted(per_module.items(), key=lambda item: -item[1])
    return Times(modules, list(servers.values()), total)


def report(times: Times, top: int = 10) -> str:
    """The text `.ci/run` prints at its end."""
    lines = [f"slowest {min(top, len(times.modules))} test modules (s, fixtures included):"]
    lines += [f"  {seconds:8.1f}  {module}" for module, seconds in times.modules[:top]]
    started = sum(s.seconds for s in times.servers)
    lines.append(f"server start-ups: {len(times.servers)}, {started:.1f} s in all")
    lines += [f"  {s.seconds:8.1f}  server {s.name} (started for {s.test})" for s in times.servers]
    lines.append(f"pytest total: {times.total_s:.1f} s ({times.total_s / 60:.1f} min)")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit_xml", type=Path, nargs="+")
    parser.add_argument("--top", type=int, default=10, help="modules to list (default: 10)")
    args = parser.parse_args(argv)
    print(report(read_times(*args.junit_xml), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
