"""Jobs nobody reports the end of: ended by the server once the agents no longer see them.

A job the agents attributed GPU processes to (Slurm's SLURM_JOB_ID, a Kubernetes pod, FLEETPROF_JOB_ID) and
whose end nobody registered (a pod ends without telling anyone; a node or `fleetprof run` killed with -9) would
stay "running" for ever, and keep claiming every later sample of its GPUs. Each GPU link's `last_seen_at` is the
latest process row of the job on that GPU (server.ingest.service); once the latest of them is older than
`job_unseen_timeout_s`, the sweep ends the job *at that time*, state "lost", with the reason in
`extra["end_reason"]`. Its job<->GPU windows end there too (server.auth.policy.link_window ends at the job's end), so
later samples of those GPUs are not the job's, and the characterization sweep gives it its final report.

The server may be wrong (an agent cut off for longer than the timeout, a job off its GPUs that long): a lost job
whose processes are seen again after its end runs again (`reopen_if_seen`), and a scheduler's own end (the Slurm
epilog) replaces the server's guess.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from server.jobs.service import END_REASON, LOST
from server.models import Job, JobGpu
from server.models.base import utcnow

log = logging.getLogger(__name__)

ACTIVE_STATES = ("pending", "running")


def _last_seen(session: Session, job_pks: list[int] | None = None) -> list[tuple[int, datetime, datetime]]:
    """(job pk, latest sighting of its processes, that or its start if later) of the active jobs the agents
    attributed processes to: a job (re)started after its last sighting has its whole timeout from its start."""
    stmt = (select(Job.id, func.max(JobGpu.last_seen_at), func.max(Job.started_at))
            .join(JobGpu, JobGpu.job_pk == Job.id)
            .where(Job.state.in_(ACTIVE_STATES), JobGpu.last_seen_at.is_not(None)).group_by(Job.id))
    if job_pks is not None:
        stmt = stmt.where(Job.id.in_(job_pks))
    return [(pk, seen, max(seen, started) if started is not None else seen)
            for pk, seen, started in session.execute(stmt) if seen is not None]


def end_unseen_jobs(session: Session, *, timeout_s: float, now: datetime | None = None) -> list[int]:
    """End (state "lost", at their last sighting) the active jobs not seen for `timeout_s`; their pks.
    `timeout_s` <= 0 ends none."""
    if timeout_s <= 0:
        return []
    now = now or utcnow()
    cutoff = now - timedelta(seconds=timeout_s)
    stale = [pk for pk, _, since in _last_seen(session) if since < cutoff]
    ended = []
    for pk in stale:
        job = session.scalars(select(Job).where(Job.id == pk).with_for_update()).first()
        # Read again under the row lock: a batch committed since the first read may have seen the job.
        again = _last_seen(session, [pk])
        if job is None or job.state not in ACTIVE_STATES or not again or again[0][2] >= cutoff:
            continue
        last_seen = again[0][1]
        job.state = LOST
        job.ended_at = max(last_seen, job.started_at) if job.started_at else last_seen
        job.extra = {**(job.extra or {}), END_REASON: (
            f"no process of this job seen on its GPUs since {last_seen:%Y-%m-%d %H:%M:%S} UTC "
            f"(timeout {timeout_s:.0f} s): ended by the server; how it ended is unknown")}
        ended.append(pk)
        log.info("job %s not seen since %s: ended as lost", job.job_id, last_seen.isoformat())
    session.flush()
    return ended


def reopen_if_seen(job: Job, seen_at: datetime) -> bool:
    """A lost job whose processes were seen after the end the server gave it runs again; True when it did."""
    if job.state != LOST or job.ended_at is None or seen_at <= job.ended_at:
        return False
    job.state = "running"
    job.ended_at = None
    job.extra = {k: v for k, v in (job.extra or {}).items() if k != END_REASON}
    log.info("job %s seen again at %s: running again", job.job_id, seen_at.isoformat())
    return True
