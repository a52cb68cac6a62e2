"""The tiny pair's session-shared servers: one autoregressive, one SSD (test helper).

Every tiny-pair module that needs a plain AR reference or an SSD server with the launcher's
defaults uses these two, started side by side once per test session (`tests/conftest.py`:
`tiny_servers`, `tiny_ar`, `tiny_ssd`). Modules whose flags really differ (API keys, a pool
limit, TP/DP, another draft, another target) start their own.

Both carry the flags every sharing module needs, and nothing that changes greedy output:
- `--max-total-tokens 8192` (the load test's 16 clients), float32 (a random tiny model's top-2
  margins are small enough for bf16 kernels to flip);
- `--chunked-prefill-size 64`, `--enable-return-hidden-states` and
  `--constrained-json-max-whitespace-cnt 2` (`test_ssd_options.py` says why): a prompt longer
  than 64 tokens prefills in chunks (most prompts here are shorter: one chunk, as by default);
  hidden states and the whitespace bound act only on requests that ask for them;
- AR: `--disable-overlap-schedule` (plain decoding is exact under penalties only without SGLang's
  overlap scheduler: docs/design.md#request-options-in-detail; greedy output without penalties
  is the same either way);
- SSD: `--enable-metrics` and `--decode-log-interval 1` (the API module reads the gauges and the
  decode log line).

Live settings (`POST /ssd/config`) are shared state: `tiny_ssd` restores them after every test
(`restore_live_settings`), so no test sees another's changes, whatever the order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import requests

from eval.run_settings import ServerProvider
from eval.servers import Server
from sglang_ssd.config import LIVE_FIELDS

TINY_FLAGS = ("--max-total-tokens", "8192", "--dtype", "float32")
CHUNK = 64  # --chunked-prefill-size
SHARED_FLAGS = (
    *TINY_FLAGS,
    *("--chunked-prefill-size", str(CHUNK), "--enable-return-hidden-states"),
    *("--constrained-json-max-whitespace-cnt", "2"),
)
AR_FLAGS = ("--speculative-algorithm", "NONE", "--disable-overlap-schedule")
# The shared SSD server runs async (SSD itself); `--ssd-mode` switches live in the tests that
# need another arrangement (`test_ssd_tiny_server.py`).
SSD_FLAGS = (
    *("--speculative-algorithm", "SSD", "--ssd-mode", "async"),
    *("--enable-metrics", "--decode-log-interval", "1"),
)


def ssd_args(target: Path, draft: Path, ssd_flags: Sequence[str] = ()) -> list[str]:
    """Launcher flags of a tiny SSD server of `target` drafting with `draft`, plus `ssd_flags`
    (`TINY_FLAGS`, none of the shared servers' extras); `--ssd-mode async` unless `ssd_flags`
    name a mode (the tests of one arrangement's behaviour run that one)."""
    spec = ["--speculative-algorithm", "SSD", "--speculative-draft-model-path", str(draft)]
    mode = [] if any(f.startswith("--ssd-mode") for f in ssd_flags) else ["--ssd-mode", "async"]
    return ["--model-path", str(target), *TINY_FLAGS, *spec, *mode, *ssd_flags]


def shared_servers(target: Path, draft: Path, logs: Path) -> dict[str, Server]:
    """The two shared servers, not started: {"ar": ..., "ssd": ...}."""
    common = ["--model-path", str(target), *SHARED_FLAGS]
    ssd = [*common, *SSD_FLAGS, "--speculative-draft-model-path", str(draft)]
    return {
        "ar": Server("tiny-ar", [*common, *AR_FLAGS], log_path=logs / "tiny-ar.log"),
        "ssd": Server("tiny-ssd", ssd, log_path=logs / "tiny-ssd.log"),
    }


def live_settings(server: Server) -> dict[str, Any]:
    """The live settings (`GET /ssd/config`'s `settings`), as a `POST /ssd/config` body that sets
    them again (a self-tuned tree depth reads "auto", which POST takes back)."""
    response = requests.get(f"{server.url}/ssd/config", timeout=60)
    response.raise_for_status()
    config = response.json()["settings"]
    return {name: config[name] for name in LIVE_FIELDS}


@contextlib.contextmanager
def restore_live_settings(server: Server) -> Iterator[Server]:
    """`server`, with the live settings it had on entry set again on exit if they changed.

    Raises:
        requests.HTTPError: when the settings cannot be read or set again.
    """
    before = live_settings(server)
    try:
        yield server
    finally:
        if live_settings(server) != before:
            reply = requests.post(f"{server.url}/ssd/config", json=before, timeout=60)
            reply.raise_for_status()


def provider(by_config: Mapping[str, Server]) -> ServerProvider:
    """A `run_interleaved(..., servers=)` provider that hands out running servers (the shared
    ones) by configuration name instead of starting any; the caller keeps them running."""
    return lambda firsts: {c.server_name: by_config[c.name] for c in firsts}
