"""The admin side of the link to the speculator: live settings and counters.

`SpeculatorAdmin` answers `POST /ssd/config` (`Configure`, acknowledged with `ConfigureAck`) and
the speculator's half of `GET /ssd/stats` (`StatsRequest` / `StatsReply`, plus the client's own
bookkeeping). It takes the speculator client's lock, so a change lands between rounds, and it
updates the client's `config`, the settings a restarted speculator starts from.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from sglang_ssd.config import SSDConfig, SSDConfigError, TargetCapacity
from sglang_ssd.transport import (
    Configure,
    ConfigureAck,
    Message,
    SpeculatorStats,
    StatsReply,
    StatsRequest,
    TransportError,
)
from sglang_ssd.worker.round_mode import mode_refusal
from sglang_ssd.worker.speculator_client import SpeculatorClient

logger = logging.getLogger(__name__)

STATS_TIMEOUT_S = 5.0

# Hears each live change the admin accepted, with the settings now in force
# (`RoundPlanner.apply`).
ConfigureListener = Callable[[Mapping[str, Any], SSDConfig], None]
Reply = TypeVar("Reply", bound=Message)


def speculator_config(config: SSDConfig, capacity: TargetCapacity | None) -> SSDConfig:
    """`config` with the speculator's KV pool sized from `capacity`, the target's
    (`SSDConfig.draft_kv_slots`, unless `--ssd-draft-kv-tokens` is given)."""
    sized = config.replace(draft_kv_tokens=config.draft_kv_slots(capacity))
    logger.info(
        "SSD: speculator KV pool of %d tokens (%s; target: %s)",
        sized.draft_kv_tokens,
        "--ssd-draft-kv-tokens" if config.draft_kv_tokens else "sized from the target",
        capacity,
    )
    return sized


@dataclass(frozen=True)
class SpeculatorClientStats:
    """The client's own counters for `/ssd/stats`.

    Attributes:
        faults, restarts: the speculator's faults (timeouts, crashes) and restarts since start.
        speculator_up: a speculator is linked now.
        target_opened, target_pending, target_tracked, target_features_buffered: the requests
            the client opened, those whose Open waits, those it tracks, and those whose target
            features wait to be sent (leak checks under load).
        draft_kv_tokens: the speculator's KV pool size the client chose, in tokens.
        drafts_received: Drafts received since start, `draft_forwards` the draft forwards they
            report and `build_draft_forwards` those of pre-speculation builds.
        phase_s: the speculator's seconds by phase since start (`sglang_ssd.phases`).
        cores_lent: the plain rounds' core lendings since start.
        speculator_pid: the speculator process's id; None while none runs.
    """

    faults: int
    restarts: int
    speculator_up: bool
    target_opened: int
    target_pending: int
    target_tracked: int
    target_features_buffered: int
    draft_kv_tokens: int
    drafts_received: int
    draft_forwards: int
    build_draft_forwards: int
    phase_s: dict[str, float]
    cores_lent: int
    speculator_pid: int | None = None


@dataclass(frozen=True)
class LinkStats:
    """`SpeculatorAdmin.stats`: the speculator's counters (None: it is down or did not answer)
    and the client's."""

    speculator: SpeculatorStats | None
    client: SpeculatorClientStats


class SpeculatorAdmin:
    """Live settings and counters of `client`'s speculator (see the module docstring).

    `capacity` is the target's (it bounds the fan-out budget: the longest request); None
    without a target (tests). `on_configure` hears each accepted change.
    """

    def __init__(
        self,
        client: SpeculatorClient,
        capacity: TargetCapacity | None = None,
        on_configure: ConfigureListener | None = None,
    ) -> None:
        self.client = client
        self.capacity = capacity
        self.on_configure = on_configure

    @property
    def config(self) -> SSDConfig:
        """The settings in force (the client's copy, which live changes update)."""
        return self.client.config

    def configure(self, request: Configure) -> ConfigureAck | None:
        """Apply `request.changes` between rounds (the admin endpoint) and tell the speculator.

        Returns:
            The speculator's acknowledgement (every live setting in force), or None when none
            acknowledged (none running, a fault, no answer within the timeout): the target then
            applied the changes alone, and a restarted speculator starts from `config`.

        Raises:
            SSDConfigError: a change `SSDConfig` refuses, `mode` plain off the CPU, or a fan-out
                budget above what the speculator's KV pool and one round's outcomes can hold
                (then nothing changes).
        """
        client = self.client
        changes = request.changes.given()
        refusal = mode_refusal(changes.get("mode", "async"), str(client.target_device))
        if refusal is not None:
            raise SSDConfigError(refusal)
        with client.lock:
            if "fanout_budget" in changes:
                longest = self.capacity.longest_request if self.capacity is not None else 0
                client.config.check_fanout_budget(
                    changes["fanout_budget"], longest, client.vocab_size
                )
            client.config = client.config.replace(**changes)
            if self.on_configure is not None:
                self.on_configure(changes, client.config)
            return self._ask(request, ConfigureAck, client.config.speculator_timeout, "configure")

    def _ask(
        self, request: Message, reply: type[Reply], timeout_s: float, what: str
    ) -> Reply | None:
        """One admin round trip on the live link (the client's lock held): the reply, or None
        when no speculator is up, it did not answer in `timeout_s`, or the link faulted."""
        supervisor = self.client.supervisor
        if not supervisor.usable():
            return None
        try:
            supervisor.link.send(request)
            return supervisor.link.recv_reply(reply, timeout_s)
        except TransportError as exc:  # RemoteError included
            supervisor.fault(f"{what}: {exc}")
            return None

    def stats(self) -> LinkStats:
        """The speculator's counters (None when it is down or did not answer within
        `STATS_TIMEOUT_S`) and the client's."""
        client = self.client
        supervisor = client.supervisor
        with client.lock:
            got = self._ask(StatsRequest(), StatsReply, STATS_TIMEOUT_S, "stats")
            if got is None and supervisor.link is not None:  # busy or hung: the next round says
                logger.warning("SSD: no stats from the speculator in %.0f s", STATS_TIMEOUT_S)
            process = supervisor.process
            return LinkStats(
                speculator=None if got is None else got.stats,
                client=SpeculatorClientStats(
                    faults=supervisor.faults,
                    restarts=supervisor.restarts,
                    speculator_up=supervisor.link is not None,
                    target_opened=len(client.opened),
                    target_pending=len(client.pending),
                    target_tracked=len(client.last_seen),
                    target_features_buffered=len(client.features),
                    draft_kv_tokens=client.config.draft_kv_tokens or 0,
                    drafts_received=client.drafts_received,
                    draft_forwards=client.draft_forwards,
                    build_draft_forwards=client.build_draft_forwards,
                    phase_s=dict(sorted(client.speculator_phases.seconds.items())),
                    cores_lent=supervisor.lending.lends,
                    speculator_pid=None if process is None else process.pid,
                ),
            )
