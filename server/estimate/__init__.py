"""Pre-training estimate: memory (meta-device trace + CUDA caching-allocator simulation + calibration),
fit and max batch per GPU type, roofline time and energy. Nothing heavy at import: torch loads in the worker.

Entry points: `run_estimate(request, timeout_s, registered=...)` (the sandbox: server.estimate.sandbox; only
Hugging Face configs, the zoo and registered factories: server.estimate.allowlist), `EstimateRequest`,
`EstimateError` and its subclasses (map to HTTP 422).
"""

from server.estimate.errors import EstimateError
from server.estimate.runner import run_estimate
from server.estimate.schemas import EstimateRequest, EstimateResponse

__all__ = ["EstimateError", "EstimateRequest", "EstimateResponse", "run_estimate"]
