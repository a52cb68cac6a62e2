"""Every kind of draft a round can verify besides a cache hit: one record each, the one home of
that vocabulary (docs/design.md#who-decides-the-fallback; paper Theorem 17).

A round's draft comes from the speculation cache (a hit) or, on a miss, from a backup: the
speculator's primary draft just in time ("jit") or a fast point-mass draft ("ngram", "random"),
chosen per batch by `saguaro.fallback.FallbackPolicy`; or the target's own n-gram
("local-ngram") when the speculator has nothing for the request. Everything that lists kinds
derives its list from `KINDS` here: the `--ssd-backup` choices (`config.BackupChoice`), the
policy's options (`fallback.Backup`), the wire's `StepBackup` and `DraftSource`, the TP broadcast's
source codes (`worker.tp_sync.SOURCES`), the per-request counters (`request_metrics`) and the
speculator's proposers. A new kind is one record here plus its proposer where the record names
one (`tests/saguaro/test_draft_kinds.py` adds a dummy and checks that every list sees it).

Pure Python: no torch, no SGLang.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DraftKind:
    """One kind of non-cache draft.

    Attributes:
        name: the value on the wire, in `--ssd-backup`, `meta_info.ssd_backup_rounds` and
            `/ssd/stats` (lowercase, `-` allowed).
        proposer: what produces it: "draft" (the speculator's primary draft model), "ngram"
            (an n-gram over the request's own tokens), "random" (uniform tokens); the producer
            of a `speculator` kind is looked up by this name.
        point_mass: its drafts carry no q: verification treats each draft token as certain
            (q = one-hot), which is exact (docs/design.md#point-mass-drafts).
        speculator: the speculator produces it on a miss, as the Step's backup; False for the
            target's own fallback (never on the wire, never a `--ssd-backup` value).
        prior_alpha: the fallback policy's per-token acceptance before any measurement, in
            [0, 1] (speculator kinds; replaced by moving averages of measured rounds).
        prior_latency_s: the policy's time for one γ-token draft before any measurement, in
            seconds (speculator kinds).
    """

    name: str
    proposer: str
    point_mass: bool
    speculator: bool
    prior_alpha: float = 0.0
    prior_latency_s: float = 0.0


KINDS: tuple[DraftKind, ...] = (
    DraftKind("jit", "draft", point_mass=False, speculator=True, prior_alpha=0.8,
              prior_latency_s=0.5),
    DraftKind("ngram", "ngram", point_mass=True, speculator=True, prior_alpha=0.3,
              prior_latency_s=0.002),
    DraftKind("random", "random", point_mass=True, speculator=True, prior_alpha=0.01,
              prior_latency_s=0.001),
    DraftKind("local-ngram", "ngram", point_mass=True, speculator=False),
)  # fmt: skip
# The primary draft just in time: the policy's reference option, which other options must beat.
JIT = "jit"
# The target's own fallback for a request the speculator has nothing for.
LOCAL_NGRAM = "local-ngram"
# Sources that are not a backup: a cache hit, and a round verified without speculation.
CACHE = "cache"
PLAIN = "plain"


def kind_names() -> tuple[str, ...]:
    """Every kind's name, in `KINDS` order."""
    return tuple(k.name for k in KINDS)


def backup_names() -> tuple[str, ...]:
    """The kinds the speculator produces on a miss (`--ssd-backup` values besides "auto")."""
    return tuple(k.name for k in KINDS if k.speculator)


def fast_backup_names() -> tuple[str, ...]:
    """The speculator's point-mass backups: what the policy weighs against JIT at large b."""
    return tuple(k.name for k in KINDS if k.speculator and k.point_mass)


def round_sources() -> tuple[str, ...]:
    """Every source a verified round's draft can have: the cache, each kind, a plain round."""
    return (CACHE, *kind_names(), PLAIN)


def kind(name: str) -> DraftKind:
    """The record named `name`.

    Raises:
        KeyError: for an unknown name (the message lists the known ones).
    """
    for k in KINDS:
        if k.name == name:
            return k
    raise KeyError(f"unknown draft kind {name!r}; known: {', '.join(kind_names())}")
