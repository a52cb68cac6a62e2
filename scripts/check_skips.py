"""Fail when a pytest run skipped anything: `python scripts/check_skips.py JUNIT_XML [...]`.

CI (`.ci/run`) runs `make test` with `--junitxml` and then this check, so that no test is
silently skipped there: every skipped or xfailed test case in the JUnit XML is listed with its
reason and the exit status is 1. The only exception is the GPU checks (`tests/gpu`, marker
`gpu`), which `make test` does not collect at all (pyproject's addopts ignore them) and which
`make gpu-check` runs on a GPU machine.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

# JUnit classnames are dotted module paths: tests/gpu/test_x.py -> tests.gpu.test_x.
ALLOWED_PREFIXES = ("tests.gpu.",)


def skipped_tests(junit_xml: str | Path) -> list[str]:
    """Every skipped (or xfailed) test case outside `ALLOWED_PREFIXES`, as
    ``"classname::name: reason"`` lines in file order.

    Raises:
        FileNotFoundError: if the file is missing (the test run did not write it).
        xml.etree.ElementTree.ParseError: if it is not XML.
    """
    found = []
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        skipped = case.find("skipped")
        classname = case.get("classname", "")
        if skipped is None or classname.startswith(ALLOWED_PREFIXES):
            continue
        reason = skipped.get("message") or (skipped.text or "").strip()
        found.append(f"{classname}::{case.get('name', '?')}: {reason}")
    return found


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python scripts/check_skips.py JUNIT_XML [JUNIT_XML ...]", file=sys.stderr)
        return 2
    found = [line for path in argv for line in skipped_tests(path)]
    if found:
        print(f"check_skips: {len(found)} test(s) skipped; CI runs every test:", file=sys.stderr)
        for line in found:
            print(f"  {line}", file=sys.stderr)
        return 1
    print("check_skips: no test skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
