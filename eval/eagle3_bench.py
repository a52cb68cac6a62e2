"""The EAGLE-3 comparison: AR vs STANDALONE vs SGLang's EAGLE3 vs SSD with
the 0.5B draft vs SSD with our EAGLE-3 head, on the real target.

Every configuration runs on equal hardware (both cores): AR, STANDALONE and EAGLE3 as two
threads of one server; SSD with the target on one core and its speculator on the other. The
same γ, top-k 1 and dtype everywhere (`eval.configs`). The head is the one `python -m
sglang_ssd.models build eagle3` stores in the model cache (`default_head`); an SSD server with a
head runs with `--disable-radix-cache` (docs/eagle3-heads.md). SGLang's STANDALONE and EAGLE3
verify greedily on CPU, so their rows at T > 0 are not lossless (`notes`, `note` in the
comparisons).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eval import configs as presets
from eval import ssd_bench
from eval.configs import Config
from sglang_ssd.config import DEFAULT_LOOKAHEAD

AR, STANDALONE, EAGLE3, SSD, SSD_HEAD = (
    "AR-2c", "STANDALONE-2c", "EAGLE3-2c", "SSD-1+1c", "SSD-HEAD-1+1c",
)  # fmt: skip
# (configuration, baseline, arrangement, aims): every speculator against AR, and each SSD
# against the synchronous speculator with the same draft.
COMPARISONS: tuple[tuple[str, str, str, Mapping[str, float]], ...] = (
    (SSD_HEAD, AR, "equal", {}),
    (SSD_HEAD, EAGLE3, "equal", {}),
    (SSD_HEAD, SSD, "equal", {}),
    (SSD, AR, "equal", {}),
    (SSD, STANDALONE, "equal", {}),
    (EAGLE3, AR, "equal", {}),
    (STANDALONE, AR, "equal", {}),
)


def default_head(target: Path | str) -> Path:
    """Where `build eagle3` stores the head for `target` (`<models>/eagle3-<target name>`).

    Raises:
        FileNotFoundError: no head there (build it first), with the command that builds it.
    """
    from sglang_ssd.eagle3.config import is_eagle3_head
    from sglang_ssd.models import store

    head = store.models_root() / f"eagle3-{Path(target).name}"
    if not is_eagle3_head(head):
        raise FileNotFoundError(
            f"no EAGLE-3 head at {head}: run `python -m sglang_ssd.models build eagle3` first"
        )
    return head


def bench_configs(
    target: Path | str,
    draft: Path | str,
    head: Path | str,
    *,
    lookahead: int = DEFAULT_LOOKAHEAD,
    target_cpu: int = 0,
    draft_cpu: int = 1,
) -> list[Config]:
    """AR (the reference), STANDALONE, EAGLE3, SSD with `draft`, SSD with `head`.

    Raises:
        ValueError: equal CPU ids.
    """
    if target_cpu == draft_cpu:
        raise ValueError("the target and draft CPUs must differ")
    both = (target_cpu, draft_cpu)
    kw: dict[str, Any] = {"lookahead": lookahead}
    return [
        presets.autoregressive(target, name=AR, cpus=both),
        presets.standalone(target, draft, name=STANDALONE, cpus=both, **kw),
        presets.eagle3(target, head, name=EAGLE3, cpus=both, **kw),
        presets.ssd(target, draft, name=SSD, cpus=both, draft_cpus=(draft_cpu,), **kw),
        presets.ssd(
            target, head, name=SSD_HEAD, cpus=both, draft_cpus=(draft_cpu,),
            extra=("--disable-radix-cache",), **kw,
        ),
    ]  # fmt: skip


def comparisons(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`ssd_bench.comparisons` over this benchmark's pairs (`COMPARISONS`)."""
    return ssd_bench.comparisons(results, COMPARISONS)
