"""Live capture requests (issue #19, /work/prompts/capture_contract.md) as a real CPU training process sees them:
the hooks poll the fake collector (tests/hooks/conftest.py Recorder), report the capture's states and upload the
trace with its capture_id, while the job's own step events go on unchanged."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from agent.hooks.capture import NO_CUDA_REASON
from tests.hooks.conftest import Recorder, start_script

FAST = {"FLEETPROF_HOOKS_CAPTURE_POLL_S": "0.2"}


def stop(proc: subprocess.Popen[str], stop_file: Path) -> tuple[int, str, str]:
    stop_file.touch()
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def profiler_steps(trace: dict) -> list[int]:
    names = {e.get("name") or "" for e in trace["traceEvents"]}
    return sorted(int(n.split("#")[1]) for n in names if n.startswith("ProfilerStep#"))


def assert_steps_complete(rec: Recorder, out: str) -> None:
    n = int(re.search(r"STEPS (\d+)", out).group(1))  # type: ignore[union-attr]
    steps = [e["step"] for e in rec.events("step")]
    assert steps == list(range(n)), steps  # complete and in order: no restart, no step lost
    assert len(rec.events("job_start")) == 1


def test_kineto_capture_mid_run(recorder: Recorder, tmp_path: Path) -> None:
    stop_file = tmp_path / "stop"
    proc = start_script("train_long.py", str(stop_file), server_url=recorder.url, extra_env=FAST)
    try:
        assert recorder.wait(lambda: len(recorder.events("step")) >= 5), "the job never got going"
        cid = recorder.add_capture("kineto", 3)
        assert recorder.wait(lambda: recorder.captures[cid]["state"] == "uploaded"), recorder.state_posts
    finally:
        rc, out, err = stop(proc, stop_file)
    assert rc == 0, err
    assert recorder.states(cid) == ["delivered", "capturing"]
    assert all(b["rank"] == 0 for _, b in recorder.state_posts)
    assert all(q == "/api/v1/jobs/job-hooks-test/captures?state=requested&rank=0" for q in recorder.capture_polls)
    [(path, trace)] = recorder.uploads
    url = urlsplit(path)
    query = parse_qs(url.query)
    assert url.path == "/api/v1/jobs/job-hooks-test/traces" and query["capture_id"] == [cid]
    assert query["rank"] == ["0"]
    marked = profiler_steps(trace)
    assert len(marked) == 3 and marked == list(range(marked[0], marked[0] + 3)) and marked[0] >= 5, marked
    assert query["filename"] == [f"hooks-capture-{cid}-steps-{marked[0]}-{marked[-1]}.pt.trace.json"]
    assert "aten::convolution" in {e.get("name") for e in trace["traceEvents"]}
    assert_steps_complete(recorder, out)


def test_two_requests_one_after_the_other_and_ranks(recorder: Recorder, tmp_path: Path) -> None:
    first = recorder.add_capture("kineto", 2)
    other_rank = recorder.add_capture("kineto", 2, ranks=[1, 2])  # not for this process (rank 0)
    second = recorder.add_capture("kineto", 4, ranks=[0, 1])
    stop_file = tmp_path / "stop"
    proc = start_script("train_long.py", str(stop_file), server_url=recorder.url, extra_env=FAST)
    try:
        assert recorder.wait(lambda: recorder.captures[second]["state"] == "uploaded"), recorder.state_posts
        assert recorder.wait(lambda: len(recorder.capture_polls) >= 3 + len(recorder.uploads))  # polled on after
    finally:
        rc, out, err = stop(proc, stop_file)
    assert rc == 0, err
    assert [(cid, b["state"]) for cid, b in recorder.state_posts] == [
        (first, "delivered"), (first, "capturing"), (second, "delivered"), (second, "capturing")]
    assert recorder.captures[other_rank]["state"] == "requested"  # never touched
    assert [parse_qs(urlsplit(p).query)["capture_id"] for p, _ in recorder.uploads] == [[first], [second]]
    a, b = (profiler_steps(t) for _, t in recorder.uploads)
    assert len(a) == 2 and len(b) == 4 and a[-1] < b[0], (a, b)  # one at a time, never overlapping
    assert_steps_complete(recorder, out)


def test_allocator_capture_on_cpu_fails_and_a_capture_cut_short_by_the_end_fails(recorder: Recorder,
                                                                                  tmp_path: Path) -> None:
    alloc = recorder.add_capture("allocator", 2)
    long = recorder.add_capture("kineto", 100)
    stop_file = tmp_path / "stop"
    proc = start_script("train_long.py", str(stop_file), server_url=recorder.url, extra_env=FAST)
    try:
        assert recorder.wait(lambda: recorder.captures[long]["state"] == "capturing"), recorder.state_posts
    finally:
        rc, out, err = stop(proc, stop_file)
    assert rc == 0, err
    assert recorder.states(alloc) == ["delivered", "failed"]
    assert recorder.captures[alloc]["reason"] == NO_CUDA_REASON
    # the job ended 100 steps too early: reported failed, nothing partial uploaded
    assert recorder.states(long) == ["delivered", "capturing", "failed"]
    assert "ended" in recorder.captures[long]["reason"]
    assert not recorder.uploads
    assert_steps_complete(recorder, out)


def test_polling_off_asks_for_nothing(recorder: Recorder, tmp_path: Path) -> None:
    cid = recorder.add_capture("kineto", 2)
    proc = start_script("train_long.py", str(tmp_path / "never"), "120", server_url=recorder.url,
                        extra_env={"FLEETPROF_HOOKS_CAPTURE_POLL_S": "0"})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert not recorder.capture_polls and not recorder.state_posts and not recorder.uploads
    assert recorder.captures[cid]["state"] == "requested"
    assert_steps_complete(recorder, out)


def test_a_refused_poll_pauses_polling_and_says_why_once(recorder: Recorder, tmp_path: Path) -> None:
    recorder.poll_status = 404
    proc = start_script("train_long.py", str(tmp_path / "never"), "150", server_url=recorder.url,
                        extra_env={"FLEETPROF_HOOKS_CAPTURE_POLL_S": "0.05"})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert len(recorder.capture_polls) == 1
    lines = [line for line in err.splitlines() if "capture" in line]
    assert len(lines) == 1 and "404" in lines[0] and "paused" in lines[0], err
    assert_steps_complete(recorder, out)


def test_failing_polls_are_retried_at_the_poll_rate(recorder: Recorder, tmp_path: Path) -> None:
    recorder.poll_status = 503
    stop_file = tmp_path / "stop"
    proc = start_script("train_long.py", str(stop_file), server_url=recorder.url,
                        extra_env={"FLEETPROF_HOOKS_CAPTURE_POLL_S": "0.1"})
    try:
        assert recorder.wait(lambda: len(recorder.capture_polls) >= 3)
        recorder.poll_status = None
        cid = recorder.add_capture("kineto", 1)
        assert recorder.wait(lambda: recorder.captures[cid]["state"] == "uploaded"), recorder.state_posts
    finally:
        rc, out, err = stop(proc, stop_file)
    assert rc == 0, err
    assert len([line for line in err.splitlines() if "capture poll failed" in line]) == 1, err
    assert_steps_complete(recorder, out)


class _FakeClient:
    def __init__(self, captures: list[dict]) -> None:
        self.captures = captures
        self.posts: list[tuple[str, dict]] = []

    def get_json(self, path: str, **params: object) -> dict:
        return {"captures": self.captures}

    def post_json(self, path: str, payload: dict, **params: object) -> dict:
        self.posts.append((path, payload))
        return {}


class _NowSender:
    def __init__(self, client: _FakeClient) -> None:
        self.client = client

    def submit(self, job) -> None:  # type: ignore[no-untyped-def]
        job(self.client)


class _BrokenProfiler:
    class profiler:  # noqa: N801 (stands in for torch.profiler)
        class ProfilerActivity:
            CPU, CUDA = "cpu", "cuda"

        class ProfilerAction:
            RECORD = "record"

        @staticmethod
        def profile(**kwargs: object) -> object:
            raise RuntimeError("profiler already running")


def test_a_capture_that_cannot_start_is_failed_and_the_next_one_is_taken() -> None:
    from agent.hooks.capture import CaptureManager

    caps = [{"capture_id": "c2", "kind": "kineto", "steps": 2, "ranks": None},
            {"capture_id": "c1", "kind": "kineto", "steps": 2, "ranks": None}]
    client = _FakeClient(caps)
    mgr = CaptureManager(_BrokenProfiler, _NowSender(client), client, job_id="j", poll_s=1.0,  # type: ignore[arg-type]
                         rank=lambda: 0)
    mgr.poll_once()
    assert mgr.busy and mgr.pending is not None and mgr.pending.capture_id == "c1"  # the oldest first
    assert mgr.poll_once() == 1.0 and len(client.posts) == 1  # one in hand: no second delivery
    mgr.tick(5, cuda=False, rank=0)  # the profiler refuses to start: failed, never raised into the step
    assert [(p.split("/")[-2], b["state"]) for p, b in client.posts] == [
        ("c1", "delivered"), ("c1", "capturing"), ("c1", "failed")]
    assert "profiler already running" in client.posts[-1][1]["reason"] and not mgr.busy
    mgr.poll_once()
    assert mgr.pending is not None and mgr.pending.capture_id == "c2"
