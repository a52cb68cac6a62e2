"""Start, watch, fault, restart and stop the speculator process from the target side.

The speculator is a real separate process (`python -m sglang_ssd.speculator`) in the server's
process tree, so SGLang's process-tree cleanup reaches it: on CPU forked from the launcher's
speculator zygote (`sglang_ssd.launch.zygote`, its imports done at the launcher's start),
otherwise a child of the SGLang scheduler; it also exits by itself when the scheduler disappears
(`speculator.parent`). On CPU it gets its own cores; on GPU its own device
(`sglang_ssd.launch.placement`).
`Supervisor` keeps one such process linked: a fault kills it and restarts it in the background,
with a growing backoff while restarts fail (docs/design.md#when-the-speculator-is-down).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psutil
import torch

from sglang_ssd.config import SSDConfig
from sglang_ssd.launch import zygote
from sglang_ssd.launch.placement import Placement
from sglang_ssd.transport import LinkAddress, TargetLink, TransportError, TransportTimeout
from sglang_ssd.transport.tensor_link import Backend
from sglang_ssd.worker.core_lending import CoreLending, omp_wait_problem

logger = logging.getLogger(__name__)

KILL_WAIT_S = 10.0
# The start-up wait is progress-based: the speculator's process tree (a JIT compiler child
# included) must use CPU at least every STARTUP_STALL_S (it loads and warms up the draft), and
# links within STARTUP_LIMIT_S however busy it is.
STARTUP_STALL_S = 120.0
STARTUP_LIMIT_S = 1800.0
STARTUP_PROGRESS_CPU_S = 0.01  # CPU seconds between two polls that count as progress
RESTART_BACKOFF_S = 2.0  # first retry after a fault; doubles per failed restart
RESTART_BACKOFF_MAX_S = 60.0
ACCEPT_POLL_S = 2.0


class SpeculatorProcess:
    """One speculator child process."""

    def __init__(
        self,
        config: SSDConfig,
        model_path: str,
        address: LinkAddress,
        placement: Placement,
        dtype: str = "bfloat16",
        target_vocab_size: int | None = None,
        target_model_path: str | None = None,
    ) -> None:
        """Spawn the speculator; `target_vocab_size` (the target's logit width) keeps a wider
        draft from drafting ids the target lacks (`draft_vocab.limit`); `target_model_path`
        gives an EAGLE-3 head draft the target's embeddings."""
        args = [
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
            "--dp-rank",
            str(placement.dp_rank),
        ]
        if target_vocab_size is not None:
            args += ["--target-vocab-size", str(target_vocab_size)]
        if target_model_path is not None:
            args += ["--target-model-path", str(target_model_path)]
        env = dict(os.environ)
        if placement.cpus:
            args += ["--cpus", ",".join(map(str, placement.cpus))]
            env["OMP_NUM_THREADS"] = str(len(placement.cpus))
        self.placement = placement
        self.proc: subprocess.Popen[bytes] | zygote.ZygoteChild = self._start(args, env)
        logger.info("SSD: started speculator pid %d on %s", self.proc.pid, placement)

    def _start(
        self, args: list[str], env: dict[str, str]
    ) -> subprocess.Popen[bytes] | zygote.ZygoteChild:
        """`python -m sglang_ssd.speculator ARGS`: forked from the launcher's speculator zygote
        when there is one and the device is the CPU (`sglang_ssd.launch.zygote`: its imports are
        done); exec'd otherwise, or when the zygote cannot be reached (logged)."""
        address = zygote.address(zygote.SPECULATOR_ADDRESS_ENV)
        if address is not None and self.placement.device == "cpu":
            try:
                return zygote.fork(address, args, env)
            except zygote.ZygoteError as exc:
                logger.warning("SSD: speculator zygote unusable (%s); starting one cold", exc)
        cmd = [sys.executable, "-m", zygote.SPECULATOR_MODULE, *args]
        return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def cpu_seconds(self) -> float | None:
        """User + system CPU seconds of the process tree (None once the process is gone): the
        process, its live descendants (e.g. an `nvcc` that FlashInfer's JIT starts) and the
        children they reaped. The supervisor reads its growth as progress while the speculator
        starts, the client while it waits for drafts.

        GPU work is not measured apart: a CUDA host thread waiting for a kernel spins or yields
        on its CPU (the runtime's default `cudaDeviceScheduleAuto`), so it shows here.
        """
        try:
            root = psutil.Process(self.proc.pid)
            total = _tree_cpu_seconds(root)
            for child in root.children(recursive=True):
                try:
                    total += _tree_cpu_seconds(child)
                except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                    continue  # gone meanwhile: its time reaches its parent's children_* once reaped
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            return None
        return total

    def stop(self, timeout_s: float = 5.0) -> None:
        """Terminate (then kill) the process and reap it, and kill what it started; idempotent,
        never raises."""
        if self.proc.poll() is not None:
            return
        descendants = self._descendants()
        self.proc.terminate()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
        _kill_all(descendants)

    def kill(self) -> None:
        """SIGKILL the process and what it started (e.g. a JIT compiler that would otherwise
        outlive it, orphaned) and reap it (works on a stopped, i.e. SIGSTOPped, process too);
        idempotent, never raises."""
        if self.proc.poll() is not None:
            return
        descendants = self._descendants()
        self.proc.kill()
        try:
            self.proc.wait(KILL_WAIT_S)
        except subprocess.TimeoutExpired:  # uninterruptible sleep: the kernel reaps it later
            logger.error(
                "SSD: speculator pid %d survived SIGKILL for %.0f s", self.pid, KILL_WAIT_S
            )
        _kill_all(descendants)

    def _descendants(self) -> list[psutil.Process]:
        """The live processes the speculator started, children's children included."""
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            return []


def _kill_all(processes: list[psutil.Process]) -> None:
    """SIGKILL each of `processes` still running (psutil checks the pid was not reused)."""
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.kill()


def _tree_cpu_seconds(process: psutil.Process) -> float:
    """User + system CPU seconds of `process` and of its children it has reaped."""
    t = process.cpu_times()
    return float(t.user + t.system + t.children_user + t.children_system)


def link_backend(
    placement: Placement, target_device: torch.device, cuda_available: bool
) -> tuple[Backend, torch.device | None]:
    """(tensor backend, the target's device for it) of a link to a speculator at `placement`.

    NCCL when both sides are on CUDA devices (and CUDA works here), with the target's own
    device, named: torch's NCCL group otherwise takes the calling thread's current device,
    which on the restart thread is cuda:0, another replica's GPU when this target is not on it
    (`tensor_link._make_group` sets the device it is given). Gloo (device None) otherwise.
    """
    nccl = placement.device.startswith("cuda") and target_device.type == "cuda"
    if nccl and cuda_available:
        return "nccl", target_device
    return "gloo", None


class Supervisor:
    """Keeps one speculator process linked to the target.

    `link` and `process` are the live speculator, or both None while it is down (after a fault,
    until the background restart succeeds, and after `stop`). They change under `lock`, the
    client's lock, which `usable` and `fault` expect held; `forget` is called with it held each
    time the linked speculator changes, since the new one knows no request. For a plain round
    `cores_lent` stops the process and lends its CPU cores to the target.

    Args:
        config: returns the settings a (re)started speculator starts from (live changes
            included).
        model_path: the draft model.
        placement: where the speculator runs.
        lock: the client's lock.
        forget: drops the client's per-request state.
        target_vocab_size: the target's logit width, passed to every speculator started.
        target_model_path: the target's folder, passed likewise (an EAGLE-3 head reads it).
        target_device: the target's device ("cuda:N" on GPU): every link, first or
            restarted, is made on it (`link_backend`).
    """

    def __init__(
        self,
        config: Callable[[], SSDConfig],
        model_path: str,
        placement: Placement,
        lock: threading.Lock,
        forget: Callable[[], None],
        target_vocab_size: int | None = None,
        target_model_path: str | None = None,
        target_device: torch.device | str = "cpu",
    ) -> None:
        self.config = config
        self.target_device = torch.device(target_device)
        self.target_vocab_size = target_vocab_size
        self.target_model_path = target_model_path
        self.model_path = model_path
        self.placement = placement
        self.lending = CoreLending(placement.target_cpus, placement.cpus or ())
        problem = omp_wait_problem() if self.lending.enabled else None
        if problem is not None:
            logger.warning("SSD: %s", problem)
        self.lock = lock
        self.forget = forget
        self.link: TargetLink | None = None
        self.process: SpeculatorProcess | None = None
        self.faults = 0
        self.restarts = 0
        self._restarting: threading.Thread | None = None
        self._closing = threading.Event()  # set by `stop`: no more (re)starts

    def start(self) -> None:
        """Launch the speculator and wait for its link while it makes progress (`_launch`).

        Raises:
            TransportError: the process exited or never linked; nothing is left running.
        """
        self._install(*self._launch())

    def _launch(self) -> tuple[TargetLink, SpeculatorProcess]:
        """Start a speculator and wait for its link. The wait is progress-based: it goes on
        while the speculator's process tree uses CPU (loading the draft, its warm-up round, a
        JIT compile in a child process) and fails after `STARTUP_STALL_S` without progress, or
        after `STARTUP_LIMIT_S` in all.

        Raises:
            TransportError: the process exited, stalled, or ran out of time (it is stopped).
        """
        config = self.config()
        backend, device = link_backend(
            self.placement, self.target_device, torch.cuda.is_available()
        )
        link = TargetLink(
            backend=backend, device=device, tensor_timeout_s=config.speculator_timeout
        )
        address = link.start()
        process = SpeculatorProcess(
            config,
            self.model_path,
            address,
            self.placement,
            target_vocab_size=self.target_vocab_size,
            target_model_path=self.target_model_path,
        )
        start = last_progress = time.monotonic()
        cpu = process.cpu_seconds()
        try:
            while True:
                try:
                    link.accept(ACCEPT_POLL_S)
                    return link, process
                except TransportTimeout:
                    if not process.alive():
                        raise TransportError(
                            f"speculator exited with code {process.proc.returncode} during "
                            "startup (see its log above)"
                        ) from None
                    if self._closing.is_set():
                        raise TransportError("shutting down") from None
                    now, used = time.monotonic(), process.cpu_seconds()
                    if used is not None and (cpu is None or used - cpu >= STARTUP_PROGRESS_CPU_S):
                        last_progress, cpu = now, used
                    if now - last_progress > STARTUP_STALL_S:
                        raise TransportError(
                            f"speculator pid {process.pid} made no progress for "
                            f"{STARTUP_STALL_S:.0f} s during startup"
                        ) from None
                    if now - start > STARTUP_LIMIT_S:
                        raise TransportError(
                            f"speculator pid {process.pid} did not link within "
                            f"{STARTUP_LIMIT_S:.0f} s"
                        ) from None
        except BaseException:
            process.stop()
            link.close()
            raise

    def _install(self, link: TargetLink, process: SpeculatorProcess) -> bool:
        """Make ``link``/``process`` the live speculator; False (and both stopped) after
        `stop`."""
        with self.lock:
            if self._closing.is_set():
                link.close()
                process.stop()
                return False
            self.link, self.process = link, process
            self.forget()
            return True

    @contextmanager
    def cores_lent(self) -> Iterator[None]:
        """For a sync or plain round's forward (or a prefill): the speculator stopped and its
        CPU cores lent to the target (`CoreLending`), under the client's lock so that no admin
        request waits on a stopped speculator. A plain round's tokens reach the speculator with
        the next Step's outcomes (`Outcome.extra`)."""
        with self.lock:
            process = self.process
            pid = process.pid if process is not None and process.alive() else None
            with self.lending.lent(pid):
                yield

    def fault(self, reason: str) -> None:
        """Kill a misbehaving speculator and restart it in the background; until then the
        target serves with its own n-gram drafts. Call with the lock held."""
        self.faults += 1
        logger.error(
            "SSD: speculator fault (%s); serving with target-side n-gram drafts and restarting it",
            reason,
        )
        link, process = self.link, self.process
        self.link = self.process = None
        self.forget()
        if process is not None:
            # SIGKILL, not SIGTERM: a hung (e.g. SIGSTOPped) process never handles SIGTERM, and
            # a faulty one has nothing to save. Reaped here, so no zombie or orphan is left.
            process.kill()
        if link is not None:
            link.close()
        self._maybe_restart()

    def usable(self) -> bool:
        """Whether a live speculator is linked; a dead process is a fault (found at once, not
        after a send or receive timeout). Call with the lock held."""
        if self.link is None or self.process is None:
            self._maybe_restart()
            return False
        if not self.process.alive():
            pid, code = self.process.pid, self.process.proc.returncode
            self.fault(f"speculator process {pid} exited with code {code}")
            return False
        return True

    def _maybe_restart(self) -> None:
        """Start the restart thread unless it runs (or we are stopping)."""
        if self._closing.is_set() or (self._restarting and self._restarting.is_alive()):
            return
        self._restarting = threading.Thread(
            target=self._restart_loop, name="ssd-restart", daemon=True
        )
        self._restarting.start()

    def _restart_loop(self) -> None:
        """Relaunch the speculator after a backoff, retrying (with a growing backoff) until it
        is up or `stop` is called. Runs on its own thread, so a restart needs no traffic and
        never blocks the scheduler."""
        backoff = RESTART_BACKOFF_S
        while not self._closing.wait(backoff):
            try:
                link, process = self._launch()
            except Exception as exc:
                backoff = min(2 * backoff, RESTART_BACKOFF_MAX_S)
                logger.error(
                    "SSD: speculator restart failed (%s); retrying in %.0f s", exc, backoff
                )
                continue
            if self._install(link, process):
                self.restarts += 1
                logger.info("SSD: speculator restarted (pid %d); back to SSD", process.pid)
            return

    def stop(self) -> None:
        """Stop the speculator (and any restart in progress) for good; idempotent."""
        self._closing.set()
        with self.lock:
            if self.link is not None:
                self.link.close()
            if self.process is not None:
                self.process.stop()
            self.link = self.process = None
