"""The draft model's paged KV cache: one slot per token (page size 1), per-layer K and V.

Slots are handed out from a LIFO free stack kept as an int64 tensor on the CPU (bookkeeping never
syncs with the device), so `alloc(n)` and `free(slots)` are a few tensor ops, not a Python loop
over tokens. A bool "allocated" map makes double frees and frees of never-allocated slots an error
when `debug` is on (`default_debug`: on the CPU, off on CUDA, where each check reads device
memory; `SGLANG_SSD_KV_POOL_DEBUG` overrides it, and the GPU checks turn it on).

`affordable_slots` and `available_memory` keep a pool sized from the target's capacity within
the memory the speculator's device has left.
"""

from __future__ import annotations

import os

import torch

# "1" turns a pool's debug checks on, "0" off, whatever its device (`default_debug`).
DEBUG_ENV = "SGLANG_SSD_KV_POOL_DEBUG"
# A pool takes at most this share of the memory its device has free once the weights are in.
POOL_MEMORY_SHARE = 0.5


def default_debug(device: torch.device | str) -> bool:
    """Whether a pool on `device` runs its debug checks: `SGLANG_SSD_KV_POOL_DEBUG` ("1" or
    "0") when set, else on everywhere but CUDA (serving there skips the checks: each is a
    device-to-host read, a host sync).

    Raises:
        ValueError: on another value of `SGLANG_SSD_KV_POOL_DEBUG`.
    """
    value = os.environ.get(DEBUG_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{DEBUG_ENV} must be 1 (checks on) or 0 (off), got {value!r}")
    if value:
        return value == "1"
    return torch.device(device).type != "cuda"


def slot_bytes(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Memory one token costs across all layers (K and V)."""
    return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def affordable_slots(
    requested: int, bytes_per_slot: int, available_bytes: int, share: float = POOL_MEMORY_SHARE
) -> int:
    """`requested` slots, or as many (at least one) as fit in `share` of `available_bytes`."""
    return max(1, min(requested, int(available_bytes * share) // max(bytes_per_slot, 1)))


def available_memory(device: torch.device | str) -> int:
    """Bytes a new allocation can take on `device` now: CUDA's free memory, or on the CPU the
    kernel's MemAvailable (Linux's /proc/meminfo).

    Raises:
        OSError: when /proc/meminfo cannot be read or has no MemAvailable.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise OSError("/proc/meminfo has no MemAvailable")


class KVPoolExhausted(RuntimeError):
    """Raised by `KVPool.alloc` when fewer free slots remain than requested."""


class KVPool:
    """Per-layer K/V tensors [num_slots, num_kv_heads, head_dim] and a slot allocator.

    Args:
        num_layers: decoder layers of the draft model.
        num_slots: tokens the pool holds (all requests, all branches together).
        num_kv_heads: KV heads per layer (Hkv).
        head_dim: per-head size d of keys and values.
        dtype: K/V dtype (the model's dtype, e.g. torch.bfloat16).
        device: where K/V live; slot tensors returned by `alloc` live there too.
        debug: check every `free` for double frees, unallocated and out-of-range slots (and
            let the draft model check its output slots); None: `default_debug(device)`.

    Attributes:
        k, v: lists of num_layers tensors [num_slots, num_kv_heads, head_dim].

    Raises:
        ValueError: on non-positive sizes.
    """

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
        debug: bool | None = None,
    ) -> None:
        for name, value in (
            ("num_layers", num_layers),
            ("num_slots", num_slots),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
        ):
            if value <= 0:
                raise ValueError(f"KVPool {name} must be positive, got {value}")
        self.num_layers = num_layers
        self.num_slots = num_slots
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        self.debug = default_debug(self.device) if debug is None else debug
        shape = (num_slots, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        # Free stack: the top is at _num_free - 1; reversed so that a fresh pool hands out 0, 1, ...
        self._free_stack = torch.arange(num_slots - 1, -1, -1, dtype=torch.int64)
        self._num_free = num_slots
        self._allocated = torch.zeros(num_slots, dtype=torch.bool)

    @property
    def num_free(self) -> int:
        """Slots available to `alloc`."""
        return self._num_free

    @property
    def num_used(self) -> int:
        """Slots currently allocated."""
        return self.num_slots - self._num_free

    @property
    def bytes_per_slot(self) -> int:
        """Memory one token costs across all layers (K and V)."""
        return slot_bytes(self.num_layers, self.num_kv_heads, self.head_dim, self.dtype)

    def alloc(self, n: int) -> torch.Tensor:
        """Take `n` free slots.

        Returns:
            int64 [n] on the pool's device, distinct slots in [0, num_slots).

        Raises:
            KVPoolExhausted: if fewer than n slots are free (nothing is allocated then).
            ValueError: if n < 0.
        """
        if n < 0:
            raise ValueError(f"cannot allocate {n} slots")
        if n > self._num_free:
            raise KVPoolExhausted(
                f"KV pool exhausted: {n} slots requested, {self._num_free} of {self.num_slots} free"
            )
        top = self._num_free
        slots = self._free_stack[top - n : top].flip(0)
        self._num_free = top - n
        self._allocated[slots] = True
        return slots.to(self.device)

    def free(self, slots: torch.Tensor) -> None:
        """Return slots to the pool; their K/V contents become garbage.

        Args:
            slots: int [n] (any device), each currently allocated, no repeats.

        Raises:
            ValueError: (debug) on out-of-range, repeated, or not-allocated slots (double free).
        """
        slots = slots.reshape(-1).to(device="cpu", dtype=torch.int64)
        n = slots.numel()
        if n == 0:
            return
        if n > self.num_used:
            raise ValueError(f"free: {n} slots returned but only {self.num_used} are allocated")
        if self.debug:
            if int(slots.min()) < 0 or int(slots.max()) >= self.num_slots:
                raise ValueError(f"free: slot out of range [0, {self.num_slots})")
            if not bool(self._allocated[slots].all()):
                bad = slots[~self._allocated[slots]][:8].tolist()
                raise ValueError(f"free: slots not allocated (double free?): {bad}")
            if slots.unique().numel() != n:
                raise ValueError("free: repeated slots in one call")
        self._allocated[slots] = False
        self._free_stack[self._num_free : self._num_free + n] = slots.flip(0)
        self._num_free += n

    def is_allocated(self, slots: torch.Tensor) -> torch.Tensor:
        """bool [n]: whether each slot is currently allocated."""
        return self._allocated[slots.reshape(-1).to(device="cpu", dtype=torch.int64)]

    def reset(self) -> None:
        """Free every slot (K/V contents are left as they are)."""
        self._free_stack = torch.arange(self.num_slots - 1, -1, -1, dtype=torch.int64)
        self._num_free = self.num_slots
        self._allocated.zero_()

    def __repr__(self) -> str:
        return (
            f"KVPool(layers={self.num_layers}, slots={self.num_slots}, used={self.num_used}, "
            f"kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, dtype={self.dtype}, "
            f"device={self.device})"
        )
