"""Run an estimate in the sandbox (server.estimate.sandbox): a fresh interpreter with no credentials in its
environment, resource limits, Landlock and a scratch directory of its own; model code never runs in the caller's
process, and a hung, runaway or crashing estimate is killed and reported, never waited on.

    python -m server.estimate.runner  < request.json  > reply.json

reads `{"request": ..., "registered": [...], "limits": {...}, "search_budget_s": ...}` on stdin and writes
`{"ok": true, "result": {...}}` or `{"ok": false, "kind": "...", "message": "..."}` on stdout.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Collection
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from server.estimate.allowlist import check_allowed
from server.estimate.errors import (
    ERROR_KINDS,
    AbsurdRequestError,
    EstimateCrashError,
    EstimateError,
    EstimateTimeoutError,
)
from server.estimate.sandbox import SandboxLimits, child_environment, import_path, lock_down, set_limits
from server.estimate.schemas import EstimateRequest, EstimateResponse

logger = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parents[2]
_SEARCH_SHARE = 0.5  # share of the time limit the max-batch search may use before answering a lower bound


def run_estimate(request: EstimateRequest | dict[str, Any], timeout_s: float = 60.0, *,
                 registered: Collection[str] = (), limits: SandboxLimits | None = None) -> dict[str, Any]:
    """The estimate as a JSON-ready dict (EstimateResponse), computed in the sandbox.

    `registered`: the factories an operator registered (the zoo is always allowed; anything else is refused
    before a worker starts). `limits`: the sandbox's; by default CPU time = the time limit.
    Raises an `EstimateError` subclass: the request's own problem (unknown model, factory raised, inputs
    that do not fit, absurd sizes) or EstimateTimeoutError / EstimateCrashError for the worker.
    """
    if not isinstance(request, EstimateRequest):
        try:
            request = EstimateRequest.model_validate(request)
        except ValidationError as exc:
            raise EstimateError(f"invalid estimate request: {exc}") from exc
    if request.model.factory is not None:
        check_allowed(request.model.factory, registered)  # refused here: no process is started for it
    limits = limits or SandboxLimits(cpu_s=max(1, math.ceil(timeout_s)))
    payload = json.dumps({"request": request.model_dump(mode="json"), "registered": sorted(registered),
                          "limits": dataclasses.asdict(limits), "search_budget_s": timeout_s * _SEARCH_SHARE})
    scratch = Path(tempfile.mkdtemp(prefix="fleetprof-estimate-"))
    try:
        out, err, returncode = _run_child(payload, scratch, timeout_s)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    try:
        reply = json.loads(out.strip().splitlines()[-1]) if out.strip() else None
    except json.JSONDecodeError:
        reply = None
    if not isinstance(reply, dict):
        logger.warning("estimate worker exited %s without a reply; stderr tail: %s", returncode, err[-2000:])
        if returncode == -signal.SIGXCPU:  # RLIMIT_CPU's soft limit (SIGKILL follows one second later)
            raise EstimateTimeoutError(f"the estimate used up its CPU time limit ({limits.cpu_s} s) and was stopped")
        raise EstimateCrashError(f"the estimate worker exited with status {returncode} without an answer "
                                 f"(limits: {limits.describe()})")
    if reply.get("ok"):
        try:  # model code shares the worker's stdout: a reply it forged must not become the API's 500
            return EstimateResponse.model_validate(reply.get("result")).model_dump(mode="json")
        except ValidationError:
            raise EstimateCrashError("the estimate worker's answer was not an estimate") from None
    raise ERROR_KINDS.get(reply.get("kind", ""), EstimateError)(reply.get("message", "estimate failed"))


def _run_child(payload: str, scratch: Path, timeout_s: float) -> tuple[str, str, int]:
    proc = subprocess.Popen(
        [sys.executable, "-s", "-m", "server.estimate.runner", str(scratch)], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=scratch,
        env=child_environment(scratch, import_path(REPO_ROOT)), start_new_session=True,
    )
    try:
        out, err = proc.communicate(payload, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the child's own session: it and anything it started
        proc.communicate()
        raise EstimateTimeoutError(f"the estimate did not finish within {timeout_s:g} s and was stopped") from None
    return out, err, proc.returncode


def _serve_one(scratch: Path) -> int:
    """Child side: one request from stdin, one JSON line on stdout. Limits first, then the trusted imports, then
    the lock-down, then the model (sandbox.py)."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # models print; keep stdout for the reply alone
    real_stdout, sys.stdout = sys.stdout, sys.stderr
    limits = SandboxLimits()
    try:
        message = json.loads(sys.stdin.read())
        limits = SandboxLimits(**message["limits"])
        set_limits(limits)
        request = EstimateRequest.model_validate(message["request"])
        import torch

        from server.estimate.service import estimate

        torch.set_num_threads(1)
        if request.model.hf_config is not None:
            import transformers  # noqa: F401  (trusted, and it reads its own files: before the lock-down)
        logging.getLogger(__name__).info("estimate sandbox: %s", ", ".join(lock_down(scratch)))
        result = estimate(request, search_budget_s=float(message.get("search_budget_s", 30.0)),
                          registered=frozenset(message.get("registered", ())))
        reply: dict[str, Any] = {"ok": True, "result": result.model_dump(mode="json")}
    except EstimateError as exc:
        reply = {"ok": False, "kind": exc.kind, "message": exc.message}
    except ValidationError as exc:
        reply = {"ok": False, "kind": "estimate_error", "message": f"invalid estimate request: {exc}"}
    except MemoryError:
        reply = {"ok": False, "kind": AbsurdRequestError.kind,
                 "message": f"the estimate ran out of memory (limit {limits.memory_bytes / 2**30:g} GiB of address "
                            "space)"}
    except Exception as exc:  # an estimator bug: report it as such, with the type, not a traceback
        logging.getLogger(__name__).exception("estimate failed")
        message = f"internal estimator error: {type(exc).__name__}: {exc}"
        reply = {"ok": False, "kind": "estimate_error", "message": message}
    real_stdout.write(json.dumps(reply) + "\n")
    real_stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(_serve_one(Path(sys.argv[1])))
