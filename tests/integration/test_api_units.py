"""Unit tests of SSD's API pieces without a server: request checks, admin handling, metrics."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from sglang_ssd.config import SSDConfig
from sglang_ssd.integration import admin, request_checks, request_metrics, scheduler_metrics
from sglang_ssd.launch.placement import Placement
from sglang_ssd.phases import PhaseTimer
from sglang_ssd.runtime_registry import RUNTIMES
from sglang_ssd.transport.admin_messages import (
    AdminReply,
    AdminRequest,
    decode_admin,
    encode_admin,
)
from sglang_ssd.transport.messages import (
    Configure,
    ConfigureAck,
    SpeculatorStats,
)
from sglang_ssd.transport.wire import (
    LiveSettings,
)
from sglang_ssd.worker import metrics as worker_metrics
from sglang_ssd.worker.planner import RoundPlanner
from sglang_ssd.worker.round_mode import Arrangement
from sglang_ssd.worker.speculator_admin import LinkStats, SpeculatorClientStats
from tests.integration import stats_keys


def test_only_what_cannot_be_applied_per_position_is_refused() -> None:
    """Beam search, custom logit processors and watermarks; the refusal says why."""
    reason = request_checks.sampling_refusal({"beam_width": 2})
    assert reason is not None and reason.startswith("SSD cannot apply beam search")
    reason = request_checks.request_refusal({}, "serialized")
    assert reason is not None and "custom_logit_processor" in reason and "draft position" in reason
    assert "watermark" in request_checks.request_refusal({}, None, {"enabled": True})
    batch = [{"temperature": 0.5}, {"beam_width": 3}]
    assert "beam search" in request_checks.request_refusal(batch, [None, None])
    assert request_checks.request_refusal([{}, {}], [None, None]) is None


@pytest.mark.parametrize(
    "params",
    [
        {},
        None,
        {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.1},
        {"repetition_penalty": 1.1, "frequency_penalty": 0.5, "presence_penalty": -0.5},
        {"min_new_tokens": 3, "logit_bias": {"5": 2.0}},
        {"regex": "[a-z]+"},
        {"json_schema": "{}"},
        {"ebnf": "root ::= 'a'"},
        {"structural_tag": "{}"},
        {"beam_width": 1},
    ],
)
def test_options_ssd_applies_pass(params: Any) -> None:
    assert request_checks.sampling_refusal(params) is None


def test_sglang_sampling_params_objects_are_checked() -> None:
    from sglang.srt.sampling.sampling_params import SamplingParams

    assert request_checks.sampling_refusal(SamplingParams(temperature=0.0)) is None
    assert request_checks.sampling_refusal(SamplingParams(min_new_tokens=2)) is None


def test_empty_prompts_and_ids_outside_the_vocab_are_refused() -> None:
    request_checks.check_prompt([0, 5, 127], vocab_size=128)
    request_checks.check_prompt(None, vocab_size=128)
    for bad, message in (
        ([0, 128], "input_ids must be"),
        ([-1, 3], "input_ids must"),
        ([], "empty"),
    ):
        with pytest.raises(ValueError, match=message):
            request_checks.check_prompt(bad, vocab_size=128)


def test_meta_info_fields() -> None:
    fields = request_metrics.meta_info_fields({"cache": 3, "jit": 1})
    assert fields["ssd_rounds"] == 4
    assert fields["ssd_cache_hit_rate"] == pytest.approx(0.75)
    assert fields["ssd_backup_rounds"] == {"jit": 1, "ngram": 0, "random": 0, "local-ngram": 0}
    assert request_metrics.meta_info_fields({})["ssd_cache_hit_rate"] == 0.0
    mixed = request_metrics.meta_info_fields({"cache": 1, "ngram": 1, "plain": 2})
    assert mixed["ssd_rounds"] == 4 and mixed["ssd_plain_rounds"] == 2
    assert mixed["ssd_cache_hit_rate"] == pytest.approx(0.5)
    assert "plain" not in mixed["ssd_backup_rounds"]


def test_round_counts_live_on_requests() -> None:
    class Req:
        pass

    a, b = Req(), Req()
    worker_metrics.count_request_rounds([a, b], ["cache", "ngram"])
    worker_metrics.count_request_rounds([a], ["cache"])
    assert worker_metrics.snapshot(a) == {"cache": 2}
    assert worker_metrics.snapshot(b) == {"ngram": 1}
    assert worker_metrics.snapshot(Req()) == {}


def test_update_meta_info_takes_out_the_ssd_key() -> None:
    seen: list[dict] = []

    def original(manager, meta_info, state, customized_info, index, finish_reason):
        seen.append(customized_info)

    meta: dict[str, Any] = {}
    info = {"ssd": [{"cache": 1}, {"jit": 2}], "other": [[1], [2]]}
    request_metrics.update_meta_info(original, None, meta, None, info, 1, None)
    assert meta["ssd_rounds"] == 2 and meta["ssd_backup_rounds"]["jit"] == 2
    assert seen == [{"other": [[1], [2]]}]
    request_metrics.update_meta_info(original, None, {}, None, {"ssd": [{}]}, 0, None)
    assert len(seen) == 1  # nothing left for SGLang's handler


def round_timer() -> worker_metrics.RoundTimer:
    """A real `RoundTimer` after 4 rounds (6 request-rounds, 4 cache hits, 11 tokens accepted
    on hits) whose target phases are 0.25 s of work and 0.1 s of waiting per round."""
    timer = worker_metrics.RoundTimer(
        rounds=4,
        requests=6,
        accepted=11,
        sources=Counter(cache=4, ngram=2),
        accepted_by_source=Counter(cache=11),
    )
    timer.phases.merge({"forward": 0.6, "verify": 0.2, "scheduler": 0.2, "wait_draft": 0.4})
    return timer


class FakeClient:
    """What the admin endpoints and the decode report read of a `SpeculatorClient`."""

    def __init__(self) -> None:
        self.speculator_phases = PhaseTimer()
        self.speculator_phases.merge({"tree_1": 0.8, "lm_head": 0.3, "send": 0.1})
        self.drafts_received = 4
        self.config = SSDConfig(draft_kv_tokens=4096)  # the pool it gave the speculator
        self.supervisor = SimpleNamespace(placement=Placement("cpu", (1,), (0,)))


class FakeAdmin:
    """A `SpeculatorAdmin` whose speculator acknowledges every change."""

    def __init__(self) -> None:
        self.config = SSDConfig()

    def configure(self, request: Configure) -> ConfigureAck | None:
        self.config = self.config.replace(**request.changes.given())
        return ConfigureAck(applied=LiveSettings.of(self.config))

    def stats(self) -> LinkStats:
        client = SpeculatorClientStats(
            faults=1, restarts=0, speculator_up=True, target_opened=0, target_pending=0,
            target_tracked=0, target_features_buffered=0, draft_kv_tokens=0, drafts_received=4,
            draft_forwards=0, build_draft_forwards=0, phase_s={"glue": 0.5}, cores_lent=0,
        )  # fmt: skip
        speculator = SpeculatorStats(
            steps=4, build_s=2.0, lookup_s=0.4, backup_s=0.8, send_s=0.04, fanout_hits={3: 2}
        )
        return LinkStats(speculator=speculator, client=client)


@dataclass
class FakeWorker:
    """The `SSDWorker` members the admin bridge reads (a real planner: D in force is γ = 4)."""

    config: SSDConfig = field(default_factory=SSDConfig)
    timer: worker_metrics.RoundTimer = field(default_factory=round_timer)
    plain_timer: worker_metrics.RoundTimer = field(default_factory=worker_metrics.RoundTimer)
    speculator_client: FakeClient = field(default_factory=FakeClient)
    speculator_admin: FakeAdmin = field(default_factory=FakeAdmin)
    planner: RoundPlanner = field(default_factory=lambda: RoundPlanner(SSDConfig()))
    dp_rank: int = 0
    draft_model_path: str = "/no/such/draft"


def _ask(worker: FakeWorker, op: str, **changes: Any) -> AdminReply:
    """`op` through the scheduler side of the bridge, as the HTTP side sends it."""
    request = AdminRequest(op=op, changes=LiveSettings(**changes) if changes else None)
    return admin.handle(worker, encode_admin(request))


def _ask_raw(worker: FakeWorker, request: Any) -> AdminReply:
    """A frame the HTTP side would never send (to check the scheduler side's own checks)."""
    return admin.handle(worker, msgspec.msgpack.encode(request))


def test_admin_config_round_trip() -> None:
    worker = FakeWorker()
    got = _ask(worker, "config")
    assert got.status == 200 and got.config.beta == 1.0 and got.config.tree_depth is None
    body = admin.http_body("config", got)
    left_to_the_server = ("tree_depth", "batch_threshold", "draft_device", "draft_cpus")
    assert body["settings"] == msgspec.to_builtins(SSDConfig()) | dict.fromkeys(
        (*left_to_the_server, "draft_kv_tokens"), "auto"
    )
    in_force = body["in_force"]  # every key, none null: what the server runs
    assert in_force.keys() == body["settings"].keys() and None not in in_force.values()
    assert in_force["tree_depth"] in (0, 4)  # D = γ before tuning (0: sync rounds only)
    mode = SSDConfig().mode  # auto holds no arrangement before its first rounds
    assert in_force["mode"] == ("calibrating" if mode == "auto" else mode)
    assert (in_force["draft_device"], in_force["draft_cpus"]) == ("cpu", "1")
    assert in_force["draft_kv_tokens"] == 4096 and in_force["draft_runtime"] in RUNTIMES
    b_star = in_force["batch_threshold"]  # a fresh policy leaves JIT at once: "auto" means b*
    assert b_star == 1 and in_force["backup"] == {"b>=1": worker.planner.policy.choose(1).value}
    got = _ask(worker, "configure", beta=0.5, backup="ngram")
    assert got.status == 200 and got.config.beta == 0.5 and not got.applied_locally
    body = admin.http_body("configure", got)
    assert body["acknowledged"] == {"beta": 0.5, "backup": "ngram"}  # what was given
    assert body["settings"]["beta"] == 0.5 and body["in_force"]["beta"] == 0.5
    assert _ask(worker, "config").config.backup == "ngram"
    body = admin.http_body("configure", _ask(worker, "configure", tree_depth=0))
    assert body["acknowledged"] == {"tree_depth": 0}  # self-tuned: None in force, 0 as given
    assert body["settings"]["tree_depth"] == "auto" and body["in_force"]["tree_depth"] in (0, 4)


def test_admin_reports_changes_no_speculator_took() -> None:
    worker = FakeWorker()
    worker.speculator_admin.configure = lambda request: None  # no speculator running
    body = admin.http_body("configure", _ask(worker, "configure", fanout_budget=3))
    assert body["acknowledged"] == {"applied_locally": True, "fanout_budget": 3}
    assert body["settings"]["fanout_budget"] == 8  # FakeAdmin did not apply it


@pytest.mark.parametrize(
    "changes",
    [
        {"beta": 0.0},
        {"beta": 1.5},
        {"beta": "x"},
        {"beta": True},
        {"fanout": "zigzag"},
        {"fanout_budget": -1},
        {"mode": "turbo"},
        {},
        [1],
    ],
)
def test_admin_refuses_bad_changes(changes: Any) -> None:
    worker = FakeWorker()
    got = _ask_raw(worker, {"type": "admin_request", "op": "configure", "changes": changes})
    assert got.status == 400 and got.error
    assert worker.speculator_admin.config == SSDConfig()
    with pytest.raises(admin.AdminError) as refused:  # the HTTP side refuses them first
        admin.parse_changes(msgspec.json.encode(changes))
    assert refused.value.status == 400


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b'{"beta": 0}', "--ssd-beta must be in (0, 1]"),
        (b'{"beta": "x"}', "$.beta"),
        (b'{"mode": 3}', "Expected `str`, got `int`"),  # not `str | null`: null is
        (b'{"mode": null, "beta": 0.5}', "null is not a value of mode"),  # refused
        (b'{"draft_vocab": 9, "beta": 0.5}', "fixed at startup: --ssd-draft-vocab"),
        (b'{"fanout_budget": 2.5}', "$.fanout_budget"),
        (b'{"backup": "oracle"}', "$.backup"),
        (b'{"mode": "sometimes"}', "--ssd-mode must be one of auto, async, sync, plain"),
        (b'{"fanout": "zigzag"}', "--ssd-fanout must be one of geometric, uniform"),
        (b'{"tree_depth": -1}', "--ssd-tree-depth must be in 0..γ"),
        (b"{}", "no settings"),
        (b"[1]", "object"),
        (b"{bad", "malformed JSON: object keys must be strings"),  # msgspec's, said once
        (b'{"tree_depth": null}', "or tree_depth 0 to self-tune"),  # GET shows null: self-tuned
    ],
)
def test_admin_http_errors_name_the_setting(body: bytes, needle: str) -> None:
    with pytest.raises(admin.AdminError) as refused:
        admin.parse_changes(body)
    assert refused.value.status == 400 and needle in str(refused.value)


def test_admin_stats_and_errors() -> None:
    got = _ask(FakeWorker(), "stats")
    body = admin.http_body("stats", got)
    assert body["avg_speculator_build_s"] == pytest.approx(0.5)
    assert body["avg_transport_s"] == pytest.approx(0.01)
    assert body["faults"] == 1.0 and body["rounds_by_source"] == {"cache": 4, "ngram": 2}
    assert body["accepted_by_source"] == {"cache": 11}
    assert body["target_phases"]["forward"] == pytest.approx(0.15)
    assert body["speculator_phases"] == pytest.approx({"tree_1": 0.2, "lm_head": 0.075,
                                                       "send": 0.025})  # fmt: skip
    assert body["speculator_round_s"] == pytest.approx(0.3)
    assert body["target_round_s"] == pytest.approx(0.25)  # waiting for drafts left out
    assert body["t_p"] == pytest.approx(1.2)
    assert _ask_raw(FakeWorker(), {"type": "admin_request", "op": "nope"}).status == 400
    assert _ask_raw(FakeWorker(), {"type": "admin_reply"}).status == 400
    assert admin.handle(FakeWorker(), b"{not json").status == 400


def test_admin_stats_keys_are_pinned() -> None:
    """The keys users read come from typed structs; none appears, vanishes or is renamed
    without `stats_keys` changing too."""
    body = admin.http_body("stats", _ask(FakeWorker(), "stats"))
    assert stats_keys.STATS_KEYS <= set(body) <= stats_keys.STATS_KEYS | stats_keys.SPECULATOR_KEYS
    assert set(body["plain_rounds"]) == stats_keys.PLAIN_ROUNDS_KEYS
    assert set(body["arrangements"]) == stats_keys.ARRANGEMENTS_KEYS
    assert set(body["fallback"]) == stats_keys.FALLBACK_KEYS


def test_admin_stats_list_the_speculators_counters_by_field() -> None:
    """`speculator` lists the speculator's counters, then the client's, then the planner's, one
    key per field; a dict field one key per entry (`fanout_hits_3`); a missing pid left out."""
    body = admin.http_body("stats", _ask(FakeWorker(), "stats"))
    spec = body["speculator"]
    keys = list(spec)
    fields = [f for f in SpeculatorStats.__struct_fields__ if f not in ("fanout_outcomes",
              "fanout_hits", "builds_at_depth")]  # fmt: skip
    assert keys[: len(fields) + 1] == [*fields, "fanout_hits_3"]
    assert spec["steps"] == 4 and spec["send_s"] == 0.04 and spec["fanout_hits_3"] == 2
    assert spec["faults"] == 1 and spec["drafts_received"] == 4 and spec["phase_s_glue"] == 0.5
    assert "speculator_pid" not in spec and "phase_s" not in spec
    assert keys[-1] == "arrangement_switches" and spec["tree_depth"] == 4  # the planner's
    averages = [body[f"avg_speculator_{name}_s"] for name in ("build", "lookup", "backup", "send")]
    assert averages == pytest.approx([0.5, 0.1, 0.2, 0.01]) and body["speculator_up"] is True


def test_admin_stats_without_a_speculator_keep_the_clients_counters() -> None:
    worker = FakeWorker()
    link = worker.speculator_admin.stats()
    worker.speculator_admin.stats = lambda: LinkStats(speculator=None, client=link.client)
    body = admin.http_body("stats", _ask(worker, "stats"))
    assert not any(key.startswith("avg_speculator_") for key in body)
    assert "avg_transport_s" not in body and body["faults"] == 1
    assert "steps" not in body["speculator"] and body["speculator"]["cores_lent"] == 0


def test_admin_stats_report_the_schedulers_requests() -> None:
    scheduler = SimpleNamespace(running_batch=SimpleNamespace(reqs=["a", "b"]), waiting_queue=["c"])
    frame = encode_admin(AdminRequest(op="stats"))
    body = admin.http_body("stats", admin.handle(FakeWorker(), frame, scheduler))
    assert body["target_running"] == 2.0 and body["target_waiting"] == 1.0
    assert "target_running" not in admin.http_body("stats", admin.handle(FakeWorker(), frame))


def test_admin_failures_are_replies() -> None:
    worker = FakeWorker()
    worker.timer = None  # stats cannot be read: a 500, and the bridge keeps serving
    got = decode_admin(admin.reply_frame(worker, encode_admin(AdminRequest(op="stats"))))
    assert got.status == 500 and "AttributeError" in got.error


def test_admin_stats_report_the_fallback_threshold() -> None:
    from sglang_ssd.worker.planner import default_policy

    worker = FakeWorker()
    worker.planner.policy = default_policy(SSDConfig(backup="jit"))
    body = _ask(worker, "stats").stats["fallback"]
    assert body["backup"] == "jit" and body["batch_threshold"] is None  # forced JIT never leaves
    auto = default_policy(SSDConfig())
    assert body["auto_batch_threshold"] == auto.batch_threshold()
    assert set(body["backups"]) == {"jit", "ngram", "random"}
    assert worker.planner.policy.mode == "jit"  # the copy changed, not the live policy


def test_the_admin_socket_leaves_no_file(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bridge binds an abstract ipc name (no file): SGLang kills the scheduler on shutdown
    before its exit handlers run, and a new user found 450 socket files left in /tmp when the
    bridge bound a path there."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    address = admin.admin_address(SimpleNamespace(instance_id=f"test-{os.getpid()}"))
    admin.AdminServer(FakeWorker(), address).start()
    assert admin.ask(address, AdminRequest(op="config"), timeout_s=10).config.beta == 1.0
    assert list(tmp_path.iterdir()) == []


def test_admin_socket_round_trip(tmp_path) -> None:
    address = f"ipc://{tmp_path}/admin"
    admin.AdminServer(FakeWorker(), address).start()
    assert admin.ask(address, AdminRequest(op="config"), timeout_s=10).config.fanout == "predicted"


def test_decode_window_and_log_filter() -> None:
    import logging

    tracker = scheduler_metrics.WindowTracker()
    timer, client, planner = round_timer(), FakeClient(), RoundPlanner(SSDConfig())
    first = tracker.take(timer, client, planner)
    assert first.values()["cache_hit_rate"] == pytest.approx(4 / 6)
    assert first.values()["t_p"] == pytest.approx(1.2)
    timer.rounds, timer.requests = 6, 8
    timer.sources["cache"] += 2
    timer.phases.merge({"forward": 0.3, "verify": 0.1, "wait_draft": 0.2})
    client.speculator_phases.merge({"tree_1": 0.1, "glue": 0.2})
    client.drafts_received += 2
    second = tracker.take(timer, client, planner)
    assert (second.rounds.rounds, second.rounds.requests, second.rounds.hits) == (2, 2, 2)
    assert second.values()["wait_draft_seconds"] == pytest.approx(0.1)
    assert second.values()["target_round_seconds"] == pytest.approx(0.2)
    assert second.values()["speculator_round_seconds"] == pytest.approx(0.15)

    line_filter = scheduler_metrics.DecodeLineFilter()
    line_filter.suffix = second.log_suffix()
    record = logging.LogRecord("x", logging.INFO, "f", 1, "Decode batch, #running-req: 1", (), None)
    line_filter.filter(record)
    assert record.msg.endswith(
        "ssd hit rate: 1.00, wait draft: 100.0 ms, verify: 200.0 ms, T_p: 0.75 (speculator 150 ms:"
        " glue 100.0 ms, tree_1 50.0 ms, lm_head 0.0 ms; target 200 ms)"
        ", D: 4"  # the D in force (the planner's tuner; γ until a build is timed)
    )
    # `--ssd-mode sync`: the draft precedes each verify, so the line gives its time, not T_p.
    assert dataclasses.replace(second, sync=True).log_suffix() == (
        "ssd hit rate: 1.00, wait draft: 100.0 ms, verify: 200.0 ms, sync draft: 150 ms (glue"
        " 100.0 ms, tree_1 50.0 ms, lm_head 0.0 ms) before each verify"  # no tree built: no D
    )
    # Sync rounds under auto: the line counts them; a window of sync rounds only reads as sync.
    mixed = dataclasses.replace(second, sync_rounds=1).log_suffix()
    assert mixed.endswith("lm_head 0.0 ms; target 200 ms), D: 4, sync rounds: 1"), mixed
    assert dataclasses.replace(second, sync_rounds=2).log_suffix() == (
        "ssd hit rate: 1.00, wait draft: 100.0 ms, verify: 200.0 ms, sync draft: 150 ms (glue"
        " 100.0 ms, tree_1 50.0 ms, lm_head 0.0 ms) before each verify, sync rounds: 2"
    )
    planner.arrangements.rounds[Arrangement.SYNC] += 3  # `WindowTracker` takes the planner's
    assert tracker.take(timer, client, planner).sync_rounds == 3
    other = logging.LogRecord("x", logging.INFO, "f", 1, "Prefill batch", (), None)
    line_filter.filter(other)
    assert other.msg == "Prefill batch"
    plain = scheduler_metrics.Window(plain_rounds=40, tree_depth=4)  # every round plain
    assert plain.log_suffix() == "ssd: no speculative round, plain rounds: 40"
    # The arrangement held per batch-size bucket and the rates behind it close the line.
    held = dataclasses.replace(
        plain, arrangements="b<=1: plain (plain 4.00 tok/s = 1.00 / 0.250 s)"
    )
    assert held.log_suffix().endswith(
        ", arrangement b<=1: plain (plain 4.00 tok/s = 1.00 / 0.250 s)"
    )


def test_hooks_leave_other_algorithms_alone() -> None:
    from types import SimpleNamespace

    from sglang.srt.sampling.sampling_params import SamplingParams

    from sglang_ssd.integration import hooks

    tokenized = SimpleNamespace(
        sampling_params=SamplingParams(presence_penalty=1.0), custom_logit_processor="processor"
    )
    for algorithm, refused in (("STANDALONE", False), (None, False), ("ssd", True)):
        manager = SimpleNamespace(server_args=SimpleNamespace(speculative_algorithm=algorithm))
        if refused:
            with pytest.raises(ValueError, match="SSD cannot apply a custom_logit_processor"):
                hooks._check_tokenized(tokenized, manager)
        else:
            hooks._check_tokenized(tokenized, manager)

    class Base:
        pass

    for name, expected in (("STANDALONE", Base), ("SSD", None)):
        scheduler = SimpleNamespace(spec_algorithm=SimpleNamespace(name=name), rust_server=None)
        chosen = request_metrics.pick_output_streamer_class(lambda s: Base, scheduler)
        assert chosen is expected if expected else issubclass(chosen, Base) and chosen is not Base


def test_p_changing_server_flags_are_refused_at_startup(tmp_path) -> None:
    from types import SimpleNamespace

    from sglang_ssd.integration.registration import validate_ssd_server_args
    from sglang_ssd.testing.tiny_models import make_tiny_model

    model = str(make_tiny_model(tmp_path / "model"))  # the tokenizer check loads its tokenizer
    args = dict(
        model_path=model,
        speculative_draft_model_path=model,
        speculative_num_steps=4,
        speculative_eagle_topk=1,
        tp_size=1,
        pp_size=1,
        dp_size=1,
    )
    validate_ssd_server_args(SimpleNamespace(**args, enable_watermark=False))
    validate_ssd_server_args(SimpleNamespace(**args, preferred_sampling_params='{"top_p": 0.9}'))
    for extra, message in (
        ({"enable_watermark": True}, "--enable-watermark"),
        ({"enable_strict_thinking": True}, "--enable-strict-thinking"),
        ({"preferred_sampling_params": '{"beam_width": 2}'}, "beam search"),
    ):
        with pytest.raises(ValueError, match=message):
            validate_ssd_server_args(SimpleNamespace(**args, **extra))


def test_admin_routes_over_the_bridge(tmp_path) -> None:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from sglang_ssd.integration.admin_routes import add_routes

    address = f"ipc://{tmp_path}/admin"
    worker = FakeWorker()
    admin.AdminServer(worker, address).start()
    app = FastAPI()
    add_routes(app, [address])
    client = TestClient(app)
    assert client.get("/ssd/config").json()["settings"]["beta"] == 1.0
    reply = client.post("/ssd/config", json={"beta": 0.25})
    assert reply.status_code == 200 and reply.json()["settings"]["beta"] == 0.25
    assert client.get("/ssd/config").json()["settings"]["beta"] == 0.25
    for bad in (b"{bad", b"[]", b'{"beta": 0}', b'{"tree_depth": -1}', b'{"beta": true}', b"{}"):
        reply = client.post("/ssd/config", content=bad)
        assert reply.status_code == 400 and reply.json()["error"]["message"], bad
    assert client.get("/ssd/stats").json()["avg_transport_s"] == pytest.approx(0.01)


def test_the_settings_get_shows_post_back_unchanged(tmp_path) -> None:
    """`GET /ssd/config`'s "settings" (startup-only ones and "auto" included) posted back as
    they are: accepted, nothing changes; a startup-only setting with another value is refused,
    named by its flag; `tree_depth` "auto" self-tunes like 0."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from sglang_ssd.integration.admin_routes import add_routes

    address = f"ipc://{tmp_path}/admin"
    worker = FakeWorker()
    worker.speculator_admin.config = SSDConfig(tree_depth=2, draft_cpus=(1,))
    admin.AdminServer(worker, address).start()
    app = FastAPI()
    add_routes(app, [address])
    client = TestClient(app)
    before = client.get("/ssd/config").json()
    assert (
        before["settings"]["draft_cpus"] == "1" and before["settings"]["draft_kv_tokens"] == "auto"
    )
    reply = client.post("/ssd/config", json=before["settings"])
    assert reply.status_code == 200, reply.json()
    assert client.get("/ssd/config").json()["settings"] == before["settings"]
    for changed in ({"lookahead": 3}, {"draft_cpus": "0"}, {"draft_kv_tokens": 512}):
        reply = client.post("/ssd/config", json={**before["settings"], **changed})
        option = admin.FLAGS[next(iter(changed))].option
        assert reply.status_code == 400 and option in reply.json()["error"]["message"], changed
    reply = client.post("/ssd/config", json={"tree_depth": "auto"})
    assert reply.status_code == 200 and reply.json()["settings"]["tree_depth"] == "auto"


def test_admin_routes_list_every_dp_replica(tmp_path) -> None:
    """`--dp-size 2`: each replica binds its own socket; GET lists both, POST changes both,
    and a replica that does not answer fails the call with its rank named."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from sglang_ssd.integration.admin_routes import add_routes

    port_args = SimpleNamespace(instance_id=f"test-{tmp_path.name}")
    addresses = admin.admin_addresses(port_args, 2)
    assert len(set(addresses)) == 2 and addresses[0] == admin.admin_address(port_args)
    workers = [FakeWorker(), FakeWorker()]
    workers[1].speculator_client.drafts_received = 8
    for rank, worker in enumerate(workers):
        worker.dp_rank = rank
        admin.start_admin_server(worker, port_args)
    app = FastAPI()
    add_routes(app, addresses)
    client = TestClient(app)
    body = client.get("/ssd/config").json()
    assert body["dp_size"] == 2 and [r["dp_rank"] for r in body["replicas"]] == [0, 1]
    reply = client.post("/ssd/config", json={"beta": 0.5}).json()
    assert [r["settings"]["beta"] for r in reply["replicas"]] == [0.5, 0.5]
    assert [w.speculator_admin.config.beta for w in workers] == [0.5, 0.5]
    stats = client.get("/ssd/stats").json()["replicas"]
    assert stats[0]["speculator_round_s"] != stats[1]["speculator_round_s"]  # per replica
    status, body = admin.combine(
        "stats", [AdminReply(stats={}), AdminReply(status=504, error="late")]
    )
    assert status == 504 and body["error"]["message"] == "DP replica 1: late"
    assert admin.combine("stats", [AdminReply(stats={"a": 1.0})]) == (200, {"a": 1.0})
    assert admin.admin_address(port_args, 1).endswith(f"{port_args.instance_id}-dp1")
