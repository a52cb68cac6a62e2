"""The `/ssd/stats` keys users and `eval/` read, as sets: a rename fails the tests that compare
against them. Declared with their meanings in `sglang_ssd.integration.stats_keys`."""

from __future__ import annotations

from sglang_ssd.integration import stats_keys as declared

STATS_KEYS = frozenset(declared.TOP)
SPECULATOR_KEYS = frozenset(declared.SPECULATOR)
SCHEDULER_KEYS = frozenset(declared.SCHEDULER)
PLAIN_ROUNDS_KEYS = frozenset(declared.PLAIN_ROUNDS)
ARRANGEMENTS_KEYS = frozenset(declared.ARRANGEMENTS)
FALLBACK_KEYS = frozenset(declared.FALLBACK)
