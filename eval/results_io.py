"""A run's results file on disk, its per-batch rows optionally gzipped beside it.

`eval.harness` writes one JSON document per run. Most of its bytes are the per-batch rows
("batches": every request's output ids and timings), which only the summaries, intervals and
traces re-read. `pack` moves them to ``NAME.batches.json.gz`` beside ``NAME.json`` and leaves
``"batches_file": "NAME.batches.json.gz"`` in their place, so the document a reader opens keeps
its settings, configurations, summary and comparisons; `read_results` puts the rows back. Every
reader of a results file goes through `read_results`: a packed and an unpacked file read alike.

`python -m eval.results_io pack FILE ...` packs finished runs (eval/results/) before they are
committed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BATCHES_KEY = "batches_file"
SUFFIX = ".batches.json.gz"


def batches_path(path: Path) -> Path:
    """Where `pack` puts the rows of ``NAME.json``: ``NAME.batches.json.gz`` beside it."""
    path = Path(path)
    return path.with_name(path.name.removesuffix(".json") + SUFFIX)


def read_results(path: Path) -> Any:
    """The document in `path`, with its batches read back when they were packed.

    Raises:
        FileNotFoundError: no such file (or its packed batches are missing).
        ValueError: the file or its batches are not JSON (the message names the file).
    """
    path = Path(path)
    results = _json(path, path.read_bytes())
    if isinstance(results, dict) and (name := results.get(BATCHES_KEY)):
        side = path.parent / name
        with gzip.open(side, "rb") as f:
            batches = _json(side, f.read())
        results = {
            ("batches" if k == BATCHES_KEY else k): (batches if k == BATCHES_KEY else v)
            for k, v in results.items()
        }
    return results


def _json(path: Path, raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None


def pack(path: Path) -> Path | None:
    """Move the batches of the run in `path` to `batches_path(path)` (gzip, byte-reproducible:
    no name or time in its header); the document keeps its key order, "batches_file" where
    "batches" was. Returns the batches' path, or None for a document without batches.

    Raises:
        FileNotFoundError, ValueError: as `read_results`.
    """
    path = Path(path)
    results = _json(path, path.read_bytes())
    if not isinstance(results, dict) or "batches" not in results:
        return None
    side = batches_path(path)
    raw = json.dumps(results["batches"], separators=(",", ":")).encode()
    with open(side, "wb") as out, gzip.GzipFile("", "wb", 9, out, mtime=0) as f:
        f.write(raw)
    packed = {
        (BATCHES_KEY if k == "batches" else k): (side.name if k == "batches" else v)
        for k, v in results.items()
    }
    path.write_text(json.dumps(packed, indent=1) + "\n")
    return side


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m eval.results_io pack FILE...`: pack each run; prints what it wrote."""
    parser = argparse.ArgumentParser(prog="python -m eval.results_io", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="move each run's batches to NAME.batches.json.gz")
    p.add_argument("files", type=Path, nargs="+")
    a = parser.parse_args(argv)
    for path in a.files:
        try:
            side = pack(path)
        except (OSError, ValueError) as exc:
            parser.error(str(exc))
        print(f"{path}: {'no batches' if side is None else f'batches -> {side}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
