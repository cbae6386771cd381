"""ONNX export through torch's dynamo exporter, with dynamic H and W.

Only ``torch.onnx.export(..., dynamo=True)`` is used: it traces the model
with ``torch.export``, so the graph keeps the input's height and width (and
batch) symbolic, and raises where the model would fix one of them. The
legacy TorchScript exporter (``dynamo=False``) and ``torch.jit.trace``
record the Python-side decisions taken at the traced size, so they are not
a route for a model whose windows depend on the size.

``export_verified`` is the safe way to write a file: the graph goes to a
temporary file next to the target, is checked in ONNX Runtime at several
sizes, and only then renamed to the target; a file that fails is deleted
(or kept under a name that says it is unverified).
"""
from __future__ import annotations

import contextlib
import os
import os.path as osp
import re
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from ..atomic_io import atomic_write_bytes, fsync_folder, partial_name
from .dependencies import require_export_dependencies
from .verification import (Shape, VerificationReport, model_device,
                           verify_onnx)

# Besides the export size, files are checked at a size whose level maps no
# PosMLP window tiles (level maps 75x115, 38x58, 19x29, 10x15 for windows
# 14/14/14/7) and one whose two deepest maps (10x12, 5x6) fit inside a
# single window. Neither is a multiple of 32, so the stem and the
# downsampling convs see odd sizes too.
DEFAULT_VERIFY_SIZES: Tuple[Tuple[int, int], ...] = ((300, 460), (150, 190))


# The file's input axes that torch.export keeps symbolic, by name.
AXES = {0: 'batch', 2: 'height', 3: 'width'}


@dataclass
class OnnxGraph:
    """What export_onnx wrote."""
    opset: int
    # each dynamic input axis: the sizes torch.export found the graph valid
    # for, (lowest, highest or None)
    input_ranges: Dict[str, Tuple[int, Optional[int]]]

    def describe_ranges(self) -> str:
        return ', '.join(f'{name} {low}..{"" if high is None else high}'
                         for name, (low, high) in self.input_ranges.items())

    def outside(self, shape: Shape) -> List[str]:
        """The axes of ``shape`` outside the graph's valid ranges.

        A size of 1 is not counted: torch.export excludes 0 and 1 from
        every dynamic axis by convention (its "0/1 specialization"), not
        because the graph cannot take them; verification runs batch 1.
        """
        sizes = dict(zip(('batch', None, 'height', 'width'), shape))
        return [f'{name} {sizes[name]}'
                for name, (low, high) in self.input_ranges.items()
                if (sizes[name] < low and (sizes[name], low) != (1, 2))
                or (high is not None and sizes[name] > high)]


@dataclass
class ExportResult:
    path: Optional[str]  # the verified file; None when it was refused
    unverified_path: Optional[str]  # set only with keep_unverified
    graph: OnnxGraph
    export_seconds: float
    verify_seconds: float
    report: VerificationReport

    @property
    def passed(self) -> bool:
        return self.report.passed


class DynamicShapeError(RuntimeError):
    """The model's forward turns a dynamic input axis into a constant."""


def unverified_path(path: str) -> str:
    """Where ``keep_unverified`` puts a file that failed verification."""
    stem, ext = osp.splitext(path)
    return f'{stem}.UNVERIFIED{ext or ".onnx"}'


def export_onnx(model: nn.Module, example: torch.Tensor, path: str, *,
                input_name: str = 'input',
                output_names: Optional[Sequence[str]] = None,
                opset: Optional[int] = None,
                dynamic_batch: bool = True,
                size_oblivious: bool = False) -> OnnxGraph:
    """Write ``model`` (eval mode) as ONNX with dynamic H and W (and batch).

    The input's axes are named batch, height and width in the file (output
    axes are expressions of them). Weights are stored inside the file (no
    external data), so it can be renamed and moved freely; this limits a
    model to ONNX's 2 GB, several times PosMLP-B's size.

    ``size_oblivious`` captures with torch's size-oblivious reasoning: a
    size is not specialized for being 1 in the example (e.g. a detector's
    coarsest FPN map, 1 pixel high at small inputs), so the graph's range
    is not cut at that size; verification at such sizes shows the graph
    right there too.
    """
    require_export_dependencies()
    if example.dim() != 4:
        raise ValueError(f'the example input must be a 4-D (B, C, H, W) '
                         f'batch, got shape {tuple(example.shape)}')
    if dynamic_batch and example.shape[0] < 2:
        raise ValueError('with a dynamic batch the example batch must be at '
                         'least 2: torch.export fixes every axis whose '
                         'example size is 1')
    dynamic = torch.export.Dim.DYNAMIC  # its valid range is inferred
    dims = {axis: dynamic for axis in AXES if dynamic_batch or axis}
    # Captured here rather than by torch.onnx.export, which on a constraint
    # violation quietly applies torch's suggested fixes (e.g. batch = 1) and
    # writes a graph for fewer sizes than asked for; this raises instead.
    capture = contextlib.nullcontext()
    if size_oblivious:
        import torch.fx.experimental._config as fx_config
        capture = fx_config.patch(backed_size_oblivious=True)
    with capture, warnings.catch_warnings():
        # torchvision's shape function for nms calls an API torch has
        # deprecated; nothing the user can act on
        warnings.filterwarnings('ignore', '`create_unbacked_symint`',
                                FutureWarning)
        try:
            exported = torch.export.export(model.eval(), (example,),
                                           dynamic_shapes=(dims,),
                                           strict=False)
        except RuntimeError as err:
            if 'Constraints violated' not in str(err):
                raise
            raise DynamicShapeError(
                'the model fixes an input axis that must stay dynamic, so '
                'no graph for all sizes can be exported; torch.export '
                'says:\n' + _name_axes(str(err))) from err
        symbols, ranges = _input_symbols(exported, dims)
        program = torch.onnx.export(
            exported, (example,), dynamo=True, input_names=[input_name],
            output_names=list(output_names) if output_names else None,
            opset_version=opset, verbose=False)
    proto = program.model_proto
    _rename_dims(proto, symbols)
    atomic_write_bytes(proto.SerializeToString(), path)
    opset_used = next(entry.version for entry in proto.opset_import
                      if entry.domain in ('', 'ai.onnx'))
    return OnnxGraph(int(opset_used), ranges)


def _name_axes(message: str) -> str:
    """torch.export's L['x'].size()[3] -> width."""
    return re.sub(r"L\['\w+'\]\.size\(\)\[(\d)\]",
                  lambda m: AXES.get(int(m.group(1)), m.group(0)), message)


def _input_symbols(exported, dims) -> Tuple[Dict[str, str], Dict]:
    """{symbol: axis name} of the image input, and each axis' valid sizes."""
    name = exported.graph_signature.user_inputs[0]
    node = next(n for n in exported.graph.nodes if n.name == name)
    symbols, ranges = {}, {}
    for axis in sorted(dims):
        size = node.meta['val'].shape[axis]
        if not isinstance(size, torch.SymInt):
            continue  # cannot happen: torch.export raises on specialization
        symbol = size.node.expr
        symbols[str(symbol)] = AXES[axis]
        bounds = exported.range_constraints.get(symbol)
        if bounds is not None:
            upper = bounds.upper  # torch's int_oo when unbounded
            ranges[AXES[axis]] = (int(bounds.lower), int(upper)
                                  if upper.is_Integer else None)
    return symbols, ranges


def _rename_dims(proto, symbols: Dict[str, str]):
    """Replace torch's symbol names (s77, ...) by batch/height/width in
    every symbolic dimension of the graph's inputs, outputs and values."""
    pattern = re.compile(r'\b(' + '|'.join(map(re.escape, symbols)) + r')\b')
    graph = proto.graph
    for value in [*graph.input, *graph.output, *graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param:
                dim.dim_param = pattern.sub(
                    lambda match: symbols[match.group(0)], dim.dim_param)


def export_verified(model: nn.Module, shape: Shape, out: str, *,
                    verify_sizes: Sequence[Tuple[int, int]] =
                    DEFAULT_VERIFY_SIZES,
                    dynamic_batch: bool = True, opset: Optional[int] = None,
                    atol: float = 1e-4, rtol: float = 1e-4,
                    input_name: str = 'input',
                    output_names: Optional[Sequence[str]] = None,
                    keep_unverified: bool = False, overwrite: bool = False,
                    seed: int = 0, size_oblivious: bool = False,
                    verify: Optional[Callable[..., VerificationReport]] = None
                    ) -> ExportResult:
    """Export at ``shape``, verify, and only then put the file at ``out``.

    The file is checked at ``shape`` and at every (H, W) in
    ``verify_sizes``. With a dynamic batch the export batch must be at
    least 2 and the other sizes run at batch 1, so the batch axis is
    checked as well. A file that fails is deleted, or with
    ``keep_unverified`` renamed to ``unverified_path(out)``; an existing
    ``out`` is then left as it was.

    ``verify(path, shapes, export_shape)`` replaces the default check
    (``verify_onnx``: every output against ``model``'s, within atol/rtol)
    for models judged otherwise, e.g. detectors (box for box against
    mmdet's predict); it returns a report with the same interface.
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
    other_batch = 1 if dynamic_batch else shape[0]
    shapes = [shape] + [(other_batch, shape[1], int(h), int(w))
                        for h, w in verify_sizes
                        if (int(h), int(w)) != shape[2:]]

    # verified where it is written, a hidden name next to the target; only
    # then renamed (same file system: atomic)
    partial = partial_name(out)
    try:
        example = torch.randn(
            shape, generator=torch.Generator().manual_seed(seed)).to(
                model_device(model))
        start = time.perf_counter()
        graph = export_onnx(model, example, partial, input_name=input_name,
                            output_names=output_names, opset=opset,
                            dynamic_batch=dynamic_batch,
                            size_oblivious=size_oblivious)
        export_seconds = time.perf_counter() - start
        start = time.perf_counter()
        if verify is None:
            report = verify_onnx(partial, model, shapes, export_shape=shape,
                                 dynamic_batch=dynamic_batch, atol=atol,
                                 rtol=rtol, seed=seed)
        else:
            report = verify(partial, shapes, shape)
        verify_seconds = time.perf_counter() - start
        for check in report.checks:
            outside = graph.outside(check.shape)
            if outside:  # ONNX Runtime does not check torch.export's ranges
                report.notes.append(
                    f'{"x".join(map(str, check.shape))} is outside the sizes '
                    f'torch.export found this graph valid for '
                    f'({graph.describe_ranges()}): {", ".join(outside)}')
        kept = kept_unverified = None
        if report.passed:
            os.replace(partial, out)
            kept = out
        elif keep_unverified:
            kept_unverified = unverified_path(out)
            os.replace(partial, kept_unverified)
        if kept or kept_unverified:
            fsync_folder(folder)  # the rename survives a power loss
        report.path = kept or kept_unverified or ''
    finally:
        if osp.exists(partial):
            os.remove(partial)
    return ExportResult(kept, kept_unverified, graph, export_seconds,
                        verify_seconds, report)
