"""Check an ONNX file against the eager PyTorch model it came from.

The file on disk is run in ONNX Runtime (CPU) on seeded random images of
several sizes, and every output is compared with the eager model's output
on the same images. A size passes when every output has eager's shape, is
finite, and is within ``atol + rtol * |eager|`` element-wise (as
``torch.allclose``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import torch
from torch import nn

from .coverage import describe_coverage, find_posmlp
from .dependencies import require_export_dependencies

Shape = Tuple[int, int, int, int]


@dataclass
class OutputDiff:
    """One output at one size: ONNX Runtime against eager PyTorch."""
    name: str
    shape: Tuple[int, ...]
    max_abs_diff: float
    max_abs_eager: float
    ok: bool
    problem: str = ''


@dataclass
class SizeCheck:
    """Every output of the model at one input shape."""
    shape: Shape
    is_export_shape: bool
    windows: str = ''  # how the backbone's windows cover its maps
    outputs: List[OutputDiff] = field(default_factory=list)
    error: str = ''  # ONNX Runtime failed, or the outputs do not pair up
    eager_ms: float = float('nan')
    onnx_ms: float = float('nan')

    @property
    def passed(self) -> bool:
        return not self.error and bool(self.outputs) and all(
            out.ok for out in self.outputs)


@dataclass
class VerificationReport:
    path: str
    input_shape: List  # the file's input dims (names where dynamic)
    atol: float
    rtol: float
    checks: List[SizeCheck]
    problems: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)  # help read the table

    @property
    def passed(self) -> bool:
        return not self.problems and bool(self.checks) and all(
            check.passed for check in self.checks)

    @property
    def max_abs_diff(self) -> float:
        diffs = [out.max_abs_diff for check in self.checks
                 for out in check.outputs]
        return max(diffs) if diffs else float('nan')

    def table(self) -> str:
        """The per-size, per-output differences as a Markdown table."""
        lines = ['| input (B, C, H, W) | windows | output | shape | '
                 'max abs diff | max abs eager | eager ms | onnxrt ms | ok |',
                 '| --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- |']
        for check in self.checks:
            size = 'x'.join(map(str, check.shape))
            if check.is_export_shape:
                size += ' (export)'
            timing = f'{check.eager_ms:.0f} | {check.onnx_ms:.0f}'
            if check.error:
                lines.append(f'| {size} | {check.windows} | - | - | - | - | '
                             f'{timing} | FAIL: {check.error} |')
            for out in check.outputs:
                verdict = 'yes' if out.ok else f'FAIL: {out.problem}'
                lines.append(
                    f'| {size} | {check.windows} | {out.name} | '
                    f'{"x".join(map(str, out.shape))} | '
                    f'{out.max_abs_diff:.2e} | {out.max_abs_eager:.2e} | '
                    f'{timing} | {verdict} |')
        return '\n'.join(lines)

    def verdict(self) -> str:
        tolerance = f'atol {self.atol:g}, rtol {self.rtol:g}'
        if self.passed:
            return (f'verified: {len(self.checks)} input sizes, max abs diff '
                    f'{self.max_abs_diff:.2e} ({tolerance})')
        failed = [check for check in self.checks if not check.passed]
        reasons = list(self.problems) + [
            f'{"x".join(map(str, check.shape))} does not match eager'
            for check in failed]
        return f'NOT verified ({tolerance}): ' + '; '.join(reasons)


def model_device(model: nn.Module) -> torch.device:
    """Where the model's weights are (CPU for a model without any)."""
    param = next(iter(model.parameters()), None)
    return param.device if param is not None else torch.device('cpu')


def _as_list(outputs) -> List[torch.Tensor]:
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    if isinstance(outputs, (tuple, list)) and all(
            isinstance(o, torch.Tensor) for o in outputs):
        return list(outputs)
    raise TypeError(f'the model must return a tensor or a tuple/list of '
                    f'tensors to be exported, got {type(outputs).__name__}')


def compare_output(name: str, onnx_value, eager: torch.Tensor, atol: float,
                   rtol: float) -> OutputDiff:
    got = torch.from_numpy(onnx_value)
    if tuple(got.shape) != tuple(eager.shape):
        return OutputDiff(name, tuple(got.shape), float('nan'),
                          float(eager.abs().max()), False,
                          f'shape {tuple(got.shape)}, eager '
                          f'{tuple(eager.shape)}')
    if got.dtype != eager.dtype:
        return OutputDiff(name, tuple(got.shape), float('nan'),
                          float(eager.abs().max()), False,
                          f'dtype {got.dtype}, eager {eager.dtype}')
    diff = (got.double() - eager.double()).abs()
    max_eager = float(eager.abs().max()) if eager.numel() else 0.0
    max_diff = float(diff.max()) if diff.numel() else 0.0
    if not bool(torch.isfinite(got).all()):
        return OutputDiff(name, tuple(got.shape), max_diff, max_eager, False,
                          'non-finite values')
    bound = atol + rtol * eager.double().abs()
    ok = bool((diff <= bound).all())
    return OutputDiff(name, tuple(got.shape), max_diff, max_eager, ok,
                      '' if ok else 'beyond tolerance')


def verify_onnx(path: str, model: nn.Module, shapes: Sequence[Shape], *,
                export_shape: Optional[Shape] = None,
                dynamic_batch: bool = False, atol: float = 1e-4,
                rtol: float = 1e-4, seed: int = 0) -> VerificationReport:
    """Run ``path`` in ONNX Runtime at ``shapes`` and compare with ``model``.

    The model runs in eval mode under ``torch.no_grad()``; the inputs are
    seeded standard-normal images (a normalized image's range). The file's
    height and width (and with ``dynamic_batch`` its batch) must be
    dynamic: an exporter that fixed them fails the check by itself.
    """
    require_export_dependencies()
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # the table says what went wrong
    session = onnxruntime.InferenceSession(
        path, options, providers=['CPUExecutionProvider'])
    inputs, outputs = session.get_inputs(), session.get_outputs()
    report = VerificationReport(path, list(inputs[0].shape) if inputs else [],
                                atol, rtol, [])
    if len(inputs) != 1:
        report.problems.append(f'the file has {len(inputs)} inputs, expected '
                               f'one image batch (a graph that ignores its '
                               f'input is never right)')
        return report
    dynamic = 'BHW' if dynamic_batch else 'HW'
    fixed = [axis for axis, dim in zip('BCHW', inputs[0].shape)
             if axis in dynamic and isinstance(dim, int)]
    if fixed:
        report.problems.append(
            f'the file\'s input {inputs[0].shape} has a fixed '
            f'{" and ".join(fixed)} (the exporter specialized '
            f'{"it" if len(fixed) == 1 else "them"})')
    names = [out.name for out in outputs]

    model = model.eval()
    device = model_device(model)
    backbone = find_posmlp(model)
    generator = torch.Generator().manual_seed(seed)
    for shape in shapes:
        shape = tuple(int(s) for s in shape)
        check = SizeCheck(shape, shape == tuple(export_shape or ()))
        report.checks.append(check)
        x = torch.randn(shape, generator=generator)
        level_sizes = []
        hook = None
        if backbone is not None:
            hook = backbone.register_forward_hook(
                lambda module, args, result: level_sizes.extend(
                    tuple(t.shape[-2:]) for t in result))
        try:
            start = time.perf_counter()
            with torch.no_grad():
                eager = [t.cpu() for t in _as_list(model(x.to(device)))]
            check.eager_ms = 1000 * (time.perf_counter() - start)
        finally:
            if hook is not None:
                hook.remove()
        if backbone is not None:
            check.windows = describe_coverage(backbone, level_sizes)
        try:
            start = time.perf_counter()
            got = session.run(None, {inputs[0].name: x.numpy()})
            check.onnx_ms = 1000 * (time.perf_counter() - start)
        except Exception as err:  # ORT's errors have no common base class
            check.error = f'ONNX Runtime failed: {_one_line(err)}'
            continue
        if len(got) != len(eager):
            check.error = (f'the file has {len(got)} outputs, the model '
                           f'{len(eager)}')
            continue
        check.outputs = [compare_output(name, value, ref, atol, rtol)
                         for name, value, ref in zip(names, got, eager)]
    return report


def _one_line(err: Exception) -> str:
    text = ' '.join(str(err).split()) or type(err).__name__
    return text.replace('|', '/')[:400]  # it goes into a Markdown table
