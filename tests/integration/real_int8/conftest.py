"""The int8 target's real-pair servers run in their own package, before `real_pair`'s shared
servers start: four real servers at once do not fit in 24 GB."""

from __future__ import annotations

from pathlib import Path

import pytest
from real_pair.pair import real_pair


@pytest.fixture(scope="package")
def pair() -> tuple[Path, Path]:
    """(target, draft) model folders, pulled when absent."""
    return real_pair()
