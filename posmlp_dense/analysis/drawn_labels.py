"""How many of the boxes a detector draws carry the right class.

box mAP rewards a ranking over all scores; a user looking at the drawn
pictures sees only the boxes above the drawing threshold and reads their
labels. This scores exactly those: each drawn box (score >= ``score_thr``)
is matched, highest score first, to a ground-truth box of the same image at
IoU >= ``iou_thr``, one prediction per ground-truth box (as COCO matches).

A drawn box is

* ``right``: matched to a not yet matched ground-truth box of its class;
* ``wrong_class``: not right, and its best-overlapping ground-truth box
  (IoU >= ``iou_thr``) is of another class;
* ``duplicate``: not right, its best overlap is a box of its class that a
  higher-scored drawn box already took;
* ``background``: no ground-truth box at IoU >= ``iou_thr``.

Inputs are COCO's formats: the ground truth as the dict of an
``instances_*.json`` file, the predictions as the list of a results file
(``image_id``, ``category_id``, ``bbox`` [x, y, w, h], ``score``), which
mmdet's CocoMetric writes with ``outfile_prefix``.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Sequence

OUTCOMES = ('right', 'wrong_class', 'duplicate', 'background')


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """IoU of two COCO boxes [x, y, w, h] (continuous coordinates, as
    pycocotools computes it)."""
    ax0, ay0, aw, ah = (float(v) for v in a)
    bx0, by0, bw, bh = (float(v) for v in b)
    iw = min(ax0 + aw, bx0 + bw) - max(ax0, bx0)
    ih = min(ay0 + ah, by0 + bh) - max(ay0, by0)
    if iw <= 0 or ih <= 0:
        return 0.0
    inter = iw * ih
    return inter / (aw * ah + bw * bh - inter)


def _check_prediction(i: int, pred: dict, image_ids: set) -> None:
    missing = [k for k in ('image_id', 'category_id', 'bbox', 'score')
               if k not in pred]
    if missing:
        raise ValueError(f'prediction {i} lacks {missing}: {pred}')
    if pred['image_id'] not in image_ids:
        raise ValueError(f'prediction {i} names image {pred["image_id"]}, '
                         f'which the ground truth does not have')
    if len(pred['bbox']) != 4:
        raise ValueError(f'prediction {i}: bbox must be [x, y, w, h], got '
                         f'{pred["bbox"]}')


def drawn_label_share(ground_truth: dict, predictions: List[dict],
                      score_thr: float = 0.5, iou_thr: float = 0.5) -> dict:
    """Score the drawn boxes; see the module's docstring.

    Returns a dict: ``drawn`` (boxes at score >= ``score_thr``), a count
    per outcome of :data:`OUTCOMES`, ``share`` (right / drawn; None when
    nothing is drawn), ``missed`` (ground-truth boxes no drawn box took),
    ``num_gt``, ``confusion`` ({ground-truth class name: {drawn class
    name: count}} over the drawn boxes whose best overlap is at IoU >=
    ``iou_thr``), the thresholds, ``per_image`` ({image id: counts}) and
    ``outcomes`` (one per prediction, in their order; None: not drawn).
    Crowd ground-truth boxes are not used.
    """
    if not 0.0 < iou_thr <= 1.0:
        raise ValueError(f'iou_thr must be in (0, 1], got {iou_thr}')
    for key in ('images', 'annotations', 'categories'):
        if key not in ground_truth:
            raise ValueError(f"the ground truth has no '{key}': not a COCO "
                             f'instances dict')
    names = {c['id']: c['name'] for c in ground_truth['categories']}
    image_ids = {img['id'] for img in ground_truth['images']}
    gt_by_image: Dict[int, List[dict]] = defaultdict(list)
    for ann in ground_truth['annotations']:
        if not ann.get('iscrowd', 0):
            gt_by_image[ann['image_id']].append(ann)
    for i, pred in enumerate(predictions):
        _check_prediction(i, pred, image_ids)
        if pred['category_id'] not in names:
            raise ValueError(f'prediction {i} has category '
                             f'{pred["category_id"]}, not one of '
                             f'{sorted(names)}')

    drawn = sorted((i for i, p in enumerate(predictions)
                    if p['score'] >= score_thr),
                   key=lambda i: -float(predictions[i]['score']))
    outcomes: List = [None] * len(predictions)
    counts = dict.fromkeys(OUTCOMES, 0)
    per_image: Dict[int, Dict[str, int]] = {}
    confusion: Dict[str, Dict[str, int]] = {
        names[g]: {names[p]: 0 for p in sorted(names)} for g in sorted(names)}
    taken = set()  # ids of matched ground-truth boxes
    for index in drawn:
        pred = predictions[index]
        gts = gt_by_image.get(pred['image_id'], [])
        ious = [box_iou(pred['bbox'], gt['bbox']) for gt in gts]
        same = [(iou, gt['id']) for iou, gt in zip(ious, gts)
                if gt['category_id'] == pred['category_id']
                and gt['id'] not in taken and iou >= iou_thr]
        best = max(range(len(gts)), key=ious.__getitem__, default=None)
        if best is not None and ious[best] >= iou_thr:
            row = names[gts[best]['category_id']]
            confusion[row][names[pred['category_id']]] += 1
        if same:
            taken.add(max(same)[1])
            outcome = 'right'
        elif best is None or ious[best] < iou_thr:
            outcome = 'background'
        elif gts[best]['category_id'] != pred['category_id']:
            outcome = 'wrong_class'
        else:
            outcome = 'duplicate'
        counts[outcome] += 1
        outcomes[index] = outcome
        image = per_image.setdefault(pred['image_id'],
                                     dict.fromkeys(OUTCOMES, 0))
        image[outcome] += 1
    num_gt = sum(len(v) for v in gt_by_image.values())
    return dict(drawn=len(drawn), **counts,
                share=counts['right'] / len(drawn) if drawn else None,
                missed=num_gt - len(taken), num_gt=num_gt,
                confusion=confusion, score_thr=score_thr, iou_thr=iou_thr,
                per_image=per_image, outcomes=outcomes)
