"""`fleetprof tune power` on the NVML test double (agent/devices/fake.py, no GPU): setting limits within the
driver's constraints, the one-line errors, and a sweep that gives the GPUs their limits back whatever happens."""

from __future__ import annotations

import sys

import pytest

from agent.devices.base import DevicePermissionError, FieldNotSupportedError
from agent.devices.fake import FakeGpu, FakeNvml
from agent.devices.nvml import NvmlDevices
from agent.tune import CapRun, run_sweep, sweep_caps_w
from fleetprof.cli import main


def _devices(n: int = 2, **gpu: object) -> tuple[NvmlDevices, FakeNvml]:
    fake = FakeNvml([FakeGpu(uuid=f"GPU-tune-{i}", power_limit_mw=600_000, **gpu) for i in range(n)])  # type: ignore[arg-type]
    return NvmlDevices(fake, xid_events=False), fake


def test_set_power_limit_is_read_back_as_the_enforced_limit() -> None:
    devices, fake = _devices(1)
    assert devices.power_limit_constraints_mw(0) == (200_000, 700_000)
    devices.set_power_limit_mw(0, 350_000)
    assert devices.read(0).power_limit_mw == 350_000 == devices.power_limit_mw(0)
    assert fake.calls["nvmlDeviceSetPowerManagementLimit"] == 1


def test_out_of_range_permission_and_mig_are_clear_errors() -> None:
    devices, fake = _devices(1)
    with pytest.raises(ValueError, match="outside the range the driver accepts, 200-700 W"):
        devices.set_power_limit_mw(0, 150_000)
    assert "nvmlDeviceSetPowerManagementLimit" not in fake.calls  # refused before NVML is asked
    fake.gpus[0].power_limit_needs_root = True
    with pytest.raises(DevicePermissionError):
        devices.set_power_limit_mw(0, 300_000)
    assert fake.gpus[0].power_limit_mw == 600_000
    mig = FakeNvml([FakeGpu(uuid="GPU-p", mig_devices=[FakeGpu(uuid="MIG-a", is_mig=True)])])
    with_mig = NvmlDevices(mig, xid_events=False)
    assert with_mig.gpus()[1].mig_parent_uuid == "GPU-p"
    with pytest.raises(FieldNotSupportedError):
        with_mig.set_power_limit_mw(1, 300_000)


def test_sweep_sets_each_cap_on_every_gpu_and_restores_the_limits() -> None:
    devices, fake = _devices(2)
    fake.gpus[1].power_limit_mw = 650_000
    seen: list[tuple[float, list[int]]] = []

    def run_one(cap: float) -> CapRun:
        seen.append((cap, [devices.read(s).power_limit_mw or 0 for s in (0, 1)]))
        return CapRun(cap, f"job-{cap:g}", "finished", 0)

    runs = run_sweep(devices, [400.0, 300.0], run_one)
    assert seen == [(400.0, [400_000, 400_000]), (300.0, [300_000, 300_000])]
    assert [r.job_id for r in runs] == ["job-400", "job-300"]
    assert [g.power_limit_mw for g in fake.gpus] == [600_000, 650_000]


def test_sweep_restores_on_ctrl_c_and_stops_after_a_failed_run() -> None:
    devices, fake = _devices(1)

    def interrupted(cap: float) -> CapRun:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(devices, [300.0, 250.0], interrupted)
    assert fake.gpus[0].power_limit_mw == 600_000
    calls: list[float] = []

    def failing(cap: float) -> CapRun:
        calls.append(cap)
        return CapRun(cap, "j", "failed", 1)

    assert [r.state for r in run_sweep(devices, [300.0, 250.0], failing)] == ["failed"]
    assert calls == [300.0] and fake.gpus[0].power_limit_mw == 600_000
    with pytest.raises(ValueError, match="outside"):
        run_sweep(devices, [300.0, 800.0], failing)  # checked before any cap is set
    assert calls == [300.0]


def test_sweep_caps_span_the_constraints() -> None:
    assert sweep_caps_w(200.0, 700.0, 3) == [700.0, 450.0, 200.0]
    assert sweep_caps_w(200.0, 700.0, 2) == [700.0, 200.0]
    with pytest.raises(ValueError):
        sweep_caps_w(200.0, 700.0, 1)


def test_cli_sweeps_the_test_double_and_rejects_bad_caps(capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEETPROF_SERVER_URL", raising=False)
    assert main(["tune", "power", "--source", "fake:1", "--caps", "900,250", "--", "true"]) == 2
    assert "power cap 900 W is outside the range the GPUs accept, 200-700 W" in capsys.readouterr().err
    assert main(["tune", "power", "--source", "fake:1", "--caps", "300,250", "--name", "t",
                 "--", sys.executable, "-c", "pass"]) == 0
    out = capsys.readouterr()
    assert "test double" in out.err
    rows = [line.split() for line in out.out.splitlines()[1:3]]
    assert [(r[0], r[4]) for r in rows] == [("300", "finished"), ("250", "finished")]
    assert "recommendation: none yet" in out.out


def test_cli_without_privilege_says_so_in_one_line_and_runs_nothing(capsys: pytest.CaptureFixture[str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import agent.cli.tune as tune_cli

    devices, fake = _devices(1, power_limit_needs_root=True)
    monkeypatch.setattr(tune_cli, "_open", lambda source: devices)
    monkeypatch.delenv("FLEETPROF_SERVER_URL", raising=False)
    assert main(["tune", "power", "--caps", "300,250", "--", sys.executable, "-c", "raise SystemExit(9)"]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("fleetprof tune: error: setting the power limit needs root (or CAP_SYS_ADMIN)")
    assert fake.gpus[0].power_limit_mw == 600_000 and not any("job" in line for line in err)
