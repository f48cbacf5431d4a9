"""Job attribution from a fake /proc tree and from real child processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.attribution import ENV_JOB, ENV_SLURM, K8S_POD, UNATTRIBUTED, Attribution, Attributor

POD_UID = "0d2a8c5e-1f3b-4c6d-9e8f-a1b2c3d4e5f6"


def make_proc(root: Path, pid: int, *, env: dict[str, str] | None = None, ppid: int = 1, start: int = 1000,
              cgroup: str = "0::/user.slice/session-1.scope\n") -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in (env or {}).items()))
    # comm with a space and a parenthesis, as real ones can have
    rest = " ".join(["S", str(ppid)] + ["0"] * 17 + [str(start)] + ["0"] * 5)
    (d / "stat").write_text(f"{pid} (python (x) 3) {rest}\n")
    (d / "status").write_text(f"Name:\tpython\nState:\tS\nPPid:\t{ppid}\n")
    (d / "cgroup").write_text(cgroup)


def test_fake_proc_tree_in_priority_order(tmp_path: Path) -> None:
    make_proc(tmp_path, 10, env={"PATH": "/bin", "FLEETPROF_JOB_ID": "alice-1", "SLURM_JOB_ID": "77"})
    make_proc(tmp_path, 11, env={"SLURM_JOB_ID": "77"})
    make_proc(tmp_path, 12, cgroup="0::/kubepods.slice/kubepods-burstable.slice/"
              f"kubepods-burstable-pod{POD_UID.replace('-', '_')}.slice/cri-containerd-abc.scope\n")
    make_proc(tmp_path, 13, cgroup=f"12:memory:/kubepods/burstable/pod{POD_UID}/0123456789abcdef\n")
    make_proc(tmp_path, 14)
    make_proc(tmp_path, 15, env={"FLEETPROF_JOB_ID": "bad id with spaces"})
    a = Attributor(tmp_path, pod_resources_socket=tmp_path / "no.sock")
    assert a.attribute(10) == Attribution("alice-1", ENV_JOB)
    assert a.attribute(11) == Attribution("slurm:77", ENV_SLURM)
    assert a.attribute(12) == Attribution(f"k8s:pod-{POD_UID}", K8S_POD)
    assert a.attribute(13) == Attribution(f"k8s:pod-{POD_UID}", K8S_POD)
    assert a.attribute(14) == UNATTRIBUTED
    assert a.attribute(15) == UNATTRIBUTED
    assert a.attribute(99) == UNATTRIBUTED  # gone


def test_parent_environment_and_pid_reuse(tmp_path: Path) -> None:
    make_proc(tmp_path, 20, env={"FLEETPROF_JOB_ID": "launcher-job"})
    make_proc(tmp_path, 21, ppid=20)  # a worker whose environment was scrubbed
    a = Attributor(tmp_path)
    assert a.attribute(21) == Attribution("launcher-job", ENV_JOB)
    # pid 21 exits and the pid is reused by an unrelated process: the start time differs, not the cache
    make_proc(tmp_path, 21, ppid=1, start=5000)
    assert a.attribute(21) == UNATTRIBUTED
    a.forget_except(set())
    assert not a._cache


def test_unreadable_environ_falls_back_to_cgroup(tmp_path: Path) -> None:
    make_proc(tmp_path, 30, cgroup=f"0::/kubepods/besteffort/pod{POD_UID}/c1\n")
    (tmp_path / "30" / "environ").unlink()
    (tmp_path / "30" / "environ").mkdir()  # reading it fails like EACCES would
    assert Attributor(tmp_path).attribute(30).method == K8S_POD


def test_real_child_processes_by_their_environment() -> None:
    code = "import sys; print('ready', flush=True); sys.stdin.read()"
    env = {k: v for k, v in os.environ.items() if k not in ("FLEETPROF_JOB_ID", "SLURM_JOB_ID")}
    children = [
        subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         env={**env, **extra})
        for extra in ({"FLEETPROF_JOB_ID": "real-job-1"}, {"SLURM_JOB_ID": "4242"}, {})
    ]
    try:
        for c in children:  # exec'd: until then /proc shows the environment of the forked parent
            assert c.stdout is not None and c.stdout.readline() == b"ready\n"
        a = Attributor()  # the real /proc
        got = [a.attribute(c.pid) for c in children]
    finally:
        for c in children:
            c.communicate(b"")
    assert got[0] == Attribution("real-job-1", ENV_JOB)
    assert got[1] == Attribution("slurm:4242", ENV_SLURM)
    assert got[2].method in (None, K8S_POD)  # unattributed (or this test itself runs in a pod)


def test_a_live_process_is_checked_by_its_pidfd_and_an_exited_one_looked_up_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With the real /proc, a cached process is checked with one poll of its pidfd: no /proc read while it runs;
    once it has exited its entry (and pidfd) goes, and the pid is looked up afresh."""
    code = "import sys; print('ready', flush=True); sys.stdin.read()"
    env = {k: v for k, v in os.environ.items() if k not in ("FLEETPROF_JOB_ID", "SLURM_JOB_ID")}
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env={**env, "FLEETPROF_JOB_ID": "pidfd-job"})
    a = Attributor()
    reads: list[str] = []
    real_read = a._read

    def counted(pid: int, name: str) -> bytes | None:
        reads.append(name)
        return real_read(pid, name)

    a._read = counted  # type: ignore[method-assign]
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        assert a.attribute(child.pid) == Attribution("pidfd-job", ENV_JOB)
        assert child.pid in a._pidfds and reads
        reads.clear()
        for _ in range(5):
            assert a.attribute(child.pid) == Attribution("pidfd-job", ENV_JOB)
        assert reads == []  # the pidfd said it still runs
    finally:
        child.communicate(b"")
    fd = a._pidfds[child.pid]
    closed: list[int] = []
    real_close = os.close

    def recorded_close(n: int) -> None:
        closed.append(n)
        real_close(n)

    monkeypatch.setattr(os, "close", recorded_close)
    assert a.attribute(child.pid) == UNATTRIBUTED  # exited and reaped: nothing to read any more
    assert child.pid not in a._pidfds and child.pid not in a._cache
    assert fd in closed  # the pidfd of the exited process was released


def test_another_proc_root_compares_start_times(tmp_path: Path) -> None:
    make_proc(tmp_path, 40, env={"FLEETPROF_JOB_ID": "j40"})
    a = Attributor(tmp_path)  # not this namespace's /proc: its pids are not ours to open
    assert a.attribute(40) == Attribution("j40", ENV_JOB) and not a._pidfds
