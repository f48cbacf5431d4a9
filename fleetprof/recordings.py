"""Recorded GPU telemetry: nvidia-smi `--query-gpu ... --format=csv` logs and the agent's own recordings.

Both become a `Recording` (GPU inventory + time-ordered sample rows with protocol field names and units),
which `fleetprof replay` and the agent's replay device turn into ordinary protocol batches.

nvidia-smi CSV quirks handled here:
- units live in the header (`memory.used [MiB]`) and again in each cell (`19818 MiB`) unless `nounits`;
- `[N/A]`, `[Not Supported]`, `[Requested functionality has been deprecated]`... are unknown -> None;
- timestamps (`2026/07/14 08:12:38.696`) carry no zone: UTC unless the caller says otherwise;
- a capture file (the nvidia_gpu_exporter format) holds several CSV sections between `#` banners:
  every query-gpu section is read, other sections (compute apps) give per-process rows, the rest is skipped.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from fleetprof.protocol import (
    PROTOCOL_VERSION,
    SAMPLE_FIELDS,
    GpuInfo,
    NodeInfo,
    ProcessColumns,
    SampleBatch,
    SampleColumns,
    SampleSource,
)

MIB = 1 << 20
_UNIT_SCALE = {"b": 1, "kib": 1 << 10, "mib": MIB, "gib": 1 << 30, "w": 1.0, "mw": 1e-3, "%": 1.0,
               "mhz": 1.0, "c": 1.0, "kb/s": 1e3, "mb/s": 1e6}
_HEADER_RE = re.compile(r"^\s*(?P<name>[^\[]+?)\s*(\[(?P<unit>[^\]]+)\])?\s*$")

# nvidia-smi query name -> protocol field. The first name present in the header wins.
_SMI_FIELDS: dict[str, tuple[str, ...]] = {
    "memory_used_bytes": ("memory.used",),
    "memory_total_bytes": ("memory.total",),
    "memory_reserved_bytes": ("memory.reserved",),
    "gpu_util_pct": ("utilization.gpu",),
    "mem_util_pct": ("utilization.memory",),
    "power_w": ("power.draw", "power.draw.average", "power.draw.instant"),
    "temperature_c": ("temperature.gpu",),
    "sm_clock_mhz": ("clocks.current.sm", "clocks.sm"),
    "mem_clock_mhz": ("clocks.current.memory", "clocks.mem"),
    "throttle_reasons": ("clocks_event_reasons.active", "clocks_throttle_reasons.active"),
    "ecc_corrected_total": ("ecc.errors.corrected.volatile.total",),
    "ecc_uncorrected_total": ("ecc.errors.uncorrected.volatile.total",),
}
_INT_FIELDS = {name for name, kind in SAMPLE_FIELDS if kind is int}


class RecordingError(ValueError):
    """The file is not a telemetry recording we can read; the message names the line and the problem."""


@dataclass
class SampleRow:
    ts: float
    gpu_uuid: str
    values: dict[str, float | int | None]  # protocol field -> value; plus "healthy" (bool) when recorded


@dataclass
class ProcessRow:
    ts: float
    gpu_uuid: str
    pid: int
    used_memory_bytes: int | None
    job_id: str | None = None
    # how the recording agent found the job ("env:FLEETPROF_JOB_ID", ...); None = not recorded / unattributed
    attribution: str | None = None


@dataclass
class Recording:
    source: str  # "nvidia-smi" | "fleetprof"
    gpus: list[GpuInfo]
    rows: list[SampleRow]
    processes: list[ProcessRow] = field(default_factory=list)
    node_info: NodeInfo | None = None

    @property
    def start_ts(self) -> float:
        return self.rows[0].ts

    @property
    def end_ts(self) -> float:
        return self.rows[-1].ts


# ------------------------------------------------------------------------------------------ parsing


def _unknown(cell: str) -> bool:
    c = cell.strip()
    return not c or c.startswith("[") or c.upper() in ("N/A", "NA", "-")


def _number(cell: str, header_unit: str | None) -> float | None:
    """'19818 MiB' -> 19818 * 2**20; '0x0000000000000001' -> 1; units from the cell or the header."""
    c = cell.strip()
    if _unknown(c):
        return None
    if c.lower().startswith("0x"):
        return float(int(c, 16))
    parts = c.split()
    unit = (parts[1] if len(parts) > 1 else header_unit or "").lower()
    try:
        value = float(parts[0])
    except ValueError:
        return None
    return value * _UNIT_SCALE.get(unit, 1.0)


def _parse_timestamp(cell: str, tz: ZoneInfo) -> float:
    text = cell.strip()
    for fmt in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S", "%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%dT%H:%M:%S.%f"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=tz).timestamp()
        except ValueError:
            continue
    raise ValueError(f"unrecognised timestamp {text!r}")


def _split_header(cells: list[str]) -> list[tuple[str, str | None]]:
    out = []
    for cell in cells:
        m = _HEADER_RE.match(cell)
        out.append((m.group("name").strip(), m.group("unit")) if m else (cell.strip(), None))
    return out


def _read_smi(lines: list[str], tz: ZoneInfo) -> Recording:
    gpus: dict[str, GpuInfo] = {}
    rows: list[SampleRow] = []
    procs: list[ProcessRow] = []
    header: list[tuple[str, str | None]] | None = None
    kind = None  # "gpu" | "apps" | None
    for lineno, line in enumerate(lines, 1):
        if not line.strip() or line.startswith("#"):
            header, kind = None, None  # a banner ends a capture section
            continue
        cells = next(csv.reader([line], skipinitialspace=True))
        if cells and cells[0].strip().lower() == "timestamp":
            header = _split_header(cells)
            names = {n for n, _ in header}
            if "memory.used" in names and ("uuid" in names or "index" in names):
                kind = "gpu"
            elif "pid" in names and "gpu_uuid" in names:
                kind = "apps"
            else:
                kind = None
            continue
        if header is None or kind is None:
            continue
        if len(cells) != len(header):
            raise RecordingError(f"line {lineno}: {len(cells)} cells but the header has {len(header)}")
        rec = {name: (cell, unit) for (name, unit), cell in zip(header, cells, strict=True)}
        try:
            ts = _parse_timestamp(rec["timestamp"][0], tz)
        except ValueError as exc:
            raise RecordingError(f"line {lineno}: {exc}") from None
        if kind == "apps":
            uuid = rec["gpu_uuid"][0].strip()
            mem = _number(*rec.get("used_gpu_memory", ("", None)))
            pid = _number(*rec["pid"])
            if pid is not None:
                procs.append(ProcessRow(ts, uuid, int(pid), None if mem is None else int(mem)))
            continue
        index = int(_number(*rec["index"]) or 0) if "index" in rec else len(gpus)
        uuid = rec["uuid"][0].strip() if "uuid" in rec else f"index-{index}"
        values: dict[str, float | int | None] = {}
        for field_name, smi_names in _SMI_FIELDS.items():
            for smi_name in smi_names:
                if smi_name in rec:
                    v = _number(*rec[smi_name])
                    if v is not None:
                        values[field_name] = int(round(v)) if field_name in _INT_FIELDS else v
                        break
        if uuid not in gpus:
            power_name = next((n for n in _SMI_FIELDS["power_w"] if n in rec), None)
            limit = _number(*rec["power.limit"]) if "power.limit" in rec else None
            gpus[uuid] = GpuInfo(
                uuid=uuid, index=index, name=rec["name"][0].strip() if "name" in rec else "unknown",
                memory_total_bytes=values.get("memory_total_bytes"),  # type: ignore[arg-type]
                pci_bus_id=rec["pci.bus_id"][0].strip() if "pci.bus_id" in rec else None,
                power_source=f"nvidia-smi:{power_name}" if power_name else None, power_limit_w=limit,
            )
        rows.append(SampleRow(ts, uuid, values))
    if not rows:
        raise RecordingError("no nvidia-smi --query-gpu CSV rows found (need a header with timestamp, "
                             "uuid or index, and memory.used)")
    rows.sort(key=lambda r: (r.ts, r.gpu_uuid))
    procs.sort(key=lambda p: p.ts)
    return Recording("nvidia-smi", sorted(gpus.values(), key=lambda g: g.index), rows, procs)


def _read_fleetprof(lines: list[str]) -> Recording:
    """The agent's recording format: one protocol SampleBatch JSON per line (what the spool holds)."""
    gpus: dict[str, GpuInfo] = {}
    rows: list[SampleRow] = []
    procs: list[ProcessRow] = []
    node_info = None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            batch = SampleBatch.model_validate_json(line)
        except ValueError as exc:
            raise RecordingError(f"line {lineno}: not a fleetprof sample batch: {exc}") from None
        node_info = batch.node_info or node_info
        for g in batch.gpus:
            gpus[g.uuid] = g
        cols = batch.samples
        present = [(name, getattr(cols, name)) for name, _ in SAMPLE_FIELDS if getattr(cols, name) is not None]
        for i, (ts, uuid) in enumerate(zip(cols.ts, cols.gpu_uuid, strict=True)):
            values: dict[str, Any] = {name: col[i] for name, col in present}
            if cols.healthy is not None:
                values["healthy"] = cols.healthy[i]  # a GPU recorded as lost replays as lost
            rows.append(SampleRow(ts, uuid, values))
        if batch.processes is not None:
            p = batch.processes
            how = p.attribution if p.attribution is not None else [None] * len(p.ts)
            for i in range(len(p.ts)):
                procs.append(ProcessRow(p.ts[i], p.gpu_uuid[i], p.pid[i], p.used_memory_bytes[i], p.job_id[i],
                                        how[i]))
    if not rows:
        raise RecordingError("recording holds no samples")
    rows.sort(key=lambda r: (r.ts, r.gpu_uuid))
    return Recording("fleetprof", sorted(gpus.values(), key=lambda g: g.index), rows, procs, node_info)


def read_recording(path: str | Path, *, tz: str = "UTC") -> Recording:
    """Read an nvidia-smi CSV log / capture, or a fleetprof JSONL recording (detected from the content)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise RecordingError(f"cannot read {path}: {exc.strerror}") from None
    try:
        zone = ZoneInfo(tz)
    except (KeyError, ValueError):
        raise RecordingError(f"unknown time zone {tz!r}") from None
    lines = text.splitlines()
    first = next((ln for ln in lines if ln.strip()), "")
    if first.lstrip().startswith("{"):
        return _read_fleetprof(lines)
    return _read_smi(lines, zone)


# ------------------------------------------------------------------------------------------ batching


def _columns(rows: list[SampleRow]) -> SampleColumns:
    cols: dict[str, Any] = {"ts": [r.ts for r in rows], "gpu_uuid": [r.gpu_uuid for r in rows]}
    if rows and all(isinstance(r.values.get("healthy"), bool) for r in rows):
        cols["healthy"] = [r.values["healthy"] for r in rows]
    for name, _ in SAMPLE_FIELDS:
        if any(name in r.values for r in rows):
            cols[name] = [r.values.get(name) for r in rows]
    return SampleColumns(**cols)


def iter_timesteps(rec: Recording) -> Iterator[list[SampleRow]]:
    """Rows grouped by timestamp (one group = one sampling instant across the node's GPUs)."""
    group: list[SampleRow] = []
    for row in rec.rows:
        if group and row.ts != group[0].ts:
            yield group
            group = []
        group.append(row)
    if group:
        yield group


def make_batch(rows: list[SampleRow], *, rec: Recording, node: str, agent_id: str, seq: int, sent_at: float,
               source: SampleSource = "replay", processes: list[ProcessRow] | None = None) -> SampleBatch:
    proc_cols = None
    if processes:
        proc_cols = ProcessColumns(
            ts=[p.ts for p in processes], gpu_uuid=[p.gpu_uuid for p in processes],
            pid=[p.pid for p in processes], used_memory_bytes=[p.used_memory_bytes for p in processes],
            job_id=[p.job_id for p in processes],
            attribution=[p.attribution for p in processes] if any(p.attribution for p in processes) else None,
        )
    return SampleBatch(
        protocol_version=PROTOCOL_VERSION, node=node, agent_id=agent_id, seq=seq, sent_at=sent_at,
        source=source, node_info=rec.node_info, gpus=rec.gpus, samples=_columns(rows), processes=proc_cols,
    )


def dump_batch_line(batch: SampleBatch) -> str:
    """One line of the fleetprof recording format."""
    return json.dumps(batch.model_dump(mode="json", exclude_none=True), separators=(",", ":"))
