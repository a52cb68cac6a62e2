"""The speculator's warm-up: one round at the serving shapes before it tells the target it is up.

The first forward of each kind pays one-time costs: on CUDA FlashInfer may JIT-compile its
kernels (through an `nvcc` child process) at its first `plan()`, cuBLAS picks its algorithms,
the caching allocator grows; on CPU oneDNN builds its primitives. Paid here, they land in the
startup wait, which the target judges by the progress of the speculator's process tree
(`worker.supervisor.SpeculatorProcess.cpu_seconds`), not inside the first serving round, whose
wait is bounded by `--ssd-speculator-timeout`.

The round is what a Step runs for one sampled (T > 0) request: its prompt's prefill, a
just-in-time draft of γ tokens (`SpeculatorEngine.serve` with the jit backup) and, in async
mode, the pre-speculation build of the next round (glue, fork F branches, tree decode of D
tokens; paper §4). Then the request is closed and every counter it moved is reset, so
`/ssd/stats` and the target's policies see serving rounds only.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

from sglang_ssd.saguaro import draft_kinds
from sglang_ssd.speculator.engine import SpeculatorEngine

logger = logging.getLogger(__name__)

WARMUP_RID = "__sglang_ssd_warmup__"
WARMUP_PROMPT_TOKENS = 16
# Test-only: seconds of a busy child process that the warm-up starts and waits for, standing in
# for a JIT compiler (the target must count its CPU time as the speculator's progress).
BUSY_CHILD_ENV = "SGLANG_SSD_TEST_WARMUP_CHILD_S"


def warm_up(engine: SpeculatorEngine) -> float | None:
    """Run one warm-up round on `engine` (see the module docstring) and undo its effects.

    Returns:
        The warm-up's wall seconds (device work included: the draft model's timers synchronise
        on CUDA), or None when it was skipped: a draft that reads the target's features
        (an EAGLE-3 head) has none to read before the first Step.

    Raises:
        Whatever the draft's forward raises (a broken kernel is better found before the link
        is up than by the first round).
    """
    start = time.perf_counter()
    _busy_child()
    if engine.model.uses_features:
        return None
    limit = engine.token_limit
    prompt = [(7 * i + 1) % limit for i in range(WARMUP_PROMPT_TOKENS)]
    engine.open(WARMUP_RID, prompt, temperature=1.0, top_k=-1, top_p=1.0, seed=0, prefill=True)
    try:
        engine.serve([WARMUP_RID], draft_kinds.JIT, engine.config.lookahead)
        if engine.config.mode == "async":
            engine.build([WARMUP_RID])
    finally:
        engine.close(WARMUP_RID)
        _reset_counters(engine)
    return time.perf_counter() - start


def _reset_counters(engine: SpeculatorEngine) -> None:
    """Forget what the warm-up round counted (phases, builds, degraded drafts)."""
    engine.phases.take()
    engine.build_forwards = 0
    engine.last_build_depth = 0
    engine.builds_by_depth.clear()
    engine.kv_exhausted_drafts = engine.kv_exhausted_builds = 0
    engine.prefill_backup_drafts = 0


def _busy_child() -> None:
    """Test-only (`BUSY_CHILD_ENV` set): start a child that spins for that many seconds and
    wait for it, as the speculator waits for an `nvcc` its first FlashInfer plan starts."""
    seconds = os.environ.get(BUSY_CHILD_ENV)
    if not seconds:
        return
    end = f"time.monotonic() + {float(seconds)}"
    code = f"import time\nend = {end}\nwhile time.monotonic() < end: pass"
    logger.info("speculator warm-up: waiting for a busy child for %s s", seconds)
    subprocess.run([sys.executable, "-c", code], check=True)
