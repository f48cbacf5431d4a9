"""The estimate sandbox, tried from inside by a registered factory (tests.estimate.factories:sandbox_probe) through
the real entry point (`run_estimate`: a fresh interpreter, limits, Landlock, the audit hook), and Landlock alone."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from server.estimate import landlock, run_estimate
from server.estimate.errors import AbsurdRequestError, EstimateTimeoutError, ModelBuildError, UnknownModelError
from server.estimate.sandbox import SandboxLimits
from tests.estimate.registered import REGISTERED

PROBE = "tests.estimate.factories:sandbox_probe"
LIMITS = SandboxLimits(cpu_s=60, memory_bytes=3 * 2**30)


def _probe(check: str, limits: SandboxLimits = LIMITS, timeout_s: float = 120, **kwargs: object) -> str:
    """The probe's findings (the message of the error it raises on purpose)."""
    request = {"model": {"factory": PROBE, "kwargs": {"check": check, **kwargs}}, "inputs": [{"shape": [64]}],
               "batch_size": 4, "gpu_types": ["T4"], "search_max_batch": False}
    with pytest.raises(ModelBuildError, match="PROBE") as caught:
        run_estimate(request, timeout_s=timeout_s, registered=REGISTERED, limits=limits)
    return str(caught.value)


def test_no_credentials_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = {"FLEETPROF_DATABASE_URL": "postgresql+psycopg2://fleetprof:hunter2@db:5432/fleetprof",
               "FLEETPROF_BROKER_URL": "redis://:hunter2@redis:6379/0", "FLEETPROF_TOKEN": "fp_hunter2",
               "PGPASSWORD": "hunter2", "AWS_SECRET_ACCESS_KEY": "hunter2"}
    for key, value in secrets.items():
        monkeypatch.setenv(key, value)
    found = _probe("env")
    assert "hunter2" not in found and "FLEETPROF_" not in found and "DATABASE" not in found
    cwd = found.split("cwd=")[1].strip().strip("'")
    assert f"'HOME': '{cwd}'" in found and f"'TMPDIR': '{cwd}'" in found  # its scratch directory
    assert "fleetprof-estimate-" in cwd and not Path(cwd).exists()  # removed after the estimate


def test_writes_only_in_its_scratch_directory(tmp_path: Path) -> None:
    marker = tmp_path / "written-by-an-estimate"
    assert "outside=refused" in (found := _probe("write", path=str(marker))) and "inside=written" in found
    assert not marker.exists()


def test_starts_no_process(tmp_path: Path) -> None:
    marker = tmp_path / "spawned"
    found = _probe("spawn", path=str(marker))
    assert found.count("refused") == 3, found  # subprocess.run, os.system, os.fork
    assert not marker.exists()


@pytest.mark.skipif(not Path("/lib/x86_64-linux-gnu/libc.so.6").exists(), reason="probe copies glibc's x86_64 path")
def test_loads_no_library_of_its_own() -> None:
    """Installed libraries load (torch.distributed opens libc at import); one written to scratch does not."""
    assert "installed=loaded own=refused" in _probe("dlopen")


def test_hugging_face_model_builds_in_the_sandbox() -> None:
    """transformers' model code under the lock-down (its lazy imports load torch.distributed, which opens libc)."""
    gpt2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 512}
    result = run_estimate({"model": {"hf_config": gpt2}, "seq_len": 32, "batch_size": 2, "gpu_types": ["T4"],
                           "search_max_batch": False}, timeout_s=240, limits=LIMITS)
    assert result["model_name"] == "hf:gpt2/causal_lm" and result["gpus"][0]["fits"]


def test_opens_no_tcp_connection(pg_url: str) -> None:
    """Not even to the database the server uses (a trust-auth Postgres on 127.0.0.1 here)."""
    assert "tcp=refused" in _probe("tcp", port=5432)


@pytest.mark.slow
def test_killed_past_its_cpu_time() -> None:
    started = time.monotonic()
    with pytest.raises(EstimateTimeoutError, match=r"CPU time limit \(10 s\)"):
        run_estimate({"model": {"factory": PROBE, "kwargs": {"check": "cpu"}}, "inputs": [{"shape": [64]}],
                      "batch_size": 4}, timeout_s=300, registered=REGISTERED,
                     limits=SandboxLimits(cpu_s=10, memory_bytes=3 * 2**30))
    assert time.monotonic() - started < 280  # stopped by the CPU limit, not the wall clock


def test_stopped_past_its_memory() -> None:
    """A 6 GiB buffer under a 3 GiB address-space limit (the host has the memory: without the limit it succeeds)."""
    with pytest.raises(AbsurdRequestError, match=r"out of memory \(limit 3 GiB"):
        run_estimate({"model": {"factory": PROBE, "kwargs": {"check": "memory"}}, "inputs": [{"shape": [64]}],
                      "batch_size": 4}, timeout_s=120, registered=REGISTERED, limits=LIMITS)


@pytest.mark.parametrize("factory", ["os:system", "subprocess:getoutput", "builtins:eval",
                                     "tests.estimate.factories:mlp"],
                         ids=["os", "subprocess", "builtins", "unregistered"])
def test_unregistered_factory_starts_no_worker(factory: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_worker(*_: object, **__: object) -> None:
        raise AssertionError("a worker was started for an unregistered factory")

    monkeypatch.setattr("server.estimate.runner._run_child", no_worker)
    with pytest.raises(UnknownModelError, match="not registered"):
        run_estimate({"model": {"factory": factory, "kwargs": {"cmd": "true"}}, "inputs": [{"shape": [64]}],
                      "batch_size": 1})


@pytest.mark.skipif(landlock.abi_version() < 1, reason="this kernel has no Landlock")
def test_landlock_alone(tmp_path: Path, pg_url: str) -> None:
    """Landlock without the audit hook: the kernel itself refuses writes outside, exec and TCP."""
    scratch, outside = tmp_path / "scratch", tmp_path / "outside"
    scratch.mkdir()
    code = textwrap.dedent(f"""
        import json, os, socket, sys
        from server.estimate import landlock
        landlock.restrict([{str(scratch)!r}])
        def attempt(fn):
            try:
                fn()
                return "done"
            except OSError as exc:
                return type(exc).__name__
        def write(path):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT)
            os.close(fd)
        print(json.dumps({{
            "inside": attempt(lambda: write({str(scratch / "f")!r})),
            "outside": attempt(lambda: write({str(outside)!r})),
            "exec": attempt(lambda: os.execv("/bin/true", ["true"])),
            "tcp": attempt(lambda: socket.create_connection(("127.0.0.1", 5432), timeout=5)),
        }}))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout)
    assert found["inside"] == "done" and found["outside"] == "PermissionError" and not outside.exists()
    assert found["exec"] == "PermissionError"
    if landlock.abi_version() >= 4:
        assert found["tcp"] == "PermissionError"


def test_audit_hook_alone_refuses_writes_outside(tmp_path: Path) -> None:
    """Where the kernel has no Landlock, the audit hook is what refuses writes outside the scratch directory."""
    scratch, outside = tmp_path / "scratch", tmp_path / "outside"
    scratch.mkdir()
    code = textwrap.dedent(f"""
        import json, os, shutil, sys
        from server.estimate.sandbox import _Guard
        sys.addaudithook(_Guard({str(scratch)!r}))
        def attempt(fn):
            try:
                fn()
                return "done"
            except OSError as exc:
                return type(exc).__name__
        inside, outside = {str(scratch / "f")!r}, {str(outside)!r}
        print(json.dumps([attempt(lambda: open(inside, "w").close()), attempt(lambda: open(outside, "w").close()),
                          attempt(lambda: os.close(os.open(outside, os.O_WRONLY | os.O_CREAT))),
                          attempt(lambda: os.mkdir(outside)), attempt(lambda: shutil.copyfile(inside, outside)),
                          attempt(lambda: os.rename(inside, outside)), attempt(lambda: open(inside).close())]))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == ["done", *["PermissionError"] * 5, "done"]
    assert not outside.exists()
