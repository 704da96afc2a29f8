"""`harness serve` on a port it cannot listen on (taken, or a host that is no address of this machine) is a
service that cannot start: exit 2 and one line saying why, in one process or several, never uvicorn's own
exit code 3 (which stays the code of a service process that could not start, for its supervisor)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

#: `harness ARGS` with the check before the start left out: the port taken between the check and the bind
UNCHECKED = textwrap.dedent("""
    import sys
    import harness.cli.serve
    harness.cli.serve.can_listen = lambda host, port: None
    sys.argv = ["harness", *sys.argv[1:]]
    from harness.cli import main
    main()
""")


@pytest.fixture
def taken() -> Iterator[int]:
    """A port on 127.0.0.1 another socket listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def serve(tmp_path: Path, *args: str, script: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """`harness serve ARGS` on a database in `tmp_path`, in a process of its own, to its end."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    argv = [sys.executable, *(script or ["-m", "harness.cli"]), "serve", "--db", str(tmp_path / "h.db"), *args]
    return subprocess.run(argv, env={**env, "HARNESS_DATA_DIR": str(tmp_path / "data")}, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_port_in_use_is_one_line_and_exit_2(tmp_path: Path, taken: int, processes: str) -> None:
    """The port is checked before the service is built: one line naming it, exit 2, nothing started."""
    done = serve(tmp_path, "--port", str(taken), "--processes", processes)
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"error: cannot listen on 127.0.0.1:{taken}: Address already in use" in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "harness service on" not in done.stderr, done.stderr[-3000:]


def test_a_host_that_is_no_address_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """A host that does not resolve is refused like a port in use."""
    done = serve(tmp_path, "--host", "999.1.1.1")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "error: cannot listen on 999.1.1.1:8000: " in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_port_taken_after_the_check_is_exit_2(tmp_path: Path, taken: int, processes: str) -> None:
    """When uvicorn's own bind fails (the port taken since the check) the command still ends with exit 2, the
    reason in uvicorn's log line above its own."""
    done = serve(tmp_path, "--port", str(taken), "--processes", processes, script=["-c", UNCHECKED])
    assert done.returncode == 2, done.stderr[-3000:]
    assert "address already in use" in done.stderr.lower() and "the service could not start" in done.stderr, \
        done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
