"""`python -m sglang_ssd.speculator`: the speculator process (spawned by the SSD target worker).

It pins itself to its own device (a CUDA device, or a disjoint set of CPU cores with a matching
torch thread count), loads the draft model, connects to the target's link and serves it. A
watchdog thread ends the process as soon as its parent (the target's scheduler) is gone, in
every phase (loading, connecting, serving, a blocked transfer), so it never outlives the target.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time

import torch

from sglang_ssd.config import SSDConfig
from sglang_ssd.launch.cpu_lists import parse_cpu_list
from sglang_ssd.launch.placement import pin_process
from sglang_ssd.speculator import draft_vocab
from sglang_ssd.speculator.engine import SpeculatorEngine
from sglang_ssd.speculator.kv_pool import POOL_MEMORY_SHARE
from sglang_ssd.speculator.parent import parent_alive
from sglang_ssd.speculator.runtimes import LoadRequest, create_draft_runtime
from sglang_ssd.speculator.server import SpeculatorServer
from sglang_ssd.speculator.warmup import warm_up
from sglang_ssd.transport import LinkAddress, SpeculatorLink, TransportError

logger = logging.getLogger("sglang_ssd.speculator")

PARENT_POLL_S = 0.5
EXIT_LINK_REFUSED = 3


def watch_parent(parent_pid: int, poll_s: float = PARENT_POLL_S) -> threading.Thread:
    """Exit the process (status 0) once process ``parent_pid`` is gone (`parent_alive`).

    A daemon thread, because the main thread may be busy for long (loading the model, a draft
    forward) or blocked (a tensor transfer to a target that was SIGKILLed).
    """

    def watch() -> None:
        while parent_alive(parent_pid):
            time.sleep(poll_s)
        logger.warning("speculator: parent %d is gone; exiting", parent_pid)
        logging.shutdown()
        os._exit(0)

    thread = threading.Thread(target=watch, name="ssd-parent-watch", daemon=True)
    thread.start()
    return thread


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_ssd.speculator")
    parser.add_argument("--address", required=True, help="LinkAddress JSON from the target")
    parser.add_argument("--model-path", required=True, help="draft model folder (HF format)")
    parser.add_argument(
        "--target-model-path",
        default=None,
        help="the target's folder (an EAGLE-3 head draft reads the target's embeddings)",
    )
    parser.add_argument("--config", required=True, help="SSDConfig JSON")
    parser.add_argument("--device", default="cpu", help="cpu or cuda:N")
    parser.add_argument("--cpus", default=None, help="CPU list to pin to (CPU device)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument(
        "--kv-slots",
        type=int,
        default=None,
        help="KV pool in tokens (default: the config's draft_kv_tokens, which the target sizes)",
    )
    parser.add_argument(
        "--target-vocab-size",
        type=int,
        default=None,
        help="the target's logit width: a wider draft never drafts the ids beyond it",
    )
    parser.add_argument("--parent-pid", type=int, default=os.getppid())
    parser.add_argument("--dp-rank", type=int, default=0, help="the DP replica served")
    parser.add_argument("--connect-timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("SGLANG_SSD_SPECULATOR_LOG", "INFO"),
        format=f"[%(asctime)s] [speculator DP{args.dp_rank}] %(message)s",
    )
    watch_parent(args.parent_pid)
    config = SSDConfig.from_json(args.config)
    if args.device != "cpu":
        torch.cuda.set_device(torch.device(args.device))
    elif args.cpus:
        pin_process(parse_cpu_list(args.cpus))
    kv_slots = args.kv_slots or config.draft_kv_slots(None)
    request = LoadRequest(
        args.model_path, args.target_model_path, args.device, args.dtype, kv_slots,
        POOL_MEMORY_SHARE,
    )  # fmt: skip
    model = create_draft_runtime(config.draft_runtime, request)
    pool = model.kv_pool
    if pool.num_slots < kv_slots:
        logger.warning(
            "speculator KV pool cut to %d of the %d tokens asked for: more would take over %.0f%% "
            "of the memory left on %s (requests that do not fit get backup drafts)",
            pool.num_slots,
            kv_slots,
            100 * POOL_MEMORY_SHARE,
            args.device,
        )
    logger.info(
        "speculator KV pool: %d tokens (%.1f MiB)",
        pool.num_slots,
        pool.num_slots * pool.bytes_per_slot / 2**20,
    )
    if model.owns_vocab:  # e.g. an EAGLE-3 head's own vocabulary
        if config.draft_vocab != SSDConfig().draft_vocab:
            logger.warning("--ssd-draft-vocab is ignored: the draft runtime has its own vocabulary")
    else:
        if config.draft_vocab:
            draft_vocab.install(model, args.model_path, config.draft_vocab)
        if args.target_vocab_size:
            draft_vocab.limit_to_target(model, args.target_vocab_size)
    engine = SpeculatorEngine(model, config)
    # One round at the serving shapes before linking: its one-time costs (a FlashInfer JIT
    # compile on CUDA) fall in the startup wait, which the target judges by progress.
    warmup_s = warm_up(engine)
    q_columns = engine.q_columns
    try:
        link = SpeculatorLink.connect(
            LinkAddress.from_json(args.address),
            args.connect_timeout,
            device=args.device if args.device != "cpu" else None,
            q_columns=None if q_columns is None else q_columns.tolist(),
        )
    except TransportError as exc:  # e.g. a protocol version mismatch: nothing to serve
        logger.error("speculator: cannot link to the target: %s; exiting", exc)
        return EXIT_LINK_REFUSED
    logger.info(
        "speculator ready: pid %d, draft runtime %s (%s), device %s, cpus %s, threads %d, mode %s, "
        "warm-up %s",
        os.getpid(),
        type(model).__name__,
        config.draft_runtime,
        args.device,
        sorted(os.sched_getaffinity(0)),
        torch.get_num_threads(),
        config.mode,
        "skipped (the draft reads the target's features)"
        if warmup_s is None
        else f"{warmup_s:.2f} s",
    )
    try:
        SpeculatorServer(link, engine, args.parent_pid).run()
    finally:
        link.close()
    return 0


if __name__ == "__main__":
    # Ctrl-C in a terminal signals the whole process group: the target owns our lifetime (it
    # sends Shutdown, kills us, or exits, which `watch_parent` notices), so SIGINT is not ours.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(main())
