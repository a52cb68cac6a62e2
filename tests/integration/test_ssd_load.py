"""Sustained load on SSD, the CI version: 16 streaming clients for 20 s,
after 15 s of the same load as warm-up.

The session's shared tiny SSD server (`tiny_ssd`). `eval.load` drives it: greedy and sampled
requests of 8 to 64 tokens, with every seventh request of each client hung up mid-stream (an
abort). The test checks that no request failed and no speculator fault happened; that after the
load (and one settling request that sweeps requests which left unannounced) the speculator holds
no KV slots, no open requests and no cache entries and the target client tracks no request; that
the scheduler's own KV pool raised no leak; and that the resident memory of the scheduler and
the speculator grew less than 10% after the warm-up (it rises at first: see
`eval.load.run_load`). The 3-minute run on the real pair is `python -m eval.load`.
"""

from __future__ import annotations

import json

import pytest

from eval.load import RSS_GROWTH_LIMIT, LoadShape, measure
from eval.servers import Server

CLIENTS = 16
# At a tiny model's round rate the RSS of both processes levels off within ~5 s (growth 0.05-0.4%
# over the next 30 s on the AMX Xeon, at 16-23 requests/s); 35 s in all (was 60) keep ~90 aborts
# and ~700 requests here, and a speculator that leaks one closed request's KV slots in 20 still
# fails the counters check (tried on the AMX Xeon, 2026-12-05).
WARMUP_S = 15.0
DURATION_S = WARMUP_S + 20.0
# Token ids of the tiny models' character-level tokenizer (printable ASCII from id 0 = " ").
PROMPTS = [
    [68, 69, 70, 0, 70, 73, 66, 79, 78, 65, 67, 67, 73, 8, 78, 9, 26],
    [52, 72, 69, 0, 81, 85, 73, 67, 75, 0, 66, 82, 79, 87, 78, 0, 70, 79, 88],
    [51, 37, 44, 37, 35, 52, 0, 10, 0, 38, 50, 47, 45, 0, 85, 83, 69, 82, 83],
    [65, 66, 67, 65, 66, 67, 65, 66, 67],
    [17],
]


@pytest.fixture
def server(tiny_ssd: Server) -> Server:
    return tiny_ssd


def test_sixteen_streaming_clients_leak_nothing(server: Server) -> None:
    result = measure(server, LoadShape(PROMPTS), CLIENTS, DURATION_S, WARMUP_S)
    summary = {
        k: result[k]
        for k in ("requests", "completed", "aborted", "tokens", "tokens_per_s", "rss_growth")
    }
    print("\nload:", json.dumps(summary), result["counters_before"], result["counters_after"])
    (server.log_path.parent / "tiny-ssd-load.json").write_text(json.dumps(result, indent=1))
    assert not result["errors"], result["errors"][:5]
    assert result["completed"] > CLIENTS and result["aborted"] > 0  # both paths exercised
    assert result["counters_after"] == result["counters_before"]
    assert all(v == 0 for v in result["counters_after"].values()), result["counters_after"]
    assert result["rss_growth"] < RSS_GROWTH_LIMIT, result["rss_samples"]
    assert result["faults_after"] == result["faults_before"] == 0
    assert result["problems"] == []
    assert "memory leak" not in server.log_path.read_text(errors="replace").lower()
