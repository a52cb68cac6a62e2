"""Per-request SSD metrics in `meta_info`: `ssd_rounds`, `ssd_cache_hit_rate`, `ssd_backup_rounds`,
`ssd_plain_rounds`.

Path through SGLang (scheduler → detokenizer → tokenizer manager):
1. `SSDWorker` calls `worker.metrics.count_request_rounds` each decode round: every
   request's draft source (``cache`` or a backup kind) is counted on its `Req`.
2. The scheduler's output streamer (`SSDOutputStreamer`, chosen by a hook on
   `Scheduler.get_output_streamer_class`) attaches each emitted request's running totals to the
   batch output as the customized-info key ``ssd`` (SGLang's extension point for extra
   per-request output; one value per emitted request, not per token).
3. A hook on `TokenizerManager.update_request_meta_info` turns that snapshot into the scalar
   `meta_info` fields before SGLang's per-token accumulation sees it, so streamed chunks and the
   final response both carry the totals so far.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sglang_ssd.integration.registration import is_ssd
from sglang_ssd.saguaro.draft_kinds import CACHE, PLAIN, kind_names
from sglang_ssd.worker.metrics import snapshot

INFO_KEY = "ssd"
BACKUP_KINDS = kind_names()


def meta_info_fields(counts: dict[str, int]) -> dict[str, Any]:
    """The `meta_info` fields for a request's round counts by draft source.

    Returns:
        ``ssd_rounds`` (decode rounds), ``ssd_plain_rounds`` (those without speculation),
        ``ssd_cache_hit_rate`` (fraction of the speculative ones whose draft came from the
        speculation cache, 0.0 before any) and ``ssd_backup_rounds`` (speculative rounds
        drafted by each backup kind).
    """
    rounds = sum(counts.values())
    plain = counts.get(PLAIN, 0)
    backups = dict.fromkeys(BACKUP_KINDS, 0)
    backups.update({k: v for k, v in counts.items() if k not in (CACHE, PLAIN)})
    speculative = rounds - plain
    return {
        "ssd_rounds": rounds,
        "ssd_plain_rounds": plain,
        "ssd_cache_hit_rate": counts.get(CACHE, 0) / speculative if speculative else 0.0,
        "ssd_backup_rounds": backups,
    }


def output_streamer_class(base: type) -> type:
    """A subclass of SGLang's `SchedulerOutputStreamer` that emits the ``ssd`` snapshots."""

    class SSDOutputStreamer(base):
        """Adds each emitted request's SSD round counts to the batch output."""

        has_additional_customized_info = True

        def build_additional_customized_info(self, reqs: list[Any]) -> dict[str, list]:
            info = dict(super().build_additional_customized_info(reqs))
            info[INFO_KEY] = [snapshot(req) for req in reqs]
            return info

    return SSDOutputStreamer


def pick_output_streamer_class(original: Callable[..., type], scheduler: Any) -> type:
    """Hook (AROUND `Scheduler.get_output_streamer_class`): the SSD streamer on SSD servers.

    SGLang's Rust egress refuses extra per-request output, so it keeps the plain streamer.
    """
    base = original(scheduler)
    if not is_ssd(scheduler.spec_algorithm) or getattr(scheduler, "rust_server", None):
        return base
    return output_streamer_class(base)


def update_meta_info(
    original: Callable[..., None],
    manager: Any,
    meta_info: dict,
    state: Any,
    customized_info: dict,
    index: int,
    finish_reason: Any,
) -> None:
    """Hook (AROUND `TokenizerManager.update_request_meta_info`): ``ssd`` → scalar fields.

    The ``ssd`` key is taken out before SGLang's handler, which would accumulate it as a
    per-token list and slice it when streaming.
    """
    if INFO_KEY not in customized_info:
        original(manager, meta_info, state, customized_info, index, finish_reason)
        return
    counts = customized_info[INFO_KEY][index]
    if isinstance(counts, dict):
        meta_info.update(meta_info_fields(counts))
    rest = {k: v for k, v in customized_info.items() if k != INFO_KEY}
    if rest:
        original(manager, meta_info, state, rest, index, finish_reason)
