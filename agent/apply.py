"""`fleetprof run --apply REF`: turn a previous run's recommendations into the next run's settings.

Pure: `plan_apply` takes the recommendations of the report (or of GET /rightsizing?name=REF) and the command, and
returns the environment to add, the command with the batch size argument set, and what was applied, in the shape the
job's metadata records (`applied: [{kind, summary, predicted_saving, from_job}]`) and the compare view reads back.
Only what a launcher can set is applied: PYTORCH_CUDA_ALLOC_CONF (allocator_settings) and the batch size, where the
user names the argument (`--batch-size-arg`) or the environment variable (`--batch-size-env`) the script reads it
from. Everything else is listed as skipped with the reason, never silently dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ALLOCATOR_KIND = "allocator_settings"
# kind -> the evidence key holding the batch size to use (server.analysis.fleet.batch_sizing, planning.fit_advice)
BATCH_KINDS = {"batch_size": "max_batch_size", "batch_size_fit": "largest_batch"}


@dataclass(frozen=True)
class Applied:
    kind: str
    summary: str
    predicted_saving: dict[str, Any] | None  # the recommendation's `saving`, units in its keys; None: not known
    from_job: str
    setting: str  # what was set, e.g. "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" or "--batch-size 64"

    def as_metadata(self) -> dict[str, Any]:
        return {"kind": self.kind, "summary": self.summary, "predicted_saving": self.predicted_saving,
                "from_job": self.from_job, "setting": self.setting}


@dataclass(frozen=True)
class ApplyPlan:
    env: dict[str, str]
    command: list[str]
    batch_size: int | None  # the batch size set, recorded as the job's own; None: unchanged
    applied: list[Applied]
    skipped: list[str] = field(default_factory=list)  # "<kind>: <why>"


def set_cli_arg(command: Sequence[str], flag: str, value: str) -> list[str]:
    """`command` with `flag value` (or `flag=value`) replaced by the new value, or appended when absent."""
    out = list(command)
    for i, arg in enumerate(out):
        if arg == flag and i + 1 < len(out):
            out[i + 1] = value
            return out
        if arg.startswith(flag + "="):
            out[i] = f"{flag}={value}"
            return out
    return [*out, flag, value]


def _env_pair(evidence: Mapping[str, Any]) -> tuple[str, str] | None:
    line = evidence.get("env")
    if not isinstance(line, str) or "=" not in line:
        return None
    name, _, value = line.partition("=")
    return (name, value) if name and value else None


def plan_apply(recommendations: Sequence[Mapping[str, Any]], command: Sequence[str], *, from_job: str,
               batch_size_arg: str | None = None, batch_size_env: str | None = None) -> ApplyPlan:
    env: dict[str, str] = {}
    argv = list(command)
    batch: int | None = None
    applied: list[Applied] = []
    skipped: list[str] = []
    for rec in recommendations:
        kind = str(rec.get("kind"))
        evidence = rec.get("evidence") or {}
        saving = rec.get("saving")
        summary = str(rec.get("summary", ""))
        if kind == ALLOCATOR_KIND:
            pair = _env_pair(evidence)
            if pair is None:
                skipped.append(f"{kind}: no environment setting in its evidence")
                continue
            env[pair[0]] = pair[1]
            applied.append(Applied(kind, summary, saving, from_job, f"{pair[0]}={pair[1]}"))
        elif kind in BATCH_KINDS:
            value = evidence.get(BATCH_KINDS[kind])
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                skipped.append(f"{kind}: no batch size to set")
            elif batch is not None:
                skipped.append(f"{kind}: a batch size ({batch}) is already set")
            elif batch_size_arg is None and batch_size_env is None:
                skipped.append(f"{kind}: name where the script reads its batch size (--batch-size-arg FLAG or "
                               "--batch-size-env VAR)")
            else:
                batch = value
                settings = []
                if batch_size_arg is not None:
                    argv = set_cli_arg(argv, batch_size_arg, str(value))
                    settings.append(f"{batch_size_arg} {value}")
                if batch_size_env is not None:
                    env[batch_size_env] = str(value)
                    settings.append(f"{batch_size_env}={value}")
                applied.append(Applied(kind, summary, saving, from_job, ", ".join(settings)))
        else:
            skipped.append(f"{kind}: not something a launcher can set")
    return ApplyPlan(env=env, command=argv, batch_size=batch, applied=applied, skipped=skipped)
