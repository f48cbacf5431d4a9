"""POST /api/v1/estimate: pre-training memory/time/energy estimate.

The request names a Hugging Face config, a factory of the built-in zoo or one an operator registered
(server.estimate.allowlist): anything else is refused (422) before a process starts. The model is built and traced
in the sandbox (server.estimate.runner, server.estimate.sandbox), never in the API process. Concurrent estimates
are bounded; past the bound the answer is 503.
"""

from __future__ import annotations

import threading
from typing import Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool

from server.deps import SchedulerAuth, SessionDep, SettingsDep
from server.errors import InvalidInput, Overloaded
from server.estimate.errors import EstimateError
from server.estimate.registry import registered_factories
from server.estimate.runner import run_estimate
from server.estimate.sandbox import SandboxLimits
from server.estimate.schemas import EstimateRequest, EstimateResponse

router = APIRouter(prefix="/api/v1", tags=["estimate"])

_slots = threading.BoundedSemaphore(2)


@router.post("/estimate", response_model=EstimateResponse, responses={401: {}, 403: {}, 422: {}, 503: {}},
             summary="Before a job runs: peak memory, which GPUs it fits, largest batch, time and energy per step")
async def estimate(request: EstimateRequest, _: SchedulerAuth, settings: SettingsDep, session: SessionDep,
                   timeout_s: float = Query(60.0, ge=5, le=600, description="time limit for this estimate")
                   ) -> dict[str, Any]:
    registered = await run_in_threadpool(registered_factories, session) if request.model.factory else frozenset()
    if not _slots.acquire(blocking=False):
        raise Overloaded("estimator busy (2 estimates running); retry shortly", retry_after_s=10)
    timeout_s = min(timeout_s, settings.estimate_timeout_s)
    limits = SandboxLimits(cpu_s=max(1, round(min(timeout_s, settings.estimate_cpu_s))),
                           memory_bytes=settings.estimate_memory_bytes)
    try:
        return await run_in_threadpool(run_estimate, request, timeout_s, registered=registered, limits=limits)
    except EstimateError as exc:
        kind = getattr(exc, "kind", "invalid")
        raise InvalidInput(f"{kind}: {exc}") from None
    finally:
        _slots.release()
