"""Whole mmdet detectors as one exportable forward: image tensor to boxes.

The contract is mmdeploy's "end2end" one: the input ``input`` (N, 3, H, W)
holds images normalized and padded as the config's data preprocessor makes
them; the outputs are ``dets`` (N, K, 5: x1, y1, x2, y2, score) and
``labels`` (N, K) int64 in the input tensor's coordinates, and for Mask
R-CNN ``masks`` (N, K, H, W) bool; rows past the detections found have
score 0. K is the config's ``max_per_img``. ``verify_detector_onnx``
compares a file with mmdet's own ``predict``, box for box.
"""
from .build import (build_detector, detector_end2end, output_names,
                    rows_per_image)
from .photos import prepare_photo
from .retinanet import RetinaNetEnd2End
from .two_stage import TwoStageEnd2End
from .unsupported import UnsupportedDetectorError
from .verification import DetectionReport, verify_detector_onnx

__all__ = ['DetectionReport', 'RetinaNetEnd2End', 'TwoStageEnd2End',
           'UnsupportedDetectorError', 'build_detector', 'detector_end2end',
           'output_names', 'prepare_photo', 'rows_per_image',
           'verify_detector_onnx']
