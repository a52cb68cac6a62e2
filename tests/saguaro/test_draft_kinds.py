"""The draft-kind registry (`saguaro.draft_kinds`) is the one home of the backup vocabulary: every
list of kinds derives from it.

The dummy-kind check runs in a fresh interpreter: the lists are built when their modules are
first imported, so the registry is extended there before anything else imports it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import get_args

import pytest

from sglang_ssd import config
from sglang_ssd.integration import request_metrics
from sglang_ssd.saguaro import Backup, draft_kinds
from sglang_ssd.transport import messages
from sglang_ssd.worker import tp_sync

# What each derived list holds, read the same way in this process and in the dummy's.
LISTS = """
from typing import get_args
from sglang_ssd import config
from sglang_ssd.integration import request_metrics
from sglang_ssd.saguaro import Backup
from sglang_ssd.transport import messages
from sglang_ssd.worker import tp_sync

lists = {
    "--ssd-backup": list(config.BACKUPS),
    "policy options": [b.value for b in Backup],
    "Step.backup": list(get_args(messages.StepBackup)),
    "DraftSource": [s.value for s in messages.DraftSource],
    "point-mass sources": [s.value for s in messages._POINT_MASS_SOURCES],
    "TP source codes": list(tp_sync.SOURCES),
    "meta_info ssd_backup_rounds": list(
        request_metrics.meta_info_fields({"cache": 1})["ssd_backup_rounds"]
    ),
}
"""


def _lists_here() -> dict[str, list[str]]:
    scope: dict = {}
    exec(LISTS, scope)
    return scope["lists"]


def test_every_list_is_the_registrys() -> None:
    backups = list(draft_kinds.backup_names())
    assert backups == ["jit", "ngram", "random"]
    assert _lists_here() == {
        "--ssd-backup": [*backups, "auto"],
        "policy options": backups,
        "Step.backup": backups,
        "DraftSource": ["cache", *backups, "missing"],
        "point-mass sources": ["ngram", "random", "missing"],
        "TP source codes": ["cache", *backups, "local-ngram", "plain"],
        "meta_info ssd_backup_rounds": [*backups, "local-ngram"],
    }
    assert list(get_args(config.BackupChoice)) == list(config.BACKUPS)
    assert draft_kinds.round_sources() == tp_sync.SOURCES
    assert draft_kinds.kind_names() == request_metrics.BACKUP_KINDS
    assert [b.value for b in Backup] == list(messages.StepBackup.__args__)


def test_a_kind_added_in_one_place_reaches_every_list() -> None:
    script = (
        textwrap.dedent(
            """
        import json
        from sglang_ssd.saguaro import draft_kinds
        draft_kinds.KINDS = (*draft_kinds.KINDS, draft_kinds.DraftKind(
            "dummy", "ngram", point_mass=True, speculator=True, prior_alpha=0.2,
            prior_latency_s=0.001))
        """
        )
        + LISTS
        + textwrap.dedent(
            """
        from sglang_ssd.worker.planner import default_policy
        config.SSDConfig(backup="dummy")  # a --ssd-backup value
        step = messages.Step(step_id=1, outcomes=[], requests=[], backup="dummy")
        assert messages.decode(messages.encode(step)) == step  # on the wire
        lists["policy priors"] = [b.value for b in default_policy(config.SSDConfig()).backups]
        print(json.dumps(lists))
        """
        )
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lists = json.loads(done.stdout.strip().splitlines()[-1])
    missing = [name for name, values in lists.items() if "dummy" not in values]
    assert not missing, f"lists without the dummy kind: {missing}\n{lists}"


def test_unknown_kind_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="jit, ngram, random, local-ngram"):
        draft_kinds.kind("nope")
    assert draft_kinds.kind("local-ngram").speculator is False
