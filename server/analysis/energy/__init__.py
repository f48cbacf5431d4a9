"""Energy of a job: NVML counter or integrated power, per GPU and per step, cost and CO2."""
