"""GET /api/v1/nodes, /api/v1/gpus and /api/v1/gpus/gpm: inventory, health, last seen, recent GPM (operators)."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query

from server.deps import OperatorAuth, SessionDep
from server.nodes import service as node_service
from server.nodes.schemas import GpuGpmRead, GpuRead, NodeRead

router = APIRouter(prefix="/api/v1", tags=["inventory"])


@router.get("/nodes", response_model=list[NodeRead], summary="Nodes: inventory, health, last seen")
def list_nodes(_: OperatorAuth, session: SessionDep) -> list[NodeRead]:
    return node_service.list_nodes(session)


@router.get("/gpus", response_model=list[GpuRead], summary="GPUs of every node: health and last seen")
def list_gpus(_: OperatorAuth, session: SessionDep, node: str | None = None) -> list[GpuRead]:
    return node_service.list_gpus(session, node=node)


@router.get("/gpus/gpm", response_model=list[GpuGpmRead],
            summary="A node's GPUs: NVML GPM means (SM activity, occupancy, tensor, DRAM) over the recent window")
def list_gpu_gpm(_: OperatorAuth, session: SessionDep, node: str,
                 window_s: Annotated[float, Query(ge=10, le=86_400, description="seconds before now")] = 300.0,
                 ) -> list[GpuGpmRead]:
    return node_service.gpu_gpm(session, node=node, window_s=window_s, now=time.time())
