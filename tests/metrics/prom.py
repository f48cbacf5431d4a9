"""A real Prometheus server (Debian package `prometheus`) for the tests: started on a free port with a given scrape
configuration, queried through its HTTP API."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.conftest import free_port, wait_http


def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    assert found, ("the Prometheus server is not installed: `apt-get install -y prometheus` (the Makefile's `test` "
                   "target does it); this test scrapes fleetprof with the real thing")
    return found


def query(prom: str, expr: str) -> list[dict]:
    """The instant query's result; a query Prometheus cannot parse raises (400)."""
    r = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=5)
    assert r.status_code == 200, f"{expr!r}: {r.status_code} {r.text}"
    body = r.json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def wait_query(prom: str, expr: str, ok: Callable[[list[dict]], bool], timeout_s: float = 40.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    result: list[dict] = []
    while time.monotonic() < deadline:
        result = query(prom, expr)
        if result and ok(result):
            return result
        time.sleep(0.5)
    raise AssertionError(f"Prometheus never answered {expr!r} as expected; last answer: {result}")


@contextmanager
def prometheus(config: str, tmp_path: Path) -> Iterator[str]:
    """Prometheus scraping with `config` (YAML text); yields its base URL once it is ready."""
    binary = prometheus_binary()
    path = tmp_path / "prometheus.yml"
    path.write_text(config)
    port = free_port()
    with open(tmp_path / "prometheus.log", "w") as log:
        proc = subprocess.Popen([binary, f"--config.file={path}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_http(url + "/-/ready", timeout_s=60)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
