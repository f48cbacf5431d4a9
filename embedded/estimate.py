"""`fleetprof estimate`: the client command (fleetprof/commands/estimate.py) with the server's estimator for
`--local`, run in this process on the user's own code."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from pydantic import ValidationError

from fleetprof.commands import estimate as command
from fleetprof.errors import CliError

add_arguments = command.add_arguments


def estimate_locally(req: dict[str, Any], timeout_s: float, step: str | None = None) -> dict[str, Any]:
    """The estimator in this process: the user's own machine and code, so the factory named is the one allowed,
    and `step` ('module:function', server.estimate.user_step) may replace the canned training step."""
    try:
        # heavy and optional (torch): only for --local; the estimator imports neither FastAPI nor SQLAlchemy
        from server.estimate.errors import EstimateError
        from server.estimate.schemas import EstimateRequest
        from server.estimate.service import estimate
        from server.estimate.user_step import load_user_step
    except ImportError as exc:
        raise CliError(f"--local needs PyTorch and the estimator (pip install 'fleetprof[estimate]'): {exc}") from None

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: the user's modules beside them
    try:
        request = EstimateRequest.model_validate(req)
        factory = request.model.factory
        user_step = load_user_step(step) if step else None
        result = estimate(request, search_budget_s=timeout_s / 2, registered=(factory,) if factory else (),
                          user_step=user_step)
    except ValidationError as exc:
        raise CliError(f"invalid estimate request: {exc}") from None
    except EstimateError as exc:
        raise CliError(f"{exc.kind}: {exc}") from None
    return result.model_dump(mode="json")


def explain_locally(req: dict[str, Any]) -> str:
    """`--local --explain`: where the estimate and a real CPU step part ways (server/estimate/explain.py)."""
    try:
        from server.estimate.errors import EstimateError
        from server.estimate.explain import explain_request
        from server.estimate.schemas import EstimateRequest
    except ImportError as exc:
        raise CliError(f"--explain needs PyTorch and the estimator (the 'estimate' extra): {exc}") from None

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        request = EstimateRequest.model_validate(req)
        factory = request.model.factory
        return explain_request(request, registered=(factory,) if factory else ()).format() + "\n"
    except ValidationError as exc:
        raise CliError(f"invalid estimate request: {exc}") from None
    except EstimateError as exc:
        raise CliError(f"{exc.kind}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    return command.run(args, local=estimate_locally, explain=explain_locally)
