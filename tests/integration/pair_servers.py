"""Servers started side by side: any set of them, or an AR and an SSD server on one target
(test helper)."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from eval.servers import Server

TINY_FLAGS = ("--max-total-tokens", "4096", "--dtype", "float32")


@contextlib.contextmanager
def ar_and_ssd(
    target: Path, draft: Path, logs: Path, ssd_flags: Sequence[str] = ()
) -> Iterator[dict[str, Server]]:
    """{"ar": ..., "ssd": ...} servers of `target` (fp32, 4096 KV tokens), SSD drafting with
    `draft` plus `ssd_flags`; the two start-ups overlap; both are stopped on exit.

    Raises:
        eval.servers.ServerError: if either fails to start (the other is stopped too).
    """
    common = ["--model-path", str(target), *TINY_FLAGS]
    spec = ["--speculative-algorithm", "SSD", "--speculative-draft-model-path", str(draft)]
    made = {
        "ar": Server("ar", [*common, "--speculative-algorithm", "NONE"], log_path=logs / "ar.log"),
        "ssd": Server("ssd", [*common, *spec, *ssd_flags], log_path=logs / "ssd.log"),
    }
    with started(made):
        yield made


@contextlib.contextmanager
def started(made: Mapping[str, Server]) -> Iterator[Mapping[str, Server]]:
    """`made`'s servers started side by side (their start-ups overlap), all stopped on exit.

    Raises:
        eval.servers.ServerError: if any fails to start (the others are stopped too).
    """
    with contextlib.ExitStack() as stack:
        for server in made.values():
            stack.callback(server.stop)
        with cf.ThreadPoolExecutor(len(made)) as pool:
            list(pool.map(Server.start, made.values()))
        yield made
