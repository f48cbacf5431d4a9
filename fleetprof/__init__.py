"""fleetprof: GPU fleet profiling. `fleetprof.profile()` profiles a block or a function from inside a program
(fleetprof/profiling.py); `fleetprof.client.Client` is the REST SDK."""

from fleetprof.profiling import ProfileResult, profile

__all__ = ["ProfileResult", "profile"]
