"""`fleetprof report`'s table and the standalone HTML report show the health findings of a job shipped by the real
agent code from the NVML test double (tests/server/faulty_gpu.py), as the real API answers them: one line per
finding, on the faulty GPU only, each with its source labelled as the double's."""

from __future__ import annotations

from fleetprof.commands.report import format_table
from tests.server.fake_node import poster
from tests.server.faulty_gpu import COUNTS, FLAGS, SOURCE, ship_faulty_job
from tests.server.helpers import auth


def test_report_table_and_html_list_each_finding_with_its_source(api, make_token) -> None:  # type: ignore[no-untyped-def]
    post = poster(api)

    op, truth = ship_faulty_job(post, make_token, node="health-cli", job_id="health-cli-job")
    report = api.get("/api/v1/jobs/health-cli-job/report", headers=auth(op)).json()
    health = format_table(report).split("\n[health]\n", 1)[1].split("\n\n", 1)[0]
    lines = health.splitlines()
    kinds = {*COUNTS, *FLAGS, "temperature_near_slowdown"}
    assert len(lines) == len(kinds) and all(line.startswith(f"  {truth.bad}  ") for line in lines)
    assert truth.good not in health
    assert {line.split()[1] for line in lines} == kinds
    assert all(line.endswith(f"{SOURCE}]") for line in lines)
    assert f"  {truth.bad}  pcie_replay (info): 4 PCIe replays in the window" in health
    assert f"  {truth.bad}  ecc_uncorrected (critical): 1 uncorrected ECC errors" in health

    page = api.get("/api/v1/jobs/health-cli-job/report", params={"format": "html"}, headers=auth(op)).text
    section = page.split("<h2>Health</h2>", 1)[1].split("</ul>", 1)[0]
    assert section.count("<li>") == len(kinds) and section.count(SOURCE) == len(kinds)
    assert "4 PCIe replays" in section and truth.good not in section
