"""The agent's Prometheus endpoint: what a scrape costs, and what feeding it costs the sampling path.

    .venv/bin/python bench/agent_exporter.py            # 8 GPUs of the NVML test double, 300 scrapes

The exporter serves the readings the sampler already took (agent/exporter): a scrape renders (or reuses) text and
makes no NVML call. Measured here, in one process, with 8 simulated GPUs (the test double without latencies, so
that the exporter's own cost is what shows):
- a scrape over real HTTP (keep-alive, as Prometheus scrapes): wall latency and the process's CPU per scrape
  (client included: an upper bound of the agent's share);
- rendering after a new reading (text built) and between readings (the kept text);
- the sampling path with and without the exporter's wrapper: one full `sample()` of 8 GPUs and one 10 Hz
  `tick_fast()`, so the extra CPU per second at 1 Hz full readings, 10 Hz peaks is known;
- NVML calls made by all the scrapes (must be 0).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from agent.attribution import Attributor  # noqa: E402
from agent.devices.fake import FakeNvml  # noqa: E402
from agent.devices.nvml import NvmlDevices  # noqa: E402
from agent.exporter.endpoint import MetricsServer  # noqa: E402
from agent.exporter.gauges import NodeGauges  # noqa: E402
from agent.exporter.observe import JobsSeen, ObservedAttributor, ObservedDevices  # noqa: E402
from agent.sampler import Sampler  # noqa: E402
from bench.report import write_report  # noqa: E402

GPUS = 8
SCRAPES = 300
ROUNDS = 200
SCRAPE_INTERVAL_S = 15.0  # Prometheus' usual interval


def _cpu() -> float:
    return time.process_time()


def _sampler(observed: bool) -> tuple[Sampler, FakeNvml, NodeGauges | None]:
    fake = FakeNvml.with_gpus(GPUS)
    devices = NvmlDevices(fake)
    devices.source = "test"
    if not observed:
        return Sampler(devices, node="bench", agent_id="bench", attributor=Attributor("/nonexistent")), fake, None
    gauges = NodeGauges(devices.gpus(), hostname="bench", source="test", agent_id="bench")
    attributor = ObservedAttributor("/nonexistent", pod_resources_socket="/nonexistent.sock")
    jobs = JobsSeen(gauges, attributor.pod_resources.pods_of_gpu)
    attributor.jobs = jobs
    return (Sampler(ObservedDevices(devices, gauges, jobs), node="bench", agent_id="bench", attributor=attributor),
            fake, gauges)


def _per_call_us(fn, n: int) -> float:  # type: ignore[no-untyped-def]
    fn()
    start = _cpu()
    for _ in range(n):
        fn()
    return (_cpu() - start) / n * 1e6


def main() -> None:
    plain, _, _ = _sampler(False)
    observed, fake, gauges = _sampler(True)
    assert gauges is not None
    sample_plain_us = _per_call_us(plain.sample, ROUNDS)
    sample_observed_us = _per_call_us(observed.sample, ROUNDS)
    fast_plain_us = _per_call_us(plain.tick_fast, ROUNDS * 5)
    fast_observed_us = _per_call_us(observed.tick_fast, ROUNDS * 5)
    plain.make_batch()
    observed.make_batch()

    def fresh_render() -> None:
        gauges.update_fast(0, 1 << 30, 300_000)
        gauges.render()

    render_fresh_us = _per_call_us(fresh_render, ROUNDS)
    render_kept_us = _per_call_us(gauges.render, ROUNDS * 5)
    body_bytes = len(gauges.render())

    server = MetricsServer("127.0.0.1", 0, gauges)
    server.start()
    calls_before = sum(fake.calls.values())
    latencies = []
    try:
        with httpx.Client() as client:
            url = f"http://127.0.0.1:{server.port}/metrics"
            client.get(url)
            cpu0 = _cpu()
            for i in range(SCRAPES):
                if i % 2 == 0:  # half the scrapes find a new reading, as at a 15 s scrape and 1 s sampling
                    gauges.update_fast(i % GPUS, 1 << 30, 300_000)
                t = time.perf_counter()
                r = client.get(url)
                latencies.append(time.perf_counter() - t)
                assert r.status_code == 200
            scrape_cpu_us = (_cpu() - cpu0) / SCRAPES * 1e6
    finally:
        server.close()
    nvml_calls = sum(fake.calls.values()) - calls_before
    latencies.sort()
    extra_per_s_us = (sample_observed_us - sample_plain_us) + 10 * (fast_observed_us - fast_plain_us)
    figures = {
        "gpus_count": GPUS,
        "scrape_latency_p50_ms": statistics.median(latencies) * 1e3,
        "scrape_latency_p99_ms": latencies[int(0.99 * (len(latencies) - 1))] * 1e3,
        "scrape_cpu_us": scrape_cpu_us,
        "scrape_body_bytes": body_bytes,
        "render_new_reading_us": render_fresh_us,
        "render_kept_text_us": render_kept_us,
        "nvml_calls_by_scrapes_count": nvml_calls,
        "sample_8_gpus_plain_us": sample_plain_us,
        "sample_8_gpus_exported_us": sample_observed_us,
        "tick_fast_8_gpus_plain_us": fast_plain_us,
        "tick_fast_8_gpus_exported_us": fast_observed_us,
        # at 1 Hz full readings and 10 Hz peaks, plus one scrape every 15 s, as % of one core
        "exporter_cpu_pct": (extra_per_s_us + scrape_cpu_us / SCRAPE_INTERVAL_S) / 1e6 * 100,
    }
    width = max(len(k) for k in figures)
    print(f"agent exporter, {GPUS} GPUs of the NVML test double (no call latency), {SCRAPES} scrapes")
    for key, value in figures.items():
        print(f"  {key:<{width}}  {value:.3f}" if isinstance(value, float) else f"  {key:<{width}}  {value}")
    print(f"-> {write_report(__file__, figures)}")


if __name__ == "__main__":
    main()
