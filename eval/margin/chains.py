"""Per-prompt measurement state (a chain of teacher-forced segments) and its JSON form.

A chain's `forced` tokens are the output so far, AR's token at every divergence, so the context
of output position i is ``prompt + forced[:i]``. Chains are saved after every segment and
restored by prompt id, which makes an interrupted run resumable.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eval.datasets import Prompt
from eval.margin.segments import Segment

GAP_DIGITS = 5  # logit units; bf16 logits are coarser than 1e-5


@dataclass
class Chain:
    """One prompt's measurement so far.

    Attributes:
        prompt: the chat-templated prompt.
        lossless: whether the prompt is one of `eval.lossless`'s set (others extend the count).
        forced: output tokens so far (AR's at divergences); the next request's prefix.
        segments: per request pair, its JSON summary (gaps rounded to `GAP_DIGITS`).
        differing: every position whose argmaxes differ, with `fp32_margin` once computed.
        tie_orders: positions where a top-1 logprob id was not the emitted token (`Segment`).
        done: no more segments (a stop, the token cap, or an unalignable pair).
    """

    prompt: Prompt
    lossless: bool
    forced: list[int] = field(default_factory=list)
    segments: list[dict[str, Any]] = field(default_factory=list)
    differing: list[dict[str, Any]] = field(default_factory=list)
    tie_orders: int = 0
    done: bool = False

    @property
    def positions(self) -> int:
        return sum(len(s["decode_gap"]) for s in self.segments)

    def add(self, seg: Segment, max_tokens: int) -> None:
        """Record a segment and extend `forced`; done at a stop or at `max_tokens` forced."""
        self.segments.append(
            {
                "start": seg.start,
                "reason": seg.reason,
                "decode_gap": [round(g, GAP_DIGITS) for g in seg.decode_gap],
                "verify_gap": [round(g, GAP_DIGITS) for g in seg.verify_gap],
            }
        )
        self.differing += [asdict(d) for d in seg.differing]
        self.tie_orders += seg.tie_orders
        self.forced += seg.appended
        self.done = seg.done or len(self.forced) >= max_tokens or not seg.appended

    def context(self, index: int) -> list[int]:
        """Token ids before output position `index`."""
        return [*self.prompt.input_ids, *self.forced[:index]]

    def to_json(self) -> dict[str, Any]:
        return {
            **self.prompt.describe(),
            "lossless": self.lossless,
            "positions": self.positions,
            "done": self.done,
            "tie_orders": self.tie_orders,
            "forced": self.forced,
            "differing": self.differing,
            "segments": self.segments,
        }

    def restore(self, saved: dict[str, Any]) -> None:
        """Take a saved state; raises ValueError if it was measured on other prompt tokens."""
        if saved["input_ids_sha256"] != self.prompt.fingerprint():
            raise ValueError(f"{self.prompt.id}: saved chain has other prompt tokens")
        self.forced = list(saved["forced"])
        self.segments = list(saved["segments"])
        self.differing, self.tie_orders = _differing_of(saved, self.forced, self.segments)
        self.done = bool(saved["done"])


def _differing_of(
    saved: dict[str, Any], forced: list[int], segments: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], int]:
    """A saved chain's differing positions and tie orders, one per diverged segment's end.

    Files written before "argmax" meant the emitted token compared top-1 logprob ids: they list
    exact ties as differing and can miss a divergence where a tie hid it. The divergences are
    the diverged segments' last measured positions; one the file missed gets AR's token from
    `forced` and -1 for SSD's (not kept).
    """
    by_index = {d["index"]: d for d in saved["differing"]}
    differing = []
    for seg in segments:
        if seg["reason"] != "diverged" or not seg["decode_gap"]:
            continue
        index = seg["start"] + len(seg["decode_gap"])
        differing.append(by_index.pop(index, None) or {
            "index": index, "decode": forced[index], "verify": -1,
            "decode_gap": seg["decode_gap"][-1], "verify_gap": seg["verify_gap"][-1],
        })  # fmt: skip
    return differing, int(saved.get("tie_orders", 0)) + len(by_index)


def make_chains(lossless: Sequence[Prompt], extra: Sequence[Prompt]) -> list[Chain]:
    """The lossless prompts' chains first, then the extra prompts'."""
    return [Chain(p, True) for p in lossless] + [Chain(p, False) for p in extra]


RUN_KEYS = ("command", "date", "settings", "servers", "measure_seconds")


def restore_all(chains: Iterable[Chain], path: Path) -> tuple[int, list[dict[str, Any]]]:
    """Restore chains from a results file written by `save`.

    Returns:
        (how many chains were found, the runs that wrote the file: each one's command, date,
        settings, servers and measuring seconds, earliest first).
    """
    if not path.exists():
        return 0, []
    body = json.loads(path.read_text())
    saved = {(c["dataset"], c["id"]): c for c in body["chains"]}
    found = 0
    for chain in chains:
        state = saved.get((chain.prompt.record.dataset, chain.prompt.id))
        if state is not None:
            chain.restore(state)
            found += 1
    runs = [*body.get("earlier_runs", []), {k: body[k] for k in RUN_KEYS if k in body}]
    return found, runs


def all_differing(chains: Iterable[Chain]) -> list[tuple[Chain, dict[str, Any]]]:
    """Every differing position with its chain."""
    return [(c, d) for c in chains for d in c.differing]


def save(path: Path, header: dict[str, Any], chains: Iterable[Chain]) -> None:
    """Write `header` plus every started chain, atomically (a temp file, then rename)."""
    body = {**header, "chains": [c.to_json() for c in chains if c.segments or c.done]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body, indent=None, separators=(",", ":")))
    tmp.replace(path)
