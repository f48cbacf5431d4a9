"""Fleet analytics: hourly rollups, group figures and the fleet summary; right-sizing against the GPU catalogue."""
