"""`TensorLink`: the SSD link's own two-rank torch.distributed group for draft tensors.

SGLang's scheduler owns the default process group, so the link never calls
`init_process_group`: rank 0 (the target) hosts its own `TCPStore` on a free port, rank 1 (the
speculator) connects to it, and both build a `ProcessGroupGloo` (CPU) or `ProcessGroupNCCL`
(both sides on CUDA devices) directly on a `PrefixStore` scoped to the link's session. Shapes and
dtypes never travel here: they come from the control message (`Drafts`), so `send` and `recv`
must be called with matching tensor lists, in the same order, on the two ranks. Zero-element
tensors are skipped on both sides. A failed or timed-out transfer leaves the group unusable:
close the link and start a new one.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

import torch
import torch.distributed as dist

from sglang_ssd.transport.wire import (
    TransportError,
    TransportTimeout,
)

logger = logging.getLogger(__name__)

Backend = Literal["gloo", "nccl"]
TensorSpec = tuple[tuple[int, ...], torch.dtype]  # (shape, dtype) of one tensor to receive
TARGET_RANK, SPECULATOR_RANK = 0, 1
FIRST_USE_MARK = 0x55D0  # + the sender's rank: the value each side sends in `_first_use`


@dataclass
class TransferStats:
    """Totals for one direction of a `TensorLink`; seconds include waiting for the peer."""

    count: int = 0
    bytes: int = 0
    seconds: float = 0.0
    last_s: float = 0.0

    def add(self, nbytes: int, seconds: float) -> None:
        self.count += 1
        self.bytes += nbytes
        self.seconds += seconds
        self.last_s = seconds


def master_store(host: str = "127.0.0.1", timeout_s: float = 60.0) -> dist.TCPStore:
    """The target's TCPStore on a free port (read it from ``.port``); keep it while linked."""
    return dist.TCPStore(
        host, 0, 2, True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
    )


class TensorLink:
    """A two-rank process group carrying tensors between the target (rank 0) and speculator (1)."""

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        session: str,
        backend: Backend = "gloo",
        device: torch.device | str | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        """Join the group; blocks until the other rank joins too.

        Args:
            store: the target's `master_store` on rank 0, a client of it on rank 1 (`connect`).
            rank: `TARGET_RANK` or `SPECULATOR_RANK`.
            session: scopes the store keys, so one store can serve successive links.
            backend: "gloo" (CPU tensors; CUDA tensors are copied to the host) or "nccl".
            device: the CUDA device for "nccl" (default: the current one); ignored by gloo.
            timeout_s: rendezvous and per-transfer timeout, seconds.

        Raises:
            TransportTimeout: the peer did not join within ``timeout_s``.
            TransportError: the backend is unavailable or the group could not be built.
        """
        if rank not in (TARGET_RANK, SPECULATOR_RANK):
            raise ValueError(f"rank must be 0 or 1, got {rank}")
        if backend == "nccl" and device is None:
            if not torch.cuda.is_available():
                raise TransportError("the nccl backend needs a CUDA device on this side")
            device = torch.device("cuda", torch.cuda.current_device())
        self.rank, self.peer = rank, 1 - rank
        self.backend: Backend = backend
        self.timeout_s = timeout_s
        self.device = torch.device(device if backend == "nccl" else "cpu")
        self.sent, self.received = TransferStats(), TransferStats()
        self._store = store
        prefixed = dist.PrefixStore(f"sglang_ssd/{session}/", store)
        try:
            self._group = _make_group(prefixed, rank, backend, self.device, timeout_s)
        except (RuntimeError, ValueError) as err:  # DistStoreError / DistNetworkError included
            kind = TransportTimeout if _is_timeout(err) else TransportError
            raise kind(f"tensor link ({backend}, rank {rank}) failed to start: {err}") from err
        try:
            self._first_use()
        except TransportError:
            self.close()
            raise

    @classmethod
    def connect(
        cls,
        host: str,
        port: int,
        session: str,
        backend: Backend = "gloo",
        device: torch.device | str | None = None,
        timeout_s: float = 30.0,
    ) -> TensorLink:
        """Speculator side: connect to the target's store at ``host:port`` and join as rank 1."""
        try:
            store = dist.TCPStore(host, port, 2, False, timeout=timedelta(seconds=timeout_s))
        except RuntimeError as err:
            raise TransportTimeout(f"tensor link store {host}:{port} unreachable: {err}") from err
        return cls(store, SPECULATOR_RANK, session, backend, device, timeout_s)

    def send(self, tensors: list[torch.Tensor]) -> float:
        """Send ``tensors`` to the peer, which must `recv` the same shapes and dtypes in order.

        Returns the seconds taken (blocks until the peer has received them).

        Raises:
            TransportTimeout / TransportError: the peer did not receive within the timeout / failed.
        """
        start = time.perf_counter()
        tensors = [self._placed(t) for t in tensors if t.numel()]
        self._wait(
            lambda: [self._group.send([t], self.peer, tag) for tag, t in enumerate(tensors)], "send"
        )
        seconds = time.perf_counter() - start
        self.sent.add(sum(t.nbytes for t in tensors), seconds)
        return seconds

    def recv(self, specs: list[TensorSpec]) -> list[torch.Tensor]:
        """Receive one tensor per ``(shape, dtype)`` spec, on `device` (CPU for gloo).

        Raises:
            TransportTimeout / TransportError: nothing arrived within the timeout / failed.
        """
        start = time.perf_counter()
        out = [torch.empty(shape, dtype=dtype, device=self.device) for shape, dtype in specs]
        live = [t for t in out if t.numel()]
        self._wait(
            lambda: [self._group.recv([t], self.peer, tag) for tag, t in enumerate(live)], "recv"
        )
        self.received.add(sum(t.nbytes for t in live), time.perf_counter() - start)
        return out

    def _first_use(self) -> None:
        """One small tensor each way (target first) before the link is up. torch's NCCL group
        builds the communicator of a lone send/recv lazily, at its first use
        (`ProcessGroupNCCL::pointToPoint`), apart from the one `eager_connect_single_device`
        built: without this exchange the first round would pay its initialisation. Gloo runs
        the same exchange, so the CPU tests cover this code. Not counted in `sent`/`received`.

        Raises:
            TransportTimeout / TransportError: the peer did not answer / answered wrongly.
        """
        out = torch.tensor([FIRST_USE_MARK + self.rank], dtype=torch.int64, device=self.device)
        got = torch.zeros(1, dtype=torch.int64, device=self.device)
        steps = [
            (lambda: [self._group.send([out], self.peer, 0)], "first send"),
            (lambda: [self._group.recv([got], self.peer, 0)], "first recv"),
        ]
        if self.rank == SPECULATOR_RANK:  # the speculator answers the target's send
            steps.reverse()
        for post, what in steps:
            self._wait(post, what)
        if int(got.item()) != FIRST_USE_MARK + self.peer:
            raise TransportError(f"tensor link first use: got {int(got.item())} from the peer")

    def _placed(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().to(self.device, non_blocking=False).contiguous()

    def _wait(self, post: Callable[[], list], what: str) -> None:
        """Post the transfers (``post`` returns their works) and wait for them. Posting raises
        too when the peer is already gone: both become `TransportError`, never a bare
        RuntimeError that would escape the callers' fault handling."""
        if self._group is None:
            raise TransportError(f"tensor link {what}: the link is closed")
        try:
            for work in post():
                work.wait(timedelta(seconds=self.timeout_s))
            if self.device.type == "cuda":  # the transfer is done only when the stream is
                torch.cuda.current_stream(self.device).synchronize()
        except RuntimeError as err:
            kind = TransportTimeout if _is_timeout(err) else TransportError
            raise kind(f"tensor link {what} failed: {err}") from err

    def close(self) -> None:
        """Tear the group down and drop the store (the master's port is freed); idempotent."""
        group, self._group = getattr(self, "_group", None), None
        if group is not None:
            try:
                group.shutdown()
            except RuntimeError as err:  # a peer that is already gone is not an error here
                logger.debug("tensor link shutdown: %s", err)
        self._store = None


def _is_timeout(err: Exception) -> bool:
    text = str(err).lower()
    return "timeout" in text or "timed out" in text


def _make_group(
    store: dist.Store, rank: int, backend: Backend, device: torch.device, timeout_s: float
) -> dist.ProcessGroup:
    timeout = timedelta(seconds=timeout_s)
    if backend == "gloo":
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timeout
        # Loopback explicitly: both processes run on this host, and hostname lookup can be slow.
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        return dist.ProcessGroupGloo(store, rank, 2, opts)
    if backend != "nccl":
        raise ValueError(f"backend must be gloo or nccl, got {backend!r}")
    if not dist.is_nccl_available() or device.type != "cuda":
        raise TransportError(f"nccl needs a CUDA build and a cuda device, got {device}")
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    torch.cuda.set_device(device)
    group = nccl_group(store, rank, opts)
    group.eager_connect_single_device(device)  # build the communicator now, not mid-round
    return group


# torch's NCCL error handling modes (`ErrorHandlingMode`, torch/csrc/distributed/c10d/
# ProcessGroupNCCL.hpp): 2 aborts the failed work's communicators without taking the process
# down; the default, 3 (SkipCleanUp), and 1 (TearDown) rethrow on the watchdog thread.
NCCL_ERROR_HANDLING_ENV = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
NCCL_CLEAN_UP_ONLY = "2"


def nccl_group(store: dist.Store, rank: int, opts: dist.ProcessGroupNCCL.Options):
    """The link's two-rank `ProcessGroupNCCL`, built so that a failed or timed-out transfer is a
    Python exception on the calling thread, never the end of the process.

    torch's NCCL watchdog thread (`Watchdog::runLoop` in ProcessGroupNCCL.cpp) checks every
    posted work; on an error or a timeout it aborts the communicators when `SHOULD_CLEAN_UP`
    and then calls `work.handleException(asyncErrorHandling_)`, which rethrows *on the
    watchdog thread* when `SHOULD_TEAR_DOWN`: with torch's default mode (3, SkipCleanUp) an
    unmatched p2p, e.g. a speculator killed between its Drafts and their tensors, would
    terminate the scheduler. The mode is read once per process group, in the
    `ProcessGroupNCCL` constructor (`getCvarInt(TORCH_NCCL_ASYNC_ERROR_HANDLING, 3)`), so this
    group alone is built with CleanUpOnly (2): the watchdog aborts its communicator and
    rethrows nothing, SGLang's own groups keep their mode, and `WorkNCCL::wait(timeout)`,
    which `TensorLink._wait` always calls with the link's timeout, blocks the caller's thread
    until the work completes or fails and raises there (`handleException` on the main
    thread), which `_wait` turns into `TransportError` / `TransportTimeout`.

    Args:
        store: the link's prefixed store; rank: 0 (target) or 1 (speculator); opts: its
            options (timeout set).
    """
    previous = os.environ.get(NCCL_ERROR_HANDLING_ENV)
    os.environ[NCCL_ERROR_HANDLING_ENV] = NCCL_CLEAN_UP_ONLY
    try:
        return dist.ProcessGroupNCCL(store, rank, 2, opts)
    finally:
        if previous is None:
            del os.environ[NCCL_ERROR_HANDLING_ENV]
        else:
            os.environ[NCCL_ERROR_HANDLING_ENV] = previous
