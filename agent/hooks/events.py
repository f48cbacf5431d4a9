"""The hooks' events as the wire protocol's dicts: the fields every event carries, job start and OOM."""

from __future__ import annotations

import operator
import os
import re
import socket
from collections.abc import Callable
from typing import Any


class EventFactory:
    """Builds events for one job; the rank is read from torch.distributed once it is initialized.

    Another framework's hooks (Keras, JAX) pass `torch=None`, their `framework` and `device` strings and the rank
    they know (it is then fixed).
    """

    def __init__(self, torch: Any, job_id: str, clock: Callable[[], float], *, framework: str | None = None,
                 device: str | None = None, rank: int = 0):
        self._torch = torch
        self.job_id = job_id
        self._clock = clock
        self._framework = framework
        self._device = device
        self.rank = rank
        self._rank_known = False
        self._dist_initialized: Callable[[], bool] | None = None  # torch.distributed.is_initialized, once available
        self._dist_checked = False

    def update_rank(self) -> int:
        """The rank, read from torch.distributed until it is initialized (then fixed): once per event."""
        if not self._rank_known and self._torch is not None:
            if not self._dist_checked:
                self._dist_checked = True
                dist = self._torch.distributed
                if dist.is_available():
                    self._dist_initialized = dist.is_initialized
            if self._dist_initialized is not None and self._dist_initialized():
                self.rank = int(self._torch.distributed.get_rank())
                self._rank_known = True
        return self.rank

    def base(self, kind: str) -> dict[str, Any]:
        return {"kind": kind, "job_id": self.job_id, "ts": self._clock(), "rank": self.update_rank()}

    def step(self, step: int, samples: int | None) -> dict[str, Any]:
        """A step event's common fields (the Profiler adds wall_s, device_s and the memory fields)."""
        return {"kind": "step", "job_id": self.job_id, "ts": self._clock(), "rank": self.update_rank(), "step": step,
                "samples": samples}

    def job_start(self) -> dict[str, Any]:
        ev = self.base("job_start")
        framework = self._framework or f"pytorch {self._torch.__version__}"
        ev.update(host=socket.gethostname(), pid=os.getpid(), framework=framework,
                  device=self._device or _device_name(self._torch))
        return ev

    def oom(self, exc: BaseException) -> dict[str, Any]:
        ev = self.base("oom")
        msg = str(exc)
        ev.update(message=msg[:4000], requested_bytes=parse_requested_bytes(msg))
        return ev


_ALLOC_RE = re.compile(r"Tried to allocate ([0-9.]+) ?(bytes|B|KiB|MiB|GiB|TiB)")
_UNITS = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def parse_requested_bytes(message: str) -> int | None:
    """'CUDA out of memory. Tried to allocate 20.00 MiB ...' -> 20971520 (rounded as printed)."""
    m = _ALLOC_RE.search(message)
    return int(float(m.group(1)) * _UNITS[m.group(2)]) if m else None


def _device_name(torch: Any) -> str:
    if torch.cuda.is_initialized():
        return f"cuda:{torch.cuda.current_device()}"
    return "cuda" if torch.cuda.is_available() else "cpu"


def sample_count(value: Any) -> int | None:
    """A caller's `step(samples=...)` as a plain int (numpy and torch integers too: the wire protocol takes JSON
    integers only and would drop the step's event); anything else (a float, a bool) is unknown."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None
