"""Tests on the real Qwen2.5-Coder pair (marked `integration`): one AR and one SSD server shared
by the package (`conftest.py`), stopped when its last test ends."""
