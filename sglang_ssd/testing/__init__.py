"""Utilities for tests and examples: tiny random-weight models built on the fly."""

from sglang_ssd.testing.tiny_models import TinySpec, make_tiny_model

__all__ = ["TinySpec", "make_tiny_model"]
