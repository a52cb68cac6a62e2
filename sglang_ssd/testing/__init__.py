"""Utilities for tests and examples: tiny random-weight models built on the fly."""

from sglang_ssd.testing.greedy import check_greedy, first_divergence
from sglang_ssd.testing.tiny_models import TinySpec, make_tiny_model

__all__ = ["TinySpec", "check_greedy", "first_divergence", "make_tiny_model"]
