from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, Float, Index
from sqlalchemy.orm import Mapped, mapped_column

from server.models.base import Base, BigId, UtcDateTime


class GpuSample(Base):
    """One NVML (or replayed) sample of one GPU. Columns mirror fleetprof.protocol.SAMPLE_FIELDS, units in names.

    Primary key (gpu_id, ts): reads are time ranges per GPU, and a sample delivered twice is stored once.
    BRIN on ts: reads of the recent past over all GPUs (current utilization, the rollup sweep) have no gpu_id to
    enter the primary key by; samples arrive in time order, so min/max ts per block range narrows them to the
    pages of the window, for ~4 MB of index per 100 GB of rows (migration 0005; docs/ARCHITECTURE.md).
    """

    __tablename__ = "gpu_samples"
    # One partition per UTC day (server/storage/partitions.py): retention drops whole days.
    __table_args__ = (
        Index("ix_gpu_samples_ts", "ts", postgresql_using="brin", postgresql_with={"autosummarize": "on"}),
        {"postgresql_partition_by": "RANGE (ts)"},
    )

    gpu_id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=False)  # gpus.id, no FK: migration 0005
    ts: Mapped[datetime] = mapped_column(UtcDateTime, primary_key=True)
    healthy: Mapped[bool | None] = mapped_column(Boolean)
    memory_used_bytes: Mapped[int | None] = mapped_column(BigInteger)
    memory_used_max_bytes: Mapped[int | None] = mapped_column(BigInteger)
    memory_total_bytes: Mapped[int | None] = mapped_column(BigInteger)
    memory_reserved_bytes: Mapped[int | None] = mapped_column(BigInteger)
    gpu_util_pct: Mapped[float | None] = mapped_column(Float)
    mem_util_pct: Mapped[float | None] = mapped_column(Float)
    power_w: Mapped[float | None] = mapped_column(Float)
    power_max_w: Mapped[float | None] = mapped_column(Float)
    energy_counter_j: Mapped[float | None] = mapped_column(Float)
    temperature_c: Mapped[float | None] = mapped_column(Float)
    sm_clock_mhz: Mapped[float | None] = mapped_column(Float)
    mem_clock_mhz: Mapped[float | None] = mapped_column(Float)
    throttle_reasons: Mapped[int | None] = mapped_column(BigInteger)
    pcie_tx_bytes_per_s: Mapped[float | None] = mapped_column(Float)
    pcie_rx_bytes_per_s: Mapped[float | None] = mapped_column(Float)
    nvlink_tx_bytes_per_s: Mapped[float | None] = mapped_column(Float)
    nvlink_rx_bytes_per_s: Mapped[float | None] = mapped_column(Float)
    ecc_corrected_total: Mapped[int | None] = mapped_column(BigInteger)
    ecc_uncorrected_total: Mapped[int | None] = mapped_column(BigInteger)
    xid_last: Mapped[int | None] = mapped_column(BigInteger)
    power_limit_w: Mapped[float | None] = mapped_column(Float)  # enforced at the sample (migration 0012)
    app_sm_clock_mhz: Mapped[float | None] = mapped_column(Float)
    app_mem_clock_mhz: Mapped[float | None] = mapped_column(Float)
    # GPM (Hopper+, migration 0016): percent over the interval, bytes/s
    gpm_sm_activity_pct: Mapped[float | None] = mapped_column(Float)
    gpm_sm_occupancy_pct: Mapped[float | None] = mapped_column(Float)
    gpm_tensor_activity_pct: Mapped[float | None] = mapped_column(Float)
    gpm_dram_bw_util_pct: Mapped[float | None] = mapped_column(Float)
    gpm_pcie_tx_bytes_per_s: Mapped[float | None] = mapped_column(Float)
    gpm_pcie_rx_bytes_per_s: Mapped[float | None] = mapped_column(Float)
    gpm_nvlink_tx_bytes_per_s: Mapped[float | None] = mapped_column(Float)
    gpm_nvlink_rx_bytes_per_s: Mapped[float | None] = mapped_column(Float)
    # health counters (cumulative; flags 0/1), migration 0016
    ecc_corrected_volatile: Mapped[int | None] = mapped_column(BigInteger)
    ecc_uncorrected_volatile: Mapped[int | None] = mapped_column(BigInteger)
    retired_pages_sbe: Mapped[int | None] = mapped_column(BigInteger)
    retired_pages_dbe: Mapped[int | None] = mapped_column(BigInteger)
    retired_pages_pending: Mapped[int | None] = mapped_column(BigInteger)
    remapped_rows_correctable: Mapped[int | None] = mapped_column(BigInteger)
    remapped_rows_uncorrectable: Mapped[int | None] = mapped_column(BigInteger)
    remapped_rows_pending: Mapped[int | None] = mapped_column(BigInteger)
    remapped_rows_failed: Mapped[int | None] = mapped_column(BigInteger)
    pcie_replay_total: Mapped[int | None] = mapped_column(BigInteger)
    nvlink_errors_total: Mapped[int | None] = mapped_column(BigInteger)
