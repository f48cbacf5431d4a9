"""GPU health: slowdowns (clock-event reasons), clocks, temperature, XID and error counters, per GPU."""
