"""Who may write what, and which telemetry a job may read: the rules of issue 15 in one place.

- Node binding: an agent token bound to node n writes only for n: its samples, and the jobs that run on n (the
  job's node is n, or the job has a GPU of n). A job an agent names first becomes a job of its node.
- Inventory: nodes and GPUs are created by their node's agent (and by operators, who may say anything); a team
  token never creates either.
- Attaching GPUs to a job: the node's agent (or an operator) may; a team only where that node's agent attributed
  the GPU to one of the team's jobs' processes during the job's window (a `process` link the agent made).
- Reading: a job reads a GPU's samples over its window on that GPU, never over time the agent attributed that GPU
  to another team's job (`clip_window`), unless the job's own processes were on it at the same time (a GPU shared
  at once is both jobs' telemetry). Links an operator or the node's agent registered are taken as they are said.
  A team decides its own job's start and end: what it may not decide is whose GPU time that covers.

Team isolation of job metadata (a team reads and writes only its own team's jobs) is `Principal.can_see_team`.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from sqlalchemy import exists, func, select
from sqlalchemy.orm import Session

from server.auth.service import Principal
from server.errors import Forbidden
from server.models import TERMINAL_STATES, Gpu, Job, JobGpu, Node

# Sources of a job<->GPU link (job_gpus.source): who said the GPU was the job's.
REGISTERED = "registered"  # an operator or the node's agent registered it: taken as said
PROCESS = "process"        # the node's agent saw the job's processes on it (first/last seen: when)
TEAM = "team"              # a team attached it where the agent had attributed it to the team (first/last: when)

_TICK = timedelta(microseconds=1)  # Postgres keeps whole microseconds: the instant just before/after a bound


def link_window(job: Job, link: JobGpu, *, now: datetime) -> tuple[datetime, datetime] | None:
    """The time a GPU's telemetry belongs to a job (both ends included): from the job's start, else when the
    agent first saw it on the GPU, to its end, else when last seen once it ended, else now. None when unknown.
    The one rule for reports and for the per-job/per-team rollups (reports then clip it: `clip_window`)."""
    start = job.started_at or link.first_seen_at
    end = job.ended_at or (link.last_seen_at if job.state in TERMINAL_STATES else now)
    if start is None or end is None:
        return None
    return start, end


def bound_node(principal: Principal) -> str | None:
    """The node an agent token writes for; None for tokens not bound to one node (other scopes, node '*')."""
    if principal.scope == "agent" and principal.node not in (None, "*"):
        return principal.node
    return None


def require_node(principal: Principal, node: str) -> None:
    """Forbidden unless the token may write for `node`."""
    if (bound := bound_node(principal)) is not None and bound != node:
        raise Forbidden(f"this agent token writes for node {bound!r}, not {node!r}")


def may_write_job(session: Session, principal: Principal, job: Job) -> bool:
    """May `principal` write to `job` (events, traces, updates)? Teams: their own team's jobs and jobs nobody
    owns that no agent has seen run (a job an agent observed, a Slurm or Kubernetes job by its id, is some team's
    whose name the agent does not know: letting the first team to name it claim it would hand over its telemetry;
    its node's agent (the Slurm prolog) or an operator says whose it is); agents bound to a node: the jobs running
    there (the job's node, or a GPU of the node)."""
    if principal.scope == "team":
        if job.team is None:
            return not observed_by_agent(session, job)
        if job.team != principal.team:
            return False
    node = bound_node(principal)
    if node is None or job.node_name == node:
        return True
    return bool(session.scalar(select(exists().where(
        JobGpu.job_pk == job.id, JobGpu.gpu_id == Gpu.id, Gpu.node_id == Node.id, Node.name == node))))


def observed_by_agent(session: Session, job: Job) -> bool:
    """Has an agent attributed processes on some GPU to `job`?"""
    return bool(session.scalar(select(exists().where(JobGpu.job_pk == job.id, JobGpu.source == PROCESS))))


def may_create_inventory(principal: Principal, node: str) -> bool:
    """Nodes and GPUs are the agents' to create (an agent for its own node), and operators'."""
    if principal.scope == "operator":
        return True
    return principal.scope == "agent" and bound_node(principal) in (None, node)


def team_attribution(session: Session, *, principal: Principal, job: Job, node: str,
                     uuids: list[str]) -> dict[str, tuple[int, datetime, datetime]]:
    """uuid -> (gpu id, first, last seen): when `node`'s agent saw processes of jobs of the caller's team on each
    GPU during `job`'s window. Forbidden, naming only what the caller sent, when a GPU has no such attribution or
    does not exist: the same answer either way, so it tells nothing of other teams' GPUs."""
    gpus = dict(session.execute(select(Gpu.uuid, Gpu.id).join(Node, Node.id == Gpu.node_id)
                                .where(Node.name == node, Gpu.uuid.in_(uuids))).tuples().all())
    where = [JobGpu.gpu_id.in_(gpus.values()), JobGpu.source == PROCESS, Job.team == principal.team,
             JobGpu.first_seen_at.is_not(None), JobGpu.last_seen_at.is_not(None)]
    if job.ended_at is not None:
        where.append(JobGpu.first_seen_at <= job.ended_at)
    if job.started_at is not None:
        where.append(JobGpu.last_seen_at >= job.started_at)
    spans: dict[int, tuple[datetime, datetime]] = {gpu_id: (lo, hi) for gpu_id, lo, hi in session.execute(
        select(JobGpu.gpu_id, func.min(JobGpu.first_seen_at), func.max(JobGpu.last_seen_at))
        .join(Job, Job.id == JobGpu.job_pk).where(*where).group_by(JobGpu.gpu_id)).tuples()
        if lo is not None and hi is not None}
    missing = [u for u in uuids if u not in gpus or gpus[u] not in spans]
    if missing:
        raise Forbidden(f"GPU(s) {missing} of node {node!r} were not attributed to processes of team "
                        f"{principal.team!r} by that node's agent during this job: a team may attach only those "
                        f"(an operator may attach any)")
    return {u: (gpus[u], *spans[gpus[u]]) for u in uuids}


def foreign_spans(session: Session, job: Job, gpu_ids: Iterable[int], *,
                  now: datetime) -> dict[int, list[tuple[datetime, datetime]]]:
    """gpu id -> the times those GPUs were other teams' (jobs of another team, or of none when `job` has one):
    when the agent saw their processes there, or their registered windows."""
    rows = session.execute(
        select(JobGpu, Job).join(Job, Job.id == JobGpu.job_pk)
        .where(JobGpu.gpu_id.in_(list(gpu_ids)), JobGpu.job_pk != job.id, Job.team.is_distinct_from(job.team))
    ).tuples().all()
    out: dict[int, list[tuple[datetime, datetime]]] = {}
    for link, other in rows:
        span = ((link.first_seen_at, link.last_seen_at) if link.source != REGISTERED
                else link_window(other, link, now=now))
        if span is not None and span[0] is not None and span[1] is not None:
            out.setdefault(link.gpu_id, []).append((span[0], span[1]))
    return out


def clip_window(window: tuple[datetime, datetime], link: JobGpu,
                foreign: list[tuple[datetime, datetime]]) -> tuple[datetime, datetime] | None:
    """`window` (a job's time on a GPU) without the other teams' time on that GPU; None when nothing is left.

    A `process` link keeps the foreign time within the job's own sighting (a GPU shared at once: its samples are
    both jobs' telemetry) and loses all foreign time before or after the sighting. A `team` link is cut to the
    team's own attributed time and loses every foreign span in it (the span may join several of the team's runs
    around another team's). Registered links are taken as said."""
    if link.source == REGISTERED or link.first_seen_at is None or link.last_seen_at is None:
        return window
    start, end = window
    own_lo, own_hi = link.first_seen_at, link.last_seen_at
    shared_ok = link.source == PROCESS
    if not shared_ok:
        start, end = max(start, own_lo), min(end, own_hi)
    for lo, hi in foreign:
        if shared_ok and lo <= own_hi and hi >= own_lo:
            # Shared at once: both jobs' while both were seen; before or after the job's own sighting, the other's.
            if lo < own_lo:
                start = max(start, own_lo)
            if hi > own_hi:
                end = min(end, own_hi)
            continue
        if hi < own_lo or (not shared_ok and lo <= own_lo):
            start = max(start, hi + _TICK)
        else:
            end = min(end, lo - _TICK)
    return (start, end) if start <= end else None
