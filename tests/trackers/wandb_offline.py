"""Read back what W&B offline mode wrote: the records of an offline run's `run-<id>.wandb` file.

wandb 0.31 no longer ships a Python reader (its core is Go). The file is a LevelDB-style log: a 7-byte W&B header
(`:W&B`, version), then 32 KiB blocks of chunks, each `crc32c(4) length(2) type(1)` then the data (type 1 full,
2 first, 3 middle, 4 last); each whole record is a `wandb_internal_pb2.Record` protobuf."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7


def records(path: Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    pos, buf = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf + chunk)
            buf = b""
            yield rec
        else:
            buf = chunk if kind == 2 else buf + chunk


def offline_run(wandb_dir: Path) -> dict[str, Any]:
    """The one offline run under `wandb_dir`."""
    (run,) = offline_runs(wandb_dir)
    return run


def offline_runs(wandb_dir: Path) -> list[dict[str, Any]]:
    """The offline runs under `wandb_dir`, each with its name, summary, config, history rows and artifacts."""
    return [_read(path) for path in sorted(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"))]


def _read(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"name": None, "summary": {}, "config": {}, "history": [], "artifacts": []}

    def key(item: Any) -> str:
        return item.key or "/".join(item.nested_key)

    for rec in records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out["name"] = rec.run.display_name
        elif kind == "summary":
            out["summary"].update({key(u): json.loads(u.value_json) for u in rec.summary.update})
        elif kind == "config":
            out["config"].update({key(u): json.loads(u.value_json) for u in rec.config.update})
        elif kind == "history":
            out["history"].append({key(u): json.loads(u.value_json) for u in rec.history.item})
        elif kind == "artifact":
            out["artifacts"].append({"name": rec.artifact.name, "type": rec.artifact.type,
                                     "files": {m.path: m.local_path for m in rec.artifact.manifest.contents}})
    return out
