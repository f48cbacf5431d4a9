"""How much of its GPUs a job used: NVML GPM means (the plain NVML utilization stays in `characterize`)."""
