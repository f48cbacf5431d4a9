"""`fleetprof run --profile STEPS` and `--trace-allocator STEPS`, as the hooks see them (the variables `fleetprof run`
puts in the child's environment, agent.hooks.child_env), on an unmodified CPU script."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from agent.hooks import child_env
from tests.hooks.conftest import Recorder, run_script


def test_flags_become_the_hooks_environment() -> None:
    env = child_env(job_id="j", server_url=None, token=None, alloc_trace_steps=3, profile_steps=2)
    assert env["FLEETPROF_HOOKS_ALLOC_TRACE_STEPS"] == "3" and env["FLEETPROF_HOOKS_PROFILE_STEPS"] == "2"
    plain = child_env(job_id="j", server_url=None, token=None)
    assert "FLEETPROF_HOOKS_ALLOC_TRACE_STEPS" not in plain and "FLEETPROF_HOOKS_PROFILE_STEPS" not in plain


def test_profile_uploads_a_kineto_trace_of_the_asked_steps(recorder: Recorder) -> None:
    run = run_script("train_loader.py", "8", "6", server_url=recorder.url,
                     extra_env={"FLEETPROF_HOOKS_PROFILE_STEPS": "2"})
    assert run.returncode == 0, run.stderr
    assert len(recorder.uploads) == 1, recorder.uploads
    path, trace = recorder.uploads[0]
    url = urlsplit(path)
    assert url.path == "/api/v1/jobs/job-hooks-test/traces"
    assert parse_qs(url.query)["filename"] == ["hooks-profile-steps-1-2.pt.trace.json"]
    names = {e.get("name") for e in trace["traceEvents"]}
    # steps 1 and 2 marked as the profiler marks them, and the model's work inside
    assert {n for n in names if n and n.startswith("ProfilerStep#")} == {"ProfilerStep#1", "ProfilerStep#2"}
    assert "aten::convolution" in names
    assert len(recorder.events("step")) == 6  # the run went on past the profiled steps


def test_allocator_trace_on_cpu_says_so_in_one_line_and_the_run_goes_on(recorder: Recorder) -> None:
    run = run_script("train_loader.py", "8", "4", server_url=recorder.url,
                     extra_env={"FLEETPROF_HOOKS_ALLOC_TRACE_STEPS": "2"})
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stderr.splitlines() if "allocator" in line]
    assert len(lines) == 1 and "CUDA-only" in lines[0], run.stderr
    assert not recorder.uploads and len(recorder.events("step")) == 4
