"""A greedy trace from a served run: the target's outputs of an `eval run` results file.

`python -m eval.trace record` decodes with the target in transformers, one prompt at a time,
which on a 2-core CPU takes minutes per prompt. A replay needs only the prompts and the target's
greedy outputs, and an `eval run` of the autoregressive server already holds those for its
prompts (`batches[].requests[].output_ids`), served by SGLang itself. `trace_from_run` turns one
configuration's unit of such a file into a trace `eval.trace.replay` accepts, with no recorded
rounds (`rounds_matching_record` of its replays is then 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from eval.datasets import DatasetError, Prompt
from eval.harness import SCHEMA as RUN_SCHEMA
from eval.mtbench_answers import load_answers
from eval.sampling import Sampling


class RunTraceError(ValueError):
    """The results file cannot give a greedy trace (sampled, unknown config, prompts differ)."""


def check_run_file(results: Any, path: object = "the file") -> dict[str, Any]:
    """`results` itself when it is an `eval run` results file (`eval.harness.SCHEMA`, with its
    prompts and units).

    Raises:
        RunTraceError: anything else (another tool's JSON, an interrupted run without units),
            naming `path`.
    """
    schema = results.get("schema") if isinstance(results, dict) else None
    if schema != RUN_SCHEMA:
        raise RunTraceError(
            f"{path} is not an `eval run` results file (schema {schema!r}, expected "
            f"{RUN_SCHEMA!r}): from-run takes the outputs of `python -m eval run` or "
            "`python -m eval ssd`"
        )
    missing = [k for k in ("experiment", "prompts", "batches") if not results.get(k)]
    if missing:
        raise RunTraceError(f"{path} has no {', '.join(missing)}: an interrupted run?")
    return results


def run_answers(results: dict[str, Any]) -> Mapping[str, str] | None:
    """The MT-Bench turn-1 answers a second-turn run's prompts were built with (its
    `mtbench_answers` file, checked against the sha256 the run recorded), None for first turns.

    Raises:
        RunTraceError: the answers file is gone or changed since the run.
    """
    held = results["experiment"].get("mtbench_answers")
    if not held:
        return None
    try:
        answers = load_answers(Path(held["path"]))
    except DatasetError as exc:
        raise RunTraceError(f"the run's MT-Bench turn-1 answers: {exc}") from exc
    if answers.sha256 != held["sha256"]:
        raise RunTraceError(f"{held['path']} changed since the run (sha256 differs)")
    return answers.answers


def run_outputs(results: dict[str, Any], config: str, repeat: int) -> dict[str, list[int]]:
    """Output token ids by prompt id of `config`'s requests in repeat `repeat` of `results`.

    Raises:
        RunTraceError: no such configuration or repeat, or a request that failed.
    """
    outputs: dict[str, list[int]] = {}
    for unit in results.get("batches", []):
        if unit["config"] != config or unit["repeat"] != repeat:
            continue
        for request in unit["requests"]:
            if request.get("error") or request.get("output_ids") is None:
                raise RunTraceError(f"{config} repeat {repeat}: {request['prompt_id']} failed")
            outputs[request["prompt_id"]] = [int(t) for t in request["output_ids"]]
    if not outputs:
        known = sorted({(u["config"], u["repeat"]) for u in results.get("batches", [])})
        raise RunTraceError(f"no units of {config!r} repeat {repeat}; the file has {known}")
    return outputs


def trace_from_run(
    results: dict[str, Any],
    prompts: Sequence[Prompt],
    *,
    config: str = "AR-2c",
    repeat: int = 0,
    lookahead: int = 4,
) -> dict[str, Any]:
    """The trace body (`prompts`, `rounds`, `summary`, `sampling`, `ssd_config`, ...) of
    `config`'s greedy outputs in `results`, an `eval run` results file (sglang-ssd-eval/1).

    Args:
        results: the parsed results file.
        prompts: the run's prompts, chat-templated again (`eval.datasets.load_prompts` with
            the run's prompt ids); each must have the token-id fingerprint the file recorded.
        config: the configuration whose outputs become the trace (the target alone, AR, gives
            the target's own greedy text).
        repeat: which of the run's repeats.
        lookahead: γ, the draft length the replay drafts (`ssd_config.lookahead`).

    Returns:
        A dict with the keys `eval.trace.replay.replay` reads: `prompts` ([{index,
        input_ids, output_tokens, id}]), `sampling` (greedy), `ssd_config`, `rounds` (empty),
        `summary`, `max_new_tokens`, and `source` (config, repeat, file's commit).

    Raises:
        RunTraceError: a sampled run, prompts whose fingerprint differs from the file's, or as
            `run_outputs`.
    """
    settings = results.get("settings", {}).get("sampling", {})
    if not Sampling(**_sampling_fields(settings)).greedy:
        raise RunTraceError(
            f"the run sampled at temperature {settings.get('temperature')}: a replay can force "
            "only greedy outputs (the target's outcome must follow from the draft and the text; "
            "see `eval/trace/__init__.py`), so take a greedy run"
        )
    recorded = {p["id"]: p["input_ids_sha256"] for p in results.get("prompts", [])}
    for prompt in prompts:
        if recorded.get(prompt.id) != prompt.fingerprint():
            raise RunTraceError(
                f"prompt {prompt.id}: its token ids differ from the run's (another tokenizer or "
                "chat template?)"
                if prompt.id in recorded
                else f"prompt {prompt.id} is not in the run"
            )
    outputs = run_outputs(results, config, repeat)
    entries = [
        {
            "index": i,
            "id": p.id,
            "input_ids": list(p.input_ids),
            "output_tokens": outputs[p.id],
        }
        for i, p in enumerate(prompts)
        if p.id in outputs
    ]
    return {
        "source": {
            "config": config,
            "repeat": repeat,
            "experiment": results.get("experiment", {}).get("name"),
            "commit": results.get("git", {}).get("commit"),
        },
        "sampling": {"temperature": 0.0, "top_k": 1, "top_p": 1.0},
        "seed": 0,
        "max_new_tokens": settings.get("max_new_tokens"),
        "ssd_config": {"lookahead": lookahead},
        "prompts": entries,
        "rounds": [],
        "summary": {
            "prompts": len(entries),
            "tokens": sum(len(e["output_tokens"]) for e in entries),
        },
    }


def _sampling_fields(settings: dict[str, Any]) -> dict[str, Any]:
    return {k: settings[k] for k in ("temperature", "top_k", "top_p") if k in settings}
