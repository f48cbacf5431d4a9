"""Projection: a measured run on one GPU type projected onto another (step time, power, energy, memory)."""
