"""The zoo the accuracy benchmark runs: >= 40 architectures, small enough for about a second per training step on
one CPU core, each a factory of this package or a Hugging Face config (no weights). Batch sizes per entry."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from server.estimate.models import ResolvedModel, resolve
from server.estimate.schemas import InputSpec, ModelSpec

PRECISIONS = ("fp32", "amp_bf16")
OPTIMIZERS = ("sgd", "adamw")


@dataclass(frozen=True)
class ZooEntry:
    name: str
    family: str
    factory: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    inputs: tuple[InputSpec, ...] = ()
    hf_config: dict[str, Any] | None = None
    seq_len: int | None = None
    batches: tuple[int, ...] = (1, 4, 8)
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"

    def resolve(self) -> ResolvedModel:
        if self.hf_config:
            spec = ModelSpec(factory=None, hf_config=self.hf_config, attn_implementation=self.attn_implementation)
        else:
            spec = ModelSpec(factory=self.factory, kwargs=self.kwargs, hf_config=None)
        return resolve(spec, list(self.inputs), self.seq_len, "auto")


def _in(shape: list[int], dtype: Literal["float32", "int64"] = "float32", high: int = 2, name: str | None = None
        ) -> InputSpec:
    return InputSpec(name=name, shape=shape, dtype=dtype, high=high)


def _img(hw: int = 32) -> tuple[InputSpec, ...]:
    return (_in(shape=[3, hw, hw]),)


def _tokens(n: int = 32, vocab: int = 1000, name: str | None = None) -> InputSpec:
    return _in([n], "int64", vocab, name)


def _f(name: str, family: str, *inputs: InputSpec, **kwargs: Any) -> ZooEntry:
    return ZooEntry(name, family, factory=f"server.estimate.zoo:{name.split('/')[0]}", kwargs=kwargs,
                    inputs=inputs)


def _hf(model_type: str, family: str, seq_len: int | None = 32, attn: Literal["sdpa", "eager"] = "sdpa",
        **config: Any) -> ZooEntry:
    return ZooEntry(f"hf/{model_type}", family, hf_config={"model_type": model_type, **config}, seq_len=seq_len,
                    attn_implementation=attn)


_DECODER: dict[str, Any] = {
    "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 1024, "max_position_embeddings": 256}
_ENCODER: dict[str, Any] = {
    "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 1024}

ZOO: tuple[ZooEntry, ...] = (
    # CNNs written in the repository
    _f("resnet18", "cnn", *_img()),
    _f("resnet50", "cnn", *_img(64), width=16, num_classes=10),
    _f("mobilenet_v3", "cnn", *_img(64)),
    _f("efficientnet_b0", "cnn", *_img(64)),
    _f("densenet121", "cnn", *_img()),
    _f("convnext_tiny", "cnn", *_img(64)),
    _f("unet", "cnn", *_img()),
    _f("vgg_small", "cnn", *_img()),
    _f("mlp_mixer", "cnn", *_img()),
    _f("tcn", "conv1d", _in(shape=[16, 128])),
    # torch.nn attention
    _f("transformer_encoder", "nn_attention", _tokens()),
    _f("transformer_encoder/pre_norm", "nn_attention", _tokens(), norm_first=True),
    _f("transformer_decoder_lm", "nn_attention", _tokens()),
    _f("transformer_seq2seq", "nn_attention", _tokens(), _tokens(24)),
    _f("mha_classifier", "nn_attention", _in(shape=[32, 32])),
    # recurrent
    _f("lstm", "rnn", _in(shape=[32, 32])),
    _f("lstm/bi2", "rnn", _in(shape=[32, 32]), layers=2, bidirectional=True),
    _f("gru/2", "rnn", _in(shape=[32, 32]), layers=2),
    _f("gru/bi", "rnn", _in(shape=[32, 32]), bidirectional=True),
    _f("rnn_tanh", "rnn", _in(shape=[32, 32])),
    # recommenders, graphs
    _f("dlrm", "recsys", _in(shape=[13]), _in(shape=[4, 8], dtype="int64", high=5000)),
    _f("wide_and_deep", "recsys", _in(shape=[4, 8], dtype="int64", high=5000)),
    _f("gcn", "graph", _in(shape=[256, 16])),
    _f("gat", "graph", _in(shape=[256, 16])),
    # Hugging Face decoders
    _hf("llama", "hf_decoder", **_DECODER),
    _hf("mistral", "hf_decoder", **_DECODER),
    _hf("qwen2", "hf_decoder", **_DECODER),
    _hf("gemma", "hf_decoder", **{**_DECODER, "head_dim": 32, "num_key_value_heads": 1}),
    _hf("phi", "hf_decoder", **{k: v for k, v in _DECODER.items() if k != "num_key_value_heads"}),
    _hf("gpt_neox", "hf_decoder", **{k: v for k, v in _DECODER.items() if k != "num_key_value_heads"}),
    _hf("gpt2", "hf_decoder", n_embd=128, n_layer=2, n_head=4, vocab_size=1024, n_positions=256),
    _hf("opt", "hf_decoder", hidden_size=128, ffn_dim=256, num_hidden_layers=2, num_attention_heads=4,
        vocab_size=1024, word_embed_proj_dim=128, max_position_embeddings=256),
    # Hugging Face encoders, encoder-decoders
    _hf("bert", "hf_encoder", **_ENCODER),
    _hf("electra", "hf_encoder", **_ENCODER, embedding_size=64),
    _hf("roberta", "hf_encoder", **_ENCODER),
    _hf("deberta-v2", "hf_encoder", attn="eager", **_ENCODER),
    _hf("t5", "hf_seq2seq", num_layers=2, d_model=128, num_heads=4, d_ff=256, d_kv=32, vocab_size=1024),
    _hf("bart", "hf_seq2seq", d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256, vocab_size=1024),
    _f("whisper", "hf_seq2seq", _in(shape=[16, 64]), _tokens(16)),
    # Hugging Face vision, image-text
    _hf("vit", "hf_vision", None, hidden_size=96, num_hidden_layers=2, num_attention_heads=3, intermediate_size=192,
        image_size=32, patch_size=8),
    _hf("swin", "hf_vision", None, image_size=32, patch_size=2, embed_dim=24, depths=[1, 1], num_heads=[2, 4],
        window_size=4),
    _hf("convnext", "hf_vision", None, "eager", image_size=32, num_stages=2, hidden_sizes=[16, 32], depths=[1, 1]),
    _f("clip", "hf_vision", _tokens(16), _in(shape=[3, 32, 32])),
)
# a few rows of every kind, for `--quick` and the test suite
QUICK = ("resnet18", "unet", "transformer_encoder", "lstm/bi2", "gru/2", "dlrm", "gat", "hf/llama", "hf/bert",
         "hf/t5", "hf/swin")


def architectures() -> int:
    """Entries: a variant (bidirectional, multi-layer, pre-norm) of one factory counts as an architecture of its own."""
    return len(ZOO)
