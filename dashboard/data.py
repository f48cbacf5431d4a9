"""The API's JSON read into the typed models the pages use, once, at the edge (the client hands back plain dicts).

An answer that does not fit its model (a server of another version, a proxy's error page) becomes an `ApiError`,
shown like any failed call, instead of a page that breaks on a missing key halfway through.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from dashboard.client import ApiError
from fleetprof.api_models import CandidateGpu, FleetSummary, JobList, JobRead
from fleetprof.report import JobReport

M = TypeVar("M", bound=BaseModel)
# Not an HTTP status the API sends: the call succeeded, its answer is not what this dashboard reads.
UNEXPECTED_ANSWER = 502


_CANDIDATES: TypeAdapter[list[CandidateGpu]] = TypeAdapter(list[CandidateGpu])


def parse(model: type[M], doc: Any, what: str) -> M:
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "answer"
        raise ApiError(UNEXPECTED_ANSWER, f"the API's {what} is not what this dashboard reads "
                                          f"({exc.error_count()} problem(s); {where}: {first['msg']})") from exc


def job_report(doc: Any) -> JobReport:
    return parse(JobReport, doc, "job report")


def job_record(doc: Any) -> JobRead:
    return parse(JobRead, doc, "job")


def job_list(doc: Any) -> JobList:
    return parse(JobList, doc, "job list")


def fleet_summary(doc: Any) -> FleetSummary:
    return parse(FleetSummary, doc, "fleet summary")


def other_gpu_types(doc: Any) -> tuple[list[CandidateGpu], str | None]:
    """A right-sizing answer's `projections[]` (the job on each other catalogue GPU type) and
    `projection_unavailable` (why there are none)."""
    if not isinstance(doc, dict):
        raise ApiError(UNEXPECTED_ANSWER, "the API's right-sizing is not what this dashboard reads (not an object)")
    try:
        candidates = _CANDIDATES.validate_python(doc.get("projections") or [])
    except ValidationError as exc:
        raise ApiError(UNEXPECTED_ANSWER, f"the API's right-sizing projections are not what this dashboard reads "
                                          f"({exc.error_count()} problem(s))") from exc
    unavailable = doc.get("projection_unavailable")
    return candidates, unavailable if isinstance(unavailable, str) else None
