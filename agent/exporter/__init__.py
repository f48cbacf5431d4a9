"""The node's GPU gauges for Prometheus, served by the agent itself as dcgm-exporter serves them (issue #20).

Each GPU's series come from its own node's agent only, so a fleet scraped through its agents holds every GPU
series once, however many collectors run. `fields.py` names the series (dcgm-exporter's names, types and units),
`gauges.py` keeps the latest reading of each GPU and renders the text exposition, `observe.py` feeds it from the
sampler's own device calls (no NVML call of its own), `endpoint.py` serves it.
"""
