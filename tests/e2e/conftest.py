"""Fixtures of the end-to-end tests: real `fleetprof` processes against this test session's real Postgres.

- `restartable_server`: a `fleetprof server` that a test can stop and start again on the same port (the
  collector outage of the agent acceptance test);
- `h100_recording`: a fleetprof JSONL recording (the agent's own format) of 2 GPUs x 150 timesteps built from
  the real H100 nvidia-smi capture (see `build_h100_recording`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port, wait_http

H100_CAPTURE = "nvidia-smi/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
FLEETPROF = [sys.executable, "-m", "fleetprof.cli"]


class RestartableServer:
    """A real `fleetprof server` subprocess on a fixed free port; `stop()` and `start()` may alternate."""

    def __init__(self, env: dict[str, str], log_path: Path):
        self.env = env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        assert self.proc is None, "already running"
        log = open(self.log_path, "a")
        log.write(f"---- start {self.starts + 1} at {time.time():.3f}\n")
        log.flush()
        self.proc = subprocess.Popen([*FLEETPROF, "server", "--port", str(self.port)], env=self.env, stdout=log,
                                     stderr=subprocess.STDOUT)
        log.close()
        self.starts += 1
        wait_http(self.url + "/healthz", timeout_s=60)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None
        # really down: a request now is refused, not answered by a dying process
        with pytest.raises(httpx.HTTPError):
            httpx.get(self.url + "/healthz", timeout=1)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def restartable_server(cli_env: dict[str, str], tmp_path: Path) -> Iterator[RestartableServer]:
    server = RestartableServer(cli_env, tmp_path / "server.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def client_env(cli_env: dict[str, str], url: str, token: str, **extra: str) -> dict[str, str]:
    """Environment of a client command (`run`, `replay`, `agent`) pointed at a live server."""
    return {**cli_env, "FLEETPROF_SERVER_URL": url, "FLEETPROF_TOKEN": token, **extra}


# ------------------------------------------------------------------------------------------ the recording


def build_h100_recording(capture: Path, out: Path, *, steps: int = 150, end_ts: float | None = None,
                         steps_per_line: int = 10) -> Path:
    """A fleetprof JSONL recording of a 2-GPU node, made of the real H100 capture's rows.

    The capture holds one idle row (0 MiB, 0 %, 69.85 W) and one loaded row (gpu_burn + 2 memhogs: 19818 MiB,
    100 %, 631.95 W) of one H100, and three compute-app rows. The recording repeats those two rows, with their
    recorded values untouched, at shifted timestamps 1 s apart, in two different idle/load patterns (GPU 1 is
    the same H100's rows under a second UUID and PCI id), ending `end_ts` (default: 5 minutes ago). Loaded
    timesteps carry the capture's compute-app rows (unattributed, as the agent would ship them). Nothing here is
    made up but the timestamps and the second GPU's identity.
    """
    from fleetprof.recordings import ProcessRow, SampleRow, dump_batch_line, iter_timesteps, make_batch, read_recording

    cap = read_recording(capture)
    assert len(cap.gpus) == 1 and len(cap.rows) == 2, "expected the H100 capture's idle row and loaded row"
    idle, load = sorted(cap.rows, key=lambda r: r.values["power_w"])
    g0 = cap.gpus[0]
    g1 = g0.model_copy(update={"uuid": g0.uuid[:-4] + "beef", "index": 1, "pci_bus_id": "00000000:1B:00.0"})
    end_ts = time.time() - 300 if end_ts is None else end_ts
    start_ts = round(end_ts - (steps - 1), 3)
    patterns = [
        lambda i: (i // 25) % 3 != 0,  # GPU 0: 25 s idle, 50 s loaded, ...
        lambda i: (i // 15) % 2 == 1,  # GPU 1: 15 s idle, 15 s loaded, ...
    ]
    rows: list[SampleRow] = []
    procs: list[ProcessRow] = []
    for i in range(steps):
        ts = round(start_ts + i, 3)
        for gpu, loaded in zip((g0, g1), patterns):
            src = load if loaded(i) else idle
            rows.append(SampleRow(ts, gpu.uuid, dict(src.values)))
            if loaded(i):
                procs += [ProcessRow(ts, gpu.uuid, p.pid, p.used_memory_bytes) for p in cap.processes]
    cap.gpus, cap.rows, cap.processes, cap.source = [g0, g1], rows, procs, "fleetprof"
    lines = []
    groups = list(iter_timesteps(cap))
    for seq, k in enumerate(range(0, len(groups), steps_per_line), start=1):
        chunk = [r for g in groups[k:k + steps_per_line] for r in g]
        lo, hi = chunk[0].ts, chunk[-1].ts
        batch = make_batch(chunk, rec=cap, node="h100-capture", agent_id="h100-capture-recording", seq=seq,
                           sent_at=hi, processes=[p for p in procs if lo <= p.ts <= hi])
        lines.append(dump_batch_line(batch))
    out.write_text("\n".join(lines) + "\n")
    return out


@pytest.fixture
def h100_recording(real_data: Path, tmp_path: Path) -> Path:
    return build_h100_recording(real_data / H100_CAPTURE, tmp_path / "h100-2gpu.jsonl")


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> int:
    """Signal a child we started and wait for it; kill it if it does not stop. Returns its exit status."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
            raise
    return proc.returncode


def pids_alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:
            pass
        try:  # a zombie is gone for our purposes (its parent reaps it)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        alive.append(pid)
    return alive
