"""Host-to-device copies that do not wait for the device.

A plain `tensor.to("cuda")` from pageable host memory is a blocking copy: the host waits for
every kernel queued before it, as a device-to-host read does. `to_device` copies a host tensor
through pinned memory with `non_blocking=True` instead (PyTorch's caching host allocator keeps
the pinned buffer alive until the copy has run), the way SGLang uploads its per-batch sampling
parameters (`sampling_batch_info.py`, `from_schedule_batch`). Imports with torch alone.
"""

from __future__ import annotations

import torch


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`tensor` on `device`: unchanged when it is already there; from the host to a CUDA
    device through pinned memory without a sync; otherwise `tensor.to(device)`.

    Args:
        tensor: any tensor (a host one is the case this is for).
        device: the destination.

    Returns:
        The tensor on `device` (the same values, dtype and shape).
    """
    device = torch.device(device)
    if tensor.device == device or (device.type == tensor.device.type and device.index is None):
        return tensor
    if tensor.device.type == "cpu" and device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
