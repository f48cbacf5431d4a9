"""Does the shipped power need the agent's 10 Hz power reads? power_w as the agent computes it (the mean of the
interval's 10 readings) against a single reading per interval, on a simulated training job's instantaneous power.

    .venv/bin/python bench/power_cadence.py

The agent reads instantaneous power (NVML_FI_DEV_POWER_INSTANT on A100/H100) at 10 Hz and ships the interval's
mean (`power_w`) and max (`power_max_w`); the alternative weighed for issue #20's CPU target reads it once per
interval, with the full reading. The server uses `power_w` as a 1-s series: the iteration period from telemetry
(`server.analysis.time.iterations`, power first among its signals), the split of each energy-counter delta over the
intervals it spans (the counter is read every 60th interval), energy where the counter is missing, stragglers,
plots, the Prometheus export. This bench measures, per iteration period, over `--seeds` jobs of 10 min each:
- the RMS error of the 1-s value against the true mean power of its interval (what a plot or an energy split sees);
- how often the iteration-period detector finds a period: a correct one (within 5 %) for iterations of 2 s and
  more, a false one for shorter iterations (under 2 samples at 1 s: they alias; the detector is specified for
  periods of 2 samples and more, and a false period is worse than none: it is cross-checked against the hooks
  and reported).
The job: each iteration busy for 70 % of it at 650 W, then 250 W (communication, input); iteration lengths
jitter by 3 % (sd), the sensor by 10 W (sd). Readings at 10 Hz, the 10th at the row's timestamp (the full
reading stands in for the tick due with it, as in agent/daemon.py).

Second table: the sensor A100s and H100s have (Yang et al., "Accurate and Convenient Energy Measurements for
GPUs", SC'24: "only 25 % of the runtime is sampled"): each 100 ms the sensor averages 25 ms of power (a random
phase per job); the instantaneous field answers the latest such window, and the driver's 1-s mean
(NVML_FI_DEV_POWER_AVERAGE, what the agent reads once a second where the GPU has it) the mean of the last ten.
Columns: the agent's 10 Hz mean of instantaneous reads (with FLEETPROF_POWER_INSTANT_10HZ), one instantaneous
read per interval, and the driver's 1-s mean read once per interval (the default where available).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.report import write_report  # noqa: E402
from server.analysis.time.iterations import detect_period  # noqa: E402

BUSY_W, WAIT_W, BUSY_SHARE = 650.0, 250.0, 0.7
JITTER, NOISE_W = 0.03, 10.0
FS = 2000  # samples/s of the simulated instantaneous power
PERIODS_S = (0.35, 0.9, 1.3, 2.5, 4.0, 7.0)


def job_power(period_s: float, seconds: float, rng: np.random.Generator) -> np.ndarray:
    """Instantaneous power at FS samples/s of a job whose iterations last `period_s` (jittered)."""
    t = np.arange(0.0, seconds, 1 / FS)
    n = int(seconds / period_s * 1.2) + 10
    ends = np.cumsum(period_s * (1 + JITTER * rng.standard_normal(n)))
    starts = np.concatenate([[0.0], ends[:-1]])
    i = np.searchsorted(ends, t, side="right")
    busy = (t - starts[i]) < BUSY_SHARE * (ends[i] - starts[i])
    return np.where(busy, BUSY_W, WAIT_W) + NOISE_W * rng.standard_normal(t.size)


def rows(power: np.ndarray, seconds: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Row timestamps, power_w from the 10 Hz readings (mean), from the full reading alone, and the true mean."""
    ts = np.arange(1, seconds, dtype=np.float64)
    at = ((ts[:, None] - 1 + (np.arange(10)[None, :] + 1) / 10) * FS).astype(int) - 1  # 10 readings, last at ts
    readings = power[at]
    true = power[: (seconds - 1) * FS].reshape(seconds - 1, FS).mean(axis=1)
    return ts, readings.mean(axis=1), readings[:, -1], true


WINDOW_S, EVERY_S = 0.025, 0.1  # the part-time sensor: 25 ms averaged in every 100 ms


def part_time_rows(power: np.ndarray, seconds: int, rng: np.random.Generator
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """With the part-time sensor: the 10 Hz mean of instantaneous reads, one instantaneous read, the driver's
    1-s mean read once (each at the row's timestamp), per row."""
    win, every = int(WINDOW_S * FS), int(EVERY_S * FS)
    phase = int(rng.integers(0, every))
    n = (power.size - phase - win) // every
    starts = phase + every * np.arange(n)
    window_mean = power[starts[:, None] + np.arange(win)[None, :]].mean(axis=1)

    def latest(t_s: np.ndarray) -> np.ndarray:  # index of the latest window completed at each time
        return np.clip(((t_s * FS).astype(int) - phase - win) // every, 0, n - 1)

    ts = np.arange(1, seconds, dtype=np.float64)
    reads = ts[:, None] - 1 + (np.arange(10)[None, :] + 1) / 10
    last = latest(ts)
    ten = np.clip(last[:, None] - np.arange(10)[None, :], 0, n - 1)
    return window_mean[latest(reads)].mean(axis=1), window_mean[last], window_mean[ten].mean(axis=1), ts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10, help="simulated jobs per iteration period")
    ap.add_argument("--seconds", type=int, default=600, help="length of each job at 1-s rows")
    args = ap.parse_args()
    figures: dict[str, dict[str, float]] = {}
    print(f"{'iteration':>9}  {'RMS error of the 1-s value, W':>31}  {'periods detected (of ' + str(args.seeds) + ')':>36}")
    print(f"{'':>9}  {'10 Hz mean':>15} {'one reading':>15}  {'10 Hz mean':>17} {'one reading':>18}")
    for period in PERIODS_S:
        rng = np.random.default_rng(int(period * 1000))
        err_mean, err_one, found_mean, found_one = [], [], 0, 0
        for _ in range(args.seeds):
            ts, mean, one, true = rows(job_power(period, args.seconds, rng), args.seconds)
            err_mean.append(float(np.sqrt(np.mean((mean - true) ** 2))))
            err_one.append(float(np.sqrt(np.mean((one - true) ** 2))))
            for series, is_mean in ((mean, True), (one, False)):
                res = detect_period(ts, series)
                hit = res is not None and (period < 2.0 or abs(res.period_s / period - 1) <= 0.05)
                if hit and is_mean:
                    found_mean += 1
                elif hit:
                    found_one += 1
        kind = "false" if period < 2.0 else "correct"
        print(f"{period:>7.2f} s  {np.median(err_mean):>13.1f} W {np.median(err_one):>13.1f} W  "
              f"{found_mean:>8} {kind:>8} {found_one:>9} {kind:>8}")
        figures[f"iteration_{period:g}_s".replace(".", "_")] = {
            "period_s": period, "rms_error_10hz_mean_w": float(np.median(err_mean)),
            "rms_error_one_reading_w": float(np.median(err_one)),
            f"{kind}_periods_10hz_mean_count": found_mean, f"{kind}_periods_one_reading_count": found_one}
    print("\nthe A100/H100 part-time sensor (25 ms of every 100 ms): RMS error of the 1-s value, W / periods detected")
    print(f"{'iteration':>9}  {'10 Hz mean':>12} {'one instant':>12} {'1-s mean once':>14}  "
          f"{'10 Hz mean':>10} {'one instant':>12} {'1-s mean once':>14}")
    part_time: dict[str, dict[str, float]] = {}
    for period in PERIODS_S:
        rng = np.random.default_rng(int(period * 1000) + 1)
        errs: dict[str, list[float]] = {"10hz_mean": [], "one_instant": [], "driver_mean_once": []}
        found = dict.fromkeys(errs, 0)
        for _ in range(args.seeds):
            power = job_power(period, args.seconds, rng)
            true = power[: (args.seconds - 1) * FS].reshape(args.seconds - 1, FS).mean(axis=1)
            mean10, one, driver, ts = part_time_rows(power, args.seconds, rng)
            for name, series in (("10hz_mean", mean10), ("one_instant", one), ("driver_mean_once", driver)):
                errs[name].append(float(np.sqrt(np.mean((series - true) ** 2))))
                res = detect_period(ts, series)
                found[name] += int(res is not None and (period < 2.0 or abs(res.period_s / period - 1) <= 0.05))
        kind = "false" if period < 2.0 else "correct"
        med = {k: float(np.median(v)) for k, v in errs.items()}
        print(f"{period:>7.2f} s  {med['10hz_mean']:>10.1f} W {med['one_instant']:>10.1f} W "
              f"{med['driver_mean_once']:>12.1f} W  {found['10hz_mean']:>4} {kind:<5} {found['one_instant']:>6} "
              f"{kind:<5} {found['driver_mean_once']:>8} {kind:<5}")
        part_time[f"iteration_{period:g}_s".replace(".", "_")] = {
            "period_s": period, **{f"rms_error_{k}_w": v for k, v in med.items()},
            **{f"{kind}_periods_{k}_count": v for k, v in found.items()}}
    write_report(__file__, {"seeds_count": args.seeds, "job_s": args.seconds, **figures,
                            "part_time_sensor": part_time})
    return 0


if __name__ == "__main__":
    sys.exit(main())
