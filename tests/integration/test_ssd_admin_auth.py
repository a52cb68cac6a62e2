"""`/ssd/config` and `/ssd/stats` under each API-key setting, and fan-out the speculator cannot
hold, on tiny-pair SSD servers: one per key setting (the session's shared
tiny SSD server for "no key"; the session's keyed servers, `keyed_servers.py`, for the others,
which `test_ssd_shutdown.py` later stops).

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

import pytest
from keyed_servers import ADMIN, API, KEYS, PROMPT_IDS, KeyedPool, KeyedServer

from eval.servers import Server

WRONG = "not-a-key"
SENT = (None, API, ADMIN, WRONG)  # the Authorization bearer token a client sends, if any
# Who may call the SSD routes (ADMIN_OPTIONAL), and /generate (NORMAL), per key setting.
ADMIN_ALLOWED = {"none": set(SENT), "api": {API}, "admin": {ADMIN}, "both": {ADMIN}}
GENERATE_ALLOWED = {"none": set(SENT), "api": {API}, "admin": set(SENT), "both": {API}}


@pytest.fixture(params=list(KEYS))
def keyed(
    request: pytest.FixtureRequest, keyed_pool: KeyedPool, tiny_servers: dict[str, Server]
) -> KeyedServer:
    """The server of one key setting: the session's shared tiny SSD server for "none", a
    keyed server of the session's pool (`keyed_servers.py`) for the others."""
    if request.param == "none":
        return KeyedServer("none", tiny_servers["ssd"])
    return keyed_pool.get()[request.param]


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
    keyed.generate(2)


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
    keyed.generate(2)


def test_a_sane_fanout_budget_is_applied_and_served(keyed: KeyedServer) -> None:
    before = keyed.config()
    status, body = keyed.call("POST", "/ssd/config", keyed.admin_key, {"fanout_budget": 16})
    assert status == 200, body
    assert body["acknowledged"]["fanout_budget"] == 16 and keyed.config()["fanout_budget"] == 16
    keyed.generate(2)
    restore = {"fanout_budget": before["fanout_budget"]}
    assert keyed.call("POST", "/ssd/config", keyed.admin_key, restore)[0] == 200
    status, stats = keyed.call("GET", "/ssd/stats", keyed.admin_key)
    assert status == 200 and stats["faults"] == 0 and stats["restarts"] == 0, stats
