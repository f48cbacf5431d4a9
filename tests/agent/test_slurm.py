"""agent.slurm's rules: the exit state from Slurm's variables, GPU indices to UUIDs, the job id, and where the epilog
may write (the end-to-end path through deploy/slurm/ is tests/deploy/test_slurm.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.config import load_settings
from agent.run import default_job_id
from agent.slurm import SlurmEnvError, SlurmJob, append_to_job_output, exit_state, resolve_gpu_uuids


@pytest.mark.parametrize(("code2", "raw", "expected"), [
    ("0:0", "0", ("finished", 0, "0:0")),
    ("1:0", "256", ("failed", 1, "1:0")),
    ("0:9", "9", ("killed", 137, "0:9")),      # scancel / time limit: SIGKILL
    ("0:15", "15", ("killed", 143, "0:15")),
    (None, "512", ("failed", 2, "2:0")),      # only the raw wait(2) status
    (None, "6", ("killed", 134, "0:6")),
    ("garbage", None, ("lost", None, None)),  # nothing usable: how it ended is unknown, not 0
    (None, None, ("lost", None, None)),
])
def test_exit_state(code2: str | None, raw: str | None, expected: tuple) -> None:
    s = exit_state(code2, raw)
    assert (s.state, s.exit_code, s.slurm_exit) == expected


def test_job_from_a_prolog_environment() -> None:
    job = SlurmJob.from_environ({"SLURM_JOB_ID": "123", "SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "9",
                                 "SLURM_JOB_ACCOUNT": "vision", "SLURM_JOB_DERIVED_EC": "256"}, epilog=False)
    assert job.job_id == "slurm:123" and job.gpus == ("2", "3") and job.account == "vision" and job.exit is None
    assert job.derived_exit == "1:0"
    with pytest.raises(SlurmEnvError):
        SlurmJob.from_environ({"SLURM_JOB_ID": "12 3; rm"}, epilog=True)
    with pytest.raises(SlurmEnvError):
        SlurmJob.from_environ({}, epilog=True)


def test_gpu_indices_resolve_to_uuids_or_not_at_all() -> None:
    nodes = {0: "GPU-a", 1: "GPU-b"}
    assert resolve_gpu_uuids(("1", "0"), nodes) == ["GPU-b", "GPU-a"]
    assert resolve_gpu_uuids(("GPU-x",), nodes) == ["GPU-x"]
    assert resolve_gpu_uuids(("0", "7"), nodes) is None  # a wrong GPU would claim another job's telemetry


def test_fleetprof_run_takes_the_slurm_job_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert default_job_id(load_settings()) == "slurm:4242"
    monkeypatch.setenv("SLURM_JOB_ID", "4243_7")  # the array form is a valid id as well
    assert default_job_id(load_settings()) == "slurm:4243_7"
    monkeypatch.delenv("SLURM_JOB_ID")
    assert not default_job_id(load_settings()).startswith("slurm:")


def test_the_summary_goes_only_to_a_regular_file_of_the_jobs_user(tmp_path: Path) -> None:
    out = tmp_path / "slurm-1.out"
    out.write_text("training...\n")
    append_to_job_output(str(out), "summary\n", uid=os.getuid())
    assert out.read_text() == "training...\nsummary\n"
    victim = tmp_path / "root-owned"
    victim.write_text("keep\n")
    link = tmp_path / "slurm-2.out"
    link.symlink_to(victim)
    with pytest.raises(OSError):
        append_to_job_output(str(link), "summary\n", uid=os.getuid())
    with pytest.raises(PermissionError):
        append_to_job_output(str(out), "summary\n", uid=os.getuid() + 1)
    with pytest.raises(FileNotFoundError):  # never created
        append_to_job_output(str(tmp_path / "missing"), "summary\n", uid=os.getuid())
    assert victim.read_text() == "keep\n" and out.read_text() == "training...\nsummary\n"
