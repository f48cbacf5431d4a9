"""A worker process's cache of what it last read of each running job, so that the next characterization reads
only what came since.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from server.lru import LruCache
from server.models import Job
from server.models.base import epoch_us, from_epoch

# A running job is characterized again every minute (characterize_running_every_s), and reading its whole history
# each time is what that costs (24 h x 8 GPUs: ~1.4 s of 1.5 s). Each worker process keeps what it last read of a
# running job (per GPU series, and the steps), and the next run reads only the rows from SERIES_OVERLAP_S before
# the end of that read: stragglers up to that late are picked up; later ones only by the final characterization,
# which always reads everything.
SERIES_OVERLAP_S = 600.0


@dataclass(frozen=True)
class _Read:
    value: Any  # GpuSeries | StepSeries
    until: float  # epoch s: the end of the window that was read
    nbytes: int


RUNNING_SERIES: LruCache[tuple[Any, ...], _Read] = LruCache(max_entries=4096, max_weight=256 * 2**20,
                                                           weigh=lambda r: r.nbytes)


def running_key(session: Session, job: Job, *what: Any) -> tuple[Any, ...]:
    """What identifies one job's reads: database, job row (ids are reused after a restore; creation times not)."""
    return (str(session.get_bind().engine.url), job.id, job.created_at, *what)


def since_last_read(key: tuple[Any, ...], until: float, read: Callable[[datetime | None], Any],
                    join: Callable[[Any, int, Any], Any], *, floor_s: float = 0.0) -> Any:
    """`read(None)` reads everything up to `until`, `read(cut)` the rows at or after `cut`; with this process's
    earlier read of `key`, only the latter, joined to the earlier rows before the cut (`join(old, cut_us, new)`).
    The cut is in whole microseconds, as the database stores times, so no row is counted twice."""
    hit = RUNNING_SERIES.get(key)
    if hit is None or hit.value is None or hit.until > until:
        value = read(None)
    else:
        cut_us = epoch_us(max(hit.until - SERIES_OVERLAP_S, floor_s))
        value = join(hit.value, cut_us, read(from_epoch(cut_us / 1e6)))
    RUNNING_SERIES.put(key, _Read(value, until, _weight(value)))
    return value


def _weight(value: Any) -> int:
    """Bytes a cached read holds: its arrays (series), or a row estimate (aggregates)."""
    if value is None:
        return 0
    if isinstance(value, list):
        return 256 * len(value)
    arrays = [v for v in vars(value).values() if isinstance(v, np.ndarray)]
    return sum(a.nbytes for a in (*arrays, *getattr(value, "columns", {}).values()))


def rows_before(ts: np.ndarray, cut_us: int) -> np.ndarray:
    """The rows of an earlier read that the new read (from `cut_us` on) does not read again."""
    return np.rint(ts * 1e6) < cut_us
