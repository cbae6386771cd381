"""Faster / Mask R-CNN, from the input tensor to boxes (and masks), as one
exportable forward.

The backbone, neck, RPN convs, box head and mask head are the detector's
own modules. Around them, with symbolic sizes:

* proposals as ``RPNHead.predict`` makes them: per level the ``nms_pre``
  best anchors (a fixed-size top-k over scores padded by entries marked
  invalid), decoded and clipped, boxes no larger than ``min_bbox_size``
  dropped, NMS per level, the best ``max_per_img`` per image;
* the box head on those proposals (RoIAlign on each RoI's level), class
  scores above ``score_thr``, class-specific boxes decoded and clipped,
  per-class NMS, the best ``max_per_img`` per image (``multiclass_nms``);
* for Mask R-CNN, the mask head on those boxes, each mask taken for its
  box's label and pasted into an image of the input's size.
"""
from __future__ import annotations

from typing import Tuple

import torch
from torch import nn

from .boxes import decode_deltas, grid_anchors
from .masks import paste_masks
from .nms import Rows, nms_into_rows, nms_settings
from .retinanet import check_anchor_head
from .roi_features import check_roi_extractor, pool_rois
from .unsupported import UnsupportedDetectorError, require_keys, require_type

RPN_KEYS = ('nms_pre', 'max_per_img', 'nms', 'min_bbox_size')
RCNN_KEYS = ('score_thr', 'nms', 'max_per_img', 'mask_thr_binary')


def _check_heads(detector):
    from mmdet.models.dense_heads import RPNHead
    from mmdet.models.roi_heads import StandardRoIHead
    from mmdet.models.roi_heads.bbox_heads import (BBoxHead, ConvFCBBoxHead,
                                                   Shared2FCBBoxHead,
                                                   Shared4Conv1FCBBoxHead)
    from mmdet.models.roi_heads.mask_heads import FCNMaskHead
    from mmdet.models.task_modules.coders import DeltaXYWHBBoxCoder
    require_type(detector.rpn_head, [RPNHead], 'rpn_head',
                 'its proposals are written here for RPNHead')
    check_anchor_head(detector.rpn_head, 'rpn_head')
    roi_head = detector.roi_head
    require_type(roi_head, [StandardRoIHead], 'roi_head',
                 'one box stage and an optional mask stage')
    if roi_head.with_shared_head:
        raise UnsupportedDetectorError(
            'roi_head.shared_head is set; the export runs the box and mask '
            'heads on the pooled features directly')
    check_roi_extractor(roi_head.bbox_roi_extractor,
                        'roi_head.bbox_roi_extractor')
    require_type(roi_head.bbox_head, [BBoxHead, ConvFCBBoxHead,
                                      Shared2FCBBoxHead,
                                      Shared4Conv1FCBBoxHead],
                 'roi_head.bbox_head', 'softmax scores and delta boxes')
    bbox_head = roi_head.bbox_head
    if bbox_head.custom_cls_channels or bbox_head.reg_decoded_bbox or \
            bbox_head.reg_predictor_cfg.get('type') != 'Linear':
        raise UnsupportedDetectorError(
            'roi_head.bbox_head has custom class channels, decoded-box '
            'regression or a non-linear regressor, which the export does '
            'not compute')
    require_type(bbox_head.bbox_coder, [DeltaXYWHBBoxCoder],
                 'roi_head.bbox_head.bbox_coder',
                 'the (dx, dy, dw, dh) decoding written in boxes.py')
    if roi_head.with_mask:
        if not roi_head.share_roi_extractor:
            check_roi_extractor(roi_head.mask_roi_extractor,
                                'roi_head.mask_roi_extractor')
        require_type(roi_head.mask_head, [FCNMaskHead], 'roi_head.mask_head',
                     'masks pasted as FCNMaskHead pastes them')


class TwoStageEnd2End(nn.Module):
    """Normalized images (B, 3, H, W) -> ``dets`` (B, K, 5), ``labels``
    (B, K) and, with a mask head, ``masks`` (B, K, H, W) bool; K is the
    R-CNN test_cfg's ``max_per_img``."""

    def __init__(self, detector: nn.Module):
        super().__init__()
        _check_heads(detector)
        self.backbone = detector.backbone
        self.neck = detector.neck if detector.with_neck else nn.Identity()
        self.rpn_head = detector.rpn_head
        self.roi_head = detector.roi_head
        rpn_cfg, rcnn_cfg = detector.test_cfg.rpn, detector.test_cfg.rcnn
        require_keys(rpn_cfg, RPN_KEYS, 'test_cfg.rpn')
        require_keys(rcnn_cfg, RCNN_KEYS, 'test_cfg.rcnn')
        for where, cfg in (('test_cfg.rpn', rpn_cfg),
                           ('test_cfg.rcnn', rcnn_cfg)):
            if cfg.get('nms') is None or cfg.get('max_per_img', 0) <= 0:
                raise UnsupportedDetectorError(
                    f'{where} needs nms and a positive max_per_img (the '
                    f'number of rows per image)')
        self.rpn_nms = nms_settings(rpn_cfg.nms, 'test_cfg.rpn.nms')
        self.rpn_pre = int(rpn_cfg.get('nms_pre', -1))
        self.rpn_min_size = rpn_cfg.get('min_bbox_size', -1)
        self.proposals = int(rpn_cfg.max_per_img)
        self.rcnn_nms = nms_settings(rcnn_cfg.nms, 'test_cfg.rcnn.nms')
        self.score_thr = float(rcnn_cfg.score_thr)
        self.max_per_img = int(rcnn_cfg.max_per_img)
        self.with_mask = self.roi_head.with_mask
        if self.with_mask:
            self.mask_thr = float(rcnn_cfg.mask_thr_binary)
            if self.mask_thr < 0:
                raise UnsupportedDetectorError(
                    'test_cfg.rcnn.mask_thr_binary < 0 asks for uint8 soft '
                    'masks; the export gives thresholded (bool) masks')

    def forward(self, images: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        feats = self.neck(self.backbone(images))
        proposals = self.propose(feats, images)
        rows = self.detect(feats, proposals, images)
        dets = torch.cat([rows.boxes, rows.scores[..., None]], -1)
        if not self.with_mask:
            return dets, rows.labels
        return dets, rows.labels, self.segment(feats, rows, images)

    def propose(self, feats, images) -> Rows:
        """The RPN's proposals, ``max_per_img`` rows per image."""
        head = self.rpn_head
        batch, _, height, width = images.shape
        cls_scores, box_deltas = head(feats)
        boxes, scores, levels, valid = [], [], [], []
        for level, (logits, deltas) in enumerate(zip(cls_scores, box_deltas)):
            map_h, map_w = logits.shape[-2:]
            logits = logits.permute(0, 2, 3, 1).reshape(
                batch, -1, head.cls_out_channels)
            if head.use_sigmoid_cls:
                level_scores = logits.sigmoid()[..., 0]
            else:
                level_scores = logits.softmax(-1)[..., 0]
            anchors = grid_anchors(head.prior_generator, level, map_h, map_w,
                                   images)
            deltas = deltas.permute(0, 2, 3, 1).reshape(batch, -1, 4)
            count = level_scores.shape[1]
            if self.rpn_pre > 0:  # as mmdet: the best nms_pre, or all
                padded = torch.cat([level_scores, level_scores.new_full(
                    (batch, self.rpn_pre), -1.0)], dim=1)
                level_scores, index = padded.topk(self.rpn_pre, dim=1)
                real = index < count
                index = index.clamp(max=count - 1)
                level_anchors = anchors[index]
                deltas = deltas.gather(1, index[..., None].expand(-1, -1, 4))
            else:
                real = torch.ones_like(level_scores, dtype=torch.bool)
                level_anchors = anchors[None].expand(batch, -1, -1)
            boxes.append(decode_deltas(level_anchors, deltas, head.bbox_coder,
                                       height, width))
            scores.append(level_scores)
            levels.append(torch.full_like(real, level, dtype=torch.long))
            valid.append(real)
        boxes, scores = torch.cat(boxes, 1), torch.cat(scores, 1)
        levels, valid = torch.cat(levels, 1), torch.cat(valid, 1)
        if self.rpn_min_size >= 0:
            sizes = boxes[..., 2:] - boxes[..., :2]
            valid = valid & (sizes > self.rpn_min_size).all(-1)
        image, candidate = valid.nonzero(as_tuple=True)
        # NMS within each level (mmdet passes the level ids as labels)
        return nms_into_rows(
            boxes[image, candidate], scores[image, candidate],
            levels[image, candidate], image, batch, len(cls_scores),
            self.rpn_nms, self.proposals)

    def detect(self, feats, proposals: Rows, images) -> Rows:
        """The box head's detections, ``max_per_img`` rows per image."""
        batch, _, height, width = images.shape
        head = self.roi_head.bbox_head
        # every proposal row goes through the head, empty ones too (zero
        # boxes, cheap): a fixed count keeps the sizes after it symbolic
        # rather than data-dependent
        count = proposals.boxes.shape[1]
        image = torch.arange(batch, device=images.device).repeat_interleave(
            count)
        rois = torch.cat([image[:, None].to(images.dtype),
                          proposals.boxes.reshape(-1, 4)], dim=1)
        extractor = self.roi_head.bbox_roi_extractor
        cls_score, box_deltas = head(pool_rois(
            extractor, feats[:extractor.num_inputs], rois))
        scores = cls_score.softmax(-1)[:, :-1]
        deltas = box_deltas.reshape(rois.shape[0], -1, 4)
        boxes = decode_deltas(rois[:, None, 1:], deltas, head.bbox_coder,
                              height, width)  # (n, classes or 1, 4)
        valid = (scores > self.score_thr) & proposals.filled.reshape(-1, 1)
        roi, label = valid.nonzero(as_tuple=True)
        chosen = boxes[roi, 0] if head.reg_class_agnostic else \
            boxes[roi, label]
        return nms_into_rows(chosen, scores[roi, label], label, image[roi],
                             batch, head.num_classes, self.rcnn_nms,
                             self.max_per_img)

    def segment(self, feats, rows: Rows, images) -> torch.Tensor:
        """(B, K, H, W) masks of the detections, False in empty rows."""
        batch, _, height, width = images.shape
        head = self.roi_head.mask_head
        boxes = rows.boxes.reshape(-1, 4)
        image = torch.arange(batch, device=images.device).repeat_interleave(
            rows.boxes.shape[1])
        rois = torch.cat([image[:, None].to(images.dtype), boxes], dim=1)
        extractor = self.roi_head.mask_roi_extractor
        logits = head(pool_rois(extractor, feats[:extractor.num_inputs],
                                rois))
        channel = torch.zeros_like(image) if head.class_agnostic else \
            rows.labels.reshape(-1)
        probs = logits[torch.arange(logits.shape[0],
                                    device=logits.device), channel].sigmoid()
        masks = paste_masks(probs, boxes, height, width, self.mask_thr)
        masks = masks & rows.filled.reshape(-1)[:, None, None]
        return masks.reshape(batch, -1, height, width)
