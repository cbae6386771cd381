"""Which mmdet detectors export whole, and the module that exports each.

``detector_end2end`` picks the deploy forward for a built mmdet detector:
``RetinaNetEnd2End`` for RetinaNet, ``TwoStageEnd2End`` for Faster and Mask
R-CNN. Anything else (other detectors and heads, test-time augmentation)
is refused with an ``UnsupportedDetectorError`` that names the module.
"""
from __future__ import annotations

from typing import Optional

from torch import nn

from ..segmentor import build_openmmlab_model
from .retinanet import RetinaNetEnd2End
from .two_stage import TwoStageEnd2End
from .unsupported import UnsupportedDetectorError

TTA_EXPLANATION = (
    'test-time augmentation runs the detector on several transformed copies '
    'of the image and merges their boxes in Python, outside any one forward '
    'graph; export the plain detector (the config\'s model, not tta_model) '
    'and run the copies through the ONNX file')


def build_detector(config: str, checkpoint: Optional[str] = None,
                   cfg_options: Optional[dict] = None) -> nn.Module:
    """The config's mmdet detector in eval mode (weights from a training
    checkpoint of the config, loaded strictly, if given)."""
    from mmengine.config import Config
    cfg = Config.fromfile(config)
    model_type = str(cfg.get('model', {}).get('type', ''))
    if 'TTA' in model_type:
        raise UnsupportedDetectorError(
            f'model is {model_type}: {TTA_EXPLANATION}')
    return build_openmmlab_model(config, 'mmdet', 'detector', checkpoint,
                                 cfg_options)


def detector_end2end(detector: nn.Module) -> nn.Module:
    """The exportable forward of ``detector``: images -> dets, labels (and
    masks)."""
    from mmdet.models.detectors import (SingleStageDetector,
                                        TwoStageDetector)
    from mmdet.models.detectors import FasterRCNN, MaskRCNN, RetinaNet
    from mmengine.model import BaseTTAModel
    if isinstance(detector, BaseTTAModel):
        raise UnsupportedDetectorError(
            f'the model is {type(detector).__name__}: {TTA_EXPLANATION}')
    if type(detector) in (RetinaNet, SingleStageDetector):
        return RetinaNetEnd2End(detector).eval()
    if type(detector) in (FasterRCNN, MaskRCNN, TwoStageDetector):
        require_onnxscript_roi_align()
        return TwoStageEnd2End(detector).eval()
    family = ('single-stage' if isinstance(detector, SingleStageDetector)
              else 'two-stage' if isinstance(detector, TwoStageDetector)
              else 'other')
    raise UnsupportedDetectorError(
        f'the detector is {type(detector).__name__} ({family}); the export '
        f'writes RetinaNet, Faster R-CNN and Mask R-CNN whole (their '
        f'post-processing is implemented in posmlp_dense/export/detection); '
        f'export its backbone with tools/export.py --arch instead')


def require_onnxscript_roi_align():
    """onnxscript writes torchvision's roi_align correctly from 0.7 on."""
    from importlib.metadata import version
    from ..dependencies import ExportDependencyError
    found = version('onnxscript')
    if tuple(int(part) for part in found.split('.')[:2]
             if part.isdigit()) < (0, 7):
        raise ExportDependencyError(
            f'two-stage detectors need onnxscript >= 0.7 for RoIAlign '
            f'(found {found}): pip install -U "onnxscript>=0.7" (or pip '
            f'install -r requirements/export.txt)')


def output_names(end2end: nn.Module):
    """The graph's output names, mmdeploy's end2end ones."""
    if isinstance(end2end, TwoStageEnd2End) and end2end.with_mask:
        return ['dets', 'labels', 'masks']
    return ['dets', 'labels']


def rows_per_image(end2end: nn.Module) -> int:
    """K: the rows per image of ``dets`` (the config's max_per_img)."""
    return end2end.max_per_img
