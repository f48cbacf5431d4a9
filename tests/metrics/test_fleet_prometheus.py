"""Metrics Prometheus can trust (issue #20), end to end with real components: a real Prometheus scraping a real
agent's exporter (the agent in this process, sampling the NVML test double, so its series say source="test") and
two real `fleetprof server` replicas over one Postgres, and one of them for /metrics/fleet.

- Acceptance: two collector replicas behind one Prometheus give each GPU series once.
- Every query of every panel of deploy/grafana/fleetprof-fleet.json is run through Prometheus' HTTP API: it must
  parse, return series, and the right ones (this node's GPUs, the slowed-down GPU, the two collectors, ...).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pynvml
import pytest

from agent.config import AgentSettings
from agent.daemon import Agent
from agent.devices.base import GpuReading
from agent.devices.fake import FakeGpu, FakeNvml
from agent.devices.nvml import NvmlDevices
from tests.conftest import REPO_ROOT
from tests.metrics.prom import prometheus, query, wait_query
from tests.security.conftest import server_process

DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "fleetprof-fleet.json"
NODE = "node-prom"
UUIDS = [f"GPU-prom{i:04d}-0000-0000-0000-000000000000" for i in range(3)]
THROTTLED = 1  # this GPU is held back thermally (0x20 SW thermal) while idle bits are set on all
THERMAL, IDLE = 0x20, 0x1
FAULTY = 2  # this GPU's health counters are set (the double's, distinct values); the others' are all 0
REPLAY, FLIT = pynvml.NVML_NVLINK_ERROR_DL_REPLAY, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT
HEALTH_OF_FAULTY = {"ecc_uncorrected_volatile": 1, "ecc_corrected_volatile": 4, "retired_pages_dbe": 2,
                    "retired_pages_sbe": 5, "retired_pages_pending": True, "remapped_rows_uncorrectable": 3,
                    "remapped_rows_correctable": 6, "remapped_rows_pending": True, "remapped_rows_failed": True,
                    "pcie_replay": 7, "nvlink_errors": {(0, REPLAY): 6, (1, FLIT): 2}}
# The health panels' series (per GPU, "> 0": GPUs with any) and the value each must show for the faulty GPU.
HEALTH_SERIES = {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 1.0, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 4.0,
                 "DCGM_FI_DEV_RETIRED_DBE": 2.0, "DCGM_FI_DEV_RETIRED_SBE": 5.0, "DCGM_FI_DEV_RETIRED_PENDING": 1.0,
                 "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 3.0, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 6.0,
                 "DCGM_FI_DEV_ROW_REMAP_PENDING": 1.0, "DCGM_FI_DEV_ROW_REMAP_FAILURE": 1.0,
                 "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 7.0, "fleetprof_gpu_nvlink_errors_total": 8.0}
HEALTH_PANELS = {"Volatile ECC errors", "Retired pages and pending retirements", "Row remapping",
                 "PCIe replays and NVLink errors"}
# The panels' variables as Grafana would fill them: all nodes, a rate window of a few scrapes.
VARIABLES = {"$Hostname": ".*", "$__rate_interval": "20s"}

# The test double learns GPM in issue #20's telemetry part (FakeGpu.gpm_supported); until then the readings carry
# the values an H100 running a matmul shows, set here and labelled as the double's like the rest.
DOUBLE_HAS_GPM = "gpm_supported" in {f.name for f in dataclasses.fields(FakeGpu)}
GPM_OF_DOUBLE = {"gpm_sm_activity_pct": 71.0, "gpm_sm_occupancy_pct": 38.0, "gpm_tensor_activity_pct": 55.0,
                 "gpm_dram_bw_util_pct": 42.0, "gpm_pcie_tx_bytes_per_s": 1.2e9, "gpm_pcie_rx_bytes_per_s": 2.3e9,
                 "gpm_nvlink_tx_bytes_per_s": 3.1e10, "gpm_nvlink_rx_bytes_per_s": 3.0e10}


class _DoubleWithGpm(NvmlDevices):
    def read(self, slot: int) -> GpuReading:
        reading = super().read(slot)
        for name, value in GPM_OF_DOUBLE.items():
            if getattr(reading, name, None) is None:
                setattr(reading, name, value)
        return reading


def _devices() -> tuple[NvmlDevices, FakeNvml]:
    extra = {"gpm_supported": True} if DOUBLE_HAS_GPM else {}
    gpus = [FakeGpu(uuid=u, pci_bus_id=f"00000000:{0x18 + i:02X}:00.0", power_mw=250_000 + 50_000 * i,
                    throttle_reasons=IDLE | (THERMAL if i == THROTTLED else 0), ecc_corrected=3 * i,
                    **extra, **(HEALTH_OF_FAULTY if i == FAULTY else {}))
            for i, u in enumerate(UUIDS)]  # type: ignore[arg-type]
    fake = FakeNvml(gpus)
    devices = NvmlDevices(fake) if DOUBLE_HAS_GPM else _DoubleWithGpm(fake)
    devices.source = "test"
    return devices, fake


def _run_energy(fake: FakeNvml, stop: threading.Event) -> None:
    """The double's energy counters advance at each GPU's power draw, as the hardware's do (mW x s = mJ)."""
    last = time.monotonic()
    while not stop.wait(0.05):
        now = time.monotonic()
        for gpu in fake.gpus:
            gpu.energy_mj += int(gpu.power_mw * (now - last))
        last = now


def _panels() -> list[dict]:
    doc = json.loads(DASHBOARD.read_text())
    return [p for p in doc["panels"] if p["type"] != "row"]


def _expr(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a variable the test does not fill: {expr}"
    return expr


def _config(agent: str, collectors: list[str]) -> str:
    targets = ", ".join(f"'{c}'" for c in collectors)
    return ("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n"
            f"  - job_name: fleetprof-agents\n    static_configs:\n      - targets: ['{agent}']\n"
            f"  - job_name: fleetprof-collectors\n    static_configs:\n      - targets: [{targets}]\n"
            "  - job_name: fleetprof-fleet\n    metrics_path: /metrics/fleet\n"
            f"    static_configs:\n      - targets: ['{collectors[0]}']\n")


def _refused_requests(url: str, stop: threading.Event) -> None:
    """The second replica answers requests too: a refused token every half second, so the latency panel's rate()
    over its window always holds some 401s (one request before the first scrape never shows in a rate)."""
    while not stop.wait(0.5):
        assert httpx.get(url + "/api/v1/nodes", headers={"Authorization": "Bearer nope"}).status_code == 401


@pytest.fixture
def fleet(cli_env, make_token, tmp_path: Path) -> Iterator[tuple[str, list[str]]]:  # type: ignore[no-untyped-def]
    """Two collector replicas, an agent shipping to the first and exporting its GPUs, and Prometheus scraping all."""
    token = make_token("agent", node=NODE)
    with ExitStack() as stack:
        urls = [stack.enter_context(server_process(cli_env, tmp_path / f"server-{i}.log")) for i in range(2)]
        devices, fake = _devices()
        settings = AgentSettings(server_url=urls[0], token=token, spool_dir=tmp_path / "spool", node_name=NODE,
                                 interval_s=0.1, fast_interval_s=0.05, batch_interval_s=0.5,
                                 agent_metrics_port=0, agent_metrics_host="127.0.0.1")
        agent = Agent(settings, devices)
        assert agent.metrics is not None
        fake.xid(0, 79)
        stop = threading.Event()
        threads = [threading.Thread(target=agent.run, args=(stop,)),
                   threading.Thread(target=_run_energy, args=(fake, stop)),
                   threading.Thread(target=_refused_requests, args=(urls[1], stop))]
        for t in threads:
            t.start()
        try:
            collectors = [u.removeprefix("http://") for u in urls]
            prom = stack.enter_context(prometheus(_config(f"127.0.0.1:{agent.metrics.port}", collectors), tmp_path))
            wait_query(prom, "up", lambda r: len(r) == 4 and all(s["value"][1] == "1" for s in r))
            yield prom, collectors
        finally:
            stop.set()
            for t in threads:
                t.join(15)


@pytest.mark.slow
def test_two_collector_replicas_behind_one_prometheus_give_each_gpu_series_once(fleet) -> None:  # type: ignore[no-untyped-def]
    prom, collectors = fleet
    # both replicas are scraped, and serve the service's own series, one per process
    assert len(wait_query(prom, "fleetprof_ingest_samples_total", lambda r: len(r) == 2)) == 2
    util = wait_query(prom, "DCGM_FI_DEV_GPU_UTIL", lambda r: len(r) == len(UUIDS))
    assert sorted(s["metric"]["UUID"] for s in util) == UUIDS
    assert {s["metric"]["job"] for s in util} == {"fleetprof-agents"}
    assert all(s["metric"]["Hostname"] == NODE and s["metric"]["source"] == "test" for s in util)
    # every DCGM series of every GPU exactly once, and none from a collector
    counts = query(prom, 'count by (__name__, UUID) ({__name__=~"DCGM_.*"})')
    assert counts and {s["value"][1] for s in counts} == {"1"}
    assert {s["metric"]["UUID"] for s in counts} == set(UUIDS)
    assert query(prom, '{job="fleetprof-collectors", __name__=~"DCGM_.*"}') == []
    # the fleet's figures come once, from the one scrape of /metrics/fleet, though both collectors could answer
    reporting = wait_query(prom, "fleetprof_fleet_gpus_reporting", lambda r: float(r[0]["value"][1]) == len(UUIDS))
    assert len(reporting) == 1 and reporting[0]["metric"]["instance"] == collectors[0]
    # energy is a counter and Prometheus' rate() of it is the double's power draw (W); the agent reads the counter
    # every 30th interval (3 s here), so the window must hold a few readings before the rate settles
    def at_power(result: list[dict]) -> bool:
        rates = {s["metric"]["UUID"]: float(s["value"][1]) for s in result}
        return set(rates) == set(UUIDS) and all(
            rates[u] == pytest.approx(250 + 50 * i, rel=0.25) for i, u in enumerate(UUIDS))

    wait_query(prom, "rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[30s]) / 1000", at_power, timeout_s=90)
    meta = httpx.get(f"{prom}/api/v1/metadata", params={"metric": "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"}).json()
    assert meta["data"]["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][0]["type"] == "counter"


def _check_panel(title: str, expr: str, result: list[dict]) -> str | None:
    """What each panel must show for this fleet, beyond "some series"; the health series it checked, if one."""
    for s in result:
        assert s["metric"].get("Hostname", NODE) == NODE, (title, s)
        assert s["metric"].get("UUID", UUIDS[0]) in UUIDS, (title, s)
    values = [float(s["value"][1]) for s in result]
    metric = expr.split("{", 1)[0]
    if metric in HEALTH_SERIES:  # the faulty GPU alone, with the double's value, labelled as the double's
        assert title in HEALTH_PANELS, title
        assert [(s["metric"]["UUID"], s["metric"]["source"], float(s["value"][1])) for s in result] == \
            [(UUIDS[FAULTY], "test", HEALTH_SERIES[metric])], (expr, result)
        return metric
    if title.startswith("GPUs slowed down"):
        assert values == [1.0], (expr, result)  # the thermally held GPU; idle bits on the others do not count
    elif title.startswith("Slowed-down GPUs now"):
        assert [s["metric"]["UUID"] for s in result] == [UUIDS[THROTTLED]] and values == [IDLE | THERMAL]
    elif title == "Collector processes":
        assert values == [2.0]
    elif title.startswith("SM and tensor-core"):
        assert all(0 < v <= 1 for v in values), (expr, values)  # DCGM's ratio, not percent
    elif title == "Power draw":
        assert values == [sum(250 + 50 * i for i in range(len(UUIDS)))]
    elif "by status" in title:
        assert {"200", "401"} <= {s["metric"]["status"] for s in result}, result
    elif title == "GPU errors" and "XID" in expr:
        assert values == [1.0]  # XID 79 on one GPU
    elif title == "GPU errors" and "SBE" in expr:
        assert values == [3.0 * sum(range(len(UUIDS)))]
    return None


def _holds(title: str, expr: str, result: list[dict]) -> bool:
    """Whether the panel shows what it must yet: a rate() over a window needs a few scrapes of the 401s the second
    replica answers before its "by status" split shows them (asserting at the first answer was a flake)."""
    try:
        _check_panel(title, expr, result)
    except AssertionError:
        return False
    return True


@pytest.mark.slow
def test_every_grafana_panel_query_runs_against_prometheus(fleet, make_token) -> None:  # type: ignore[no-untyped-def]
    prom, collectors = fleet
    panels = _panels()
    titles = {p["title"] for p in panels}
    assert {"GPU utilization (NVML: a kernel was running)", "Power draw", "Collector request latency p99, by status",
            "GPU errors", *HEALTH_PANELS} <= titles
    checked = 0
    health: list[str] = []
    for panel in panels:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            expr = _expr(target["expr"])
            # parses, returns series, and (once the rate windows hold enough scrapes) the right ones
            result = wait_query(prom, expr, lambda r: _holds(panel["title"], target["expr"], r), timeout_s=60)
            metric = _check_panel(panel["title"], target["expr"], result)
            health += [metric] if metric else []
            checked += 1
    assert checked >= len(panels)
    assert sorted(health) == sorted(HEALTH_SERIES)  # every health series has its panel, once
    # the same readings reach the collector through the agent's shipper: the node's GPUs needing attention are the
    # faulty one, with its raised flags (its counters do not rise here: no counter finding), labelled as the double's
    op = {"Authorization": f"Bearer {make_token('operator')}"}
    flags = ["retired_pages_pending", "row_remap_failed", "row_remap_pending"]
    deadline = time.monotonic() + 30
    while True:
        gpus = httpx.get(f"http://{collectors[0]}/api/v1/gpus", params={"node": NODE}, headers=op).json()
        found = {g["uuid"]: g["findings"] or [] for g in gpus}
        if sorted(f["kind"] for f in found.get(UUIDS[FAULTY], [])) == flags or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert sorted(f["kind"] for f in found[UUIDS[FAULTY]]) == flags, found
    assert all(f["source"].endswith("(NVML test double)") for f in found[UUIDS[FAULTY]])
    assert all(f["kind"] in ("xid", "thermal") for u in UUIDS if u != UUIDS[FAULTY] for f in found[u]), found


def test_the_dashboard_is_one_importable_document() -> None:
    doc = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)) and doc["uid"] == "fleetprof-fleet"
    variables = {v["name"] for v in doc["templating"]["list"]}
    assert variables == {"datasource", "Hostname"}
    for panel in _panels():
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]  # every number carries its unit
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
