"""Count the calls that make the host wait for the device: reads of tensor values on the host.

On a GPU each of these copies device memory to the host and so waits for every kernel queued
before it (a host sync): `.item()`, `.tolist()`, `.cpu()`, `.numpy()`, `bool()` / `int()` /
`float()` / `operator.index` of a tensor, `nonzero` / `argwhere` / `unique` / `masked_select` /
one-argument `where` (their output size is data-dependent), indexing with a bool tensor, and
`repeat_interleave` without `output_size`. `HostSyncCounter` counts them with a
`torch.overrides.TorchFunctionMode`, so it runs on the CPU: every tensor there is a host tensor,
so the count is an upper bound on the syncs the same code makes on a GPU (it also counts reads of
tensors that stay on the host when serving on CUDA). Blocking host-to-device copies also wait on
a GPU; they are not counted here. Phase-timer synchronisations are counted when the clock is
given `HostSyncCounter.device_sync` as its sync.

The budgets are the most syncs one round may make on each side; `tests/test_host_syncs.py` (CPU)
and `tests/gpu/test_gpu_speculator.py` (CUDA) assert them, docs/cuda.md lists what they hold.

Imports with torch alone (tests/gpu imports it).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

# The most counted syncs one decode round may make (every read counted, so an upper bound on
# CUDA): the target's `SSDWorker._decode` of a 3-request batch (greedy and sampled rows) on a
# round that does not sample phases, and the speculator engine's hit round of 2 requests (apply
# the outcomes that hit, serve, build) with the KV pool's debug checks off, as served on CUDA.
# docs/cuda.md: what each budget holds, and which of its reads are device reads on CUDA.
TARGET_ROUND_BUDGET = 32
SPECULATOR_ROUND_BUDGET = 140

_ALWAYS = frozenset(
    {
        "item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__",
        "nonzero", "argwhere", "unique", "unique_consecutive", "masked_select",
    }
)  # fmt: skip
_PACKAGE = str(Path(__file__).resolve().parent)
_HERE = str(Path(__file__).resolve())


class HostSyncCounter(TorchFunctionMode):
    """A `with` block's host syncs, by operation and by the calling line of sglang_ssd code.

    Attributes:
        by_op: operation name -> count (``synchronize`` for phase-timer syncs).
        by_site: ``"path:line op"`` of the innermost sglang_ssd frame (or the test's) -> count.
    """

    def __init__(self) -> None:
        super().__init__()
        self.by_op: Counter[str] = Counter()
        self.by_site: Counter[str] = Counter()
        self._paused = False

    @property
    def total(self) -> int:
        """All syncs counted so far."""
        return sum(self.by_op.values())

    def reset(self) -> None:
        """Forget the counts (to count one round after warm-up rounds)."""
        self.by_op.clear()
        self.by_site.clear()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Count nothing inside the block (work that is not ours to count, e.g. SGLang's)."""
        self._paused = True
        try:
            yield
        finally:
            self._paused = False

    def device_sync(self) -> None:
        """A phase timer's sync (`PhaseTimer(sync=...)`): counted, and a real
        `torch.cuda.synchronize` when CUDA is in use."""
        self._count("synchronize")
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if not self._paused and _syncs(name, args, kwargs):
            self._count(name)
        return func(*args, **kwargs)

    def _count(self, name: str) -> None:
        if self._paused:
            return
        self.by_op[name] += 1
        self.by_site[f"{_caller()} {name}"] += 1

    def report(self) -> str:
        """The counts as lines ``count  site op``, most first (for assertion messages)."""
        return "\n".join(f"{n:4d}  {site}" for site, n in self.by_site.most_common())


def _syncs(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether `name` called with `args` reads device values on the host."""
    if name in _ALWAYS:
        return True
    if name == "where":
        return len(args) + len(kwargs) == 1
    if name in ("__getitem__", "__setitem__") and len(args) > 1:
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)
    if name == "repeat_interleave":
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
        return isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None
    return False


def _caller() -> str:
    """``path:line`` of the innermost frame in sglang_ssd outside this module, else the first
    frame outside torch (a test's own line)."""
    frame = sys._getframe(2)
    fallback = None
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(_PACKAGE) and path != _HERE:
            return f"{Path(path).relative_to(Path(_PACKAGE).parent)}:{frame.f_lineno}"
        if fallback is None and "/torch/" not in path and path != _HERE:
            fallback = f"{Path(path).name}:{frame.f_lineno}"
        frame = frame.f_back
    return fallback or "?"
