"""Right-sizing history: the `rightsizing_inputs` of a job's cached report and of earlier runs of the same job."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from server.analysis import characterize as characterize_mod
from server.lru import LruCache
from server.models import Job, Report

# Cached reports' `rightsizing_inputs`, keyed by what identifies one stored report: (database, job_pk, analyzer
# version, computed_at). The inputs sit inside the report document (~70 KiB for 2 h x 8 GPUs), and Postgres
# decompresses a whole TOASTed JSONB value to read one key: 50 runs of history cost ~7 ms per request that way,
# ~0.1 ms from here. Entries are small (a few hundred bytes plus one peak per hour of the run).
RIGHTSIZING_INPUTS: LruCache[tuple[Any, ...], Mapping[str, Any]] = LruCache(max_entries=50_000)


def rightsizing_history(session: Session, job: Job, *, limit: int,
                        cache: LruCache[tuple[Any, ...], Mapping[str, Any]] = RIGHTSIZING_INPUTS,
                        ) -> list[tuple[str, Mapping[str, Any]]]:
    """(job_id, rightsizing inputs) of this job and earlier runs of the same name and team, oldest first.

    Only the small `rightsizing_inputs` part of each cached report is read, never the samples, and only for the
    reports `cache` does not hold yet: a repeated question costs one query on jobs and report timestamps.
    The inputs are shared between requests: read them, never change them.
    """
    where: tuple[ColumnElement[bool], ...]
    if job.name:
        where = (Job.name == job.name, (Job.team == job.team) if job.team else Job.team.is_(None))
    else:
        where = (Job.id == job.id,)
    return stored_inputs(session, *where, limit=limit, cache=cache)


def fingerprint_inputs(session: Session, fingerprint: str, *, team: str | None, limit: int,
                       cache: LruCache[tuple[Any, ...], Mapping[str, Any]] = RIGHTSIZING_INPUTS,
                       ) -> list[tuple[str, Mapping[str, Any]]]:
    """(job_id, rightsizing inputs) of the runs of one fingerprint with a stored report, newest `limit`, oldest
    first; `team`: only that team's runs (a team-scoped reader's), None: every team's."""
    where = (Job.fingerprint == fingerprint,) + ((Job.team == team,) if team is not None else ())
    return stored_inputs(session, *where, limit=limit, cache=cache)


def fingerprinted_inputs(session: Session, *, team: str | None, limit: int,
                         cache: LruCache[tuple[Any, ...], Mapping[str, Any]] = RIGHTSIZING_INPUTS,
                         ) -> list[tuple[str, Mapping[str, Any]]]:
    """(fingerprint, rightsizing inputs) of the newest `limit` runs of any model with a stored report, oldest
    first; `team` as in `fingerprint_inputs`."""
    where = (Job.fingerprint.is_not(None),) + ((Job.team == team,) if team is not None else ())
    return stored_inputs(session, *where, limit=limit, cache=cache, label=Job.fingerprint)


def reports_version(session: Session) -> tuple[Any, ...]:
    """(database, analyzer version, the oldest and the newest stored report's computed_at): two probes of
    ix_reports_computed_at that tell whether what is derived from many stored reports may have changed. The
    newest moves whenever a report is stored; the oldest when the oldest is removed or the tables are emptied.
    Removing another report moves neither: such derived answers also expire (server/jobs/projection.py)."""
    version = characterize_mod.ANALYZER_VERSION
    oldest, newest = session.execute(select(func.min(Report.computed_at), func.max(Report.computed_at))).one()
    return str(session.get_bind().engine.url), version, oldest, newest


def stored_inputs(session: Session, *where: ColumnElement[bool], limit: int,
                  cache: LruCache[tuple[Any, ...], Mapping[str, Any]] = RIGHTSIZING_INPUTS,
                  label: Any = Job.job_id) -> list[tuple[str, Mapping[str, Any]]]:
    """(label, rightsizing inputs) of the newest `limit` jobs matching `where` that have a report stored at the
    current analyzer version, oldest first (reports are never computed here); `label`: the jobs' column that
    names each run in the answer (its job id unless told)."""
    version = characterize_mod.ANALYZER_VERSION
    stmt = (select(label, Report.job_pk, Report.computed_at)
            .join(Report, (Report.job_pk == Job.id) & (Report.analyzer_version == version))
            .where(*where).order_by(Job.started_at.desc().nulls_last(), Job.id.desc()).limit(limit))
    rows = session.execute(stmt).all()
    database = str(session.get_bind().engine.url)
    keys = [(database, pk, version, computed_at) for _, pk, computed_at in rows]
    found = cache.get_many(keys)
    listed = {k[1]: k for k in keys}
    missing = [k[1] for k in keys if k not in found]
    if missing:
        fetched = session.execute(select(Report.job_pk, Report.computed_at, Report.data["rightsizing_inputs"])
                                  .where(Report.analyzer_version == version, Report.job_pk.in_(missing)))
        for pk, computed_at, data in fetched:
            if isinstance(data, dict):
                inputs: Mapping[str, Any] = MappingProxyType(data)
                cache.put((database, pk, version, computed_at), inputs)
                # A report recomputed between the two reads (a worker characterizing the run as it finishes) is
                # the same run's newer answer: it stands in for the one listed instead of dropping the run.
                found[listed[pk]] = inputs
    return [(job_id, found[k]) for (job_id, _, _), k in zip(rows, keys, strict=True) if k in found][::-1]

