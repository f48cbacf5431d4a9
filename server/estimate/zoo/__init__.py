"""The model zoo: architectures defined in this repository (CNNs, `torch.nn` sequence models, recommenders, graph
layers, HF speech/image-text wrappers), each a factory (`server.estimate.zoo:NAME`, allowed without registration,
see server.estimate.allowlist), and the catalogue the accuracy benchmark runs (`catalogue.ZOO`)."""

from server.estimate.zoo.cnn import (
    convnext_tiny,
    densenet121,
    efficientnet_b0,
    mobilenet_v3,
    resnet18,
    resnet50,
    resnet_small,
    unet,
    vgg16,
    vgg_small,
)
from server.estimate.zoo.hf import clip, whisper
from server.estimate.zoo.sequence import (
    gru,
    lstm,
    mha_classifier,
    mlp_mixer,
    rnn_tanh,
    tcn,
    transformer_decoder_lm,
    transformer_encoder,
    transformer_seq2seq,
)
from server.estimate.zoo.sparse import dlrm, gat, gcn, wide_and_deep

__all__ = [
    "clip", "convnext_tiny", "densenet121", "dlrm", "efficientnet_b0", "gat", "gcn", "gru", "lstm",
    "mha_classifier", "mlp_mixer", "mobilenet_v3", "resnet18", "resnet50", "resnet_small", "rnn_tanh", "tcn",
    "transformer_decoder_lm", "transformer_encoder", "transformer_seq2seq", "unet", "vgg16", "vgg_small",
    "whisper", "wide_and_deep",
]
