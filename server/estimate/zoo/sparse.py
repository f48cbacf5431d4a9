"""Embedding-bag recommenders and scatter/gather graph layers."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class DLRM(nn.Module):
    """DLRM: bottom MLP on dense features, `nn.EmbeddingBag` (sum) per sparse feature, pairwise dot interaction."""

    def __init__(self, dense: int = 13, tables: int = 4, rows: int = 5000, dim: int = 32) -> None:
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(dense, 64), nn.ReLU(), nn.Linear(64, dim), nn.ReLU())
        self.tables = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
        pairs = (tables + 1) * tables // 2
        self.top = nn.Sequential(nn.Linear(dim + pairs, 64), nn.ReLU(), nn.Linear(64, 2))

    def forward(self, dense: Tensor, sparse: Tensor) -> Tensor:
        x = self.bottom(dense)
        feats = torch.stack([x, *(t(sparse[:, i]) for i, t in enumerate(self.tables))], 1)
        inter = torch.bmm(feats, feats.transpose(1, 2))
        i, j = torch.triu_indices(feats.shape[1], feats.shape[1], 1, device=feats.device)
        return self.top(torch.cat([x, inter[:, i, j]], 1))


class WideAndDeep(nn.Module):
    def __init__(self, rows: int = 5000, dim: int = 32, fields: int = 4) -> None:
        super().__init__()
        self.wide = nn.EmbeddingBag(rows, 2, mode="sum")
        self.bags = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="mean") for _ in range(fields))
        self.deep = nn.Sequential(nn.Linear(fields * dim, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 2))

    def forward(self, sparse: Tensor) -> Tensor:
        deep = torch.cat([bag(sparse[:, i]) for i, bag in enumerate(self.bags)], 1)
        return self.deep(deep) + self.wide(sparse.flatten(1))


def dlrm() -> DLRM:
    return DLRM()


def wide_and_deep() -> WideAndDeep:
    return WideAndDeep()


def _ring_edges(nodes: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    # a fixed graph: a ring plus random chords, 4 edges per node (the graph is data of the model, not an input)
    gen = torch.Generator().manual_seed(seed)
    src = torch.arange(nodes).repeat(4)
    dst = torch.cat([(torch.arange(nodes) + 1) % nodes, (torch.arange(nodes) - 1) % nodes,
                     torch.randint(0, nodes, (2 * nodes,), generator=gen)])
    return src, dst


class GCNLayer(nn.Module):
    """Mean aggregation by `index_add` over gathered source features (the scatter/gather of PyG's GCNConv)."""

    src: Tensor
    dst: Tensor
    deg: Tensor

    def __init__(self, nodes: int, dim_in: int, dim_out: int) -> None:
        super().__init__()
        src, dst = _ring_edges(nodes)
        self.register_buffer("src", src, persistent=False)
        self.register_buffer("dst", dst, persistent=False)
        deg = torch.zeros(nodes).index_add_(0, dst, torch.ones(dst.shape[0])).clamp(min=1)
        self.register_buffer("deg", deg, persistent=False)
        self.lin = nn.Linear(dim_in, dim_out)

    def forward(self, x: Tensor) -> Tensor:
        h = self.lin(x)
        messages = h.index_select(1, self.src)
        out = torch.zeros_like(h).index_add(1, self.dst, messages)
        return torch.relu(out / self.deg[:, None])


class GATLayer(nn.Module):
    """Graph attention: per-edge scores, softmax over each node's in-edges by `scatter_add`, weighted sum."""

    src: Tensor
    dst: Tensor

    def __init__(self, nodes: int, dim_in: int, dim_out: int) -> None:
        super().__init__()
        src, dst = _ring_edges(nodes, seed=1)
        self.register_buffer("src", src, persistent=False)
        self.register_buffer("dst", dst, persistent=False)
        self.lin = nn.Linear(dim_in, dim_out, bias=False)
        self.att_src = nn.Parameter(torch.randn(dim_out) * 0.1)
        self.att_dst = nn.Parameter(torch.randn(dim_out) * 0.1)

    def forward(self, x: Tensor) -> Tensor:
        h = self.lin(x)
        src_score, dst_score = (h * self.att_src).sum(-1), (h * self.att_dst).sum(-1)
        score = nn.functional.leaky_relu(src_score[:, self.src] + dst_score[:, self.dst])
        weight = score.exp()
        index = self.dst.expand_as(weight)
        denom = torch.zeros(h.shape[:2], dtype=weight.dtype, device=h.device).scatter_add(1, index, weight)
        alpha = weight / denom.gather(1, index)
        messages = h[:, self.src] * alpha[..., None]
        out = torch.zeros_like(messages[:, : h.shape[1]]).scatter_add(1, self.dst[None, :, None].expand_as(messages),
                                                                      messages)
        return nn.functional.elu(out)


class GraphClassifier(nn.Module):
    def __init__(self, kind: str = "gcn", nodes: int = 256, features: int = 16, hidden: int = 64, layers: int = 2,
                 num_classes: int = 10) -> None:
        super().__init__()
        layer_class = {"gcn": GCNLayer, "gat": GATLayer}[kind]
        dims = [features] + [hidden] * layers
        self.layers = nn.ModuleList(layer_class(nodes, a, b) for a, b in zip(dims, dims[1:], strict=False))
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(1))


def gcn(nodes: int = 256) -> GraphClassifier:
    return GraphClassifier("gcn", nodes)


def gat(nodes: int = 256) -> GraphClassifier:
    return GraphClassifier("gat", nodes)
