"""The agent's Prometheus endpoint: dcgm-exporter's names, types, units and labels, served over real HTTP from the
readings the sampler took (the NVML test double stands in for NVML; its series say source="test"), pods named by
a real gRPC kubelet double, Slurm jobs from a /proc tree; and no NVML call per scrape."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.config import AgentSettings
from agent.daemon import Agent
from agent.devices.base import GpuIdentity, GpuReading
from agent.devices.fake import FakeGpu, FakeNvml
from agent.devices.nvml import NvmlDevices
from agent.exporter.fields import FIELDS
from agent.exporter.gauges import NodeGauges, hpc_job_of
from tests.agent.collector import Collector
from tests.agent.test_attribution import POD_UID, make_proc
from tests.agent.test_podresources import GPU_A, LIST_ANSWER, Kubelet

GPU_S = "GPU-55555555-0000-0000-0000-000000000000"  # a Slurm job's
GPU_F = "GPU-ffffffff-0000-0000-0000-000000000000"  # no process


def _scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    r = httpx.get(url, timeout=5)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(r.text):  # the reference parser: a malformed line raises
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def _types(url: str) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(httpx.get(url, timeout=5).text)}


def _by_uuid(series: list[tuple[dict[str, str], float]]) -> dict[str, tuple[dict[str, str], float]]:
    return {labels["UUID"]: (labels, value) for labels, value in series}


@pytest.fixture
def node(tmp_path: Path, collector: Collector) -> Iterator[tuple[Agent, FakeNvml, str]]:
    sock = tmp_path / "kubelet.sock"
    kubelet = Kubelet(sock, LIST_ANSWER)
    proc = tmp_path / "proc"
    make_proc(proc, 40, cgroup=f"0::/kubepods.slice/kubepods-pod{POD_UID.replace('-', '_')}.slice/cri-x.scope\n")
    make_proc(proc, 41, env={"SLURM_JOB_ID": "77"})
    fake = FakeNvml([FakeGpu(uuid=GPU_A, pci_bus_id="00000000:18:00.0", compute_processes=[(40, 1 << 30)]),
                     FakeGpu(uuid=GPU_S, pci_bus_id="00000000:2A:00.0", compute_processes=[(41, 1 << 30)],
                             power_mw=412_500, energy_mj=5_000_123),
                     FakeGpu(uuid=GPU_F, pci_bus_id="00000000:3A:00.0", memory_used_bytes=3 << 29)])
    devices = NvmlDevices(fake)
    devices.source = "test"
    settings = AgentSettings(server_url=collector.url, token="tok", spool_dir=tmp_path / "spool", node_name="node-x",
                             proc_root=proc, pod_resources_socket=sock, agent_metrics_port=0,
                             agent_metrics_host="127.0.0.1")
    agent = Agent(settings, devices)
    assert agent.metrics is not None
    agent.metrics.start()
    try:
        yield agent, fake, f"http://127.0.0.1:{agent.metrics.port}/metrics"
    finally:
        agent.close()
        kubelet.stop()


def test_dcgm_names_units_types_and_labels(node) -> None:  # type: ignore[no-untyped-def]
    agent, fake, url = node
    fake.xid(1, 79)
    agent.sampler.sample()
    agent.sampler.sample()  # job labels are those seen at the GPU's previous reading
    m = _scrape(url)
    fb = _by_uuid(m["DCGM_FI_DEV_FB_USED"])
    assert set(fb) == {GPU_A, GPU_S, GPU_F}
    labels, value = fb[GPU_F]
    assert value == 1536  # 3 << 29 bytes in MiB, as DCGM reports it
    assert labels == {"gpu": "2", "UUID": GPU_F, "pci_bus_id": "00000000:3A:00.0", "device": "nvidia2",
                      "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "node-x", "source": "test"}
    # the kubelet says pod ml/trainer-0 (container main) holds GPU_A; GPU_S runs Slurm job 77
    a = fb[GPU_A][0]
    assert (a["namespace"], a["pod"], a["container"]) == ("ml", "trainer-0", "main") and "hpc_job" not in a
    s = fb[GPU_S][0]
    assert s["hpc_job"] == "77" and "pod" not in s
    assert not {"pod", "namespace", "container", "hpc_job"} & set(labels)
    power = _by_uuid(m["DCGM_FI_DEV_POWER_USAGE"])
    assert power[GPU_S][1] == 412.5  # W
    energy = _by_uuid(m["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total"])  # a counter: the parser adds _total
    assert energy[GPU_S][1] == 5_000_123  # mJ
    assert _by_uuid(m["DCGM_FI_DEV_XID_ERRORS"])[GPU_S][1] == 79 and GPU_A not in _by_uuid(m["DCGM_FI_DEV_XID_ERRORS"])
    assert _by_uuid(m["DCGM_FI_DEV_SM_CLOCK"])[GPU_A][1] == 1980
    assert _by_uuid(m["DCGM_FI_DEV_FB_FREE"])[GPU_F][1] == pytest.approx((85_520_809_984 - (3 << 29)) / 2**20)
    types = _types(url)
    assert types["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter" and types["DCGM_FI_DEV_GPU_UTIL"] == "gauge"
    # the test double has no GPM: no DCGM_FI_PROF_* series at all (unknown is no series, never 0)
    if getattr(agent.devices.read(0), "gpm_sm_activity_pct", None) is None:
        assert not [name for name in m if name.startswith("DCGM_FI_PROF_")]
    (info_labels, _), = m["fleetprof_agent_info"]
    assert info_labels["source"] == "test" and info_labels["Hostname"] == "node-x"


def test_a_scrape_makes_no_nvml_call_and_a_lost_gpu_exports_nothing(node) -> None:  # type: ignore[no-untyped-def]
    agent, fake, url = node
    agent.sampler.sample()
    agent.sampler.tick_fast()
    calls = dict(fake.calls)
    for _ in range(20):
        _scrape(url)
    assert fake.calls == calls
    fake.gpus[2].lost = True
    agent.sampler.sample()
    m = _scrape(url)
    assert set(_by_uuid(m["DCGM_FI_DEV_GPU_UTIL"])) == {GPU_A, GPU_S}
    assert httpx.get(url.replace("/metrics", "/nope"), timeout=5).status_code == 404


def test_gpm_percent_becomes_dcgm_ratio() -> None:
    gpu = GpuIdentity(slot=0, index=3, uuid="GPU-g", name="NVIDIA H100 80GB HBM3", pci_bus_id="00000000:9A:00.0")
    gauges = NodeGauges([gpu], hostname="h", source="nvml", agent_id="a")
    reading = GpuReading(gpu_util_pct=90.0)
    gpm = {"gpm_sm_activity_pct": 62.5, "gpm_sm_occupancy_pct": 25.0, "gpm_tensor_activity_pct": 40.0,
           "gpm_dram_bw_util_pct": 12.5, "gpm_pcie_tx_bytes_per_s": 1.5e9, "gpm_nvlink_rx_bytes_per_s": 3e10}
    for name, value in gpm.items():
        setattr(reading, name, value)  # the fields issue #20's telemetry part adds to GpuReading
    gauges.update_reading(0, reading)
    text = gauges.render().decode()
    samples = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples["DCGM_FI_PROF_SM_ACTIVE"].value == 0.625
    assert samples["DCGM_FI_PROF_SM_OCCUPANCY"].value == 0.25
    assert samples["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"].value == 0.4
    assert samples["DCGM_FI_PROF_DRAM_ACTIVE"].value == 0.125
    assert samples["DCGM_FI_PROF_PCIE_TX_BYTES"].value == 1.5e9
    assert samples["DCGM_FI_PROF_NVLINK_RX_BYTES"].value == 3e10
    assert "DCGM_FI_PROF_PCIE_RX_BYTES" not in samples
    assert "source" not in samples["DCGM_FI_DEV_GPU_UTIL"].labels  # real NVML data carries no marker
    assert gauges.render() is gauges.render()  # nothing changed: the rendered text is reused


def test_every_exported_name_is_unique_and_typed() -> None:
    names = [f.name for f in FIELDS]
    assert len(names) == len(set(names))
    assert {f.name for f in FIELDS if f.kind == "counter"} >= {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                                                                "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"}


def test_hpc_job_only_for_exactly_one_slurm_job() -> None:
    assert hpc_job_of(["slurm:12", "train-1"]) == "12"
    assert hpc_job_of(["slurm:12", "slurm:13"]) is None
    assert hpc_job_of(["k8s:ml/p"]) is None


def test_the_wrapper_passes_every_device_method_through() -> None:
    """A method added to Devices later must be delegated here too, or the exporter would hide the real one."""
    from agent.devices.base import Devices
    from agent.exporter.observe import ObservedDevices

    public = {name for name in vars(Devices) if not name.startswith("_") and callable(getattr(Devices, name))}
    assert public <= set(vars(ObservedDevices)), public - set(vars(ObservedDevices))


def test_a_port_in_use_fails_the_start_clearly(tmp_path: Path, collector: Collector) -> None:
    import socket

    from agent.exporter.endpoint import MetricsPortError

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        settings = AgentSettings(server_url=collector.url, token="t", spool_dir=tmp_path / "spool",
                                 agent_metrics_port=port, agent_metrics_host="127.0.0.1")
        with pytest.raises(MetricsPortError, match=f"127.0.0.1:{port}"):
            Agent(settings, NvmlDevices(FakeNvml.with_gpus(1)))


def test_cli_agent_serves_metrics_on_its_port(tmp_path: Path, collector: Collector, repo_root: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import free_port

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(repo_root), "FLEETPROF_INTERVAL_S": "0.2",
           "FLEETPROF_AGENT_METRICS_HOST": "127.0.0.1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetprof.cli", "agent", "--server", collector.url, "--token", "t", "--source",
         "fake:2", "--spool", str(tmp_path / "spool"), "--node", "cli-node", "--metrics-port", str(port)],
        cwd=repo_root, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline, series = time.monotonic() + 30, []
        while time.monotonic() < deadline and len(series) < 2:
            try:
                series = _scrape(f"http://127.0.0.1:{port}/metrics").get("DCGM_FI_DEV_GPU_UTIL", [])
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert sorted(labels["gpu"] for labels, _ in series) == ["0", "1"]
    assert all(labels["Hostname"] == "cli-node" and labels["source"] == "test" for labels, _ in series)


def test_mig_series_carry_the_gpu_instance_and_profile() -> None:
    """As dcgm-exporter: a MIG device's series say GPU_I_ID and GPU_I_PROFILE; a whole GPU's carry neither."""
    whole = GpuIdentity(slot=0, index=0, uuid="GPU-p", name="NVIDIA H100 80GB HBM3")
    mig = GpuIdentity(slot=1, index=0, uuid="MIG-a", name="NVIDIA H100 80GB HBM3 MIG 3g.40gb",
                      mig_parent_uuid="GPU-p", mig_gpu_instance_id=2, mig_profile="3g.40gb")
    gauges = NodeGauges([whole, mig], hostname="h", source="nvml", agent_id="a")
    for slot in (0, 1):
        gauges.update_reading(slot, GpuReading(memory_used_bytes=1 << 30, gpu_util_pct=10.0))
    used = {s.labels["UUID"]: s.labels for f in text_string_to_metric_families(gauges.render().decode())
            for s in f.samples if s.name == "DCGM_FI_DEV_FB_USED"}
    assert used["MIG-a"]["GPU_I_ID"] == "2" and used["MIG-a"]["GPU_I_PROFILE"] == "3g.40gb"
    assert "GPU_I_ID" not in used["GPU-p"] and "GPU_I_PROFILE" not in used["GPU-p"]


def test_fast_ticks_refresh_used_and_free_together() -> None:
    gpu = GpuIdentity(slot=0, index=0, uuid="GPU-m", name="NVIDIA H100 80GB HBM3", memory_total_bytes=80 << 30)
    gauges = NodeGauges([gpu], hostname="h", source="nvml", agent_id="a")
    gauges.update_fast(0, 1 << 30, 100_000)  # before any full reading: nothing to show yet
    assert b"DCGM_FI_DEV_FB_USED" not in gauges.render()
    gauges.update_reading(0, GpuReading(memory_used_bytes=10 << 30, power_mw=200_000))
    gauges.update_fast(0, 30 << 30, 350_000)
    samples = {s.name: s.value for f in text_string_to_metric_families(gauges.render().decode()) for s in f.samples}
    assert samples["DCGM_FI_DEV_FB_USED"] == 30 * 1024 and samples["DCGM_FI_DEV_FB_FREE"] == 50 * 1024
    assert samples["DCGM_FI_DEV_POWER_USAGE"] == 350.0
