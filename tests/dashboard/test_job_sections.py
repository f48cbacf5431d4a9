"""Pieces of the job page built from a report (dashboard/pages/job.py), without a browser."""

from __future__ import annotations

from dashboard.pages.job import saving_line


def test_a_negative_saving_reads_as_the_extra_cost_it_is() -> None:
    assert saving_line({"usd_per_gpu_hour": -1.52, "usd": -291.84}) == "extra cost: $1.52 per gpu hour, $291.84"
    assert saving_line({"usd_per_gpu_hour": 0.75, "usd": None}) == "saving: $0.75 per gpu hour, unknown"
    assert saving_line({"usd_per_gpu_hour": -0.5, "usd": None}) == "extra cost: $0.50 per gpu hour, unknown"
    assert saving_line({"energy_fraction": 0.12}).startswith("saving: ")
    assert saving_line(None) is None
