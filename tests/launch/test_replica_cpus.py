"""CPU cores per DP replica: the startup plan (`replica_cpus.plan_bind`, through
`registration.check_cpu_placement`) and each replica's split (`placement.place`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_ssd.config import SSDConfig
from sglang_ssd.integration.registration import check_cpu_placement
from sglang_ssd.launch import placement
from sglang_ssd.launch.placement import TargetGpus
from sglang_ssd.launch.replica_cpus import BIND_ENV, parse_bind, plan_bind, replica_cores

MACHINE = list(range(8))


def _replicas(dp: int, tp: int = 1) -> list[tuple[int, ...]]:
    gpus = TargetGpus(tp_size=tp, dp_size=dp)
    return [gpus.replica(r) for r in range(dp)]


def _plan(
    dp: int,
    cpus: list[int],
    env: dict[str, str] | None = None,
    tp: int = 1,
    draft_cpus: tuple[int, ...] | None = None,
    allow_shared: bool = False,
) -> str | None:
    return plan_bind(_replicas(dp, tp), draft_cpus, allow_shared, env or {}, cpus, MACHINE)


def test_unset_bind_cuts_the_cores_into_equal_blocks() -> None:
    assert _plan(2, [0, 1, 2, 3]) == "0-1|2-3"
    assert _plan(2, [0, 1, 2, 3, 4]) == "0-1|2-3"  # the odd core stays unused
    assert _plan(3, [0, 2, 4, 6, 7, 5]) == "0,2|4-5|6-7"
    assert parse_bind("0-1|2,4") == [(0, 1), (2, 4)]


def test_too_few_cores_are_refused_naming_the_flags() -> None:
    with pytest.raises(ValueError, match="--dp-size 2 on CPU needs 4 cores") as info:
        _plan(2, [0, 1])
    assert "--ssd-allow-shared-cores" in str(info.value)
    assert _plan(2, [0, 1], allow_shared=True) == "0-1|0-1"  # tests only
    assert _plan(2, [3], allow_shared=True) == "3|3"


def test_a_users_bind_list_is_checked_and_kept() -> None:
    assert _plan(2, MACHINE, {BIND_ENV: "0-3|4-7"}) is None
    for bind, message in (
        ("0-3|3-7", r"replicas 0 and 1 share cores \[3\]"),
        ("0|1-3", "replica 0 has cores"),
        ("0-3", "has 1 entries"),
        ("0-3|8-9", r"cores \[8, 9\] that this machine lacks"),
        ("0-3|x", "entry 1"),
    ):
        with pytest.raises(ValueError, match=message):
            _plan(2, MACHINE, {BIND_ENV: bind})
    assert _plan(2, MACHINE, {BIND_ENV: "0-3|3-7"}, allow_shared=True) is None
    # TP rank 0 of each replica leads: entries 0 and 2 of four.
    assert _plan(2, MACHINE, {BIND_ENV: "0-1|2|4-5|6"}, tp=2) is None
    with pytest.raises(ValueError, match="one core list per rank"):
        _plan(2, MACHINE, tp=2)


def test_one_draft_core_list_for_every_replica_is_refused() -> None:
    with pytest.raises(ValueError, match="--ssd-draft-cpus 3 would put the speculators"):
        _plan(2, MACHINE, draft_cpus=(3,))


def test_each_replica_splits_its_own_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    pinned: list[list[int]] = []
    monkeypatch.setattr(placement, "pin_process", lambda cpus: pinned.append(list(cpus)))
    monkeypatch.setenv(BIND_ENV, "0-2|3-5")
    gpus = TargetGpus(dp_size=2)
    spots = [placement.place(SSDConfig(), "cpu", gpus, rank) for rank in (0, 1)]
    assert [(p.target_cpus, p.cpus, p.dp_rank) for p in spots] == [
        ((0, 1), (2,), 0),
        ((3, 4), (5,), 1),
    ]
    assert pinned == [[0, 1], [3, 4]]
    monkeypatch.setenv(BIND_ENV, "0-1|0-1")  # --ssd-allow-shared-cores on 2 cores
    shared = placement.place(SSDConfig(), "cpu", gpus, 1)
    assert (shared.target_cpus, shared.cpus) == ((0,), (1,))
    monkeypatch.delenv(BIND_ENV)
    with pytest.raises(ValueError, match=f"needs {BIND_ENV}"):
        replica_cores(0)


def test_startup_exports_the_plan_for_sglangs_subprocesses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(placement, "available_cpus", lambda: [0, 1, 2, 3])
    monkeypatch.setattr(placement, "machine_cpus", lambda: [0, 1, 2, 3])
    args = SimpleNamespace(device="cpu", dp_size=2, tp_size=1, pp_size=1)
    environ: dict[str, str] = {}
    check_cpu_placement(args, environ)
    assert environ == {BIND_ENV: "0-1|2-3"}
    check_cpu_placement(SimpleNamespace(device="cpu", dp_size=1), environ := {})
    check_cpu_placement(SimpleNamespace(device="cuda", dp_size=2), environ)
    assert environ == {}  # one replica, or a GPU: nothing to bind
    monkeypatch.setattr(placement, "available_cpus", lambda: [0, 1])
    with pytest.raises(ValueError, match="needs 4 cores"):
        check_cpu_placement(args, {})
    shared = SSDConfig(allow_shared_cores=True)
    monkeypatch.setenv("SGLANG_SSD_CONFIG", shared.to_json())
    check_cpu_placement(args, environ)
    assert environ == {BIND_ENV: "0-1|0-1"}
