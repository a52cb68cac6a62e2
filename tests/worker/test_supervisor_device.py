"""Every link to the speculator, first or restarted, is made on the target's device:
torch's NCCL group otherwise takes the calling thread's current device, cuda:0 on the
restart thread, another DP replica's GPU when this target is elsewhere."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from sglang_ssd.config import SSDConfig
from sglang_ssd.launch.placement import Placement
from sglang_ssd.worker import supervisor
from sglang_ssd.worker.supervisor import Supervisor, link_backend

TARGET = torch.device("cuda", 3)


@pytest.mark.parametrize(
    ("speculator", "target", "cuda", "expected"),
    [
        ("cuda:1", TARGET, True, ("nccl", TARGET)),
        ("cuda:1", torch.device("cpu"), True, ("gloo", None)),
        ("cpu", TARGET, True, ("gloo", None)),
        ("cuda:1", TARGET, False, ("gloo", None)),
    ],
)
def test_nccl_only_between_cuda_devices_and_on_the_targets(
    speculator: str, target: torch.device, cuda: bool, expected: tuple
) -> None:
    assert link_backend(Placement(speculator, None), target, cuda) == expected


class _Stop(Exception):
    """Raised by the recording link: the test needs the arguments, not a link."""


def test_a_restart_links_on_the_targets_device_not_the_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`_launch` runs on the restart thread (whose current CUDA device would be 0): the link
    it builds still names the target's device."""
    seen: list[dict[str, Any]] = []

    def record(**kwargs: Any) -> None:
        seen.append(kwargs)
        raise _Stop

    monkeypatch.setattr(supervisor, "TargetLink", record)
    monkeypatch.setattr(supervisor.torch.cuda, "is_available", lambda: True)
    sup = Supervisor(
        SSDConfig,
        "draft",
        Placement("cuda:1", None),
        threading.Lock(),
        lambda: None,
        target_device="cuda:3",
    )
    errors: list[BaseException] = []

    def launch() -> None:
        try:
            sup._launch()
        except BaseException as exc:  # the recorded stop, checked below
            errors.append(exc)

    thread = threading.Thread(target=launch)
    thread.start()
    thread.join(30)
    assert len(errors) == 1 and isinstance(errors[0], _Stop), errors
    (kwargs,) = seen
    assert kwargs["backend"] == "nccl" and kwargs["device"] == TARGET, kwargs
