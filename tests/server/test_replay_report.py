"""Acceptance: a real nvidia-smi log replayed for a job gives a report that matches the log itself.

The expected figures are computed here independently of fleetprof's parser, straight from the CSV.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

CAPTURES = sorted((Path(__file__).resolve().parents[1] / "data/nvidia-smi").glob("*.txt"))


def _query_gpu_rows(path: Path) -> list[dict[str, str]]:
    """Every data row of every `--query-gpu` CSV section of a capture (or of a plain CSV log)."""
    rows, header = [], None
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            header = None
            continue
        cells = [c.strip() for c in next(csv.reader([line]))]
        if cells[0] == "timestamp":
            header = cells if "memory.used [MiB]" in cells else None
        elif header:
            rows.append(dict(zip(header, cells)))
    return rows


def _num(cell: str) -> float | None:
    return None if cell.startswith("[") else float(cell.split()[0])


def _expected(path: Path) -> dict[str, float | None]:
    rows = _query_gpu_rows(path)
    ts = [datetime.strptime(r["timestamp"], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=UTC).timestamp()
          for r in rows]
    power = [_num(r["power.draw [W]"]) for r in rows]
    util = [u for u in (_num(r["utilization.gpu [%]"]) for r in rows) if u is not None]
    energy = sum((ts[i + 1] - ts[i]) * (power[i] + power[i + 1]) / 2 for i in range(len(rows) - 1))
    return {"peak_used_bytes": max(_num(r["memory.used [MiB]"]) for r in rows) * 2**20,
            "energy_j": energy, "gpu_mean_pct": sum(util) / len(util) if util else None, "rows": len(rows)}


def _fleetprof(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetprof.cli", *args], env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def client_env(cli_env, live_server, make_token):
    return {**cli_env, "FLEETPROF_SERVER_URL": live_server, "FLEETPROF_TOKEN": make_token("operator")}


@pytest.mark.parametrize("capture", CAPTURES, ids=[c.name.split("__")[1] for c in CAPTURES])
def test_replayed_capture_report_matches_the_log(client_env, capture):
    expected = _expected(capture)
    assert expected["rows"] >= 2
    job = "replay-" + capture.name.split("__")[1]
    r = _fleetprof(["replay", str(capture), "--job-id", job, "--node", "node-replay"], client_env)
    assert r.returncode == 0, r.stderr
    r = _fleetprof(["report", job, "--format", "json"], client_env)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["state"] == "finished"
    assert report["memory"]["peak_used_bytes"] == expected["peak_used_bytes"]
    assert report["gpus"][0]["peak_used_bytes"] == expected["peak_used_bytes"]
    assert report["energy"]["source"] == "integrated_power"
    assert report["energy"]["energy_j"] == pytest.approx(expected["energy_j"], rel=0.01)
    if expected["gpu_mean_pct"] is None:  # MIG: utilization is [N/A] in the log, so unknown in the report
        assert report["utilization"]["gpu_mean_pct"] is None
    else:
        assert report["utilization"]["gpu_mean_pct"] == pytest.approx(expected["gpu_mean_pct"], abs=1e-9)


def _plain_log(tmp_path: Path) -> Path:
    """What `nvidia-smi --query-gpu=... --format=csv -l 1 > log` writes, cut from a real H200 capture."""
    capture = next(c for c in CAPTURES if "h200" in c.name)
    lines = capture.read_text().splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.startswith("timestamp, driver_version"))
    log = tmp_path / "nvidia-smi.csv"
    body = [ln for ln in lines if ln.startswith("20") and ln.count(",") == lines[header].count(",")]
    log.write_text("\n".join([lines[header], *body]) + "\n")
    return log


def test_plain_csv_log_and_table_and_html_formats(client_env, tmp_path):
    log = _plain_log(tmp_path)
    expected = _expected(log)
    assert _fleetprof(["replay", str(log), "--job-id", "plain-1", "--node", "n9"], client_env).returncode == 0
    table = _fleetprof(["report", "plain-1"], client_env)
    assert table.returncode == 0 and "peak_used_bytes" in table.stdout and "[NVML]" in table.stdout
    assert f"{expected['peak_used_bytes'] / 2**30:,.2f} GiB" in table.stdout
    html_path = tmp_path / "report.html"
    r = _fleetprof(["report", "plain-1", "--format", "html", "-o", str(html_path)], client_env)
    assert r.returncode == 0, r.stderr
    html = html_path.read_text()
    assert html.startswith("<!doctype html>") and "plotly" in html and "plain-1" in html


def test_client_errors_are_clear(client_env, tmp_path):
    r = _fleetprof(["report", "no-such-job"], client_env)
    assert r.returncode == 3 and "404" in r.stderr and "not found" in r.stderr
    bad = tmp_path / "bad.csv"
    bad.write_text("hello,world\n1,2\n")
    r = _fleetprof(["replay", str(bad), "--job-id", "x", "--node", "n"], client_env)
    assert r.returncode == 2 and "no nvidia-smi --query-gpu CSV rows" in r.stderr
    r = _fleetprof(["replay", str(tmp_path / "missing.csv"), "--job-id", "x", "--node", "n"], client_env)
    assert r.returncode == 2 and "cannot read" in r.stderr
    env = {k: v for k, v in client_env.items() if k != "FLEETPROF_TOKEN"}
    r = _fleetprof(["report", "x"], env)
    assert r.returncode == 2 and "FLEETPROF_TOKEN" in r.stderr


def test_replay_waits_out_a_rate_limited_collector(cli_env, make_token, tmp_path):
    """A collector shedding load (429 + Retry-After) slows a replay down but loses and duplicates nothing; with
    --retry-for 0 the same refusal is a clear CLI error."""
    from tests.conftest import server_process

    log = _plain_log(tmp_path)
    rows = _expected(log)["rows"]
    # 1 request/s after a burst of 2: at 4/s a loaded machine (each CLI request taking > 250 ms) refilled the
    # bucket between requests and the first replay was never refused
    env = dict(cli_env, FLEETPROF_RATE_LIMIT_PER_S="1", FLEETPROF_RATE_LIMIT_BURST="2")
    with server_process(env, tmp_path / "server.log") as url:
        client = {**cli_env, "FLEETPROF_SERVER_URL": url, "FLEETPROF_TOKEN": make_token("operator")}
        args = ["replay", str(log), "--node", "n-limited", "--batch-steps", "1"]
        r = _fleetprof([*args, "--job-id", "limited-0", "--retry-for", "0"], client)
        assert r.returncode == 5 and "429" in r.stderr and "rate limit" in r.stderr  # unavailable: retry later
        r = _fleetprof([*args, "--job-id", "limited-1"], client)  # rows + 2 requests at 1/s after a burst of 2
        assert r.returncode == 0, r.stderr
        for _ in range(5):  # the report's own request shares the 1/s bucket the replay just emptied: exit 5, retry
            rep = _fleetprof(["report", "limited-1", "--format", "json"], client)
            if rep.returncode != 5:
                break
            time.sleep(1.0)
        assert rep.returncode == 0, rep.stderr
        report = json.loads(rep.stdout)
    assert report["state"] == "finished"
    assert [g["samples"] for g in report["gpus"]] == [rows]  # every row stored, once
    r = _fleetprof(["replay", str(log), "--job-id", "x", "--node", "n", "--retry-for", "-1"], client)
    assert r.returncode == 2 and "--retry-for" in r.stderr
