"""Pure analysis: numpy arrays and plain data in, typed results out; no database, HTTP or broker.

By concern, each a subpackage; the layers below only import those below them (tests/test_layers.py checks it):
- `base`: the shared inputs (`jobdata`), plot downsampling and bucket grid, the GPU catalogue;
- `memory`, `time`, `energy`: one report section each, from a job's telemetry and hook steps;
- `utilization`: the NVML GPM means of a job (SM activity, occupancy, tensor activity, DRAM bandwidth);
- `traces`: uploaded artefacts (Kineto traces, allocation traces, allocator snapshots) and their sections;
- `planning`: offset packing, swap plans and fragmentation over an allocation trace (`optimization` assembles);
- `fleet`: hourly rollups, group figures and the fleet summary; right-sizing against the catalogue;
- `characterize` assembles one job's report, `compare` sets reports side by side.
"""
