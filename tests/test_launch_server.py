"""The launcher's first-start work: the draft vocabulary is counted from the draft's local
folder, so a draft given as anything else is refused with a message, not a traceback."""

from __future__ import annotations

import re
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
