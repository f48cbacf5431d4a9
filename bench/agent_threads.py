"""Where the agent's CPU goes: thread CPU time per thread, the NVML test double's simulated driver time, and NVML
calls per second, with the agent in this process (the same settings as bench/agent_overhead.py).

    .venv/bin/python bench/agent_threads.py                  # 8 simulated GPUs, 1 Hz, 10 Hz peaks, 60 s
    .venv/bin/python bench/agent_threads.py --profile        # plus a cProfile of the sampling thread (top 25)

The devices are the pynvml test double (agent/devices/fake.py) with the per-call latencies measured on an H100;
its spin time (what stands for the driver's CPU time) is counted per call and reported apart from the agent's
own Python. The sink is a real HTTP server in this process (its thread is not counted). Not a target: the
target is bench/agent_overhead.py's, measured on a separate process.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from agent.config import AgentSettings  # noqa: E402
from agent.daemon import Agent  # noqa: E402
from agent.devices.fake import FakeNvml  # noqa: E402
from agent.devices.nvml import NvmlDevices  # noqa: E402
from bench.agent_overhead import Sink  # noqa: E402
from bench.report import write_report  # noqa: E402


def _thread_cpu_s(native_ids: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user + system) of each named thread, by its native id."""
    by_id = {t.id: t.user_time + t.system_time for t in psutil.Process().threads()}
    return {name: by_id.get(tid, 0.0) for name, tid in native_ids.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--duration", type=float, default=60.0, help="measured seconds (after the warm-up)")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--profile", action="store_true", help="cProfile the sampling thread (adds its own overhead)")
    args = ap.parse_args()
    sink = Sink()
    nvml = FakeNvml.with_gpus(args.gpus, realistic=True)
    spin = threading.local()
    spin_s: dict[str, float] = {}
    real_cost = nvml._cost

    def counted_cost(name: str, extra_s: float = 0.0) -> None:  # the double's simulated driver CPU, per call
        t = time.thread_time()
        real_cost(name, extra_s)
        spent = time.thread_time() - t
        spin_s[name] = spin_s.get(name, 0.0) + spent
        spin.total = getattr(spin, "total", 0.0) + spent

    nvml._cost = counted_cost  # type: ignore[method-assign]
    in_call_s = [0.0]  # thread CPU inside the double's NVML functions: its spin and its own Python
    depth = threading.local()

    def timed(fn: Any) -> Any:
        def call(*a: Any, **kw: Any) -> Any:
            outer = not getattr(depth, "n", 0)
            depth.n = getattr(depth, "n", 0) + 1
            t = time.thread_time() if outer else 0.0
            try:
                return fn(*a, **kw)
            finally:
                depth.n -= 1
                if outer:
                    in_call_s[0] += time.thread_time() - t
        return call

    for name in dir(nvml):
        if name.startswith("nvml") and callable(getattr(nvml, name)):
            setattr(nvml, name, timed(getattr(nvml, name)))
    devices = NvmlDevices(nvml)
    devices.source = "test"
    profiler = cProfile.Profile() if args.profile else None
    gc_runs = [0, 0, 0]
    gc_s = [0.0, 0.0, 0.0]
    gc_t0: list[float] = [0.0]

    def gc_timer(phase: str, info: dict[str, int]) -> None:  # collections and their thread CPU, by generation
        if phase == "start":
            gc_t0[0] = time.thread_time()
        else:
            gc_runs[info["generation"]] += 1
            gc_s[info["generation"]] += time.thread_time() - gc_t0[0]

    gc.callbacks.append(gc_timer)
    with tempfile.TemporaryDirectory() as tmp:
        settings = AgentSettings(server_url=sink.url, token="bench", spool_dir=Path(tmp) / "spool", node_name="bench",
                                 interval_s=args.interval)
        agent = Agent(settings, devices)
        stop = threading.Event()
        ids: dict[str, int] = {}
        spin_of: dict[str, float] = {}

        def sampling() -> None:
            ids["sampler"] = threading.get_native_id()
            try:
                if profiler is not None:
                    profiler.runcall(agent.run, stop)
                else:
                    agent.run(stop)
            finally:
                spin_of["sampler"] = getattr(spin, "total", 0.0)

        thread = threading.Thread(target=sampling, name="bench-sampler")
        thread.start()
        time.sleep(args.warmup)
        for t in threading.enumerate():
            if t.name == "fleetprof-shipper" and t.native_id is not None:
                ids["shipper"] = t.native_id
        calls0, spin0, cpu0, t0 = dict(nvml.calls), dict(spin_s), _thread_cpu_s(ids), time.monotonic()
        in_call0 = in_call_s[0]
        gc_runs0, gc_s0 = list(gc_runs), list(gc_s)
        proc0 = psutil.Process().cpu_times()
        time.sleep(args.duration)
        calls1, spin1, cpu1, t1 = dict(nvml.calls), dict(spin_s), _thread_cpu_s(ids), time.monotonic()
        in_call1 = in_call_s[0]
        proc1 = psutil.Process().cpu_times()
        gc_runs1, gc_s1 = list(gc_runs), list(gc_s)
        stop.set()
        thread.join(30)
    wall = t1 - t0
    pct = {name: 100 * (cpu1[name] - cpu0.get(name, 0.0)) / wall for name in cpu1}
    sim = {name: 100 * (spin1[name] - spin0.get(name, 0.0)) / wall for name in spin1}
    rate = {name: (calls1[name] - calls0.get(name, 0)) / wall for name in calls1}
    sim_total = sum(sim.values())
    in_call = 100 * (in_call1 - in_call0) / wall
    rows = [("wall", f"{wall:.1f} s after {args.warmup:g} s warm-up; {args.gpus} GPUs, {args.interval:g} s interval"),
            ("process CPU (all threads, sink included)",
             f"{100 * (proc1.user + proc1.system - proc0.user - proc0.system) / wall:.3f} % of one core"),
            *((f"thread {name}", f"{v:.3f} % of one core") for name, v in sorted(pct.items())),
            *((f"gc generation {g}", f"{(gc_runs1[g] - gc_runs0[g]) / wall:.2f} collections/s, "
                                     f"{100 * (gc_s1[g] - gc_s0[g]) / wall:.3f} % of one core") for g in range(3)),
            ("simulated NVML driver CPU (the double's spin)", f"{sim_total:.3f} % of one core"),
            ("in the double's calls (spin + its own Python)", f"{in_call:.3f} % of one core"),
            ("sampler thread less simulated NVML", f"{pct.get('sampler', 0.0) - sim_total:.3f} % of one core"),
            ("sampler thread less the double's calls", f"{pct.get('sampler', 0.0) - in_call:.3f} % of one core")]
    rows += [(f"  {name}", f"{rate[name]:.1f} calls/s, {sim.get(name, 0.0):.3f} %")
             for name in sorted(rate, key=lambda n: -sim.get(n, 0.0)) if rate[name] > 0]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
        print(out.getvalue())
    figures: dict[str, Any] = {
        "wall_s": wall, "gpus_count": args.gpus, "interval_s": args.interval,
        "thread_cpu_of_one_core": {f"{k}_pct": v for k, v in pct.items()}, "simulated_nvml_cpu_of_one_core_pct": sim_total,
        "sampler_less_simulated_nvml_pct": pct.get("sampler", 0.0) - sim_total,
        "in_double_calls_pct": in_call, "sampler_less_double_calls_pct": pct.get("sampler", 0.0) - in_call,
        "gc_collections": {f"generation{g}_per_s": (gc_runs1[g] - gc_runs0[g]) / wall for g in range(3)},
        "gc_cpu_of_one_core": {f"generation{g}_pct": 100 * (gc_s1[g] - gc_s0[g]) / wall for g in range(3)},
        "nvml_calls": {f"{k}_per_s": v for k, v in rate.items()}, "profiled_ok": profiler is not None}
    write_report(__file__, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
