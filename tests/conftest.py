"""Shared fixtures: tiny random-weight models built once per test session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sglang_ssd.testing import TinySpec, make_tiny_model

# The Triton reference kernels of tests/kernels run on Triton's CPU interpreter, which must be on
# when triton is first imported (it jits its own helpers then). Some test modules import SGLang,
# which imports triton, and may be collected first: import it here, before any of them.
sys.path.insert(0, str(Path(__file__).parent / "kernels"))
import sglang_source  # noqa: F401


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer tiny Qwen2 (fp32) used as a target."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-target"), TinySpec(seed=0))


@pytest.fixture(scope="session")
def tiny_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1-layer tiny Qwen2 sharing the target's tokenizer, different weights."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-draft"), TinySpec(num_layers=1, seed=1))
