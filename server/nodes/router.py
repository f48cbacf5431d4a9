"""GET /api/v1/nodes and /api/v1/gpus: inventory, health, last seen (operators)."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel
from sqlalchemy import select

from server.deps import OperatorAuth, SessionDep
from server.models import Gpu, Node
from server.models.base import to_epoch

router = APIRouter(prefix="/api/v1", tags=["inventory"])


class GpuRead(BaseModel):
    node: str
    uuid: str
    index: int
    name: str
    memory_total_bytes: int | None
    pci_bus_id: str | None
    mig_parent_uuid: str | None
    power_source: str | None
    power_limit_w: float | None
    healthy: bool
    last_seen_at: float | None


class NodeRead(BaseModel):
    name: str
    hostname: str | None
    driver_version: str | None
    cuda_version: str | None
    nvml_version: str | None
    source: str | None
    gpu_count: int
    dropped_samples_total: int
    clock_skew_s: float | None
    last_seen_at: float | None


def _gpu_read(gpu: Gpu, node: str) -> GpuRead:
    return GpuRead(node=node, uuid=gpu.uuid, index=gpu.index, name=gpu.name, memory_total_bytes=gpu.memory_total_bytes,
                   pci_bus_id=gpu.pci_bus_id, mig_parent_uuid=gpu.mig_parent_uuid, power_source=gpu.power_source,
                   power_limit_w=gpu.power_limit_w, healthy=gpu.healthy, last_seen_at=to_epoch(gpu.last_seen_at))


@router.get("/nodes", response_model=list[NodeRead], summary="Nodes: inventory, health, last seen")
def list_nodes(_: OperatorAuth, session: SessionDep) -> list[NodeRead]:
    counts: dict[int, int] = {}
    for (node_id,) in session.execute(select(Gpu.node_id)):
        counts[node_id] = counts.get(node_id, 0) + 1
    return [NodeRead(name=n.name, hostname=n.hostname, driver_version=n.driver_version, cuda_version=n.cuda_version,
                     nvml_version=n.nvml_version, source=n.last_source, gpu_count=counts.get(n.id, 0),
                     dropped_samples_total=n.dropped_samples_total or 0, clock_skew_s=n.clock_skew_s,
                     last_seen_at=to_epoch(n.last_seen_at))
            for n in session.scalars(select(Node).order_by(Node.name))]


@router.get("/gpus", response_model=list[GpuRead], summary="GPUs of every node: health and last seen")
def list_gpus(_: OperatorAuth, session: SessionDep, node: str | None = None) -> list[GpuRead]:
    stmt = select(Gpu, Node.name).join(Node, Node.id == Gpu.node_id).order_by(Node.name, Gpu.index)
    if node is not None:
        stmt = stmt.where(Node.name == node)
    return [_gpu_read(g, name) for g, name in session.execute(stmt)]
