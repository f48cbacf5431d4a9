"""The dashboard's way to its data: the one REST client (fleetprof.client), and `gather` to run calls at once.

The pages open a client per callback (components.client_for) and read the API's JSON; `ApiClient` is
`fleetprof.client.Client` under the name the pages use, so there is no second HTTP or error layer here.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from fleetprof.client import ApiError, EstimatorUnavailable
from fleetprof.client import Client as ApiClient

__all__ = ["ApiClient", "ApiError", "EstimatorUnavailable", "gather"]

T = TypeVar("T")


def gather(*calls: Callable[[], T]) -> list[T | ApiError]:
    """Run API calls at once (one ApiClient may be shared between threads: httpx pools its connections).
    Results in order; an ApiError is returned in its call's place, any other exception raised."""
    def run(call: Callable[[], T]) -> T | ApiError:
        try:
            return call()
        except ApiError as exc:
            return exc

    if len(calls) == 1:
        return [run(calls[0])]
    with ThreadPoolExecutor(max_workers=len(calls), thread_name_prefix="api") as pool:
        return list(pool.map(run, calls))
