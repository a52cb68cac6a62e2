"""`python -m sglang_ssd.testing.resolve_args CASES`: each launcher command line of `CASES` (a
JSON object, name -> argv) through the launcher's path up to serving, in one process.

That path is `launch_server.server_args_of` (SSD's flags, the launcher's defaults, SGLang's
plugins and `prepare_server_args`), then the `resolve_once` that SGLang's `run_server` begins
with, which runs SSD's validation. A start per case would import SGLang once per case (~20 s
each on CI's machines). Prints one line, `RESULTS {name: "served" or "ExcType: message"}`.
"""

from __future__ import annotations

import json
import sys

from sglang_ssd.launch_server import server_args_of


def main(argv: list[str]) -> int:
    """Resolve each case of the JSON object `argv[0]`; prints the results line, returns 0."""
    out = {}
    for name, args in json.loads(argv[0]).items():
        try:
            server_args_of(args).resolve_once()
            out[name] = "served"
        except BaseException as exc:  # what a real start would die of
            out[name] = f"{type(exc).__name__}: {exc}"
    print("RESULTS " + json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
