"""`fleetprof run --apply`: the plan from a report's recommendations (pure: report -> env and argv changes)."""

from __future__ import annotations

from agent.apply import plan_apply, set_cli_arg

ALLOC = {"kind": "allocator_settings", "summary": "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: ...",
         "reason": "r", "evidence": {"env": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                                     "alloc_conf": "expandable_segments:True"},
         "saving": {"reserved_bytes": 2 << 20, "reserved_pct": 12.5}}
BATCH = {"kind": "batch_size", "summary": "Batch size up to 96", "reason": "fit",
         "evidence": {"max_batch_size": 96, "batch_size": 48}, "saving": None}
GPU = {"kind": "gpu_type", "summary": "Run on L4", "reason": "r", "evidence": {}, "saving": {"usd": 3.0}}


def test_allocator_setting_goes_to_the_environment_and_is_recorded():
    plan = plan_apply([ALLOC, GPU], ["python", "train.py"], from_job="job-a")
    assert plan.env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert plan.command == ["python", "train.py"] and plan.batch_size is None
    [applied] = plan.applied
    assert applied.as_metadata() == {"kind": "allocator_settings", "summary": ALLOC["summary"],
                                     "predicted_saving": {"reserved_bytes": 2 << 20, "reserved_pct": 12.5},
                                     "from_job": "job-a",
                                     "setting": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"}
    assert plan.skipped == ["gpu_type: not something a launcher can set"]


def test_batch_size_only_where_the_user_names_the_argument_or_variable():
    unnamed = plan_apply([BATCH], ["python", "t.py"], from_job="a")
    assert unnamed.applied == [] and unnamed.env == {} and "--batch-size-arg" in unnamed.skipped[0]

    by_arg = plan_apply([BATCH], ["python", "t.py", "--batch-size", "48", "--lr", "1"], from_job="a",
                        batch_size_arg="--batch-size")
    assert by_arg.command == ["python", "t.py", "--batch-size", "96", "--lr", "1"] and by_arg.batch_size == 96
    assert by_arg.applied[0].setting == "--batch-size 96"

    by_env = plan_apply([BATCH, {**BATCH, "kind": "batch_size_fit", "evidence": {"largest_batch": 80}}],
                        ["python", "t.py"], from_job="a", batch_size_env="BS")
    assert by_env.env == {"BS": "96"} and by_env.command == ["python", "t.py"]
    assert [a.kind for a in by_env.applied] == ["batch_size"]
    assert by_env.skipped == ["batch_size_fit: a batch size (96) is already set"]


def test_bad_evidence_is_skipped_not_applied():
    plan = plan_apply([{**ALLOC, "evidence": {"env": "no-equals"}},
                       {**BATCH, "evidence": {"max_batch_size": None, "missing": ["peak memory"]}}],
                      ["x"], from_job="a", batch_size_arg="--bs")
    assert plan.applied == [] and plan.env == {} and plan.command == ["x"] and len(plan.skipped) == 2


def test_set_cli_arg_replaces_both_spellings_or_appends():
    assert set_cli_arg(["t.py", "--bs=8"], "--bs", "16") == ["t.py", "--bs=16"]
    assert set_cli_arg(["t.py", "--bs", "8"], "--bs", "16") == ["t.py", "--bs", "16"]
    assert set_cli_arg(["t.py", "--bsx", "8"], "--bs", "16") == ["t.py", "--bsx", "8", "--bs", "16"]
    assert set_cli_arg(["t.py", "--bs"], "--bs", "16") == ["t.py", "--bs", "--bs", "16"]
