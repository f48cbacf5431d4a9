"""A block that never imports torch, profiled in local mode: NVML only (no GPU here: no samples either)."""

import json
import sys
import time

import fleetprof

with fleetprof.profile(name="no-torch") as block:
    time.sleep(0.3)
r = block.result
print(json.dumps({"job_id": r.job_id, "hooks": r.hooks, "json": str(r.report_json_path),
                  "torch_imported": "torch" in sys.modules,
                  "imported": sorted(name for name in ("torch", "keras", "jax") if name in sys.modules)}))
