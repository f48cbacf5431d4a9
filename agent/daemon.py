"""The node agent: devices -> sampler -> spool -> shipper, until told to stop.

One thread samples (fast ticks, full readings, batch cuts); one thread ships. They meet only at the spool,
which is durable, so a collector outage or an agent restart loses nothing that was spooled.
`run_agent` is what `fleetprof agent` and `fleetprof up` call.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable

from agent.attribution import Attributor
from agent.config import AgentSettings, node_name
from agent.devices.base import Devices, DeviceUnavailableError
from agent.exporter.endpoint import MetricsPortError, MetricsServer
from agent.exporter.gauges import NodeGauges
from agent.exporter.observe import JobsSeen, ObservedAttributor, ObservedDevices
from agent.sampler import Sampler
from agent.shipper import Shipper
from agent.spool import Spool
from fleetprof.client import Client
from fleetprof.recordings import RecordingError, dump_batch_line, read_recording

log = logging.getLogger(__name__)

# On a clean stop the shipper gets this long to empty the spool; what is left is sent at the next start.
STOP_FLUSH_S = 3.0
# Waits up to this long are a plain sleep, not `stop.wait`: a timed Event.wait costs about twice the CPU of a
# sleep per wake-up (a lock allocated and a timed acquire; 64 vs 35 us of thread CPU on the 2-core bench VM), and
# the sampling loop wakes 10 times a second. A stop is then noticed within this long at most.
SLEEP_MAX_S = 0.25


def wait_until(stop: threading.Event, seconds: float) -> None:
    """Wait `seconds` or until `stop` is set: a sleep when short (then `stop` is checked by the caller's loop),
    else `stop.wait`, so that a long wait still ends promptly on a stop."""
    if seconds <= 0:
        return
    if seconds <= SLEEP_MAX_S:
        time.sleep(seconds)
    else:
        stop.wait(seconds)


class SourceError(ValueError):
    """`--source` names something the agent cannot open."""


def open_devices(source: str, *, replay_job_id: str | None = None, power_instant_10hz: bool = False) -> Devices:
    """`nvml`, `replay:FILE` (a recording played as if live: our clock, looping; its unattributed processes
    attributed to `replay_job_id`), `replay-original:FILE` (the recording's own timestamps and values, one sample
    per recorded row, once) or `fake:N` (N simulated H100s, GPM included, with realistic NVML latencies, for the
    overhead benchmark; batches are labelled source="test")."""
    kind, _, arg = source.partition(":")
    if kind == "nvml":
        from agent.devices.nvml import NvmlDevices

        return NvmlDevices(power_instant_10hz=power_instant_10hz)
    if kind in ("replay", "replay-original"):
        if not arg:
            raise SourceError(f"--source {kind}:FILE needs a file")
        from agent.devices.replay import OriginalReplayDevices, ReplayDevices

        try:
            rec = read_recording(arg)
        except RecordingError as exc:
            raise SourceError(f"cannot replay {arg}: {exc}") from None
        return OriginalReplayDevices(rec) if kind == "replay-original" else ReplayDevices(rec, job_id=replay_job_id)
    if kind == "fake":
        from agent.devices.fake import FakeNvml
        from agent.devices.nvml import NvmlDevices

        try:
            n = int(arg or 8)
        except ValueError:
            raise SourceError(f"--source fake:N needs a GPU count, not {arg!r}") from None
        devices = NvmlDevices(FakeNvml.with_gpus(n, realistic=True), power_instant_10hz=power_instant_10hz)
        devices.source = "test"
        return devices
    raise SourceError(f"unknown source {source!r} (expected nvml, replay:FILE, replay-original:FILE or fake:N)")


class Agent:
    """The parts wired together; constructor arguments let tests swap the devices, transport and clocks."""

    def __init__(self, settings: AgentSettings, devices: Devices, *, transport: Client | None = None,
                 attributor: Attributor | None = None, clock: Callable[[], float] = time.time):
        if not settings.server_url:
            raise ValueError("the agent needs a server URL (--server or FLEETPROF_SERVER_URL)")
        self.settings = settings
        self.devices = devices
        node = node_name(settings)
        # A fresh id per start: seq restarts at 1 without colliding with batches an earlier run spooled.
        self.agent_id = f"{node}-{secrets.token_hex(4)}"
        self.samples_spooled = 0
        self.spool = Spool(settings.spool_dir, max_bytes=settings.spool_max_bytes)
        self.transport = transport or Client(settings.server_url, settings.token,
                                                timeout_s=settings.http_timeout_s)
        self.shipper = Shipper(self.spool, self.transport, backoff_max_s=settings.ship_backoff_max_s)
        from agent.devices.replay import OriginalReplayDevices, RecordedSampler

        self.metrics: MetricsServer | None = None
        self.sampler: Sampler | RecordedSampler
        if isinstance(devices, OriginalReplayDevices):
            # the recording's own rows and timestamps: no fast ticks, no re-aggregation, no attribution
            self.sampler = RecordedSampler(devices, node=node, agent_id=self.agent_id, clock=clock)
        else:
            gauges = None
            if settings.agent_metrics_port is not None:
                devices, attributor, gauges = self._observed(devices, attributor, node)
            self.sampler = Sampler(
                devices, node=node, agent_id=self.agent_id, clock=clock,
                attributor=attributor or Attributor(settings.proc_root,
                                                    pod_resources_socket=settings.pod_resources_socket),
            )
            if gauges is not None:
                # bound now, so that a port in use fails the start, not the first scrape
                try:
                    self.metrics = MetricsServer.bind(settings.agent_metrics_host, settings.agent_metrics_port or 0,
                                                      gauges)
                except MetricsPortError:
                    self.spool.close()
                    self.transport.close()
                    raise

    def _observed(self, devices: Devices, attributor: Attributor | None,
                  node: str) -> tuple[Devices, Attributor, NodeGauges]:
        """The devices and attributor the sampler uses, wrapped so that each reading also feeds the Prometheus
        gauges (agent/exporter), and the gauges."""
        s = self.settings
        gauges = NodeGauges(devices.gpus(), hostname=node, source=devices.source, agent_id=self.agent_id)
        if attributor is None:
            attributor = ObservedAttributor(s.proc_root, pod_resources_socket=s.pod_resources_socket)
        jobs = JobsSeen(gauges, attributor.pod_resources.pods_of_gpu)
        if isinstance(attributor, ObservedAttributor):
            attributor.jobs = jobs
        return ObservedDevices(devices, gauges, jobs), attributor, gauges

    def cut_batch(self) -> int:
        """Spool the rows gathered so far as one batch; returns the samples spooled."""
        batch = self.sampler.make_batch(dropped_samples_total=self.spool.dropped_samples_total,
                                        clock_skew_s=self.shipper.clock_skew_s)
        if batch is None:
            return 0
        self.spool.append(dump_batch_line(batch), len(batch.samples))
        self.samples_spooled += len(batch.samples)
        self.shipper.notify()
        return len(batch.samples)

    def run(self, stop: threading.Event) -> None:
        s = self.settings
        gpus = self.devices.gpus()
        log.info("agent %s: %d GPU(s) from %s, sampling every %.2f s (peaks every %.2f s), batches every %.1f s, "
                 "shipping to %s", self.agent_id, len(gpus), self.devices.source, s.interval_s, s.fast_interval_s,
                 s.batch_interval_s, s.server_url)
        ship_stop = threading.Event()
        shipper = threading.Thread(target=self.shipper.run, args=(ship_stop,), name="fleetprof-shipper",
                                   daemon=True)
        shipper.start()
        if self.metrics is not None:
            self.metrics.start()
        mono = time.monotonic
        start = mono()
        next_sample = start + s.interval_s
        next_fast = start
        next_batch = start + s.batch_interval_s
        fast = 0 < s.fast_interval_s < s.interval_s and isinstance(self.sampler, Sampler)

        def fast_tick_if_due() -> None:
            nonlocal next_fast
            now = mono()
            if fast and now >= next_fast:
                self.sampler.tick_fast()
                # after a stall (suspended VM, slow driver) skip the missed ticks rather than burst
                next_fast = max(next_fast + s.fast_interval_s, now + s.fast_interval_s / 2)

        try:
            while not stop.is_set():
                now = mono()
                if now >= next_sample:
                    if fast and next_fast <= now + s.fast_interval_s / 2:
                        # the full reading reads memory and power of every GPU: it stands in for the tick due now
                        next_fast = max(next_fast + s.fast_interval_s, now + s.fast_interval_s / 2)
                    self.sampler.sample(between=fast_tick_if_due)
                    next_sample = max(next_sample + s.interval_s, now + s.interval_s / 2)
                else:
                    fast_tick_if_due()
                if now >= next_batch:
                    self.cut_batch()
                    next_batch = max(next_batch + s.batch_interval_s, now + s.batch_interval_s / 2)
                wake = min(next_sample, next_batch, next_fast if fast else next_sample)
                wait_until(stop, wake - mono())
        finally:
            try:
                self.cut_batch()
            finally:
                ship_stop.set()
                shipper.join(timeout=self.settings.http_timeout_s + 1)
                if not shipper.is_alive():
                    self.shipper.flush(STOP_FLUSH_S)
                left = len(self.spool)
                if left:
                    log.info("%d batches stay spooled in %s for the next start", left, s.spool_dir)
                self.close()

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        self.spool.close()
        self.transport.close()
        self.devices.close()
        if isinstance(self.sampler, Sampler):
            self.sampler.attributor.close()  # its pidfds


def run_agent(settings: AgentSettings, *, source: str, stop: threading.Event) -> None:
    """Run the node agent until `stop` is set (usable in a thread). Raises SourceError or
    DeviceUnavailableError when the devices cannot be opened, SpoolError when the spool is unusable,
    MetricsPortError when the metrics port cannot be listened on."""
    devices = open_devices(source, replay_job_id=settings.replay_job_id,
                           power_instant_10hz=settings.power_instant_10hz)
    try:
        agent = Agent(settings, devices)
    except BaseException:
        devices.close()
        raise
    agent.run(stop)


__all__ = ["Agent", "DeviceUnavailableError", "MetricsPortError", "SourceError", "open_devices", "run_agent"]
