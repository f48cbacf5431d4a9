"""Sequence models from `torch.nn` building blocks: `nn.Transformer*`, `nn.MultiheadAttention`, LSTM/GRU/RNN."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class TransformerEncoderClassifier(nn.Module):
    def __init__(self, vocab: int = 1000, d_model: int = 128, heads: int = 4, layers: int = 2,
                 norm_first: bool = False, num_classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.1, batch_first=True,
                                           norm_first=norm_first)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.head(self.encoder(self.embed(tokens)).mean(1))


class TransformerDecoderLM(nn.Module):
    """A decoder-only LM from `nn.TransformerDecoderLayer` with a causal mask and cross-attention to a memory."""

    def __init__(self, vocab: int = 1000, d_model: int = 128, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerDecoderLayer(d_model, heads, 4 * d_model, dropout=0.1, batch_first=True)
        self.decoder = nn.TransformerDecoder(layer, layers)
        self.lm_head = nn.Linear(d_model, vocab)

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens)
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
        return self.lm_head(self.decoder(x, x, tgt_mask=mask, tgt_is_causal=True))


class Seq2SeqTransformer(nn.Module):
    def __init__(self, vocab: int = 1000, d_model: int = 128, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.transformer = nn.Transformer(d_model, heads, layers, layers, 4 * d_model, dropout=0.1, batch_first=True)
        self.lm_head = nn.Linear(d_model, vocab)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], device=tgt.device)
        return self.lm_head(self.transformer(self.embed(src), self.embed(tgt), tgt_mask=mask))


class AttentionClassifier(nn.Module):
    """`nn.MultiheadAttention` returning its weights (the unfused path), pre-norm, with an MLP."""

    def __init__(self, features: int = 32, d_model: int = 128, heads: int = 4, layers: int = 2,
                 num_classes: int = 10) -> None:
        super().__init__()
        self.proj = nn.Linear(features, d_model)
        self.attn = nn.ModuleList(nn.MultiheadAttention(d_model, heads, dropout=0.1, batch_first=True)
                                  for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(layers))
        self.mlps = nn.ModuleList(nn.Sequential(nn.Linear(d_model, 2 * d_model), nn.GELU(),
                                                nn.Linear(2 * d_model, d_model)) for _ in range(layers))
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        h = self.proj(x)
        for attn, norm, mlp in zip(self.attn, self.norms, self.mlps, strict=False):
            y = norm(h)
            h = h + attn(y, y, y)[0]
            h = h + mlp(h)
        return self.head(h.mean(1))


class RecurrentClassifier(nn.Module):
    def __init__(self, cell: str = "lstm", features: int = 32, hidden: int = 64, layers: int = 1,
                 bidirectional: bool = False, num_classes: int = 10) -> None:
        super().__init__()
        rnn_class = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[cell]
        self.rnn = rnn_class(features, hidden, num_layers=layers, batch_first=True, bidirectional=bidirectional,
                             dropout=0.1 if layers > 1 else 0.0)
        self.head = nn.Linear(hidden * (2 if bidirectional else 1), num_classes)

    def forward(self, x: Tensor) -> Tensor:
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


def transformer_encoder(norm_first: bool = False) -> TransformerEncoderClassifier:
    return TransformerEncoderClassifier(norm_first=norm_first)


def transformer_decoder_lm() -> TransformerDecoderLM:
    return TransformerDecoderLM()


def transformer_seq2seq() -> Seq2SeqTransformer:
    return Seq2SeqTransformer()


def mha_classifier() -> AttentionClassifier:
    return AttentionClassifier()


def lstm(layers: int = 1, bidirectional: bool = False) -> RecurrentClassifier:
    return RecurrentClassifier("lstm", layers=layers, bidirectional=bidirectional)


def gru(layers: int = 1, bidirectional: bool = False) -> RecurrentClassifier:
    return RecurrentClassifier("gru", layers=layers, bidirectional=bidirectional)


def rnn_tanh(layers: int = 2) -> RecurrentClassifier:
    return RecurrentClassifier("rnn", layers=layers)


class MixerBlock(nn.Module):
    def __init__(self, tokens: int, dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, 2 * tokens), nn.GELU(), nn.Linear(2 * tokens, tokens))
        self.norm2 = nn.LayerNorm(dim)
        self.channel_mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class MlpMixer(nn.Module):
    def __init__(self, image: int = 32, patch: int = 4, dim: int = 64, depth: int = 4, num_classes: int = 10) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        self.blocks = nn.Sequential(*(MixerBlock((image // patch) ** 2, dim) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        return self.head(self.norm(self.blocks(x)).mean(1))


def mlp_mixer() -> MlpMixer:
    return MlpMixer()


class TemporalConvNet(nn.Module):
    """Dilated causal 1-d convolutions with weight norm-free residual blocks and dropout."""

    def __init__(self, features: int = 16, channels: int = 32, levels: int = 4, num_classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        ch = features
        for i in range(levels):
            layers += [nn.Conv1d(ch, channels, 3, padding=2 * 2**i, dilation=2**i), nn.BatchNorm1d(channels),
                       nn.ReLU(), nn.Dropout(0.1)]
            ch = channels
        self.net = nn.Sequential(*layers)
        self.head = nn.Linear(channels, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.amax(self.net(x), dim=2))


def tcn() -> TemporalConvNet:
    return TemporalConvNet()
