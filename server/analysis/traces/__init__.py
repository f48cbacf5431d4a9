"""Uploaded artefacts: Kineto traces (streamed), allocation traces, allocator snapshots, and the report sections
they add."""
