"""Server start-up seconds five ways, to separate what each of the launcher's start-up paths
saves: SGLang's own (spawned children, the speculator exec'd), the preloading forkserver
(`sglang_ssd.launch.fork_start`), the forkserver plus the speculator forked from the launcher's
speculator zygote (`sglang_ssd.launch.zygote_process.fork_speculator_zygote`; the launcher's
default on CPU), and the launcher forked from a preloaded zygote (`sglang_ssd/launch/zygote.py`)
without and with the speculator zygote (the latter is how the test session starts its servers).

`python -m eval.startup [--rounds N] [--side-by-side K] [--model-path T --draft D] [--out FILE]`
starts SSD servers one arm at a time (K together with `--side-by-side K`, as CI's fixtures
start pairs), N rounds with the arms in forward then reverse order (A-B-C-C-B-A ...), each
timed by `eval.servers.Server` from the launcher's start (its exec, or the zygote's fork) to a
200 from `/health_generate`, and stopped before the next. The zygote is started once, first;
its one-off preload is recorded apart (`zygote_preload_s`), since a session pays it once for
all its servers. Without `--model-path` it trains the tests' tiny pair on the fly (about a
minute; `sglang_ssd.testing.trained_pair`), the pair most CI start-ups serve. Writes the
machine, every start-up and the median of each arm to FILE (JSON) and prints the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from eval import provenance
from eval.interleave import interleaved_order
from eval.servers import Server, started_together
from sglang_ssd.launch import zygote
from sglang_ssd.launch.fork_start import SWITCH


@dataclass(frozen=True)
class Arm:
    """One way to start a server: the launcher's forkserver switch, the speculator zygote's
    switch, and whether the launcher itself is forked from the bench's zygote."""

    forkserver: bool
    speculator_zygote: bool
    forked: bool

    def env(self) -> dict[str, str]:
        """The switches as the launcher reads them from its environment."""
        return {
            SWITCH: str(int(self.forkserver)),
            zygote.SPECULATOR_SWITCH: str(int(self.speculator_zygote)),
        }


ARMS = {
    "spawn": Arm(forkserver=False, speculator_zygote=False, forked=False),
    "forkserver": Arm(forkserver=True, speculator_zygote=False, forked=False),
    "forkserver+spec": Arm(forkserver=True, speculator_zygote=True, forked=False),
    "zygote": Arm(forkserver=True, speculator_zygote=False, forked=True),
    "zygote+spec": Arm(forkserver=True, speculator_zygote=True, forked=True),
}
TINY_FLAGS = ("--dtype", "float32", "--max-total-tokens", "8192")


def order(rounds: int) -> list[str]:
    """The arms over `rounds` rounds (one start-up each per round), forward in even rounds and
    reversed in odd ones (A-B-C-C-B-A), so a drift in the machine's speed cancels."""
    return [arm for i in range(rounds) for arm in interleaved_order(list(ARMS), i)]


def measure(
    argv: Sequence[str], rounds: int, logs: Path, side_by_side: int = 1, zygote_socket: str = ""
) -> dict[str, list[float]]:
    """Start-up seconds of each arm: `side_by_side` servers with `argv` started together (as
    CI's fixtures start pairs), one arm at a time; the forked arms fork from `zygote_socket`."""
    seconds: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for i, arm in enumerate(order(rounds)):
        made = {
            f"{arm}-{j}": Server(
                arm,
                list(argv),
                env=ARMS[arm].env(),
                log_path=logs / f"{i}-{arm}-{j}.log",
                zygote_socket=zygote_socket if ARMS[arm].forked else None,
            )
            for j in range(side_by_side)
        }
        with started_together(made):
            got = [round(server.info["startup_s"], 2) for server in made.values()]
        seconds[arm] += got
        print(f"{arm:<16} " + " ".join(f"{s:6.1f} s" for s in got), flush=True)
    return seconds


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; returns 0."""
    parser = argparse.ArgumentParser(prog="python -m eval.startup", description=__doc__)
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of one start-up per arm, in A-B-C-C-B-A order (3)",
    )
    parser.add_argument(
        "--model-path",
        type=Path,
        help="target (default: the tiny pair, trained first in about a minute)",
    )
    parser.add_argument(
        "--draft", type=Path, help="draft for --model-path (default: the target itself)"
    )
    parser.add_argument(
        "--side-by-side",
        type=int,
        default=1,
        metavar="N",
        help="servers started together per start-up, as CI's fixtures start pairs (1)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("eval/results/startup.json"),
        help="JSON file written, relative to the current folder (%(default)s)",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        if args.model_path is None:
            from sglang_ssd.testing.trained_pair import make_trained_pair

            target, draft = make_trained_pair(Path(tmp) / "pair")
            flags = TINY_FLAGS
        else:
            target, draft, flags = args.model_path, args.draft or args.model_path, ()
        server_argv = ["--model-path", str(target), "--speculative-algorithm", "SSD"]
        server_argv += ["--speculative-draft-model-path", str(draft), *flags]
        sock, began = Path(tmp) / "zygote.sock", time.monotonic()
        with zygote.running(sock, Path(tmp) / "zygote.log"):
            zygote.fork(str(sock), ["--help"], dict(os.environ), Path(tmp) / "help.log").wait()
            preload_s = time.monotonic() - began
            seconds = measure(server_argv, args.rounds, Path(tmp), args.side_by_side, str(sock))
    medians = {arm: statistics.median(values) for arm, values in seconds.items()}
    result = {
        "machine": provenance.machine_info(),
        "git": provenance.git_info(),
        "server_argv": server_argv,
        "order": order(args.rounds),
        "side_by_side": args.side_by_side,
        "startup_s": seconds,
        "median_s": medians,
        "zygote_preload_s": round(preload_s, 2),
        "over_spawn": {arm: round(medians[arm] / medians["spawn"], 3) for arm in ARMS},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for arm in ARMS:
        print(f"median {arm:<16} {medians[arm]:6.1f} s ({result['over_spawn'][arm]:.2f}x spawn)")
    print(f"zygote preload {preload_s:.1f} s, once per session; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
