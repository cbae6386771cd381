"""ONNX export through torch's dynamo exporter, with dynamic H and W.

Only ``torch.onnx.export(..., dynamo=True)`` is used: it traces the model
with ``torch.export``, so the graph keeps the input's height and width (and
batch) symbolic. The legacy TorchScript exporter (``dynamo=False``) records
one concrete size and is not a route for this model.

``export_verified`` is the safe way to write a file: the graph goes to a
temporary file next to the target, is checked in ONNX Runtime at several
sizes, and only then renamed to the target; a file that fails is deleted
(or kept under a name that says it is unverified).
"""
from __future__ import annotations

import os
import os.path as osp
import time
import uuid
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch
from torch import nn

from .dependencies import require_export_dependencies
from .verification import Shape, VerificationReport, verify_onnx

# Besides the export size, files are checked at a size whose level maps no
# PosMLP window tiles (level maps 75x115, 38x58, 19x29, 10x15 for windows
# 14/14/14/7) and one whose two deepest maps (10x12, 5x6) fit inside a
# single window. Neither is a multiple of 32, so the stem and the
# downsampling convs see odd sizes too.
DEFAULT_VERIFY_SIZES: Tuple[Tuple[int, int], ...] = ((300, 460), (150, 190))


@dataclass
class ExportResult:
    path: Optional[str]  # the verified file; None when it was refused
    unverified_path: Optional[str]  # set only with keep_unverified
    opset: int
    export_seconds: float
    verify_seconds: float
    report: VerificationReport

    @property
    def passed(self) -> bool:
        return self.report.passed


def unverified_path(path: str) -> str:
    """Where ``keep_unverified`` puts a file that failed verification."""
    stem, ext = osp.splitext(path)
    return f'{stem}.UNVERIFIED{ext or ".onnx"}'


def export_onnx(model: nn.Module, example: torch.Tensor, path: str, *,
                input_name: str = 'input',
                output_names: Optional[Sequence[str]] = None,
                opset: Optional[int] = None,
                dynamic_batch: bool = True) -> int:
    """Write ``model`` (eval mode) as ONNX with dynamic H and W (and batch).

    Returns the opset of the written file. Weights are stored inside the
    file (no external data), so it can be renamed and moved freely; this
    limits a model to ONNX's 2 GB, several times PosMLP-B's size.
    """
    require_export_dependencies()
    if example.dim() != 4:
        raise ValueError(f'the example input must be a 4-D (B, C, H, W) '
                         f'batch, got shape {tuple(example.shape)}')
    dims = {2: torch.export.Dim('height'), 3: torch.export.Dim('width')}
    if dynamic_batch:
        dims[0] = torch.export.Dim('batch')
    program = torch.onnx.export(
        model.eval(), (example,), dynamo=True, dynamic_shapes=(dims,),
        input_names=[input_name],
        output_names=list(output_names) if output_names else None,
        opset_version=opset, verbose=False)
    program.save(path, external_data=False)
    return int(program.model.opset_imports[''])


def export_verified(model: nn.Module, shape: Shape, out: str, *,
                    verify_sizes: Sequence[Tuple[int, int]] =
                    DEFAULT_VERIFY_SIZES,
                    dynamic_batch: bool = True, opset: Optional[int] = None,
                    atol: float = 1e-4, rtol: float = 1e-4,
                    input_name: str = 'input',
                    output_names: Optional[Sequence[str]] = None,
                    keep_unverified: bool = False, overwrite: bool = False,
                    seed: int = 0) -> ExportResult:
    """Export at ``shape``, verify, and only then put the file at ``out``.

    The file is checked at ``shape`` and at every (H, W) in
    ``verify_sizes``; with a dynamic batch those run at batch B + 1, so the
    batch axis is checked as well. A file that fails is deleted, or with
    ``keep_unverified`` renamed to ``unverified_path(out)``; an existing
    ``out`` is then left as it was.
    """
    require_export_dependencies()
    shape = tuple(int(s) for s in shape)
    if len(shape) != 4 or min(shape) <= 0:
        raise ValueError(f'the export shape must be four positive sizes '
                         f'(B, C, H, W), got {shape}')
    out = osp.abspath(out)
    if osp.exists(out) and not overwrite:
        raise FileExistsError(f'{out} exists; pass overwrite=True '
                              f'(--overwrite) to replace it')
    folder = osp.dirname(out)
    os.makedirs(folder, exist_ok=True)
    other_batch = shape[0] + 1 if dynamic_batch else shape[0]
    shapes = [shape] + [(other_batch, shape[1], int(h), int(w))
                        for h, w in verify_sizes
                        if (int(h), int(w)) != shape[2:]]

    # a hidden name next to the target (same file system: the rename is
    # atomic), created by the exporter with the usual permissions
    partial = osp.join(folder, f'.{osp.basename(out)}.{uuid.uuid4().hex[:8]}'
                       f'.partial.onnx')
    try:
        example = torch.randn(shape,
                              generator=torch.Generator().manual_seed(seed))
        start = time.perf_counter()
        used_opset = export_onnx(model, example, partial,
                                 input_name=input_name,
                                 output_names=output_names, opset=opset,
                                 dynamic_batch=dynamic_batch)
        export_seconds = time.perf_counter() - start
        start = time.perf_counter()
        report = verify_onnx(partial, model, shapes, export_shape=shape,
                             atol=atol, rtol=rtol, seed=seed)
        verify_seconds = time.perf_counter() - start
        kept = kept_unverified = None
        if report.passed:
            os.replace(partial, out)
            kept = out
        elif keep_unverified:
            kept_unverified = unverified_path(out)
            os.replace(partial, kept_unverified)
        report.path = kept or kept_unverified or ''
    finally:
        if osp.exists(partial):
            os.remove(partial)
    return ExportResult(kept, kept_unverified, used_opset, export_seconds,
                        verify_seconds, report)
