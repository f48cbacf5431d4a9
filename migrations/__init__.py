"""Alembic migrations of the fleetprof schema (a package so that installs carry them)."""
