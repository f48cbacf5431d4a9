"""`fleetprof tune power`: a short power-cap sweep on this node (Zeus style, NSDI'23).

For each cap the node's GPUs are set to it (nvmlDeviceSetPowerManagementLimit, within the driver's min/max
constraints), the command runs as a profiled job of one name (`fleetprof run --name NAME`: its samples carry
the enforced limit, `power_limit_w`), and at the end, also on Ctrl-C or an error, every GPU gets back the limit
it had before. The server's right-sizing of that name then compares energy and time per step across the caps
(server/analysis/fleet/rightsizing.py `power_cap_choice`).

Units: caps are watts here and at the CLI, milliwatts inside the device layer (as NVML has them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent.devices.base import Devices

log = logging.getLogger(__name__)
_MW_PER_W = 1000


@dataclass(frozen=True)
class CapRun:
    """One run of the sweep: the cap it ran at (W, as set through NVML) and the job that recorded it."""

    power_limit_w: float
    job_id: str
    state: str  # the job's end state: finished | failed | killed | oom
    exit_code: int


def physical_slots(devices: Devices) -> list[int]:
    """The slots whose power limit can be set: physical GPUs (a MIG device shares its parent's limit)."""
    return [g.slot for g in devices.gpus() if g.mig_parent_uuid is None]


def common_constraints_w(devices: Devices, slots: Sequence[int]) -> tuple[float, float]:
    """(min, max) cap in W that every one of `slots` accepts."""
    if not slots:
        raise ValueError("no GPU whose power limit can be set")
    ranges = [devices.power_limit_constraints_mw(s) for s in slots]
    lo, hi = max(r[0] for r in ranges) / _MW_PER_W, min(r[1] for r in ranges) / _MW_PER_W
    if lo > hi:
        raise ValueError("the GPUs have no power limit in common")
    return lo, hi


def sweep_caps_w(lo_w: float, hi_w: float, steps: int) -> list[float]:
    """`steps` caps from the highest (the uncapped baseline) down to the lowest, evenly spaced, whole watts."""
    if steps < 2:
        raise ValueError("a sweep needs at least 2 caps")
    span = hi_w - lo_w
    caps = [round(hi_w - span * i / (steps - 1)) for i in range(steps)]
    return sorted({float(c) for c in caps if lo_w <= c <= hi_w}, reverse=True)


def check_caps_w(caps_w: Sequence[float], lo_w: float, hi_w: float) -> None:
    """ValueError naming the first cap outside [lo, hi] or a sweep of fewer than 2 distinct caps."""
    for cap in caps_w:
        if not lo_w <= cap <= hi_w:
            raise ValueError(f"power cap {cap:g} W is outside the range the GPUs accept, {lo_w:g}-{hi_w:g} W")
    if len(set(caps_w)) < 2:
        raise ValueError("a sweep needs at least 2 distinct caps")


def run_sweep(devices: Devices, caps_w: Sequence[float], run_one: Callable[[float], CapRun], *,
              slots: Sequence[int] | None = None) -> list[CapRun]:
    """Set each cap on `slots` (default: every physical GPU), call `run_one(cap)`, and restore the limits the
    GPUs had before, whatever happens (Ctrl-C, an error, a failed run). A run that fails ends the sweep."""
    slots = list(physical_slots(devices) if slots is None else slots)
    lo, hi = common_constraints_w(devices, slots)
    check_caps_w(caps_w, lo, hi)
    original = {s: devices.power_limit_mw(s) for s in slots}
    runs: list[CapRun] = []
    try:
        for cap in caps_w:
            for s in slots:
                devices.set_power_limit_mw(s, int(round(cap * _MW_PER_W)))
            result = run_one(cap)
            runs.append(result)
            if result.state != "finished":
                log.warning("the run at %g W %s (exit status %d): the sweep stops", cap, result.state,
                            result.exit_code)
                break
    finally:
        for s, limit in original.items():
            if limit is None:
                continue
            try:
                devices.set_power_limit_mw(s, limit)
            except Exception as exc:  # noqa: BLE001 - restore the others, say which one is left capped
                log.error("GPU slot %d: could not restore its power limit of %g W: %s", s, limit / _MW_PER_W, exc)
    return runs
