"""Time of a job: step-time distribution, GPU busy fraction, per-layer table, iteration period and stalls."""
