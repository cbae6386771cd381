"""Exporting PosMLP models to ONNX, and checking the files in ONNX Runtime.

Needs the optional ``export`` extra (``pip install -e .[export]``: onnx,
onnxruntime, onnxscript); nothing else in the package imports this.

    from posmlp_dense import PosMLP
    from posmlp_dense.export import export_verified
    result = export_verified(PosMLP('t'), (1, 3, 512, 512), 'posmlp_t.onnx')
    print(result.report.table())

``tools/export.py`` is the command-line front end, also for the tensor
forward (logits) of an mmseg segmentor (``SegmentorLogits``) and for whole
mmdet detectors, image to boxes (``posmlp_dense.export.detection``).
"""
from .dependencies import ExportDependencyError, require_export_dependencies
from .onnx import (DEFAULT_VERIFY_SIZES, DynamicShapeError, ExportResult,
                   OnnxGraph, export_onnx, export_verified, unverified_path)
from .adaptive_pool import (SymbolicAdaptiveAvgPool2d,
                            make_adaptive_pooling_symbolic)
from .mmseg_upsample import SymbolicUpsample, make_upsampling_symbolic
from .segmentor import SegmentorLogits, build_segmentor
from .verification import SizeCheck, VerificationReport, verify_onnx

__all__ = ['DEFAULT_VERIFY_SIZES', 'DynamicShapeError',
           'ExportDependencyError', 'ExportResult', 'OnnxGraph',
           'SegmentorLogits', 'SizeCheck', 'SymbolicAdaptiveAvgPool2d',
           'SymbolicUpsample', 'VerificationReport', 'build_segmentor',
           'export_onnx', 'export_verified', 'make_adaptive_pooling_symbolic',
           'make_upsampling_symbolic',
           'require_export_dependencies', 'unverified_path', 'verify_onnx']
