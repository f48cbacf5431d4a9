"""Memory plans over an allocation trace: offset packing, swap (offload/prefetch), fragmentation findings."""
