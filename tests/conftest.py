"""Shared fixtures: tiny random-weight models built once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_ssd.testing import TinySpec, make_tiny_model


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer tiny Qwen2 (fp32) used as a target."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-target"), TinySpec(seed=0))


@pytest.fixture(scope="session")
def tiny_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1-layer tiny Qwen2 sharing the target's tokenizer, different weights."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-draft"), TinySpec(num_layers=1, seed=1))
