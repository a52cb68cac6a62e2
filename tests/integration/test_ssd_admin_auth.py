"""`/ssd/config` and `/ssd/stats` under each API-key setting, and fan-out the speculator cannot
hold (issue #11, item 9), on tiny-pair SSD servers: one per key setting (the session's shared
tiny SSD server for "no key"; the others started together).

The SSD routes carry SGLang 0.5.23's `ADMIN_OPTIONAL` auth level (`sglang/srt/utils/auth.py`,
`decide_request_auth`), the same for GET and POST:
- no key configured: anyone, whatever `Authorization` they send;
- `--api-key` only: the API key;
- `--admin-api-key` only: the admin key;
- both: the admin key only (the API key is refused).
A refused call is a 401 and changes nothing. `/generate` keeps SGLang's `NORMAL` level (the API
key whenever one is set; open with only an admin key).

Fan-out budgets that would exhaust the speculator get a 400 naming `--ssd-fanout-budget`, with
nothing changed and the server still serving: 1000 is above what one round of the tiny pair can
use (the live bound, which the speculator's KV pool sets too: `config.fanout_budget_limit`),
10^6 and 10^8 above the static ceiling of `SSDConfig`'s declaration.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from pair_servers import ssd_args

from eval.servers import Server, started_together

API, ADMIN, WRONG = "api-secret", "admin-secret", "not-a-key"
SENT = (None, API, ADMIN, WRONG)  # the Authorization bearer token a client sends, if any
# Key setting → (--api-key, --admin-api-key).
KEYS = {"none": (None, None), "api": (API, None), "admin": (None, ADMIN), "both": (API, ADMIN)}
# Who may call the SSD routes (ADMIN_OPTIONAL), and /generate (NORMAL), per key setting.
ADMIN_ALLOWED = {"none": set(SENT), "api": {API}, "admin": {ADMIN}, "both": {ADMIN}}
GENERATE_ALLOWED = {"none": set(SENT), "api": {API}, "admin": set(SENT), "both": {API}}
PROMPT_IDS = [68, 69, 70, 0, 70, 73, 66, 79, 78]  # "def fibon"


class KeyedServer:
    """A running tiny SSD server, its key setting, and requests sent with a chosen key."""

    def __init__(self, setting: str, server: Server) -> None:
        self.setting = setting
        self.server = server
        api_key, admin_key = KEYS[setting]
        self.admin_key = admin_key or api_key  # a key the SSD routes accept
        self.generate_key = api_key

    def call(self, method: str, path: str, key: str | None, body: object = None):
        headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
        response = requests.request(
            method, self.server.url + path, json=body, headers=headers, timeout=300
        )
        return response.status_code, response.json()

    def config(self) -> dict:
        status, config = self.call("GET", "/ssd/config", self.admin_key)
        assert status == 200, config
        return config

    def assert_serving(self) -> None:
        body = {"input_ids": PROMPT_IDS, "sampling_params": {"max_new_tokens": 2}}
        status, out = self.call("POST", "/generate", self.generate_key, body)
        assert status == 200 and len(out["output_ids"]) == 2, out


def _server(setting: str, target: Path, draft: Path, logs: Path) -> Server:
    api_key, admin_key = KEYS[setting]
    args = [
        *ssd_args(target, draft, ["--skip-server-warmup"]),
        *(("--api-key", api_key) if api_key else ()),
        *(("--admin-api-key", admin_key) if admin_key else ()),
    ]
    return Server(f"ssd-{setting}", args, log_path=logs / f"{setting}.log")


@pytest.fixture(scope="module")
def servers(
    tiny_target: Path,
    tiny_draft: Path,
    tiny_servers: dict[str, Server],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, KeyedServer]]:
    """One tiny SSD server per key setting: the shared one has no key, the others start side
    by side (their start-ups overlap)."""
    logs = tmp_path_factory.mktemp("auth-logs")
    keyed = [setting for setting in KEYS if setting != "none"]
    made = {setting: _server(setting, tiny_target, tiny_draft, logs) for setting in keyed}
    with started_together(made):
        every = {"none": tiny_servers["ssd"], **made}
        yield {setting: KeyedServer(setting, server) for setting, server in every.items()}


@pytest.fixture(params=list(KEYS))
def keyed(request: pytest.FixtureRequest, servers: dict[str, KeyedServer]) -> KeyedServer:
    return servers[request.param]


def test_ssd_routes_follow_admin_optional(keyed: KeyedServer) -> None:
    allowed = ADMIN_ALLOWED[keyed.setting]
    original = keyed.config()["beta"]
    for key in SENT:
        for path in ("/ssd/config", "/ssd/stats"):
            status, body = keyed.call("GET", path, key)
            assert status == (200 if key in allowed else 401), (keyed.setting, path, key, body)
        beta = 0.25 if original != 0.25 else 0.5
        status, body = keyed.call("POST", "/ssd/config", key, {"beta": beta})
        assert status == (200 if key in allowed else 401), (keyed.setting, key, body)
        assert keyed.config()["beta"] == (beta if key in allowed else original), key
        if key in allowed:
            status, _ = keyed.call("POST", "/ssd/config", keyed.admin_key, {"beta": original})
            assert status == 200
    keyed.assert_serving()


def test_generate_keeps_sglangs_normal_auth(keyed: KeyedServer) -> None:
    body = {"input_ids": PROMPT_IDS, "sampling_params": {"max_new_tokens": 2}}
    for key in SENT:
        status, reply = keyed.call("POST", "/generate", key, body)
        allowed = key in GENERATE_ALLOWED[keyed.setting]
        assert status == (200 if allowed else 401), (keyed.setting, key, reply)


@pytest.mark.parametrize("budget", [1000, 1_000_000, 100_000_000])
def test_fanout_the_speculator_cannot_hold_gets_400_and_changes_nothing(
    keyed: KeyedServer, budget: int
) -> None:
    before = keyed.config()
    status, body = keyed.call("POST", "/ssd/config", keyed.admin_key, {"fanout_budget": budget})
    assert status == 400, body
    message = body["error"]["message"]
    assert "--ssd-fanout-budget must be" in message and f"got {budget}" in message, body
    assert keyed.config() == before
    keyed.assert_serving()


def test_a_sane_fanout_budget_is_applied_and_served(keyed: KeyedServer) -> None:
    before = keyed.config()
    status, body = keyed.call("POST", "/ssd/config", keyed.admin_key, {"fanout_budget": 16})
    assert status == 200, body
    assert body["acknowledged"]["fanout_budget"] == 16 and keyed.config()["fanout_budget"] == 16
    keyed.assert_serving()
    restore = {"fanout_budget": before["fanout_budget"]}
    assert keyed.call("POST", "/ssd/config", keyed.admin_key, restore)[0] == 200
    status, stats = keyed.call("GET", "/ssd/stats", keyed.admin_key)
    assert status == 200 and stats["faults"] == 0 and stats["restarts"] == 0, stats
