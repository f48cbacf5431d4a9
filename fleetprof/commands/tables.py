"""Report-shaped JSON as terminal text: every figure with the unit its key names (fleetprof.units), nested
sections indented, lists of records as aligned sub-tables. Shared by `fleetprof report` and `fleetprof rightsizing`."""

from __future__ import annotations

from typing import Any

from fleetprof import units

MAX_ROWS = 12  # rows of a record list shown (all are in --format json)


def aligned(header: list[str], rows: list[list[str]], indent: str = "") -> list[str]:
    """Columns padded to their widest cell."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    return [indent + "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in (header, *rows)]


def record_lines(rows: list[dict[str, Any]], indent: str, parent_suffix: str | None) -> list[str]:
    """A list of records (layers, per-rank figures, swapped tensors) as an aligned sub-table."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    cells = [[units.cell(c, row.get(c), parent_suffix=parent_suffix, in_record=True) for c in columns]
             for row in rows[:MAX_ROWS]]
    lines = aligned(columns, cells, indent)
    if len(rows) > MAX_ROWS:
        lines.append(f"{indent}(+{len(rows) - MAX_ROWS} more rows: --format json)")
    return lines


def section_lines(data: dict[str, Any], sources: dict[str, str], prefix: str, indent: str = "  ",
                  parent_suffix: str | None = None) -> list[str]:
    """A report section: one `key  value [source]` line per figure; nested sections and record lists below."""
    lines = []
    for key, value in data.items():
        src = units.source(sources.get(f"{prefix}.{key}"))
        suffix = units.unit_suffix(key) or parent_suffix
        if units.is_records(value):
            lines.append(f"{indent}{key} ({len(value)} rows)")
            lines += record_lines(value, indent + "  ", suffix)
        elif units.is_nested(value):
            lines.append(f"{indent}{key}")
            lines += section_lines(value, sources, f"{prefix}.{key}", indent + "  ", suffix)
        else:
            text = units.cell(key, value, parent_suffix=parent_suffix)
            lines.append(f"{indent}{key:<30} {text}" + (f"   [{src}]" if src else ""))
    return lines


def recommendation_lines(recs: list[dict[str, Any]]) -> list[str]:
    """Recommendations with their reasons and, where known, the saving."""
    if not recs:
        return []
    lines = ["\n[recommendations]"]
    for r in recs:
        saving = r.get("saving")
        lines.append(f"  - {r.get('summary')}  ({r.get('kind')})\n      why: {r.get('reason')}")
        if isinstance(saving, dict) and saving:
            lines.append(f"      saving: {units.by_key('saving', saving)}")
    return lines
