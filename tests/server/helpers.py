"""Small builders shared by the server tests."""

from __future__ import annotations

import gzip
import json
import time
from typing import Any

from fleetprof.protocol import PROTOCOL_VERSION


def sample_batch(*, node: str = "node-a", agent_id: str = "agent-a", seq: int = 0, n: int = 10, gpus: int = 2,
                 t0: float | None = None, **overrides: Any) -> dict[str, Any]:
    t0 = time.time() - 3600 if t0 is None else t0
    uuids = [f"GPU-{node}-{i}" for i in range(gpus)]
    ts, gpu_uuid, mem, util, power = [], [], [], [], []
    for k in range(n):
        for i, u in enumerate(uuids):
            ts.append(t0 + k)
            gpu_uuid.append(u)
            mem.append((1000 + 10 * k + i) * 2**20)
            util.append(float((k * 7) % 100))
            power.append(100.0 + k)
    batch = {
        "protocol_version": PROTOCOL_VERSION, "node": node, "agent_id": agent_id, "seq": seq, "sent_at": time.time(),
        "source": "test",
        "gpus": [{"uuid": u, "index": i, "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 81559 * 2**20}
                 for i, u in enumerate(uuids)],
        "samples": {"ts": ts, "gpu_uuid": gpu_uuid, "memory_used_bytes": mem, "gpu_util_pct": util, "power_w": power},
    }
    batch.update(overrides)
    return batch


def gz(payload: Any) -> bytes:
    return gzip.compress(json.dumps(payload).encode())


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
