"""GET /api/v1/fleet/summary and /api/v1/fleet/rollups (operators)."""

from __future__ import annotations

import re
import time
from typing import Any, Literal

from fastapi import APIRouter, Query

from fleetprof.api_models import FleetSummary
from server.deps import OperatorAuth, SessionDep
from server.errors import InvalidInput
from server.fleet import service as fleet_service
from server.fleet.schemas import FleetRollups

router = APIRouter(prefix="/api/v1/fleet", tags=["fleet"])

_WINDOW = re.compile(r"^(\d+)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_window(window: str) -> float:
    m = _WINDOW.match(window)
    if not m or int(m.group(1)) == 0:
        raise InvalidInput(f"window {window!r} must look like 30m, 24h or 7d")
    seconds = int(m.group(1)) * _UNIT_S[m.group(2)]
    if seconds > 400 * 86400:
        raise InvalidInput("window longer than 400 days")
    return float(seconds)


@router.get("/summary", response_model=FleetSummary,
            summary="Fleet efficiency over a window: GPU-hours, busy share, idle GPUs, energy, waste")
def fleet_summary(_: OperatorAuth, session: SessionDep,
                  window: str = Query("24h", description="e.g. 30m, 24h, 7d")) -> dict[str, Any]:
    return fleet_service.summary(session, window_s=parse_window(window), now=time.time())


@router.get("/rollups", response_model=FleetRollups,
            summary="Hourly GPU-hours, busy time, utilization, energy and peak memory per GPU, node or team")
def fleet_rollups(_: OperatorAuth, session: SessionDep,
                  by: Literal["gpu", "node", "team"] = Query("gpu", description="one row per hour and this key"),
                  window: str = Query("24h", description="hours starting in the last 30m, 24h, 7d..."),
                  limit: int = Query(5000, ge=1, le=100_000), offset: int = Query(0, ge=0)) -> dict[str, Any]:
    return fleet_service.rollup_rows(session, by=by, window_s=parse_window(window), now=time.time(), limit=limit,
                                     offset=offset)
