"""Anchors and box decoding, as mmdet computes them, with symbolic sizes.

``grid_anchors`` lays an mmdet ``AnchorGenerator``'s base anchors over a
feature map whose height and width may be symbolic (they come from the
input's); ``decode_deltas`` is mmdet's ``delta2bbox`` (the decoding of
``DeltaXYWHBBoxCoder``) for tensors of any leading shape, clipped to the
input tensor's height and width as mmdet clips to ``img_shape``.
"""
from __future__ import annotations

import inspect
import math

import torch


def grid_anchors(generator, level: int, height, width,
                 like: torch.Tensor) -> torch.Tensor:
    """(height * width * A, 4) anchors of ``level``, in mmdet's order: row
    by row over the map, the A base anchors of each location together."""
    base = generator.base_anchors[level].to(like)
    stride_w, stride_h = generator.strides[level]
    xs = torch.arange(width, device=like.device).to(like.dtype) * stride_w
    ys = torch.arange(height, device=like.device).to(like.dtype) * stride_h
    yy, xx = torch.meshgrid(ys, xs, indexing='ij')
    shifts = torch.stack([xx, yy, xx, yy], dim=-1).reshape(-1, 4)
    return (base[None, :, :] + shifts[:, None, :]).reshape(-1, 4)


def coder_wh_ratio_clip(coder) -> float:
    """The ``wh_ratio_clip`` mmdet's heads decode with: the default of the
    coder's ``decode`` (no head passes another)."""
    return inspect.signature(coder.decode).parameters['wh_ratio_clip'].default


def decode_deltas(priors: torch.Tensor, deltas: torch.Tensor, coder,
                  height, width) -> torch.Tensor:
    """Boxes (x1, y1, x2, y2) from ``priors`` and ``deltas`` (..., 4), as
    ``coder`` (a ``DeltaXYWHBBoxCoder``) decodes them for an image of
    ``height`` x ``width``."""
    means = deltas.new_tensor(coder.means)
    stds = deltas.new_tensor(coder.stds)
    deltas = deltas * stds + means
    centers = (priors[..., :2] + priors[..., 2:]) * 0.5
    sizes = priors[..., 2:] - priors[..., :2]
    shift = sizes * deltas[..., :2]
    max_ratio = abs(math.log(coder_wh_ratio_clip(coder)))
    if coder.add_ctr_clamp:
        shift = shift.clamp(min=-coder.ctr_clamp, max=coder.ctr_clamp)
        scale = deltas[..., 2:].clamp(max=max_ratio)
    else:
        scale = deltas[..., 2:].clamp(min=-max_ratio, max=max_ratio)
    centers = centers + shift
    sizes = sizes * scale.exp()
    boxes = torch.cat([centers - sizes * 0.5, centers + sizes * 0.5], dim=-1)
    if coder.clip_border:
        x1, y1, x2, y2 = boxes.unbind(-1)
        boxes = torch.stack([x1.clamp(min=0, max=width),
                             y1.clamp(min=0, max=height),
                             x2.clamp(min=0, max=width),
                             y2.clamp(min=0, max=height)], dim=-1)
    return boxes
