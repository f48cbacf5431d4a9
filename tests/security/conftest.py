"""Real `fleetprof server` processes with settings of the test's choosing (rate limits, log level)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import free_port, wait_http


@contextmanager
def server_process(env: dict[str, str], log_path: Path, *args: str) -> Iterator[str]:
    """`fleetprof server` on a free port with `env` (cli_env plus overrides); yields its base URL. The log (stdout
    and stderr) is in `log_path`."""
    port = free_port()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "fleetprof.cli", "server", "--port", str(port), *args],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_http(url + "/healthz")
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
