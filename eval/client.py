"""Send `/generate` requests with `input_ids` to a server and time them.

Batch size b means b requests in flight at once (one thread each): the server batches them as
it would real concurrent users. Non-streaming by default: streaming makes the tokenizer manager
ship a chunk per step, which costs more for AR (one token per step) than for speculative
decoding (several), and on two cores that cost lands on the measurement. `stream=True` adds the
time to first token and per-chunk arrival times.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import requests

from eval.sampling import Sampling

# Keys of SGLang's meta_info worth keeping per request (the rest is large or constant).
META_KEYS = (
    "id",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "e2e_latency",
    "spec_verify_ct",
    "spec_accept_length",
    "spec_accept_rate",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_correct_drafts_histogram",
    "ssd_rounds",
    "ssd_plain_rounds",
    "ssd_cache_hit_rate",
    "ssd_backup_rounds",
)


@dataclass
class RequestResult:
    """One request's outcome. Times are client-side wall clock (`time.time()`)."""

    prompt_id: str
    start: float
    latency_s: float
    completion_tokens: int = 0
    prompt_tokens: int = 0
    output_ids: list[int] = field(default_factory=list)
    finish_reason: Any = None
    meta_info: dict[str, Any] = field(default_factory=dict)
    ttft_s: float | None = None
    chunk_times_s: list[float] | None = None
    error: str | None = None

    @property
    def tok_per_s(self) -> float:
        return self.completion_tokens / self.latency_s if self.latency_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["tok_per_s"] = self.tok_per_s
        return out


_local = threading.local()


def _session() -> requests.Session:
    if not hasattr(_local, "session"):
        _local.session = requests.Session()
    return _local.session


def generate(
    url: str,
    prompt_id: str,
    input_ids: Sequence[int],
    sampling: Sampling,
    *,
    request_index: int = 0,
    stream: bool = False,
    timeout: float = 3600.0,
) -> RequestResult:
    """POST one `/generate` request; errors are recorded in the result, not raised."""
    body = {
        "input_ids": list(input_ids),
        "sampling_params": sampling.to_sglang(request_index),
        "stream": stream,
    }
    start = time.time()
    t0 = time.perf_counter()
    ttft = None
    chunks: list[float] | None = [] if stream else None
    try:
        r = _session().post(url + "/generate", json=body, timeout=timeout, stream=stream)
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:500]}")
        if stream:
            out = None
            for line in r.iter_lines():
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                now = time.perf_counter() - t0
                if ttft is None:
                    ttft = now
                chunks.append(now)  # type: ignore[union-attr]
                out = json.loads(line[6:])
                if "error" in out:
                    raise RuntimeError(str(out["error"]))
            if out is None:
                raise RuntimeError("empty stream")
        else:
            out = r.json()
        latency = time.perf_counter() - t0
    except Exception as exc:  # recorded; the harness decides whether to abort
        return RequestResult(prompt_id, start, time.perf_counter() - t0, error=repr(exc))
    meta = out.get("meta_info", {})
    return RequestResult(
        prompt_id=prompt_id,
        start=start,
        latency_s=latency,
        completion_tokens=int(meta.get("completion_tokens", len(out.get("output_ids", [])))),
        prompt_tokens=int(meta.get("prompt_tokens", len(input_ids))),
        output_ids=list(out.get("output_ids", [])),
        finish_reason=meta.get("finish_reason"),
        meta_info={k: meta[k] for k in META_KEYS if k in meta},
        ttft_s=ttft,
        chunk_times_s=chunks,
    )


@dataclass
class BatchResult:
    """b requests sent together; `wall_s` runs from the first send to the last reply."""

    start: float
    wall_s: float
    requests: list[RequestResult]

    @property
    def tokens(self) -> int:
        return sum(r.completion_tokens for r in self.requests)


def generate_batch(
    url: str,
    prompts: Sequence[tuple[str, Sequence[int]]],
    sampling: Sampling,
    *,
    first_index: int = 0,
    stream: bool = False,
    timeout: float = 3600.0,
    samplings: Sequence[Sampling] | None = None,
) -> BatchResult:
    """Send all `prompts` ((id, input_ids) pairs) at once, one thread per request; request i
    uses `samplings[i]` when given, else `sampling`."""
    per_request = list(samplings) if samplings is not None else [sampling] * len(prompts)
    start = time.time()
    t0 = time.perf_counter()
    if len(prompts) == 1:  # no thread: keep b = 1 as lean as a plain client
        ((pid, ids),) = prompts
        one = generate(
            url, pid, ids, per_request[0], request_index=first_index, stream=stream, timeout=timeout
        )
        return BatchResult(start, time.perf_counter() - t0, [one])
    with ThreadPoolExecutor(max_workers=max(1, len(prompts))) as pool:
        futures = [
            pool.submit(
                generate,
                url,
                pid,
                ids,
                per_request[i],
                request_index=first_index + i,
                stream=stream,
                timeout=timeout,
            )
            for i, (pid, ids) in enumerate(prompts)
        ]
        results = [f.result() for f in futures]
    return BatchResult(start, time.perf_counter() - t0, results)


def flush_cache(url: str, timeout: float = 60.0) -> bool:
    """Empty the server's radix cache so every request pays its full prefill."""
    try:
        return _session().post(url + "/flush_cache", timeout=timeout).status_code == 200
    except requests.RequestException:
        return False
