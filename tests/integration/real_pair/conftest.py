"""The package's shared servers: the real target served autoregressively (`ar_server`) and by SSD
with default flags (`ssd_server`), each started on first use and stopped after the package."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eval.servers import Server

from .pair import real_pair


@pytest.fixture(scope="package")
def pair() -> tuple[Path, Path]:
    """(target, draft) model folders, pulled when absent."""
    return real_pair()


@pytest.fixture(scope="package")
def ar_server(
    pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """The target alone (`--speculative-algorithm NONE`), greedy reference for every test.

    Without the overlap scheduler: under it SGLang 0.5.23's penalizers count the prompt's last
    token and lag the output by one (README, Exactness), so only the non-overlap server is
    plain decoding for `test_options`; greedy output without penalties is the same in both."""
    log = tmp_path_factory.mktemp("real-pair-logs") / "ar.log"
    args = [
        "--model-path",
        str(pair[0]),
        "--speculative-algorithm",
        "NONE",
        "--disable-overlap-schedule",
    ]
    with Server("ar", args, log_path=log) as server:
        yield server


@pytest.fixture(scope="package")
def ssd_server(
    pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """SSD with the launcher's defaults, the speculator in its own process on its own cores,
    except a `--ssd-speculator-timeout` of 300 s: on an AVX2-only 2-core CPU the speculator's
    prefill of a batch of 10-16 new requests (one core, ~2k tokens) outlasted the default
    30 s, and the target counted a fault and restarted a speculator that was working, not hung
    (the tests here check that no fault or restart happens)."""
    log = tmp_path_factory.mktemp("real-pair-logs") / "ssd.log"
    args = [
        "--model-path",
        str(pair[0]),
        "--speculative-draft-model-path",
        str(pair[1]),
        "--speculative-algorithm",
        "SSD",
        "--ssd-speculator-timeout",
        "300",
    ]
    with Server("ssd", args, log_path=log) as server:
        yield server
