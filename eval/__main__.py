"""`python -m eval`: the evaluation harness's command line.

Subcommands:
  baseline  AR vs STANDALONE (γ = 4, top-k 1) on the real pair; `--pinned` puts each server on
            one core (taskset -c 0, OMP_NUM_THREADS=1).
  eagle3    the EAGLE-3 comparison: AR, STANDALONE, SGLang's EAGLE3 with our head, SSD with the
            0.5B draft, SSD with the head, all on both cores (eval.eagle3_bench).
  ssd       the SSD benchmark: AR vs STANDALONE vs `--ssd-mode sync` vs SSD in the paper's
            arrangement (baselines on one core, SSD adds the draft's core) and on equal
            hardware (everything on both cores), with the speedup model's prediction.
  mixed     mixed traffic: 40 short requests (max_tokens 1-128, stop strings, 1-4 at once),
            AR on both cores vs SSD, ABAB x 2, with a 90% bootstrap interval over requests.
  run       any configurations from a JSON file (a list of `Config` objects) on a prompt set.
  show      print the table of an existing results file.
  sweep     a sweep over SSD's run-time settings on one SSD server (no restarts), with an AR
            reference: `beta` (T = 0.7), `fanout` (geometric vs uniform), `backup` (batch 1, 2, 4).
  figures   PNGs from the results files (eval/results/figures[-quick]/).
  report    the figures plus eval/results/report[-quick].md with the tables.
  all       the main comparison (AR, STANDALONE, sync, SSD on HumanEval and MT-Bench), every
            sweep, then figures and report; resumes an interrupted run unless --fresh.
  model     the speedup model, from one run's component timings, against other runs' measured
            speedups at the same batch size (eval.model_check; eval/results/model-check.json).
  options   each request option's cost to SSD: tok/s with it over tok/s without it on the
            same HumanEval prompts, batch 1, greedy (eval/results/options-cost-b1.json).
  margin    ε of the greedy rule: decode vs TARGET_VERIFY argmax, teacher-forced, on the real
            pair (eval.margin; eval/results/margin-eps.json, resumable).
  target-split  where the target's forward goes inside SGLang on the CPU: matmuls, attention,
            the shim's ops, norms, RoPE, LM head, the rest, at 1, 5 and 20 rows, against its
            weight-streaming and compute floors (eval.target_split).
  outcomes  which outcomes the speculation cache holds: `record` rounds with the draft's own
            probabilities, `replay` geometric / uniform / predicted fan-out on them (hit rate
            against B, eval.outcomes; eval/results/outcomes-replay.json and a figure).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from eval import (
    cli_options,
    datasets,
    eagle3_bench,
    figures,
    mixed,
    model_check,
    mtbench_answers,
    options_cost,
    outcomes,
    report,
    ssd_bench,
    sweep,
    target_split,
)
from eval import configs as presets
from eval.configs import Config
from eval.harness import RunSettings, run_interleaved
from eval.margin import cli as margin
from eval.sampling import Sampling
from eval.summary import format_table
from sglang_ssd.draft_runtimes import NAMES as RUNTIME_NAMES
from sglang_ssd.launch_server import flag_value

RESULTS = Path("eval/results")
LOGS = Path("eval/logs")
QUICK_PROMPTS, QUICK_TOKENS = 3, 32


def _add_compare_options(p: argparse.ArgumentParser, only_example: str) -> None:
    """The options of the comparison benchmarks (`ssd`, `eagle3`): CPUs, γ, a subset of the
    configurations, the model folders."""
    cli_options.add_cpus(p)
    cli_options.add_lookahead(p)
    p.add_argument(
        "--only",
        type=_comma_list,
        default=[],
        metavar="NAMES",
        help="comma-separated configurations to run, in this order (the first is the reference), "
        + only_example,
    )
    cli_options.add_pair(p)


def _comma_list(text: str) -> list[str]:
    """The non-empty items of a comma-separated option value ("a, b,,c": a, b and c)."""
    return [item.strip() for item in text.split(",") if item.strip()]


def _gamma_list(text: str) -> list[int]:
    """Comma-separated lookaheads ("3,4,5") as a list (an argparse type): at least one, each an
    integer >= 1, or an argparse error (exit 2) before anything starts."""
    try:
        gammas = [int(v) for v in _comma_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not comma-separated integers: {text!r}") from None
    if not gammas or min(gammas) < 1:
        raise argparse.ArgumentTypeError(f"needs one or more integers >= 1, got {text!r}")
    return gammas


def _runtime_list(text: str) -> list[str]:
    """Comma-separated `--ssd-draft-runtime` names as a list (an argparse type): an unknown name
    is refused here, not at the server's start an hour into a run."""
    names = _comma_list(text)
    unknown = [n for n in names if n not in RUNTIME_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown or no draft runtime(s) {unknown}; known: {', '.join(RUNTIME_NAMES)}"
        )
    return names


def _target_and_draft_cpus(a: argparse.Namespace) -> tuple[int, int]:
    if len(a.cpus) != 2:
        raise SystemExit(f"--cpus needs exactly two CPUs (target, draft), got {list(a.cpus)}")
    return a.cpus[0], a.cpus[1]


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dataset",
        choices=datasets.CHOICES,
        default=datasets.HUMANEVAL,
        help="prompt set (default %(default)s)",
    )
    p.add_argument(
        "--prompts", type=int, default=10, help="first N prompts of the set (default %(default)s)"
    )
    p.add_argument(
        "--prompt-ids", nargs="+", default=(), metavar="ID", help="explicit prompt ids instead"
    )
    p.add_argument(
        "--mtbench-turn",
        type=int,
        choices=(1, 2),
        default=1,
        help="MT-Bench's first turns, or its second turns after an answer to the first "
        "(default %(default)s)",
    )
    p.add_argument(
        "--mtbench-answers",
        type=Path,
        help="turn-1 answers for --mtbench-turn 2 (default eval/data/mtbench-turn1-<target "
        "folder>.json; `python -m eval.mtbench_answers` writes them)",
    )
    p.add_argument("--max-new-tokens", type=int, default=128, help="(default %(default)s)")
    p.add_argument(
        "--batch-size", type=int, default=1, help="concurrent requests (default %(default)s)"
    )
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument(
        "--temperature", type=float, default=0.0, help="0 = greedy (default %(default)s)"
    )
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0, help="sampling seed for temperature > 0")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--stream", action="store_true", help="stream, to record time to first token")
    p.add_argument("--no-flush-cache", action="store_true", help="keep the radix cache")
    p.add_argument(
        "--servers",
        choices=("auto", "concurrent", "sequential"),
        default="auto",
        help="keep all servers alive together, or start them one at a time",
    )
    p.add_argument(
        "--wait-quiet",
        type=float,
        metavar="FRACTION",
        help="before each unit, wait until at most FRACTION of all CPUs is busy",
    )
    p.add_argument(
        "--quiet-max-wait",
        type=float,
        default=600.0,
        help="seconds to wait for quiet before measuring anyway",
    )
    p.add_argument("--tokenizer", type=Path, help="model folder for the chat template")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_PROMPTS} prompts x {QUICK_TOKENS} tokens, a smoke run",
    )
    p.add_argument("--out", type=Path, help="results JSON")
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the batches of an interrupted run in --out and run only the missing ones",
    )
    p.add_argument("--log-dir", type=Path, help=f"server logs (default {LOGS}/<out name>)")


def _settings(a: argparse.Namespace) -> RunSettings:
    sampling = Sampling(
        max_new_tokens=a.max_new_tokens,
        temperature=a.temperature,
        top_p=a.top_p,
        seed=a.seed if a.temperature > 0 else None,
        ignore_eos=a.ignore_eos,
    )
    concurrent = {"auto": None, "concurrent": True, "sequential": False}[a.servers]
    return RunSettings(
        sampling=sampling,
        batch_size=a.batch_size,
        repeats=a.repeats,
        flush_cache=not a.no_flush_cache,
        stream=a.stream,
        concurrent_servers=concurrent,
        quiet_threshold=a.wait_quiet,
        quiet_max_wait_s=a.quiet_max_wait,
    )


def _mtbench_answers(a: argparse.Namespace, tokenizer_dir: Path) -> mtbench_answers.Answers | None:
    """The turn-1 answers that `--mtbench-turn 2` asks for (None for first turns or a run
    without MT-Bench); exits with the loader's message when the file is missing or wrong."""
    if a.mtbench_turn != 2:
        if a.mtbench_answers is not None:
            raise SystemExit("--mtbench-answers is read only with --mtbench-turn 2")
        return None
    if datasets.MTBENCH not in datasets.sets_of(a.dataset):
        raise SystemExit(f"--mtbench-turn 2 needs MT-Bench prompts; --dataset is {a.dataset}")
    path = a.mtbench_answers or mtbench_answers.default_path(tokenizer_dir)
    try:
        return mtbench_answers.load_answers(path)
    except datasets.DatasetError as exc:
        raise SystemExit(str(exc)) from exc


def _run(
    a: argparse.Namespace,
    configs: Sequence[Config],
    tokenizer_dir: Path,
    name: str,
    mixed_shape: mixed.MixedShape | None = None,
) -> tuple[dict, Path]:
    if a.quick:
        a.prompts, a.max_new_tokens = min(a.prompts, QUICK_PROMPTS), QUICK_TOKENS
    out: Path = a.out or RESULTS / f"{name}{'-quick' if a.quick else ''}.json"
    log_dir: Path = a.log_dir or LOGS / out.stem
    tokenizer = datasets.load_tokenizer(tokenizer_dir)
    settings = _settings(a)
    if mixed_shape is None:
        answers = _mtbench_answers(a, tokenizer_dir)
        try:
            prompts = datasets.load_prompts(
                a.dataset,
                tokenizer,
                a.prompts,
                a.prompt_ids,
                answers=None if answers is None else answers.answers,
            )
        except datasets.UnansweredError as exc:
            assert answers is not None
            raise SystemExit(f"{exc} (with --out {answers.path})") from exc
        except datasets.DatasetError as exc:
            raise SystemExit(str(exc)) from exc
        sources = {d: datasets.source_info(d) for d in datasets.sets_of(a.dataset)}
        dataset = {
            "dataset": a.dataset,
            "dataset_source": sources.popitem()[1] if len(sources) == 1 else sources,
            **(
                {}
                if answers is None
                else {"mtbench_turn": 2, "mtbench_answers": answers.describe()}
            ),
        }
    else:
        prompts, sizes = mixed.load_mixed(tokenizer, mixed_shape)
        settings = dataclasses.replace(settings, unit_sizes=sizes)
        dataset = {
            "dataset": "mixed",
            "dataset_source": {d: datasets.source_info(d) for d in datasets.DATASETS},
            "mixed_shape": dataclasses.asdict(mixed_shape),
        }
    metadata = {
        "name": name,
        "command": [sys.executable, "-m", "eval", *sys.argv[1:]],
        **dataset,
        "tokenizer": str(tokenizer_dir),
        "quick": a.quick,
    }
    print(
        f"{len(configs)} configs x {len(prompts)} {dataset['dataset']} prompts x "
        f"{a.max_new_tokens if mixed_shape is None else 'mixed'} tokens, "
        f"{len(settings.units(len(prompts)))} units, {a.repeats} repeat(s) -> {out}",
        flush=True,
    )
    results = run_interleaved(
        configs,
        prompts,
        settings,
        log_dir=log_dir,
        out_path=out,
        metadata=metadata,
        progress=lambda s: print(s, flush=True),
        resume=a.resume,
    )
    print()
    print(format_table(results))
    print(f"\nwrote {out}")
    return results, out


def cmd_baseline(a: argparse.Namespace) -> int:
    target, draft = presets.model_dirs(a.target, a.draft)
    cpus = a.cpus if a.pinned else ()
    configs = presets.baseline(target, draft, lookahead=a.lookahead, pinned_cpus=cpus)
    name = "baseline-cpu-pinned" if a.pinned else "baseline-cpu"
    _run(a, configs, a.tokenizer or Path(target), name)
    return 0


def cmd_ssd(a: argparse.Namespace) -> int:
    target_cpu, draft_cpu = _target_and_draft_cpus(a)
    target, draft = presets.model_dirs(a.target, a.draft)
    arrangements = ssd_bench.ARRANGEMENTS if a.arrangement == "both" else (a.arrangement,)
    configs = ssd_bench.bench_configs(
        target,
        draft,
        arrangements,
        lookahead=a.lookahead,
        target_cpu=target_cpu,
        draft_cpu=draft_cpu,
        ssd_extra=a.ssd_args.split(),
        standalone_lookaheads=a.standalone_gammas,
        ssd_runtimes=a.ssd_runtimes,
    )
    name = f"ssd-bench-{a.arrangement}-b{a.batch_size}-{Sampling.of(a.temperature).name}"
    return _compare(a, configs, Path(target), name, ssd_bench.comparisons)


def _compare(
    a: argparse.Namespace,
    configs: list[Config],
    target: Path,
    name: str,
    comparisons: Callable[[dict], list[dict]],
) -> int:
    """Run a comparison benchmark's `configs` (the `--only` ones, in that order), then add and
    print its `comparisons` (speedups with intervals) to the results file."""
    if a.only:
        try:
            configs = ssd_bench.select(configs, a.only)
        except ValueError as exc:
            raise SystemExit(f"--only: {exc}") from exc
    results, out = _run(a, configs, a.tokenizer or target, name)
    rows = comparisons(results)
    results["ssd_comparisons"] = rows
    out.write_text(json.dumps(results, indent=1))
    print()
    print(ssd_bench.format_comparisons(rows))
    return 0


def cmd_eagle3(a: argparse.Namespace) -> int:
    target_cpu, draft_cpu = _target_and_draft_cpus(a)
    target, draft = presets.model_dirs(a.target, a.draft)
    try:
        head = a.head or eagle3_bench.default_head(target)
    except FileNotFoundError as exc:
        raise SystemExit(str(exc)) from exc
    configs = eagle3_bench.bench_configs(
        target, draft, head, lookahead=a.lookahead, target_cpu=target_cpu, draft_cpu=draft_cpu
    )
    name = f"eagle3-b{a.batch_size}-{Sampling.of(a.temperature).name}"
    return _compare(a, configs, Path(target), name, eagle3_bench.comparisons)


def cmd_run(a: argparse.Namespace) -> int:
    configs = presets.load_configs(a.configs)
    tokenizer = a.tokenizer
    if tokenizer is None:
        model = flag_value(configs[0].args, "--model-path")
        tokenizer = Path(model) if model else presets.default_model_dirs()[0]
    _run(a, configs, tokenizer, a.name or Path(a.configs).stem)
    return 0


def cmd_mixed(a: argparse.Namespace) -> int:
    target, draft = presets.model_dirs(a.target, a.draft)
    target_cpu, draft_cpu = _target_and_draft_cpus(a)
    both = [target_cpu, draft_cpu]
    ssd = presets.ssd(
        target, draft, name=mixed.SSD, cpus=both, draft_cpus=[draft_cpu], extra=a.ssd_args.split()
    )
    configs = [
        presets.autoregressive(target, name=mixed.AR, cpus=both, threads=2),
        *presets.live_variants(ssd, a.ssd_live),
    ]
    for variant in a.ssd_variant:
        name, _, args = variant.partition("=")
        configs.append(
            presets.ssd(
                target, draft, name=name, cpus=both, draft_cpus=[draft_cpu], extra=args.split()
            )
        )
    shape = mixed.MixedShape(requests=a.requests, seed=a.seed)
    results, out = _run(a, configs, a.tokenizer or Path(target), "mixed-traffic", shape)
    results["mixed_comparison"] = mixed.comparison(results)
    out.write_text(json.dumps(results, indent=1))
    print()
    print(mixed.format_comparison(results["mixed_comparison"]))
    return 0


def cmd_show(a: argparse.Namespace) -> int:
    results = json.loads(Path(a.results).read_text())
    print(
        f"{a.results}: status {results.get('status')}, "
        f"{len(results.get('prompts', []))} prompts, settings {results.get('settings')}"
    )
    print(format_table(results))
    if a.figure is not None:
        print(f"figure: {figures.fig_throughput(Path(a.results), a.figure)}")
    return 0


def _add_experiment_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="a few prompts x tokens per point")
    cli_options.add_pair(p)
    p.add_argument("--tokenizer", type=Path, help="model folder for the chat template")
    cli_options.add_cpus(p)
    cli_options.add_lookahead(p)
    p.add_argument("--results-dir", type=Path, default=RESULTS)
    p.add_argument("--log-dir", type=Path, default=LOGS / "paper", help="server logs")
    p.add_argument("--dry-run", action="store_true", help="print the plan and estimate, stop")


def _plans(a: argparse.Namespace, kinds: Sequence[str], main: bool) -> list[sweep.Plan]:
    target_cpu, draft_cpu = _target_and_draft_cpus(a)
    target, draft = presets.model_dirs(a.target, a.draft)
    configs = sweep.base_configs(
        target, draft, lookahead=a.lookahead, target_cpu=target_cpu, draft_cpu=draft_cpu
    )
    prompts = sweep.prompt_source(a.tokenizer or Path(target))
    plans = [sweep.main_plan(list(configs.values()), prompts, quick=a.quick)] if main else []
    for kind in kinds:
        plans += sweep.sweep_plans(kind, configs[sweep.AR], configs[sweep.SSD], prompts,
                                   quick=a.quick)  # fmt: skip
    for name, line in sweep.describe(plans).items():
        print(f"{name}: {line}")
    print(
        f"estimated {sweep.estimate_s(plans) / 60:.0f} min on the real pair on 2 CPUs "
        "(assumed speeds; resumed points are skipped)",
        flush=True,
    )
    if a.dry_run:
        raise SystemExit(0)
    return plans


def cmd_sweep(a: argparse.Namespace) -> int:
    plans = _plans(a, [a.kind], main=False)
    done = sweep.run_plans(plans, results_dir=a.results_dir, log_dir=a.log_dir, resume=a.resume)
    for name, results in done.items():
        print(f"\n{name}\n{format_table(results)}")
    return 0


def cmd_model(a: argparse.Namespace) -> int:
    by_batch = {}
    for path in a.components:
        results = json.loads(path.read_text())
        name = a.components_config or _first_async_ssd(results)
        try:
            comp = model_check.components(results, name, a.ar)
        except ValueError as exc:
            raise SystemExit(f"{path}: {exc}") from exc
        by_batch[comp.batch_size] = {"file": str(path), "config": name, "components": comp}
    out: dict[str, list] = {"checks": []}
    for path in a.target:
        results = json.loads(path.read_text())
        batch = int(results["settings"]["batch_size"])
        if batch not in by_batch:
            raise SystemExit(f"{path}: batch {batch}, no components at that batch size")
        source = by_batch[batch]
        try:
            rows = model_check.check(source["components"], results, a.ar)
        except ValueError as exc:
            raise SystemExit(f"{path}: {exc}") from exc
        print(f"\n{path} from {source['file']} ({source['config']}):")
        print(model_check.report(source["components"], rows))
        components = dataclasses.asdict(source["components"])
        out["checks"].append(
            {"target": str(path), **source, "components": components, "rows": rows}
        )
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"\nwrote {a.out}")
    return 0


def _first_async_ssd(results: dict) -> str:
    for c in map(Config.from_dict, results["configs"]):
        if c.algorithm == "SSD" and c.ssd_mode == "async":
            return c.name
    raise SystemExit("no SSD configuration in the components file")


def cmd_figures(a: argparse.Namespace) -> int:
    drawn = figures.make_all(a.results_dir, a.quick)
    for f in drawn:
        print(f"{f.png}  <- {', '.join(p.name for p in f.sources)}")
    print(f"{len(drawn)}/{len(figures.FIGURES)} figures drawn (missing inputs are logged)")
    return 0


def cmd_report(a: argparse.Namespace) -> int:
    print(f"wrote {report.write_report(a.results_dir, a.quick, a.out)}")
    return 0


def cmd_all(a: argparse.Namespace) -> int:
    plans = _plans(a, sweep.SWEEPS, main=True)
    try:
        sweep.run_plans(plans, results_dir=a.results_dir, log_dir=a.log_dir, resume=not a.fresh)
    except ValueError as exc:  # an earlier run with other settings is in the way
        raise SystemExit(f"{exc}; run with --fresh to start over") from exc
    print(f"wrote {report.write_report(a.results_dir, a.quick)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m eval",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("baseline", help="AR vs STANDALONE on the real pair")
    _add_run_options(p)
    p.add_argument(
        "--pinned",
        action="store_true",
        help="pin each server (target and draft) to --cpus with one thread per CPU",
    )
    cli_options.add_cpus(p, (0,), "CPUs for --pinned (default 0)")
    cli_options.add_lookahead(p, "γ for STANDALONE")
    cli_options.add_pair(p)
    p.set_defaults(func=cmd_baseline)

    p = sub.add_parser("ssd", help="AR vs STANDALONE vs SSD sync vs SSD, two arrangements")
    _add_run_options(p)
    p.add_argument(
        "--arrangement",
        choices=(*ssd_bench.ARRANGEMENTS, "both"),
        default="both",
        help="paper: the baselines on the target's core, SSD adds the draft's; equal: every "
        "configuration on both cores; both (default)",
    )
    cli_options.add_ssd_args(p)
    p.add_argument(
        "--standalone-gammas",
        type=_gamma_list,
        default=[],
        metavar="G,G,...",
        help="run STANDALONE-2c once per γ (STANDALONE-2c-g3, ...); the fastest is the "
        "STANDALONE-2c baseline (default: one, at --lookahead)",
    )
    p.add_argument(
        "--ssd-runtimes",
        type=_runtime_list,
        default=[],
        metavar="NAMES",
        help="also run SSD-1+1c with each of these --ssd-draft-runtime names (SSD-1+1c-NAME), "
        f"among {', '.join(RUNTIME_NAMES)}; e.g. torch for the bf16 reference",
    )
    _add_compare_options(p, "e.g. AR-2c,SYNC-2c,SSD-1+1c")
    p.set_defaults(func=cmd_ssd, prompts=5, max_new_tokens=64, repeats=2)

    p = sub.add_parser(
        "eagle3", help="AR vs STANDALONE vs EAGLE3 vs SSD (0.5B draft) vs SSD (EAGLE-3 head)"
    )
    _add_run_options(p)
    _add_compare_options(p, "e.g. AR-2c,EAGLE3-2c,SSD-HEAD-1+1c")
    p.add_argument(
        "--head",
        type=Path,
        help="EAGLE-3 head folder (default: the one `python -m sglang_ssd.models build eagle3` "
        "stored in the model cache)",
    )
    p.set_defaults(func=cmd_eagle3, prompts=4, max_new_tokens=64, repeats=1)

    p = sub.add_parser("mixed", help="mixed traffic: AR-2c vs SSD on short mixed requests")
    _add_run_options(p)
    p.add_argument("--requests", type=int, default=40, help="requests in the draw")
    cli_options.add_cpus(p)
    cli_options.add_ssd_args(p)
    p.add_argument(
        "--ssd-variant",
        action="append",
        default=[],
        metavar="NAME=FLAGS",
        help="another SSD configuration to run alongside, e.g. "
        "'SSD-async=--ssd-mode async' (repeatable)",
    )
    p.add_argument(
        "--ssd-live",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="another SSD configuration on the SSD server itself, its live settings applied "
        """before each unit, e.g. 'SSD-sync={"mode": "sync"}' (repeatable)""",
    )
    cli_options.add_pair(p)
    p.set_defaults(func=cmd_mixed, repeats=2, servers="concurrent")

    p = sub.add_parser("run", help="configurations from a JSON file")
    _add_run_options(p)
    p.add_argument("--configs", type=Path, required=True, help="JSON list of configurations")
    p.add_argument("--name", help="experiment name (default: the configs file's stem)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("sweep", help="a sweep over SSD's run-time settings, no restarts")
    p.add_argument("kind", choices=sweep.SWEEPS)
    _add_experiment_options(p)
    p.add_argument("--resume", action="store_true", help="keep the points already measured")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("figures", help="PNG figures from the results files")
    p.add_argument("--quick", action="store_true", help="from the --quick results")
    p.add_argument("--results-dir", type=Path, default=RESULTS)
    p.set_defaults(func=cmd_figures)

    p = sub.add_parser("report", help="figures plus the markdown report")
    p.add_argument("--quick", action="store_true", help="from the --quick results")
    p.add_argument("--results-dir", type=Path, default=RESULTS)
    p.add_argument("--out", type=Path, help="report path (default <results-dir>/report.md)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("all", help="main comparison, every sweep, figures and report")
    _add_experiment_options(p)
    p.add_argument("--fresh", action="store_true", help="discard earlier results, start over")
    p.set_defaults(func=cmd_all)

    p = sub.add_parser("model", help="the speedup model's predictions against measured runs")
    p.add_argument(
        "--components", type=Path, nargs="+", required=True,
        help="results files whose SSD counters give the components (one per batch size)",
    )  # fmt: skip
    p.add_argument(
        "--components-config", help="SSD configuration of those files (default: the first)"
    )
    p.add_argument(
        "--target", type=Path, nargs="+", required=True,
        help="results files whose SSD rows the model predicts (matched by batch size)",
    )  # fmt: skip
    p.add_argument(
        "--ar", default="AR-2c", help="the AR configuration speedups refer to (default: AR-2c)"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=RESULTS / "model-check.json",
        help="results JSON (default: eval/results/model-check.json, overwritten)",
    )
    p.set_defaults(func=cmd_model)

    p = sub.add_parser("margin", help="measure ε of the greedy rule on the real pair")
    margin.add_arguments(p)
    p.set_defaults(func=margin.run)

    p = sub.add_parser("outcomes", help="record rounds, replay fan-out allocations on them")
    outcomes.add_arguments(p)

    p = sub.add_parser("target-split", help="where the target's forward goes (in SGLang, CPU)")
    target_split.add_arguments(p)
    p.set_defaults(func=target_split.run)

    p = sub.add_parser("options", help="what each request option costs SSD (tok/s ratio)")
    options_cost.add_arguments(p)
    p.set_defaults(func=options_cost.cli)

    p = sub.add_parser("show", help="print the table of a results file")
    p.add_argument("results", type=Path)
    p.add_argument("--figure", type=Path, help="also draw its tok/s bars to this PNG")
    p.set_defaults(func=cmd_show)

    a = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # e.g. why a figure is skipped
    # SIGTERM must unwind like Ctrl-C, so that the servers' context managers stop them.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return a.func(a)


if __name__ == "__main__":
    sys.exit(main())
