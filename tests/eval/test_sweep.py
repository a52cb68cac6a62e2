"""A live sweep on tiny random models: two β points on ONE SSD server, no restart.

Checks that the harness posts each point's settings to `/ssd/config` before its units (the
server reports them back, and `GET /ssd/config` shows the last one), that both points get their
batches with SSD's counters and the miss policy's b*, that a finished sweep resumes without
touching the server, and that the β figure draws from the file the sweep wrote.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import requests

from eval import client, configs, datasets, figures, harness, ssd_stats, sweep
from eval.client import BatchResult, RequestResult
from eval.configs import Config
from eval.datasets import Prompt, Record
from eval.run_settings import RunSettings
from eval.sampling import Sampling

TINY = ("--dtype", "float32", "--max-total-tokens", "4096")


class FakeServer:
    """Stands in for `eval.servers.Server`: records starts, answers nothing itself."""

    def __init__(self, name: str, started: list[str]) -> None:
        self.name, self.started, self.proc = name, started, None
        self.url = f"http://{name}"
        self.info: dict[str, Any] = {"startup_s": 0.0, "command_line": name, "processes": []}

    def start(self) -> FakeServer:
        self.started.append(self.name)
        return self

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        pass

    def terminate(self) -> None:
        pass

    def processes(self) -> list[dict[str, Any]]:
        return []

    def log_tail(self) -> str:
        return ""


@pytest.fixture
def fake_servers(monkeypatch: pytest.MonkeyPatch) -> dict[str, list]:
    """No processes: fake servers, requests and admin calls, all recorded in order."""
    log: dict[str, list] = {"started": [], "configured": [], "sent": []}

    def server(self: Config, log_dir: Path, extra: Any = (), **kw: Any) -> FakeServer:
        return FakeServer(self.server_name, log["started"])

    def generate_batch(url: str, prompts: Any, sampling: Any, **kw: Any) -> BatchResult:
        log["sent"].append(url)
        reqs = [RequestResult(pid, 0.0, 0.1, completion_tokens=4, output_ids=[1, 2, 3, 4])
                for pid, _ in prompts]  # fmt: skip
        return BatchResult(0.0, 0.1, reqs)

    def configure(url: str, changes: Any) -> dict[str, Any]:
        log["configured"].append((url, changes["beta"]))
        return dict(changes)

    monkeypatch.setattr(Config, "server", server)
    monkeypatch.setattr(client, "generate_batch", generate_batch)
    monkeypatch.setattr(client, "generate", lambda *a, **kw: None)
    monkeypatch.setattr(client, "flush_cache", lambda *a, **kw: True)
    monkeypatch.setattr(ssd_stats, "configure", configure)
    monkeypatch.setattr(ssd_stats, "fetch", lambda url: None)
    return log


@pytest.mark.parametrize("concurrent", [True, False])
def test_shared_server_units_apply_their_settings(
    fake_servers: dict[str, list], concurrent: bool, tmp_path: Path
) -> None:
    ar = Config("AR", ("--speculative-algorithm", "NONE"))
    ssd = Config("SSD", ("--speculative-algorithm", "SSD"))
    cfgs = [ar, *sweep.beta_points(ssd, (1.0, 0.5))]
    prompts = [Prompt(Record("humaneval", f"p{i}", "x"), (1, 2)) for i in range(2)]
    settings = RunSettings(concurrent_servers=concurrent)
    results = harness.run_interleaved(cfgs, prompts, settings, log_dir=tmp_path)
    assert fake_servers["started"] == ["AR", "SSD"]  # one server for both β points
    # unit 0 forward, unit 1 reversed; each point's settings go out right before its unit
    assert fake_servers["configured"] == [("http://SSD", 1.0), ("http://SSD", 0.5),
                                          ("http://SSD", 0.5), ("http://SSD", 1.0)]  # fmt: skip
    assert len(results["batches"]) == 6 and results["status"] == "complete"
    assert [b["admin"]["beta"] for b in results["batches"] if "admin" in b] == [1, 0.5, 0.5, 1]

    # Servers the caller keeps: nothing started, the provider sees one config per server.
    asked: list[list[str]] = []

    def provider(firsts: Any) -> dict[str, FakeServer]:
        asked.append([c.name for c in firsts])
        return {c.server_name: FakeServer(c.server_name, []) for c in firsts}

    harness.run_interleaved(cfgs, prompts, settings, log_dir=tmp_path, servers=provider)
    assert asked == [["AR", "SSD β=1"]] and fake_servers["started"] == ["AR", "SSD"]


@pytest.mark.server
def test_live_beta_points_share_one_server(
    tiny_target: Path, tiny_draft: Path, tmp_path: Path
) -> None:
    ssd = configs.ssd(tiny_target, tiny_draft, name="SSD", extra=TINY)
    points = sweep.beta_points(ssd, (1.0, 0.5))
    prompts = datasets.load_prompts(datasets.HUMANEVAL, datasets.load_tokenizer(tiny_target), 1)
    sampling = Sampling(max_new_tokens=8, temperature=0.7, seed=0)
    plan = sweep.Plan("sweep-beta-quick", points, prompts, RunSettings(sampling=sampling))
    kw = {"results_dir": tmp_path, "log_dir": tmp_path / "logs"}
    with sweep.ServerPool(tmp_path / "logs") as pool:
        results = sweep.run_plans([plan], resume=False, pool=pool, **kw)[plan.name]
        ((_, server),) = pool.running.values()
        config = requests.get(f"{server.url}/ssd/config", timeout=30).json()
        assert config["settings"]["beta"] == 0.5
        again = sweep.run_plans([plan], resume=True, pool=pool, **kw)[plan.name]
        assert again["batches"] == results["batches"] and len(pool.running) == 1
    assert server.proc is None and "stopped_at" in server.info  # stopped with the pool

    by_config = {b["config"]: b for b in results["batches"]}
    assert set(by_config) == {"SSD β=1", "SSD β=0.5"} and len(results["batches"]) == 2
    assert by_config["SSD β=1"]["admin"]["beta"] == 1.0
    assert by_config["SSD β=0.5"]["admin"]["beta"] == 0.5
    for batch in results["batches"]:
        assert batch["tokens"] > 0 and batch["ssd"]["rounds"] > 0
        assert "auto_batch_threshold" in batch["fallback"]
    started = [c["servers"] for c in results["configs"]]
    assert [len(s) for s in started] == [1, 1]
    assert started[0][0]["command_line"] == started[1][0]["command_line"]

    fig = figures.fig_beta(tmp_path, tmp_path / "figures", quick=True)
    assert fig is not None and fig.png.stat().st_size > 0
