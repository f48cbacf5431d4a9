"""The hooks in real child processes running unmodified PyTorch scripts on this CPU."""

from __future__ import annotations

import json
import re
import socket
import statistics
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fleetprof.protocol import EventBatch
from tests.hooks.conftest import Recorder, run_script

STEPS = 8
BLOCKED_POST_S = 5.0  # the hooks' Transport timeout (agent/hooks/torch.py): what one blocked post would cost


def _script_step_times(stdout: str) -> list[float]:
    return [float(m.group(1)) for m in re.finditer(r"^STEP \d+ ([0-9.]+)$", stdout, re.M)]


def _loop_s(stdout: str) -> float:
    m = re.search(r"^LOOP ([0-9.]+)$", stdout, re.M)
    assert m, stdout
    return float(m.group(1))


def test_unmodified_script_steps_times_and_layers(recorder: Recorder) -> None:
    # the default level: steps on every step, per-module timing on every N-th step
    run = run_script("train_cnn.py", str(STEPS), server_url=recorder.url, level="default",
                     extra_env={"FLEETPROF_HOOKS_LAYER_EVERY": "3"})
    assert run.returncode == 0, run.stderr

    # every body is a valid EventBatch of one source, in seq order, with the token
    batches = [EventBatch.model_validate(b) for b in recorder.bodies]
    assert {b.source_id for b in batches} and len({b.source_id for b in batches}) == 1
    assert [b.seq for b in batches] == list(range(len(batches)))
    assert set(recorder.paths) == {"/api/v1/ingest/events"}
    assert set(recorder.auth) == {"Bearer tok-test"}

    starts = recorder.events("job_start")
    assert len(starts) == 1 and starts[0]["device"] == "cpu" and starts[0]["job_id"] == "job-hooks-test"
    assert not recorder.events("job_end")  # `fleetprof run` sends that one

    steps = recorder.events("step")
    assert [s["step"] for s in steps] == list(range(STEPS))  # exactly the optimizer steps taken
    assert all(s["samples"] == 24 and s["memory_source"] == "cpu_rss" for s in steps)
    assert all(s["reserved_peak_bytes"] > 0 and "allocated_peak_bytes" not in s for s in steps)

    script_times = _script_step_times(run.stdout)
    assert len(script_times) == STEPS
    # Within 10%, or 2 ms (the scheduling noise floor of this shared 2-core machine): the typical step, since a
    # boundary in the wrong place shows in every step. Each single step within 50%: on a loaded machine (the suite
    # runs on 2 xdist workers) the hook's own work between the script's clock and ours grows, and 2 steps of 8 once
    # read 12 % over (0.081 s against 0.072 s).
    off = [abs(ours - theirs) / max(theirs, 0.02) for ours, theirs in zip((s["wall_s"] for s in steps), script_times)]
    assert statistics.median(off) <= 0.10 and max(off) <= 0.5, off

    layers = recorder.events("layer")
    sampled = sorted({e["step"] for e in layers})
    assert sampled == [1, 4, 7]  # steps 1, 1+N, 1+2N with N=3
    names = {e["module"] for e in layers if e["step"] == 4}
    assert {"conv1", "act1", "conv2", "act2", "pool", "head", "SmallCNN", "CrossEntropyLoss"} <= names
    by_name = {e["module"]: e for e in layers if e["step"] == 4}
    assert by_name["conv1"]["module_type"] == "Conv2d"
    assert by_name["conv1"]["activation_bytes"] == 24 * 16 * 48 * 48 * 4
    for name in ("conv1", "conv2", "head", "SmallCNN"):
        assert by_name[name]["forward_s"] > 0 and by_name[name]["backward_s"] > 0, by_name[name]
    assert by_name["SmallCNN"]["forward_s"] >= by_name["conv1"]["forward_s"]


def test_two_optimizers_count_one_step_per_iteration(recorder: Recorder) -> None:
    run = run_script("train_gan.py", server_url=recorder.url)
    assert run.returncode == 0, run.stderr
    assert "GAN_DONE 6" in run.stdout
    steps = recorder.events("step")
    assert [s["step"] for s in steps] == list(range(6))
    assert all(s["samples"] == 32 for s in steps)


def test_explicit_steps_without_optimizer(recorder: Recorder) -> None:
    run = run_script("explicit_steps.py", server_url=recorder.url)
    assert run.returncode == 0, run.stderr
    assert [s["step"] for s in recorder.events("step")] == [0, 1, 2, 3]
    assert all(s["samples"] == 5 for s in recorder.events("step"))


def test_oom_is_reported_and_exit_code_kept(recorder: Recorder) -> None:
    run = run_script("oom.py", server_url=recorder.url)
    assert run.returncode == 1
    assert "OutOfMemoryError" in run.stderr  # the user's traceback still printed
    (oom,) = recorder.events("oom")
    assert oom["requested_bytes"] == 20 * 1024 * 1024
    assert "Tried to allocate" in oom["message"]
    assert len(recorder.events("step")) == 2


@pytest.fixture()
def blackhole_url() -> Iterator[str]:
    """A collector that accepts connections and never answers: worse than one that is down."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def test_collector_down_never_slows_or_breaks_training(blackhole_url: str) -> None:
    steps = "30"
    # side by side, so that the load of this shared machine weighs on both runs alike
    with ThreadPoolExecutor(2) as pool:
        base_f = pool.submit(run_script, "train_cnn.py", steps, server_url=None, hooks=False)
        hooked_f = pool.submit(run_script, "train_cnn.py", steps, server_url=blackhole_url, level="default",
                               extra_env={"FLEETPROF_HOOKS_LAYER_EVERY": "5"})
        base, hooked = base_f.result(), hooked_f.result()
    assert base.returncode == hooked.returncode == 0, hooked.stderr
    times = _script_step_times(hooked.stdout)
    assert len(times) == 30
    # A post that blocked the loop would cost a step the transport timeout, BLOCKED_POST_S. The bounds sit at half
    # that: they catch a blocked post and leave room for a step descheduled on a loaded machine (the suite runs on
    # 2 xdist workers, often beside other jobs). The overhead itself is measured by bench/hook_overhead.py.
    assert max(times) < BLOCKED_POST_S / 2
    assert _loop_s(hooked.stdout) <= 2 * _loop_s(base.stdout) + BLOCKED_POST_S / 2
    assert hooked.wall_s <= base.wall_s + BLOCKED_POST_S  # the exit flush waits at most 2 s


def test_non_torch_program_imports_nothing_and_chains_sitecustomize(recorder: Recorder, tmp_path: Path) -> None:
    previous = tmp_path / "prev_site"
    previous.mkdir()
    (previous / "sitecustomize.py").write_text("import os\nos.environ['CHAINED_SITECUSTOMIZE_RAN'] = '1'\n")
    run = run_script("no_torch.py", server_url=recorder.url, pythonpath=str(previous))
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out == {"loaded": [], "chained": "1"}
    assert recorder.bodies == []


def test_failing_previous_sitecustomize_does_not_stop_the_program(recorder: Recorder, tmp_path: Path) -> None:
    previous = tmp_path / "bad_site"
    previous.mkdir()
    (previous / "sitecustomize.py").write_text("raise RuntimeError('broken site')\n")
    run = run_script("train_gan.py", server_url=recorder.url, pythonpath=str(previous))
    assert run.returncode == 0, run.stderr
    assert "broken site" in run.stderr
    assert len(recorder.events("step")) == 6  # our hooks still installed
