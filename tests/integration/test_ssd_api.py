"""SSD's HTTP surface on one tiny-model SSD server: refused options, bad input, admin, metrics.

The options SSD applies (penalties, min tokens, logit bias, grammars) are checked against the
autoregressive server in `test_ssd_options.py`; the one still refused here is a custom logit
processor.

The session's shared tiny SSD server (`tiny_ssd`: float32, `--enable-metrics`, a decode log
line every round; live settings restored after each test). Every test checks that it still
serves after each refused request.

Bad inputs SGLang 0.5.23 already refuses with a clear 400 (the tests pin the status and message):
negative or huge max_new_tokens, temperature < 0, top_p outside (0, 1], top_k 0 or < -1,
wrongly typed values, empty input_ids, prompts longer than the context, malformed JSON.
Two crashed the whole server before the SSD hooks (`sglang_ssd.integration.request_checks`):
an empty text prompt and token ids outside the vocabulary.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from eval.servers import Server
from tests.integration import stats_keys

PROMPT_IDS = [68, 69, 70, 0, 70, 73, 66, 79, 78]  # "def fibon"
REFUSED = "SSD cannot apply"


class SSDClient:
    """Requests to the shared tiny SSD server (`tiny_ssd`); HTTP errors come back as statuses."""

    def __init__(self, server: Server) -> None:
        self.url = server.url
        assert server.log_path is not None
        self.log = server.log_path

    def request(self, method: str, path: str, body: Any = None, raw: bytes | None = None):
        """(status, decoded JSON or text) of one request; HTTP errors are returned, not raised."""
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=300) as response:
                status, text = response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            status, text = exc.code, exc.read().decode()
        try:
            return status, json.loads(text)
        except json.JSONDecodeError:
            return status, text

    def get(self, path: str):
        return self.request("GET", path)

    def post(self, path: str, body: Any = None, raw: bytes | None = None):
        return self.request("POST", path, body, raw)

    def stream(self, path: str, body: dict) -> list[dict]:
        """The JSON events of a server-sent-event response (up to ``[DONE]``)."""
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        events = []
        with urllib.request.urlopen(req, timeout=300) as response:
            assert response.status == 200
            for line in response:
                line = line.decode().strip()
                if line.startswith("data:") and line != "data: [DONE]":
                    events.append(json.loads(line[len("data:") :]))
        return events

    def generate(self, max_new_tokens: int = 8, **extra: Any) -> dict:
        sampling = {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}
        sampling.update(extra.pop("sampling_params", {}))
        status, body = self.post(
            "/generate", {"input_ids": PROMPT_IDS, "sampling_params": sampling, **extra}
        )
        assert status == 200, body
        return body

    def assert_serving(self) -> None:
        assert len(self.generate(max_new_tokens=2)["output_ids"]) == 2


@pytest.fixture
def server(tiny_ssd: Server) -> SSDClient:
    return SSDClient(tiny_ssd)


def _error_message(body: Any) -> str:
    if isinstance(body, dict):
        error = body.get("error", body)
        return error.get("message", "") if isinstance(error, dict) else str(error)
    return str(body)


# ------------------------------------------------------------------ refused options
@pytest.mark.parametrize(
    ("extra", "option"),
    [
        ({"custom_logit_processor": "{}"}, "custom_logit_processor"),
        ({"stream": True, "custom_logit_processor": "{}"}, "custom_logit_processor"),
    ],
)
def test_generate_refuses_options_ssd_cannot_apply(
    server: SSDClient, extra: dict, option: str
) -> None:
    body = {"input_ids": PROMPT_IDS, **extra}
    body["sampling_params"] = {"max_new_tokens": 4, **extra.get("sampling_params", {})}
    status, reply = server.post("/generate", body)
    assert status == 400, reply
    message = _error_message(reply)
    assert message.startswith(REFUSED) and option in message and "draft position" in message
    server.assert_serving()


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_openai_routes_refuse_options_ssd_cannot_apply(server: SSDClient, path: str) -> None:
    body: dict[str, Any] = {"model": "tiny", "max_tokens": 4, "custom_logit_processor": "{}"}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "def f"
    status, reply = server.post(path, body)
    assert status == 400, reply
    assert REFUSED in _error_message(reply)
    assert "custom_logit_processor" in _error_message(reply)
    server.assert_serving()


def test_min_p_logprobs_and_n_are_served(server: SSDClient, tiny_target: Path) -> None:
    """min_p is applied exactly by saguaro; logprobs come from the target's own logits."""
    out = server.generate(sampling_params={"temperature": 0.7, "min_p": 0.05})
    assert len(out["output_ids"]) == 8
    status, outs = server.post(
        "/generate",
        {"input_ids": PROMPT_IDS, "sampling_params": {"max_new_tokens": 4, "n": 2}},
    )
    assert status == 200 and len(outs) == 2
    out = server.generate(return_logprob=True, sampling_params={"temperature": 0.7})
    logprobs = [row[0] for row in out["meta_info"]["output_token_logprobs"]]
    assert len(logprobs) == len(out["output_ids"])
    reference = _reference_logprobs(tiny_target, out["output_ids"], 0.7)
    assert logprobs == pytest.approx(reference, abs=1e-4)


def _reference_logprobs(model_path: Path, output_ids: list[int], temperature: float) -> list:
    """log softmax(logits / T) of the target at each output token (SGLang's AR semantics)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    tokens = torch.tensor([PROMPT_IDS + output_ids])
    with torch.no_grad():
        logits = model(tokens).logits[0, len(PROMPT_IDS) - 1 : -1]
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return logprobs.gather(1, torch.tensor(output_ids).unsqueeze(1)).squeeze(1).tolist()


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"sampling_params": {"max_new_tokens": -1}}, "max_new_tokens must be at least 0"),
        ({"sampling_params": {"max_new_tokens": 10**9}}, "maximum context length"),
        ({"sampling_params": {"temperature": -1.0}}, "temperature must be"),
        ({"sampling_params": {"temperature": "hot"}}, "invalid type"),
        ({"sampling_params": {"top_p": 0.0}}, "top_p must be in (0, 1]"),
        ({"sampling_params": {"top_p": 1.5}}, "top_p must be in (0, 1]"),
        ({"sampling_params": {"top_k": 0}}, "top_k must be"),
        ({"sampling_params": {"top_k": -5}}, "top_k must be"),
        ({"input_ids": [5, 6, 100000]}, "input_ids must be token ids in [0, 127]"),
        ({"input_ids": [5, -3]}, "input_ids must be token ids in [0, 127]"),
        ({"input_ids": []}, "input_ids cannot be empty"),
        ({"text": ""}, "the prompt is empty"),
        ({"input_ids": [5] * 5000}, "longer than the model's context length"),
    ],
)
def test_bad_input_gets_400(server: SSDClient, body: dict, message: str) -> None:
    request = {"input_ids": PROMPT_IDS, "sampling_params": {"max_new_tokens": 4}}
    if "text" in body:
        request.pop("input_ids")
    request.update({k: v for k, v in body.items() if k != "sampling_params"})
    request["sampling_params"].update(body.get("sampling_params", {}))
    status, reply = server.post("/generate", request)
    assert status == 400, reply
    assert message in _error_message(reply)
    server.assert_serving()


def test_malformed_json_gets_400(server: SSDClient) -> None:
    for path in ("/generate", "/v1/completions", "/ssd/config"):
        status, reply = server.post(path, raw=b'{"text": "abc", ')
        assert status == 400, (path, reply)
    server.assert_serving()


# ------------------------------------------------------------------ admin endpoints
def test_admin_config_round_trip(server: SSDClient) -> None:
    status, body = server.get("/ssd/config")
    assert status == 200
    config, in_force = body["settings"], body["in_force"]
    # tree_depth "auto": self-tuned; in force, the D of the next build (a value, never null).
    assert config["lookahead"] == 4 and config["tree_depth"] == "auto" and config["mode"] == "async"
    assert in_force.keys() == config.keys() and None not in in_force.values(), in_force
    assert 1 <= in_force["tree_depth"] <= 4 and in_force["draft_device"] == "cpu"
    assert in_force["draft_kv_tokens"] > 0 and in_force["draft_runtime"] != "auto"
    original = dict(config)
    try:
        status, reply = server.post("/ssd/config", {"beta": 0.5, "fanout": "uniform"})
        assert status == 200, reply
        assert reply["settings"]["beta"] == 0.5 and reply["acknowledged"]["beta"] == 0.5
        assert server.get("/ssd/config")[1]["settings"]["fanout"] == "uniform"
        server.assert_serving()
        for bad in ({"beta": 0.0}, {"beta": 2}, {"beta": "x"}, {"lookahead": 2}, {}, [1]):
            status, reply = server.post("/ssd/config", bad)
            assert status == 400, (bad, reply)
            assert _error_message(reply)
        assert server.get("/ssd/config")[1]["settings"]["beta"] == 0.5
    finally:  # the settings GET listed, every key, posted back as they were
        restored = server.post("/ssd/config", original)
    assert restored[0] == 200, restored
    assert server.get("/ssd/config")[1]["settings"] == original
    server.assert_serving()


def test_admin_stats(server: SSDClient) -> None:
    server.generate(max_new_tokens=16)
    status, stats = server.get("/ssd/stats")
    assert status == 200
    assert stats["rounds"] > 0 and stats["request_rounds"] >= stats["rounds"]
    assert stats["avg_verify_s"] > 0 and stats["avg_wait_draft_s"] > 0
    assert 0.0 <= stats["cache_hit_rate"] <= 1.0
    assert stats["accept_length"] >= 1.0
    assert sum(stats["rounds_by_source"].values()) == stats["request_rounds"]
    for key in ("avg_speculator_build_s", "avg_transport_s", "faults", "restarts"):
        assert stats[key] >= 0, key
    assert stats["speculator"]["steps"] > 0
    target = stats["target_phases"]  # seconds per round by phase
    assert {"wait_draft", "build_batch", "forward", "verify", "commit", "record"} <= set(target)
    forward = target["build_batch"] + target["forward"]  # what avg_forward_s has always timed
    assert forward == pytest.approx(stats["avg_forward_s"], abs=1e-4)
    assert target["wait_draft"] == pytest.approx(stats["avg_wait_draft_s"])
    speculator = stats["speculator_phases"]
    assert {"glue", "tree_1", "lm_head", "sampling", "lookup", "pack", "send"} <= set(speculator)
    assert stats["speculator_round_s"] == pytest.approx(sum(speculator.values()))
    assert stats["t_p"] == pytest.approx(stats["speculator_round_s"] / stats["target_round_s"])
    pinned = stats_keys.STATS_KEYS | stats_keys.SPECULATOR_KEYS | stats_keys.SCHEDULER_KEYS
    assert set(stats) == pinned


# ------------------------------------------------------------------ per-request metrics
def _check_ssd_meta(meta: dict) -> None:
    rounds = meta["ssd_rounds"]
    assert rounds == meta["spec_verify_ct"]
    assert 0.0 <= meta["ssd_cache_hit_rate"] <= 1.0
    speculative = rounds - meta["ssd_plain_rounds"]
    hits = round(meta["ssd_cache_hit_rate"] * speculative)
    assert hits + sum(meta["ssd_backup_rounds"].values()) == speculative
    assert set(meta["ssd_backup_rounds"]) >= {"jit", "ngram", "random", "local-ngram"}


def test_meta_info_has_ssd_fields(server: SSDClient) -> None:
    meta = server.generate(max_new_tokens=16)["meta_info"]
    assert meta["ssd_rounds"] > 0
    _check_ssd_meta(meta)


def test_streaming_generate(server: SSDClient) -> None:
    events = server.stream(
        "/generate",
        {
            "input_ids": PROMPT_IDS,
            "stream": True,
            "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True},
        },
    )
    assert len(events) > 1
    final = events[-1]
    assert len(final["output_ids"]) == 12
    assert final["output_ids"] == server.generate(max_new_tokens=12)["output_ids"]
    _check_ssd_meta(final["meta_info"])


def test_openai_completions_and_chat(server: SSDClient) -> None:
    status, reply = server.post(
        "/v1/completions", {"model": "tiny", "prompt": "def f", "max_tokens": 6, "temperature": 0}
    )
    assert status == 200 and reply["usage"]["completion_tokens"] > 0
    chat = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 6,
        "temperature": 0.7,
    }
    status, reply = server.post("/v1/chat/completions", chat)
    assert status == 200 and reply["choices"][0]["message"]["content"] is not None
    events = server.stream("/v1/chat/completions", {**chat, "stream": True})
    assert any(e["choices"] and e["choices"][0].get("finish_reason") for e in events)


# ------------------------------------------------------------------ aggregates
def test_decode_log_line_and_prometheus(server: SSDClient) -> None:
    server.generate(max_new_tokens=8)
    lines = [line for line in server.log.read_text().splitlines() if "Decode batch" in line]
    assert lines and "ssd hit rate:" in lines[-1] and "wait draft:" in lines[-1]
    status, text = server.get("/metrics")
    assert status == 200
    for name in ("cache_hit_rate", "wait_draft_seconds", "verify_seconds"):
        assert f"sglang:ssd_{name}{{" in text, name
