"""The `/ssd/stats` keys users and `eval/` read (issue 29, item 4): a rename fails the tests that
compare against these sets, and goes into the README's list of renames with its reason."""

from __future__ import annotations

# Built from the target's `RoundStats`, the planner, the fallback policy and the round balance:
# present in every reply of a leading rank.
STATS_KEYS = frozenset(
    {
        "rounds",
        "request_rounds",
        "avg_wait_draft_s",
        "avg_verify_s",
        "avg_forward_s",
        "accept_length",
        "cache_hit_rate",
        "rounds_by_source",
        "accepted_by_source",
        "target_phases",
        "dp_rank",
        "speculator",
        "plain_rounds",
        "speculator_phases",
        "speculator_round_s",
        "target_round_s",
        "t_p",
        "fallback",
        "ssd_mode",
        "arrangements",
    }
)
# From the speculator's counters (present once the speculator answered a stats request).
SPECULATOR_KEYS = frozenset(
    {
        "avg_speculator_build_s",
        "avg_speculator_lookup_s",
        "avg_speculator_backup_s",
        "avg_speculator_send_s",
        "avg_transport_s",
        "faults",
        "restarts",
        "speculator_up",
    }
)
# From SGLang's scheduler (the admin bridge in a running server passes it).
SCHEDULER_KEYS = frozenset({"target_running", "target_waiting"})
PLAIN_ROUNDS_KEYS = frozenset({"rounds", "request_rounds", "avg_forward_s", "target_phases"})
ARRANGEMENTS_KEYS = frozenset({"offered", "switches", "buckets"})
FALLBACK_KEYS = frozenset(
    {"backup", "batch_threshold", "auto_batch_threshold", "p_hit", "alpha_hit", "backups"}
)
