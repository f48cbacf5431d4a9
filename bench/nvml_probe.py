"""What NVML answers on a real GPU, and how long each call takes: `python bench/nvml_probe.py` on a GPU machine.

Writes bench/results/nvml_probe_<device>.json (via bench/report.py) and prints a table:
1. the latency of every NVML call the agent makes per sample (median and p95 of 200 calls, microseconds): the
   figures the NVML test double's latencies (bench/agent_overhead.py) should match;
2. GPM (Hopper and later): whether the device supports it, and the metrics the agent would ship (SM activity,
   SM occupancy, tensor activity, DRAM bandwidth utilization, PCIe throughput) over 1 s windows while the GPU is
   idle, while it runs a bf16 matrix product loop, and while it copies memory: what each load should look like.

Needs only torch with CUDA and nvidia-ml-py. Without a GPU it prints one line and exits with status 2.
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GPM_METRICS = {  # name -> pynvml constant name
    "sm_activity_pct": "NVML_GPM_METRIC_SM_UTIL",
    "sm_occupancy_pct": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "tensor_activity_pct": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "dram_bw_util_pct": "NVML_GPM_METRIC_DRAM_BW_UTIL",
    "fp16_util_pct": "NVML_GPM_METRIC_FP16_UTIL",
    "fp32_util_pct": "NVML_GPM_METRIC_FP32_UTIL",
    "pcie_tx_bytes_per_s": "NVML_GPM_METRIC_PCIE_TX_PER_SEC",  # NVML answers MiB/s: scaled below
    "pcie_rx_bytes_per_s": "NVML_GPM_METRIC_PCIE_RX_PER_SEC",
    "graphics_util_pct": "NVML_GPM_METRIC_GRAPHICS_UTIL",
}


T = TypeVar("T")


def latency_us(fn: Callable[[], Any], n: int = 200) -> dict[str, float | str | None]:
    times = []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
    except Exception as exc:  # noqa: BLE001 - an unsupported call is a finding, not a failure
        return {"median_us": None, "p95_us": None, "error": f"{type(exc).__name__}: {exc}"}
    times.sort()
    return {"median_us": round(statistics.median(times), 1), "p95_us": round(times[int(0.95 * len(times))], 1)}


def call_latencies(pynvml: Any, h: Any) -> dict[str, dict[str, float | str | None]]:
    p = pynvml
    calls: dict[str, Callable[[], Any]] = {
        "nvmlDeviceGetMemoryInfo": lambda: p.nvmlDeviceGetMemoryInfo(h),
        "nvmlDeviceGetPowerUsage": lambda: p.nvmlDeviceGetPowerUsage(h),
        "nvmlDeviceGetTotalEnergyConsumption": lambda: p.nvmlDeviceGetTotalEnergyConsumption(h),
        "nvmlDeviceGetUtilizationRates": lambda: p.nvmlDeviceGetUtilizationRates(h),
        "nvmlDeviceGetClockInfo(SM)": lambda: p.nvmlDeviceGetClockInfo(h, p.NVML_CLOCK_SM),
        "nvmlDeviceGetClockInfo(MEM)": lambda: p.nvmlDeviceGetClockInfo(h, p.NVML_CLOCK_MEM),
        "nvmlDeviceGetTemperature": lambda: p.nvmlDeviceGetTemperature(h, p.NVML_TEMPERATURE_GPU),
        "nvmlDeviceGetCurrentClocksEventReasons": lambda: p.nvmlDeviceGetCurrentClocksEventReasons(h),
        "nvmlDeviceGetComputeRunningProcesses": lambda: p.nvmlDeviceGetComputeRunningProcesses(h),
        "nvmlDeviceGetPowerManagementLimit": lambda: p.nvmlDeviceGetPowerManagementLimit(h),
        "nvmlDeviceGetApplicationsClock(SM)": lambda: p.nvmlDeviceGetApplicationsClock(h, p.NVML_CLOCK_SM),
        "nvmlDeviceGetPcieThroughput(TX)": lambda: p.nvmlDeviceGetPcieThroughput(h, p.NVML_PCIE_UTIL_TX_BYTES),
        "nvmlDeviceGetTotalEccErrors": lambda: p.nvmlDeviceGetTotalEccErrors(
            h, p.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, p.NVML_VOLATILE_ECC),
        "nvmlDeviceGetRetiredPages": lambda: p.nvmlDeviceGetRetiredPages(
            h, p.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
        "nvmlDeviceGetRemappedRows": lambda: p.nvmlDeviceGetRemappedRows(h),
        # the agent's power readings: the driver's 1-s mean (read once a second where the GPU has it) and the
        # instantaneous field (read at 10 Hz otherwise)
        "nvmlDeviceGetFieldValues(POWER_AVERAGE)": lambda: p.nvmlDeviceGetFieldValues(h, [p.NVML_FI_DEV_POWER_AVERAGE]),
        "nvmlDeviceGetFieldValues(POWER_INSTANT)": lambda: p.nvmlDeviceGetFieldValues(h, [p.NVML_FI_DEV_POWER_INSTANT]),
        # energy: the total-energy field costs ~3 ms; is the other energy field cheaper?
        "nvmlDeviceGetFieldValues(ENERGY)": lambda: p.nvmlDeviceGetFieldValues(h, [p.NVML_FI_DEV_ENERGY]),
    }
    return {name: latency_us(fn, n=50 if "Process" in name else 200) for name, fn in calls.items()}


class Gpm:
    def __init__(self, pynvml: Any, h: Any) -> None:
        self.p, self.h = pynvml, h
        self.ids = {name: getattr(pynvml, const) for name, const in GPM_METRICS.items() if hasattr(pynvml, const)}

    def supported(self) -> bool:
        try:
            return bool(self.p.nvmlGpmQueryDeviceSupport(self.h).isSupportedDevice)
        except Exception:  # noqa: BLE001
            return False

    def _between(self, seconds: float, use: Callable[[Any], T]) -> T:
        """`use(request)` on a metrics request between two samples `seconds` apart (the samples freed after)."""
        p = self.p
        s1, s2 = p.nvmlGpmSampleAlloc(), p.nvmlGpmSampleAlloc()
        try:
            p.nvmlGpmSampleGet(self.h, s1)
            time.sleep(seconds)
            p.nvmlGpmSampleGet(self.h, s2)
            get = p.c_nvmlGpmMetricsGet_t()
            get.version = p.NVML_GPM_METRICS_GET_VERSION
            get.numMetrics = len(self.ids)
            get.sample1, get.sample2 = s1, s2
            for i, metric_id in enumerate(self.ids.values()):
                get.metrics[i].metricId = metric_id
            return use(get)
        finally:
            p.nvmlGpmSampleFree(s1)
            p.nvmlGpmSampleFree(s2)

    def window(self, seconds: float) -> dict[str, float | None]:
        def metrics(get: Any) -> dict[str, float | None]:
            self.p.nvmlGpmMetricsGet(get)
            return {name: (round(get.metrics[i].value * (2**20 if name.endswith("_bytes_per_s") else 1), 2)
                           if get.metrics[i].nvmlReturn == 0 else None) for i, name in enumerate(self.ids)}

        return self._between(seconds, metrics)

    def metrics_get_latency(self) -> dict[str, float | str | None]:
        """nvmlGpmMetricsGet between two samples (computed in the library; the double assumes 25 us)."""
        return self._between(0.1, lambda get: latency_us(lambda: self.p.nvmlGpmMetricsGet(get), n=100))

    def sample_get_latency(self) -> dict[str, float | str | None]:
        s = self.p.nvmlGpmSampleAlloc()
        try:
            return latency_us(lambda: self.p.nvmlGpmSampleGet(self.h, s), n=100)
        finally:
            self.p.nvmlGpmSampleFree(s)


def pynvml_python_us(p: Any, h: Any) -> dict[str, Any]:
    """pynvml's own Python per call, hot: each wrapper against the same C function called through ctypes with its
    arguments prepared once. The NVML double's latencies (agent/devices/fake.py) were timed through pynvml, so they
    include this hot share; the double then runs its own Python on top, which costs no more than pynvml's does cold
    (bench/nvml_double_python.py)."""
    import ctypes

    mem_fn = p._nvmlGetFunctionPointer("nvmlDeviceGetMemoryInfo_v2")
    mem = p.c_nvmlMemory_v2_t()
    mem.version = p.nvmlMemory_v2
    mem_ref = ctypes.byref(mem)
    fv_fn = p._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
    values = (p.c_nvmlFieldValue_t * 1)()
    values[0].fieldId = p.NVML_FI_DEV_POWER_AVERAGE
    pairs = {
        "nvmlDeviceGetMemoryInfo_v2": (lambda: mem_fn(h, mem_ref),
                                       lambda: p.nvmlDeviceGetMemoryInfo(h, p.nvmlMemory_v2)),
        "nvmlDeviceGetFieldValues(POWER_AVERAGE)": (lambda: fv_fn(h, 1, values),
                                                    lambda: p.nvmlDeviceGetFieldValues(h, [p.NVML_FI_DEV_POWER_AVERAGE])),
    }
    out: dict[str, Any] = {}
    for name, (raw, wrapped) in pairs.items():
        r, w = latency_us(raw, n=2000)["median_us"], latency_us(wrapped, n=2000)["median_us"]
        both = isinstance(r, float) and isinstance(w, float)
        out[name] = {"ctypes_median_us": r, "pynvml_median_us": w,
                     "pynvml_python_us": round(float(w) - float(r), 2) if both else None}  # type: ignore[arg-type]
    return out


def _field_w(p: Any, h: Any, field: int) -> float | None:
    from agent.devices.nvml import value_reader  # the agent's own reading of a field's value union

    (fv,) = p.nvmlDeviceGetFieldValues(h, [field])
    v = value_reader(p)(fv) if fv.nvmlReturn == p.NVML_SUCCESS else None
    return None if v is None else float(v) / 1e3


def power_agreement(p: Any, h: Any, seconds: float = 10.0) -> dict[str, Any]:
    """Mean power over `seconds` three ways, as the agent can read it: the energy counter's delta (the reference),
    the 10 Hz mean of the instantaneous field, and the mean of the driver's 1-s mean read once a second; and how
    often each reading changes (its update period)."""
    instant_f, average_f = p.NVML_FI_DEV_POWER_INSTANT, p.NVML_FI_DEV_POWER_AVERAGE
    instant: list[float] = []
    average: list[float] = []
    e0, t0 = p.nvmlDeviceGetTotalEnergyConsumption(h), time.monotonic()
    tick = 0
    while time.monotonic() - t0 < seconds:
        tick += 1
        v = _field_w(p, h, instant_f)
        if v is not None:
            instant.append(v)
        if tick % 10 == 0:
            a = _field_w(p, h, average_f)
            if a is not None:
                average.append(a)
        time.sleep(max(0.0, t0 + tick * 0.1 - time.monotonic()))
    e1, t1 = p.nvmlDeviceGetTotalEnergyConsumption(h), time.monotonic()
    updates: dict[str, float | None] = {}
    for name, read in (("instant", lambda: _field_w(p, h, instant_f)), ("average", lambda: _field_w(p, h, average_f)),
                       ("get_power_usage", lambda: p.nvmlDeviceGetPowerUsage(h) / 1e3)):
        changes, last, start = [], read(), time.monotonic()
        while time.monotonic() - start < 3.0:
            v = read()
            if v != last:
                changes.append(time.monotonic())
                last = v
            time.sleep(0.001)
        gaps = [b - a for a, b in zip(changes, changes[1:], strict=False)]
        updates[f"{name}_update_period_ms"] = round(1e3 * statistics.median(gaps), 1) if gaps else None
    return {"energy_counter_mean_w": round((e1 - e0) / 1e3 / (t1 - t0), 2),
            "instant_10hz_mean_w": round(statistics.fmean(instant), 2) if instant else None,
            "average_1hz_mean_w": round(statistics.fmean(average), 2) if average else None,
            "instant_reads_count": len(instant), "average_reads_count": len(average), **updates}


def under_load(load: Callable[[threading.Event], None], measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    stop = threading.Event()
    t = threading.Thread(target=load, args=(stop,), daemon=True)
    t.start()
    time.sleep(1.0)  # the load is running and the clocks have risen
    try:
        return measure()
    finally:
        stop.set()
        t.join()


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("nvml_probe: no CUDA GPU here: nothing measured", file=sys.stderr)
        return 2
    import pynvml

    from bench.report import write_report

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    name = pynvml.nvmlDeviceGetName(h)
    name = name.decode() if isinstance(name, bytes) else name
    driver = pynvml.nvmlSystemGetDriverVersion()
    driver = driver.decode() if isinstance(driver, bytes) else driver
    result: dict[str, Any] = {"device": name, "driver": driver, "torch": torch.__version__,
                              "latency": call_latencies(pynvml, h)}
    gpm = Gpm(pynvml, h)
    result["gpm_supported"] = gpm.supported()

    def matmul(stop: threading.Event) -> None:
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        while not stop.is_set():
            for _ in range(20):
                a @ a
            torch.cuda.synchronize()

    def copy(stop: threading.Event) -> None:
        a = torch.empty(1 << 30, device="cuda", dtype=torch.uint8)
        b = torch.empty_like(a)
        while not stop.is_set():
            for _ in range(20):
                b.copy_(a)
            torch.cuda.synchronize()

    def reading() -> dict[str, Any]:
        util = pynvml.nvmlDeviceGetUtilizationRates(h)
        return {"nvml_gpu_util_pct": util.gpu, "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1e3,
                "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                "clocks_event_reasons": hex(pynvml.nvmlDeviceGetCurrentClocksEventReasons(h))}

    def measure() -> dict[str, Any]:
        out = {"gpm": gpm.window(1.0) if result["gpm_supported"] else None}
        out.update(reading())
        return out

    torch.cuda.init()
    result["idle"] = measure()
    result["bf16_matmul_8192"] = under_load(matmul, measure)
    result["device_copy_1GiB"] = under_load(copy, measure)
    result["pynvml_python"] = pynvml_python_us(pynvml, h)
    if result["gpm_supported"]:
        result["latency"]["nvmlGpmSampleGet"] = gpm.sample_get_latency()
        result["latency"]["nvmlGpmMetricsGet"] = gpm.metrics_get_latency()
    try:  # where the driver's 1-s mean and the instantaneous field agree with the energy counter, under load
        result["power_agreement_bf16_matmul"] = under_load(matmul, lambda: power_agreement(pynvml, h))
    except pynvml.NVMLError as exc:
        result["power_agreement_bf16_matmul"] = {"error": str(exc)}
    pynvml.nvmlShutdown()

    print(f"{name}, driver {driver}, GPM supported: {result['gpm_supported']}")
    print(f"{'call':45s} {'median us':>10s} {'p95 us':>10s}")
    for call, lat in result["latency"].items():
        print(f"{call:45s} {lat['median_us']!s:>10s} {lat['p95_us']!s:>10s} {lat.get('error', '')}")
    for load in ("idle", "bf16_matmul_8192", "device_copy_1GiB", "power_agreement_bf16_matmul", "pynvml_python"):
        print(load, json.dumps(result[load]))
    write_report(__file__, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
