"""SGLang frontend-language programs (`sgl.function`) run on a server, greedy (test helper).

`run_programs` runs every program of `PROGRAMS` on one server through SGLang's own
`RuntimeEndpoint` and returns what each produced, so a test can run them on an SSD server and on
a plain autoregressive one and compare: multi-turn chat under the frontend's chat template,
`select`, `fork` with parallel branches, regex-constrained `gen`s (a code, an integer), a stop
string, streaming and `run_batch`. `RecordingEndpoint` keeps each generate call's prompt
text and output (token ids too when the call returned logprobs), so a divergence can be judged
at the call where it starts.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import sglang as sgl
from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint

CODE_REGEX = r"[A-Z]{2}[0-9]{3}"  # what `constrained`'s "code" must match
COUNT_REGEX = r"[1-9][0-9]{0,3}"  # an integer: what `constrained`'s "count" must match
CHOICES = ("yes", "no", "maybe")
BRANCHES = 3
BATCH_PROMPTS = ("def fibon", "hello world", "abcabc", "x = [1, 2,")


@dataclass(frozen=True)
class Call:
    """One generate call of a program: the prompt text sent and its stop strings, the output
    text, the output token ids when the call asked for logprobs (else None), the server's
    `completion_tokens` and `finish_reason`, and its `spec_accept_length` (None from a server
    that does not speculate)."""

    prompt: str
    stop: tuple[str, ...]
    text: str
    output_ids: tuple[int, ...] | None
    completion_tokens: int
    finish_reason: Any
    accept_length: float | None


class RecordingEndpoint(RuntimeEndpoint):
    """SGLang's `RuntimeEndpoint` that also records every `gen` call it serves (`calls`),
    streamed or not; thread-safe (fork branches and `run_batch` call it from several threads)."""

    def __init__(self, base_url: str, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self.calls: list[Call] = []
        self._lock = threading.Lock()

    def generate(self, s: Any, sampling_params: Any) -> tuple[str, dict]:
        prompt = s.text_
        text, meta = super().generate(s, sampling_params)
        self._record(prompt, sampling_params.stop, text, meta)
        return text, meta

    def generate_stream(self, s: Any, sampling_params: Any) -> Iterator[tuple[str, dict]]:
        prompt, text, meta = s.text_, "", {}
        for chunk, meta in super().generate_stream(s, sampling_params):
            text += chunk
            yield chunk, meta
        self._record(prompt, sampling_params.stop, text, meta)

    def _record(self, prompt: str, stop: Any, text: str, meta: dict) -> None:
        rows = meta.get("output_token_logprobs")
        ids = tuple(int(row[1]) for row in rows) if rows is not None else None
        stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
        with self._lock:
            self.calls.append(
                Call(
                    prompt,
                    stops,
                    text,
                    ids,
                    meta.get("completion_tokens", 0),
                    meta.get("finish_reason"),
                    meta.get("spec_accept_length"),
                )
            )


@sgl.function
def chat(s, question: str, follow_up: str, max_tokens: int):
    """Two chat turns under the backend's chat template."""
    s += sgl.system("Answer in one short line.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("first", max_tokens=max_tokens))
    s += sgl.user(follow_up)
    s += sgl.assistant(sgl.gen("second", max_tokens=max_tokens))


@sgl.function
def pick(s, question: str, max_tokens: int):
    """`select` among `CHOICES`, then free text that depends on the choice."""
    s += question + " Answer: "
    s += sgl.select("answer", choices=list(CHOICES))
    s += ". Because"
    s += sgl.gen("reason", max_tokens=max_tokens)


@sgl.function
def branches(s, topic: str, max_tokens: int):
    """`BRANCHES` forks generated in parallel, joined back into one summary request."""
    s += f"Three facts about {topic}.\n"
    forks = s.fork(BRANCHES)
    for i, branch in enumerate(forks):
        branch += f"Fact {i + 1}:"
        branch += sgl.gen("fact", max_tokens=max_tokens)
    forks.join()
    s += "In short:" + sgl.gen("summary", max_tokens=max_tokens)


@sgl.function
def constrained(s, prompt: str, max_tokens: int):
    """Two regex-constrained `gen`s: a code (`CODE_REGEX`), then an integer (`COUNT_REGEX`).

    Not `gen_int`: it adds the stop strings " " and "\n", and a tokenizer that decodes with a
    space between tokens (the tiny one) would stop it before its first digit."""
    s += prompt + " Product code: "
    s += sgl.gen("code", max_tokens=max_tokens, regex=CODE_REGEX)
    s += ". Units in stock: "
    s += sgl.gen("count", max_tokens=max_tokens, regex=COUNT_REGEX)


@sgl.function
def complete(s, prompt: str, max_tokens: int, stop: list[str]):
    """One plain completion (streamed, batched and stop-string cases use it)."""
    s += prompt
    s += sgl.gen("text", max_tokens=max_tokens, stop=stop)


@dataclass
class Outcome:
    """What the programs produced on one server: each case's variables, and the calls made."""

    values: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    stream_chunks: int = 0


class ProgramError(RuntimeError):
    """A frontend program ended with an error (the server refused or failed a request)."""


def _finished(state: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """`state`'s variables `names`.

    Raises:
        ProgramError: the program ended with an error.
    """
    if state.error() is not None:
        raise ProgramError(f"{type(state.error()).__name__}: {state.error()}")
    return {name: state[name] for name in names}


def _case(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`run()`'s values, or {"error": ...} when its program failed, so that one failing case
    shows as itself and the others still run."""
    try:
        return run()
    except ProgramError as error:
        return {"error": str(error)}


def stop_in(text: str, after: int) -> str:
    """The shortest non-blank substring of `text` (≤ 4 characters) whose first occurrence starts
    at index `after` or later: as a stop string it ends the output there.

    Raises:
        AssertionError: `text` has no such substring (too short or too repetitive).
    """
    for length in range(1, 5):
        for i in range(after, len(text) - length + 1):
            sub = text[i : i + length]
            if sub.strip() == sub and text.find(sub) == i:
                return sub
    raise AssertionError(f"no stop string first occurs at or after {after} in {text!r}")


def run_programs(
    url: str, max_tokens: int, stop: str | None = None, *, logprobs: bool = False
) -> Outcome:
    """Every program on the server at `url`, greedy, each `gen` at most `max_tokens` tokens.

    Args:
        url: the server's base URL.
        max_tokens: the token limit of every `gen`.
        stop: the "stop" case's stop string; None picks one from this run's unstopped output
            of the same prompt (`stop_in`, 4 characters or more in), so that it fires.
        logprobs: ask for logprobs, so that each recorded call has its output ids.

    Returns:
        `Outcome.values` by case: "chat" (first, second, roles), "select" (answer, reason),
        "fork" (fact: one per branch, summary), "regex" (code, count), "batch" (texts),
        "stop" (stop, text, finish_reason), "stream" (text, the chunks joined), or
        {"error": ...} for a case whose program failed; `Outcome.calls`, every generate call in
        the order served; `Outcome.stream_chunks`, the streamed chunks.
    """
    backend = RecordingEndpoint(url)
    run = {"backend": backend, "temperature": 0, "return_logprob": logprobs or None}
    out = Outcome()

    def chat_case() -> dict[str, Any]:
        state = chat.run("Name a fruit.", "And a color?", max_tokens, **run)
        roles = [m["role"] for m in state.messages()]
        return {**_finished(state, ("first", "second")), "roles": roles}

    def batch_case() -> dict[str, Any]:
        batch = [{"prompt": p, "max_tokens": max_tokens, "stop": []} for p in BATCH_PROMPTS]
        states = complete.run_batch(batch, num_threads=len(batch), **run)
        return {"texts": [_finished(s, ("text",))["text"] for s in states]}

    def stop_case() -> dict[str, Any]:
        chosen = stop
        if chosen is None:
            if "error" in out.values["batch"]:
                raise ProgramError("no stop string: the batch case failed")
            chosen = stop_in(out.values["batch"]["texts"][0], 4)
        state = complete.run(BATCH_PROMPTS[0], max_tokens, [chosen], **run)
        text = _finished(state, ("text",))
        return {
            "stop": chosen,
            **text,
            "finish_reason": state.get_meta_info("text")["finish_reason"],
        }

    def stream_case() -> dict[str, Any]:
        state = complete.run(BATCH_PROMPTS[1], max_tokens, [], stream=True, **run)
        chunks = list(state.text_iter("text"))
        out.stream_chunks = len(chunks)
        return {**_finished(state, ("text",)), "joined": "".join(chunks)}

    out.values["chat"] = _case(chat_case)
    out.values["select"] = _case(
        lambda: _finished(pick.run("Is the sky blue?", max_tokens, **run), ("answer", "reason"))
    )
    out.values["fork"] = _case(
        lambda: _finished(branches.run("the sea", max_tokens, **run), ("fact", "summary"))
    )
    out.values["regex"] = _case(
        lambda: _finished(
            constrained.run("Inventory report.", max_tokens, **run), ("code", "count")
        )
    )
    out.values["batch"] = _case(batch_case)
    out.values["stop"] = _case(stop_case)
    out.values["stream"] = _case(stream_case)
    out.calls = list(backend.calls)
    return out


def assert_constraints(out: Outcome, tokens: Callable[[str], str] = str) -> None:
    """Each program's output has the form its program asks for.

    Args:
        out: what `run_programs` returned for one server.
        tokens: a generated text as the string its tokens spell (identity for a real tokenizer).

    Raises:
        AssertionError: naming the case and its values.
    """
    values = out.values
    failed = {case: v["error"] for case, v in values.items() if "error" in v}
    assert not failed, failed
    assert values["chat"]["roles"] == ["system", "user", "assistant", "user", "assistant"]
    assert values["chat"]["first"] and values["chat"]["second"], values["chat"]
    assert values["select"]["answer"] in CHOICES, values["select"]
    assert len(values["fork"]["fact"]) == BRANCHES and all(values["fork"]["fact"]), values["fork"]
    assert re.fullmatch(CODE_REGEX, tokens(values["regex"]["code"])), values["regex"]
    assert re.fullmatch(COUNT_REGEX, tokens(values["regex"]["count"])), values["regex"]
    stop = values["stop"]
    assert stop["finish_reason"] == {"type": "stop", "matched": stop["stop"]}, stop
    assert stop["stop"] not in stop["text"], stop
    stream = values["stream"]
    assert out.stream_chunks > 1 and stream["joined"] == stream["text"], (out.stream_chunks, stream)
