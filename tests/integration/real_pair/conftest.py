"""The package's shared servers: the real target served autoregressively (`ar_server`) and by SSD
with default flags (`ssd_server`; `pair.shared_servers` has their flags), started together (in
the background as the session begins: `tests/conftest.py`, `prestart_servers`) and stopped after
the package.

CI runs the package's smoke (every test not marked `real`); `make test-real` runs the rest."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import prestart
import pytest

from eval.servers import Server

from .pair import real_pair, shared_servers


@pytest.fixture(scope="package")
def pair() -> tuple[Path, Path]:
    """(target, draft) model folders, pulled when absent."""
    return real_pair()


@pytest.fixture(scope="package")
def servers(
    pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Server]]:
    """The package's two servers (`pair.shared_servers`), started side by side."""

    def make() -> dict[str, Server]:
        return shared_servers(*pair, tmp_path_factory.mktemp("real-pair-logs"))

    with prestart.taken("real-pair", make) as made:
        yield dict(made)


@pytest.fixture(scope="package")
def ar_server(servers: dict[str, Server]) -> Server:
    """The target alone (see `pair.shared_servers`)."""
    return servers["ar"]


@pytest.fixture(scope="package")
def ssd_server(servers: dict[str, Server]) -> Server:
    """SSD with the launcher's defaults (see `pair.shared_servers`)."""
    return servers["ssd"]
