"""FallbackPolicy: per-batch choice and the threshold b* (Theorem 17)."""

from __future__ import annotations

import pytest

from sglang_ssd.saguaro import Backup, BackupStats, FallbackPolicy, alpha_from_accept_length
from sglang_ssd.saguaro.acceptance import expected_accept_length


def policy(jit_latency: float = 0.05, p_hit: float = 0.9, **kwargs) -> FallbackPolicy:
    """Seconds: verify 0.45 s, speculator 0.4 s, JIT = gamma fast draft forwards, n-gram ~ 0."""
    backups = {
        Backup.JIT: BackupStats(alpha=0.9, latency=jit_latency),
        Backup.NGRAM: BackupStats(alpha=0.55, latency=0.002),
        Backup.RANDOM: BackupStats(alpha=0.02, latency=0.0005),
    }
    args = dict(lookahead=4, p_hit=p_hit, alpha_hit=0.88, t_verify=0.45, t_spec=0.4)
    args.update(kwargs)
    return FallbackPolicy(backups=backups, **args)


def brute_force_threshold(pol: FallbackPolicy, limit: int = 5000) -> int | None:
    return next((b for b in range(1, limit) if pol.choose(b) != Backup.JIT), None)


def test_choice_switches_once_at_b_star() -> None:
    pol = policy()
    b_star = pol.batch_threshold()
    assert b_star is not None and b_star > 1
    assert b_star == brute_force_threshold(pol)
    assert all(pol.choose(b) == Backup.JIT for b in range(1, b_star))
    assert all(pol.choose(b) != Backup.JIT for b in range(b_star, b_star + 500))
    assert pol.choose(b_star) == max(
        (Backup.NGRAM, Backup.RANDOM), key=lambda x: pol.speedup(x, b_star)
    )


@pytest.mark.parametrize("p_hit", [0.3, 0.6, 0.9, 0.97, 0.99])
def test_b_star_falls_as_jit_gets_slower(p_hit: float) -> None:
    latencies = (0.02, 0.05, 0.1, 0.2, 0.4, 0.8)
    thresholds = [policy(latency, p_hit).batch_threshold() for latency in latencies]
    as_numbers = [float("inf") if t is None else t for t in thresholds]
    assert as_numbers == sorted(as_numbers, reverse=True)
    for latency, b_star in zip(latencies, thresholds, strict=True):
        assert b_star == brute_force_threshold(policy(latency, p_hit))


def test_never_switching_and_always_switching() -> None:
    useless = policy()
    useless.backups = {Backup.JIT: BackupStats(0.9, 0.1), Backup.NGRAM: BackupStats(0.1, 0.2)}
    assert useless.batch_threshold() is None and brute_force_threshold(useless) is None
    free_and_good = policy()
    free_and_good.backups[Backup.NGRAM] = BackupStats(alpha=0.95, latency=0.0)
    assert free_and_good.batch_threshold() == 1 and free_and_good.choose(1) == Backup.NGRAM


def test_overrides() -> None:
    assert policy(mode="ngram").choose(1) == Backup.NGRAM
    assert policy(mode="ngram").batch_threshold() == 1
    assert policy(mode=Backup.JIT).choose(10_000) == Backup.JIT
    assert policy(mode="jit").batch_threshold() is None
    fixed = policy(batch_threshold_override=8)
    assert fixed.batch_threshold() == 8
    assert fixed.choose(7) == Backup.JIT and fixed.choose(8) in (Backup.NGRAM, Backup.RANDOM)


def test_observe_moving_averages() -> None:
    pol = policy(ema_weight=0.5)
    pol.observe(hit_rate=0.0, t_verify=0.55, t_spec=0.6)
    assert pol.p_hit == pytest.approx(0.45)
    assert pol.t_verify == pytest.approx(0.5) and pol.t_spec == pytest.approx(0.5)
    pol.observe(accept_length_hit=5.0)
    assert pol.alpha_hit == pytest.approx(0.5 * 0.88 + 0.5 * 1.0)
    # A miss option's starting guess weighs as one round: averaged evenly with the first ones.
    guess = expected_accept_length(0.55, 4)
    pol.observe(backup=Backup.NGRAM, accept_length_backup=2.0, t_backup=0.004)
    ngram = pol.backups[Backup.NGRAM]
    assert ngram.alpha == pytest.approx(alpha_from_accept_length((guess + 2.0) / 2, 4))
    assert ngram.latency == pytest.approx(0.003)
    pol.observe(backup=Backup.NGRAM, accept_length_backup=1.0, t_backup=0.002)  # weight 0.5
    assert ngram.alpha == pytest.approx(alpha_from_accept_length(((guess + 2) / 2 + 1) / 2, 4))
    assert ngram.latency == pytest.approx(0.0025)
    assert pol.backups[Backup.NGRAM].observations == 2
    fresh = FallbackPolicy(4, 0.8, 0.9, 0.45, 0.4, {Backup.JIT: BackupStats(0.9, 0.5)})
    fresh.observe(backup="random", accept_length_backup=1.01, t_backup=0.001)
    assert Backup.RANDOM in fresh.backups
    with pytest.raises(ValueError):
        fresh.observe(accept_length_backup=2.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(mode="fastest"),
        dict(p_hit=1.5),
        dict(t_verify=0.0),
        dict(t_spec=-1.0),
        dict(lookahead=0),
        dict(ema_weight=0.0),
        dict(batch_threshold_override=0),
    ],
)
def test_invalid_policies(kwargs) -> None:
    with pytest.raises(ValueError):
        policy(**kwargs)
    with pytest.raises(ValueError):
        FallbackPolicy(4, 0.8, 0.9, 0.45, 0.4, {})


def test_a_rarely_measured_backup_forgets_its_starting_guess() -> None:
    """The 2-core AMX Xeon at batch 1 (seconds): the just-in-time draft took 0.22 s where the
    starting guess said 0.5 s, measured only on new requests' first rounds. Three such rounds
    must be enough for the policy to see that it pays on a miss; at weight 0.1 the guess held
    it at 0.43 s and batch 1 kept the n-gram backup (its drafts accept 1.5 tokens, a
    just-in-time chain about 3)."""
    backups = {
        Backup.JIT: BackupStats(alpha=0.8, latency=0.5),  # `draft_kinds` starting guesses
        Backup.NGRAM: BackupStats(alpha=0.08, latency=0.002, observations=50),
    }
    pol = FallbackPolicy(4, p_hit=0.72, alpha_hit=0.72, t_verify=0.52, t_spec=0.46,
                         backups=backups)  # fmt: skip
    assert pol.choose(1) == Backup.NGRAM  # the guessed 0.5 s costs more than it brings
    for _ in range(3):
        pol.observe(backup=Backup.JIT, accept_length_backup=3.0, t_backup=0.22)
    jit = pol.backups[Backup.JIT]
    assert jit.latency == pytest.approx((0.5 + 3 * 0.22) / 4) and jit.observations == 3
    assert pol.choose(1) == Backup.JIT and pol.batch_threshold() > 1
    for _ in range(6):  # the guess and nine rounds: from now on each moves it by ema_weight
        pol.observe(backup=Backup.JIT, t_backup=0.22)
    before = jit.latency
    pol.observe(backup=Backup.JIT, t_backup=before + 1.0)
    assert jit.latency == pytest.approx(before + 0.1 * 1.0)


def test_one_warm_up_round_does_not_erase_a_guess() -> None:
    """The server's startup warm-up (one round on a 6-token prompt) accepted nothing from its
    n-gram draft: when a first round replaced the guess, the n-gram backup's alpha was 0."""
    pol = policy()
    pol.observe(backup=Backup.NGRAM, accept_length_backup=1.0, t_backup=0.0003)
    assert 0.2 < pol.backups[Backup.NGRAM].alpha < 0.55


def test_backup_alpha_is_solved_from_the_average_accept_length() -> None:
    """Batch 1 on the AMX Xeon, MT-Bench second turns: five just-in-time rounds accepted all
    four draft tokens twice and none three times (2.6 tokens a round). Averaging each round's
    alpha (1, 1, 0, 0, 0) gave 0.4, and the policy kept the n-gram backup; E^-1(2.6) = 0.65."""
    backups = {
        Backup.JIT: BackupStats(alpha=0.8, latency=0.5),
        Backup.NGRAM: BackupStats(alpha=0.18, latency=0.002, observations=50),  # measured
    }
    pol = FallbackPolicy(4, p_hit=0.7, alpha_hit=0.72, t_verify=0.45, t_spec=0.4,
                         backups=backups)  # fmt: skip
    for tokens in (5.0, 5.0, 1.0, 1.0, 1.0):
        pol.observe(backup=Backup.JIT, accept_length_backup=tokens, t_backup=0.22)
    jit = pol.backups[Backup.JIT]
    mean = (expected_accept_length(0.8, 4) + 13.0) / 6  # the guess weighs as one round
    assert jit.accept_length == pytest.approx(mean)
    assert jit.alpha == pytest.approx(alpha_from_accept_length(mean, 4)) and jit.alpha > 0.6
    assert pol.choose(1) == Backup.JIT
