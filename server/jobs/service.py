"""Jobs: registration and updates, lifecycle, visibility rules (a team sees only its own jobs)."""

from __future__ import annotations

import time
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fleetprof.api_models import JobRead
from server.auth import policy
from server.auth.service import Principal
from server.db import dialect_insert
from server.errors import Forbidden, InvalidInput, NotFound
from server.jobs.framework_info import BATCH_SIZE_SOURCE_KEY
from server.jobs.schemas import JobCreate
from server.models import TERMINAL_STATES, Gpu, Job, JobGpu
from server.models.base import from_epoch, to_epoch, utcnow
from server.nodes.service import ensure_gpus

# The key in `Job.extra` that says why the server ended a job (server.jobs.unseen); JobRead.end_reason.
END_REASON = "end_reason"
LOST = "lost"


def _not_found(job_id: str) -> NotFound:
    # The same answer whether the job does not exist or belongs to another team: no existence oracle.
    return NotFound(f"job {job_id!r} not found")


def find_job(session: Session, job_id: str) -> Job | None:
    return session.scalars(select(Job).where(Job.job_id == job_id)).first()


def _create_job(session: Session, job_id: str, **values: object) -> tuple[Job, bool]:
    """The job `job_id`, inserted with `values` unless it exists; (job, created).

    Two requests may create the same job at once (an agent registering it while the hooks upload a trace):
    ON CONFLICT DO NOTHING makes the second wait for the first's commit and then take its row, where a plain
    INSERT would fail on the unique job_id."""
    insert = dialect_insert(session)(Job).values(job_id=job_id, extra={}, **values)
    new_pk = session.execute(insert.on_conflict_do_nothing(index_elements=[Job.job_id]).returning(Job.id)).scalar()
    job = find_job(session, job_id)
    assert job is not None  # inserted now, or committed by the request that won
    return job, new_pk is not None


def get_visible_job(session: Session, *, job_id: str, principal: Principal) -> Job:
    job = find_job(session, job_id)
    if job is None or not principal.can_see_team(job.team):
        raise _not_found(job_id)
    return job


def latest_visible_run(session: Session, *, name: str, team: str | None, principal: Principal) -> Job:
    """The latest run of recurring job `name` (of `team`; a team token: of its own team only). NotFound when the
    caller sees none: another team's runs are indistinguishable from none."""
    if principal.scope == "team":
        if team not in (None, principal.team):
            raise NotFound(f"no runs of that name in team {team!r} visible to this token")
        team = principal.team
    stmt = select(Job).where(Job.name == name).order_by(Job.started_at.desc().nulls_last(), Job.id.desc()).limit(1)
    if team is not None:
        stmt = stmt.where(Job.team == team)
    job = session.scalars(stmt).first()
    if job is None or not principal.can_see_team(job.team):
        # The name is not echoed: a refusal carries nothing of what the caller may not see (nor its own query).
        raise NotFound("no runs of that name" + (f" in team {team!r}" if team else "") + " visible to this token")
    return job


def get_visible_jobs(session: Session, *, job_ids: list[str], principal: Principal) -> list[Job]:
    """The jobs in the order asked; NotFound naming every id that does not exist or is another team's (the
    single-job rule: the two are indistinguishable)."""
    found = {j.job_id: j for j in session.scalars(select(Job).where(Job.job_id.in_(job_ids)))}
    missing = [i for i in job_ids if i not in found or not principal.can_see_team(found[i].team)]
    if len(missing) == 1:
        raise _not_found(missing[0])
    if missing:
        raise NotFound(f"jobs {', '.join(repr(i) for i in missing)} not found")
    return [found[i] for i in job_ids]


def get_writable_job(session: Session, *, job_id: str, principal: Principal) -> Job:
    """The job a framework-event or trace writer may write to (server.auth.policy.may_write_job); created
    (running, of the writer's team or node) if it does not exist yet."""
    job = find_job(session, job_id)
    if job is None:
        job, created = _create_job(session, job_id, team=principal.team if principal.scope == "team" else None,
                                   node_name=policy.bound_node(principal), state="running", started_at=utcnow())
        if created:
            return job
    if not policy.may_write_job(session, principal, job):
        raise _not_found(job_id)
    return job


def get_or_create_observed(session: Session, *, job_id: str, node: str, seen_at: float) -> Job:
    """A job first seen by an agent through a process's environment (e.g. a Slurm job nobody registered)."""
    job = find_job(session, job_id)
    if job is None:
        job, _ = _create_job(session, job_id, state="running", node_name=node, started_at=from_epoch(seen_at))
    return job


def mark_started(job: Job, *, ts: float, host: str | None = None, framework: str | None = None) -> None:
    if job.state == "pending":
        job.state = "running"
    if job.started_at is None or from_epoch(ts) < job.started_at:
        job.started_at = from_epoch(ts)
    job.host = job.host or host
    job.framework = job.framework or framework


def end_state(job: Job, state: str) -> str:
    """The state a job ends in: a failure is an out-of-memory one when the hooks reported one (an exit status, the
    Slurm epilog's or the hooks' own, cannot tell)."""
    return "oom" if state == "failed" and (job.extra or {}).get("oom_seen") else state


def mark_ended(job: Job, *, ts: float, exit_code: int | None, state: str | None) -> bool:
    """Record the end; True when the job became terminal now (characterize it)."""
    was_terminal = job.state in TERMINAL_STATES
    job.state = end_state(job, state if state is not None else "finished" if exit_code == 0 else "failed")
    job.exit_code = exit_code if exit_code is not None else job.exit_code
    job.ended_at = from_epoch(ts)
    return not was_terminal


def _authorise_update(session: Session, job: Job, data: JobCreate, *, principal: Principal,
                      team: str | None) -> None:
    """May `principal` update the existing `job` with `data`? Moves it to `team` where that is allowed."""
    if not policy.may_write_job(session, principal, job):
        # Another team's job, or (a node's agent) a job of another node: as if it did not exist.
        raise _not_found(data.job_id)
    if team is not None and team != job.team:
        # Moving an owned job to another team would hand its data over: operators only (agents may claim
        # a job nobody owns yet, as `fleetprof replay` does).
        if job.team is not None and principal.scope != "operator":
            raise Forbidden(f"job {data.job_id!r} already belongs to a team; only an operator can move it")
        job.team = team


def upsert_job(session: Session, data: JobCreate, *, principal: Principal) -> tuple[Job, bool]:
    """Register or update; returns (job, became_terminal)."""
    team = data.team
    if principal.scope == "team":
        if team is not None and team != principal.team:
            raise Forbidden(f"a token of team {principal.team!r} cannot register jobs for team {team!r}")
        team = principal.team
    if data.node is not None:
        policy.require_node(principal, data.node)
    job = find_job(session, data.job_id)
    if job is None:
        job, created = _create_job(session, data.job_id, team=team, state="pending",
                                   node_name=policy.bound_node(principal))
        if not created:  # a concurrent request registered it first: this is an update after all
            _authorise_update(session, job, data, principal=principal, team=team)
    else:
        _authorise_update(session, job, data, principal=principal, team=team)
    # A job the server ended (lost) that its scheduler now reports ended becomes terminal again, in its own words;
    # reported running again, it has no end (the server's guess was wrong).
    was_lost = job.state == LOST
    was_terminal = job.state in TERMINAL_STATES and not was_lost
    if was_lost and data.state in ("pending", "running") and data.ended_at is None:
        job.ended_at = None
    for attr, value in (("name", data.name), ("command", data.command), ("framework", data.framework),
                        ("host", data.host), ("user_name", data.user), ("node_name", data.node),
                        ("batch_size", data.batch_size), ("gpu_type_requested", data.gpu_type_requested),
                        ("gpus_requested", data.gpus_requested), ("exit_code", data.exit_code)):
        if value is not None:
            setattr(job, attr, value)
    if data.started_at is not None:
        job.started_at = from_epoch(data.started_at)
    if data.ended_at is not None:
        job.ended_at = from_epoch(data.ended_at)
    if data.state is not None:
        job.state = end_state(job, data.state)
        if data.state == "running" and job.started_at is None:
            job.started_at = utcnow()
        if data.state in TERMINAL_STATES and job.ended_at is None:
            job.ended_at = utcnow()
    if job.started_at and job.ended_at and job.ended_at < job.started_at:
        raise InvalidInput("ended_at is before started_at")
    extra = dict(job.extra or {})
    if data.state is not None and data.state != LOST:
        extra.pop(END_REASON, None)
    if data.metadata:
        extra.update(data.metadata)
    if data.batch_size is not None and not (data.metadata or {}).get(BATCH_SIZE_SOURCE_KEY):
        # registered: the job's own word, which the hooks' reading never replaces
        extra.pop(BATCH_SIZE_SOURCE_KEY, None)
    if data.cuda_visible_devices is not None:
        extra["cuda_visible_devices"] = data.cuda_visible_devices
    job.extra = extra
    session.flush()
    if data.gpu_uuids:
        if not data.node:
            raise InvalidInput("gpu_uuids needs `node`: GPU UUIDs are resolved per node")
        _attach_gpus(session, job, node=data.node, uuids=data.gpu_uuids, principal=principal)
    return job, (job.state in TERMINAL_STATES and not was_terminal)


def _attach_gpus(session: Session, job: Job, *, node: str, uuids: list[str], principal: Principal) -> None:
    """Bind GPUs of `node` to `job` as server.auth.policy allows: the node's agent or an operator registers them
    (creating GPUs its agent has not reported yet); a team only those the agent attributed to the team."""
    links = {link.gpu_id: link for link in session.scalars(select(JobGpu).where(JobGpu.job_pk == job.id))}
    if policy.may_create_inventory(principal, node):
        for gpu_id in ensure_gpus(session, node=node, uuids=uuids).values():
            link = links.get(gpu_id)
            if link is None:
                session.add(JobGpu(job_pk=job.id, gpu_id=gpu_id, source=policy.REGISTERED))
            else:
                link.source = policy.REGISTERED
                link.first_seen_at = None  # the job's start; last_seen_at still says when its processes were seen
    else:
        for gpu_id, first, last in policy.team_attribution(session, principal=principal, job=job, node=node,
                                                           uuids=uuids).values():
            link = links.get(gpu_id)
            if link is None:
                session.add(JobGpu(job_pk=job.id, gpu_id=gpu_id, source=policy.TEAM, first_seen_at=first,
                                   last_seen_at=last))
            elif link.source == policy.TEAM:
                link.first_seen_at, link.last_seen_at = first, last
            # else the agent's (process) or an operator's (registered) word stands
    session.flush()


def gpu_uuids_of(session: Session, job_pks: list[int]) -> dict[int, list[str]]:
    rows = session.execute(
        select(JobGpu.job_pk, Gpu.uuid).join(Gpu, Gpu.id == JobGpu.gpu_id).where(JobGpu.job_pk.in_(job_pks))
        .order_by(Gpu.index)
    ).all()
    out: dict[int, list[str]] = {pk: [] for pk in job_pks}
    for pk, uuid in rows:
        out[pk].append(uuid)
    return out


def to_read(job: Job, gpu_uuids: list[str], *, now: float | None = None) -> JobRead:
    started, ended = to_epoch(job.started_at), to_epoch(job.ended_at)
    end_or_now = ended if ended is not None else (now if now is not None else time.time())
    return JobRead(
        job_id=job.job_id, team=job.team, name=job.name, command=job.command, framework=job.framework,
        host=job.host, user=job.user_name, node=job.node_name, state=job.state, batch_size=job.batch_size,
        gpu_type_requested=job.gpu_type_requested, gpus_requested=job.gpus_requested, exit_code=job.exit_code,
        created_at=job.created_at.timestamp(), updated_at=job.updated_at.timestamp(), started_at=started,
        ended_at=ended, duration_s=None if started is None else max(0.0, end_or_now - started),
        gpu_uuids=gpu_uuids, metadata=job.extra or {}, end_reason=(job.extra or {}).get(END_REASON),
        fingerprint=job.fingerprint,
    )


def list_jobs(session: Session, *, principal: Principal, team: str | None, state: str | None,
              since: datetime | None, until: datetime | None, q: str | None, limit: int,
              offset: int, fingerprint: str | None = None) -> tuple[list[Job], int]:
    stmt = select(Job)
    if fingerprint is not None:
        stmt = stmt.where(Job.fingerprint == fingerprint)
    if principal.scope == "team":
        if team is not None and team != principal.team:
            return [], 0
        stmt = stmt.where(Job.team == principal.team)
    elif team is not None:
        stmt = stmt.where(Job.team == team)
    if state is not None:
        stmt = stmt.where(Job.state == state)
    # A job overlaps [since, until] when it started before `until` and had not ended by `since`.
    if since is not None:
        stmt = stmt.where((Job.ended_at.is_(None)) | (Job.ended_at >= since))
    if until is not None:
        stmt = stmt.where((Job.started_at.is_(None)) | (Job.started_at <= until))
    if q:
        # `_` and `%` are LIKE wildcards: matched as themselves (`slurm:123_4` is an array task's id)
        like = "%" + q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        stmt = stmt.where(Job.job_id.ilike(like, escape="\\") | Job.name.ilike(like, escape="\\"))
    total = session.scalar(select(func.count()).select_from(stmt.subquery())) or 0
    rows = session.scalars(stmt.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit).offset(offset)).all()
    return list(rows), total
