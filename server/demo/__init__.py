"""Recorded real GPU telemetry that `fleetprof up` replays on machines without a GPU."""
