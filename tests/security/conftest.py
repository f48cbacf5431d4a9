"""Real `fleetprof server` processes with settings of the test's choosing (rate limits, log level):
`server_process` lives in tests/conftest.py and is re-exported here for the security and metrics tests."""

from tests.conftest import server_process

__all__ = ["server_process"]
