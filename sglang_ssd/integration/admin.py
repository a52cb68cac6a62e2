"""The SSD admin endpoints: `GET/POST /ssd/config` and `GET /ssd/stats`.

SGLang's HTTP server runs in the main process, the `SSDWorker` in the scheduler subprocess.
The bridge is a ZMQ REP socket that the scheduler binds once its SSD worker exists
(`AdminServer`, a daemon thread), on an abstract ipc:// name (Linux's abstract socket namespace:
no file, so a scheduler killed without its exit handlers leaves nothing behind) both processes
derive from the server's `PortArgs.instance_id` and the scheduler's DP replica (`admin_address`;
SGLang gives every replica the server's instance id). With `--dp-size` N > 1 the HTTP process
asks every replica and lists their answers (`combine`). Requests and replies are typed msgpack
messages (`AdminRequest` / `AdminReply` in `sglang_ssd.transport.admin_messages`), never pickle.
The main process adds the routes to SGLang's FastAPI app and forwards each call
(`sglang_ssd.integration.admin_routes`). Live changes (`LiveSettings`, generated from
`SSDConfig`'s declarations) go through `SpeculatorAdmin.configure`, which takes the speculator
client's lock (so they land between rounds), tells the round planner and the speculator.
"""

from __future__ import annotations

import copy
import logging
import os
import re
import threading
from typing import TYPE_CHECKING, Any

import msgspec

from sglang_ssd.config import FLAGS, LIVE_FIELDS, SSDConfig, SSDConfigError
from sglang_ssd.integration.settings_view import AUTO, in_force, settings_view
from sglang_ssd.saguaro import Backup, FallbackPolicy
from sglang_ssd.transport.admin_messages import (
    AdminReply,
    AdminRequest,
    decode_admin,
    encode_admin,
)
from sglang_ssd.transport.messages import (
    Configure,
)
from sglang_ssd.transport.wire import (
    LiveSettings,
)

if TYPE_CHECKING:
    from sglang_ssd.worker.speculator_client import SpeculatorClient
    from sglang_ssd.worker.ssd_worker import SSDWorker

logger = logging.getLogger(__name__)

REPLY_TIMEOUT_S = 75.0  # the client may wait a round plus `--ssd-speculator-timeout` for an ack


class AdminError(Exception):
    """An admin call that fails with an HTTP status and a message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def admin_address(port_args: Any, dp_rank: int = 0) -> str:
    """The ipc:// address of the admin socket of DP replica `dp_rank` of the server that owns
    `port_args`: an abstract name (``ipc://@...``), which the kernel frees with the socket, so
    none is left on disk (SGLang kills its scheduler on shutdown before exit handlers run: 450
    socket files were found left in /tmp when the bridge used paths)."""
    tag = getattr(port_args, "instance_id", None) or str(os.getpid())
    return f"ipc://@sglang-ssd-admin-{tag}-dp{dp_rank}"


def admin_addresses(port_args: Any, dp_size: int) -> list[str]:
    """The admin sockets of every DP replica of the server, replica order."""
    return [admin_address(port_args, rank) for rank in range(dp_size)]


# ------------------------------------------------------------------ scheduler side
def settings(worker: SSDWorker) -> SSDConfig:
    """The SSD settings (`SpeculatorAdmin.config`, the copy live changes update); None where
    left to the server (`tree_depth` None: self-tuned), whose value in force `in_force` gives."""
    return worker.speculator_admin.config


def scheduler_load(scheduler: Any) -> dict[str, float]:
    """The scheduler's requests now: decoding (`target_running`) and queued (`target_waiting`).
    Read from the admin thread: each is one len() of a list the scheduler thread replaces."""
    return {
        "target_running": float(len(scheduler.running_batch.reqs)),
        "target_waiting": float(len(scheduler.waiting_queue)),
    }


def stats(worker: SSDWorker, scheduler: Any = None) -> dict[str, Any]:
    """The `--ssd-mode` served (`ssd_mode`), the arrangement held per batch-size bucket and
    the rates behind it (`arrangements`), per-round averages on both sides (and by phase:
    `target_phases`, `speculator_phases`, `t_p`), cache hit rate, backup rounds, faults and
    restarts, the miss policy's b* (`fallback`), the speculator's, the client's and the
    planner's counters (`speculator`), the DP replica that answers (`dp_rank`) and, given the
    `scheduler`, its running and waiting requests."""
    out: dict[str, Any] = worker.timer.snapshot().summary()
    out["dp_rank"] = worker.dp_rank
    out["ssd_mode"] = worker.config.mode
    link = worker.speculator_admin.stats()
    spec, client = link.speculator, link.client
    if spec is not None:  # the speculator answered
        steps = max(spec.steps, 1)
        out["avg_speculator_build_s"] = spec.build_s / steps
        out["avg_speculator_lookup_s"] = spec.lookup_s / steps
        out["avg_speculator_backup_s"] = spec.backup_s / steps
        out["avg_speculator_send_s"] = spec.send_s / steps
        out["avg_transport_s"] = spec.send_s / steps
    out["faults"] = client.faults
    out["restarts"] = client.restarts
    out["speculator_up"] = client.speculator_up
    counters = flat(spec) if spec is not None else {}
    out["speculator"] = {**counters, **flat(client), **worker.planner.stats()}
    plain = worker.plain_timer.snapshot().summary()
    out["plain_rounds"] = {
        k: plain[k] for k in ("rounds", "request_rounds", "avg_forward_s", "target_phases")
    }
    out["arrangements"] = arrangements(worker.planner)
    out.update(round_balance(out["target_phases"], worker.speculator_client))
    if scheduler is not None:
        out.update(scheduler_load(scheduler))
    try:
        out["fallback"] = fallback(worker.planner.policy)
    except Exception as exc:  # the scheduler thread may be updating it: keep the counters
        out["fallback"] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def flat(counters: Any) -> dict[str, Any]:
    """A stats struct or dataclass as `/ssd/stats`' `speculator` lists it: one key per field,
    a dict field `name` as one `name_<key>` per key (`fanout_hits_3`, `phase_s_glue`), a field
    that is None left out."""
    out: dict[str, Any] = {}
    for name, value in msgspec.to_builtins(counters).items():
        if isinstance(value, dict):
            out.update({f"{name}_{key}": v for key, v in value.items()})
        elif value is not None:
            out[name] = value
    return out


def arrangements(planner: Any) -> dict[str, Any]:
    """The arrangements `--ssd-mode` offers (`offered`, in calibration order), the switches
    since start and, per measured batch-size bucket (its upper size as a string), the
    arrangement held ("" while it calibrates) and each arrangement's round seconds, tokens per
    request per round and rate (tokens per request per second) behind that choice."""
    policy = planner.arrangements
    return {
        "offered": [str(a) for a in policy.offered],
        "switches": policy.switches,
        "buckets": policy.buckets(),
    }


def round_balance(target_phases: dict[str, float], client: SpeculatorClient) -> dict[str, Any]:
    """The speculator's seconds by phase per round (`speculator_phases`), its round
    (`speculator_round_s`), the target's round without waiting for drafts (`target_round_s`)
    and their ratio `t_p`: the speculator keeps up when T_p <= 1 (paper Theorem 7)."""
    phases = dict(client.speculator_phases.means(client.drafts_received))
    spec_round = sum(phases.values())
    target_round = sum(v for k, v in target_phases.items() if k != "wait_draft")
    return {
        "speculator_phases": phases,
        "speculator_round_s": spec_round,
        "target_round_s": target_round,
        "t_p": spec_round / target_round if target_round > 0 else None,
    }


def fallback(policy: FallbackPolicy) -> dict[str, Any]:
    """The cache-miss policy's state: its `--ssd-backup` setting (`backup`: "auto" or the forced
    backup), b* as set and b* that `auto` would pick from the current measurements (the same as
    b* in auto mode; what a forced backup is compared with)."""
    auto = copy.copy(policy)  # shallow: reads the live estimates, changes only the copy's mode
    auto.mode = "auto"
    backup = policy.mode.value if isinstance(policy.mode, Backup) else policy.mode
    return {
        "backup": backup,
        "batch_threshold": policy.batch_threshold(),
        "auto_batch_threshold": auto.batch_threshold(),
        "p_hit": policy.p_hit,
        "alpha_hit": policy.alpha_hit,
        "backups": {
            Backup(k).value: {
                "alpha": v.alpha,
                "latency_s": v.latency,
                "observations": v.observations,
            }
            for k, v in dict(policy.backups).items()
        },
    }


def configure(worker: SSDWorker, changes: LiveSettings) -> AdminReply:
    """Apply live changes; the reply holds what the speculator acknowledged and the settings now
    in force.

    Raises:
        AdminError: 400 for values `SSDConfig` refuses and for more fan-out than the
            speculator can hold (`SpeculatorAdmin.configure` checks before changing anything).
    """
    try:
        ack = worker.speculator_admin.configure(Configure(changes=changes))
    except SSDConfigError as exc:
        raise AdminError(400, str(exc)) from None
    logger.info("SSD: settings changed at run time: %s (speculator: %s)", changes, ack)
    return AdminReply(
        config=settings(worker),
        acknowledged=changes if ack is None else acknowledged(changes, ack.applied),
        applied_locally=ack is None,
    )


def acknowledged(changes: LiveSettings, applied: LiveSettings) -> LiveSettings:
    """The settings `changes` gave, with the values the speculator reports in force
    (`applied`, all its live settings); a setting it reports none for (`tree_depth` 0, which
    self-tunes: None there) keeps the value given."""
    held = applied.given()
    return LiveSettings(**{k: held.get(k, v) for k, v in changes.given().items()})


def handle(worker: SSDWorker, frame: bytes, scheduler: Any = None) -> AdminReply:
    """Answer one encoded `AdminRequest` for `worker` (and its `scheduler`, whose load the stats
    report); failures become the reply's status."""
    try:
        try:
            request = decode_admin(frame)
        except msgspec.DecodeError as exc:
            raise AdminError(400, f"malformed admin request: {exc}") from None
        if not isinstance(request, AdminRequest):
            raise AdminError(400, f"expected an AdminRequest, got {type(request).__name__}")
        if request.op == "config":
            return AdminReply(config=settings(worker), in_force=in_force(worker))
        if request.op == "configure":
            reply = configure(worker, request.changes)
            return msgspec.structs.replace(reply, in_force=in_force(worker))
        return AdminReply(stats=stats(worker, scheduler))
    except AdminError as exc:
        return AdminReply(status=exc.status, error=str(exc))
    except Exception as exc:  # report, keep serving
        logger.exception("SSD admin request failed")
        return AdminReply(status=500, error=f"{type(exc).__name__}: {exc}"[:4096])


def reply_frame(worker: SSDWorker, frame: bytes, scheduler: Any = None) -> bytes:
    """`handle`, encoded: a reply that cannot be encoded is answered as a 500."""
    reply = handle(worker, frame, scheduler)
    try:
        return encode_admin(reply)
    except (TypeError, ValueError) as exc:
        logger.exception("SSD admin reply could not be encoded")
        return encode_admin(AdminReply(status=500, error=f"unencodable reply: {exc}"[:4096]))


class AdminServer:
    """Serves `handle` for one SSD worker (and its scheduler) on a ZMQ REP socket in a daemon
    thread."""

    def __init__(self, worker: SSDWorker, address: str, scheduler: Any = None) -> None:
        self.worker = worker
        self.address = address
        self.scheduler = scheduler
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
        logger.info("SSD admin endpoint bridge listening on %s", self.address)
        while True:
            socket.send(reply_frame(self.worker, socket.recv(), self.scheduler))


def start_admin_server(worker: SSDWorker, port_args: Any, scheduler: Any = None) -> AdminServer:
    """Bind the admin socket for `worker` of `scheduler` (call once, in the scheduler process;
    the address names the worker's `dp_rank`)."""
    address = admin_address(port_args, worker.dp_rank)
    return AdminServer(worker, address, scheduler).start()


# ------------------------------------------------------------------ HTTP side
def parse_changes(body: bytes, current: dict[str, Any] | None = None) -> LiveSettings:
    """The `LiveSettings` of a `POST /ssd/config` body (a JSON object of some settings).

    A setting fixed at startup is accepted at its `current` value (`settings_view`'s: GET's
    ``settings`` posts back unchanged) and dropped; `tree_depth` "auto" self-tunes, as 0 does.

    Raises:
        AdminError: 400 for malformed JSON, a non-object, an empty object, a setting fixed at
            startup given another value (named by its flag), a null value (a setting left out
            keeps its value; `tree_depth` 0 self-tunes again), unknown keys, wrong types and
            values `SSDConfig` refuses (the message names the setting).
    """
    settable = f"settable at run time: {', '.join(LIVE_FIELDS)}"
    try:
        raw = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:  # msgspec's own text may begin "JSON is malformed: "
        detail = str(exc).removeprefix("JSON is malformed: ")
        raise AdminError(400, f"malformed JSON: {detail}") from None
    given = raw if isinstance(raw, dict) else {}
    current = current or {}
    fixed = [
        FLAGS[key].option
        for key, value in given.items()
        if key in FLAGS and key not in LIVE_FIELDS and (key not in current or current[key] != value)
    ]
    if fixed:
        raise AdminError(400, f"fixed at startup: {', '.join(fixed)} ({settable})")
    nulls = [key for key, value in given.items() if value is None]
    if nulls:  # `LiveSettings` reads null as "not given": say so rather than ignore it
        self_tune = ", or tree_depth 0 to self-tune" if "tree_depth" in nulls else ""
        raise AdminError(
            400, f"null is not a value of {', '.join(nulls)}: leave a setting out to keep it"
            f"{self_tune} ({settable})",
        )  # fmt: skip
    if isinstance(raw, dict):
        raw = {k: v for k, v in raw.items() if k not in FLAGS or k in LIVE_FIELDS}
        if raw.get("tree_depth") == AUTO:
            raw["tree_depth"] = 0
    try:
        changes = msgspec.convert(raw, LiveSettings)
    except msgspec.ValidationError as exc:
        # Every field of `LiveSettings` is optional (`X | None`); null is refused above.
        error = str(exc).replace(" | null", "")
        raise AdminError(400, f"{error}{_allowed_values(error)} ({settable})") from None
    if not changes.given():
        raise AdminError(400, f"no settings to change ({settable})")
    return changes


def _allowed_values(error: str) -> str:
    """ ": --ssd-X must be one of a, b, c" when msgspec's `error` is about a setting with a
    fixed set of values (msgspec names the path, `$.X`, not the values), else ""."""
    found = re.search(r"at `\$\.(\w+)`", error)
    flag = FLAGS.get(found.group(1)) if found else None
    if flag is None or not flag.choices:
        return ""
    return f": {flag.option} must be one of {', '.join(flag.choices)}"


def ask(address: str, request: AdminRequest, timeout_s: float = REPLY_TIMEOUT_S) -> AdminReply:
    """One blocking round trip to the scheduler's admin socket.

    Raises:
        AdminError: 504 when the scheduler does not answer within `timeout_s`, 502 when its
            answer does not decode.
    """
    import zmq

    context = zmq.Context.instance()
    socket = context.socket(zmq.REQ)
    socket.setsockopt(zmq.LINGER, 0)
    try:
        socket.connect(address)
        socket.send(encode_admin(request))
        if not socket.poll(int(timeout_s * 1000)):
            raise AdminError(504, f"the SSD worker did not answer within {timeout_s:.0f} s")
        reply = decode_admin(socket.recv())
    except msgspec.DecodeError as exc:
        raise AdminError(502, f"malformed reply from the SSD worker: {exc}") from None
    finally:
        socket.close()
    if not isinstance(reply, AdminReply):
        raise AdminError(502, f"the SSD worker answered with a {type(reply).__name__}")
    return reply


def ask_reply(address: str, request: AdminRequest) -> AdminReply:
    """`ask`, with its failures (no answer, a malformed one) as the reply's status."""
    try:
        return ask(address, request)
    except AdminError as exc:
        return AdminReply(status=exc.status, error=str(exc))


def combine(op: str, replies: list[AdminReply]) -> tuple[int, Any]:
    """The HTTP status and JSON body answering an `op` request from the replies of every DP
    replica (replica order).

    One replica: its `http_body` (or its error). Several: ``{"dp_size": N, "replicas":
    [{"dp_rank": r, ...its body}, ...]}``; settings are per replica too (a change goes to every
    replica), and counters are not summed (each replica's rounds, times and hit rate are its
    own). The first replica that failed answers for all, with ``DP replica r:`` before its
    message; a configure that one replica refused may have been applied by the others.
    """
    for rank, reply in enumerate(replies):
        if reply.status != 200:
            where = f"DP replica {rank}: " if len(replies) > 1 else ""
            return reply.status, {"error": {"message": where + (reply.error or "unknown error")}}
    bodies = [http_body(op, reply) for reply in replies]
    if len(bodies) == 1:
        return 200, bodies[0]
    listed = [{"dp_rank": rank, **body} for rank, body in enumerate(bodies)]
    return 200, {"dp_size": len(bodies), "replicas": listed}


def http_body(op: str, reply: AdminReply) -> Any:
    """The JSON body of a successful `reply` to an `op` request, as the HTTP routes return it.

    config: ``{"settings": ..., "in_force": ...}``, every setting as given (`settings_view`,
    which POST takes back) and its value in force now (`in_force`); configure: the same with
    ``"acknowledged"`` first (the settings given, as the speculator reports them in force, or
    with ``applied_locally: true`` when no speculator took them); stats: the counters.
    """
    if op == "stats":
        return reply.stats
    body = {"settings": settings_view(reply.config), "in_force": reply.in_force or {}}
    if op == "config":
        return body
    acknowledged = msgspec.to_builtins(reply.acknowledged)
    if reply.applied_locally:
        acknowledged = {"applied_locally": True, **acknowledged}
    return {"acknowledged": acknowledged, **body}
