"""fleetprof.units: every figure with the unit its key names; unknown is 'unknown', never 0."""

from __future__ import annotations

import pytest

from fleetprof import units


@pytest.mark.parametrize(("key", "value", "text"), [
    ("peak_used_bytes", 31.6 * 2**30, "31.60 GiB"),
    ("activation_bytes", 3_538_944, "3.38 MiB"),
    ("alignment_bytes", 512, "512 B"),
    ("samples_per_s", 1106.149, "1,106 /s"),  # a rate, not a duration
    ("pcie_bandwidth_bytes_per_s", 12e9, "11.18 GiB/s"),
    ("duration_s", 23.654, "23.65 s"),
    ("hook_period_s", 0.0191, "19.1 ms"),
    ("span_us", 1_396_669.0, "1.40 s"),
    ("energy_j", 8339.3, "8.3 kJ"),
    ("energy_j", 64.79 * 3.6e6, "64.79 kWh"),
    ("mean_power_w", 352.6, "352.6 W"),
    ("gpu_mean_pct", 50.0, "50.0 %"),
    ("gpu_busy_fraction", 0.804, "80.4 %"),
    ("co2e_g", 1.112, "1.1 g CO2e"),
    ("cost_usd", 0.0003336, "$0.0003"),
    ("usd", 291.84, "$291.84"),
    ("usd_per_gpu_hour", -1.52, "-$1.52 per GPU-hour"),
    ("grid_intensity_g_per_kwh", 400, "400 g CO2e/kWh"),
    ("price_per_kwh_usd", 0.12, "$0.12/kWh"),
    ("sm_clock_mhz", 1980.0, "1,980 MHz"),
    ("steps", 14400, "14,400"),
    ("pue", 1.2, "1.2"),
    ("oom_detected", False, "no"),
    ("source", "hardware_counter", "hardware_counter"),
])
def test_a_value_takes_the_unit_its_key_names(key: str, value: object, text: str) -> None:
    assert units.by_key(key, value) == text


def test_unknown_is_never_zero() -> None:
    for key in ("peak_used_bytes", "energy_j", "samples_per_s", "steps", "source"):
        assert units.by_key(key, None) == "unknown"
    assert units.by_key("energy_j", 0.0) == "0.0 J"  # a measured zero stays a zero


def test_children_without_a_unit_take_their_parents() -> None:
    text = units.by_key("step_time_s", {"mean": 0.0209, "p50": 0.0183, "p95": None})
    assert text == "mean 20.9 ms, p50 18.3 ms, p95 unknown"
    # a child with a unit of its own keeps it
    assert units.by_key("stragglers", {"ranks": 2, "median_step_s": 0.5}) == "ranks 2, median_step_s 500.0 ms"


def test_sources_in_words() -> None:
    assert units.source("nvml:gpu_util_pct") == "NVML (gpu_util_pct)"
    assert units.source("hardware_counter") == "NVML energy counter"
    assert units.source("something new") == "something new"
    assert units.source(None) is None


def test_series_say_how_long_they_are_and_sections_how_they_nest() -> None:
    assert units.cell("ts", list(range(100))) == "100 points"
    assert units.cell("ts", [1.0, 2.0], in_record=True) == "2 points"  # a record's numbers are a series
    assert units.cell("missing_ranks", [0, 3]) == "0, 3"  # a short list of values is shown
    assert units.is_records([{"a": 1}]) and not units.is_records([]) and not units.is_records([1])
    assert units.is_nested({"plan": {"a": 1}}) and not units.is_nested({"p50": 1.0, "p95": None})


def test_every_source_the_analyzers_write_reads_in_words() -> None:
    for raw in ("nvml", "nvml_max", "cuda_allocator", "cpu_rss", "hardware_counter", "integrated_power"):
        assert units.source(raw) != raw, raw


@pytest.mark.parametrize(("key", "symbol"), [
    ("memory_used_bytes", "B"), ("pcie_tx_bytes_per_s", "B/s"), ("gpu_util_pct", "%"), ("power_w", "W"),
    ("energy_counter_j", "J"), ("temperature_c", "°C"), ("sm_clock_mhz", "MHz"), ("duration_s", "s"),
    ("samples_per_s", "/s"),  # a rate, not seconds
    ("throttle_reasons", None), ("xid_last", None),
])
def test_a_series_unit_is_the_symbol_its_key_names(key: str, symbol: str | None) -> None:
    # the timeseries API's `unit` and the report's formatting read one table of suffixes
    assert units.unit_symbol(key) == symbol
