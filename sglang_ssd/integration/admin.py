"""The SSD admin endpoints: `GET/POST /ssd/config` and `GET /ssd/stats`.

SGLang's HTTP server runs in the main process, the `SSDWorker` in the scheduler subprocess.
The bridge is a ZMQ REP socket that the scheduler binds once its SSD worker exists
(`AdminServer`, a daemon thread), on an ipc:// path both processes derive from the server's
`PortArgs.instance_id` (`admin_address`). Requests and replies are small JSON objects, never
pickle. The main process adds the routes to SGLang's FastAPI app and forwards each call
(`sglang_ssd.integration.admin_routes`). Live changes go through `SpeculatorClient.configure`,
which validates them via `SSDConfig`, takes the client's lock (so they land between rounds) and
tells the speculator.
"""

from __future__ import annotations

import atexit
import copy
import json
import logging
import os
import tempfile
import threading
from typing import Any

logger = logging.getLogger(__name__)

# Settings that can change at run time, with the JSON types each accepts.
LIVE_SETTINGS: dict[str, tuple[type, ...]] = {
    "beta": (int, float),
    "fanout_budget": (int,),
    "fanout": (str,),
    "backup": (str,),
}
REPLY_TIMEOUT_S = 75.0  # the client may wait a round plus `--ssd-speculator-timeout` for an ack


class AdminError(Exception):
    """An admin call that fails with an HTTP status and a message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def admin_address(port_args: Any) -> str:
    """The ipc:// address of the admin socket of the server that owns `port_args`."""
    tag = getattr(port_args, "instance_id", None) or str(os.getpid())
    return f"ipc://{os.path.join(tempfile.gettempdir(), f'sglang-ssd-admin-{tag}')}"


def validate_changes(body: Any) -> dict[str, Any]:
    """Check a `POST /ssd/config` body's shape and types; `SSDConfig` checks the values.

    Raises:
        AdminError: 400 for a non-object, an empty object, unknown keys or wrong types.
    """
    if not isinstance(body, dict) or not body:
        raise AdminError(
            400, f"expected a JSON object with some of {sorted(LIVE_SETTINGS)}, got {body!r}"
        )
    unknown = sorted(set(body) - set(LIVE_SETTINGS))
    if unknown:
        raise AdminError(
            400, f"unknown or read-only SSD settings {unknown}; settable: {sorted(LIVE_SETTINGS)}"
        )
    for key, value in body.items():
        if isinstance(value, bool) or not isinstance(value, LIVE_SETTINGS[key]):
            kinds = "/".join(t.__name__ for t in LIVE_SETTINGS[key])
            raise AdminError(400, f"{key} must be a {kinds}, got {value!r}")
    return dict(body)


# ------------------------------------------------------------------ scheduler side
def settings(worker: Any) -> dict[str, Any]:
    """The SSD settings in force (the client's copy is the one live changes update)."""
    config = getattr(worker.provider, "config", None) or worker.config
    return {
        "beta": config.beta,
        "fanout_budget": config.fanout_budget,
        "fanout": config.fanout,
        "backup": config.backup,
        "mode": config.mode,
        "lookahead": config.lookahead,
        "tree_depth": config.depth,
        "batch_threshold": config.batch_threshold,
        "speculator_timeout": config.speculator_timeout,
        "draft_device": config.draft_device,
        "draft_cpus": list(config.draft_cpus) if config.draft_cpus is not None else None,
    }


def stats(worker: Any) -> dict[str, Any]:
    """Per-round averages on both sides, cache hit rate, backup rounds, faults and restarts, and
    the miss policy's b* (`fallback`)."""
    out: dict[str, Any] = _timer_summary(worker.timer)
    for prefix, key in (("source_", "rounds_by_source"), ("accepted_", "accepted_by_source")):
        grouped = {k[len(prefix) :]: v for k, v in out.items() if k.startswith(prefix)}
        out = {k: v for k, v in out.items() if not k.startswith(prefix)}
        out[key] = grouped
    provider_stats = getattr(worker.provider, "stats", None)
    speculator = dict(provider_stats()) if provider_stats is not None else {}
    steps = max(speculator.get("steps", 0.0), 1.0)
    for name in ("build_s", "lookup_s", "backup_s", "send_s"):
        if name in speculator:
            out[f"avg_speculator_{name}"] = speculator[name] / steps
    if "send_s" in speculator:
        out["avg_transport_s"] = speculator["send_s"] / steps
    for name in ("faults", "restarts", "speculator_up"):
        if name in speculator:
            out[name] = speculator[name]
    out["speculator"] = speculator
    policy = getattr(worker.provider, "policy", None)
    if policy is not None:
        try:
            out["fallback"] = fallback(policy)
        except Exception as exc:  # the scheduler thread may be updating it: keep the counters
            out["fallback"] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def fallback(policy: Any) -> dict[str, Any]:
    """The cache-miss policy's state: its mode, b* as set and b* that `auto` would pick from the
    current measurements (the same as b* in auto mode; what a forced backup is compared with)."""
    auto = copy.copy(policy)  # shallow: reads the live estimates, changes only the copy's mode
    auto.mode = "auto"
    mode = getattr(policy.mode, "value", policy.mode)
    return {
        "mode": mode,
        "batch_threshold": policy.batch_threshold(),
        "auto_batch_threshold": auto.batch_threshold(),
        "p_hit": policy.p_hit,
        "alpha_hit": policy.alpha_hit,
        "backups": {
            getattr(k, "value", k): {"alpha": v.alpha, "latency_s": v.latency}
            for k, v in dict(policy.backups).items()
        },
    }


def _timer_summary(timer: Any, attempts: int = 3) -> dict[str, Any]:
    """`RoundTimer.summary()` read from this thread while the scheduler thread records rounds
    (iterating its source counter can meet a key being added: retry)."""
    for attempt in range(attempts):
        try:
            return dict(timer.summary())
        except RuntimeError:
            if attempt == attempts - 1:
                raise
    return {}


def configure(worker: Any, changes: dict[str, Any]) -> dict[str, Any]:
    """Validate and apply live changes; returns what the speculator acknowledged and the
    settings now in force.

    Raises:
        AdminError: 400 for values `SSDConfig` refuses, 409 without a speculator client.
    """
    from sglang_ssd.config import SSDConfigError

    changes = validate_changes(changes)
    apply = getattr(worker.provider, "configure", None)
    if apply is None:
        raise AdminError(409, "this SSD worker has no speculator to configure")
    current = getattr(worker.provider, "config", None) or worker.config
    try:
        current.replace(**changes)
    except SSDConfigError as exc:
        raise AdminError(400, str(exc)) from None
    acknowledged = apply(**changes)
    logger.info("SSD: settings changed at run time: %s (speculator: %s)", changes, acknowledged)
    return {"acknowledged": acknowledged, "config": settings(worker)}


def handle(worker: Any, raw: bytes) -> dict[str, Any]:
    """Answer one admin request (JSON ``{"op": ..., "changes": {...}}``) for `worker`.

    Returns:
        ``{"status": 200, "body": ...}`` or ``{"status": code, "error": message}``.
    """
    try:
        try:
            request = json.loads(raw)
        except ValueError as exc:
            raise AdminError(400, f"malformed admin request: {exc}") from None
        op = request.get("op") if isinstance(request, dict) else None
        if op == "config":
            body = settings(worker)
        elif op == "configure":
            body = configure(worker, request.get("changes"))
        elif op == "stats":
            body = stats(worker)
        else:
            raise AdminError(400, f"unknown admin operation {op!r}")
        return {"status": 200, "body": body}
    except AdminError as exc:
        return {"status": exc.status, "error": str(exc)}
    except Exception as exc:  # report, keep serving
        logger.exception("SSD admin request failed")
        return {"status": 500, "error": f"{type(exc).__name__}: {exc}"}


class AdminServer:
    """Serves `handle` for one SSD worker on a ZMQ REP socket in a daemon thread."""

    def __init__(self, worker: Any, address: str) -> None:
        self.worker = worker
        self.address = address
        self.thread = threading.Thread(target=self._serve, name="ssd-admin", daemon=True)

    def start(self) -> AdminServer:
        self.thread.start()
        return self

    def _serve(self) -> None:
        import zmq

        context = zmq.Context()
        socket = context.socket(zmq.REP)
        socket.setsockopt(zmq.LINGER, 0)
        try:
            socket.bind(self.address)
        except zmq.ZMQError as exc:
            logger.error("SSD admin: cannot bind %s: %s", self.address, exc)
            return
        path = self.address.removeprefix("ipc://")
        atexit.register(lambda: os.path.exists(path) and os.unlink(path))
        logger.info("SSD admin endpoint bridge listening on %s", self.address)
        while True:
            raw = socket.recv()
            socket.send(json.dumps(handle(self.worker, raw)).encode())


def start_admin_server(worker: Any, port_args: Any) -> AdminServer:
    """Bind the admin socket for `worker` (call once, in the scheduler process)."""
    return AdminServer(worker, admin_address(port_args)).start()


# ------------------------------------------------------------------ HTTP side
def ask(address: str, op: str, timeout_s: float = REPLY_TIMEOUT_S, **payload: Any) -> dict:
    """One blocking round trip to the scheduler's admin socket.

    Raises:
        AdminError: 504 when the scheduler does not answer within `timeout_s`.
    """
    import zmq

    context = zmq.Context.instance()
    socket = context.socket(zmq.REQ)
    socket.setsockopt(zmq.LINGER, 0)
    try:
        socket.connect(address)
        socket.send(json.dumps({"op": op, **payload}).encode())
        if not socket.poll(int(timeout_s * 1000)):
            raise AdminError(504, f"the SSD worker did not answer within {timeout_s:.0f} s")
        return json.loads(socket.recv())
    finally:
        socket.close()
