"""Reference CNNs defined in code (torchvision is not a dependency), usable as factories:
`server.estimate.zoo:resnet50`, `server.estimate.zoo:vgg16`. Same layer shapes as torchvision's."""

from __future__ import annotations

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
