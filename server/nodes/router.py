"""GET /api/v1/nodes and /api/v1/gpus: inventory, health, last seen (operators)."""

from __future__ import annotations

from fastapi import APIRouter

from server.deps import OperatorAuth, SessionDep
from server.nodes import service as node_service
from server.nodes.schemas import GpuRead, NodeRead

router = APIRouter(prefix="/api/v1", tags=["inventory"])


@router.get("/nodes", response_model=list[NodeRead], summary="Nodes: inventory, health, last seen")
def list_nodes(_: OperatorAuth, session: SessionDep) -> list[NodeRead]:
    return node_service.list_nodes(session)


@router.get("/gpus", response_model=list[GpuRead], summary="GPUs of every node: health and last seen")
def list_gpus(_: OperatorAuth, session: SessionDep, node: str | None = None) -> list[GpuRead]:
    return node_service.list_gpus(session, node=node)
