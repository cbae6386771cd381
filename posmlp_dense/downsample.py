"""Downsampling between levels (``levels.i.pool``)."""
from __future__ import annotations

import torch
from torch import nn


class ConvDownsample(nn.Module):
    """Grouped conv3x3/2 (groups = input width) then LayerNorm over channels.

    Takes an NCHW map and returns the channels-last (B, H, W, C) map that the
    level's windows are cut from. The conv pads with zeros as published; it
    only ever sees the real map, never window padding.
    """

    def __init__(self, in_dim: int, out_dim: int, norm_eps: float = 1e-6):
        super().__init__()
        self.conv = nn.Conv2d(in_dim, out_dim, kernel_size=3, stride=2,
                              padding=1, groups=in_dim)
        self.norm = nn.LayerNorm(out_dim, eps=norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x).permute(0, 2, 3, 1))
