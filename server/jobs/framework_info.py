"""The hooks' `framework_info` event on a job: kept in `job.extra["framework"]`, the job's batch size and
fingerprint (`jobs.fingerprint`, indexed) filled.

Batch-size precedence: a batch size the job was registered with (`POST /jobs` `batch_size`, `fleetprof run
--batch-size`) is the job's own word and is kept; otherwise the hooks' reading fills `jobs.batch_size`, and
`extra["batch_size_source"]` says where it came from ("hooks:dataloader", "hooks:forward_input"). Rank 0 speaks
for the job (every rank's event is stored as a job event all the same).
"""

from __future__ import annotations

from typing import Any, Final

from fleetprof.protocol import FrameworkInfoEvent
from server.models import Job

FRAMEWORK_KEY: Final = "framework"
BATCH_SIZE_SOURCE_KEY: Final = "batch_size_source"
HOOKS_PREFIX: Final = "hooks:"


def note_framework_info(job: Job, event: FrameworkInfoEvent) -> None:
    if event.rank != 0:
        return
    extra = dict(job.extra or {})
    fields = event.model_dump(exclude={"kind", "job_id", "rank"}, exclude_none=True)
    # A later event may know less (a field it could not read this time): what was known stays.
    extra[FRAMEWORK_KEY] = {**(extra.get(FRAMEWORK_KEY) or {}), **fields}
    source = extra.get(BATCH_SIZE_SOURCE_KEY)
    filled_by_hooks = isinstance(source, str) and source.startswith(HOOKS_PREFIX)
    if event.batch_size is not None and (job.batch_size is None or filled_by_hooks):
        job.batch_size = event.batch_size
        extra[BATCH_SIZE_SOURCE_KEY] = f"{HOOKS_PREFIX}{event.batch_size_source or 'unknown'}"
    if event.fingerprint is not None:  # the latest rank-0 reading (an optimizer seen later may change it)
        job.fingerprint = event.fingerprint
    job.extra = extra


def framework_of(job: Job) -> dict[str, Any] | None:
    """The latest framework_info fields of the job, with where its batch size came from; None without hooks."""
    extra = job.extra or {}
    info = extra.get(FRAMEWORK_KEY)
    if not isinstance(info, dict) and job.batch_size is None:
        return None
    out = dict(info) if isinstance(info, dict) else {}
    source = extra.get(BATCH_SIZE_SOURCE_KEY)
    out["job_batch_size_source"] = (source if isinstance(source, str) else
                                    "registered" if job.batch_size is not None else None)
    return out
