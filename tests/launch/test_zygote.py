"""`sglang_ssd.launch.zygote`: a child forked from a preloaded zygote is set up as an exec'd process
would be (arguments, the caller's environment and working directory, CPU affinity, its own session,
torch's thread count), and its exit status comes back as `subprocess.Popen`'s would. A probe
module stands in for the launcher (the integration tests start every server through it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_ssd.launch import zygote

PROBE = textwrap.dedent(
    """
    import json, os, sys, time
    report = {
        "argv": sys.argv[1:],
        "probe": os.environ.get("PROBE"),
        "cwd": os.getcwd(),
        "cpus": sorted(os.sched_getaffinity(0)),
        "session_leader": os.getsid(0) == os.getpid(),
        "ppid": os.getppid(),
    }
    if "torch" in sys.modules:  # what a child SGLang forks from this launcher runs with
        read, write = os.pipe()
        if os.fork() == 0:
            os.write(write, str(sys.modules["torch"].get_num_threads()).encode())
            os._exit(0)
        os.wait()
        report["threads"] = int(os.read(read, 16))
    print(json.dumps(report), flush=True)
    if sys.argv[1] == "sleep":
        time.sleep(120)
    sys.exit(int(sys.argv[1]))
    """
)


def _zygote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preload: str) -> Iterator[tuple]:
    (tmp_path / "zygote_probe.py").write_text(PROBE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # what the zygote's torch reads at import
    sock = tmp_path / "z.sock"
    with zygote.running(sock, tmp_path / "zygote.log", (preload,), "zygote_probe") as proc:
        yield str(sock), proc


@pytest.fixture
def plain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple]:
    """A zygote that preloads only `json`, running the probe."""
    yield from _zygote(tmp_path, monkeypatch, "json")


def _report(log: Path) -> dict:
    return json.loads(log.read_text().splitlines()[-1])


def test_a_child_gets_the_callers_args_environment_folder_and_cpus(
    plain: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, proc = plain
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    log = tmp_path / "child.log"
    env = {**os.environ, "PROBE": "from the caller"}
    child = zygote.fork(sock, ["3", "--flag"], env, log, cpus=[0])
    assert child.wait(60) == 3 and child.poll() == 3
    report = _report(log)
    assert report["argv"] == ["3", "--flag"]
    assert report["probe"] == "from the caller"
    assert report["cwd"] == str(work)
    assert report["cpus"] == [0]
    assert report["session_leader"]
    assert report["ppid"] == proc.pid


def test_a_signalled_child_reports_minus_the_signal_and_shows_its_command_line(
    plain: tuple, tmp_path: Path
) -> None:
    sock, _ = plain
    log = tmp_path / "child.log"
    address = json.dumps({"session": "a b", "port": 1})  # spaces and quotes survive the title
    child = zygote.fork(sock, ["sleep", "--address", address], dict(os.environ), log)
    deadline = time.monotonic() + 60
    while not log.exists() or not log.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert child.poll() is None
    argv = zygote.argv_of(child.pid)
    assert argv == [sys.executable, "-m", "zygote_probe", "sleep", "--address", address]
    child.kill()
    assert child.wait(60) == -signal.SIGKILL
    assert zygote.argv_of(child.pid) == []


def test_torch_threads_follow_the_childs_omp_num_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch read OMP_NUM_THREADS (2) when the zygote imported it; the child asks for 1, and the
    processes SGLang forks from it run with 1 (the launcher itself runs torch on one thread:
    `fork_start.use_fork`)."""
    for sock, _ in _zygote(tmp_path, monkeypatch, "torch"):
        log = tmp_path / "child.log"
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        assert zygote.fork(sock, ["0"], env, log).wait(120) == 0
        assert _report(log)["threads"] == 1


def test_unreachable_zygote_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(zygote.ZygoteError, match="zygote at"):
        zygote.fork(str(tmp_path / "none.sock"), [], {}, tmp_path / "x.log")


def test_run_returns_the_status_and_output_of_the_module_it_names(
    plain: tuple, tmp_path: Path
) -> None:
    """`zygote.run` runs the module the request names (not only the zygote's own) to its end;
    `testing.processes.run_module` uses it for launchers a test runs to their end."""
    sock, _ = plain
    other = "import sys\nprint('other', sys.argv[1:])\nsys.exit(4)\n"
    (tmp_path / "other_probe.py").write_text(other)
    assert zygote.run(sock, "other_probe", ["x"], dict(os.environ), 60) == (4, "other ['x']\n")
    code, output = zygote.run(sock, "zygote_probe", ["5"], dict(os.environ), 60)
    assert code == 5 and json.loads(output)["argv"] == ["5"]
    with pytest.raises(subprocess.TimeoutExpired):
        zygote.run(sock, "zygote_probe", ["sleep"], dict(os.environ), 1)


def test_run_interleaves_output_by_line_when_the_caller_asks_unbuffered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The zygote's interpreter started buffered; a request whose environment sets
    PYTHONUNBUFFERED gets its stdout lines before a later traceback, as an exec'd `python`
    would (a test reads a refused start's last line)."""
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    for sock, _ in _zygote(tmp_path, monkeypatch, "json"):
        (tmp_path / "noisy.py").write_text("print('first')\nraise SystemExit('last')\n")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        code, output = zygote.run(sock, "noisy", [], env, 60)
        assert code == 1 and output.splitlines() == ["first", "last"], output


def test_a_zygote_whose_parent_exits_goes_too(tmp_path: Path) -> None:
    """A zygote started by a process that exits at once (a shell's `cmd &`) does not stay
    behind, orphaned."""
    start = (
        "import os, subprocess, sys; "
        "p = subprocess.Popen([sys.executable, '-m', 'sglang_ssd.launch.zygote_process', "
        f"'--socket', {str(tmp_path / 'z.sock')!r}, '--preload', 'json', "
        "'--parent-pid', str(os.getpid())], "
        "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid)"
    )
    done = subprocess.run([sys.executable, "-c", start], capture_output=True, text=True, timeout=60)
    pid = int(done.stdout)
    deadline = time.monotonic() + 30
    while zygote._running(pid):
        assert time.monotonic() < deadline, "the orphaned zygote is still running"
        time.sleep(0.2)
