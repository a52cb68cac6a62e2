"""The package's shared servers: the real target served autoregressively (`ar_server`) and by SSD
with default flags (`ssd_server`), started together on first use and stopped after the package.

CI runs the package's smoke (every test not marked `real`); `make test-real` runs the rest."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eval.servers import Server, started_together

from .pair import real_pair


@pytest.fixture(scope="package")
def pair() -> tuple[Path, Path]:
    """(target, draft) model folders, pulled when absent."""
    return real_pair()


@pytest.fixture(scope="package")
def servers(
    pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Server]]:
    """The package's two servers, started side by side (their start-ups overlap) on first use.

    - "ar": the target alone (`--speculative-algorithm NONE`), greedy reference for every test.
      Without the overlap scheduler: under it SGLang 0.5.23's penalizers count the prompt's last
      token and lag the output by one (docs/design.md#request-options-in-detail), so only the
      non-overlap server is plain decoding for `test_options`; greedy output without penalties
      is the same in both.
    - "ssd": SSD with the launcher's defaults, the speculator in its own process on its own
      cores, except a `--ssd-speculator-timeout` of 300 s: on an AVX2-only 2-core CPU the
      speculator's prefill of a batch of 10-16 new requests (one core, ~2k tokens) outlasted
      the default 30 s, and the target counted a fault and restarted a speculator that was
      working, not hung (the tests here check that no fault or restart happens).
    """
    logs = tmp_path_factory.mktemp("real-pair-logs")
    target, draft = (str(path) for path in pair)
    ar = ["--model-path", target, "--speculative-algorithm", "NONE", "--disable-overlap-schedule"]
    ssd = [
        *("--model-path", target, "--speculative-draft-model-path", draft),
        *("--speculative-algorithm", "SSD", "--ssd-speculator-timeout", "300"),
        *("--ssd-mode", "async"),  # the tests here check pre-speculation (hit rates, builds)
    ]
    made = {
        "ar": Server("ar", ar, log_path=logs / "ar.log"),
        "ssd": Server("ssd", ssd, log_path=logs / "ssd.log"),
    }
    with started_together(made):
        yield dict(made)


@pytest.fixture(scope="package")
def ar_server(servers: dict[str, Server]) -> Server:
    """The target alone (see `servers`)."""
    return servers["ar"]


@pytest.fixture(scope="package")
def ssd_server(servers: dict[str, Server]) -> Server:
    """SSD with the launcher's defaults (see `servers`)."""
    return servers["ssd"]
