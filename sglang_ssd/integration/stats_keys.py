"""The `/ssd/stats` keys and what each holds, declared once.

`admin.stats` builds the reply; the tests pin its keys to these declarations
(`tests/integration/test_api_units.py`), and `scripts/render_docs.py` renders them into
docs/stats.md. Seconds are wall-clock seconds; "per round" means per speculative decode round.
"""

from __future__ import annotations

# In every reply of a leading rank: the target's `RoundStats`, the planner, the miss policy and
# the round balance.
TOP: dict[str, str] = {
    "rounds": "speculative decode rounds verified",
    "request_rounds": "request-rounds (Σ batch sizes) of those rounds",
    "avg_wait_draft_s": "seconds per round the target waited for drafts",
    "avg_verify_s": "seconds per round from drafts in hand to the round recorded",
    "avg_forward_s": "seconds per round building the verify batch and running its forward",
    "accept_length": "tokens per request-round, the bonus token included",
    "cache_hit_rate": "fraction of request-rounds whose draft was a speculation-cache hit",
    "rounds_by_source": "request-rounds by draft source: `cache`, `jit`, `ngram`, `random`, "
    "`local-ngram` (the target's own n-gram draft when the speculator has none)",
    "accepted_by_source": "accepted draft tokens by draft source",
    "target_phases": "the target's seconds per round by phase (wait_draft, build_batch, "
    "forward, verify, commit, record, scheduler)",
    "dp_rank": "the DP replica that answered (0 without DP)",
    "ssd_mode": "the `--ssd-mode` served",
    "speculator": "the speculator's, the link's and the planner's counters, one key each "
    "(a dict field `f` as `f_<key>`; see below)",
    "plain_rounds": "the plain rounds' own figures (the averages above cover speculative "
    "rounds only)",
    "speculator_phases": "the speculator's seconds per round by phase (prefill, jit, glue, "
    "tree_1..tree_D, lm_head, sampling, populate, lookup, pack, send, `*_other`)",
    "speculator_round_s": "the speculator's seconds per round",
    "target_round_s": "the target's seconds per round, waiting for drafts left out",
    "t_p": "speculator_round_s / target_round_s: the speculator keeps up when ≤ 1 (under "
    "`--ssd-mode sync` the chain draft's time over the verify's)",
    "fallback": "the cache-miss policy (below)",
    "arrangements": "the core planner's choice per batch-size bucket (below)",
}
# Once the speculator has answered a stats request.
SPECULATOR: dict[str, str] = {
    "avg_speculator_build_s": "seconds per Step the speculator spent pre-speculating",
    "avg_speculator_lookup_s": "seconds per Step looking up outcomes in the cache",
    "avg_speculator_backup_s": "seconds per Step drafting backups on misses",
    "avg_speculator_send_s": "seconds per Step sending the drafts",
    "avg_transport_s": "the same figure as `avg_speculator_send_s` (its first name)",
    "faults": "speculator faults (timeouts, crashes) since start",
    "restarts": "speculator restarts since start",
    "speculator_up": "whether the speculator is serving now",
}
# From SGLang's scheduler, when the admin bridge of a running server passes it.
SCHEDULER: dict[str, str] = {
    "target_running": "requests the target is decoding",
    "target_waiting": "requests queued",
}
PLAIN_ROUNDS: dict[str, str] = {
    "rounds": "plain rounds (the target alone, one token per request)",
    "request_rounds": "request-rounds of those rounds",
    "avg_forward_s": "seconds per plain round in the forward",
    "target_phases": "seconds per plain round by phase",
}
ARRANGEMENTS: dict[str, str] = {
    "offered": "the arrangements `--ssd-mode` lets the planner run here, in calibration order",
    "switches": "switches of the arrangement held since start",
    "buckets": "per batch-size bucket (its upper size as a string): the arrangement `held` "
    '("" while it calibrates); per arrangement measured, `round_s` (median of its recent rounds), '
    "`tokens` (per request per round, from the shared figures), `rate`, `rounds`; and the async "
    "`hit_rate` those figures use",
}
FALLBACK: dict[str, str] = {
    "backup": "the `--ssd-backup` setting",
    "batch_threshold": "b* in force: the smallest batch size that leaves the just-in-time "
    "draft for a fast backup (null when none does)",
    "auto_batch_threshold": "the b* `auto` would pick from the current measurements",
    "p_hit": "the measured cache hit rate the policy uses",
    "alpha_hit": "the acceptance rate α on cache hits",
    "backups": "per backup: `alpha`, `latency_s` and `observations` (rounds measured; 0: "
    "the starting guess of `saguaro/draft_kinds.py`)",
}
# Keys renamed since they were first served, and why.
RENAMED: dict[str, str] = {
    "fallback.mode": "now `fallback.backup`: it is the `--ssd-backup` setting, and read as the "
    "SSD mode it misled (`ssd_mode` names the mode)",
}
