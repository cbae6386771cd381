"""mmdet's ``SingleRoIExtractor``: RoIAlign on the level each RoI maps to.

Each RoI is pooled from one FPN level, chosen by its size as mmdet chooses
it; the RoIAlign is torchvision's (the ONNX exporter writes it as
``RoiAlign``), with the settings of mmcv's ``RoIAlign`` layers, which
compute the same (average pooling, ``aligned`` half-pixel offsets,
adaptive sampling when ``sampling_ratio`` is 0).
"""
from __future__ import annotations

from typing import Sequence

import torch
import torchvision

from .unsupported import UnsupportedDetectorError, require_type


def check_roi_extractor(extractor, where: str):
    """Refuse an extractor the graph would not reproduce."""
    from mmcv.ops import RoIAlign
    from mmdet.models.roi_heads.roi_extractors import SingleRoIExtractor
    require_type(extractor, [SingleRoIExtractor], where,
                 'RoIs pooled from one level chosen by their size')
    for i, layer in enumerate(extractor.roi_layers):
        require_type(layer, [RoIAlign], f'{where}.roi_layers[{i}]',
                     'torchvision\'s roi_align, which ONNX has as RoiAlign')
        if layer.pool_mode != 'avg':
            raise UnsupportedDetectorError(
                f'{where}.roi_layers[{i}] has pool_mode={layer.pool_mode!r}; '
                f'the export implements average pooling (ONNX RoiAlign)')


def roi_levels(rois: torch.Tensor, finest_scale: float,
               num_levels: int) -> torch.Tensor:
    """The level of each RoI (n, 5: image, x1, y1, x2, y2), as
    ``SingleRoIExtractor.map_roi_levels`` computes it."""
    scale = torch.sqrt((rois[:, 3] - rois[:, 1]) * (rois[:, 4] - rois[:, 2]))
    levels = torch.floor(torch.log2(scale / finest_scale + 1e-6))
    return levels.clamp(min=0, max=num_levels - 1).long()


def pool_rois(extractor, feats: Sequence[torch.Tensor],
              rois: torch.Tensor) -> torch.Tensor:
    """(n, C, h, w) features of ``rois`` (n, 5), each from its level."""
    num_levels = len(extractor.featmap_strides)
    levels = roi_levels(rois, extractor.finest_scale, num_levels)
    out_h, out_w = extractor.roi_layers[0].output_size
    pooled = feats[0].new_zeros(
        (rois.shape[0], extractor.out_channels, out_h, out_w))
    for level in range(num_levels):
        # only the RoIs of this level: RoIAlign's cost grows with a RoI's
        # size in the level's pixels (adaptive sampling)
        index = (levels == level).nonzero()[:, 0]
        layer = extractor.roi_layers[level]
        values = torchvision.ops.roi_align(
            feats[level], rois[index], layer.output_size,
            spatial_scale=layer.spatial_scale,
            sampling_ratio=layer.sampling_ratio, aligned=layer.aligned)
        pooled = pooled.index_put((index,), values)
    return pooled
