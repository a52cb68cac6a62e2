"""Each SSD setting two ways, for `GET /ssd/config`: as given (`settings_view`, which `POST
/ssd/config` takes back unchanged) and the value in force now (`in_force`, never None).

A setting left to the server (None in `SSDConfig`: the tree depth, b*, the speculator's device,
cores and pool) is given as "auto"; in force, it is what the server chose. A setting whose value
in force depends on the batch (`--ssd-mode auto`, `--ssd-backup auto`) is listed per batch size.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import msgspec

from sglang_ssd.config import SSDConfig
from sglang_ssd.launch.cpu_lists import format_cpu_list
from sglang_ssd.saguaro import Backup, FallbackPolicy

if TYPE_CHECKING:
    from sglang_ssd.worker.ssd_worker import SSDWorker

# How `GET /ssd/config` spells a setting left to the server (None in `SSDConfig`): the word
# `--ssd-batch-threshold` takes, and what `POST /ssd/config` reads back for `tree_depth`.
AUTO = "auto"


def settings_view(config: SSDConfig) -> dict[str, Any]:
    """Every setting by field name as `GET /ssd/config` shows it: as given (a flag's value, or
    changed since), "auto" where left to the server, `draft_cpus` as a CPU list. `POST
    /ssd/config` takes it back unchanged (`admin.parse_changes`)."""
    out = msgspec.to_builtins(config)
    if config.draft_cpus is not None:
        out["draft_cpus"] = format_cpu_list(config.draft_cpus)
    return {k: AUTO if v is None else v for k, v in out.items()}


def in_force(worker: SSDWorker) -> dict[str, Any]:
    """The value of every setting in force now, by field name, none None: where the setting
    leaves it to the server, what the server runs.

    mode: the one arrangement offered, else `{bucket: arrangement held}` per measured
    batch-size bucket ("calibrating" until one is held, and for the whole key before any
    round). tree_depth: D of the next build (`RoundPlanner.tree_depth`; 0 when sync only).
    backup: the forced one, else "jit" below b* and the fast backup from b* (``{"b<4": "jit",
    "b>=4": "ngram"}``). batch_threshold: b*, or "never" when no batch leaves JIT.
    draft_device, draft_cpus: the speculator's placement (a CPU list, empty on a GPU).
    draft_kv_tokens: the pool the speculator was given. draft_runtime: the runtime "auto"
    resolves to for this draft and device. The rest: as set.
    """
    config = worker.speculator_admin.config  # the settings, live changes included
    out = msgspec.to_builtins(config)
    planner = worker.planner
    offered = planner.arrangements.offered
    if len(offered) == 1:
        out["mode"] = str(offered[0])
    else:
        buckets = planner.arrangements.buckets()
        out["mode"] = {b: row["held"] or "calibrating" for b, row in buckets.items()} or (
            "calibrating"
        )
    out["tree_depth"] = planner.tree_depth
    try:
        out["batch_threshold"], out["backup"] = _backup_in_force(planner.policy)
    except Exception as exc:  # the scheduler thread may be updating its estimates
        out["batch_threshold"] = out["backup"] = f"unavailable ({type(exc).__name__}: {exc})"
    client = worker.speculator_client
    placement = client.supervisor.placement
    out["draft_device"] = placement.device
    out["draft_cpus"] = format_cpu_list(placement.cpus or ())
    out["draft_kv_tokens"] = client.config.draft_kv_tokens
    out["draft_runtime"] = runtime_in_force(
        config.draft_runtime, str(worker.draft_model_path), placement.device
    )
    return out


def _backup_in_force(policy: FallbackPolicy) -> tuple[int | str, str | dict[str, str]]:
    """(b* or "never", the backup in force: the forced one, or per side of b*)."""
    b_star = policy.batch_threshold()
    if policy.mode != "auto":
        backup = policy.mode.value if isinstance(policy.mode, Backup) else str(policy.mode)
        return (b_star if b_star is not None else "never"), backup
    if b_star is None:
        return "never", policy.choose(1).value
    below = {} if b_star <= 1 else {f"b<{b_star}": policy.choose(1).value}
    return b_star, {**below, f"b>={b_star}": policy.choose(b_star).value}


@functools.cache
def runtime_in_force(name: str, model_path: str, device: str) -> str:
    """The draft runtime `name` ("auto" or a runtime) means for this draft on `device`, as the
    speculator resolves it (`speculator.runtimes.resolve`; asked once)."""
    from sglang_ssd.speculator.runtimes import resolve

    try:
        return resolve(name, model_path, device)
    except (ValueError, OSError) as exc:
        return f"unresolved ({exc})"
