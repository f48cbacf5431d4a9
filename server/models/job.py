from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from server.models.base import Base, BigId, JsonDoc, UtcDateTime, utcnow

# "lost": ended by the server, not by whoever ran the job: the agent attributed GPU processes to it and has seen
# none for `job_unseen_timeout_s` (server.jobs.unseen; the reason is in `extra["end_reason"]`). Seen again, it runs.
JOB_STATES = ("pending", "running", "finished", "failed", "killed", "oom", "lost")
TERMINAL_STATES = frozenset({"finished", "failed", "killed", "oom", "lost"})


class Job(Base):
    __tablename__ = "jobs"
    # ix_jobs_name_team_started: the runs of one recurring job (right-sizing history) without scanning the team's.
    # ix_jobs_fingerprint: the runs of one model (GET /jobs?fingerprint=, the characterization across configurations).
    # ix_jobs_ended_at: the jobs running or ended since T (fleet summary, headroom, rollup job windows).
    __table_args__ = (Index("ix_jobs_team_started", "team", "started_at"), Index("ix_jobs_state", "state"),
                      Index("ix_jobs_name_team_started", "name", "team", "started_at"),
                      Index("ix_jobs_ended_at", "ended_at"), Index("ix_jobs_fingerprint", "fingerprint"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    # Chosen by users or schedulers; the public identifier in every path.
    job_id: Mapped[str] = mapped_column(String(200), unique=True)
    team: Mapped[str | None] = mapped_column(String(100))
    name: Mapped[str | None] = mapped_column(String(500))
    command: Mapped[str | None] = mapped_column(Text)
    framework: Mapped[str | None] = mapped_column(String(100))
    host: Mapped[str | None] = mapped_column(String(255))
    user_name: Mapped[str | None] = mapped_column(String(100))
    node_name: Mapped[str | None] = mapped_column(String(200))
    state: Mapped[str] = mapped_column(String(16), default="pending")
    batch_size: Mapped[int | None] = mapped_column(Integer)
    gpu_type_requested: Mapped[str | None] = mapped_column(String(100))
    gpus_requested: Mapped[int | None] = mapped_column(Integer)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    extra: Mapped[dict[str, Any]] = mapped_column(JsonDoc, default=dict)
    # The model's fingerprint (fleetprof/fingerprint.py), from the hooks' framework_info event; null without one.
    fingerprint: Mapped[str | None] = mapped_column(String(64))
