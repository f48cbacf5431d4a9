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
