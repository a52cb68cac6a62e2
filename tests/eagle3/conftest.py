"""Fixtures of the EAGLE-3 tests: tiny targets built on the fly (SGLang's CPU world is the
session's `sglang_world`, tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_ssd.testing.tiny_models import TinySpec, make_tiny_model

FEATURE_LAYERS = 8  # deep enough for SGLang's default capture [2, L//2, L-3] = [2, 4, 5]


@pytest.fixture(scope="session")
def feature_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny Qwen2 target of `FEATURE_LAYERS` layers, fp32."""
    spec = TinySpec(num_layers=FEATURE_LAYERS, seed=3)  # TinySpec's widths are the heads'
    return make_tiny_model(tmp_path_factory.mktemp("feature-target"), spec)
