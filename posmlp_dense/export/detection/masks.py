"""Pasting mask-head predictions into the image, as mmdet does on a CPU.

mmdet's ``FCNMaskHead`` resamples each RoI's (m x m) mask onto the image
with ``grid_sample`` (bilinear, ``align_corners=False``, zeros outside)
over the box's pixel range widened by one pixel, and thresholds it. The
sampling grid of an axis-aligned box is separable, so the same values come
from two small interpolation matrices: (H x m) @ mask @ (m x W), each row
holding the bilinear weights max(0, 1 - |position - j|) of one pixel.
"""
from __future__ import annotations

import torch


def _axis_weights(low: torch.Tensor, high: torch.Tensor, size,
                  cells: int) -> torch.Tensor:
    """(n, size, cells) bilinear weights along one axis for boxes spanning
    [low, high) (n,) on an image axis of ``size`` pixels."""
    pixels = torch.arange(size, device=low.device)
    centers = pixels.to(low.dtype) + 0.5
    # mmdet's normalized grid coordinate, with its division by a zero
    # width set to 0 as it sets it
    grid = (centers[None, :] - low[:, None]) / (high - low)[:, None] * 2 - 1
    grid = torch.where(torch.isinf(grid), torch.zeros_like(grid), grid)
    position = ((grid + 1) * cells - 1) / 2  # grid_sample's unnormalizing
    offsets = position[..., None] - torch.arange(
        cells, device=low.device).to(low.dtype)
    weights = (1 - offsets.abs()).clamp(min=0)
    # mmdet pastes into the pixels [floor(low) - 1, ceil(high) + 1) only
    start = (low.floor() - 1).clamp(min=0)
    end = (high.ceil() + 1).clamp(max=size)
    inside = (pixels[None, :] >= start[:, None]) & (
        pixels[None, :] < end[:, None])
    return weights * inside[..., None].to(weights.dtype)


def paste_masks(probs: torch.Tensor, boxes: torch.Tensor, height, width,
                threshold: float) -> torch.Tensor:
    """(n, height, width) bool masks from mask probabilities (n, m, m) of
    the boxes (n, 4) in image coordinates."""
    x1, y1, x2, y2 = boxes.unbind(-1)
    rows = _axis_weights(y1, y2, height, probs.shape[-2])
    cols = _axis_weights(x1, x2, width, probs.shape[-1])
    image = rows @ probs @ cols.transpose(1, 2)
    return image >= threshold
