"""Spawn, watch and stop the speculator process from the target side.

The speculator is a real separate process (`python -m sglang_ssd.speculator`), a child of the
SGLang scheduler so SGLang's process-tree cleanup reaches it; it also exits by itself when its
parent disappears. On CPU it gets its own cores; on GPU its own device.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import dataclass

from sglang_ssd.config import SSDConfig
from sglang_ssd.transport import LinkAddress

logger = logging.getLogger(__name__)

KILL_WAIT_S = 10.0


@dataclass(frozen=True)
class Placement:
    """Where the speculator runs: `device` ("cpu" / "cuda:N") and, on CPU, its cores."""

    device: str
    cpus: tuple[int, ...] | None


class SpeculatorProcess:
    """One speculator child process."""

    def __init__(
        self,
        config: SSDConfig,
        model_path: str,
        address: LinkAddress,
        placement: Placement,
        dtype: str = "bfloat16",
    ) -> None:
        cmd = [
            sys.executable,
            "-m",
            "sglang_ssd.speculator",
            "--address",
            address.to_json(),
            "--model-path",
            str(model_path),
            "--config",
            config.to_json(),
            "--device",
            placement.device,
            "--dtype",
            dtype,
            "--parent-pid",
            str(os.getpid()),
        ]
        env = dict(os.environ)
        if placement.cpus:
            cmd += ["--cpus", ",".join(map(str, placement.cpus))]
            env["OMP_NUM_THREADS"] = str(len(placement.cpus))
        self.placement = placement
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL)
        logger.info("SSD: started speculator pid %d on %s", self.proc.pid, placement)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 5.0) -> None:
        """Terminate (then kill) the process and reap it; idempotent, never raises."""
        if self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the process and reap it (works on a stopped, i.e. SIGSTOPped, process too);
        idempotent, never raises."""
        if self.proc.poll() is not None:
            return
        self.proc.kill()
        try:
            self.proc.wait(KILL_WAIT_S)
        except subprocess.TimeoutExpired:  # uninterruptible sleep: the kernel reaps it later
            logger.error(
                "SSD: speculator pid %d survived SIGKILL for %.0f s", self.pid, KILL_WAIT_S
            )
