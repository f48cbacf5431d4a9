"""POST /api/v1/estimate: pre-training memory/time/energy estimate.

The model is built and traced in a child process with a time limit (server.estimate.runner), never in the API
process: a factory is user code. Concurrent estimates are bounded; past the bound the answer is 503.
"""

from __future__ import annotations

import threading
from typing import Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool

from server.deps import SchedulerAuth, SettingsDep
from server.errors import InvalidInput, Overloaded
from server.estimate.errors import EstimateError
from server.estimate.runner import run_estimate
from server.estimate.schemas import EstimateRequest, EstimateResponse

router = APIRouter(prefix="/api/v1", tags=["estimate"])

_slots = threading.BoundedSemaphore(2)


@router.post("/estimate", response_model=EstimateResponse, responses={401: {}, 403: {}, 422: {}, 503: {}},
             summary="Before a job runs: peak memory, which GPUs it fits, largest batch, time and energy per step")
async def estimate(request: EstimateRequest, _: SchedulerAuth, settings: SettingsDep,
                   timeout_s: float = Query(60.0, ge=5, le=600, description="time limit for this estimate")
                   ) -> dict[str, Any]:
    if not _slots.acquire(blocking=False):
        raise Overloaded("estimator busy (2 estimates running); retry shortly", retry_after_s=10)
    try:
        return await run_in_threadpool(run_estimate, request, min(timeout_s, settings.estimate_timeout_s))
    except EstimateError as exc:
        kind = getattr(exc, "kind", "invalid")
        raise InvalidInput(f"{kind}: {exc}") from None
    finally:
        _slots.release()
