"""Postgres binary COPY payloads from column-wise data, vectorized with numpy.

The binary format (PostgreSQL docs, "COPY ... Binary Format"): an 11-byte signature, two int32 (flags, header
extension length), then per row an int16 field count and per field an int32 length (-1 for NULL) followed by
that many bytes, big-endian; an int16 -1 ends the data. Rows here hold only fixed-size fields, so every row
with the same NULL pattern has the same layout: rows are grouped by pattern and each group is written as one
numpy structured array (row order does not matter to COPY). The Python cost is ~0.5 us per row, against ~9 us
for text COPY formatted in Python; Postgres parses binary fields for less than it parses text arrays.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"
TRAILER = b"\xff\xff"

# Postgres type -> (numpy dtype of the big-endian payload, numpy dtype to convert Python values with)
FIXED_TYPES: dict[str, tuple[str, type]] = {
    "boolean": ("u1", np.bool_),
    "integer": (">i4", np.int64),
    "bigint": (">i8", np.int64),
    "double precision": (">f8", np.float64),
    "float": (">f8", np.float64),  # SQLAlchemy's Float() is Postgres FLOAT, i.e. double precision
    "timestamptz": (">i8", np.float64),  # microseconds since 2000-01-01, from float epoch seconds
}
_PG_EPOCH_S = 946_684_800.0  # 2000-01-01T00:00:00Z in Unix seconds
_INT_BOUNDS = {">i4": (-(2**31), 2**31 - 1), ">i8": (-(2**63), 2**63 - 1)}


class NotEncodable(ValueError):
    """The data cannot travel as fixed-size binary fields (a type not listed, or an integer out of range)."""


def _column(values: Sequence[object], pg_type: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Values as a numpy array (NULLs as 0) and the NULL mask, or None when there is no NULL."""
    _, convert = FIXED_TYPES[pg_type]
    if None in values:  # a C-speed scan; NULLs are rare on the hot path
        mask = np.fromiter((v is None for v in values), dtype=bool, count=len(values))
        values = [0 if v is None else v for v in values]
    else:
        mask = None
    try:
        arr: np.ndarray = np.asarray(values, dtype=convert)
    except (OverflowError, TypeError, ValueError) as exc:
        raise NotEncodable(f"{pg_type} column: {exc}") from None
    if pg_type == "timestamptz":
        # Rounded exactly as Postgres' to_timestamp(float8) rounds (rint of microseconds since 2000): the
        # same rule as server.models.base.epoch_us.
        arr = np.rint((arr - _PG_EPOCH_S) * 1e6).astype(np.int64)
    payload = FIXED_TYPES[pg_type][0]
    if payload in _INT_BOUNDS and arr.size:
        lo, hi = _INT_BOUNDS[payload]
        if arr.min() < lo or arr.max() > hi:
            raise NotEncodable(f"{pg_type} column: value out of range")
    return arr, mask


def encode(pg_types: Sequence[str], columns: Sequence[Sequence[object]]) -> bytes:
    """A complete binary COPY payload for rows given column-wise. NotEncodable for unsupported data."""
    for t in pg_types:
        if t not in FIXED_TYPES:
            raise NotEncodable(f"type {t!r} is not a fixed-size type this encoder writes")
    n = len(columns[0]) if columns else 0
    arrays, masks = (zip(*(_column(col, t) for col, t in zip(columns, pg_types, strict=True)), strict=True)
                     if n else ((), ()))
    pattern = np.zeros(n, dtype=np.int64)
    for bit, mask in enumerate(masks):
        if mask is not None:
            pattern |= mask.astype(np.int64) << bit
    parts = [SIGNATURE]
    codes = np.unique(pattern)
    for code in codes:
        rows = None if len(codes) == 1 else np.flatnonzero(pattern == code)
        count = n if rows is None else len(rows)
        fields: list[tuple[str, str]] = [("count", ">i2")]
        null = [bool(code >> bit & 1) for bit in range(len(pg_types))]
        for i, t in enumerate(pg_types):
            fields.append((f"len{i}", ">i4"))
            if not null[i]:
                fields.append((f"val{i}", FIXED_TYPES[t][0]))
        rec = np.empty(count, dtype=fields)
        rec["count"] = len(pg_types)
        for i, t in enumerate(pg_types):
            if null[i]:
                rec[f"len{i}"] = -1
            else:
                rec[f"len{i}"] = np.dtype(FIXED_TYPES[t][0]).itemsize
                rec[f"val{i}"] = arrays[i] if rows is None else arrays[i][rows]
        parts.append(rec.tobytes())
    parts.append(TRAILER)
    return b"".join(parts)
