"""The arrangements of the cores a decode round can run (`--ssd-mode`), and which a device offers.

- async (SSD): the target verifies on its own cores while the speculator pre-speculates the
  next round's outcomes on its own (docs/design.md#the-two-processes);
- sync (synchronous SD on every core): the speculator drafts a chain of γ tokens just in time
  on every core both processes hold, then it is stopped and the target verifies on all of them;
- plain: the target alone on every core (the speculator stopped), one token per request: a
  TARGET_VERIFY forward of one position per request, the token sampled from p (Theorem 1 with
  an empty draft).

Output is exact under each (the verify samples against the q the speculator sent). On a GPU no
core moves: a plain round's one-position verify is refused there (`mode_refusal`) and `auto`
offers async alone (`offered`); a fixed `sync` runs the just-in-time draft on the speculator's
device (the synchronous baseline).
"""

from __future__ import annotations

import enum

from sglang_ssd.config import MODES


class Arrangement(enum.StrEnum):
    """Where a decode round's draft and verify run (module docstring)."""

    ASYNC = "async"
    SYNC = "sync"
    PLAIN = "plain"


class RoundMode(str, enum.Enum):
    """What a round's verify forward holds: γ + 1 positions per request, or the root alone."""

    SPECULATE = "speculate"
    PLAIN = "plain"


def round_mode(arrangement: Arrangement) -> RoundMode:
    """The verify of a round run as `arrangement`: plain rounds verify the root alone."""
    return RoundMode.PLAIN if arrangement == Arrangement.PLAIN else RoundMode.SPECULATE


def on_cpu(target_device: str) -> bool:
    """Whether the target runs on the CPU (its device string starts with "cpu")."""
    return str(target_device).startswith("cpu")


def mode_refusal(setting: str, target_device: str) -> str | None:
    """Why `--ssd-mode setting` cannot serve a target on `target_device`, or None.

    Off the CPU a plain round's TARGET_VERIFY forward has one query row per request, while
    SGLang's CUDA attention backends build verify metadata for the static width
    `speculative_num_draft_tokens` (γ + 1): FA3, the default on Hopper, sets `cu_seqlens_q` in
    steps of it (sglang/srt/layers/attention/flashattention_backend.py,
    `init_forward_metadata`, target verify with topk <= 1), so rows would be read out of bounds
    or attend to another request's KV. So `plain` is refused there; `auto` offers async alone.
    """
    if setting not in MODES:
        return f"--ssd-mode must be one of {', '.join(MODES)}, got {setting!r}"
    if setting != Arrangement.PLAIN or on_cpu(target_device):
        return None
    return (
        f"--ssd-mode plain is not supported on {target_device}: a plain round verifies one "
        "position per request, and SGLang's CUDA attention backends (FA3) build the verify "
        "metadata for γ + 1 positions; use auto, async or sync"
    )


def offered(setting: str, target_device: str) -> tuple[Arrangement, ...]:
    """The arrangements `--ssd-mode setting` lets the planner choose from on `target_device`:
    the fixed one, or with `auto` all three on the CPU (sync first: the prior on a 2-core CPU,
    where it measured fastest at batch 1) and async alone elsewhere (no core to move, and no
    one-position verify).

    Raises:
        ValueError: on a setting `mode_refusal` refuses.
    """
    refusal = mode_refusal(setting, target_device)
    if refusal is not None:
        raise ValueError(refusal)
    if setting != "auto":
        return (Arrangement(setting),)
    if on_cpu(target_device):
        return (Arrangement.SYNC, Arrangement.ASYNC, Arrangement.PLAIN)
    return (Arrangement.ASYNC,)
