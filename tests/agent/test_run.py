"""`fleetprof run`: exit codes, job registration and state, signals, OOM detection, no server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agent.run import generate_job_id, gpus_from_cuda_visible_devices, outcome
from tests.agent.collector import Collector


def fleetprof_run(repo_root: Path, args: list[str], *, server: str | None, **popen: object) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETPROF_")}
    env.update(PYTHONPATH=str(repo_root), CUDA_VISIBLE_DEVICES="GPU-aaaa,GPU-bbbb")
    if server:
        env.update(FLEETPROF_SERVER_URL=server, FLEETPROF_TOKEN="team-token")
    return subprocess.Popen([sys.executable, "-m", "fleetprof.cli", "run", *args], cwd=repo_root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)  # type: ignore[call-overload]


def test_exit_code_is_the_childs_and_the_job_is_marked_failed(repo_root: Path, collector: Collector) -> None:
    p = fleetprof_run(repo_root, ["--job-id", "j-3", "--team", "vision", "--", sys.executable, "-c",
                                  "import os, sys; print(os.environ['FLEETPROF_JOB_ID']); sys.exit(3)"],
                      server=collector.url)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 3, err
    assert out.strip() == "j-3"
    start, end = collector.jobs
    assert start["job_id"] == end["job_id"] == "j-3" and start["team"] == "vision"
    assert start["state"] == "running" and start["gpu_uuids"] == ["GPU-aaaa", "GPU-bbbb"]
    assert start["cuda_visible_devices"] == "GPU-aaaa,GPU-bbbb" and start["host"] and start["user"]
    assert "sys.exit(3)" in start["command"]
    assert end["state"] == "failed" and end["exit_code"] == 3 and end["ended_at"] >= start["started_at"]


def test_server_unreachable_still_runs_and_exits_3(repo_root: Path) -> None:
    p = fleetprof_run(repo_root, ["--", sys.executable, "-c", "import sys; sys.exit(3)"],
                      server="http://127.0.0.1:9")
    _, err = p.communicate(timeout=30)
    assert p.returncode == 3
    assert "cannot reach the server" in err and "job id" in err


def test_oom_text_on_stderr_is_teed_and_marks_oom(repo_root: Path, collector: Collector) -> None:
    code = ("import sys; sys.stderr.write('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\\n');"
            " sys.exit(1)")
    p = fleetprof_run(repo_root, ["--no-hooks", "--", sys.executable, "-c", code], server=collector.url)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 1
    assert "CUDA out of memory. Tried to allocate 2.00 GiB" in err  # teed through, not swallowed
    assert collector.jobs[-1]["state"] == "oom"


def test_sigterm_is_forwarded_and_reported_like_a_shell(repo_root: Path, collector: Collector) -> None:
    code = "import time; print('ready', flush=True); time.sleep(30)"
    p = fleetprof_run(repo_root, ["--job-id", "j-term", "--", sys.executable, "-c", code], server=collector.url)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=20)
    assert p.returncode == 128 + signal.SIGTERM and time.monotonic() - t0 < 10
    assert collector.jobs[-1]["state"] == "killed" and collector.jobs[-1]["exit_code"] == 143


def test_helpers() -> None:
    assert outcome(0, False).state == "finished"
    assert outcome(-9, False) == outcome(-9, False) and outcome(-9, False).exit_code == 137
    assert outcome(1, True).state == "oom" and outcome(2, False).state == "failed"
    assert gpus_from_cuda_visible_devices("0,1") is None and gpus_from_cuda_visible_devices(None) is None
    jid = generate_job_id("al ice", now=1_784_016_758.0)
    assert jid.startswith("al_ice-20260714-") and len(jid.rsplit("-", 1)[1]) == 4


def test_framework_oom_messages_are_recognised() -> None:
    """The messages an out-of-memory ends a job with, as each framework prints them (TensorFlow's and XLA's too)."""
    from agent.run import OOM_RE

    for msg in (b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB",
                b"tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with "
                b"shape[8192,8192] and type float on /job:localhost/replica:0/task:0/device:GPU:0",
                b"jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate"):
        assert OOM_RE.search(msg), msg
    assert not OOM_RE.search(b"ResourceExhaustedError: rate limited")
