"""A job's headline figures where teams already track runs: MLflow and Weights & Biases (issue #22 part 5).

    from fleetprof.trackers import log_report
    log_report(report, html, to="mlflow")          # into the active MLflow run, else a new one
    log_report(report, html, to="wandb", project="vision")

Also `fleetprof report JOB_ID --to mlflow|wandb` and `fleetprof.profile(..., log_to=("mlflow",))`. Metrics carry
their unit in the name (`fleetprof.peak_used_bytes`, `fleetprof.step_time_p50_s`, ...); a figure the report does
not know is left out, never logged as 0. Params say what the figures are of (job, GPU, energy source). The report
itself goes along as artefacts `fleetprof/report.json` and `fleetprof/report.html`.

The trackers are optional extras (`pip install 'fleetprof[mlflow]'` / `'fleetprof[wandb]'`), imported only here, when
called: the bare install does not pull them in.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fleetprof.errors import CliError

PREFIX = "fleetprof."
TRACKERS = ("mlflow", "wandb")
ARTEFACT_DIR = "fleetprof"

# metric name (unit in it) -> where the report keeps it
METRICS: dict[str, tuple[str, ...]] = {
    "peak_used_bytes": ("memory", "peak_used_bytes"),
    "peak_allocated_bytes": ("memory", "peak_allocated_bytes"),
    "peak_reserved_bytes": ("memory", "peak_reserved_bytes"),
    "memory_total_bytes": ("memory", "memory_total_bytes"),
    "process_peak_bytes": ("memory", "process_peak_bytes"),
    "steps": ("time", "steps"),
    "step_time_mean_s": ("time", "step_time_s", "mean"),
    "step_time_p50_s": ("time", "step_time_s", "p50"),
    "step_time_p95_s": ("time", "step_time_s", "p95"),
    "samples_per_s": ("time", "samples_per_s"),
    "gpu_busy_fraction": ("time", "gpu_busy_fraction"),
    "gpu_util_mean_pct": ("utilization", "gpu_mean_pct"),
    "energy_j": ("energy", "energy_j"),
    "energy_per_step_j": ("energy", "energy_per_step_j"),
    "energy_per_sample_j": ("energy", "per_sample_j"),
    "mean_power_w": ("energy", "mean_power_w"),
    "co2e_g": ("energy", "co2e_g"),
    "duration_s": ("duration_s",),
}
# MFU where some section reports it (model FLOPs utilization, a fraction)
MFU_KEYS = ("mfu_fraction", "mfu")


def _get(report: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = report
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def headline_metrics(report: Mapping[str, Any]) -> dict[str, float]:
    """The report's headline figures, known ones only, named `fleetprof.<figure with its unit>`."""
    out = {}
    for name, path in METRICS.items():
        value = _number(_get(report, path))
        if value is not None:
            out[PREFIX + name] = value
    for section in report.values():
        if isinstance(section, Mapping):
            for key in MFU_KEYS:
                value = _number(section.get(key))
                if value is not None:
                    out[PREFIX + "mfu_fraction"] = value
    return out


def headline_params(report: Mapping[str, Any]) -> dict[str, str]:
    """What the figures are of: job, state, GPU, energy source, model (as strings, as trackers keep params)."""
    gpus = report.get("gpus") or []
    framework = report.get("framework") or {}
    params = {
        "job_id": report.get("job_id"),
        "state": report.get("state"),
        "gpu_name": gpus[0].get("name") if gpus and isinstance(gpus[0], Mapping) else None,
        "gpu_count": len(gpus) if gpus else None,
        "energy_source": _get(report, ("energy", "source")),
        "model_class": framework.get("model_class") if isinstance(framework, Mapping) else None,
        "batch_size": report.get("batch_size"),
    }
    return {PREFIX + k: str(v) for k, v in params.items() if v is not None}


def log_report(report: Mapping[str, Any], html: str | None = None, *, to: str, **options: Any) -> str:
    """Log the report's headline figures and the report itself to `to` (mlflow | wandb); returns the run's id.

    mlflow options: `run_id` (log into that run), `experiment` (name), `tracking_uri`. Without `run_id` the active
    run is used (a child run of it when it already holds another job's figures), else a new run named after the job.
    wandb options: `project`, `entity`, `mode` ("offline" as WANDB_MODE would), `dir`, `run_id` (resume that run).
    Without `run_id` the active run is used (a new run beside it when it already holds another job's figures), else
    a new run named after the job.
    """
    if to == "mlflow":
        return log_to_mlflow(report, html, **options)
    if to == "wandb":
        return log_to_wandb(report, html, **options)
    raise ValueError(f"unknown tracker {to!r}; one of {', '.join(TRACKERS)}")


def _report_files(folder: Path, report: Mapping[str, Any], html: str | None) -> list[Path]:
    files = [folder / "report.json"]
    files[0].write_text(json.dumps(report, indent=1) + "\n")
    if html is not None:
        files.append(folder / "report.html")
        files[1].write_text(html)
    return files


def log_to_mlflow(report: Mapping[str, Any], html: str | None = None, *, run_id: str | None = None,
                  experiment: str | None = None, tracking_uri: str | None = None) -> str:
    try:
        import mlflow
    except ImportError:
        raise CliError("logging to MLflow needs the mlflow extra: pip install 'fleetprof[mlflow]'") from None
    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    if experiment:
        mlflow.set_experiment(experiment)
    job_id = str(report.get("job_id"))
    active = mlflow.active_run()
    run = None  # the run this call started (and ends)
    if run_id is not None:
        run = mlflow.start_run(run_id=run_id)
    elif active is None:
        run = mlflow.start_run(run_name=job_id)
    elif mlflow.get_run(active.info.run_id).data.params.get(PREFIX + "job_id", job_id) != job_id:
        # the active run holds another job's figures (a decorated function called twice): one child run per job,
        # as MLflow refuses to change a logged param
        run = mlflow.start_run(run_name=job_id, nested=True)
    try:
        current = mlflow.active_run()
        assert current is not None
        mlflow.log_metrics(headline_metrics(report))
        mlflow.log_params(headline_params(report))
        with tempfile.TemporaryDirectory() as tmp:
            for f in _report_files(Path(tmp), report, html):
                mlflow.log_artifact(str(f), artifact_path=ARTEFACT_DIR)
        return str(current.info.run_id)
    finally:
        if run is not None:
            mlflow.end_run()


def log_to_wandb(report: Mapping[str, Any], html: str | None = None, *, project: str | None = None,
                 entity: str | None = None, mode: str | None = None, dir: str | None = None,
                 run_id: str | None = None) -> str:
    try:
        import wandb
    except ImportError:
        raise CliError("logging to Weights & Biases needs the wandb extra: pip install 'fleetprof[wandb]'") from None
    if mode not in (None, "online", "offline", "disabled"):
        raise ValueError(f"W&B mode {mode!r}: online, offline or disabled")
    job_id = str(report.get("job_id"))
    active = wandb.run
    # the active run holds another job's figures (a decorated function called twice): a run of its own for this job
    other_job = active is not None and active.config.get(PREFIX + "job_id", job_id) != job_id
    own = active is None or run_id is not None or other_job
    run: Any = wandb.init(project=project, entity=entity, mode=mode, dir=dir, id=run_id,  # type: ignore[arg-type]
                          resume="allow" if run_id else None, name=job_id, config=headline_params(report),
                          reinit="create_new" if active is not None else None) if own else active
    try:
        run.config.update(headline_params(report), allow_val_change=True)
        run.summary.update(headline_metrics(report))
        run.log(headline_metrics(report))
        artifact = wandb.Artifact(f"fleetprof-report-{_artifact_name(str(report.get('job_id')))}",
                                  type="fleetprof-report")
        with tempfile.TemporaryDirectory() as tmp:
            for f in _report_files(Path(tmp), report, html):
                artifact.add_file(str(f), name=f"{ARTEFACT_DIR}/{f.name}")
            run.log_artifact(artifact)
            if own:
                run.finish()
        return str(run.id)
    except BaseException:
        if own:
            run.finish(exit_code=1)
        raise


def _artifact_name(job_id: str) -> str:
    # W&B artifact names take letters, digits, '-', '_' and '.'
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in job_id)[:120]
