"""`tests/prestart.py`, the background start of the session's shared servers, on stand-in
launchers: a plain HTTP server whose /health answers 200 (a server that starts), `/bin/false`
(one that dies during its start-up)."""

from __future__ import annotations

import sys
from pathlib import Path

import prestart
import pytest

from eval.servers import Server, ServerError, port_is_free


def _http_launcher(folder: Path) -> Path:
    (folder / "health").write_text("ok")
    launcher = folder / "launcher.sh"
    launcher.write_text(
        "#!/bin/bash\n"
        f'cd {folder} && exec {sys.executable} -m http.server --bind 127.0.0.1 "${{@: -1}}"\n'
    )
    launcher.chmod(0o755)
    return launcher


def test_a_prestart_is_taken_running_and_stopped_after(tmp_path: Path) -> None:
    made = {"a": Server("a", [], python=str(_http_launcher(tmp_path)), log_path=tmp_path / "a")}
    prestart.begin("ok", lambda: made)
    assert prestart.prestarted(made["a"])
    with pytest.raises(ValueError, match="already"):
        prestart.begin("ok", lambda: made)
    with prestart.taken("ok", lambda: pytest.fail("started again")) as running:
        assert running is made and made["a"].proc is not None and made["a"].proc.poll() is None
        port = made["a"].port
    assert made["a"].proc is None and port_is_free(port)
    # Taken once: a second `taken` starts its own servers.
    fresh = {"b": Server("b", [], python=str(_http_launcher(tmp_path)), log_path=tmp_path / "b")}
    with prestart.taken("ok", lambda: fresh) as running:
        assert running is fresh and not prestart.prestarted(fresh["b"])
    assert fresh["b"].proc is None


def test_a_failed_prestart_raises_where_it_is_taken(tmp_path: Path) -> None:
    bad = {"bad": Server("bad", [], python="/bin/false", log_path=tmp_path / "bad.log")}
    prestart.begin("bad", lambda: bad)
    with (
        pytest.raises(ServerError, match="exited with status"),
        prestart.taken("bad", lambda: pytest.fail("started again")),
    ):
        pass
    assert bad["bad"].proc is None


def test_a_prestart_nobody_took_is_stopped(tmp_path: Path) -> None:
    # What `close_all` does at the session's end to each (not called here: the session's own
    # prestarts may still be pending).
    made = {"c": Server("c", [], python=str(_http_launcher(tmp_path)), log_path=tmp_path / "c")}
    pending = prestart.Prestart("left", lambda: made)
    pending.close()
    assert made["c"].proc is None and made["c"].info["stopped_at"]
