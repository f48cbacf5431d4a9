"""Domain errors of the estimator. The API maps every `EstimateError` to HTTP 422 (the message names the problem)."""

from __future__ import annotations


class EstimateError(Exception):
    """A request the estimator cannot answer; `str(error)` is a message meant for the user."""

    kind = "estimate_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UnknownModelError(EstimateError):
    kind = "unknown_model"


class UnknownGpuError(EstimateError):
    kind = "unknown_gpu"


class ModelBuildError(EstimateError):
    """The factory or config was found but building the model raised."""

    kind = "model_build_failed"


class InputMismatchError(EstimateError):
    """The inputs do not fit the model (the forward or backward pass raised)."""

    kind = "input_mismatch"


class AbsurdRequestError(EstimateError):
    """Batch sizes, shapes or memory far beyond any real device."""

    kind = "absurd_request"


class UserStepError(EstimateError):
    """The user's own training step (`--step`, local only) could not be imported, built or called."""

    kind = "user_step_failed"


class EstimateTimeoutError(EstimateError):
    kind = "timeout"


class EstimateCrashError(EstimateError):
    """The worker process died (segfault, out of host memory) before answering."""

    kind = "worker_crashed"


ERROR_KINDS: dict[str, type[EstimateError]] = {
    cls.kind: cls
    for cls in (
        EstimateError, UnknownModelError, UnknownGpuError, ModelBuildError, InputMismatchError,
        AbsurdRequestError, UserStepError, EstimateTimeoutError, EstimateCrashError,
    )
}
