"""child_env, the RSS peak reader, OOM message parsing, and the self-disabling guard (in-process)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

from agent.hooks import SITE_DIR, child_env
from agent.hooks.memory import RssPeak


def test_child_env_sets_vars_and_keeps_pythonpath() -> None:
    env = child_env(job_id="j1", server_url="http://c:8000", token="t", level="layers", pythonpath="/a:/b")
    assert env == {"FLEETPROF_JOB_ID": "j1", "FLEETPROF_HOOKS_LEVEL": "layers",
                   "FLEETPROF_SERVER_URL": "http://c:8000", "FLEETPROF_TOKEN": "t",
                   "PYTHONPATH": os.pathsep.join([str(SITE_DIR), "/a", "/b"])}
    assert (SITE_DIR / "sitecustomize.py").is_file()
    assert child_env(job_id="j1", server_url=None, token=None, pythonpath="")["PYTHONPATH"] == str(SITE_DIR)
    off = child_env(job_id="j1", server_url=None, token=None, level="off")
    assert "PYTHONPATH" not in off and off["FLEETPROF_HOOKS_LEVEL"] == "off"
    with pytest.raises(ValueError):
        child_env(job_id="j1", server_url=None, token=None, level="everything")


def test_rss_peak_reads_vmhwm_from_a_fake_proc(tmp_path: Path) -> None:
    (tmp_path / "status").write_text("Name:\tpython\nVmPeak:\t 999 kB\nVmHWM:\t  2048 kB\nVmRSS:\t 1000 kB\n")
    (tmp_path / "clear_refs").write_text("")
    rss = RssPeak(proc_self=tmp_path)
    assert rss.read_and_reset() == 2048 * 1024
    assert (tmp_path / "clear_refs").read_text() == "5"
    assert RssPeak(proc_self=tmp_path / "missing").read_and_reset() is None


def test_parse_requested_bytes() -> None:
    from agent.hooks.events import parse_requested_bytes

    assert parse_requested_bytes("CUDA out of memory. Tried to allocate 2.50 GiB (GPU 0)") == int(2.5 * 2**30)
    assert parse_requested_bytes("Tried to allocate 512 bytes") == 512
    assert parse_requested_bytes("something else") is None


def test_sample_counts_become_plain_ints() -> None:
    """The protocol's integers are strict: a numpy or torch integer from the caller must not drop the step."""
    import numpy as np
    import torch

    from agent.hooks.torch import sample_count
    from fleetprof.protocol import StepEvent

    for value in (32, np.int64(32), torch.tensor(32)):
        assert sample_count(value) == 32 and type(sample_count(value)) is int
        StepEvent(kind="step", job_id="j", ts=1.7e9, step=1, wall_s=0.1, samples=sample_count(value))
    assert [sample_count(v) for v in (True, 32.0, "32", None)] == [None] * 4


class ListSender:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def put(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def submit(self, job: Any) -> None:
        pass

    def close(self, timeout_s: float = 2.0) -> None:
        pass


def test_internal_error_disables_hooks_and_training_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    import torch

    from agent.hooks.torch import Profiler

    class BrokenRss(RssPeak):
        def read_and_reset(self) -> int | None:
            raise OSError("boom")

    sender = ListSender()
    prof = Profiler(job_id="j", sender=sender, level="layers", layer_every=1,  # type: ignore[arg-type]
                    rss=BrokenRss()).install(process_hooks=False)
    try:
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with caplog.at_level(logging.WARNING, logger="agent.hooks.torch"):
            for _ in range(4):
                model(torch.randn(2, 3)).sum().backward()
                opt.step()
        assert not prof.enabled
        assert sum("disabled after an internal error" in r.message for r in caplog.records) == 1
        assert [e["kind"] for e in sender.events] == ["job_start"]
        assert prof._handles == [] and not prof._sampler.active  # unregistered at the next boundary
    finally:
        prof.close()


class CountingRss(RssPeak):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def read_and_reset(self) -> int | None:
        self.reads += 1
        return 1000 + self.reads


def test_short_cpu_steps_read_the_rss_peak_at_a_bounded_rate_with_exact_steps() -> None:
    """Steps 0-7 each read the RSS peak; then at most one reading per 20 ms of training. Step numbers and wall
    times stay exact for every step; the steps between readings carry no memory fields (unknown)."""
    from agent.hooks.memory import RSS_EVERY_STEP_UNTIL, RSS_MIN_INTERVAL_S
    from agent.hooks.torch import Profiler

    clock = [100.0]
    sender, rss = ListSender(), CountingRss()
    prof = Profiler(job_id="j", sender=sender, level="default", layer_every=10**6, rss=rss,  # type: ignore[arg-type]
                    perf=lambda: clock[0]).install(send_job_start=False, process_hooks=False)
    try:
        prof._step_start = clock[0]
        for _ in range(60):
            clock[0] += 0.004  # 4 ms steps
            prof.step(samples=2)
    finally:
        prof.close()
    steps = [e for e in sender.events if e["kind"] == "step"]
    assert [e["step"] for e in steps] == list(range(60))
    assert all(abs(e["wall_s"] - 0.004) < 1e-9 and e["samples"] == 2 for e in steps)
    read = [e["step"] for e in steps if "reserved_peak_bytes" in e]
    assert read[:RSS_EVERY_STEP_UNTIL] == list(range(RSS_EVERY_STEP_UNTIL))
    gaps = {b - a for a, b in zip(read[RSS_EVERY_STEP_UNTIL - 1:], read[RSS_EVERY_STEP_UNTIL:], strict=False)}
    assert gaps == {round(RSS_MIN_INTERVAL_S / 0.004)}  # one reading per 20 ms: every 5th step here
    assert rss.reads == len(read)
    assert all(e["memory_source"] == "cpu_rss" for e in steps if "reserved_peak_bytes" in e)
    assert all("memory_source" not in e for e in steps if "reserved_peak_bytes" not in e)


def test_cuda_peaks_read_once_from_the_nested_stats_or_through_the_public_calls() -> None:
    from types import SimpleNamespace

    from agent.hooks.memory import CudaPeaks

    calls: list[str] = []
    stats = {"allocated_bytes": {"all": {"peak": 7, "current": 1}}, "reserved_bytes": {"all": {"peak": 9}}}
    public = SimpleNamespace(max_memory_allocated=lambda: calls.append("alloc") or 3,
                             max_memory_reserved=lambda: calls.append("resv") or 4,
                             reset_peak_memory_stats=lambda: calls.append("reset"))
    fast_c = SimpleNamespace(_cuda_getDevice=lambda: 0, _cuda_memoryStats=lambda d: calls.append(f"stats{d}") or stats,
                             _cuda_resetPeakMemoryStats=lambda d: calls.append(f"reset{d}"))
    assert CudaPeaks(SimpleNamespace(_C=fast_c, cuda=public)).read_and_reset() == (7, 9)
    assert calls == ["stats0", "reset0"]
    calls.clear()
    assert CudaPeaks(SimpleNamespace(_C=SimpleNamespace(), cuda=public)).read_and_reset() == (3, 4)
    assert calls == ["alloc", "resv", "reset"]


def test_device_timer_drains_in_step_order_and_bounds_what_it_holds() -> None:
    from types import SimpleNamespace

    from agent.hooks.device_time import PENDING_MAX, DeviceTimer

    class FakeEvent:
        def __init__(self, done: bool, t_ms: float) -> None:
            self.done, self.t_ms = done, t_ms

        def query(self) -> bool:
            return self.done

        def elapsed_time(self, end: FakeEvent) -> float:
            return end.t_ms - self.t_ms

    out: list[dict[str, Any]] = []
    timer = DeviceTimer(SimpleNamespace(_C=SimpleNamespace()), out.append)
    start = FakeEvent(True, 0.0)
    timer.send({"step": 0}, start, FakeEvent(True, 5.0))
    timer.send({"step": 1}, start, FakeEvent(False, 0.0))
    timer.send({"step": 2}, start, FakeEvent(True, 9.0))
    timer.drain(final=False)
    assert out == [{"step": 0, "device_s": 0.005}]  # step 2 waits behind step 1: events go out in order
    for i in range(3, 3 + PENDING_MAX + 1):
        timer.send({"step": i}, start, FakeEvent(False, 0.0))
    timer.drain(final=False)
    # 67 held: the oldest go out, device time unknown where not complete, until PENDING_MAX are left
    assert [e["step"] for e in out] == [0, 1, 2, 3] and out[2]["device_s"] == 0.009
    assert "device_s" not in out[1] and "device_s" not in out[3]
    assert len(timer.pending) == PENDING_MAX
    timer.drain(final=True)
    assert [e["step"] for e in out] == list(range(3 + PENDING_MAX + 1))
