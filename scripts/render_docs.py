"""Render the reference parts of docs/ from the code that declares them.

Each rendered part sits in its Markdown file between two marker lines,

    <!-- rendered by scripts/render_docs.py: NAME -->
    ...
    <!-- end rendered: NAME -->

and the text around it is written by hand. The parts:

- `ssd-flags` (docs/flags.md): every `SSDConfig` flag, from its `Flag` declaration
  (`sglang_ssd/config.py`): default, live or not, its one-sentence help, its evidence.
- `server-flags` (docs/flags.md): SGLang's server flags under SSD
  (`sglang_ssd/integration/server_flags.py`).
- `user-flags` (README.md): the few flags a user touches, from the same declarations.
- `stats-keys` (docs/stats.md): the `/ssd/stats` keys (`sglang_ssd/integration/stats_keys.py`)
  and the speculator's counters (`SpeculatorStats`, `SpeculatorClientStats` fields).

Usage: `python scripts/render_docs.py` rewrites the parts in place; `--check` changes nothing
and exits 1, naming each part that differs from the code (tests/scripts/test_render_docs.py
runs it so).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BEGIN = "<!-- rendered by scripts/render_docs.py: {name} -->"
END = "<!-- end rendered: {name} -->"
HELP_LIMIT = 200  # characters of a flag's help: one sentence


def _cell(text: str) -> str:
    """Text fit for one Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def _shown_default(flag: Any) -> str:
    """A flag's default as the startup log names it (None: "auto", chosen by the server)."""
    if flag.switch:
        return "off"
    if flag.default is None:
        return "auto"
    return str(flag.default)


def _usage(flag: Any) -> str:
    """The flag as typed: its option, then its metavar or choices."""
    if flag.switch:
        return flag.option
    if flag.metavar:
        return f"{flag.option} {flag.metavar}"
    if flag.choices:
        return f"{flag.option} {{{','.join(flag.choices)}}}"
    return flag.option


def ssd_flags() -> str:
    """The `--ssd-*` flags table (and γ, SGLang's flag that SSD reads), in field order.

    Raises:
        ValueError: a flag whose help exceeds `HELP_LIMIT` characters or that names no evidence.
    """
    from sglang_ssd.config import FLAGS

    rows = ["| flag | default | live | what it does | evidence |", "|---|---|---|---|---|"]
    for flag in FLAGS.values():
        if len(flag.help) > HELP_LIMIT:
            raise ValueError(f"{flag.option}: help of {len(flag.help)} characters (> {HELP_LIMIT})")
        if not flag.evidence:
            raise ValueError(f"{flag.option}: no evidence named (`Flag.evidence`)")
        label = flag.evidence.partition("#")[0].removesuffix(".md")
        rows.append(
            f"| `{_usage(flag)}` | {_shown_default(flag)} | {'live' if flag.live else ''} | "
            f"{_cell(flag.help)} | [{label}]({flag.evidence}) |"
        )
    return "\n".join(rows)


# The README's short list: the fields of the flags a user touches, in this order.
USER_FLAGS = ("mode", "draft_cpus", "draft_device", "fanout_budget", "beta")


def user_flags() -> str:
    """The README's table of the flags a user touches (`USER_FLAGS`), after the draft's path."""
    from sglang_ssd.config import FLAGS

    rows = [
        "| flag | default | what it does |",
        "|---|---|---|",
        "| `--speculative-draft-model-path` | the 0.5B | The draft: a causal LM sharing the "
        "target's tokenizer, or an EAGLE-3 head. |",
    ]
    for name in USER_FLAGS:
        flag = FLAGS[name]
        rows.append(f"| `{_usage(flag)}` | {_shown_default(flag)} | {_cell(flag.help)} |")
    return "\n".join(rows)


def server_flags() -> str:
    """SGLang's server flags under SSD (`server_flags.flags_table`)."""
    from sglang_ssd.integration.server_flags import flags_table

    return flags_table()


def _keys_table(keys: dict[str, str], prefix: str = "") -> list[str]:
    rows = ["| key | holds |", "|---|---|"]
    rows += [f"| `{prefix}{key}` | {_cell(text)} |" for key, text in keys.items()]
    return rows


def _field_names(fields: Any) -> str:
    return ", ".join(f"`{name}`" for name in fields)


def stats_keys() -> str:
    """The `/ssd/stats` keys by group, and the fields behind `speculator`."""
    import msgspec

    from sglang_ssd.integration import stats_keys as keys
    from sglang_ssd.transport.messages import SpeculatorStats
    from sglang_ssd.worker.speculator_admin import SpeculatorClientStats

    spec_fields = [f.name for f in msgspec.structs.fields(SpeculatorStats)]
    client_fields = [f.name for f in dataclasses.fields(SpeculatorClientStats)]
    out = ["Top level, in every reply:", "", *_keys_table(keys.TOP), ""]
    out += ["Once the speculator has answered:", "", *_keys_table(keys.SPECULATOR), ""]
    out += ["From SGLang's scheduler:", "", *_keys_table(keys.SCHEDULER), ""]
    for group, declared in (
        ("plain_rounds", keys.PLAIN_ROUNDS),
        ("arrangements", keys.ARRANGEMENTS),
        ("fallback", keys.FALLBACK),
    ):
        out += [f"`{group}`:", "", *_keys_table(declared, f"{group}."), ""]
    out += [
        "`speculator` holds one key per field of the speculator's `SpeculatorStats` "
        f"({_field_names(spec_fields)}), of the link's `SpeculatorClientStats` "
        f"({_field_names(client_fields)}) and of the planner's `RoundPlanner.stats` (the "
        "tree-depth tuner's figures and the rounds by arrangement).",
        "",
        "Renamed keys:",
        "",
        "| was | now, and why |",
        "|---|---|",
        *[f"| `{old}` | {_cell(why)} |" for old, why in keys.RENAMED.items()],
    ]
    return "\n".join(out)


# (file under the root, part name) -> its renderer.
PARTS: dict[tuple[str, str], Callable[[], str]] = {
    ("README.md", "user-flags"): user_flags,
    ("docs/flags.md", "ssd-flags"): ssd_flags,
    ("docs/flags.md", "server-flags"): server_flags,
    ("docs/stats.md", "stats-keys"): stats_keys,
}


def _span(text: str, name: str, path: str) -> re.Match[str]:
    pattern = re.escape(BEGIN.format(name=name)) + r"\n(.*?)\n?" + re.escape(END.format(name=name))
    found = re.search(pattern, text, flags=re.S)
    if found is None:
        raise ValueError(f"{path}: no rendered part {name!r} (its marker lines are missing)")
    return found


def rendered_part(path: str, name: str) -> str:
    """The part `name` of `path` as the file holds it now.

    Raises:
        ValueError: when the file lacks the part's marker lines.
    """
    return _span((ROOT / path).read_text(), name, path).group(1)


def render(check: bool = False) -> list[str]:
    """Bring every part up to date (or, with `check`, only compare); returns 'path: name' of
    each part that differed."""
    stale = []
    for (path, name), renderer in PARTS.items():
        text = (ROOT / path).read_text()
        found = _span(text, name, path)
        fresh = renderer()
        if found.group(1) == fresh:
            continue
        stale.append(f"{path}: {name}")
        if not check:
            block = f"{BEGIN.format(name=name)}\n{fresh}\n{END.format(name=name)}"
            (ROOT / path).write_text(text[: found.start()] + block + text[found.end() :])
    return stale


def main(argv: list[str] | None = None) -> int:
    """Render (or `--check`) every part; exit status 1 when `--check` finds a stale one."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 if stale")
    args = parser.parse_args(argv)
    stale = render(check=args.check)
    verb = "differs from the code (run python scripts/render_docs.py)" if args.check else "updated"
    for part in stale:
        print(f"{part}: {verb}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
