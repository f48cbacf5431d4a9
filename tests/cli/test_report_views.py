"""`fleetprof report`'s table and the standalone HTML report, on a report of real captures and real step times."""

from __future__ import annotations

import re
import time

from fleetprof import units
from fleetprof.commands.report import format_table
from server.analysis.characterize import characterize
from server.jobs.html_report import render_report_html
from tests.analysis.test_characterize import real_job  # noqa: F401 - the fixture: 3 real captures + Alibaba steps


def _row(table: str, key: str) -> str:
    match = re.search(rf"^\s+{key}\s+(.*)$", table, re.M)
    assert match, f"no row {key!r} in the table"
    return match.group(1)


def test_table_shows_each_figure_with_its_unit_and_source(real_job) -> None:  # noqa: F811
    report = characterize(real_job, now=time.time())
    table = format_table(report)
    peak = report["memory"]["peak_used_bytes"]
    assert _row(table, "peak_used_bytes").startswith(f"{peak / 2**30:,.2f} GiB")
    assert "[NVML]" in _row(table, "peak_used_bytes")
    assert _row(table, "samples_per_s").endswith("/s")  # a rate: once printed as seconds
    p50 = report["time"]["step_time_s"]["p50"]
    assert f"p50 {units.seconds(p50)}" in _row(table, "step_time_s")
    assert "[" in _row(table, "energy_j")  # where the energy came from
    # layers are a table of their own, not a JSON dump
    assert "layers (2 rows)" in table and "{" not in table
    assert "unknown" in table and " nan" not in table.lower()


def test_html_report_carries_units_and_escapes(real_job) -> None:  # noqa: F811
    report = characterize(real_job, now=time.time())
    report["time"]["layers"][0]["module"] = "<script>alert(1)</script>"
    page = render_report_html(report, {})
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page
    energy = report["energy"]["energy_j"]
    assert re.search(r"<th>energy_j</th><td>[0-9.,]+ (J|kJ|kWh)</td>", page), "energy without its unit"
    assert energy > 0
    assert "NVML" in page  # sources in words
