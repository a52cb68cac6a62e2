"""Move CPU cores between the target and the speculator for one round
(docs/design.md#cores-and-devices).

On CPU the target and the speculator each own cores (`sglang_ssd.launch.placement`). The planner's
arrangement (`round_mode.Arrangement`) says where a round runs; this module moves the cores:

- a sync or plain round's verify (and a prefill the planner lends cores to):
  `CoreLending.lent(pid)` stops the speculator process (SIGSTOP: it freezes at once,
  mid-forward if need be, and resumes exactly there), pins every thread of the target to its
  cores plus the speculator's with as many torch threads, runs the forward, then pins the
  target back and continues the speculator (SIGCONT), also when the forward raises;
- a sync round's just-in-time draft: the Step carries `sync_draft_cpus` (every core both hold)
  and the speculator widens itself likewise for that draft and pins back before it replies
  (`speculator.server`), while the target waits for the drafts.

Idle thread pools do not spin on the other process's cores: a stopped process runs nothing,
and torch's OpenMP (GNU libgomp in the CPU wheels) spins at most `GOMP_SPINCOUNT` iterations
(well under a millisecond) after a parallel region before it sleeps, unless OMP_WAIT_POLICY is
ACTIVE, which `omp_wait_problem` reports at startup.

Cost: two signals and one `sched_setaffinity` per thread of the scheduler process each way,
about a millisecond in all (measured by `eval`'s plain-round benchmark, not asserted). While
the speculator is stopped it answers nothing, so callers hold the speculator client's lock
(admin requests wait for the forward). If the target dies in that window the stopped
speculator is killed with SGLang's process tree (SIGKILL ends stopped processes too).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Iterator, Sequence

from sglang_ssd.launch.placement import widened

logger = logging.getLogger(__name__)


class CoreLending:
    """Moves the speculator's cores to the target around a forward.

    Args:
        target_cpus: the target's own cores; empty on GPU (then `lent` only runs the forward).
        draft_cpus: the speculator's cores; those the target does not own are lent (on one
            core they share it: the speculator is only stopped).
    """

    def __init__(self, target_cpus: Sequence[int], draft_cpus: Sequence[int]) -> None:
        self.target_cpus = sorted(set(target_cpus))
        self.draft_cpus = sorted(set(draft_cpus) - set(target_cpus))
        self.lends = 0

    @property
    def sync_draft_cpus(self) -> list[int]:
        """The cores a sync round's draft runs on: every core either process holds (empty on
        GPU: nothing moves there)."""
        if not self.enabled:
            return []
        return sorted(set(self.target_cpus) | set(self.draft_cpus))

    @property
    def enabled(self) -> bool:
        """True on CPU placements (there is a core to free, even one the two share)."""
        return bool(self.target_cpus)

    @contextlib.contextmanager
    def lent(self, speculator_pid: int | None) -> Iterator[None]:
        """Within the block the target runs on all its and the speculator's cores and the
        speculator (`speculator_pid`, None while it is down) is stopped.

        Raises:
            Whatever the block raises, after the cores are given back.
        """
        if not self.enabled:
            yield
            return
        stopped = _signal(speculator_pid, signal.SIGSTOP)
        try:
            with widened(self.target_cpus, self.draft_cpus):
                self.lends += 1
                yield
        finally:
            if stopped:
                _signal(speculator_pid, signal.SIGCONT)


def _signal(pid: int | None, sig: signal.Signals) -> bool:
    """Send `sig` to `pid`; False when there is no such process (it exited)."""
    if pid is None:
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    except PermissionError as exc:  # not ours: never stop what we cannot continue
        logger.warning("SSD: cannot signal speculator pid %d: %s", pid, exc)
        return False
    return True


def omp_wait_problem(environ: dict[str, str] | None = None) -> str | None:
    """Why the OpenMP settings in `environ` (default: this process's) would let idle thread
    pools spin on cores the other process is using, or None."""
    env = os.environ if environ is None else environ
    if env.get("OMP_WAIT_POLICY", "").strip().upper() == "ACTIVE":
        return (
            "OMP_WAIT_POLICY=ACTIVE makes idle OpenMP threads spin: while the target and the "
            "speculator take turns on the same cores (sync and plain rounds) each slows the "
            "other; unset it or use PASSIVE"
        )
    return None
