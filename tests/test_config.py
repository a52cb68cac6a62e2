"""`SSDConfig` validation and the launcher's argument handling (no servers started)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from sglang_ssd.config import (
    DEFAULT_DRAFT_KV_TOKENS,
    FLAGS,
    LIVE_FIELDS,
    SSDConfig,
    SSDConfigError,
    TargetCapacity,
    add_ssd_args,
    fanout_budget_limit,
)
from sglang_ssd.launch_server import apply_defaults, build_config, split_args
from sglang_ssd.testing.processes import run_module


def test_defaults_are_valid_and_round_trip_through_env():
    config = SSDConfig()
    env: dict[str, str] = {}
    config.to_env(env)
    assert SSDConfig.from_env(env) == config
    assert SSDConfig.from_env({}) is None
    assert config.depth == config.lookahead


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"beta": 0.0}, "--ssd-beta"),
        ({"beta": 1.5}, "--ssd-beta"),
        ({"tree_depth": 5}, "--ssd-tree-depth"),
        ({"tree_depth": -1}, "--ssd-tree-depth"),
        ({"mode": "turbo"}, "--ssd-mode"),
        ({"fanout": "cubic"}, "--ssd-fanout"),
        ({"backup": "oracle"}, "--ssd-backup"),
        ({"fanout_budget": -1}, "--ssd-fanout-budget"),
        ({"batch_threshold": 0}, "--ssd-batch-threshold"),
        ({"draft_device": "tpu:0"}, "--ssd-draft-device"),
        ({"speculator_timeout": 0.0}, "--ssd-speculator-timeout"),
        ({"lookahead": 0}, "--speculative-num-steps"),
        ({"draft_device": "cuda:1", "draft_cpus": (1,)}, "--ssd-draft-cpus"),
    ],
)
def test_invalid_values_name_their_flag(changes, needle):
    with pytest.raises(SSDConfigError, match=needle):
        SSDConfig(**changes)


def test_every_flag_is_generated_from_its_declaration():
    """The parser, `from_namespace` and the checks all come from `SSDConfig`'s fields."""
    parser = argparse.ArgumentParser()
    add_ssd_args(parser)
    options = {a.option_strings[0] for a in parser._actions if a.option_strings[0] != "-h"}
    assert options == {f"--ssd-{name.replace('_', '-')}" for name in FLAGS if name != "lookahead"}
    argv = [
        *("--ssd-mode", "sync", "--ssd-tree-depth", "2", "--ssd-fanout-budget", "3"),
        *("--ssd-fanout", "uniform", "--ssd-beta", "0.5", "--ssd-backup", "ngram"),
        *("--ssd-batch-threshold", "4", "--ssd-draft-device", "cpu", "--ssd-draft-cpus", "1-2"),
        *("--ssd-speculator-timeout", "9"),
    ]
    got = SSDConfig.from_namespace(parser.parse_args(argv), lookahead=3)
    expected = SSDConfig(3, "sync", 2, 3, "uniform", 0.5, "ngram", 4, "cpu", (1, 2), 9.0)
    assert got == expected
    assert SSDConfig.from_namespace(parser.parse_args([]), lookahead=4) == SSDConfig()
    assert SSDConfig().mode == "auto"  # each round the arrangement measured fastest
    live = {"mode", "tree_depth", "beta", "fanout_budget", "fanout", "backup"}
    assert set(LIVE_FIELDS) == live


def test_the_launchers_help_prints_every_flag_with_its_text() -> None:
    """`python -m sglang_ssd.launch_server --help` (a help text with a bare "%" once made
    argparse raise instead of printing)."""
    code, output = run_module("sglang_ssd.launch_server", ["--help"])
    assert code == 0, output[-2000:]
    for name in FLAGS:
        if FLAGS[name].cli:
            assert FLAGS[name].option in output
    text = " ".join(output.split())  # argparse wraps help text at the terminal's width
    assert "by 5% or more" in text and "--- SGLang's flags" in text


@pytest.mark.parametrize("bad", [{"beta": "x"}, {"fanout_budget": None}, {"draft_cpus": ()}])
def test_wrong_types_and_empty_values_are_refused(bad):
    with pytest.raises(SSDConfigError, match=f"--ssd-{next(iter(bad)).replace('_', '-')}"):
        SSDConfig(**bad)


def test_unknown_json_key_is_refused():
    with pytest.raises(SSDConfigError, match="unknown"):
        SSDConfig.from_json('{"lookahead": 4, "warp": 9}')


def test_split_args_separates_ssd_flags_and_keeps_sglang_order():
    ns, rest = split_args(
        ["--port", "1", "--ssd-beta", "0.5", "--model-path", "m", "--ssd-draft-cpus=1"]
    )
    assert rest == ["--port", "1", "--model-path", "m"]
    assert ns.ssd_beta == 0.5 and ns.ssd_draft_cpus == (1,)


def test_unknown_ssd_flag_refuses_startup(capsys):
    with pytest.raises(SystemExit) as exc:
        split_args(["--ssd-warp", "9"])
    assert exc.value.code == 2
    assert "--ssd-warp" in capsys.readouterr().err


def test_bad_ssd_value_refuses_startup():
    with pytest.raises(SystemExit):
        split_args(["--ssd-mode", "turbo"])


def test_speculative_algorithm_none_is_dropped():
    """SGLang 0.5.23 crashes on the first finished request when NONE is passed explicitly."""
    argv = apply_defaults(
        ["--model-path", "m", "--speculative-algorithm", "NONE"], cuda=True, environ={}
    )
    assert "--speculative-algorithm" not in argv


def test_cpu_defaults_and_gamma_copied_into_config():
    env: dict[str, str] = {}
    argv = apply_defaults(
        [
            "--model-path",
            "t",
            "--speculative-algorithm",
            "ssd",
            "--speculative-draft-model-path",
            "d",
            "--speculative-num-steps",
            "3",
        ],
        cuda=False,
        environ=env,
    )
    assert env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert "--sleep-on-idle" in argv
    for flag, value in [
        ("--device", "cpu"),
        ("--attention-backend", "intel_amx"),
        ("--speculative-algorithm", "SSD"),
        ("--speculative-num-draft-tokens", "4"),
        ("--speculative-eagle-topk", "1"),
    ]:
        assert argv[argv.index(flag) + 1] == value
    parser = argparse.ArgumentParser()
    add_ssd_args(parser)
    config = build_config(parser.parse_args(["--ssd-tree-depth", "2"]), argv)
    assert config.lookahead == 3 and config.depth == 2


def test_tree_depth_above_gamma_refused():
    parser = argparse.ArgumentParser()
    add_ssd_args(parser)
    with pytest.raises(SSDConfigError, match="--ssd-tree-depth"):
        build_config(parser.parse_args(["--ssd-tree-depth", "5"]), ["--speculative-num-steps", "4"])


def test_draft_kv_pool_is_sized_from_the_target_unless_given():
    capacity = TargetCapacity(max_total_tokens=2048, max_running_requests=48, context_len=1024)
    config = SSDConfig(lookahead=4, fanout_budget=8, tree_depth=3)
    # Branches sized for γ = 4, not the pinned D = 3: the depth can change while serving.
    assert config.draft_kv_slots(capacity) == 2048 + 48 * (4 + 1 + 8 * 4)
    assert config.draft_kv_slots(None) == DEFAULT_DRAFT_KV_TOKENS
    assert config.replace(draft_kv_tokens=300).draft_kv_slots(capacity) == 300
    assert capacity.longest_request == 1024
    with pytest.raises(SSDConfigError, match="--ssd-draft-kv-tokens"):
        SSDConfig(draft_kv_tokens=0)
    with pytest.raises(SSDConfigError, match="must fit in --ssd-draft-kv-tokens"):
        SSDConfig(fanout_budget=8, draft_kv_tokens=31)  # 8 × γ=4 branch slots


def test_live_fanout_budget_is_bounded_by_the_pool_and_the_outcomes_of_a_round():
    # V = 128: one round has (γ + 1)(V − 1) = 635 outcomes.
    limit, why = fanout_budget_limit(10**6, 1024, lookahead=4, depth=4, vocab_size=128)
    assert limit == 635 and "outcomes" in why
    # 4096 slots: a 1024-token request, its draft and root (5), then (4096 - 1029) // 4 branches.
    limit, why = fanout_budget_limit(4096, 1024, lookahead=4, depth=4, vocab_size=151936)
    assert limit == (4096 - 1029) // 4 and "KV pool (4096 tokens)" in why
    assert fanout_budget_limit(500, 1024, 4, 4, 128)[0] == 0
    config = SSDConfig(fanout_budget=8, draft_kv_tokens=4096)
    config.check_fanout_budget(766, 1024, 151936)
    config.check_fanout_budget(4, 10**6, 151936)  # lowering is always allowed
    with pytest.raises(SSDConfigError, match="--ssd-fanout-budget must be at most 766"):
        config.check_fanout_budget(767, 1024, 151936)
    with pytest.raises(SSDConfigError, match=r"at most 635 .*outcomes.*got 1000000"):
        SSDConfig(fanout_budget=8, draft_kv_tokens=10**7).check_fanout_budget(10**6, 1024, 128)


def test_config_imports_only_the_standard_library() -> None:
    """The launcher reads `SSDConfig` before it imports SGLang, and subprocesses parse it from
    the environment: importing it must not pull torch in (through `saguaro`'s package either)."""
    code = "import sys, sglang_ssd.config; print(sorted({'torch', 'numpy'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_the_startup_line_names_every_setting_by_its_flag() -> None:
    line = SSDConfig(draft_cpus=(1, 2), tree_depth=2, mode="async").flags_line()
    parts = line.split(", ")
    assert len(parts) == len(FLAGS)
    assert "--ssd-mode* async" in parts and "--ssd-tree-depth* 2" in parts
    assert "--ssd-draft-cpus 1,2" in parts and "--ssd-draft-kv-tokens auto" in parts
    assert "--speculative-num-steps 4" in parts
