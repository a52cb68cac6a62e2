"""Registers `--speculative-algorithm SSD` with SGLang (placeholder until SSD mode lands)."""

from __future__ import annotations


def register_ssd() -> None:
    """Register the SSD algorithm name with SGLang's speculative registry."""
