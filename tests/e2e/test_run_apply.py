"""Issue #18 items 3 and 7 acceptance: a job whose report carries an allocator-settings recommendation (computed by
simulation from a real Kineto memory trace, uploaded to it), then `fleetprof run --apply` of it: the setting reaches
the child's environment, the batch size reaches its argv through `--batch-size-arg`, and GET /jobs/compare shows the
applied recommendation with its predicted saving. A tiny CPU script, no hooks: cheap."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from fleetprof.client import Client
from tests.e2e.conftest import FLEETPROF, client_env

MEMORY_TRACE = Path(__file__).parents[1] / "data/kineto/hta/df_index_resolver/df_index_resolver.json.gz"
SCRIPT = "import os, sys; print('ALLOC', os.environ.get('PYTORCH_CUDA_ALLOC_CONF')); print('ARGV', sys.argv[1:])"


def _run(env: dict[str, str], job_id: str, *flags: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*FLEETPROF, "run", "--job-id", job_id, "--name", "e2e-apply", "--no-hooks", *flags, "--",
                           sys.executable, "-c", SCRIPT, "--batch-size", "8"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_apply_sets_the_allocator_setting_and_compare_shows_it(live_server: str, cli_env, make_token) -> None:
    token = make_token("team", team="e2e-apply")
    headers = {"Authorization": f"Bearer {token}"}
    env = client_env(cli_env, live_server, token)
    first = _run(env, "apply-before")
    assert "ALLOC None" in first.stdout
    r = httpx.post(f"{live_server}/api/v1/jobs/apply-before/traces", content=MEMORY_TRACE.read_bytes(),
                   params={"filename": MEMORY_TRACE.name}, headers={**headers, "Content-Type": "application/gzip"},
                   timeout=120)
    assert r.status_code == 200, r.text
    report = httpx.get(f"{live_server}/api/v1/jobs/apply-before/report", headers=headers, timeout=120).json()
    [rec] = [r for r in report["recommendations"] if r["kind"] == "allocator_settings"]
    setting = rec["evidence"]["env"]

    second = _run(env, "apply-after", "--apply", "apply-before", "--batch-size-arg=--batch-size")
    assert f"ALLOC {setting.partition('=')[2]}" in second.stdout  # the env reached the child
    assert f"applied allocator_settings from apply-before: {setting}" in second.stderr
    assert "ARGV ['--batch-size', '8']" in second.stdout  # no batch recommendation: argv untouched

    job = httpx.get(f"{live_server}/api/v1/jobs/apply-after", headers=headers, timeout=60).json()
    [recorded] = job["metadata"]["applied"]
    assert recorded["kind"] == "allocator_settings" and recorded["from_job"] == "apply-before"
    assert recorded["predicted_saving"] == rec["saving"]

    r = httpx.get(f"{live_server}/api/v1/jobs/compare", params={"ids": "apply-before,apply-after"}, headers=headers,
                  timeout=120)
    assert r.status_code == 200, r.text
    before, after = r.json()["jobs"]
    assert before["applied"] == []
    [applied] = after["applied"]
    assert applied["kind"] == "allocator_settings" and applied["setting"] == setting
    assert applied["predicted_saving"]["reserved_bytes"] == rec["saving"]["reserved_bytes"] > 0
    [realized] = applied["realized"]
    assert realized["figure"] == "peak_reserved_bytes" and realized["unit"] == "bytes"
    assert realized["before"] == report["memory"]["peak_reserved_bytes"]
    # the second run recorded no memory trace (a CPU run without hooks): unknown, not zero
    assert realized["after"] is None and realized["saving"] is None

    # the typed client (the dashboard's compare view reads it) agrees
    with Client(live_server, token) as c:
        typed = c.compare(["apply-before", "apply-after"])
    assert typed.jobs[1].applied[0].setting == setting and typed.jobs[1].applied[0].realized[0].saving is None

    # REF that is no job: the right-sizing of the recurring job of that name (its latest run)
    by_name = _run(env, "apply-by-name", "--apply", "e2e-apply")
    assert "from apply-after" in by_name.stderr, by_name.stderr

    missing = subprocess.run([*FLEETPROF, "run", "--apply", "no-such-job-or-name", "--", sys.executable, "-c", ""],
                             env=env, capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and "--apply no-such-job-or-name" in missing.stderr
