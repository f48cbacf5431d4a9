"""Run an estimate in a child process with a time limit: user code (model factories) never runs in the
caller's process, and a hung or crashing estimate is killed and reported, never waited on.

    python -m server.estimate.runner  < request.json  > reply.json

reads one request as JSON on stdin and writes `{"ok": true, "result": {...}}` or
`{"ok": false, "kind": "...", "message": "..."}` on stdout.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from server.estimate.errors import ERROR_KINDS, EstimateCrashError, EstimateError, EstimateTimeoutError
from server.estimate.schemas import EstimateRequest

logger = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parents[2]
_SEARCH_SHARE = 0.5  # share of the time limit the max-batch search may use before answering a lower bound


def run_estimate(request: EstimateRequest | dict[str, Any], timeout_s: float = 60.0) -> dict[str, Any]:
    """The estimate as a JSON-ready dict (EstimateResponse), computed in a child process.

    Raises an `EstimateError` subclass: the request's own problem (unknown model, factory raised, inputs
    that do not fit, absurd sizes) or EstimateTimeoutError / EstimateCrashError for the worker.
    """
    if not isinstance(request, EstimateRequest):
        try:
            request = EstimateRequest.model_validate(request)
        except ValidationError as exc:
            raise EstimateError(f"invalid estimate request: {exc}") from exc
    payload = json.dumps({"request": request.model_dump(mode="json"), "search_budget_s": timeout_s * _SEARCH_SHARE})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    env.setdefault("OMP_NUM_THREADS", "1")  # the meta trace does no arithmetic
    proc = subprocess.Popen(
        [sys.executable, "-m", "server.estimate.runner"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT, start_new_session=True,
    )
    try:
        out, err = proc.communicate(payload, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the child's own session: it and anything it started
        proc.communicate()
        raise EstimateTimeoutError(f"the estimate did not finish within {timeout_s:g} s and was stopped") from None
    try:
        reply = json.loads(out.strip().splitlines()[-1]) if out.strip() else None
    except json.JSONDecodeError:
        reply = None
    if not isinstance(reply, dict):
        logger.warning("estimate worker exited %s without a reply; stderr tail: %s", proc.returncode, err[-2000:])
        raise EstimateCrashError(f"the estimate worker exited with status {proc.returncode} without an answer")
    if reply.get("ok"):
        return reply["result"]
    raise ERROR_KINDS.get(reply.get("kind", ""), EstimateError)(reply.get("message", "estimate failed"))


def _serve_one() -> int:
    """Child side: one request from stdin, one JSON line on stdout."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # models print; keep stdout for the reply alone
    real_stdout, sys.stdout = sys.stdout, sys.stderr
    try:
        message = json.loads(sys.stdin.read())
        from server.estimate.service import estimate

        request = EstimateRequest.model_validate(message["request"])
        result = estimate(request, search_budget_s=float(message.get("search_budget_s", 30.0)))
        reply: dict[str, Any] = {"ok": True, "result": result.model_dump(mode="json")}
    except EstimateError as exc:
        reply = {"ok": False, "kind": exc.kind, "message": exc.message}
    except ValidationError as exc:
        reply = {"ok": False, "kind": "estimate_error", "message": f"invalid estimate request: {exc}"}
    except MemoryError:
        reply = {"ok": False, "kind": "absurd_request", "message": "the estimate ran out of host memory"}
    except Exception as exc:  # an estimator bug: report it as such, with the type, not a traceback
        logging.getLogger(__name__).exception("estimate failed")
        message = f"internal estimator error: {type(exc).__name__}: {exc}"
        reply = {"ok": False, "kind": "estimate_error", "message": message}
    real_stdout.write(json.dumps(reply) + "\n")
    real_stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(_serve_one())
