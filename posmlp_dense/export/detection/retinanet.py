"""RetinaNet, from the input tensor to boxes, as one exportable forward.

The backbone, neck and head are the detector's own modules; what
``RetinaHead.predict`` does after them is written here with symbolic sizes:
per level, the ``nms_pre`` best (anchor, class) scores above ``score_thr``
(taken with a fixed-size top-k over the scores padded by ``nms_pre``
entries that can never pass, so that no size is data-dependent), their
anchors' boxes decoded and clipped to the input, boxes no larger than
``min_bbox_size`` dropped, per-class NMS, and the best ``max_per_img``
per image.
"""
from __future__ import annotations

from typing import Tuple

import torch
from torch import nn

from .boxes import decode_deltas, grid_anchors
from .nms import nms_into_rows, nms_settings
from .unsupported import UnsupportedDetectorError, require_keys, require_type

TEST_CFG_KEYS = ('nms_pre', 'min_bbox_size', 'score_thr', 'nms',
                 'max_per_img')


def check_anchor_head(head, where: str):
    """The prior generator and box coder a head must have here."""
    from mmdet.models.task_modules.coders import DeltaXYWHBBoxCoder
    from mmdet.models.task_modules.prior_generators import AnchorGenerator
    require_type(head.prior_generator, [AnchorGenerator],
                 f'{where}.prior_generator', 'anchors on a regular grid')
    if head.prior_generator.use_box_type:
        raise UnsupportedDetectorError(
            f'{where}.prior_generator has use_box_type=True; the export '
            f'works on plain box tensors')
    require_type(head.bbox_coder, [DeltaXYWHBBoxCoder], f'{where}.bbox_coder',
                 'the (dx, dy, dw, dh) decoding written in boxes.py')
    if getattr(head.loss_cls, 'custom_cls_channels', False):
        raise UnsupportedDetectorError(
            f'{where}.loss_cls has custom class channels, whose scores the '
            f'export does not compute')


class RetinaNetEnd2End(nn.Module):
    """Normalized images (B, 3, H, W) -> ``dets`` (B, K, 5: x1, y1, x2, y2,
    score) and ``labels`` (B, K), K being test_cfg's ``max_per_img``."""

    def __init__(self, detector: nn.Module):
        super().__init__()
        from mmdet.models.dense_heads import RetinaHead
        head = detector.bbox_head
        require_type(head, [RetinaHead], 'bbox_head',
                     'its anchors, decoding and NMS are written here for '
                     'RetinaHead')
        check_anchor_head(head, 'bbox_head')
        cfg = head.test_cfg
        require_keys(cfg, TEST_CFG_KEYS, 'test_cfg')
        if cfg.get('nms') is None or cfg.get('max_per_img', 0) <= 0 or \
                cfg.get('nms_pre', -1) <= 0:
            raise UnsupportedDetectorError(
                'test_cfg needs nms, a positive max_per_img (the number of '
                'rows per image) and a positive nms_pre')
        self.backbone = detector.backbone
        self.neck = detector.neck if detector.with_neck else nn.Identity()
        self.head = head
        self.nms = nms_settings(cfg.nms, 'test_cfg.nms')
        self.nms_pre = int(cfg.nms_pre)
        self.score_thr = float(cfg.get('score_thr', 0))
        self.min_bbox_size = cfg.get('min_bbox_size', -1)
        self.max_per_img = int(cfg.max_per_img)

    def forward(self, images: torch.Tensor
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        batch, _, height, width = images.shape
        cls_scores, box_deltas = self.head(self.neck(self.backbone(images)))
        num_classes = self.head.num_classes
        boxes, scores, labels, valid = [], [], [], []
        for level, (logits, deltas) in enumerate(zip(cls_scores, box_deltas)):
            map_h, map_w = logits.shape[-2:]
            logits = logits.permute(0, 2, 3, 1).reshape(
                batch, -1, self.head.cls_out_channels)
            if self.head.use_sigmoid_cls:
                level_scores = logits.sigmoid()
            else:
                level_scores = logits.softmax(-1)[..., :-1]
            level_scores = level_scores.reshape(batch, -1)
            count = level_scores.shape[1]  # anchors x classes
            padded = torch.cat([level_scores, level_scores.new_full(
                (batch, self.nms_pre), -1.0)], dim=1)
            top, index = padded.topk(self.nms_pre, dim=1)
            anchor = (index // num_classes).clamp(max=count // num_classes - 1)
            anchors = grid_anchors(self.head.prior_generator, level, map_h,
                                   map_w, images)
            deltas = deltas.permute(0, 2, 3, 1).reshape(batch, -1, 4)
            boxes.append(decode_deltas(
                anchors[anchor], deltas.gather(
                    1, anchor[..., None].expand(-1, -1, 4)),
                self.head.bbox_coder, height, width))
            scores.append(top)
            labels.append(index % num_classes)
            valid.append((top > self.score_thr) & (index < count))
        boxes, scores = torch.cat(boxes, 1), torch.cat(scores, 1)
        labels, valid = torch.cat(labels, 1), torch.cat(valid, 1)
        if self.min_bbox_size >= 0:
            sizes = boxes[..., 2:] - boxes[..., :2]
            valid = valid & (sizes > self.min_bbox_size).all(-1)
        image, candidate = valid.nonzero(as_tuple=True)
        rows = nms_into_rows(
            boxes[image, candidate], scores[image, candidate],
            labels[image, candidate], image, batch, num_classes, self.nms,
            self.max_per_img)
        return torch.cat([rows.boxes, rows.scores[..., None]], -1), \
            rows.labels
