"""PosMLP's numbers on the device: fp32 (TF32 off) against a float64 CPU
reference, whose own error is far below fp32's, and autocast (bf16, fp16)
against fp32."""
from __future__ import annotations

import contextlib
import copy
from typing import Dict, List, Sequence, Tuple

import torch
from torch import nn

from posmlp_dense.export.coverage import describe_coverage
from .rows import Skip, Verdict

# Relative L2 error allowed between fp32 on the device and the float64
# reference, for every output level and every parameter's gradient.
FP32_TOLERANCE = 1e-4
# A gradient that is zero in exact arithmetic (a conv bias before a
# train-mode batch norm) is rounding noise in fp32: it is judged against
# this fraction of the whole gradient's norm instead of its own.
GRADIENT_FLOOR = 1e-6
# Autocast against fp32: at least this far apart (autocast did compute in
# low precision) and at most the limit of its dtype (bf16 keeps 8
# mantissa bits, fp16 11).
AUTOCAST_MIN = 1e-5
AUTOCAST_LIMITS = {torch.bfloat16: 3e-2, torch.float16: 1e-2}


@contextlib.contextmanager
def full_fp32():
    """No TF32 in cuDNN convolutions or CUDA matmuls while inside."""
    saved = (torch.backends.cudnn.allow_tf32,
             torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        (torch.backends.cudnn.allow_tf32,
         torch.backends.cuda.matmul.allow_tf32) = saved


def relative(got: torch.Tensor, ref: torch.Tensor) -> float:
    got = got.detach().to('cpu', torch.float64)
    ref = ref.detach().to('cpu', torch.float64)
    return ((got - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def loss_weights(shapes: Sequence[torch.Size], seed: int
                 ) -> List[torch.Tensor]:
    """Fixed random weights, one tensor per output level (float64, CPU):
    the loss sum_i mean(out_i * w_i) reaches every output element."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen, dtype=torch.float64)
            for s in shapes]


def weighted_loss(outs, weights) -> torch.Tensor:
    """sum_i mean(out_i * w_i), in float64 for float64 outputs and in fp32
    otherwise (also for autocast's half-precision outputs)."""
    total = 0
    for o, w in zip(outs, weights):
        o = o if o.dtype == torch.float64 else o.float()
        total = total + (o * w.to(o.device, o.dtype)).mean()
    return total


def forward_backward(model: nn.Module, x: torch.Tensor, weights
                     ) -> Tuple[List[torch.Tensor], Dict[str, torch.Tensor]]:
    model.train()
    model.zero_grad(set_to_none=True)
    outs = model(x)
    weighted_loss(outs, weights).backward()
    return ([o.detach() for o in outs],
            {n: p.grad.detach() for n, p in model.named_parameters()
             if p.grad is not None})


def device_against_cpu(base: nn.Module, size: Tuple[int, int], batch: int,
                       device: torch.device, seed: int) -> Verdict:
    """``base`` (CPU, fp32) copied to ``device`` in fp32 and to the CPU in
    float64: eval outputs, train outputs and every parameter's gradient."""
    reference = copy.deepcopy(base).double()
    model = copy.deepcopy(base).to(device)
    x = torch.randn(batch, 3, *size,
                    generator=torch.Generator().manual_seed(seed))
    with full_fp32():
        reference.eval()
        model.eval()
        with torch.no_grad():
            ref_eval = reference(x.double())
            got_eval = model(x.to(device))
        weights = loss_weights([o.shape for o in ref_eval], seed + 1)
        ref_train, ref_grads = forward_backward(reference, x.double(),
                                                weights)
        got_train, grads = forward_backward(model, x.to(device), weights)
    coverage = describe_coverage(base, [o.shape[-2:] for o in ref_eval])
    problems = []
    if [o.shape for o in got_eval] != [o.shape for o in ref_eval]:
        problems.append('output shapes differ')
    eval_err = max(relative(g, r) for g, r in zip(got_eval, ref_eval))
    train_err = max(relative(g, r) for g, r in zip(got_train, ref_train))
    if set(grads) != set(ref_grads):
        problems.append(f'gradients of {sorted(set(grads) ^ set(ref_grads))}'
                        f' exist on one side only')
    total = torch.cat([g.flatten() for g in ref_grads.values()]).norm()
    all_err = relative(torch.cat([grads[n].flatten().cpu() for n in
                                  ref_grads if n in grads]),
                       torch.cat([ref_grads[n].flatten() for n in ref_grads
                                  if n in grads]))
    worst_name, worst = '', 0.0
    for name, ref in ref_grads.items():
        if name not in grads:
            continue
        diff = (grads[name].to('cpu', torch.float64) - ref).norm()
        score = (diff / (ref.norm() + GRADIENT_FLOOR / FP32_TOLERANCE
                         * total)).item()
        if score > worst:
            worst_name, worst = name, score
    for what, err in (('eval outputs', eval_err),
                      ('train outputs', train_err),
                      (f'gradient of {worst_name}', worst)):
        if not err <= FP32_TOLERANCE:  # (NaN fails too)
            problems.append(f'{what}: {err:.2e}')
    detail = (f'rel. error against float64 CPU: outputs eval {eval_err:.1e}'
              f', train {train_err:.1e}; gradients {all_err:.1e}, worst '
              f'parameter {worst:.1e} ({worst_name}); limit '
              f'{FP32_TOLERANCE:.0e}; windows {coverage}')
    if problems:
        detail = 'beyond the limit: ' + '; '.join(problems) + '. ' + detail
    return Verdict(not problems, detail, dict(
        size=list(size), batch=batch, coverage=coverage,
        eval_output_error=eval_err, train_output_error=train_err,
        gradient_error=all_err, worst_parameter=worst_name,
        worst_parameter_error=worst, tolerance=FP32_TOLERANCE))


def autocast_supported(device: torch.device, dtype: torch.dtype) -> bool:
    if device.type == 'cuda':
        return dtype != torch.bfloat16 or torch.cuda.is_bf16_supported()
    return True


def autocast_against_fp32(base: nn.Module, shape: Tuple[int, int, int],
                          device: torch.device, dtype: torch.dtype,
                          seed: int) -> Verdict:
    """Eval forward under autocast against fp32 (no TF32), then a train
    forward under autocast and its backward: all finite."""
    if not autocast_supported(device, dtype):
        raise Skip(f'{torch.cuda.get_device_name(device)} has no {dtype}')
    model = copy.deepcopy(base).to(device).eval()
    batch, h, w = shape
    x = torch.randn(batch, 3, h, w, generator=torch.Generator().manual_seed(
        seed)).to(device)
    with torch.no_grad():
        with full_fp32():
            ref = model(x)
        with torch.autocast(device.type, dtype=dtype):
            outs = model(x)
    problems = []
    if not all(torch.isfinite(o).all() for o in outs):
        problems.append('non-finite outputs')
    low_precision = [o.dtype for o in outs if o.dtype != torch.float32]
    errors = [relative(o, r) for o, r in zip(outs, ref)]
    err = max(errors)
    limit = AUTOCAST_LIMITS[dtype]
    if not err <= limit:
        problems.append(f'{err:.2e} from fp32, limit {limit:.0e}')
    if err <= AUTOCAST_MIN:
        problems.append(f'only {err:.1e} from fp32: autocast changed '
                        f'nothing')
    model.train()
    with torch.autocast(device.type, dtype=dtype):
        outs = model(x)
    weighted_loss(outs, loss_weights([o.shape for o in outs],
                                     seed + 1)).backward()
    bad = [n for n, p in model.named_parameters()
           if p.grad is None or not torch.isfinite(p.grad).all()]
    if bad:
        problems.append(f'{len(bad)} parameters without a finite gradient, '
                        f'e.g. {bad[0]}')
    detail = (f'rel. error against fp32, per level '
              f'{", ".join(f"{e:.1e}" for e in errors)} (allowed '
              f'{AUTOCAST_MIN:.0e}..{limit:.0e}); outputs '
              f'{low_precision[0] if low_precision else torch.float32}; '
              f'train forward + backward: '
              + ('gradients finite' if not bad else 'NOT finite'))
    if problems:
        detail = '; '.join(problems) + '. ' + detail
    return Verdict(not problems, detail, dict(
        shape=list(shape), dtype=str(dtype), errors=errors, limit=limit))
