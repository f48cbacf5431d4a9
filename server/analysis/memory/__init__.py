"""Memory of a job: device and allocator peaks, headroom, processes on its GPUs, OOM."""
