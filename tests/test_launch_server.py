"""The launcher's first-start work: the draft vocabulary is counted from the draft's local
folder, so a draft given as anything else is refused with a message, not a traceback."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_ssd.config import SSDConfig
from sglang_ssd.launch_server import _prepare_draft_vocab


def test_a_draft_that_is_not_a_folder_is_refused_with_a_message(tmp_path: Path) -> None:
    argv = ["--speculative-algorithm", "SSD", "--speculative-draft-model-path", "Qwen/Qwen2.5-0.5B"]
    with pytest.raises(SystemExit, match=re.escape("Qwen/Qwen2.5-0.5B is not a local folder")):
        _prepare_draft_vocab(SSDConfig(draft_vocab=65536), argv)
    _prepare_draft_vocab(SSDConfig(draft_vocab=0), argv)  # nothing to count: SGLang's to resolve
    plain = ["--speculative-algorithm", "NONE", "--speculative-draft-model-path", str(tmp_path)]
    _prepare_draft_vocab(SSDConfig(draft_vocab=65536), plain)  # not SSD: nothing to count


SPECULATOR_ZYGOTE = """
import json, os, sys
from sglang_ssd.launch import zygote
from sglang_ssd.launch_server import start_speculator_zygote

environ = dict(os.environ)
report = {"none": start_speculator_zygote(["--speculative-algorithm", "NONE"], environ)}
report["off"] = start_speculator_zygote([], {**environ, zygote.SPECULATOR_SWITCH: "0"})
report["env_untouched"] = zygote.SPECULATOR_ADDRESS_ENV not in environ
report["ssd"] = start_speculator_zygote([], environ)
address = environ[zygote.SPECULATOR_ADDRESS_ENV]
child = zygote.fork(address, ["--help"], environ)
report["help_exit"] = child.wait(300)
report["abstract"] = address.startswith("@")
print(json.dumps(report))
"""


def test_the_ssd_launcher_forks_a_speculator_zygote_on_cpu_only_for_ssd() -> None:
    """`start_speculator_zygote`: nothing for another algorithm or with the switch off; for SSD
    a zygote whose address goes to SGLang's children and which forks `python -m
    sglang_ssd.speculator` (here `--help`: exit 0)."""
    done = subprocess.run(
        [sys.executable, "-c", SPECULATOR_ZYGOTE],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["none"] is None and report["off"] is None and report["env_untouched"]
    assert isinstance(report["ssd"], int) and report["abstract"]
    assert report["help_exit"] == 0
