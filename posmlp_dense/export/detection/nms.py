"""Per-class NMS for a batch, into a fixed number of rows per image.

How many boxes NMS keeps depends on the data, so the graph's outputs have
``rows`` rows per image (the config's ``max_per_img``): the kept boxes in
descending score, then rows of zeros (score 0, label 0) if fewer were
kept. The NMS itself is torchvision's, which the ONNX exporter writes as
``NonMaxSuppression``, on boxes moved apart by group as mmcv's
``batched_nms`` moves them, so that boxes of different classes (and here
also of different images) never overlap.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torchvision

from .unsupported import UnsupportedDetectorError, require_keys

# what mmcv's nms settings may hold, as far as the export implements them
NMS_KEYS = ('type', 'iou_threshold', 'class_agnostic', 'split_thr',
            'offset', 'score_threshold', 'max_num')


class NmsSettings(NamedTuple):
    iou_threshold: float
    class_agnostic: bool


def nms_settings(cfg, where: str) -> NmsSettings:
    """The settings of a test_cfg's ``nms`` dict, refusing what mmcv's
    ``batched_nms`` would do differently from plain, hard NMS."""
    require_keys(cfg, NMS_KEYS, where)
    if cfg.get('type', 'nms') != 'nms':
        raise UnsupportedDetectorError(
            f'{where}.type is {cfg["type"]!r}; only plain NMS (type=\'nms\') '
            f'is exported (it is ONNX NonMaxSuppression; soft-NMS rescores '
            f'boxes, which that operator cannot)')
    # mmcv's defaults: offset 0 (areas without +1), no score threshold
    # and no cap inside NMS (score_thr and max_per_img do those)
    for key, default, is_default in (
            ('offset', 0, lambda v: v == 0),
            ('score_threshold', 0, lambda v: v <= 0),
            ('max_num', -1, lambda v: v <= 0)):
        if not is_default(cfg.get(key, default)):
            raise UnsupportedDetectorError(
                f'{where}.{key} = {cfg[key]!r} is not exported (the deploy '
                f'graph implements mmcv\'s default, {default}); leave it '
                f'unset')
    # split_thr only chooses between two ways mmcv computes the same result
    return NmsSettings(float(cfg['iou_threshold']),
                       bool(cfg.get('class_agnostic', False)))


class Rows(NamedTuple):
    """Kept boxes, ``rows`` per image; ``filled`` marks the real ones."""
    boxes: torch.Tensor  # (B, rows, 4)
    scores: torch.Tensor  # (B, rows)
    labels: torch.Tensor  # (B, rows), int64
    filled: torch.Tensor  # (B, rows), bool


def nms_into_rows(boxes: torch.Tensor, scores: torch.Tensor,
                  labels: torch.Tensor, images: torch.Tensor, num_images,
                  num_labels: int, settings: NmsSettings,
                  rows: int) -> Rows:
    """NMS per image and label of n candidates (``boxes`` (n, 4),
    ``scores``, ``labels``, ``images`` (n,)), then the first ``rows`` kept
    per image.

    As in mmcv, the boxes are moved by (group) * (largest coordinate + 1),
    group being the label (nothing with ``class_agnostic``), plus
    image * ``num_labels`` here; with one image this is mmcv's arithmetic
    exactly.
    """
    groups = images * (1 if settings.class_agnostic else num_labels)
    if not settings.class_agnostic:
        groups = groups + labels
    # mmcv takes boxes.max(), which fails on no boxes; 0 joins in, which
    # changes nothing for boxes clipped to the image (all coordinates >= 0)
    top = torch.cat([boxes.reshape(-1), boxes.new_zeros(1)]).amax(0)
    moved = boxes + (groups.to(boxes.dtype) * (top + 1))[:, None]
    # (torchvision's shape function for nms assumes >= 2 kept boxes; the
    # graph holds for 0 and 1 too, tests/test_export_detector.py checks)
    keep = torchvision.ops.nms(moved, scores, settings.iou_threshold)

    # keep is in descending score; a kept box's row is its rank among the
    # kept boxes of its image
    kept_images = images[keep]
    member = kept_images[:, None] == torch.arange(
        num_images, device=images.device)[None, :]
    rank = member.long().cumsum(0).gather(1, kept_images[:, None])[:, 0] - 1
    # room for every kept box (ranks are unique per image), then the first
    # `rows` columns: no index is written twice, rows past the last kept
    # box stay zero
    width = keep.shape[0] + rows
    index = (kept_images, rank)

    def place(values, shape_tail=()):
        out = values.new_zeros((num_images, width) + shape_tail)
        return out.index_put(index, values)[:, :rows]

    return Rows(place(boxes[keep], (4,)), place(scores[keep]),
                place(labels[keep]),
                place(torch.ones_like(keep, dtype=torch.bool)))
