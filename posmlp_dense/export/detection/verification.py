"""Check a detector's ONNX file against mmdet's own ``predict``, box by box.

The file runs in ONNX Runtime (CPU) on the same tensor that
``detector.predict(x, samples, rescale=False)`` gets, the samples saying
that the whole tensor is the image (``img_shape`` = its size, scale factor
1), which is the file's contract. Per image, every box mmdet gives must
have a partner in the file's rows: the same label, IoU above
``min_iou``, score within ``score_tol`` (and, for masks, mask IoU above
``min_iou``, or at most ``MASK_PIXELS`` pixels different, since a small
mask flips whole fractions with one pixel at the threshold), and the
reverse. A box may be unpartnered only at the top-k cut: when its list
holds ``max_per_img`` boxes and its score is within ``score_tol`` of the
lowest one. Rows past the detections must be zeros.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from ..coverage import describe_coverage, find_posmlp
from ..dependencies import require_export_dependencies

Shape = Tuple[int, int, int, int]
MASK_PIXELS = 2


@dataclass
class ImageMatch:
    """One image: the file's boxes against mmdet's."""
    eager_boxes: int
    onnx_boxes: int
    matched: int = 0
    at_cut: int = 0  # unpartnered boxes at the top-k cut (allowed)
    max_iou_deficit: float = 0.0  # 1 - the lowest IoU of a matched pair
    max_score_diff: float = 0.0
    min_mask_iou: Optional[float] = None
    max_mask_pixels: Optional[int] = None
    problems: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class DetectionCheck:
    shape: Shape
    is_export_shape: bool
    source: str  # 'random' or the photograph's name
    windows: str = ''
    images: List[ImageMatch] = field(default_factory=list)
    error: str = ''
    eager_ms: float = float('nan')
    onnx_ms: float = float('nan')

    @property
    def passed(self) -> bool:
        return not self.error and bool(self.images) and all(
            image.ok for image in self.images)


@dataclass
class DetectionReport:
    path: str
    input_shape: List
    min_iou: float
    score_tol: float
    checks: List[DetectionCheck]
    problems: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems and bool(self.checks) and all(
            check.passed for check in self.checks)

    def table(self) -> str:
        masks = any(image.min_mask_iou is not None or
                    image.max_mask_pixels is not None
                    for check in self.checks for image in check.images)
        head = ('| input (B, C, H, W) | image | windows | boxes mmdet | '
                'boxes onnx | matched | at top-k cut | max 1-IoU | '
                'max score diff |' + (' min mask IoU |' if masks else '') +
                ' mmdet ms | onnxrt ms | ok |')
        lines = [head, '| ' + ' | '.join(
            ['---'] * 3 + ['---:'] * (6 + masks + 2) + ['---']) + ' |']
        for check in self.checks:
            size = 'x'.join(map(str, check.shape))
            if check.is_export_shape:
                size += ' (export)'
            timing = f'{check.eager_ms:.0f} | {check.onnx_ms:.0f}'
            if check.error:
                lines.append(f'| {size} | {check.source} | {check.windows} | '
                             + '- | ' * (6 + masks) +
                             f'{timing} | FAIL: {check.error} |')
            for i, image in enumerate(check.images):
                mask = ''
                if masks:
                    mask = ('-' if image.min_mask_iou is None
                            else f'{image.min_mask_iou:.4f}') + ' | '
                verdict = 'yes' if image.ok else \
                    'FAIL: ' + '; '.join(image.problems)
                source = check.source if len(check.images) == 1 else \
                    f'{check.source} #{i}'
                lines.append(
                    f'| {size} | {source} | {check.windows} | '
                    f'{image.eager_boxes} | {image.onnx_boxes} | '
                    f'{image.matched} | {image.at_cut} | '
                    f'{image.max_iou_deficit:.1e} | '
                    f'{image.max_score_diff:.1e} | {mask}{timing} | '
                    f'{verdict} |')
        return '\n'.join(lines)

    def verdict(self) -> str:
        rule = (f'same label, IoU > {self.min_iou}, score within '
                f'{self.score_tol:g}')
        if self.passed:
            images = [image for check in self.checks
                      for image in check.images]
            boxes = sum(image.eager_boxes for image in images)
            return (f'verified: {len(self.checks)} input sizes, '
                    f'{len(images)} images, {boxes} boxes of mmdet\'s '
                    f'predict matched box for box ({rule})')
        reasons = list(self.problems) + [
            f'{"x".join(map(str, check.shape))} ({check.source}) does not '
            f'match mmdet' for check in self.checks if not check.passed]
        return f'NOT verified ({rule}): ' + '; '.join(reasons)


def tensor_samples(images: torch.Tensor):
    """mmdet data samples saying that the whole tensor is the image."""
    from mmdet.structures import DetDataSample
    height, width = images.shape[-2:]
    meta = dict(img_shape=(height, width), ori_shape=(height, width),
                pad_shape=(height, width),
                batch_input_shape=(height, width), scale_factor=(1.0, 1.0))
    return [DetDataSample(metainfo=meta) for _ in range(images.shape[0])]


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(n, m) IoU of boxes (n, 4) and (m, 4)."""
    top_left = torch.maximum(a[:, None, :2], b[None, :, :2])
    bottom_right = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (bottom_right - top_left).clamp(min=0).prod(-1)
    area_a = (a[:, 2:] - a[:, :2]).clamp(min=0).prod(-1)
    area_b = (b[:, 2:] - b[:, :2]).clamp(min=0).prod(-1)
    union = area_a[:, None] + area_b[None, :] - inter
    # identical degenerate boxes (zero area) count as the same box
    same = (a[:, None, :] == b[None, :, :]).all(-1)
    return torch.where(union > 0, inter / union.clamp(min=1e-12),
                       same.to(inter.dtype))


def compare_image(eager, dets: np.ndarray, labels: np.ndarray,
                  masks: Optional[np.ndarray], rows: int, min_iou: float,
                  score_tol: float) -> ImageMatch:
    """mmdet's InstanceData of one image against the file's rows."""
    dets = torch.from_numpy(dets).double()
    labels = torch.from_numpy(labels)
    scores = dets[:, 4]
    filled = scores > 0
    count = int(filled.sum())
    match = ImageMatch(len(eager), count)
    if not bool(filled[:count].all()):
        match.problems.append('rows with score 0 before detections')
    rest = slice(count, None)
    if bool(dets[rest].ne(0).any()) or bool(labels[rest].ne(0).any()) or (
            masks is not None and bool(masks[count:].any())):
        match.problems.append('rows past the detections are not zero')
    if bool((scores[:count][1:] > scores[:count][:-1]).any()):
        match.problems.append('rows not in descending score')
    if labels.dtype != torch.int64:
        match.problems.append(f'labels are {labels.dtype}, not int64')

    ours_boxes, ours_scores = dets[:count, :4], scores[:count]
    ours_labels = labels[:count]
    ref_boxes = eager.bboxes.double()
    ref_scores, ref_labels = eager.scores.double(), eager.labels
    iou = box_iou(ref_boxes, ours_boxes) if count and len(eager) else \
        torch.zeros(len(eager), count, dtype=torch.float64)
    taken = torch.zeros(count, dtype=torch.bool)
    pairs = []
    for i in range(len(eager)):
        fits = (ours_labels == ref_labels[i]) & ~taken & (iou[i] > min_iou) \
            & ((ours_scores - ref_scores[i]).abs() <= score_tol)
        if bool(fits.any()):
            j = int(torch.where(fits, iou[i], -1.0).argmax())
            taken[j] = True
            pairs.append((i, j))
    match.matched = len(pairs)
    if pairs:
        ref_i = torch.tensor([i for i, _ in pairs])
        our_j = torch.tensor([j for _, j in pairs])
        match.max_iou_deficit = float(1 - iou[ref_i, our_j].min())
        match.max_score_diff = float(
            (ref_scores[ref_i] - ours_scores[our_j]).abs().max())
        if masks is not None:
            ious, pixels = mask_agreement(eager.masks[ref_i],
                                          torch.from_numpy(masks[our_j]))
            match.min_mask_iou = float(ious.min())
            match.max_mask_pixels = int(pixels.max())
            bad = (ious <= min_iou) & (pixels > MASK_PIXELS)
            if bool(bad.any()):
                match.problems.append(
                    f'{int(bad.sum())} masks differ (lowest mask IoU '
                    f'{match.min_mask_iou:.4f})')
    unpaired_ref = set(range(len(eager))) - {i for i, _ in pairs}
    unpaired_ours = set(range(count)) - {j for _, j in pairs}
    for name, unpaired, list_scores in (
            ('mmdet', unpaired_ref, ref_scores),
            ('the file', unpaired_ours, ours_scores)):
        cut = float(list_scores.min()) if len(list_scores) == rows else None
        for k in sorted(unpaired):
            if cut is not None and float(list_scores[k]) - cut <= score_tol:
                match.at_cut += 1
            else:
                match.problems.append(
                    f'{len(unpaired)} boxes of {name} without a partner '
                    f'(e.g. score {float(list_scores[k]):.4f})')
                break
    return match


def mask_agreement(ref: torch.Tensor, ours: torch.Tensor):
    """Per pair of (n, H, W) bool masks: IoU (1 for two empty masks) and
    the number of pixels that differ."""
    ref, ours = ref.bool().flatten(1), ours.bool().flatten(1)
    inter = (ref & ours).sum(1).double()
    union = (ref | ours).sum(1).double()
    ious = torch.where(union > 0, inter / union.clamp(min=1),
                       torch.ones_like(union))
    return ious, (ref ^ ours).sum(1)


def verify_detector_onnx(path: str, detector: nn.Module,
                         shapes: Sequence[Shape], *,
                         export_shape: Optional[Shape] = None,
                         photos: Sequence[Tuple[str, torch.Tensor]] = (),
                         rows: int = 100, min_iou: float = 0.99,
                         score_tol: float = 1e-3,
                         seed: int = 0) -> DetectionReport:
    """Run ``path`` at ``shapes`` (seeded standard-normal images) and on
    ``photos`` ((name, preprocessed (1, 3, H, W) tensor)), comparing with
    ``detector.predict``; ``rows`` is the file's rows per image."""
    require_export_dependencies()
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(
        path, options, providers=['CPUExecutionProvider'])
    inputs = session.get_inputs()
    report = DetectionReport(path, list(inputs[0].shape) if inputs else [],
                             min_iou, score_tol, [])
    if len(inputs) != 1:
        report.problems.append(f'the file has {len(inputs)} inputs, '
                               f'expected one image batch')
        return report
    names = [out.name for out in session.get_outputs()]
    detector = detector.eval()
    backbone = find_posmlp(detector)
    generator = torch.Generator().manual_seed(seed)
    cases = [(tuple(int(s) for s in shape), 'random', None)
             for shape in shapes]
    cases += [(tuple(x.shape), name, x) for name, x in photos]
    for shape, source, x in cases:
        if x is None:
            x = torch.randn(shape, generator=generator)
        check = DetectionCheck(shape, shape == tuple(export_shape or ()) and
                               source == 'random', source)
        report.checks.append(check)
        level_sizes = []
        hook = None
        if backbone is not None:
            hook = backbone.register_forward_hook(
                lambda module, args, result: level_sizes.extend(
                    tuple(t.shape[-2:]) for t in result))
        try:
            start = time.perf_counter()
            with torch.no_grad():
                eager = detector.predict(x, tensor_samples(x), rescale=False)
            check.eager_ms = 1000 * (time.perf_counter() - start)
        finally:
            if hook is not None:
                hook.remove()
        if backbone is not None:
            check.windows = describe_coverage(
                backbone, level_sizes[:len(backbone.out_indices)])
        try:
            start = time.perf_counter()
            got = dict(zip(names, session.run(None, {inputs[0].name:
                                                     x.numpy()})))
            check.onnx_ms = 1000 * (time.perf_counter() - start)
        except Exception as err:  # ORT's errors have no common base class
            check.error = f'ONNX Runtime failed: {_one_line(err)}'
            continue
        missing = {'dets', 'labels'} - set(got)
        if missing:
            check.error = f'the file has no {", ".join(sorted(missing))}'
            continue
        if got['dets'].shape[:2] != (shape[0], rows):
            check.error = (f'dets has shape {got["dets"].shape}, expected '
                           f'({shape[0]}, {rows}, 5)')
            continue
        for b, sample in enumerate(eager):
            masks = got['masks'][b] if 'masks' in got else None
            check.images.append(compare_image(
                sample.pred_instances, got['dets'][b], got['labels'][b],
                masks, rows, min_iou, score_tol))
    return report


def _one_line(err: Exception) -> str:
    text = ' '.join(str(err).split()) or type(err).__name__
    return text.replace('|', '/')[:400]
