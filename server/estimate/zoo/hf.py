"""Hugging Face models whose inputs are not token ids alone (speech, image-text): factories that build them from a
config (no weights, no hub) and take tensors in, the loss out. Text and vision models go through `hf_config`."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn


class WithLoss(nn.Module):
    """`model(**inputs).loss` as the output: a factory model whose loss is the model's own."""

    def __init__(self, model: nn.Module, names: tuple[str, ...], **extra: Any) -> None:
        super().__init__()
        self.model = model
        self.names = names
        self.extra = extra

    def forward(self, *inputs: Tensor) -> Tensor:
        return self.model(**dict(zip(self.names, inputs, strict=False)), **self.extra).loss


def whisper(d_model: int = 64, layers: int = 2, mel_bins: int = 16, frames: int = 64, vocab: int = 1000) -> WithLoss:
    """Inputs: input_features (mel_bins, frames) float, labels (tokens,) int64 below vocab."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig(d_model=d_model, encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=4,
                           decoder_attention_heads=4, encoder_ffn_dim=4 * d_model, decoder_ffn_dim=4 * d_model,
                           num_mel_bins=mel_bins, max_source_positions=frames // 2, max_target_positions=64,
                           vocab_size=vocab, pad_token_id=0, decoder_start_token_id=1)
    return WithLoss(WhisperForConditionalGeneration(config), ("input_features", "labels"))


def clip(width: int = 64, layers: int = 2, image: int = 32, patch: int = 8, vocab: int = 1000) -> WithLoss:
    """Inputs: input_ids (tokens,) int64 below vocab, pixel_values (3, image, image); contrastive loss."""
    from transformers import CLIPConfig, CLIPModel

    text = {"hidden_size": width, "intermediate_size": 4 * width, "num_hidden_layers": layers,
            "num_attention_heads": 4, "vocab_size": vocab, "max_position_embeddings": 64}
    vision = {"hidden_size": width, "intermediate_size": 4 * width, "num_hidden_layers": layers,
              "num_attention_heads": 4, "image_size": image, "patch_size": patch}
    config = CLIPConfig(text_config=text, vision_config=vision, projection_dim=width)
    return WithLoss(CLIPModel(config), ("input_ids", "pixel_values"), return_loss=True)
