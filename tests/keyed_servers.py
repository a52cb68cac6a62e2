"""The session's tiny SSD servers with API keys, one per key setting (test helper).

`test_ssd_admin_auth.py` checks the SSD routes' auth on them; `test_ssd_shutdown.py` then stops
two of them with a signal (each shutdown check needs a live SSD server, and a key changes
nothing there), so the session starts three servers for both modules instead of five. They
start side by side on first use (`KeyedPool.get`); `take` hands one over to a test that stops
it, and a later `get` starts the missing ones again, so the order of the modules does not
matter (in file order the auth module comes first and nothing restarts).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import requests
from tiny_servers import ssd_args

from eval.servers import Server, started_together

API, ADMIN = "api-secret", "admin-secret"
# Key setting → (--api-key, --admin-api-key). "none" is the session's shared tiny SSD server.
KEYS: dict[str, tuple[str | None, str | None]] = {
    "none": (None, None),
    "api": (API, None),
    "admin": (None, ADMIN),
    "both": (API, ADMIN),
}
PROMPT_IDS = [68, 69, 70, 0, 70, 73, 66, 79, 78]  # "def fibon"


class KeyedServer:
    """A running tiny SSD server, its key setting, and requests sent with a chosen key."""

    def __init__(self, setting: str, server: Server) -> None:
        self.setting = setting
        self.server = server
        api_key, admin_key = KEYS[setting]
        self.admin_key = admin_key or api_key  # a key the SSD routes accept
        self.generate_key = api_key  # a key /generate accepts (None: open)

    def call(
        self, method: str, path: str, key: str | None, body: object = None
    ) -> tuple[int, object]:
        """(HTTP status, decoded JSON body) of `method path` sent with bearer token `key`."""
        headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
        response = requests.request(
            method, self.server.url + path, json=body, headers=headers, timeout=300
        )
        return response.status_code, response.json()

    def config(self) -> dict:
        """`GET /ssd/config`'s settings, with the admin key (raises AssertionError on a
        non-200)."""
        status, config = self.call("GET", "/ssd/config", self.admin_key)
        assert status == 200 and isinstance(config, dict), config
        return config["settings"]

    def generate(self, new_tokens: int, prompt: str | None = None) -> dict:
        """Greedy `/generate` of `new_tokens` tokens (of `PROMPT_IDS`, or of `prompt`) with the
        key /generate needs; raises AssertionError unless it answers 200 with that many."""
        source = {"text": prompt} if prompt is not None else {"input_ids": PROMPT_IDS}
        body = {**source, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0}}
        status, out = self.call("POST", "/generate", self.generate_key, body)
        assert status == 200 and isinstance(out, dict), out
        assert len(out["output_ids"]) == new_tokens, out
        return out


def keyed_server(setting: str, target: Path, draft: Path, logs: Path) -> Server:
    """A tiny SSD server (not started) with `setting`'s keys (`KEYS`) and no warm-up."""
    api_key, admin_key = KEYS[setting]
    args = [
        *ssd_args(target, draft, ["--skip-server-warmup"]),
        *(("--api-key", api_key) if api_key else ()),
        *(("--admin-api-key", admin_key) if admin_key else ()),
    ]
    return Server(f"ssd-{setting}", args, log_path=logs / f"{setting}.log")


class KeyedPool:
    """The keyed servers ("api", "admin", "both") of the tiny pair, started on first use."""

    def __init__(self, target: Path, draft: Path, logs: Path) -> None:
        self._made = lambda setting: keyed_server(setting, target, draft, logs)
        self._running: dict[str, Server] = {}
        self._stack = contextlib.ExitStack()

    def get(self) -> dict[str, KeyedServer]:
        """Every keyed server, running; the missing ones are started side by side.

        Raises:
            eval.servers.ServerError: if one fails to start.
        """
        self._start([s for s in KEYS if s != "none"])
        return {s: KeyedServer(s, server) for s, server in self._running.items()}

    def take(self, setting: str) -> KeyedServer:
        """The running `setting` server (started if missing), no longer the pool's: the caller
        stops it (`close` stops it too if it is still running then)."""
        self._start([setting])
        return KeyedServer(setting, self._running.pop(setting))

    def _start(self, settings: list[str]) -> None:
        made = {s: self._made(s) for s in settings if s not in self._running}
        if made:
            self._running |= self._stack.enter_context(started_together(made))

    def close(self) -> None:
        """Stop every server the pool started and that still runs."""
        self._running.clear()
        self._stack.close()
