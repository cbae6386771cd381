"""Weights that make a small random mmdet detector detect things.

Freshly initialized heads score every anchor near their prior (RetinaNet:
0.01, under any score threshold), and ``randomize_``'s weights saturate
scores to 1.0, where many ties make the top-k order arbitrary. Here each
score and regression layer is rescaled, per output channel, so that on a
sample image its outputs have a chosen spread and offset: scores spread
over (0, 1) without ties, a share of them above the threshold, and boxes
moved visibly off their anchors. The result is a detector with many
different, overlapping detections (which NMS must sort out) at any size.
"""
from __future__ import annotations

import math

import torch
from torch import nn


def _channel_outputs(model_call, layer: nn.Module) -> torch.Tensor:
    """(samples, channels) outputs of ``layer`` during ``model_call()``."""
    seen = []

    def hook(module, args, out):
        seen.append(out.detach().transpose(0, 1).reshape(out.shape[1], -1))

    handle = layer.register_forward_hook(hook)
    try:
        with torch.no_grad():
            model_call()
    finally:
        handle.remove()
    return torch.cat(seen, dim=1).t()


def calibrate_(layer: nn.Module, outputs: torch.Tensor, std: float,
               top_share: float = None, top_value: float = 0.0):
    """Rescale ``layer``'s weight and bias per output channel: spread
    ``std``; with ``top_share``, the share ``top_share`` of each channel's
    sample outputs lies above ``top_value``, else mean 0."""
    with torch.no_grad():
        scale = std / outputs.std(0).clamp(min=1e-6)
        shape = (-1,) + (1,) * (layer.weight.dim() - 1)
        layer.weight.mul_(scale.view(shape))
        layer.bias.mul_(scale)
        scaled = outputs * scale
        if top_share is None:
            layer.bias.sub_(scaled.mean(0))
        else:
            layer.bias.add_(top_value - scaled.quantile(1 - top_share, dim=0))


def _sample_call(detector, size=(160, 224), seed=0):
    x = torch.randn((1, 3) + size,
                    generator=torch.Generator().manual_seed(seed))
    return lambda: detector._forward(x, _samples(x)), x


def _samples(x):
    from mmdet.structures import DetDataSample
    h, w = x.shape[-2:]
    sample = DetDataSample(metainfo=dict(
        img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w),
        batch_input_shape=(h, w), scale_factor=(1.0, 1.0)))
    return [sample for _ in range(x.shape[0])]


def make_retinanet_detect_(detector, share: float = 0.01):
    """RetinaNet: 1 % of the (anchor, class) scores of a sample image
    above the score threshold, boxes up to about 30 % off their anchors."""
    head = detector.bbox_head
    threshold = head.test_cfg.get('score_thr', 0.05)
    call, _ = _sample_call(detector)
    calibrate_(head.retina_cls, _channel_outputs(call, head.retina_cls), 1.5,
               share, math.log(threshold / (1 - threshold)))
    calibrate_(head.retina_reg, _channel_outputs(call, head.retina_reg), 0.3)
    return detector


def make_two_stage_detect_(detector):
    """Faster / Mask R-CNN: spread RPN scores, class scores of which some
    pass the threshold (the background a little ahead), boxes off their
    proposals, masks covering part of their boxes."""
    call, _ = _sample_call(detector)
    rpn = detector.rpn_head
    calibrate_(rpn.rpn_cls, _channel_outputs(call, rpn.rpn_cls), 2.0)
    calibrate_(rpn.rpn_reg, _channel_outputs(call, rpn.rpn_reg), 0.2)
    head = detector.roi_head.bbox_head
    calibrate_(head.fc_cls, _channel_outputs(call, head.fc_cls), 1.5)
    with torch.no_grad():
        head.fc_cls.bias[-1] += 1.0  # background
    calibrate_(head.fc_reg, _channel_outputs(call, head.fc_reg), 0.3)
    if detector.roi_head.with_mask:
        logits = detector.roi_head.mask_head.conv_logits
        calibrate_(logits, _channel_outputs(call, logits), 2.0)
    return detector
