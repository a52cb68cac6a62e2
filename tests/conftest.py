"""Shared fixtures: the tiny trained pair, built and checked once per test session."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

# SGLang reads SGLANG_USE_CPU_ENGINE once, when it is first imported (its CPU code paths, e.g.
# rotary embedding without vllm); test modules import SGLang at collection, and the in-process
# SGLang model tests (tests/eagle3) need its CPU engine, as every server here gets from
# `sglang_ssd.launch_server`. These machines have no GPU (tests/gpu has its own conftest).
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

# The Triton reference kernels of tests/kernels run on Triton's CPU interpreter, which must be on
# when triton is first imported (it jits its own helpers then). Some test modules import SGLang,
# which imports triton, and may be collected first: import it here, before any of them.
sys.path.insert(0, str(Path(__file__).parent / "kernels"))
import server_markers
import sglang_source  # noqa: F401

from eval import servers as eval_servers
from sglang_ssd.launch import zygote
from sglang_ssd.testing.pair_stats import PairStats, check_pair
from sglang_ssd.testing.trained_pair import make_trained_pair

if TYPE_CHECKING:
    from keyed_servers import KeyedPool


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    server_markers.running.append(item)
    try:
        return (yield)
    finally:
        server_markers.running.remove(item)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # before `-m` deselects (pytest's own hook runs after a conftest's): `make test-unit`
    # leaves out what is marked here
    server_markers.mark_server_tests(items)


eval_servers.START_LISTENERS.append(server_markers.record_server_start)

_zygote = contextlib.ExitStack()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move the real pair's smoke first (`server_markers.real_pair_first`, after any shuffling
    plugin has reordered). When the selected tests start servers (any has a server marker:
    `server_markers`), start the preloaded zygote now (`sglang_ssd/launch/zygote.py`): its import
    of SGLang runs beside the first tests, and every `eval.servers.Server` of the session is
    then forked from it instead of importing SGLang again (~18 s of CPU a start-up on a 2-core
    AVX2 EPYC). `SGLANG_SSD_ZYGOTE=0` keeps exec'd launchers; a socket path already in
    `SGLANG_SSD_ZYGOTE` is used as it is."""
    server_markers.real_pair_first(session.items)  # after any shuffling plugin's reorder
    starts_servers = any(map(server_markers.server_marked, session.items))
    if zygote.ADDRESS_ENV in os.environ or not starts_servers:
        return
    folder = Path(_zygote.enter_context(tempfile.TemporaryDirectory(prefix="zygote-")))
    _zygote.enter_context(zygote.running(folder / "zygote.sock", folder / "zygote.log"))
    os.environ[zygote.ADDRESS_ENV] = str(folder / "zygote.sock")
    _zygote.callback(os.environ.pop, zygote.ADDRESS_ENV, None)


def pytest_sessionfinish(session: pytest.Session) -> None:
    _zygote.close()


@pytest.fixture(scope="session")
def sglang_world() -> Iterator[None]:
    """SGLang's single-rank CPU world (`sglang_cpu.sglang_world`: gloo, its model-parallel
    groups and runtime context), once per session: SGLang's own Python run in the test process
    needs it."""
    from sglang_cpu import sglang_world as world

    with world():
        yield


@pytest.fixture(scope="session")
def tiny_pair_stats(tmp_path_factory: pytest.TempPathFactory) -> PairStats:
    """The tiny pair, trained on the fly (seconds), and what a greedy SSD run on it exercised.

    The pair (folders in `.paths`: target, draft) is checked here, before any test uses them:
    varied greedy output, accept length in [1.5, γ], cache hit rate in [0.2, 0.95], hits at
    k < γ and k = γ, rounds from cache, jit and ngram drafts (`sglang_ssd.testing.pair_stats`).
    A degenerate pair fails every test that uses it, with the measured numbers.
    """
    target, draft = make_trained_pair(tmp_path_factory.mktemp("tiny-pair"))
    return check_pair(target, draft)


@pytest.fixture(scope="session")
def tiny_pair(tiny_pair_stats: PairStats) -> tuple[Path, Path]:
    """(target, draft) folders of the checked tiny pair (see `tiny_pair_stats`)."""
    assert tiny_pair_stats.paths is not None
    return tiny_pair_stats.paths


@pytest.fixture(scope="session")
def tiny_target(tiny_pair: tuple[Path, Path]) -> Path:
    """The tiny pair's target: 2 layers, fp32, trained on the procedural corpus."""
    return tiny_pair[0]


@pytest.fixture(scope="session")
def tiny_draft(tiny_pair: tuple[Path, Path]) -> Path:
    """The tiny pair's draft: 1 layer, trained for fewer steps (agrees with the target in part)."""
    return tiny_pair[1]


@pytest.fixture(scope="session")
def tiny_eagle3_head(
    tiny_target: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict]:
    """(folder, manifest) of an EAGLE-3 head trained for the tiny target by our trainer
    (`sglang_ssd.build.eagle3_head`, 3000 steps on procedural text: 33 s of training on the AMX
    Xeon). The target has 2 layers, so the head reads 2 features: the embeddings and layer 1's
    input (aux ids -1 and 0). Served accept length (tests/integration/test_ssd_head_server.py,
    bar 1.2) on the AMX Xeon by steps: 1000: 1.20, 1500: 1.19, 2000: 1.23, 2500: 1.29, 3000:
    1.36 (the offline γ-chain accept length stays 2.0-2.3 throughout: it reads the target's
    features at every position, while a served draft feeds back its own hidden past the last
    verified token)."""
    from sglang_ssd.build import eagle3_head, train
    from sglang_ssd.testing.corpus import tiny_corpus

    out = tmp_path_factory.mktemp("eagle3") / "eagle3-tiny"
    texts = [(f"tiny-{i}", tiny_corpus(num_chars=4000, seed=100 + i)) for i in range(12)]
    # A fixed step count (the minutes only cap it), so that the head, and every test that
    # uses it, is the same however loaded the machine is.
    spec = eagle3_head.BuildSpec(
        minutes=4.0, draft_vocab=64, seq_len=128, heldout_chars=8000, aux_layer_ids=(-1, 0),
        milestones=(0.15,), train=train.TrainSpec(lr=3e-3, warmup=10, max_steps=3000),
    )  # fmt: skip
    return out, eagle3_head.build(tiny_target, out, spec, texts=texts, progress=False)


@pytest.fixture(scope="session")
def tiny_servers(
    tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, eval_servers.Server]]:
    """The tiny pair's shared AR and SSD servers (`tiny_servers.py` has their flags), started
    side by side on first use and stopped when the session ends."""
    from tiny_servers import shared_servers

    with eval_servers.started_together(
        shared_servers(*tiny_pair, tmp_path_factory.mktemp("tiny-servers"))
    ) as made:
        yield dict(made)


@pytest.fixture(scope="session")
def keyed_pool(
    tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KeyedPool]:
    """The tiny pair's SSD servers with API keys (`keyed_servers.py`), shared by the auth and
    shutdown modules, started on first use; whatever still runs is stopped when the session
    ends."""
    from keyed_servers import KeyedPool

    pool = KeyedPool(*tiny_pair, tmp_path_factory.mktemp("keyed-servers"))
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="session")
def tiny_ar(tiny_servers: dict[str, eval_servers.Server]) -> eval_servers.Server:
    """The session's shared autoregressive server of the tiny target."""
    return tiny_servers["ar"]


@pytest.fixture
def tiny_ssd(tiny_servers: dict[str, eval_servers.Server]) -> Iterator[eval_servers.Server]:
    """The session's shared SSD server of the tiny pair; live settings a test changes are set
    back after it (`tiny_servers.restore_live_settings`)."""
    from tiny_servers import restore_live_settings

    with restore_live_settings(tiny_servers["ssd"]) as server:
        yield server
