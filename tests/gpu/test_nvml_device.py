"""The agent's NVML device layer against the real driver: identities, readings in their units, the energy counter."""

from __future__ import annotations

import time


def test_every_gpu_has_an_identity_and_a_reading_in_range(nvml_devices) -> None:
    facts = nvml_devices.node_facts()
    assert facts.driver_version
    for gpu in nvml_devices.gpus():
        assert gpu.uuid.startswith(("GPU-", "MIG-")) and gpu.name
        r = nvml_devices.read(gpu.slot)
        if gpu.mig_parent_uuid is None:
            assert gpu.memory_total_bytes and gpu.memory_total_bytes > 1 << 30
            assert r.memory_total_bytes == gpu.memory_total_bytes
            assert 0 <= r.memory_used_bytes <= r.memory_total_bytes
            assert r.gpu_util_pct is None or 0 <= r.gpu_util_pct <= 100
            # an H100 idles at ~70 W (the capture in tests/data): milliwatts, not watts
            assert r.power_mw is None or 10_000 < r.power_mw < 1_500_000
            assert r.temperature_c is None or 0 < r.temperature_c < 120
            assert r.sm_clock_mhz is None or r.sm_clock_mhz > 0


def test_fast_reading_agrees_with_the_full_one(nvml_devices) -> None:
    gpu = nvml_devices.gpus()[0]
    used, power_mw = nvml_devices.read_fast(gpu.slot)
    full = nvml_devices.read(gpu.slot)
    assert used is not None and abs(used - full.memory_used_bytes) < 256 << 20
    assert (power_mw is None) == (full.power_mw is None)


def test_energy_counter_moves_with_power_times_time(nvml_devices) -> None:
    """The hardware counter (mJ since driver load, Volta+) over ~5 s against the mean of power readings."""
    gpu = next(g for g in nvml_devices.gpus() if g.mig_parent_uuid is None)
    first = nvml_devices.read(gpu.slot)
    assert first.energy_mj is not None, "Volta and newer have the total-energy counter"
    t0, powers = time.monotonic(), []
    while time.monotonic() - t0 < 5.0:
        powers.append(nvml_devices.read_fast(gpu.slot)[1])
        time.sleep(0.1)
    last = nvml_devices.read(gpu.slot)
    elapsed = time.monotonic() - t0
    counter_j = (last.energy_mj - first.energy_mj) / 1000.0
    integrated_j = sum(p for p in powers if p) / len(powers) / 1000.0 * elapsed
    assert counter_j > 0
    assert abs(counter_j - integrated_j) / integrated_j < 0.25  # idle power is steady; the 1-s average lags


def test_memory_held_by_this_process_shows_in_used_and_in_its_process_row(nvml_devices, cuda_torch) -> None:
    import os

    torch = cuda_torch
    slot = next(g.slot for g in nvml_devices.gpus() if g.index == torch.cuda.current_device()
                and g.mig_parent_uuid is None)
    before = nvml_devices.read(slot).memory_used_bytes
    block = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")  # 2 GiB
    torch.cuda.synchronize()
    try:
        after = nvml_devices.read(slot).memory_used_bytes
        assert after - before >= 2 << 30
        mine = [p for p in nvml_devices.processes(slot) if p.pid == os.getpid()]
        # in a container the driver may report host pids: then this process is not found by its own pid
        if mine:
            assert mine[0].used_memory_bytes >= 2 << 30
    finally:
        del block
        torch.cuda.empty_cache()
