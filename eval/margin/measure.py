"""The measurement loop: chains advanced concurrently against an AR and an SSD server."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import requests

from eval.margin.chains import Chain
from eval.margin.segments import Reply, align, request_body


@dataclass(frozen=True)
class Budget:
    """When to stop starting segments.

    Attributes:
        positions: total measured positions to reach.
        deadline: `time.time()` after which no segment starts.
        segment_tokens: new tokens per request.
        max_tokens: output tokens per prompt (its chain is done after them).
    """

    positions: int
    deadline: float
    segment_tokens: int
    max_tokens: int


def ask(url: str, input_ids: list[int], max_new_tokens: int, timeout: float = 3600.0) -> Reply:
    """One greedy request with top-2 logprobs; raises on an HTTP or parse error."""
    r = requests.post(url + "/generate", json=request_body(input_ids, max_new_tokens),
                      timeout=timeout)  # fmt: skip
    if r.status_code != 200:
        raise RuntimeError(f"{url}: HTTP {r.status_code}: {r.text[:300]}")
    return Reply.from_response(r.json())


Ask = Callable[[str, list[int], int], Reply]


class Measurer:
    """Advances chains, `streams` at a time; each segment asks both servers at once.

    Args:
        ar_url, ssd_url: the servers.
        chains: in the order they are started.
        budget: when to stop.
        on_segment: called (under a lock) after each recorded segment, e.g. to save.
        ask_fn: the request function (tests pass a fake).
    """

    def __init__(
        self,
        ar_url: str,
        ssd_url: str,
        chains: Sequence[Chain],
        budget: Budget,
        on_segment: Callable[[], None],
        ask_fn: Ask = ask,
    ) -> None:
        self.urls = (ar_url, ssd_url)
        self.chains = list(chains)
        self.budget = budget
        self.on_segment = on_segment
        self.ask = ask_fn
        self.lock = threading.Lock()
        self.claimed: set[int] = set()

    def total(self) -> int:
        return sum(c.positions for c in self.chains)

    def _out_of_budget(self) -> bool:
        return self.total() >= self.budget.positions or time.time() >= self.budget.deadline

    def _claim(self) -> Chain | None:
        with self.lock:
            if self._out_of_budget():
                return None
            for i, chain in enumerate(self.chains):
                if not chain.done and i not in self.claimed:
                    self.claimed.add(i)
                    return chain
        return None

    def _segment(self, chain: Chain, pool: ThreadPoolExecutor) -> None:
        prefix = chain.context(len(chain.forced))
        n = min(self.budget.segment_tokens, self.budget.max_tokens - len(chain.forced))
        ssd = pool.submit(self.ask, self.urls[1], prefix, n)
        ar = self.ask(self.urls[0], prefix, n)
        seg = align(len(chain.forced), ar, ssd.result())
        with self.lock:
            chain.add(seg, self.budget.max_tokens)
            self.on_segment()

    def _worker(self) -> None:
        with ThreadPoolExecutor(max_workers=1) as pool:
            while (chain := self._claim()) is not None:
                while not chain.done:
                    with self.lock:
                        if self._out_of_budget():
                            return
                    self._segment(chain, pool)

    def run(self, streams: int) -> None:
        """Until the budget is spent or every chain is done; a failed request raises."""
        with ThreadPoolExecutor(max_workers=streams) as pool:
            for f in [pool.submit(self._worker) for _ in range(streams)]:
                f.result()
