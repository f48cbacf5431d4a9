"""Reference CNNs defined in code (torchvision is not a dependency), usable as factories:
`server.estimate.zoo:resnet50`, `server.estimate.zoo:vgg16`. Layer types and shapes as torchvision's; the zoo
sizes are narrowed (documented per factory)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int = 1) -> None:
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch)
            )

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, layers: tuple[int, ...] = (3, 4, 6, 3), num_classes: int = 1000, width: int = 64) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        blocks: list[nn.Module] = []
        in_ch = width
        for stage, count in enumerate(layers):
            stage_width = width * 2**stage
            for i in range(count):
                blocks.append(Bottleneck(in_ch, stage_width, stride=2 if stage > 0 and i == 0 else 1))
                in_ch = stage_width * Bottleneck.expansion
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.pool(self.blocks(self.stem(x))).flatten(1))


def resnet50(num_classes: int = 1000, width: int = 64) -> ResNet:
    return ResNet((3, 4, 6, 3), num_classes, width)


def resnet_small(num_classes: int = 10, width: int = 16) -> ResNet:
    """Two bottlenecks per stage, narrow: the ResNet-50 layer types at test-suite cost."""
    return ResNet((1, 1, 1, 1), num_classes, width)


class VGG(nn.Module):
    def __init__(self, cfg: tuple[int | str, ...], num_classes: int = 1000, hidden: int = 4096, pool: int = 7) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        in_ch = 3
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                assert isinstance(v, int)
                layers += [nn.Conv2d(in_ch, v, 3, padding=1), nn.ReLU(inplace=True)]
                in_ch = v
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(pool)
        self.classifier = nn.Sequential(
            nn.Linear(in_ch * pool * pool, hidden), nn.ReLU(inplace=True), nn.Dropout(),
            nn.Linear(hidden, hidden), nn.ReLU(inplace=True), nn.Dropout(), nn.Linear(hidden, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.avgpool(self.features(x)).flatten(1))


VGG16 = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


def vgg16(num_classes: int = 1000) -> VGG:
    return VGG(VGG16, num_classes)


def vgg_small(num_classes: int = 10) -> VGG:
    """VGG-16's structure at 1/8 width with a small classifier."""
    cfg = tuple(v if v == "M" else int(v) // 8 for v in VGG16)
    return VGG(cfg, num_classes, hidden=256, pool=2)


# --- more CNNs, same layer types as torchvision's, narrow so a training step takes about a second on one core ---

class BasicBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(out_ch))

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 10, width: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(True))
        blocks: list[nn.Module] = []
        in_ch = width
        for stage in range(4):
            out_ch = width * 2**stage
            blocks += [BasicBlock(in_ch, out_ch, 2 if stage else 1), BasicBlock(out_ch, out_ch)]
            in_ch = out_ch
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


def resnet18(num_classes: int = 10, width: int = 16) -> ResNet18:
    return ResNet18(num_classes, width)


class SqueezeExcite(nn.Module):
    def __init__(self, ch: int, squeeze: int, gate: type[nn.Module] = nn.Sigmoid) -> None:
        super().__init__()
        self.fc1 = nn.Conv2d(ch, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, ch, 1)
        self.act = nn.ReLU(inplace=True)
        self.gate = gate()

    def forward(self, x: Tensor) -> Tensor:
        s = x.mean((2, 3), keepdim=True)
        return x * self.gate(self.fc2(self.act(self.fc1(s))))


class InvertedResidual(nn.Module):
    """MobileNetV3 / EfficientNet block: expand 1x1, depthwise kxk, squeeze-excite, project 1x1."""

    def __init__(self, in_ch: int, out_ch: int, expand: int, kernel: int, stride: int, act: type[nn.Module],
                 se: bool, gate: type[nn.Module] = nn.Sigmoid) -> None:
        super().__init__()
        mid = in_ch * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [nn.Conv2d(in_ch, mid, 1, bias=False), nn.BatchNorm2d(mid), act()]
        layers += [nn.Conv2d(mid, mid, kernel, stride, kernel // 2, groups=mid, bias=False), nn.BatchNorm2d(mid), act()]
        if se:
            layers.append(SqueezeExcite(mid, max(8, mid // 4), gate))
        layers += [nn.Conv2d(mid, out_ch, 1, bias=False), nn.BatchNorm2d(out_ch)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and in_ch == out_ch

    def forward(self, x: Tensor) -> Tensor:
        out = self.block(x)
        return out + x if self.residual else out


class MobileNetLike(nn.Module):
    def __init__(self, cfg: list[tuple[int, int, int, int, bool]], act: type[nn.Module], gate: type[nn.Module],
                 stem: int, head: int, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, stem, 3, 2, 1, bias=False), nn.BatchNorm2d(stem), act())
        blocks: list[nn.Module] = []
        in_ch = stem
        for expand, out_ch, kernel, stride, se in cfg:
            blocks.append(InvertedResidual(in_ch, out_ch, expand, kernel, stride, act, se, gate))
            in_ch = out_ch
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(nn.Conv2d(in_ch, head, 1, bias=False), nn.BatchNorm2d(head), act())
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(head, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.head(self.blocks(self.stem(x))).mean((2, 3)))


def mobilenet_v3(num_classes: int = 10) -> MobileNetLike:
    """MobileNetV3-Small's block list (expand, out, kernel, stride, SE) at half width; hardswish, hardsigmoid gate."""
    cfg = [(1, 8, 3, 2, True), (4, 12, 3, 2, False), (3, 12, 3, 1, False), (4, 20, 5, 2, True), (6, 20, 5, 1, True),
           (3, 24, 5, 1, True), (6, 48, 5, 2, True), (6, 48, 5, 1, True)]
    return MobileNetLike(cfg, nn.Hardswish, nn.Hardsigmoid, 8, 288, num_classes)


def efficientnet_b0(num_classes: int = 10) -> MobileNetLike:
    """EfficientNet-B0's stages (one block each) at quarter width: MBConv with SE, SiLU."""
    cfg = [(1, 4, 3, 1, True), (6, 6, 3, 2, True), (6, 10, 5, 2, True), (6, 20, 3, 2, True), (6, 28, 5, 1, True),
           (6, 48, 5, 2, True), (6, 80, 3, 1, True)]
    return MobileNetLike(cfg, nn.SiLU, nn.Sigmoid, 8, 320, num_classes)


class DenseLayer(nn.Module):
    def __init__(self, in_ch: int, growth: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.BatchNorm2d(in_ch), nn.ReLU(True), nn.Conv2d(in_ch, 4 * growth, 1, bias=False),
                                 nn.BatchNorm2d(4 * growth), nn.ReLU(True),
                                 nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False))

    def forward(self, features: list[Tensor]) -> Tensor:
        return self.net(torch.cat(features, 1))


class DenseNet(nn.Module):
    def __init__(self, blocks: tuple[int, ...] = (6, 12, 24, 16), growth: int = 8, num_classes: int = 10) -> None:
        super().__init__()
        ch = 2 * growth
        self.stem = nn.Sequential(nn.Conv2d(3, ch, 3, padding=1, bias=False), nn.BatchNorm2d(ch), nn.ReLU(True))
        self.stages = nn.ModuleList()
        self.transitions = nn.ModuleList()
        for i, n in enumerate(blocks):
            layers = nn.ModuleList()
            for _ in range(n):
                layers.append(DenseLayer(ch, growth))
                ch += growth
            self.stages.append(layers)
            if i < len(blocks) - 1:
                self.transitions.append(nn.Sequential(nn.BatchNorm2d(ch), nn.ReLU(True),
                                                      nn.Conv2d(ch, ch // 2, 1, bias=False), nn.AvgPool2d(2)))
                ch //= 2
        self.norm = nn.BatchNorm2d(ch)
        self.fc = nn.Linear(ch, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        for i, layers in enumerate(self.stages):
            features = [x]
            assert isinstance(layers, nn.ModuleList)
            for layer in layers:
                features.append(layer(features))
            x = torch.cat(features, 1)
            if i < len(self.transitions):
                x = self.transitions[i](x)
        return self.fc(torch.relu(self.norm(x)).mean((2, 3)))


def densenet121(num_classes: int = 10, growth: int = 8, blocks: tuple[int, ...] = (3, 6, 12, 8)) -> DenseNet:
    """DenseNet-121's layers at half its block counts (6, 12, 24, 16), growth rate 8 (torchvision: 32): the full
    depth takes 40 s to trace on this machine's shared cores, half of it the same layer pattern."""
    return DenseNet(blocks, growth, num_classes)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: Tensor) -> Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.gamma * self.pwconv2(self.act(self.pwconv1(self.norm(y))))
        return x + y.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self, depths: tuple[int, ...] = (3, 3, 9, 3), dims: tuple[int, ...] = (96, 192, 384, 768),
                 num_classes: int = 10) -> None:
        super().__init__()
        self.downsample = nn.ModuleList([nn.Sequential(nn.Conv2d(3, dims[0], 4, 4), nn.GroupNorm(1, dims[0]))])
        for i in range(len(dims) - 1):
            self.downsample.append(nn.Sequential(nn.GroupNorm(1, dims[i]), nn.Conv2d(dims[i], dims[i + 1], 2, 2)))
        self.stages = nn.ModuleList(nn.Sequential(*(ConvNeXtBlock(d) for _ in range(n)))
                                    for n, d in zip(depths, dims, strict=True))
        self.norm = nn.LayerNorm(dims[-1])
        self.head = nn.Linear(dims[-1], num_classes)

    def forward(self, x: Tensor) -> Tensor:
        for down, stage in zip(self.downsample, self.stages, strict=False):
            x = stage(down(x))
        return self.head(self.norm(x.mean((2, 3))))


def convnext_tiny(num_classes: int = 10) -> ConvNeXt:
    """ConvNeXt-T's depths (3, 3, 9, 3) at 1/8 width."""
    return ConvNeXt((3, 3, 9, 3), (12, 24, 48, 96), num_classes)


class UNet(nn.Module):
    """Encoder-decoder with group norm and transposed-convolution upsampling; per-pixel output."""

    def __init__(self, in_ch: int = 3, out_ch: int = 2, width: int = 8, depth: int = 3) -> None:
        super().__init__()

        def double(i: int, o: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.GroupNorm(4, o), nn.SiLU(),
                                 nn.Conv2d(o, o, 3, padding=1), nn.GroupNorm(4, o), nn.SiLU())

        chans = [width * 2**i for i in range(depth + 1)]
        self.down = nn.ModuleList([double(in_ch, chans[0]), *(double(chans[i], chans[i + 1]) for i in range(depth))])
        self.up = nn.ModuleList(nn.ConvTranspose2d(chans[i + 1], chans[i], 2, stride=2) for i in reversed(range(depth)))
        self.merge = nn.ModuleList(double(2 * chans[i], chans[i]) for i in reversed(range(depth)))
        self.out = nn.Conv2d(chans[0], out_ch, 1)

    def forward(self, x: Tensor) -> Tensor:
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else nn.functional.max_pool2d(x, 2))
            skips.append(x)
        skips.pop()
        for up, merge in zip(self.up, self.merge, strict=False):
            x = merge(torch.cat([up(x), skips.pop()], 1))
        return self.out(x)


def unet(out_ch: int = 2, width: int = 8) -> UNet:
    return UNet(3, out_ch, width)
