"""Does the NVML test double over-charge its own Python? Its Python per call against pynvml's, cold and hot.

    .venv/bin/python bench/nvml_double_python.py

The agent overhead bench (bench/agent_overhead.py) runs the agent on the pynvml test double (agent/devices/fake.py):
each call spins for the latency measured on an H100 through pynvml (so the spin already holds pynvml's own Python,
timed hot, 200 calls in a row), and the double then runs its own Python on top. In the agent a call is cold: the
sampling thread has slept 100 ms before it. If the double's Python cost more than pynvml's, the bench would charge
the agent for the apparatus. Here both run the same calls with no driver behind them: pynvml's wrappers around a C
function that returns 0 at once (libc's sched_yield, which ignores the arguments NVML's functions get), and the double
with zero latencies; each call of the 8 GPUs after a 100 ms sleep (cold) and 2000 times in a row (hot).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from agent.devices.fake import FakeNvml  # noqa: E402
from bench.report import write_report  # noqa: E402

GPUS = 8
COLD_ROUNDS = 60
HOT_ROUNDS = 2000


def per_call_us(call: Callable[[Any], Any], handles: list[Any]) -> tuple[float, float]:
    """(cold, hot) thread CPU per call in us: each round calls every handle once."""
    cold = 0.0
    for _ in range(COLD_ROUNDS):
        time.sleep(0.1)
        t = time.thread_time()
        for h in handles:
            call(h)
        cold += time.thread_time() - t
    t = time.thread_time()
    for _ in range(HOT_ROUNDS):
        for h in handles:
            call(h)
    hot = time.thread_time() - t
    return 1e6 * cold / (COLD_ROUNDS * len(handles)), 1e6 * hot / (HOT_ROUNDS * len(handles))


def main() -> int:
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    stub = libc.sched_yield  # returns 0 (NVML_SUCCESS) and ignores its arguments
    for name in ("nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetFieldValues", "nvmlDeviceGetUtilizationRates"):
        pynvml._nvmlGetFunctionPointer_cache[name] = stub
    double = FakeNvml.with_gpus(GPUS, realistic=False)  # no latencies: its Python alone
    double.nvmlInit()
    fake_handles = [double.nvmlDeviceGetHandleByIndex(i) for i in range(GPUS)]
    real_handles = [ctypes.c_void_p(i + 1) for i in range(GPUS)]
    power = [pynvml.NVML_FI_DEV_POWER_AVERAGE]
    v2 = pynvml.nvmlMemory_v2
    calls: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
        "memory_info_v2": (lambda h: pynvml.nvmlDeviceGetMemoryInfo(h, v2),
                           lambda h: double.nvmlDeviceGetMemoryInfo(h, v2)),
        "field_values_power": (lambda h: pynvml.nvmlDeviceGetFieldValues(h, power),
                               lambda h: double.nvmlDeviceGetFieldValues(h, power)),
        "utilization_rates": (pynvml.nvmlDeviceGetUtilizationRates, double.nvmlDeviceGetUtilizationRates),
    }
    figures: dict[str, dict[str, float]] = {}
    print(f"{'call':22s} {'pynvml cold':>12s} {'double cold':>12s} {'pynvml hot':>11s} {'double hot':>11s}   us/call")
    for name, (real, fake) in calls.items():
        real_cold, real_hot = per_call_us(real, real_handles)
        fake_cold, fake_hot = per_call_us(fake, fake_handles)
        print(f"{name:22s} {real_cold:12.1f} {fake_cold:12.1f} {real_hot:11.1f} {fake_hot:11.1f}")
        figures[name] = {"pynvml_cold_us": real_cold, "double_cold_us": fake_cold,
                         "pynvml_hot_us": real_hot, "double_hot_us": fake_hot}
    print("pynvml's figures include the stub's own call (a syscall); the spin of the double already holds pynvml's "
          "hot share")
    write_report(__file__, {"gpus_count": GPUS, "cold_rounds_count": COLD_ROUNDS, "calls": figures})
    return 0


if __name__ == "__main__":
    sys.exit(main())
