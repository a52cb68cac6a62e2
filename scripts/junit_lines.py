"""One line per test case of a pytest JUnit XML report: `check NAME: passed|failed|skipped
(reason)`, for `scripts/gpu_check.sh`. Standard library only (the GPU machine has no project
install). Usage: python scripts/junit_lines.py REPORT.xml; exit status 1 when any case failed,
2 when the report is missing or unreadable."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def case_lines(path: str) -> tuple[list[str], bool]:
    """(the report's lines, whether any case failed or errored).

    Raises:
        OSError / xml.etree.ElementTree.ParseError: the report is missing or not XML.
    """
    lines, failed = [], False
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}".lstrip(":")
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        skipped = case.find("skipped")
        if problem is not None:
            failed = True
            reason = (problem.get("message") or "").splitlines()[:1]
            lines.append(f"check {name}: failed ({reason[0] if reason else 'no message'})")
        elif skipped is not None:
            lines.append(f"check {name}: skipped ({skipped.get('message') or 'no reason'})")
        else:
            lines.append(f"check {name}: passed")
    return lines, failed


def main(argv: list[str]) -> int:
    try:
        lines, failed = case_lines(argv[1])
    except (IndexError, OSError, ET.ParseError) as exc:
        print(f"check tests/gpu: failed (no readable JUnit report: {exc})")
        return 2
    print("\n".join(lines) if lines else "check tests/gpu: failed (the report holds no test)")
    return 1 if failed or not lines else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
