"""The KV pool's debug checks: on in tests and on the CPU, off when serving on CUDA (each
check reads device memory), `SGLANG_SSD_KV_POOL_DEBUG` overriding either way."""

from __future__ import annotations

import pytest
import torch

from sglang_ssd.speculator.kv_pool import DEBUG_ENV, KVPool, default_debug


def test_on_for_the_cpu_off_for_cuda_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    assert default_debug("cpu") and default_debug(torch.device("cpu"))
    assert not default_debug("cuda") and not default_debug("cuda:1")
    monkeypatch.setenv(DEBUG_ENV, "1")
    assert default_debug("cuda:0")
    monkeypatch.setenv(DEBUG_ENV, "0")
    assert not default_debug("cpu")
    monkeypatch.setenv(DEBUG_ENV, "yes")
    with pytest.raises(ValueError, match=DEBUG_ENV):
        default_debug("cpu")


def test_a_cpu_pool_checks_frees_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    pool = KVPool(1, 16, 1, 4, torch.float32)
    assert pool.debug
    slots = pool.alloc(2)
    pool.alloc(2)
    pool.free(slots)
    with pytest.raises(ValueError, match="double free"):
        pool.free(slots)
    assert not KVPool(1, 16, 1, 4, torch.float32, debug=False).debug
