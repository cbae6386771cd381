"""The convolutional stem: image -> stride-4 feature map (``patch_embed``)."""
from __future__ import annotations

import torch
from torch import nn


class ConvStem(nn.Module):
    """conv3x3/2 -> BN -> GELU -> conv3x3/2 -> BN -> GELU -> conv1x1 -> BN.

    Widths in_channels -> dim/2 -> dim -> dim, BatchNorm eps 1e-6, all convs
    with bias, as published.
    """

    def __init__(self, in_channels: int, dim: int):
        super().__init__()
        widths = (in_channels, dim // 2, dim, dim)
        kernels, strides = (3, 3, 1), (2, 2, 1)
        self.projs = nn.Sequential(*[
            nn.Conv2d(widths[i], widths[i + 1], kernels[i], strides[i],
                      padding=kernels[i] // 2) for i in range(3)])
        self.norms = nn.Sequential(*[
            nn.BatchNorm2d(widths[i + 1], eps=1e-6) for i in range(3)])
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.norms[0](self.projs[0](x)))
        x = self.act(self.norms[1](self.projs[1](x)))
        return self.norms[2](self.projs[2](x))
