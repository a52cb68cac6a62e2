"""`python -m sglang_ssd.speculator`: the speculator process (spawned by the SSD target worker).

It pins itself to its own device (a CUDA device, or a disjoint set of CPU cores with a matching
torch thread count), loads the draft model, connects to the target's link and serves it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import torch

from sglang_ssd.config import SSDConfig, parse_cpu_list
from sglang_ssd.speculator.affinity import pin_process
from sglang_ssd.speculator.draft_model import DraftModel
from sglang_ssd.speculator.engine import SpeculatorEngine
from sglang_ssd.speculator.server import SpeculatorServer
from sglang_ssd.transport import LinkAddress, SpeculatorLink

logger = logging.getLogger("sglang_ssd.speculator")

DEFAULT_KV_SLOTS = 65536


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_ssd.speculator")
    parser.add_argument("--address", required=True, help="LinkAddress JSON from the target")
    parser.add_argument("--model-path", required=True, help="draft model folder (HF format)")
    parser.add_argument("--config", required=True, help="SSDConfig JSON")
    parser.add_argument("--device", default="cpu", help="cpu or cuda:N")
    parser.add_argument("--cpus", default=None, help="CPU list to pin to (CPU device)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--kv-slots", type=int, default=DEFAULT_KV_SLOTS)
    parser.add_argument("--parent-pid", type=int, default=os.getppid())
    parser.add_argument("--connect-timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("SGLANG_SSD_SPECULATOR_LOG", "INFO"),
        format="[%(asctime)s] [speculator] %(message)s",
    )
    config = SSDConfig.from_json(args.config)
    if args.device == "cpu" and args.cpus:
        pin_process(parse_cpu_list(args.cpus))
    else:
        torch.cuda.set_device(torch.device(args.device))
    model = DraftModel.load(
        args.model_path,
        device=args.device,
        dtype=getattr(torch, args.dtype),
        num_slots=args.kv_slots,
    )
    engine = SpeculatorEngine(model, config)
    link = SpeculatorLink.connect(
        LinkAddress.from_json(args.address),
        args.connect_timeout,
        device=args.device if args.device != "cpu" else None,
    )
    logger.info(
        "speculator ready: pid %d, device %s, cpus %s, threads %d, mode %s",
        os.getpid(),
        args.device,
        sorted(os.sched_getaffinity(0)),
        torch.get_num_threads(),
        config.mode,
    )
    try:
        SpeculatorServer(link, engine, args.parent_pid).run()
    finally:
        link.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
