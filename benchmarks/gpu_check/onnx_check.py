"""The export route on this machine's torch, onnx, onnxscript and
onnxruntime: ``posmlp_dense.export.export_verified`` (dynamo export with
dynamic batch, height and width; the file run in ONNX Runtime at the
export size, at a size no window tiles and at one smaller than a window,
against eager PyTorch)."""
from __future__ import annotations

import os
import tempfile
from importlib import metadata
from typing import Tuple

from torch import nn

from posmlp_dense.export import (ExportDependencyError, export_verified,
                      require_export_dependencies)
from .rows import Skip, Verdict


def export_check(model: nn.Module, shape: Tuple[int, int, int],
                 seed: int) -> Verdict:
    """``model`` (on the CPU) exported at ``shape`` = (batch, H, W)."""
    try:
        require_export_dependencies()
    except ExportDependencyError as err:
        raise Skip(str(err)) from err
    batch, h, w = shape
    with tempfile.TemporaryDirectory() as tmp:
        result = export_verified(model.eval(), (batch, 3, h, w),
                                 os.path.join(tmp, 'posmlp.onnx'), seed=seed)
    report = result.report
    print(report.table(), flush=True)
    versions = ', '.join(f'{name} {metadata.version(name)}'
                         for name in ('onnx', 'onnxscript', 'onnxruntime'))
    detail = (f'{report.verdict()}; export {result.export_seconds:.1f} s, '
              f'check {result.verify_seconds:.1f} s; opset '
              f'{result.graph.opset}; {versions}')
    return Verdict(result.passed, detail, dict(
        shape=[batch, 3, h, w], passed=result.passed,
        max_abs_diff=report.max_abs_diff,
        sizes=[list(c.shape) for c in report.checks],
        windows=[c.windows for c in report.checks],
        export_seconds=result.export_seconds,
        verify_seconds=result.verify_seconds, opset=result.graph.opset))
