"""Health findings per GPU over a window (a job's, or a recent fleet window): slowdowns from the clock-event reasons,
SM clock against its maximum, temperature against the slowdown threshold, XID errors, and the error counters (ECC,
retired pages, row remapping, PCIe replay, NVLink errors).

Time is sample-and-hold (`base.durations`): a finding's `seconds` is the time its samples stand for, `fraction` that
over the time the GPU's samples cover in the window. A counter finding says how much the counter rose in the window
(`count`) and when it first did; a flag finding (a pending retirement or remap) how long it was raised, each reading
holding until the next (the agent reads the health fields every 30th sample, null between).

Inputs are columns of `GpuSeries` by their protocol names (issue #20); a column the agent never sent is all-NaN and
gives no finding (unknown is not healthy, it is not reported at all). The reference SM clock and the slowdown
temperature come from the agent's GPU facts when it sent them, else the GPU catalogue, else the check is skipped.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fleetprof.report import HealthFinding, HealthSection, sample_source_suffix
from server.analysis.base.durations import hold_last, sample_durations
from server.analysis.base.gpu_catalog import find_model
from server.analysis.base.jobdata import GpuSeries
from server.analysis.health import reasons

# A slowdown shorter than this over the window is noise (a power-cap bit flickering at a load step), not a finding.
MIN_SLOWDOWN_S = 10.0
# Busy: kernels ran most of the sample (NVML utilization.gpu), the GPU was not idle-clocked.
BUSY_UTIL_PCT = 50.0
# SM clock check: a busy GPU below this share of its maximum, with no slowdown reason to explain it.
LOW_CLOCK_FRACTION = 0.9
MIN_LOW_CLOCK_S = 60.0
# Temperature check: within this many degrees of the slowdown threshold.
TEMPERATURE_MARGIN_C = 5.0

SLOWDOWN_TITLES = {"thermal": "thermal slowdown", "power_cap": "power-cap slowdown", "hw_slowdown": "hardware slowdown"}

# (column, finding kind, what it counts, source label); volatile ECC before aggregate: one finding per kind.
COUNTERS: tuple[tuple[str, str, str, str], ...] = (
    ("ecc_uncorrected_volatile", "ecc_uncorrected", "uncorrected ECC errors", "nvml:ecc volatile"),
    ("ecc_uncorrected_total", "ecc_uncorrected", "uncorrected ECC errors", "nvml:ecc aggregate"),
    ("ecc_corrected_volatile", "ecc_corrected", "corrected ECC errors", "nvml:ecc volatile"),
    ("ecc_corrected_total", "ecc_corrected", "corrected ECC errors", "nvml:ecc aggregate"),
    ("retired_pages_dbe", "retired_pages", "pages retired (double-bit ECC)", "nvml:retired pages"),
    ("retired_pages_sbe", "retired_pages", "pages retired (single-bit ECC)", "nvml:retired pages"),
    ("remapped_rows_uncorrectable", "row_remap", "rows remapped (uncorrectable errors)", "nvml:row remapping"),
    ("remapped_rows_correctable", "row_remap", "rows remapped (correctable errors)", "nvml:row remapping"),
    ("pcie_replay_total", "pcie_replay", "PCIe replays", "nvml:pcie replay counter"),
    ("nvlink_errors_total", "nvlink_errors", "NVLink errors (CRC flit + CRC data + replay + recovery)",
     "nvml:nvlink error counters"),
)
# Flags (0/1): how long they were raised.
FLAGS: tuple[tuple[str, str, str], ...] = (
    ("retired_pages_pending", "retired_pages_pending", "a page retirement pending (takes effect at the next reset)"),
    ("remapped_rows_pending", "row_remap_pending", "a row remap pending (takes effect at the next reset)"),
    ("remapped_rows_failed", "row_remap_failed", "a row remap failed (the GPU needs service)"),
)
SEVERITY = {"xid": "critical", "ecc_uncorrected": "critical", "row_remap_failed": "critical",
            "retired_pages_pending": "warning", "row_remap_pending": "warning", "retired_pages": "warning",
            "row_remap": "warning", "thermal": "warning", "hw_slowdown": "warning", "nvlink_errors": "warning",
            "pcie_replay": "info", "ecc_corrected": "info", "power_cap": "info", "sm_clock_low": "info",
            "temperature_near_slowdown": "info"}


@dataclass(frozen=True)
class Reference:
    value: float | None
    source: str | None


def max_sm_clock(g: GpuSeries) -> Reference:
    """The SM clock the GPU can reach: the agent's NVML max clock, else the catalogue's, else unknown."""
    if g.max_sm_clock_mhz is not None:
        return Reference(g.max_sm_clock_mhz, "nvml:max_sm_clock_mhz")
    model = find_model(g.name) if g.name else None
    if model is not None and model.max_sm_clock_mhz is not None:
        return Reference(model.max_sm_clock_mhz, f"catalogue:{model.name}")
    return Reference(None, None)


def slowdown_temperature(g: GpuSeries) -> Reference:
    return slowdown_threshold(g.slowdown_temperature_c, g.name)


def slowdown_threshold(nvml_c: float | None, gpu_name: str | None) -> Reference:
    """A GPU's slowdown temperature: what NVML said, else its catalogue model's, else unknown."""
    if nvml_c is not None:
        return Reference(nvml_c, "nvml:temperature threshold SLOWDOWN")
    model = find_model(gpu_name) if gpu_name else None
    if model is not None and model.slowdown_temperature_c is not None:
        return Reference(model.slowdown_temperature_c, f"catalogue:{model.name}")
    return Reference(None, None)


def near_slowdown(temperature_c: np.ndarray, threshold_c: float) -> np.ndarray:
    """Which samples ran within TEMPERATURE_MARGIN_C of the slowdown temperature (False where unknown)."""
    with np.errstate(invalid="ignore"):
        return np.asarray(temperature_c, dtype=np.float64) >= threshold_c - TEMPERATURE_MARGIN_C


def _utc(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _span(seconds: float) -> str:
    return f"{seconds / 60.0:.1f} min" if seconds >= 120 else f"{seconds:.0f} s"


def _episodes(mask: np.ndarray) -> int:
    m = mask.astype(np.int8)
    return int(np.sum(np.diff(np.concatenate([[0], m])) == 1))


def _mean(a: np.ndarray) -> float | None:
    a = a[~np.isnan(a)]
    return float(np.mean(a)) if a.size else None


def _clock_cost(g: GpuSeries, mask: np.ndarray, busy_ok: np.ndarray) -> dict[str, float | str | None]:
    """SM clock while `mask` against the reference: the max clock when known, else the GPU's own median clock
    when busy and not slowed down."""
    clock = g.column("sm_clock_mhz")
    during = _mean(clock[mask])
    ref = max_sm_clock(g)
    reference, source = (None if ref.value is None else float(ref.value)), ref.source
    if reference is None:
        normal = clock[busy_ok & ~np.isnan(clock)]
        if normal.size:
            reference, source = float(np.median(normal)), "this GPU's median SM clock when busy and not slowed down"
    drop = (1.0 - during / reference) * 100.0 if during is not None and reference else None
    return {"sm_clock_mean_mhz": during, "sm_clock_reference_mhz": reference, "sm_clock_reference_source": source,
            "sm_clock_drop_pct": drop}


def _cost_text(cost: dict[str, float | str | None]) -> str:
    drop, during, ref = cost["sm_clock_drop_pct"], cost["sm_clock_mean_mhz"], cost["sm_clock_reference_mhz"]
    if isinstance(drop, (int, float)) and isinstance(during, (int, float)) and isinstance(ref, (int, float)):
        return f"SM clock {-drop:+.0f} % ({during:.0f} vs {ref:.0f} MHz)"
    return "SM clock unknown"


def _slowdown_findings(g: GpuSeries, dur: np.ndarray, covered: float) -> list[HealthFinding]:
    out = []
    throttle = g.column("throttle_reasons")
    slowed = reasons.any_slowdown(throttle)
    util = g.column("gpu_util_pct")
    bits, known = reasons.as_bits(throttle)
    with np.errstate(invalid="ignore"):
        busy_ok = (util >= BUSY_UTIL_PCT) & ~slowed & ~(known & ((bits & reasons.GPU_IDLE) != 0))
    for kind, mask in reasons.slowdown_masks(throttle).items():
        seconds = float(np.sum(dur[mask]))
        if seconds < MIN_SLOWDOWN_S:
            continue
        first = int(np.flatnonzero(mask)[0])
        last = int(np.flatnonzero(mask)[-1])
        cost = _clock_cost(g, mask, busy_ok)
        fraction = seconds / covered if covered > 0 else None
        share = f" ({fraction:.0%} of the window)" if fraction is not None else ""
        out.append(_finding(
            g, kind, seconds=seconds, fraction=fraction, since_ts=float(g.ts[first]), until_ts=float(g.ts[last]),
            episodes=_episodes(mask), source="nvml:clock event reasons " + "+".join(
                reasons.names(reasons.SLOWDOWN_KINDS[kind])),
            summary=f"{SLOWDOWN_TITLES[kind]}: {_cost_text(cost)} for {_span(seconds)}{share}, "
                    f"first at {_utc(float(g.ts[first]))}",
            **cost))
    return out


def _low_clock_finding(g: GpuSeries, dur: np.ndarray) -> HealthFinding | None:
    """Busy, no slowdown reason, SM clock well below the maximum: clocks locked or capped by a setting."""
    ref = max_sm_clock(g)
    clock, util = g.column("sm_clock_mhz"), g.column("gpu_util_pct")
    if ref.value is None or np.all(np.isnan(clock)):
        return None
    throttle = g.column("throttle_reasons")
    bits, known = reasons.as_bits(throttle)
    idle_bit = known & ((bits & reasons.GPU_IDLE) != 0)
    with np.errstate(invalid="ignore"):
        busy = (util >= BUSY_UTIL_PCT) & ~idle_bit & ~reasons.any_slowdown(throttle)
        low = busy & (clock < LOW_CLOCK_FRACTION * ref.value)
    busy_s = float(np.sum(dur[busy]))
    seconds = float(np.sum(dur[low]))
    if seconds < MIN_LOW_CLOCK_S or busy_s <= 0:
        return None
    during = _mean(clock[low])
    app_clocks = bool(np.any(known[low] & ((bits[low] & reasons.APPLICATIONS_CLOCKS_SETTING) != 0)))
    drop = None if during is None else (1.0 - during / ref.value) * 100.0
    if app_clocks:
        why = "application clocks set below the maximum"
    elif not np.any(known[low]):
        why = "clock-event reasons not recorded"  # e.g. an nvidia-smi log without clocks_event_reasons.active
    else:
        why = "no NVML reason given"
    first = int(np.flatnonzero(low)[0])
    return _finding(
        g, "sm_clock_low", seconds=seconds, fraction=seconds / busy_s, since_ts=float(g.ts[first]),
        until_ts=float(g.ts[int(np.flatnonzero(low)[-1])]), episodes=_episodes(low),
        source="nvml:sm_clock_mhz vs max SM clock while busy", sm_clock_mean_mhz=during,
        sm_clock_reference_mhz=ref.value, sm_clock_reference_source=ref.source, sm_clock_drop_pct=drop,
        summary=f"SM clock {-(drop or 0.0):+.0f} % below its maximum ({during or 0.0:.0f} vs {ref.value:.0f} MHz) "
                f"for {_span(seconds)} of busy time ({seconds / busy_s:.0%}), {why}")


def _temperature_finding(g: GpuSeries, dur: np.ndarray, covered: float) -> HealthFinding | None:
    ref = slowdown_temperature(g)
    temp = g.column("temperature_c")
    if ref.value is None or np.all(np.isnan(temp)):
        return None
    hot = near_slowdown(temp, ref.value)
    seconds = float(np.sum(dur[hot]))
    if seconds < MIN_SLOWDOWN_S:
        return None
    first = int(np.flatnonzero(hot)[0])
    peak = float(np.nanmax(temp[hot]))
    return _finding(
        g, "temperature_near_slowdown", seconds=seconds, fraction=seconds / covered if covered > 0 else None,
        since_ts=float(g.ts[first]), until_ts=float(g.ts[int(np.flatnonzero(hot)[-1])]), episodes=_episodes(hot),
        source="nvml:temperature_c vs slowdown threshold", temperature_max_c=peak,
        slowdown_temperature_c=ref.value, slowdown_temperature_source=ref.source,
        summary=f"temperature within {TEMPERATURE_MARGIN_C:.0f} °C of its slowdown threshold ({ref.value:.0f} °C) "
                f"for {_span(seconds)}, up to {peak:.0f} °C")


def _xid_finding(g: GpuSeries) -> HealthFinding | None:
    """XID errors the agent saw in the window. `xid_last` holds the latest XID since the agent started: a change of
    value (or a first value) inside the window is a new error; a value already there at the window's start is an
    earlier one, not counted (the same XID twice in a row is seen once)."""
    x = g.column("xid_last")
    ok = np.flatnonzero(~np.isnan(x))
    if ok.size == 0:
        return None
    vals = x[ok]
    # a value at the window's first sample is from before; one appearing later, or changing, is new
    new = np.concatenate([[ok[0] != 0], vals[1:] != vals[:-1]])
    if not np.any(new):
        return None
    idx = ok[new]
    codes = [int(v) for v in x[idx]]
    return _finding(g, "xid", seconds=None, fraction=None, since_ts=float(g.ts[idx[0]]),
                    until_ts=float(g.ts[idx[-1]]), count=len(codes), xids=codes,
                    source="nvml:XID critical error events",
                    summary=f"XID {', '.join(str(c) for c in codes)} at {_utc(float(g.ts[idx[0]]))}"
                            + (f" ({len(codes)} errors)" if len(codes) > 1 else ""))


def counter_increase(values: np.ndarray) -> tuple[float, int | None]:
    """(how much a cumulative counter rose, index of the first rise): the sum of its positive steps, so a reset (a
    volatile counter after a driver reload) does not subtract."""
    ok = np.flatnonzero(~np.isnan(values))
    if ok.size < 2:
        return 0.0, None
    steps = np.diff(values[ok])
    rises = np.flatnonzero(steps > 0)
    if rises.size == 0:
        return 0.0, None
    return float(np.sum(steps[steps > 0])), int(ok[rises[0] + 1])


def _counter_findings(g: GpuSeries) -> list[HealthFinding]:
    out: list[HealthFinding] = []
    reported: set[tuple[str, str]] = set()
    for column, kind, what, source in COUNTERS:
        rise, first = counter_increase(g.column(column))
        # volatile ECC and the aggregate count the same errors: the volatile counter speaks when it rose
        if rise <= 0 or first is None or (kind.startswith("ecc") and (kind, "ecc") in reported):
            continue
        if kind.startswith("ecc"):
            reported.add((kind, "ecc"))
        out.append(_finding(g, kind, seconds=None, fraction=None, since_ts=float(g.ts[first]), until_ts=None,
                            count=int(rise), source=f"{source} ({column})",
                            summary=f"{int(rise)} {what} in the window, the first at {_utc(float(g.ts[first]))}"))
    return out


def _flag_findings(g: GpuSeries, dur: np.ndarray, covered: float) -> list[HealthFinding]:
    out = []
    for column, kind, what in FLAGS:
        # read with the health counters (every 30th sample): a flag holds between its readings
        v = hold_last(g.column(column))
        with np.errstate(invalid="ignore"):
            raised = v > 0
        if not np.any(raised):
            continue
        seconds = float(np.sum(dur[raised]))
        first = int(np.flatnonzero(raised)[0])
        out.append(_finding(g, kind, seconds=seconds, fraction=seconds / covered if covered > 0 else None,
                            since_ts=float(g.ts[first]), until_ts=float(g.ts[int(np.flatnonzero(raised)[-1])]),
                            source=f"nvml:{column}",
                            summary=f"{what}, raised for {_span(seconds)} from {_utc(float(g.ts[first]))}"))
    return out


def _finding(g: GpuSeries, kind: str, **fields: object) -> HealthFinding:
    """A finding of `g`; its sources say so when the samples came from the NVML test double or a replay."""
    suffix = sample_source_suffix(g.sample_source)
    if suffix:
        fields = {k: v + suffix if k.endswith("source") and isinstance(v, str) and v.startswith("nvml:") else v
                  for k, v in fields.items()}
    return HealthFinding.model_validate({"gpu_uuid": g.uuid, "kind": kind, "severity": SEVERITY.get(kind, "info"),
                                         **fields})


def gpu_findings(g: GpuSeries) -> list[HealthFinding]:
    """Every finding of one GPU over its series (the caller cuts the series to the window)."""
    if g.ts.size == 0:
        return []
    dur = sample_durations(g.ts)
    covered = float(np.sum(dur))
    out = _slowdown_findings(g, dur, covered)
    for extra in (_low_clock_finding(g, dur), _temperature_finding(g, dur, covered), _xid_finding(g)):
        if extra is not None:
            out.append(extra)
    return out + _counter_findings(g) + _flag_findings(g, dur, covered)


def health_section(gpus: Sequence[GpuSeries]) -> HealthSection:
    findings = [f for g in gpus for f in gpu_findings(g)]
    order = {"critical": 0, "warning": 1, "info": 2}
    findings.sort(key=lambda f: (order.get(f.severity or "info", 3), -(f.seconds or 0.0)))
    return HealthSection(findings=findings, gpus_checked=len(gpus),
                         gpus_with_findings=len({f.gpu_uuid for f in findings}))
